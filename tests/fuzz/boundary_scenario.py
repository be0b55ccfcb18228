"""Fuzz boundary: a scenario (YAML) and the trace, price and availability CSVs it names, through
``gpu-autoscaler validate`` and the replay ``report --scenario`` runs.

The rules checked for every input, independently of the code under test:

* ``validate`` ends in exit 0 or exit 2 with one error line naming one of the files and its line
  (``boundary_config.error_problem``), never a traceback;
* an accepted scenario's CSVs are well formed, read here with the ``csv`` module alone: UTF-8,
  no column named twice, every row as long as the header, and every number the replay reads
  (every row's, skipped rows' too) finite and at most 1e15 in magnitude;
* an accepted scenario short enough to replay here (at most ``REPLAY_TICKS`` ticks; a longer one
  is a legitimate long replay, only validated) replays without an input error, and the report
  it makes holds only finite figures, no negative cost, and no more jobs finished than given.
"""

from __future__ import annotations

import csv
import io
import math
import random
import re
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from boundary_config import (
    HOSTILE_NUMBERS,
    bad_number,
    error_problem,
    numbers_in,
    run_cli,
)
from harness import Outcome, mutate_text

from autoscaler.model.errors import InputError

Files = dict[str, str | bytes]
REPLAY_TICKS = 400
SCENARIO = "scenario.yaml"

# The columns each file's reader takes as numbers, and whether an empty cell is allowed.
NUMERIC: dict[str, dict[str, bool]] = {
    "trace.csv": {
        "submit_time_s": True,
        "start_time_s": True,
        "duration_s": True,
        "num_gpus": False,
        "gpu_fraction": True,
        "min_gpu_memory_gib": True,
        "num_nodes": True,
    },
    "prices.csv": {"price_per_hour": True, "on_demand_price_per_hour": True},
    "avail.csv": {"start_elapsed_s": False, "duration_s": False, "available_instances": False},
}


def scenario_seeds() -> list[Files]:
    """The small scenarios the simulator's tests write (``test_sim_engine.small_scenario``),
    on a four-hour window so that a replay takes a fraction of a second."""
    from test_sim_engine import job_row, small_scenario

    seeds: list[Files] = []
    availability = (
        "t,availability,1-node,aws,z,small,2024-01-01,60,0,10,0,1000,1\n"
        "t,availability,1-node,aws,z,small,2024-01-01,60,10,20,1000,1000,0\n"
        "t,availability,1-node,aws,z,small,2024-01-01,60,20,100,2000,90000,1\n"
    )
    variants: list[dict[str, Any]] = [
        {"jobs": [job_row("a", 0, 7200), job_row("b", 0, 3600), job_row("c", 60, 600, gpus=2)]},
        {
            "jobs": [job_row("local", 0, 8000), job_row("spot-job", 0, 3000)],
            "availability": availability,
            "market": "pools: {spot: {availability_trace: t}}",
        },
        {
            "jobs": [
                job_row("a", 0, 1200, preemptible=0),
                "g,30,30,1800,2,1.0,4,Succeeded,0,,BE,1,,none,",
                "z,10,,,0,,4,Failed,0,,LS,0,,none,",
            ],
            "pools": (
                "- {name: spot, market: spot, provider: aws, region: r1, instance_type: small,"
                " gpus_per_instance: 2, boot_seconds: 60}\n"
                "- {name: od, market: on-demand, provider: aws, region: r1, instance_type: small,"
                " gpus_per_instance: 2, boot_seconds: 60}\n"
            ),
        },
    ]
    for variant in variants:
        folder = Path(tempfile.mkdtemp(prefix="fuzz-seed-"))
        try:
            small_scenario(folder, **variant)
            files: Files = {p.name: p.read_text() for p in folder.iterdir()}
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        text = str(files[SCENARIO]).replace("window_end_s: 86400", "window_end_s: 14400")
        files[SCENARIO] = text
        seeds.append(files)
    return seeds


def _csv_edit(text: str, rng: random.Random) -> str:
    """A structural CSV mistake: a short or long row, a column named twice, a hostile number
    in a cell, a far-off time, every availability run of no length, a single price."""
    lines = text.splitlines()
    if len(lines) < 2:
        return text + "\n" + rng.choice(["", ",", "a,b"])
    row = rng.randrange(1, len(lines))
    cells = lines[row].split(",")
    choice = rng.randrange(7)
    if choice == 0:
        lines[row] = ",".join(cells[: rng.randrange(len(cells))])
    elif choice == 1:
        lines[row] = lines[row] + ",extra"
    elif choice == 2:
        header = lines[0].split(",")
        header[rng.randrange(len(header))] = rng.choice(header)
        lines[0] = ",".join(header)
    elif choice == 3:
        cells[rng.randrange(len(cells))] = str(
            rng.choice((*HOSTILE_NUMBERS, "1_000", "٣", "²", "NaN", "inf", " 5", "1e15", "-0"))
        ).strip("'")
        lines[row] = ",".join(cells)
    elif choice == 4:
        lines[row] = re.sub(
            r"20\d\d-", rng.choice(["9999-", "0001-", "1969-", "2101-"]), lines[row]
        )
    elif choice == 5:
        lines = [re.sub(r",(\d+),(\d+),([01])$", r",0,0,\3", line) for line in lines]
    else:
        lines = lines[:2]
    return "\n".join(lines) + "\n"


def _yaml_edit(text: str, rng: random.Random) -> str:
    """A careless edit of one scenario setting that bounds the replay or its inputs."""
    edits = [
        ("window_end_s: 14400", f"window_end_s: {rng.choice(['1e15', '3e7', '.inf', '0', '1e9'])}"),
        ("tick_seconds: 60", f"tick_seconds: {rng.choice(['1e-9', '0.5', '.nan', '1e15', '0'])}"),
        ("interval_s: 600", f"interval_s: {rng.choice(['1e-9', '0.001', '1e15', '.nan'])}"),
        (
            "interruption_rate_per_hour: 0.0",
            f"interruption_rate_per_hour: {rng.choice(['1e15', '1e3', '-1'])}",
        ),
        (
            "{name: local, gpus: 1}",
            rng.choice(
                [
                    "{name: local, gpus: 1, count: 1e15}",
                    "{name: local, gpus: 1e9}",
                    "{name: local, gpus: 1, count: 100000}",
                ]
            ),
        ),
        (
            'start: "2024-01-01T00:00:00Z"',
            "start: "
            + rng.choice(
                ["9999-12-31T23:59:59-23:59", "0001-01-01", "2024-01-01", "2024-13-01", "yesterday"]
            ),
        ),
        ("seed: 1", f"seed: {rng.choice(['1e999', '-5', '99999999999999999999', '.nan'])}"),
        (
            "price_files: [prices.csv]",
            rng.choice(
                [
                    "price_files: [nothere.csv]",
                    "price_files: ['prices\\0.csv']",
                    "price_files: [/]",
                    "price_files: [.]",
                ]
            ),
        ),
        ("wait_target_s: 120", "wait_target_s: 120\nlower_bound: {bin_seconds: 1e-9}"),
        ("  - name: cost-aware", "  - name: cost-aware\n    params: {idle_seconds: .nan}"),
    ]
    old, new = rng.choice(edits)
    return text.replace(old, new, 1)


def hostile_scenario(seeds: Sequence[Files], rng: random.Random) -> dict[str, Any]:
    files: Files = dict(rng.choice(seeds))
    name = rng.choice(sorted(files))
    text = files[name]
    assert isinstance(text, str)
    choice = rng.randrange(10)
    if choice < 4:
        for _ in range(rng.choice([1, 1, 2])):
            text = mutate_text(text, rng)
        files[name] = text
    elif choice < 7 and name != SCENARIO:
        files[name] = _csv_edit(text, rng)
    elif choice < 9:
        files[SCENARIO] = _yaml_edit(str(files[SCENARIO]), rng)
    else:
        encoding = rng.choice(["latin-1", "utf-16", "cp1252", "utf-8-sig"])
        files[name] = text.replace(",", ",é", 1).encode(encoding, errors="replace")
    return {"files": files, "replay": rng.random() < 0.35}


def csv_problem(name: str, data: str | bytes) -> str | None:
    """What is wrong with a CSV the replay reads, found with the ``csv`` module alone."""
    if isinstance(data, bytes):
        try:
            data = data.decode("utf-8")
        except UnicodeDecodeError:
            return "not UTF-8"
    rows = list(csv.reader(io.StringIO(data.removeprefix("\ufeff"), newline="")))
    if not rows:
        return None
    header = rows[0]
    if len(set(header)) != len(header):
        return "a column named twice"
    for number, row in enumerate(rows[1:], start=2):
        if not row:
            continue
        if len(row) != len(header):
            return f"line {number} has {len(row)} fields, the header {len(header)}"
        for column, may_be_empty in NUMERIC.get(name, {}).items():
            if column not in header:
                continue
            cell = row[header.index(column)].strip()
            if not cell and may_be_empty:
                continue
            try:
                value = float(cell)
            except ValueError:
                return f"line {number}: {column} {cell!r} is not a number"
            if bad_number(value):
                return f"line {number}: {column} {cell!r} is not finite or too large"
    return None


class ScenarioBoundary:
    name = "scenario YAML and trace/price/availability CSVs"

    def __init__(self) -> None:
        self._seeds: list[Files] | None = None

    def seeds(self) -> Sequence[Files]:
        if self._seeds is None:
            self._seeds = scenario_seeds()
        return self._seeds

    def generate(self, rng: random.Random) -> object:
        return hostile_scenario(self.seeds(), rng)

    def check(self, data: object) -> Outcome:
        assert isinstance(data, dict)
        folder = Path(tempfile.mkdtemp(prefix="fuzz-scenario-"))
        try:
            return self._check(folder, data["files"], bool(data["replay"]))
        finally:
            shutil.rmtree(folder, ignore_errors=True)

    def _check(self, folder: Path, files: Files, replay: bool) -> Outcome:
        for name, content in files.items():
            if isinstance(content, bytes):
                (folder / name).write_bytes(content)
            else:
                (folder / name).write_text(content, encoding="utf-8", errors="surrogatepass")
        path = folder / SCENARIO
        run = run_cli(["validate", str(path)])
        if run.rc == 2:
            names = [str(path)] + [str((folder / n).resolve()) for n in files] + [str(folder)]
            problem = error_problem(run, names)
            return Outcome.wrong(problem) if problem else Outcome.rejected(run.error_lines[-1])
        if run.rc != 0:
            return Outcome.wrong(f"validate exit {run.rc}: {run.err[:200]!r}")
        for name, content in files.items():
            problem = csv_problem(name, content) if name.endswith(".csv") else None
            if problem:
                return Outcome.wrong(f"validate accepted {name} with {problem}")
        return self._replayed(path) if replay else Outcome.accepted("validated")

    def _replayed(self, path: Path) -> Outcome:
        """The replay ``report --scenario`` runs, one policy, checked figure by figure."""
        from autoscaler.report.build import build_report
        from autoscaler.sim.engine import prepare, simulate
        from autoscaler.sim.lowerbound import compute_lower_bounds
        from autoscaler.sim.scenario import load_scenario

        try:
            loaded = load_scenario(path)
            prepared = prepare(loaded)
            if prepared.horizon_s / loaded.scenario.controller.tick_seconds > REPLAY_TICKS:
                return Outcome.accepted("validated; too long to replay here")
            spec = loaded.scenario.policies[0]
            results = [simulate(prepared, spec, 0)]
            report = build_report(prepared, results, compute_lower_bounds(prepared), None)
        except InputError as exc:
            return Outcome.wrong(f"validate accepted what the replay refuses: {exc}")
        figures = report.model_dump()
        if any(bad_number(n) for n in numbers_in(figures)):
            return Outcome.wrong("the report holds a figure that is not finite")
        costs = [v for k, v in _items(figures) if "cost" in k and isinstance(v, (int, float))]
        if any(c < 0 for c in costs):
            return Outcome.wrong("the report holds a negative cost")
        result = results[0]
        if not 0 <= result.jobs_finished <= result.jobs_total or not math.isfinite(result.cost):
            return Outcome.wrong(f"{result.jobs_finished} of {result.jobs_total} jobs finished")
        return Outcome.accepted("validated and replayed")

    def close(self) -> None:
        pass


def _items(value: Any) -> list[tuple[str, Any]]:
    found: list[tuple[str, Any]] = []
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            for key, inner in item.items():
                found.append((str(key), inner))
                stack.append(inner)
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
    return found


BOUNDARIES = [ScenarioBoundary()]
