"""What the Slurm adapter's placement costs per tick on a 100,000-job queue: the pass that reads
each job's placement facts from the ``squeue --json`` demand was decoded from (the tick's one
``squeue``), and deciding which jobs' spot partitions change.

The document is bench_squeue.py's (every job with all of Slurm's ~110 fields; 85 % pending,
partitions ``gpu``/``onprem``/``big``, 40 % checkpointing, 5 % high priority). Two decisions are
timed: the first tick (every spot-safe pending job in a base partition gets its twin, up to the
per-tick bound) and a steady tick (the same queue with those changes made: nothing to change).
Prints the decode and demand pass (what a tick pays without placement), the placement facts
pass, the two decisions, the jobs changed and the ``scontrol`` commands they take; best of
``--repeat`` runs. Figures only.

    .venv/bin/python bench/bench_slurm_placement.py [--jobs 100000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import time

from bench_squeue import build_document

from autoscaler.model import Placement
from autoscaler.sources.slurm import JOB_BATCH
from autoscaler.sources.slurm_json import DemandRules, fold, iter_pending, load_jobs, queue_facts
from autoscaler.sources.slurm_placement import partition_plan

TWINS = {"gpu": "gpu-spot", "big": "big-spot"}
PLACEMENT = Placement(protect_uncheckpointable=True, protect_high_priority=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--most", type=int, default=5000, help="placement_jobs_per_tick")
    options = parser.parse_args()
    document = build_document(options.jobs)
    rules = DemandRules(high_priority_min=100_000)
    decodes, demands, reads, firsts, steadies = [], [], [], [], []
    for _ in range(options.repeat):
        started = time.perf_counter()
        jobs = load_jobs(document)
        decodes.append(time.perf_counter() - started)
        started = time.perf_counter()
        fold(iter_pending(jobs, rules))
        demands.append(time.perf_counter() - started)
        started = time.perf_counter()
        queue = queue_facts(jobs, rules, frozenset(TWINS))
        reads.append(time.perf_counter() - started)
        started = time.perf_counter()
        first = partition_plan(queue, PLACEMENT, TWINS, options.most)
        firsts.append(time.perf_counter() - started)
        unbounded = partition_plan(queue, PLACEMENT, TWINS, len(queue))
        new = {j: u.partitions for u in unbounded.updates for j in u.job_ids}
        settled = [
            j._replace(partitions=tuple(new[j.id].split(","))) if j.id in new else j for j in queue
        ]
        started = time.perf_counter()
        steady = partition_plan(settled, PLACEMENT, TWINS, options.most)
        steadies.append(time.perf_counter() - started)
    commands = sum(-(-len(u.job_ids) // JOB_BATCH) for u in first.updates)
    print(f"queue: {options.jobs:,} jobs, {len(document) / 1e6:.0f} MB of squeue --json")
    print(f"decode: {min(decodes):.2f} s; demand pass: {min(demands):.2f} s (without placement)")
    print(f"placement facts pass: {min(reads):.2f} s")
    print(
        f"first tick: {first.jobs:,} jobs change ({first.deferred:,} left for later ticks) in "
        f"{commands} scontrol commands; decided in {min(firsts) * 1000:.0f} ms"
    )
    print(f"steady tick: {steady.jobs} jobs change; decided in {min(steadies) * 1000:.0f} ms")


if __name__ == "__main__":
    main()
