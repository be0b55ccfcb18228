"""Reading a 100,000-job ``squeue --json`` into demand groups, as the Slurm adapter does per tick.

The document is built from the jobs captured on the test cluster (tests/data/slurm/squeue.json,
Slurm 22.05.8), so every job carries all of Slurm's ~110 fields: 85 % pending (1/2/4/8 GPUs per
node, per job or per task; some array records, some multi-node), the rest running; partitions
``gpu``/``onprem``/``big``, 40 % with a checkpoint comment, 5 % with a high priority, a few held
or waiting on a dependency. Prints the document's size, the time decoding the fields we read
takes (msgspec, skipping the rest), the time the field pass and fold take, the total, and for
comparison the standard library's ``json.loads`` of the whole document; best of ``--repeat``
runs. Figures only.

    .venv/bin/python bench/bench_squeue.py [--jobs 100000] [--repeat 5] [--json OUT.json]
"""

from __future__ import annotations

import argparse
import copy
import json
import random
import statistics
import time
from pathlib import Path
from typing import Any

from autoscaler.sources.slurm import DEFAULT_IGNORED_REASONS
from autoscaler.sources.slurm_json import DemandRules, demand_groups, fold, iter_pending, load_jobs

CAPTURED = Path(__file__).resolve().parent.parent / "tests" / "data" / "slurm" / "squeue.json"
TARGET_S = 1.0


def build_document(jobs: int, seed: int = 1) -> bytes:
    captured = json.loads(CAPTURED.read_text())
    pending = next(j for j in captured["jobs"] if j["job_state"] == "PENDING")
    running = next(j for j in captured["jobs"] if j["job_state"] == "RUNNING")
    rng = random.Random(seed)
    out = []
    for job_id in range(1, jobs + 1):
        is_running = rng.random() < 0.15
        job = copy.copy(running if is_running else pending)
        gpus = rng.choices([1, 2, 4, 8], weights=[70, 12, 10, 8])[0]
        model = rng.choice(["", "", "", "a100:", "h100:"])
        where = rng.choices(["tres_per_node", "tres_per_job", "tres_per_task"], [85, 10, 5])[0]
        job.update(
            job_id=job_id,
            tres_per_node="",
            tres_per_job="",
            tres_per_task="",
            submit_time=1_795_000_000 + rng.randrange(86_400),
            partition=rng.choice(["gpu", "gpu", "onprem", "big"]),
            comment=(
                f"checkpoint_interval={rng.choice([300, 600, 1800])} checkpoint_duration=30"
                if rng.random() < 0.4
                else ""
            ),
            priority=rng.choice([100_000] + [1] * 19),
            node_count=2 if rng.random() < 0.03 else 1,
            tasks=1,
            array_task_string="0-31%8" if rng.random() < 0.01 else "",
            array_max_tasks=0,
        )
        job[where] = f"gres:gpu:{model}{gpus}"
        if not is_running:
            job["state_reason"] = rng.choices(
                ["Priority", "Resources", "Dependency", "JobHeldUser"], [80, 15, 4, 1]
            )[0]
        out.append(job)
    document = {"meta": captured["meta"], "errors": [], "jobs": out}
    return json.dumps(document).encode()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()

    rules = DemandRules(ignored_reasons=frozenset(DEFAULT_IGNORED_REASONS), high_priority_min=1000)
    started = time.perf_counter()
    document = build_document(args.jobs)
    print(
        f"built a {args.jobs:,}-job squeue --json document: {len(document) / 1e6:.0f} MB "
        f"in {time.perf_counter() - started:.1f} s"
    )
    decodes, fields, totals, stdlib = [], [], [], []
    groups: list[Any] = []
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        jobs = load_jobs(document)
        t1 = time.perf_counter()
        groups = fold(iter_pending(jobs, rules))
        t2 = time.perf_counter()
        demand_groups(document, rules)
        t3 = time.perf_counter()
        json.loads(document)
        t4 = time.perf_counter()
        decodes.append(t1 - t0)
        fields.append(t2 - t1)
        totals.append(t3 - t2)
        stdlib.append(t4 - t3)
    figures = {
        "jobs": args.jobs,
        "document_mb": round(len(document) / 1e6, 1),
        "decode_s": round(min(decodes), 3),
        "field_pass_and_fold_s": round(min(fields), 3),
        "parse_and_fold_s": round(min(totals), 3),
        "parse_and_fold_median_s": round(statistics.median(totals), 3),
        "stdlib_json_loads_s": round(min(stdlib), 3),
        "groups": len(groups),
        "pending_jobs": sum(g.jobs for g in groups),
        "target_s": TARGET_S,
        "target_met": statistics.median(totals) <= TARGET_S,
    }
    print(
        f"decode (msgspec, read fields only): {figures['decode_s']:.3f} s (best of {args.repeat})"
    )
    print(f"field pass + fold:                  {figures['field_pass_and_fold_s']:.3f} s")
    print(
        f"parse + fold (total):               {figures['parse_and_fold_s']:.3f} s best, "
        f"{figures['parse_and_fold_median_s']:.3f} s median (target <= {TARGET_S:g} s)"
    )
    print(
        f"for comparison, json.loads of the whole document: {figures['stdlib_json_loads_s']:.3f} s"
    )
    print(f"-> {figures['pending_jobs']:,} pending GPU jobs in {figures['groups']} demand groups")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")


if __name__ == "__main__":
    main()
