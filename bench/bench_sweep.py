"""A sweep run by each executor: wall time, CPU time, the speed-up over the first, and whether
every figure came out the same.

By default the grid is two scenarios of the shipped evaluation suite (synthetic-bursty and
alibaba-openb-early-10d) with the suite's six policies and the lower bound: 14 tasks, about
2.5 CPU-minutes. Each executor runs ``gpu-autoscaler sweep`` in a fresh process; CPU time is that
process's and its workers' (a Ray cluster's workers are not its children: their CPU is the
sum of the runs' own figures in suite.json). The load average is printed too: on a shared
machine it says more about the wall times than the executor does. Nothing is asserted.

    .venv/bin/python bench/bench_sweep.py                        # --jobs 1 and --jobs 2
    .venv/bin/python bench/bench_sweep.py --jobs 1 4 8 --ray auto
    .venv/bin/python bench/bench_sweep.py --grid my-grid.yaml --no-lower-bound
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SCENARIOS = ROOT / "autoscaler" / "data" / "scenarios"
TIMINGS = frozenset({"wall_s", "prepare_s", "replay_wall_s", "replay_cpu_s", "solve_s"})


def default_grid(folder: Path) -> Path:
    grid = folder / "grid.yaml"
    grid.write_text(
        "name: two-of-the-suite\n"
        "policies: [{name: cost-aware}, {name: cheapest-spot}, {name: on-demand}, "
        "{name: karpenter}, {name: skypilot-managed}, {name: slurm-power-save}]\n"
        "scenarios:\n"
        f"  - file: {SCENARIOS / 'synthetic-bursty.yaml'}\n"
        f"  - file: {SCENARIOS / 'alibaba-openb-early-10d.yaml'}\n"
    )
    return grid


def figures(path: Path) -> Any:
    def strip(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: strip(v) for k, v in value.items() if k not in TIMINGS}
        if isinstance(value, list):
            return [strip(v) for v in value]
        return value

    return strip(json.loads(path.read_text()))


def run_one(grid: Path, out: Path, how: list[str], extra: list[str]) -> dict[str, Any]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    load = os.getloadavg()[0]
    started = time.perf_counter()
    command = [sys.executable, "-m", "autoscaler.cli", "sweep", "--grid", str(grid)]
    done = subprocess.run(
        [*command, "--out", str(out), "--no-progress", *how, *extra],
        capture_output=True,
        text=True,
        check=False,
        cwd=ROOT,
    )
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(how)} failed: {done.stderr.strip()}")
    report = json.loads((out / "suite.json").read_text())
    runs_cpu = sum(r["replay_cpu_s"] for s in report["scenarios"] for r in s["rows"])
    return {
        "executor": " ".join(how),
        "wall_s": round(wall, 1),
        "cpu_s": round(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime, 1),
        "replays_cpu_s": round(runs_cpu, 1),
        "load_before": round(load, 1),
        "tasks": sum(len(s["rows"]) + (s["lower_bound"] is not None) for s in report["scenarios"]),
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--grid", type=Path, help="the grid (default: two suite scenarios)")
    parser.add_argument("--jobs", type=int, nargs="*", default=[1, 2], help="local pool sizes")
    parser.add_argument("--ray", action="append", default=[], help="a Ray address to run on too")
    parser.add_argument("--no-lower-bound", action="store_true")
    parser.add_argument("--json", type=Path, help="write the figures here as JSON")
    args = parser.parse_args(argv)
    extra = ["--no-lower-bound"] if args.no_lower_bound else []
    with tempfile.TemporaryDirectory(prefix="bench-sweep-") as scratch:
        folder = Path(scratch)
        grid = args.grid or default_grid(folder)
        ways = [["--jobs", str(n)] for n in args.jobs] + [["--ray", a] for a in args.ray]
        rows = []
        first: Any = None
        for k, how in enumerate(ways):
            out = folder / f"out{k}"
            row = run_one(grid, out, how, extra)
            found = figures(out / "suite.json")
            first = found if first is None else first
            row["same_figures"] = found == first
            rows.append(row)
            print(
                f"{row['executor']:>18}: {row['tasks']} tasks, {row['wall_s']:7.1f} s wall, "
                f"{row['cpu_s']:6.1f} s CPU here ({row['replays_cpu_s']:.1f} s in replays), "
                f"x{rows[0]['wall_s'] / row['wall_s']:.2f} vs the first, load "
                f"{row['load_before']} before, same figures: {row['same_figures']}",
                flush=True,
            )
    print(f"({os.cpu_count()} CPUs here)")
    if args.json is not None:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
