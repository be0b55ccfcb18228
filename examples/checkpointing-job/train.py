#!/usr/bin/env python3
"""A training job that speaks the gpu-autoscaler checkpoint protocol (docs/checkpointing.md).

It stands in for a real trainer with nothing but the standard library: a "step" is a sleep and a
counter. What it shows is the part every real trainer needs to get right:

* resume: on start, load the last checkpoint, so a requeued job carries on where it saved;
* save atomically: write a temporary file, fsync, rename over the old one, so a job killed while
  saving leaves the previous checkpoint intact, never half of a new one;
* save on request: SIGUSR1 (what the controller sends when the node is about to be taken away)
  makes the job checkpoint at the end of the step in flight rather than at its next interval;
* report: every finished checkpoint is posted to the controller, which is how it knows what an
  interruption would cost; a report that fails is logged and training goes on.

Submit it as the batch script itself (see submit.sh), so the signal Slurm delivers to the batch
shell reaches this process.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import signal
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from types import FrameType

DESCRIPTION = "A stand-in training job that checkpoints on an interval and on SIGUSR1."
CHECKPOINT_FILE = "checkpoint.json"
REPORT_TIMEOUT_S = 5.0


def log(message: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} {message}", flush=True)


def load_step(directory: Path) -> int:
    """The step of the last checkpoint, or 0 when there is none."""
    try:
        saved = json.loads((directory / CHECKPOINT_FILE).read_text())
    except FileNotFoundError:
        return 0
    step = saved["step"]
    if not isinstance(step, int) or step < 0:
        raise ValueError(f"{directory / CHECKPOINT_FILE}: step {step!r} is not a step count")
    return step


def save_step(directory: Path, step: int, extra_seconds: float) -> None:
    """Write the checkpoint so that readers see the old one or the new one, never a mix."""
    directory.mkdir(parents=True, exist_ok=True)
    state = {"step": step, "saved_at": time.time(), "job_id": os.environ.get("SLURM_JOB_ID")}
    handle, temporary = tempfile.mkstemp(prefix=".checkpoint-", dir=directory)
    try:
        with os.fdopen(handle, "w") as out:
            json.dump(state, out)
            if extra_seconds > 0:
                time.sleep(extra_seconds)
            out.flush()
            os.fsync(out.fileno())
        os.replace(temporary, directory / CHECKPOINT_FILE)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    folder = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(folder)
    finally:
        os.close(folder)


def report(saved_at: float, duration_s: float) -> None:
    """Tell the controller a checkpoint finished. Best effort: training never waits on it for
    longer than the timeout, and never stops because of it."""
    url = os.environ.get("GPU_AUTOSCALER_URL")
    job_id = os.environ.get("SLURM_JOB_ID")
    if not url or not job_id:
        return
    body = {
        "job_id": job_id,
        "at": saved_at,
        "duration_s": round(duration_s, 3),
        "node": os.environ.get("SLURMD_NODENAME"),
    }
    request = urllib.request.Request(
        url.rstrip("/") + "/v1/checkpoints",
        data=json.dumps(body).encode(),
        headers={
            "Content-Type": "application/json",
            "Authorization": f"Bearer {os.environ.get('GPU_AUTOSCALER_TOKEN', '')}",
        },
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=REPORT_TIMEOUT_S) as answer:
            answer.read()
    except (OSError, http.client.HTTPException, ValueError) as exc:
        log(f"checkpoint report failed (training goes on): {exc}")


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=DESCRIPTION)
    parser.add_argument(
        "--checkpoint-dir",
        type=Path,
        default=Path(os.environ.get("CHECKPOINT_DIR", "checkpoints")),
        help="where the checkpoint lives (shared storage, so another node can resume from it)",
    )
    parser.add_argument(
        "--checkpoint-interval",
        type=float,
        default=600.0,
        help="seconds between checkpoints; match checkpoint_interval in the job's comment",
    )
    parser.add_argument(
        "--checkpoint-cost",
        type=float,
        default=0.0,
        help="extra seconds a save takes, to stand in for writing a real model",
    )
    parser.add_argument("--step-seconds", type=float, default=1.0, help="how long a step takes")
    parser.add_argument("--steps", type=int, default=0, help="stop after this step (0: never)")
    return parser.parse_args(argv)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    requested = False

    def on_request(signum: int, frame: FrameType | None) -> None:
        nonlocal requested
        requested = True

    signal.signal(signal.SIGUSR1, on_request)

    step = load_step(args.checkpoint_dir)
    restarts = os.environ.get("SLURM_RESTART_COUNT", "0")
    log(f"start at step {step} (restart {restarts}) from {args.checkpoint_dir / CHECKPOINT_FILE}")
    last_saved = time.monotonic()
    while args.steps == 0 or step < args.steps:
        time.sleep(args.step_seconds)
        step += 1
        due = time.monotonic() - last_saved >= args.checkpoint_interval
        if not (requested or due):
            continue
        reason = "signal" if requested else "interval"
        requested = False
        started, saved_at = time.monotonic(), time.time()
        save_step(args.checkpoint_dir, step, args.checkpoint_cost)
        last_saved = time.monotonic()
        duration = last_saved - started
        log(f"checkpoint step {step} ({reason}, {duration:.3f}s)")
        report(saved_at, duration)
    log(f"done at step {step}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
