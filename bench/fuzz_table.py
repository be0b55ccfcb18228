"""Every input boundary fuzzed for many inputs: the issue-15 table, rerun by our own fuzzers.

Discovers ``tests/fuzz/boundary_*.py`` (each exposes ``BOUNDARIES``), and for each boundary runs
``--inputs`` generated inputs (input *i* from ``random.Random(seed + i)``, so any row can be
replayed alone) in a worker process. A worker stuck on one input past ``--hang-s`` is killed; the
input counts as a hang and the next worker starts after it. Prints, per boundary: inputs,
accepted, rejected (the boundary's own error), tracebacks, hangs, silent wrong answers, inputs
per second, and the first few examples of every failure kind.

    .venv/bin/python bench/fuzz_table.py                       # 2,000 inputs per boundary
    .venv/bin/python bench/fuzz_table.py --inputs 200000 --jobs 2 --only slurm
    .venv/bin/python bench/fuzz_table.py --only slurm --inputs 1000000 --state slurm.json
    make fuzz                                                  # the 30-minute pre-release run

``--state FILE`` (one boundary) saves the tally every minute and resumes from it, so a run of
hours survives being stopped and can be finished later: input *i* is the same input either way.
"""

from __future__ import annotations

import argparse
import importlib
import json
import multiprocessing as mp
import os
import random
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
FUZZ_DIR = ROOT / "tests" / "fuzz"
KINDS = ("accepted", "rejected", "traceback", "hang", "wrong")


def _boundaries(only: Sequence[str]) -> list[tuple[str, int, str]]:
    """(module, index, name) of every boundary, loaded once here to list them."""
    sys.path[:0] = [str(FUZZ_DIR), str(ROOT / "tests")]
    found = []
    for path in sorted(FUZZ_DIR.glob("boundary_*.py")):
        module = importlib.import_module(path.stem)
        for index, boundary in enumerate(module.BOUNDARIES):
            name = str(boundary.name)
            if not only or any(o.lower() in (path.stem + " " + name).lower() for o in only):
                found.append((path.stem, index, name))
    return found


def _worker(
    module_name: str, index: int, start: int, stop: int, seed: int, hang_s: float, out: Any
) -> None:
    sys.path[:0] = [str(FUZZ_DIR), str(ROOT / "tests")]
    from harness import classify

    boundary = importlib.import_module(module_name).BOUNDARIES[index]
    try:
        for i in range(start, stop):
            out.send(("start", i))
            data = boundary.generate(random.Random(seed + i))
            result = classify(boundary, data, hang_s)
            out.send(("done", i, result.kind, result.detail, repr(data)[:200]))
    finally:
        boundary.close()
        out.send(("end",))


@dataclass
class Row:
    name: str
    counts: Counter[str] = field(default_factory=Counter)
    examples: dict[str, list[str]] = field(default_factory=dict)
    seconds: float = 0.0
    flagged: dict[str, list[int]] = field(default_factory=dict)  # input numbers of each failure

    def add(self, kind: str, detail: str, data: str, number: int | None = None) -> None:
        self.counts[kind] += 1
        if kind not in ("accepted", "rejected"):
            kept = self.examples.setdefault(kind, [])
            if len(kept) < 3:
                kept.append(f"#{number} {detail} <- {data}")
            if number is not None:
                self.flagged.setdefault(kind, []).append(number)


def _load_state(path: Path | None, name: str, inputs: int, seed: int) -> tuple[Row, int]:
    row = Row(name)
    if path is None or not path.exists():
        return row, 0
    saved = json.loads(path.read_text())
    if (saved["name"], saved["inputs"], saved["seed"]) != (name, inputs, seed):
        raise SystemExit(f"{path}: saved for another run ({saved['name']}, {saved['inputs']})")
    row.counts.update(saved["counts"])
    row.examples = saved["examples"]
    row.seconds = saved["seconds"]
    row.flagged = saved.get("flagged", {})
    return row, int(saved["next_input"])


def _save_state(path: Path, row: Row, inputs: int, seed: int, next_input: int) -> None:
    data = {
        "name": row.name,
        "inputs": inputs,
        "seed": seed,
        "next_input": next_input,
        "counts": dict(row.counts),
        "examples": row.examples,
        "seconds": row.seconds,
        "flagged": row.flagged,
    }
    scratch = path.with_suffix(".tmp")
    scratch.write_text(json.dumps(data))
    os.replace(scratch, path)


def run_boundary(
    module: str,
    index: int,
    name: str,
    inputs: int,
    seed: int,
    hang_s: float,
    state: Path | None = None,
    start: int = 0,
) -> Row:
    row, next_input = _load_state(state, name, inputs, seed)
    next_input = max(next_input, start)
    started = time.perf_counter() - row.seconds
    saved_at = time.perf_counter()
    context = mp.get_context("spawn")
    while next_input < inputs:
        receiver, sender = context.Pipe(duplex=False)
        worker = context.Process(
            target=_worker,
            args=(module, index, next_input, inputs, seed, hang_s, sender),
            daemon=True,
        )
        worker.start()
        sender.close()
        current: int | None = None
        since = time.perf_counter()
        ended = False
        while not ended:
            # the first input also pays for the worker's imports and servers: a generous bound
            limit = hang_s * (6 if current == next_input else 2)
            if receiver.poll(0.5):
                try:
                    message = receiver.recv()
                except EOFError:
                    ended = True
                    break
                if message[0] == "start":
                    current, since = message[1], time.perf_counter()
                elif message[0] == "done":
                    row.add(message[2], message[3], message[4], message[1])
                    current = None
                    next_input = message[1] + 1
                    if state is not None and time.perf_counter() - saved_at > 60:
                        row.seconds = time.perf_counter() - started
                        _save_state(state, row, inputs, seed, next_input)
                        saved_at = time.perf_counter()
                else:
                    ended = True
            elif current is not None and time.perf_counter() - since > limit:
                worker.kill()
                row.add("hang", f"killed after {limit:.0f} s", f"input #{current}", current)
                next_input = current + 1
                ended = True
            elif not worker.is_alive() and not receiver.poll(0):
                if current is not None:  # the worker died on this input (a crash, not Python)
                    row.add(
                        "traceback",
                        f"worker died (exit {worker.exitcode})",
                        f"input #{current}",
                        current,
                    )
                    next_input = current + 1
                ended = True
        worker.join(5)
    row.seconds = time.perf_counter() - started
    if state is not None:
        _save_state(state, row, inputs, seed, next_input)
    return row


def confirm_hangs(module: str, index: int, row: Row, seed: int, hang_s: float) -> None:
    """Re-run each input counted as a hang alone, one worker each: one that now finishes within
    the limit was slow only because the machine was busy (or the run was paused), so it is
    counted as ``slow under load`` with the kind it really has; one that hangs again stays."""
    for number in list(row.flagged.get("hang", [])):
        confirmation = run_boundary(module, index, row.name, number + 1, seed, hang_s, start=number)
        again = [kind for kind, count in confirmation.counts.items() if count]
        if again != ["hang"]:
            row.counts["hang"] -= 1
            row.counts["slow under load"] += 1
            row.flagged["hang"].remove(number)
            row.flagged.setdefault("slow under load", []).append(number)
            for kind in again:
                row.counts[kind] += 1
                if kind not in ("accepted", "rejected"):
                    row.flagged.setdefault(kind, []).append(number)


def render(rows: Sequence[Row]) -> str:
    lines = [
        "| boundary | inputs | accepted | rejected | tracebacks | hangs | silent wrong "
        "| slow only under load | inputs/s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        total = sum(row.counts[kind] for kind in KINDS)
        rate = total / row.seconds if row.seconds else 0.0
        lines.append(
            f"| {row.name} | {total:,} | {row.counts['accepted']:,} | {row.counts['rejected']:,} "
            f"| {row.counts['traceback']:,} | {row.counts['hang']:,} | {row.counts['wrong']:,} "
            f"| {row.counts['slow under load']:,} | {rate:,.0f} |"
        )
    for row in rows:
        for kind, examples in row.examples.items():
            for example in examples:
                lines.append(f"- {row.name}: {kind}: {example}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--inputs", type=int, default=2000, help="inputs per boundary")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--hang-s", type=float, default=10.0)
    parser.add_argument("--only", action="append", default=[], help="boundary name part")
    parser.add_argument("--jobs", type=int, default=2, help="boundaries fuzzed at once")
    parser.add_argument("--state", type=Path, help="save and resume the tally here (one boundary)")
    args = parser.parse_args(argv)
    found = _boundaries(args.only)
    if not found:
        print("no boundary matched", file=sys.stderr)
        return 2
    if args.state is not None and len(found) != 1:
        print("--state needs exactly one boundary (narrow it with --only)", file=sys.stderr)
        return 2
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max(1, args.jobs)) as pool:
        futures = [
            pool.submit(
                run_boundary, module, index, name, args.inputs, args.seed, args.hang_s, args.state
            )
            for module, index, name in found
        ]
        rows = []
        for (module, index, _name), future in zip(found, futures, strict=True):
            row = future.result()
            confirm_hangs(module, index, row, args.seed, args.hang_s)
            if args.state is not None:
                _save_state(args.state, row, args.inputs, args.seed, args.inputs)
            print(f"{row.name}: {dict(row.counts)} in {row.seconds:.0f} s", flush=True)
            rows.append(row)
    print()
    print(render(rows))
    failures = sum(r.counts["traceback"] + r.counts["hang"] + r.counts["wrong"] for r in rows)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
