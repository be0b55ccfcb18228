"""How fast ``trace import`` reads a large site's history: ``sacct --json`` and ``sacct -P`` of
100,000 jobs (the captured 22.05 records repeated under new ids, steps and all), and the jobs
inferred from a 30-day per-minute demand series. Prints seconds and jobs per second.

    .venv/bin/python bench/bench_trace_import.py [--jobs 100000]
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import tempfile
import time
from pathlib import Path

from autoscaler.sim.demand_series import infer
from autoscaler.sim.importers.sacct import to_trace
from autoscaler.sim.importers.sacct_json import read_sacct_json
from autoscaler.sim.importers.sacct_text import read_sacct_text

DATA = Path(__file__).resolve().parent.parent / "tests" / "data" / "trace_import"


def _big_json(jobs: int, folder: Path) -> Path:
    document = json.loads((DATA / "sacct-22.05.json").read_text())
    template = document["jobs"]
    out = []
    for i in range(jobs):
        job = copy.deepcopy(template[i % len(template)])
        job["job_id"] = 100 + i
        job["array"]["job_id"] = 0
        job["time"]["submission"] += i
        out.append(job)
    document["jobs"] = out
    path = folder / "sacct.json"
    path.write_text(json.dumps(document))
    return path


def _big_text(jobs: int, folder: Path) -> Path:
    lines = (DATA / "sacct-22.05.txt").read_text().splitlines()
    header, rows = lines[0], lines[1:]
    out = [header]
    for i in range(jobs):
        fields = rows[i % len(rows)].split("|")
        fields[0] = str(100 + i)
        out.append("|".join(fields))
    path = folder / "sacct.txt"
    path.write_text("\n".join(out) + "\n")
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--jobs", type=int, default=100_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        for name, make, read in (
            ("sacct --json", _big_json, read_sacct_json),
            ("sacct -P", _big_text, read_sacct_text),
        ):
            path = make(args.jobs, Path(folder))
            started = time.perf_counter()
            imported = to_trace(read(path))
            seconds = time.perf_counter() - started
            size = path.stat().st_size / 2**20
            print(
                f"{name}: {args.jobs:,} records ({size:,.0f} MiB) -> {len(imported.rows):,} jobs "
                f"in {seconds:.2f} s ({args.jobs / seconds:,.0f} records/s)"
            )
    minutes = 30 * 24 * 60
    samples = [
        (
            60.0 * i,
            float(max(0, round(40 * math.sin(i / 97)))),
            float(200 + round(80 * math.sin(i / 300))),
        )
        for i in range(minutes + 1)
    ]
    started = time.perf_counter()
    inference = infer(samples)
    seconds = time.perf_counter() - started
    print(
        f"demand series: {len(samples):,} samples (30 days per minute) -> "
        f"{len(inference.jobs):,} jobs in {seconds:.2f} s"
    )


if __name__ == "__main__":
    main()
