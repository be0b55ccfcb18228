"""``gpu-autoscaler trace import`` on captured real outputs, and demand-series replay.

The sacct files in tests/data/trace_import/ are what a real Slurm 22.05 with slurmdbd printed
(``tests/slurm_accounting.py``; test_trace_import_slurm.py produces them afresh): ``--json``,
``-X -D -P`` with the recommended fields, and ``-D -P`` with epoch times, steps, Elapsed and
NNodes. The jobs: a typed two-GPU job (1), a two-node job of 3 GPUs a node (2), an array of
three (3_0..3_2), a failed job (4), a job requeued once (9), an eight-GPU two-node job (10), one
cancelled while pending (11), and one still running when the accounting was read (12).
"""

from __future__ import annotations

import contextlib
import copy
import csv
import io
import json
import subprocess
import sys
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from waits import bound

from autoscaler.cli import main
from autoscaler.model.errors import InputError
from autoscaler.sim.importers.sacct import to_trace
from autoscaler.sim.importers.sacct_json import read_sacct_json
from autoscaler.sim.importers.sacct_text import read_sacct_text

DATA = Path(__file__).parent / "data" / "trace_import"
JSON = DATA / "sacct-22.05.json"
TEXT = DATA / "sacct-22.05.txt"
EPOCH_STEPS = DATA / "sacct-22.05-epoch-steps.txt"
ORIGIN = 1_795_537_583  # job 1's submission, 2026-11-24T16:26:23Z


@dataclass(frozen=True)
class CliRun:
    rc: int
    out: str
    err: str


def cli(*args: str | Path) -> CliRun:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main([str(a) for a in args])
    return CliRun(rc, out.getvalue(), err.getvalue())


def read_csv(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as handle:
        return list(csv.DictReader(handle))


def tiny_scenario(folder: Path, trace: str, start: str = "2026-11-24T16:26:23Z") -> Path:
    """Two 4-GPU on-prem nodes, a spot and an on-demand pool at fixed prices, two policies."""
    path = folder / "scenario.yaml"
    path.write_text(
        textwrap.dedent(f"""\
        name: imported
        seed: 1
        start: "{start}"
        wait_target_s: 60
        trace: {trace}
        onprem:
          - {{name: gpu, gpus: 4, gpu_model: A100-SXM4-80GB, count: 2}}
        controller:
          fleet_id: imported
          tick_seconds: 10
          limits: {{scale_down_cooldown_s: 0}}
          pools:
            - {{name: spot, provider: aws, region: r1, instance_type: small, gpus_per_instance: 4,
               gpu_model: A100-40GB, market: spot, boot_seconds: 30}}
            - {{name: od, provider: aws, region: r1, instance_type: small, gpus_per_instance: 4,
               gpu_model: A100-40GB, market: on-demand, boot_seconds: 30}}
        policies:
          - name: cost-aware
          - name: on-demand
        market:
          pools:
            spot: {{price_per_hour: 1.0, interruption_rate_per_hour: 0.0}}
            od: {{price_per_hour: 3.0}}
        """)
    )
    return path


def replay_report(scenario: Path, out: Path) -> dict[str, Any]:
    """``gpu-autoscaler report`` on the scenario, in this process; its report.json."""
    run = cli("report", "--scenario", scenario, "--out", out, "--no-progress")
    assert run.rc == 0, run.err
    report: dict[str, Any] = json.loads((out / "report.json").read_text())
    return report


# --------------------------------------------------------------------------------------------
# sacct


EXPECTED = {
    # id: (submit, start, duration, gpus, nodes, gpu_model, status, censored)
    "1": (0, 2, 2, 2, 1, "a100", "COMPLETED", "none"),
    "2": (0, 5, 2, 6, 2, "", "COMPLETED", "none"),
    "3_0": (0, 5, 1, 1, 1, "", "COMPLETED", "none"),
    "3_1": (0, 5, 1, 1, 1, "", "COMPLETED", "none"),
    "3_2": (0, 8, 1, 1, 1, "", "COMPLETED", "none"),
    "4": (0, 8, 0, 1, 1, "", "FAILED", "none"),
    "9": (30, 176, 4, 1, 1, "", "COMPLETED", "none"),
    "10": (55, 55, 4, 8, 2, "", "COMPLETED", "none"),
    "12": (574, 574, None, 1, 1, "a100", "RUNNING", "right"),
}


def _rows(path: Path) -> dict[str, tuple[Any, ...]]:
    rows = {}
    for row in read_csv(path):
        censored = row["censored"] == "right"
        rows[row["job_id"]] = (
            int(row["submit_time_s"]),
            int(row["start_time_s"]),
            None if censored else int(row["duration_s"]),
            int(row["num_gpus"]),
            int(row["num_nodes"]),
            row["gpu_model"],
            row["status"],
            row["censored"],
        )
    return rows


@pytest.mark.parametrize("source", [JSON, TEXT, EPOCH_STEPS], ids=lambda p: p.name)
def test_sacct_outputs_import_to_the_jobs_slurm_ran(source: Path, tmp_path: Path) -> None:
    out = tmp_path / "trace.csv"
    run = cli("trace", "import", "sacct", source, "--out", out)
    assert run.rc == 0, run.err
    assert _rows(out) == EXPECTED
    assert "9 GPU jobs from 11 accounting records" in run.out
    assert "left out: 1 GPU jobs cancelled before they started" in run.out
    assert "requeued: 1 jobs ran more than once" in run.out
    assert "trace time 0 is 2026-11-24T16:26:23Z" in run.out
    rows = {r["job_id"]: r for r in read_csv(out)}
    assert rows["9"]["queue_delay_s"] == "146"  # from its first submission to its last start
    assert rows["1"]["user_group"] == "root"


def test_the_json_and_text_readers_read_the_same_records() -> None:
    by_json = to_trace(read_sacct_json(JSON))
    by_text = to_trace(read_sacct_text(TEXT))
    running = {"12"}  # captured a second apart: its elapsed time differs
    assert [r for r in by_json.rows if r.job_id not in running] == [
        r for r in by_text.rows if r.job_id not in running
    ]
    assert by_json.skipped == by_text.skipped == {"GPU jobs cancelled before they started": 1}
    assert by_json.requeued_runs_gpu_h == pytest.approx(3 / 3600)  # job 9's first run: 3 s


def _number_objects(value: Any) -> Any:
    """22.05's plain numbers as later releases write them ({set, infinite, number})."""
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int):
        return {"set": True, "infinite": False, "number": value}
    if isinstance(value, list):
        return [_number_objects(v) for v in value]
    if isinstance(value, dict):
        return {k: _number_objects(v) for k, v in value.items()}
    return value


def test_the_number_objects_and_state_lists_of_later_slurm_releases_are_read(
    tmp_path: Path,
) -> None:
    document = json.loads(JSON.read_text())
    for job in document["jobs"]:
        job["state"]["current"] = [job["state"]["current"]]
        for key in ("time", "array", "het", "tres"):
            job[key] = _number_objects(job[key])
        job["allocation_nodes"] = _number_objects(job["allocation_nodes"])
        job["array"]["task_id"] = job["array"]["task_id"] or {
            "set": False,
            "infinite": False,
            "number": 0,
        }
    later = tmp_path / "sacct-24.json"
    later.write_text(json.dumps(document, indent=2))
    assert to_trace(read_sacct_json(later)).rows == to_trace(read_sacct_json(JSON)).rows


def _text(lines: Sequence[str]) -> str:
    return "\n".join(lines) + "\n"


HEADER = "JobID|State|Submit|Start|End|ElapsedRaw|AllocTRES|ReqTRES|AllocNodes|Account|Cluster"


def test_uneven_gpus_clusters_gres_renames_and_groups(tmp_path: Path) -> None:
    source = tmp_path / "sacct.txt"
    source.write_text(
        _text(
            [
                HEADER,
                "7|COMPLETED|1000|1010|1110|100|cpu=2,gres/gpu=5,node=2|gres/gpu=5|2|ml|east",
                "7|COMPLETED|1000|1005|1105|100|cpu=1,gres/gpu:tesla=1|gres/gpu:tesla=1|1|cv|west",
                "8|TIMEOUT|1200|1200|1300|100|cpu=1|cpu=1|1|ml|east",
            ]
        )
    )
    out = tmp_path / "trace.csv"
    run = cli(
        "trace", "import", "sacct", source, "--out", out, "--gpu-model", "tesla=V100",
        "--origin", "1970-01-01T00:10:00Z",
    )  # fmt: skip
    assert run.rc == 0, run.err
    rows = {r["job_id"]: r for r in read_csv(out)}
    assert set(rows) == {"east:7", "west:7"}  # two clusters: ids keep them apart
    assert (rows["east:7"]["num_gpus"], rows["east:7"]["num_nodes"]) == ("6", "2")
    assert rows["west:7"]["gpu_model"] == "V100"
    assert rows["west:7"]["submit_time_s"] == "400"  # from --origin
    assert "left out: 1 jobs without GPUs" in run.out
    assert "1 jobs' GPUs do not divide over their nodes" in run.out


def test_a_pending_array_and_a_still_pending_job_are_counted_not_replayed(tmp_path: Path) -> None:
    source = tmp_path / "sacct.txt"
    source.write_text(
        _text(
            [
                HEADER,
                "5_[0-9]|PENDING|1000|Unknown|Unknown|0||gres/gpu=1|0|ml|c",
                "6|RUNNING|1000|1000|Unknown|50|gres/gpu=2,node=1|gres/gpu=2|1|ml|c",
            ]
        )
    )
    imported = to_trace(read_sacct_text(source))
    assert imported.skipped == {"GPU jobs still pending when the accounting was read": 1}
    (row,) = imported.rows
    assert (row.job_id, row.duration, row.censored) == ("6", 50.0, True)


BAD_TEXT = [
    # (file lines, where, what the message says)
    ([HEADER.replace("|Submit", "")], ":1:", "missing field(s) Submit"),
    ([HEADER, "1|COMPLETED|yesterday|1|2|1|gres/gpu=1|gres/gpu=1|1|a|c"], ":2: Submit:", "time"),
    ([HEADER, "1|COMPLETED|1|1|2|1|gres/gpu=x|gres/gpu=1|1|a|c"], ":2: AllocTRES:", "whole"),
    ([HEADER, "1|COMPLETED|1|1|2|1|gres/gpu=1|gres/gpu=99999999|1|a|c"], ":2: ReqTRES:", "most"),
    ([HEADER, "", "1|COMPLETED|1|1|2|1|gres/gpu=1|gres/gpu=1|1|a|c|extra"], ":3:", "JobName"),
    ([HEADER, "|COMPLETED|1|1|2|1|gres/gpu=1|gres/gpu=1|1|a|c"], ":2: JobID:", "job id"),
    ([HEADER, "1|COMPLETED|1|1|2|1|gres/gpu=1|gres/gpu=1|x|a|c"], ":2: AllocNodes:", "whole"),
    ([HEADER, "1|COMPLETED|1|1|2|-3|gres/gpu=1|gres/gpu=1|1|a|c"], ":2: ElapsedRaw:", "seconds"),
    ([HEADER, "1|COMPLETED|1|1|2|1|gres/gpu=1|gres/gpu=1|1|a|c", "1|X|1|1|2|1|,|x|1|a|c"],
     ":3: AllocTRES:", "','"),
    ([HEADER, "1|COMPLETED|3000-01-01T00:00:00|1|2|1|gres/gpu=1|x=1|1|a|c"], ":2: Submit:", "2100"),
]  # fmt: skip


@pytest.mark.parametrize(("lines", "where", "says"), BAD_TEXT)
def test_a_malformed_sacct_text_is_one_line_naming_file_line_and_field(
    tmp_path: Path, lines: list[str], where: str, says: str
) -> None:
    source = tmp_path / "sacct.txt"
    source.write_text(_text(lines))
    run = cli("trace", "import", "sacct", source, "--out", tmp_path / "t.csv")
    assert run.rc == 2
    assert run.err.count("\n") == 1, run.err
    assert run.err.startswith(f"error: {source}{where}"), run.err
    assert says in run.err
    assert not (tmp_path / "t.csv").exists()


def _job(**changes: Any) -> dict[str, Any]:
    job: dict[str, Any] = copy.deepcopy(json.loads(JSON.read_text())["jobs"][0])
    for dotted, value in changes.items():
        *path, last = dotted.split("__")
        target = job
        for key in path:
            target = target[key]
        target[last] = value
    return job


BAD_JSON: list[tuple[str, str, str]] = [
    ('{"jobs": [\n{"job_id": 1,\n  ]}', ":3:", "not valid JSON"),
    (json.dumps({"jobs": [_job(time__submission="now")]}, indent=1), "time.submission:", "number"),
    (json.dumps({"jobs": [_job(job_id=0)]}, indent=1), "jobs[0].job_id:", "above 0"),
    (json.dumps({"jobs": [_job(tres__allocated=5)]}, indent=1), "tres.allocated:", "list"),
    (json.dumps({"jobs": [_job(time__start=2**70)]}, indent=1), "time.start:", "at most"),
    (json.dumps({"jobs": [_job(time__start=-5)]}, indent=1), "time.start:", "whole number"),
    (json.dumps({"jobs": [_job(state=None)]}, indent=1), "jobs[0].state:", "text"),
    (json.dumps({"jobs": [], "errors": [{"error": "no slurmdbd"}]}), ":1: errors[0]:", "slurmdbd"),
    ("[1, 2]", ":1:", "expected object"),
    ('{"jobs": [{"time": ' + "[" * 3000 + "]" * 3000 + "}]}", "", "nested"),
    ("\n\n\xff", ":3", "UTF-8"),
]


@pytest.mark.parametrize(("text", "where", "says"), BAD_JSON)
def test_a_malformed_sacct_json_is_one_line_naming_file_line_and_field(
    tmp_path: Path, text: str, where: str, says: str
) -> None:
    source = tmp_path / "sacct.json"
    source.write_bytes(b"{\n\n\xff" if "\xff" in text else text.encode())
    run = cli("trace", "import", "sacct", source, "--out", tmp_path / "t.csv")
    assert run.rc == 2
    assert run.err.count("\n") == 1, run.err
    assert run.err.startswith(f"error: {source}"), run.err
    assert where in run.err and says in run.err, run.err


def test_a_bad_value_deep_in_a_pretty_printed_file_is_named_by_its_line(tmp_path: Path) -> None:
    document = json.loads(JSON.read_text())
    document["jobs"][7]["tres"]["allocated"][4]["count"] = "two"
    source = tmp_path / "sacct.json"
    text = json.dumps(document, indent=1)
    source.write_text(text)
    with pytest.raises(InputError) as caught:
        to_trace(read_sacct_json(source))
    line = next(
        number for number, content in enumerate(text.splitlines(), start=1) if '"two"' in content
    )
    assert caught.value.where == f"{source}:{line}"
    assert caught.value.field == "jobs[7].tres.allocated[4].count"


def test_sacct_to_report_the_imported_trace_replays(tmp_path: Path) -> None:
    trace = tmp_path / "trace.csv"
    assert cli("trace", "import", "sacct", JSON, "--out", trace).rc == 0
    report = replay_report(tiny_scenario(tmp_path, "{file: trace.csv}"), tmp_path / "report")
    assert report["window"]["jobs"] == 9
    for policy in report["policies"]:
        assert policy["jobs_total"] == 9
        assert policy["jobs_finished"] >= 8  # the censored job may still run at the end


def test_importing_needs_no_numpy_scipy_or_matplotlib(tmp_path: Path) -> None:
    """The lean install (no [report] extra) imports a site's history."""
    code = (
        "import sys\n"
        "for name in ('numpy', 'scipy', 'matplotlib'): sys.modules[name] = None\n"
        "from autoscaler.cli import main\n"
        "sys.exit(main(['trace', 'import', 'sacct', sys.argv[1], '--out', sys.argv[2]]))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(JSON), str(tmp_path / "t.csv")],
        capture_output=True,
        text=True,
        timeout=bound(120),
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert len(read_csv(tmp_path / "t.csv")) == 9


def test_local_sacct_times_are_read_in_the_zone_given(tmp_path: Path) -> None:
    source = tmp_path / "sacct.txt"
    source.write_text(
        _text(
            [
                HEADER,
                "1|COMPLETED|2024-07-01T12:00:00|2024-07-01T12:00:30|Unknown|60|"
                "gres/gpu=1|gres/gpu=1|1|a|c",
            ]
        )
    )
    run = cli("trace", "import", "sacct", source, "--out", tmp_path / "t.csv",
              "--timezone", "Europe/Berlin")  # fmt: skip
    assert run.rc == 0, run.err
    assert "trace time 0 is 2024-07-01T10:00:00Z" in run.out  # CEST is UTC+2
    run = cli("trace", "import", "sacct", source, "--out", tmp_path / "t.csv",
              "--timezone", "Mars/Olympus")  # fmt: skip
    assert (run.rc, run.err) == (2, "error: --timezone: unknown time zone 'Mars/Olympus'; give "
                                    "an IANA name\n")  # fmt: skip
