"""Run every benchmark, each in its own process, and print a summary table against the targets.

    .venv/bin/python bench/run_all.py [--ticks 40] [--skip-tick] [--skip-replay] [--skip-signals]
        [--json OUT]

Figures only: the exit status is 0 whether or not the targets are met (1 only if a benchmark
itself fails to run).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def _run(script: str, args: list[str], scratch: Path) -> dict[str, Any] | None:
    out = scratch / f"{Path(script).stem}.json"
    command = [sys.executable, str(HERE / script), *args, "--json", str(out)]
    print(f"$ {' '.join(command)}", flush=True)
    started = time.perf_counter()
    done = subprocess.run(command, check=False)
    print(f"({script} took {time.perf_counter() - started:.0f} s)\n", flush=True)
    if done.returncode != 0 or not out.exists():
        print(f"{script} failed with exit status {done.returncode}", file=sys.stderr)
        return None
    result: dict[str, Any] = json.loads(out.read_text())
    return result


def _row(
    rows: list[tuple[str, str, str, str]], what: str, value: str, target: str, ok: Any
) -> None:
    status = "" if ok is None else ("met" if ok else "MISSED")
    rows.append((what, value, target, status))


def summary_rows(
    tick: dict[str, Any] | None, replay: dict[str, Any] | None
) -> list[tuple[str, str, str, str]]:
    rows: list[tuple[str, str, str, str]] = []
    if tick is not None:
        _row(
            rows,
            "tick: median (10k inst, 2k on-prem, 100k jobs)",
            f"{tick['median_ms']:.0f} ms",
            f"<= {tick['target_median_ms']:.0f} ms",
            tick["target_met"],
        )
        _row(rows, "tick: p95", f"{tick['p95_ms']:.0f} ms", "", None)
        _row(rows, "tick: max", f"{tick['max_ms']:.0f} ms", "", None)
        _row(rows, "tick: median CPU time", f"{tick['cpu_median_ms']:.0f} ms", "", None)
        steps = tick["breakdown_ms"]
        for label in ("observe", "decide (policy + validate_plan)", "guard", "act"):
            share = 100.0 * steps[label] / tick["breakdown_mean_tick_ms"]
            _row(
                rows,
                f"tick: {label.split(' ')[0]} (mean)",
                f"{steps[label]:.0f} ms ({share:.0f} %)",
                "",
                None,
            )
    if replay is not None:
        for figures in replay.get("shipped", []):
            name = figures["policy"]
            _row(
                rows,
                f"shipped 25 d replay, {name}: wall",
                f"{figures['wall_s']:.1f} s",
                f"<= {figures['target_s']:.0f} s",
                figures["target_met"],
            )
            _row(rows, f"shipped 25 d replay, {name}: ticks", f"{figures['ticks']:,}", "", None)
            _row(
                rows,
                f"shipped 25 d replay, {name}: peak RSS",
                f"{figures['peak_rss_mib']:.0f} MiB",
                "",
                None,
            )
        synthetic = replay.get("synthetic")
        if synthetic is not None:
            _row(
                rows,
                "synthetic 30 d / 100k jobs: wall",
                f"{synthetic['wall_s']:.1f} s",
                f"<= {synthetic['target_s']:.0f} s",
                synthetic["wall_s"] <= synthetic["target_s"],
            )
            _row(
                rows,
                "synthetic 30 d / 100k jobs: peak RSS",
                f"{synthetic['peak_rss_mib']:.0f} MiB",
                f"<= {synthetic['target_mib']:.0f} MiB",
                synthetic["peak_rss_mib"] <= synthetic["target_mib"],
            )
            _row(rows, "synthetic: ticks", f"{synthetic['ticks']:,}", "", None)
            _row(
                rows,
                "synthetic: jobs finished",
                f"{synthetic['jobs_finished']:,} / {synthetic['jobs_total']:,}",
                "",
                None,
            )
    return rows


def signal_rows(
    squeue: dict[str, Any] | None,
    scrape: dict[str, Any] | None,
    notice: dict[str, Any] | None,
) -> list[tuple[str, str, str, str]]:
    rows: list[tuple[str, str, str, str]] = []
    if squeue is not None:
        _row(
            rows,
            f"squeue --json, {squeue['jobs']:,} jobs: parse + fold (median)",
            f"{squeue['parse_and_fold_median_s']:.2f} s",
            f"<= {squeue['target_s']:g} s",
            squeue["target_met"],
        )
    if scrape is not None:
        _row(
            rows,
            f"scrape + fold {scrape['nodes']:,} exporters x {scrape['gpus_per_node']} GPUs",
            f"{scrape['median_s']:.2f} s",
            f"<= {scrape['target_s']:g} s",
            scrape["target_met"],
        )
    if notice is not None:
        for cloud, figures in notice.items():
            _row(
                rows,
                f"agent notice -> controller inbox, {cloud} (median)",
                f"{figures['end_to_end']['median_ms']:.0f} ms",
                "",
                None,
            )
    return rows


def print_table(rows: Sequence[tuple[str, str, str, str]]) -> None:
    header = ("benchmark", "measured", "target", "")
    widths = [max(len(r[i]) for r in (header, *rows)) for i in range(4)]
    line = "  ".join("-" * w for w in widths)
    print("summary")
    print("  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)).rstrip())
    print(line)
    for row in rows:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--ticks", type=int, default=40, help="timed ticks in bench_tick")
    parser.add_argument("--skip-tick", action="store_true")
    parser.add_argument("--skip-replay", action="store_true")
    parser.add_argument("--skip-signals", action="store_true", help="squeue, scrape, agent notices")
    parser.add_argument("--json", type=Path, help="also write every figure here as JSON")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-") as scratch:
        tick = (
            None
            if args.skip_tick
            else _run("bench_tick.py", ["--ticks", str(args.ticks)], Path(scratch))
        )
        replay = None if args.skip_replay else _run("bench_replay.py", [], Path(scratch))
        signals: dict[str, dict[str, Any] | None] = {"squeue": None, "scrape": None, "notice": None}
        if not args.skip_signals:
            signals["squeue"] = _run("bench_squeue.py", ["--repeat", "3"], Path(scratch))
            signals["scrape"] = _run("bench_scrape.py", [], Path(scratch))
            signals["notice"] = _run("bench_agent_notice.py", [], Path(scratch))
    print_table(summary_rows(tick, replay) + signal_rows(**signals))
    if args.json is not None:
        args.json.write_text(json.dumps({"tick": tick, "replay": replay, **signals}, indent=2))
    failed = (
        (not args.skip_tick and tick is None)
        or (not args.skip_replay and replay is None)
        or (not args.skip_signals and None in signals.values())
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
