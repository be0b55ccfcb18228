"""Write a deterministic synthetic GPU job trace in the schema of the shipped traces.

The generator and its families live in ``autoscaler/sim/synthetic.py`` (documented there and in
docs/evaluation.md); this script writes one to a file. ``mixed`` (the default) is the bench's
general trace: diurnal Poisson arrivals (4:1 peak to trough, quieter weekends), lognormal
durations (median 15 min, capped at 3 days), 82 % one-GPU jobs, 40 % preemptible. The same
family, size and seed give the same file.

    .venv/bin/python bench/synthetic_trace.py OUT.csv --jobs 100000 --days 30 --seed 1
    .venv/bin/python bench/synthetic_trace.py OUT.csv --family multinode --jobs 3000 --days 10
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import get_args

from autoscaler.sim.synthetic import DAY, Family, SyntheticTraceSpec, generate, write_rows


@dataclass(frozen=True)
class TraceSummary:
    jobs: int
    days: float
    gpu_hours: float
    mean_demand_gpus: float
    preemptible_share: float
    censored: int
    median_duration_s: float
    max_duration_s: float
    multi_node_jobs: int
    pinned_jobs: int


def summarise(rows: Sequence[dict[str, str]], days: float) -> TraceSummary:
    gpu_s = 0.0
    durations = []
    for row in rows:
        if row["duration_s"]:
            d = float(row["duration_s"])
            durations.append(d)
            gpu_s += d * int(row["num_gpus"])
    durations.sort()
    return TraceSummary(
        jobs=len(rows),
        days=days,
        gpu_hours=gpu_s / 3600.0,
        mean_demand_gpus=gpu_s / (days * DAY),
        preemptible_share=sum(r["preemptible"] == "1" for r in rows) / max(1, len(rows)),
        censored=sum(r["censored"] == "right" for r in rows),
        median_duration_s=durations[len(durations) // 2] if durations else 0.0,
        max_duration_s=durations[-1] if durations else 0.0,
        multi_node_jobs=sum(r["num_nodes"] not in ("", "1") for r in rows),
        pinned_jobs=sum(bool(r["gpu_model"]) for r in rows),
    )


def write_trace(
    path: Path, jobs: int, days: float, seed: int, family: Family = "mixed"
) -> TraceSummary:
    spec = SyntheticTraceSpec(family=family, jobs=jobs, days=days, seed=seed)
    rows = generate(spec)
    write_rows(path, rows)
    return summarise(rows, days)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("out", type=Path, help="CSV file to write")
    parser.add_argument("--family", choices=get_args(Family), default="mixed")
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--days", type=float, default=30.0)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    if args.jobs <= 0 or args.days <= 0 or args.seed < 0:
        parser.error("--jobs and --days must be positive and --seed not negative")
    summary = write_trace(args.out, args.jobs, args.days, args.seed, args.family)
    print(
        f"wrote {args.out} ({args.family}): {summary.jobs:,} jobs over {summary.days:g} days, "
        f"{summary.gpu_hours:,.0f} GPU-hours (mean demand {summary.mean_demand_gpus:.0f} GPUs), "
        f"{summary.preemptible_share:.0%} preemptible, median duration "
        f"{summary.median_duration_s:.0f} s, longest {summary.max_duration_s / 3600:.1f} h, "
        f"{summary.censored} right-censored, {summary.multi_node_jobs} multi-node, "
        f"{summary.pinned_jobs} pinned to a GPU model"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
