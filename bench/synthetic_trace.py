"""A deterministic synthetic GPU job trace in the schema of the shipped traces.

Arrivals are a Poisson process with a diurnal and weekly rate (busiest in the afternoon, a 4:1
swing between peak and trough, weekends at 60 %), conditioned on the requested number of jobs;
durations are lognormal (median 15 min, heavy tail capped at 3 days); most jobs take one GPU,
some 2, 4 or 8; about 40 % are preemptible best-effort (BE) jobs. Jobs still running when the
trace ends are right-censored, as in the shipped trace. The same seed gives the same file.

    .venv/bin/python bench/synthetic_trace.py OUT.csv --jobs 100000 --days 30 --seed 1
"""

from __future__ import annotations

import argparse
import csv
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

COLUMNS = (
    "job_id",
    "submit_time_s",
    "start_time_s",
    "duration_s",
    "num_gpus",
    "gpu_fraction",
    "num_cpus",
    "status",
    "queue_delay_s",
    "user_group",
    "priority_class",
    "preemptible",
    "gpu_model",
    "censored",
    "deadline_s",
)
DAY = 86_400.0

# Priority classes of the Alibaba openb trace, with this trace's shares.
PRIORITY_CLASSES = ("LS", "BE", "Burstable", "Guaranteed")
PRIORITY_SHARES = (0.50, 0.40, 0.07, 0.03)
GPU_COUNTS = (1, 2, 4, 8)
GPU_SHARES = (0.82, 0.07, 0.06, 0.05)
# Share of a GPU a single-GPU job uses (the shipped trace's most common values).
FRACTIONS = (1.0, 0.81, 0.47, 0.32, 0.65, 0.46, 0.23, 0.55)
FRACTION_SHARES = (0.58, 0.16, 0.08, 0.05, 0.04, 0.04, 0.03, 0.02)
USER_GROUPS = tuple(f"team-{k:02d}" for k in range(12))

MEDIAN_DURATION_S = 900.0
DURATION_SIGMA = 1.6
MIN_DURATION_S = 10.0
MAX_DURATION_S = 3 * DAY
PEAK_HOUR = 14.0
DIURNAL_AMPLITUDE = 0.6
WEEKEND_FACTOR = 0.6


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


def arrival_rate(t: np.ndarray) -> np.ndarray:
    """Relative arrival rate at trace seconds ``t`` (day 0 is a Monday); at most 1.6."""
    hour = (t % DAY) / 3600.0
    diurnal = 1.0 + DIURNAL_AMPLITUDE * np.cos(2.0 * math.pi * (hour - PEAK_HOUR) / 24.0)
    weekday = (t // DAY) % 7
    weekly = np.where(weekday >= 5, WEEKEND_FACTOR, 1.0)
    return diurnal * weekly


def arrivals(rng: np.random.Generator, jobs: int, horizon_s: float) -> np.ndarray:
    """``jobs`` arrival times of the non-homogeneous Poisson process, given that many arrived:
    independent draws from the rate's density (by thinning), sorted."""
    peak = 1.0 + DIURNAL_AMPLITUDE
    kept: list[np.ndarray] = []
    have = 0
    while have < jobs:
        candidates = rng.uniform(0.0, horizon_s, size=2 * (jobs - have) + 1024)
        accept = rng.uniform(0.0, peak, size=candidates.size) < arrival_rate(candidates)
        chosen = candidates[accept]
        kept.append(chosen)
        have += chosen.size
    return np.sort(np.concatenate(kept)[:jobs])


def generate(jobs: int, days: float, seed: int) -> list[dict[str, str]]:
    """The trace's rows, in submission order."""
    if jobs <= 0 or days <= 0:
        raise ValueError("jobs and days must be positive")
    rng = np.random.default_rng(seed)
    horizon = days * DAY
    submit = np.floor(arrivals(rng, jobs, horizon)).astype(np.int64)
    priority = rng.choice(len(PRIORITY_CLASSES), size=jobs, p=PRIORITY_SHARES)
    gpus = np.asarray(GPU_COUNTS)[rng.choice(len(GPU_COUNTS), size=jobs, p=GPU_SHARES)]
    fraction = np.asarray(FRACTIONS)[rng.choice(len(FRACTIONS), size=jobs, p=FRACTION_SHARES)]
    fraction = np.where(gpus > 1, 1.0, fraction)
    cpus_per_gpu = rng.choice((3.152, 4.0, 8.0, 11.3, 12.0), size=jobs)
    duration = np.exp(rng.normal(math.log(MEDIAN_DURATION_S), DURATION_SIGMA, size=jobs))
    duration = np.clip(np.rint(duration), MIN_DURATION_S, MAX_DURATION_S).astype(np.int64)
    delayed = rng.uniform(size=jobs) < 0.3
    delay = np.where(delayed, np.rint(rng.exponential(120.0, size=jobs)), 0).astype(np.int64)
    start = submit + delay
    failed = rng.uniform(size=jobs) < 0.25
    group = rng.choice(len(USER_GROUPS), size=jobs, p=_zipf_shares(len(USER_GROUPS)))

    rows: list[dict[str, str]] = []
    end_of_trace = int(horizon)
    for i in range(jobs):
        cls = PRIORITY_CLASSES[priority[i]]
        begin = int(start[i])
        run = int(duration[i])
        censored = "none"
        status = "Failed" if failed[i] else "Succeeded"
        if begin >= end_of_trace:
            begin, run, status, censored = end_of_trace, 0, "Pending", "right"
        elif begin + run > end_of_trace:
            run, status, censored = end_of_trace - begin, "Running", "right"
        rows.append(
            {
                "job_id": f"syn-{seed}-{i:07d}",
                "submit_time_s": str(int(submit[i])),
                "start_time_s": str(begin),
                "duration_s": str(run) if status != "Pending" else "",
                "num_gpus": str(int(gpus[i])),
                "gpu_fraction": f"{fraction[i]:g}",
                "num_cpus": f"{cpus_per_gpu[i] * gpus[i]:.3f}".rstrip("0").rstrip("."),
                "status": status,
                "queue_delay_s": str(int(delay[i])),
                "user_group": USER_GROUPS[group[i]],
                "priority_class": cls,
                "preemptible": "1" if cls == "BE" else "0",
                "gpu_model": "",
                "censored": censored,
                "deadline_s": "",
            }
        )
    return rows


def _zipf_shares(n: int) -> np.ndarray:
    weights: np.ndarray = 1.0 / np.arange(1, n + 1)
    shares: np.ndarray = weights / weights.sum()
    return shares


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
    )


def write_trace(path: Path, jobs: int, days: float, seed: int) -> TraceSummary:
    rows = generate(jobs, days, seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=COLUMNS, lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
    return summarise(rows, days)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("out", type=Path, help="CSV file to write")
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--days", type=float, default=30.0)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    summary = write_trace(args.out, args.jobs, args.days, args.seed)
    print(
        f"wrote {args.out}: {summary.jobs:,} jobs over {summary.days:g} days, "
        f"{summary.gpu_hours:,.0f} GPU-hours (mean demand {summary.mean_demand_gpus:.0f} GPUs), "
        f"{summary.preemptible_share:.0%} preemptible, median duration "
        f"{summary.median_duration_s:.0f} s, longest {summary.max_duration_s / 3600:.1f} h, "
        f"{summary.censored} right-censored"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
