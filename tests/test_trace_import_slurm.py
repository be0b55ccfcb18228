"""``trace import sacct`` against a real Slurm 22.05's accounting (slurmdbd on MariaDB, see
``tests/slurm_accounting.py``): real jobs run, ``sacct --json`` and ``sacct -P`` read back, both
imported to the same trace, and the trace replayed by ``gpu-autoscaler report``.

The jobs: two typed GPUs, 3 GPUs on each of two nodes, an array of three, a job that fails, one
that waits in a down partition until cancelled, one requeued once, and one still running when
the accounting is read."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from pathlib import Path

from slurm_accounting import (  # noqa: F401 (the fixture, by name)
    PARKED,
    Accounting,
    slurm_accounting,
)
from slurm_cluster import wait_for
from test_trace_import import cli, read_csv, replay_report, tiny_scenario

SACCT_FORMAT = (
    "--format=JobID,State,Submit,Start,End,ElapsedRaw,AllocTRES,ReqTRES,AllocNodes,Partition,"
    "Account,QOS,User,Cluster"
)
FINAL = ("COMPLETED", "FAILED", "CANCELLED")


def _state(accounting: Accounting, job: str) -> str:
    return accounting.cluster.job_field(job, "JobState")


def _requeue_once(accounting: Accounting, job: str) -> None:
    """Requeue a running job, and let it run again at once (Slurm holds a requeued job back
    for the credential lifetime, two minutes here)."""
    cluster = accounting.cluster
    wait_for(f"job {job} to run", lambda: _state(accounting, job) == "RUNNING")
    cluster.run("scontrol", "requeue", job)
    wait_for(
        f"job {job} to wait after its requeue",
        lambda: (
            _state(accounting, job) == "PENDING" and cluster.job_field(job, "Reason") == "BeginTime"
        ),
    )
    cluster.run("scontrol", "update", f"jobid={job}", "StartTime=now")


def _accounted(accounting: Accounting, finished: list[str], requeued: str) -> bool:
    """Whether slurmdbd has every finished job's last record (it is written a moment after)."""
    out = accounting.cluster.run(
        "sacct", "-a", "-X", "-D", "-P", "-n", "-S", "now-1hours", "--format=JobID,State"
    )
    states: dict[str, list[str]] = {}
    for line in out.splitlines():
        job_id, _, state = line.partition("|")
        states.setdefault(job_id, []).append(state.split(" ")[0])
    return all(states.get(j, ["?"])[-1] in FINAL for j in finished) and len(states[requeued]) == 2


def test_real_sacct_imports_as_the_jobs_ran_and_replays(
    slurm_accounting: Accounting,  # noqa: F811
    tmp_path: Path,
) -> None:
    accounting = slurm_accounting
    cluster = accounting.cluster
    started = time.time()
    typed = cluster.sbatch("--gres=gpu:a100:2", "--wrap", "sleep 2")
    wide = cluster.sbatch("-N2", "--gres=gpu:3", "--wrap", "sleep 2")
    array = cluster.sbatch("--array=0-2", "--gres=gpu:1", "--wrap", "sleep 1")
    failed = cluster.sbatch("--gres=gpu:1", "--wrap", "exit 3")
    parked = cluster.sbatch("-p", PARKED, "--gres=gpu:2", "--wrap", "sleep 1")
    requeued = cluster.sbatch("--gres=gpu:1", "--wrap", "sleep 3")
    _requeue_once(accounting, requeued)
    cluster.run("scancel", parked)
    tasks = [f"{array}_{task}" for task in range(3)]
    finished = [typed, wide, *tasks, failed, parked, requeued]
    wait_for(
        "every job's last record in slurmdbd",
        lambda: _accounted(accounting, finished, requeued),
    )
    running = cluster.sbatch("--gres=gpu:a100:1", "--wrap", "sleep 300")
    wait_for("the last job to run", lambda: _state(accounting, running) == "RUNNING")
    wait_for(
        "its start in slurmdbd",
        lambda: "RUNNING" in cluster.run("sacct", "-X", "-n", "-P", "-j", running, "-o", "State"),
    )
    as_json = tmp_path / "sacct.json"
    as_json.write_text(cluster.run("sacct", "--json", "-a", "-D", "-S", "now-1hours"))
    as_text = tmp_path / "sacct.txt"
    as_text.write_text(
        cluster.run("sacct", "-a", "-X", "-D", "-P", "-S", "now-1hours", SACCT_FORMAT)
    )
    cluster.cancel_all()

    traces = {}
    for name, source in (("json", as_json), ("text", as_text)):
        out = tmp_path / f"trace-{name}.csv"
        run = cli("trace", "import", "sacct", source, "--out", out)
        assert run.rc == 0, run.err
        assert "left out: 1 GPU jobs cancelled before they started" in run.out
        assert "requeued: 1 jobs ran more than once" in run.out
        traces[name] = {row["job_id"]: row for row in read_csv(out)}
    rows = traces["json"]
    assert set(rows) == {typed, wide, *tasks, failed, requeued, running}
    assert {k: {**v, "duration_s": ""} for k, v in rows.items() if k != running} == {
        k: {**v, "duration_s": ""} for k, v in traces["text"].items() if k != running
    }
    shape = {
        k: (r["num_gpus"], r["num_nodes"], r["gpu_model"], r["status"]) for k, r in rows.items()
    }
    assert shape == {
        typed: ("2", "1", "a100", "COMPLETED"),
        wide: ("6", "2", "", "COMPLETED"),
        **{task: ("1", "1", "", "COMPLETED") for task in tasks},
        failed: ("1", "1", "", "FAILED"),
        requeued: ("1", "1", "", "COMPLETED"),
        running: ("1", "1", "a100", "RUNNING"),
    }
    assert rows[running]["censored"] == "right"
    assert 1 <= float(rows[typed]["duration_s"]) <= 60
    # the requeued job waits from its first submission to its last start
    assert float(rows[requeued]["queue_delay_s"]) >= 1
    assert all(float(r["submit_time_s"]) <= time.time() - started + 1 for r in rows.values())

    start = datetime.fromtimestamp(started, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    (tmp_path / "trace.csv").write_bytes((tmp_path / "trace-json.csv").read_bytes())
    report = replay_report(tiny_scenario(tmp_path, "{file: trace.csv}", start), tmp_path / "out")
    assert report["window"]["jobs"] == len(rows)
    for policy in report["policies"]:
        assert policy["jobs_total"] == len(rows)
        assert policy["jobs_finished"] >= len(rows) - 1  # the running one may run on
