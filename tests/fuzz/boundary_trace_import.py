"""Fuzz boundary: ``gpu-autoscaler trace import`` (``sacct --json``, ``sacct -P``, a Prometheus
``query_range`` answer, a CSV of pending and running GPUs), run in this process as a user runs
it.

The rules checked for every input, independently of the code under test:

* exit 0 or exit 2 with one error line that names one of the input files and the line in it
  (or the whole file, for a problem of the whole file: empty, not one series, no GPU job...),
  never a traceback;
* an accepted sacct file gives a trace whose every row, read here with the ``csv`` module, has
  a unique id, finite non-negative times with the start not before the submission, 1 to 65,536
  GPUs spread evenly over its nodes; and the simulator's trace reader takes the file;
* an accepted series is written so that the simulator's series reader takes it back sample for
  sample, and the jobs inferred from it hold, at every sample, the series' running GPUs rounded
  to jobs, with every arrival either a job, counted as left unseen, or counted as pending at the
  end (the arrivals counted here from the rounded series alone).
"""

from __future__ import annotations

import csv
import itertools
import json
import math
import random
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

from boundary_config import CliRun, run_cli
from harness import Outcome, mutate_text

from autoscaler.model.errors import InputError

DATA = Path(__file__).resolve().parent.parent / "data" / "trace_import"
T0 = 1_795_500_000
WHOLE_FILE = (
    "no such file",
    "cannot be read",
    "larger than",
    "empty",
    "nested too deeply",
    "no GPU job that ran",
    "share no time range",
    "needs at least two",
    "the series spans",
    "would be inferred",
    "must be three columns",
)
HOSTILE: list[Any] = [
    None, -1, 0, 2**64, 2**70, 1.5, 1e308, "", "x", "NaN", "1e999", "٣", True, [], {}, [[]],
    {"set": True, "number": -5}, {"set": False}, {"infinite": True}, "gres/gpu=2", "x" * 5000,
    "CANCELLED by 0", ["RUNNING", 5], 253402300800, 4_000_000_000,
]  # fmt: skip
LIMIT_CHECKS = 2_000_000  # (samples x jobs) beyond which the running check is skipped


def _answer(values: list[tuple[int, int]], series: int = 1) -> str:
    return json.dumps(
        {
            "status": "success",
            "data": {
                "resultType": "matrix",
                "result": [
                    {
                        "metric": {"partition": f"p{s}"},
                        "values": [[T0 + 60 * t, str(v)] for t, v in values],
                    }
                    for s in range(series)
                ],
            },
        },
        indent=1,
    )


def trace_import_seeds() -> list[dict[str, Any]]:
    pending = [(t, max(0, 3 - abs(t - 4))) for t in range(10)]
    running = [(t, 2 + t % 3) for t in range(10)]
    return [
        {"kind": "sacct", "files": {"sacct.json": (DATA / "sacct-22.05.json").read_text()}},
        {"kind": "sacct", "files": {"sacct.txt": (DATA / "sacct-22.05.txt").read_text()}},
        {
            "kind": "sacct",
            "files": {"sacct.txt": (DATA / "sacct-22.05-epoch-steps.txt").read_text()},
        },
        {
            "kind": "prometheus",
            "files": {"pending.json": _answer(pending, 2), "running.json": _answer(running)},
            "job_gpus": 1,
        },
        {
            "kind": "csv",
            "files": {
                "dash.csv": "time_s,pending_gpus,running_gpus\n"
                + "".join(
                    f"{T0 + 60 * t},{p},{r}\n"
                    for (t, p), (_, r) in zip(pending, running, strict=True)
                )
            },
            "job_gpus": 2,
        },
    ]


def _paths(value: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    found = [path]
    if isinstance(value, dict):
        for key, inner in value.items():
            found += _paths(inner, (*path, key))
    elif isinstance(value, list):
        for index, inner in enumerate(value[:40]):
            found += _paths(inner, (*path, index))
    return found


def _replace(document: Any, path: tuple[Any, ...], value: Any) -> Any:
    if not path:
        return value
    target = document
    for part in path[:-1]:
        target = target[part]
    target[path[-1]] = value
    return document


def mutate_json(text: str, rng: random.Random) -> str:
    """A value deep in a valid document replaced, removed or duplicated: what a careless edit or
    a Slurm release of another shape does."""
    document = json.loads(text)
    path = rng.choice(_paths(document))
    choice = rng.randrange(3)
    if choice == 0 or not path:
        document = _replace(document, path, rng.choice(HOSTILE))
    elif choice == 1:
        parent = document
        for part in path[:-1]:
            parent = parent[part]
        del parent[path[-1]]
    else:
        parent = document
        for part in path[:-1]:
            parent = parent[part]
        if isinstance(parent, list):
            parent.insert(path[-1], parent[path[-1]])
        else:
            parent[path[-1]] = [parent[path[-1]]] * 2
    return json.dumps(document, indent=rng.choice([None, 1]))


def hostile_import(seeds: list[dict[str, Any]], rng: random.Random) -> dict[str, Any]:
    seed = rng.choice(seeds)
    files = dict(seed["files"])
    name = rng.choice(sorted(files))
    text = files[name]
    if name.endswith(".json") and rng.random() < 0.6:
        files[name] = mutate_json(text, rng)
    else:
        for _ in range(rng.choice([1, 1, 2, 3])):
            text = mutate_text(text, rng)
        files[name] = text
    job_gpus = seed.get("job_gpus", 1)
    if rng.random() < 0.2:
        job_gpus = rng.choice([0, -1, 1, 3, 65_537])
    return {**seed, "files": files, "job_gpus": job_gpus}


def _error_problem(run: CliRun, names: list[str]) -> str | None:
    lines = run.error_lines
    if len(lines) != 1:
        return f"expected one error line, got {len(lines)}: {run.err[:200]!r}"
    line = lines[0]
    if line.startswith(("error: --job-gpus:", "error: --origin")):
        return None
    for name in names:
        if line.startswith(f"error: {name}:"):
            rest = line[len(f"error: {name}") :]
            if re.match(r"^:\d+: ", rest) or any(w in rest for w in WHOLE_FILE):
                return None
            return f"the error names no line: {line[:200]!r}"
    return f"the error names none of the input files: {line[:200]!r}"


def _finite(cell: str, *, integer: bool = False) -> float | None:
    try:
        value = float(cell)
    except ValueError:
        return None
    if not math.isfinite(value) or value < 0 or (integer and not value.is_integer()):
        return None
    return value


def trace_problem(path: Path) -> str | None:
    """Why an imported trace breaks the trace rules, read with the csv module alone."""
    with path.open(newline="", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    seen: set[str] = set()
    for number, row in enumerate(rows, start=2):
        if not row["job_id"] or row["job_id"] in seen:
            return f"line {number}: job id {row['job_id']!r} empty or repeated"
        seen.add(row["job_id"])
        submit, start = _finite(row["submit_time_s"]), _finite(row["start_time_s"])
        duration = _finite(row["duration_s"])
        gpus = _finite(row["num_gpus"], integer=True)
        nodes = _finite(row["num_nodes"], integer=True)
        if submit is None or start is None or duration is None or start < submit:
            return f"line {number}: times {row['submit_time_s']}/{row['start_time_s']} bad"
        if gpus is None or not 1 <= gpus <= 65_536 or nodes is None or nodes < 1 or gpus % nodes:
            return f"line {number}: {row['num_gpus']} GPUs on {row['num_nodes']} nodes"
        if row["censored"] not in ("none", "right"):
            return f"line {number}: censored {row['censored']!r}"
    return None


def _units(gpus: float, job_gpus: int) -> int:
    return math.floor(gpus / job_gpus + 0.5)


def series_problem(path: Path, job_gpus: int) -> str | None:
    """The written series read back by the simulator, and its inferred jobs checked against
    the rounded series."""
    from autoscaler.sim.demand_series import infer, read_series

    try:
        samples = read_series(path)
    except InputError as exc:
        return f"the simulator refuses the series the import wrote: {exc}"
    inference = infer(samples, job_gpus)
    units = [(_units(p, job_gpus), _units(r, job_gpus)) for _, p, r in samples]
    arrived = sum(units[0]) + sum(
        max(0, (p1 + r1) - (p0 + r0)) + max(0, (r0 - r1) - max(0, (p0 + r0) - (p1 + r1)))
        for (p0, r0), (p1, r1) in itertools.pairwise(units)
    )
    accounted = len(inference.jobs) + inference.left_unseen + inference.pending_at_end
    if accounted != arrived:
        return f"{accounted} jobs accounted for, {arrived} arrived"
    if len(samples) * len(inference.jobs) <= LIMIT_CHECKS:
        origin = samples[0][0]
        for (t, _, _), (_, r) in zip(samples, units, strict=True):
            held = sum(
                1
                for j in inference.jobs
                if j.start <= t - origin and (j.end is None or j.end > t - origin)
            )
            if held != r:
                return f"at {t:g} s the jobs hold {held} units, the series {r}"
    figures = (inference.series_running_gpu_s, inference.inferred_running_gpu_s)
    if not all(math.isfinite(f) and f >= 0 for f in figures):
        return f"GPU-seconds {figures} not finite"
    return None


class TraceImportBoundary:
    name = "trace import: sacct --json / -P, Prometheus query_range, demand CSV"

    def __init__(self) -> None:
        self._seeds: list[dict[str, Any]] | None = None

    def seeds(self) -> list[dict[str, Any]]:
        if self._seeds is None:
            self._seeds = trace_import_seeds()
        return self._seeds

    def generate(self, rng: random.Random) -> object:
        return hostile_import(self.seeds(), rng)

    def check(self, data: object) -> Outcome:
        assert isinstance(data, dict)
        folder = Path(tempfile.mkdtemp(prefix="fuzz-trace-import-"))
        try:
            return self._check(folder, data)
        finally:
            shutil.rmtree(folder, ignore_errors=True)

    def _check(self, folder: Path, data: dict[str, Any]) -> Outcome:
        files: dict[str, str] = data["files"]
        for name, content in files.items():
            (folder / name).write_text(content, encoding="utf-8", errors="surrogatepass")
        out = folder / "out.csv"
        kind = data["kind"]
        gpus = ["--job-gpus", str(data.get("job_gpus", 1))]
        if kind == "sacct":
            (name,) = files
            args = ["trace", "import", "sacct", str(folder / name), "--out", str(out)]
        elif kind == "prometheus":
            pending, running = str(folder / "pending.json"), str(folder / "running.json")
            args = ["trace", "import", "prometheus", "--pending", pending, "--running", running,
                    "--out", str(out), *gpus]  # fmt: skip
        else:
            args = ["trace", "import", "csv", str(folder / "dash.csv"), "--out", str(out), *gpus]
        run = run_cli(args)
        if run.rc == 2:
            problem = _error_problem(run, [str(folder / n) for n in files])
            return Outcome.wrong(problem) if problem else Outcome.rejected(run.error_lines[-1])
        if run.rc != 0:
            return Outcome.wrong(f"exit {run.rc}: {run.err[:200]!r}")
        if kind == "sacct":
            problem = trace_problem(out)
            if problem is None:
                problem = _loads(out)
        else:
            problem = series_problem(out, int(data.get("job_gpus", 1)))
        return Outcome.wrong(problem) if problem else Outcome.accepted("imported")

    def close(self) -> None:
        pass


def _loads(path: Path) -> str | None:
    """The simulator's trace reader takes what the import wrote (a span longer than a replay
    covers is a window for the scenario to choose, not a bad trace)."""
    from autoscaler.sim.scenario import TraceSpec
    from autoscaler.sim.trace import load_trace

    try:
        load_trace(path, TraceSpec(file=path.name), (), None, 0)
    except InputError as exc:
        if "the replayed window is" in str(exc):
            return None
        return f"the simulator refuses the trace the import wrote: {exc}"
    return None


BOUNDARIES = [TraceImportBoundary()]
