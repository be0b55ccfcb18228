"""Folding pending jobs into demand groups (``autoscaler.spi.sources.aggregate``), the work every
queue source pays on every tick, on 100,000 jobs: CPU time per fold over repeated runs.

Two job sets: Slurm-like numeric ids with few groups, and ``bench_tick``'s world (288 groups of
about 350 jobs, ``job-NNNNNN`` ids). Each group also names its eight longest-waiting jobs (what
on-prem rebalancing makes room for). Figures only; nothing is asserted.

    .venv/bin/python bench/bench_aggregate.py [--jobs 100000] [--repeats 9]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from autoscaler.model import Job
from autoscaler.spi.sources import aggregate


def slurm_like(n: int, rng: random.Random) -> list[Job]:
    return [
        Job(
            id=str(1_000_000 + k),
            gpus=rng.choice([1, 2, 4, 8]),
            submit_time=rng.uniform(0, 1e6),
            checkpoint_interval_s=rng.choice([None, 3600.0]),
            high_priority=rng.random() < 0.1,
        )
        for k in range(n)
    ]


def tick_world(n: int, rng: random.Random) -> list[Job]:
    jobs = []
    for k in range(n):
        checkpointable = rng.random() < 0.55
        jobs.append(
            Job(
                id=f"job-{k:06d}",
                gpus=rng.choices((1, 2, 4, 8), weights=(70, 12, 10, 8))[0],
                submit_time=1e6 - rng.uniform(0, 6 * 3600),
                high_priority=rng.random() < 0.1,
                checkpoint_interval_s=rng.choice((900.0, 1800.0, 3600.0))
                if checkpointable
                else None,
                checkpoint_duration_s=60.0 if checkpointable else None,
                gpu_models=rng.choices(((), ("A100-80GB",), ("H100",)), weights=(80, 15, 5))[0],
                partition=rng.choice(("batch", "train", "interactive")),
            )
        )
    return jobs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=9)
    args = parser.parse_args()
    for name, make in (("slurm-like ids", slurm_like), ("bench_tick's world", tick_world)):
        jobs = make(args.jobs, random.Random(7))
        times = []
        groups = 0
        for _ in range(args.repeats):
            started = time.process_time()
            groups = len(aggregate(jobs))
            times.append(time.process_time() - started)
        print(
            f"{name:20} {args.jobs:,} jobs -> {groups} groups: CPU per fold median "
            f"{statistics.median(times) * 1000:.1f} ms, min {min(times) * 1000:.1f} ms"
        )


if __name__ == "__main__":
    main()
