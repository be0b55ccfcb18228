"""The example checkpointing job (examples/checkpointing-job), submitted with its own submit.sh to
the real Slurm of tests/slurm_cluster.py, reporting to a real ``InboxServer`` on loopback (the
slurmd nodes run on this machine): it saves on its interval and reports, saves at once when the
adapter signals it, keeps training when a report is refused, and a requeued run resumes from the
step it saved."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from slurm_cluster import SlurmCluster, wait_for
from waits import bound

from autoscaler.fleet.checkpoints import CheckpointLedger, CheckpointReport
from autoscaler.model.clock import SystemClock
from autoscaler.ops.inbox import InboxServer, NoticeInbox
from autoscaler.sources.slurm import SlurmAdapter

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "checkpointing-job"
TOKEN = "checkpoint-test-token"
STEP_S = 0.1


class RecordingLedger(CheckpointLedger):
    """The real ledger, keeping every report so the test can read what the job sent."""

    def __init__(self) -> None:
        super().__init__()
        self.received: list[CheckpointReport] = []

    def record(self, report: CheckpointReport) -> None:
        self.received.append(report)
        super().record(report)


@dataclass
class Controller:
    ledger: RecordingLedger
    url: str


@pytest.fixture
def controller() -> Iterator[Controller]:
    ledger = RecordingLedger()
    server = InboxServer(NoticeInbox(SystemClock()), TOKEN, checkpoints=ledger)
    server.start()
    try:
        yield Controller(ledger, f"http://127.0.0.1:{server.port}")
    finally:
        server.close()


@pytest.fixture
def slurm(slurm_cluster: SlurmCluster) -> Iterator[SlurmAdapter]:
    yield SlurmAdapter.from_config({"slurm_conf": str(slurm_cluster.conf)}, "hpc")
    slurm_cluster.reset()


@dataclass(frozen=True)
class Training:
    job_id: str
    directory: Path

    @property
    def log(self) -> str:
        path = self.directory / "train.log"
        return path.read_text() if path.exists() else ""

    def saved_step(self) -> int:
        step: int = json.loads((self.directory / "checkpoint.json").read_text())["step"]
        return step

    def started_at_step(self, restart: int) -> int | None:
        found = re.search(rf"start at step (\d+) \(restart {restart}\)", self.log)
        return int(found.group(1)) if found else None


def submit(
    cluster: SlurmCluster,
    controller: Controller,
    directory: Path,
    interval: float,
    token: str = TOKEN,
) -> Training:
    done = subprocess.run(
        [str(EXAMPLE / "submit.sh"), "--parsable", "--", "--step-seconds", str(STEP_S)],
        env={
            **cluster.env,
            "GPU_AUTOSCALER_URL": controller.url,
            "GPU_AUTOSCALER_TOKEN": token,
            "CHECKPOINT_DIR": str(directory),
            "CHECKPOINT_INTERVAL": str(interval),
            "CHECKPOINT_DURATION": "1",
        },
        capture_output=True,
        text=True,
        timeout=bound(60),
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return Training(done.stdout.strip().split(";")[0], directory)


def test_the_example_job_checkpoints_reports_and_resumes_after_a_requeue(
    slurm: SlurmAdapter, slurm_cluster: SlurmCluster, controller: Controller, tmp_path: Path
) -> None:
    ledger = controller.ledger
    periodic = submit(slurm_cluster, controller, tmp_path / "periodic", interval=0.5)
    on_request = submit(slurm_cluster, controller, tmp_path / "on-request", interval=3600)
    refused = submit(slurm_cluster, controller, tmp_path / "refused", 0.5, token="wrong")
    wait_for(
        "the jobs to start training",
        lambda: all(t.started_at_step(0) == 0 for t in (periodic, on_request, refused)),
    )

    wait_for(
        "two interval checkpoints to be reported",
        lambda: sum(r.job_id == periodic.job_id for r in ledger.received) >= 2,
    )
    reported = [r for r in ledger.received if r.job_id == periodic.job_id]
    node = slurm_cluster.job_field(periodic.job_id, "NodeList")
    assert {r.node for r in reported} == {node}
    assert reported[1].at - reported[0].at >= 0.45
    assert reported[1].at <= time.time()
    assert ledger.expected_duration(periodic.job_id) is not None
    wait_for("a refused report", lambda: "checkpoint report failed" in refused.log)
    assert refused.log.count("(interval,") >= 1 and ledger.last(refused.job_id) is None
    wait_for("training to go on after it", lambda: refused.log.count("(interval,") >= 2)

    where = slurm_cluster.job_field(on_request.job_id, "NodeList")
    listed = {job.id: job for job in slurm.running_jobs(where)}[on_request.job_id]
    assert (listed.gpus, listed.checkpoint_interval_s, listed.checkpoint_signal) == (
        1,
        3600,
        "USR1",
    )
    assert ledger.last(on_request.job_id) is None
    asked_at = time.time()
    slurm.signal(on_request.job_id, "USR1")
    last = wait_for("the signalled checkpoint's report", lambda: ledger.last(on_request.job_id), 60)
    assert asked_at <= last <= time.time()
    assert "(signal," in on_request.log
    saved = on_request.saved_step()
    assert saved > 0

    slurm.requeue(on_request.job_id)
    resumed = wait_for("the requeued job to start again", lambda: on_request.started_at_step(1))
    assert resumed == saved
    slurm.signal(on_request.job_id, "USR1")
    wait_for(
        "a checkpoint of the resumed run",
        lambda: sum(r.job_id == on_request.job_id for r in ledger.received) == 2,
    )
    assert on_request.saved_step() > saved
    assert set(os.listdir(on_request.directory)) == {"checkpoint.json", "train.log"}
