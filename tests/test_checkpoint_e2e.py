"""Checkpoint-aware interruption handling end to end: the real controller launches a spot
instance on moto's EC2, the instance joins the real Slurm as a dynamic node (the boot script a
real instance runs), the example training job runs there and reports its checkpoints to the
controller's inbox; then the cloud takes the instance back.

* Through SQS (the EventBridge warning): the job is signalled, saves, reports, is requeued and
  resumes from that checkpoint on an on-prem node; the work lost is at most the time between
  the notice and the requeue, and the leaving node takes no new work.
* Through the node's IMDS (the agent, a real subprocess, forwarding to the inbox) with a
  deadline too close for the job's checkpoint: it is requeued at once and resumes from its
  previous checkpoint.
* Scale-down: of two idle cloud nodes (GPU telemetry scraped over HTTP reads 0 %), the one given
  back first is the one whose job saved last; that job leaves at a checkpoint and resumes from
  it.
"""

from __future__ import annotations

import datetime
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3
import pytest
from aws_support import REGION
from botocore.awsrequest import AWSResponse
from exporter_server import Answer, ExporterServer
from metadata_servers import FakeImds
from slurm_cluster import SlurmCluster, free_port, wait_for
from test_aws import event, real_spot_prices
from test_checkpointing_job import EXAMPLE, RecordingLedger, Training
from waits import bound

from autoscaler.app.runner import summary
from autoscaler.fleet.telemetry import IdleTracker
from autoscaler.model import Pool
from autoscaler.model.clock import SystemClock
from autoscaler.model.config import ControllerConfig, Limits
from autoscaler.model.records import TickReport
from autoscaler.ops.inbox import InboxServer, NoticeInbox
from autoscaler.sources.scrape import ScrapeSettings, ScrapeTelemetrySource
from autoscaler.sources.slurm import SlurmAdapter
from autoscaler.tick.controller import Controller
from autoscaler.tick.observe import Signals
from autoscaler.tick.retry import RetryPolicy
from policies.cost_aware import CostAwareParams, CostAwarePolicy
from providers.aws import AwsProvider

JOIN_SCRIPT = Path(__file__).resolve().parent.parent / "autoscaler/data/slurm/join-cloud-node.sh"
TOKEN = "e2e-shared-token"
FLEET = "e2e"
STEP_S = 0.1


@dataclass
class World:
    aws_url: str
    cluster: SlurmCluster
    controller: Controller
    provider: AwsProvider
    ledger: RecordingLedger
    inbox: InboxServer
    queue_url: str
    slurm: SlurmAdapter
    tmp: Path
    joined: list[str]

    def tick_until(self, what: str, done: Any, timeout: float = 60.0) -> list[TickReport]:
        """Tick as the run loop would when woken, until ``done(reports)`` holds; ``timeout`` is a
        ceiling scaled by the wait knob."""
        reports: list[TickReport] = []
        timeout = bound(timeout)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            reports.append(self.controller.tick())
            if done(reports):
                return reports
            time.sleep(0.1)
        last = summary(reports[-1]) if reports else "no tick"
        actions = [(a.kind, a.outcome, a.detail) for r in reports[-3:] for a in r.actions]
        raise AssertionError(
            f"timed out after {timeout:.0f}s ticking until {what}; last tick: {last}; "
            f"its actions: {actions}"
        )

    def boot(self, instance_id: str) -> None:
        """What the instance's user data does: join Slurm under its instance id."""
        joined = subprocess.run(
            ["sh", str(JOIN_SCRIPT)],
            env={
                **self.cluster.env,
                "GPU_AUTOSCALER_NODE_NAME": instance_id,
                "GPU_AUTOSCALER_GPUS": "1",
                "GPU_AUTOSCALER_GPU_TYPE": self.cluster.gpu_model,
                "GPU_AUTOSCALER_NODE_CONF": "CPUs=8 RealMemory=4000",
            },
            capture_output=True,
            text=True,
            timeout=bound(60),
            check=False,
        )
        assert joined.returncode == 0, joined.stderr
        self.joined.append(instance_id)

    def boot_beside(self, instance_id: str) -> None:
        """A second instance on this one host, where only one dynamic slurmd can listen on the
        cluster's SlurmdPort: the node is created in Slurm (``scontrol create``) and a slurmd
        with a copy of slurm.conf naming it registers it, so Slurm schedules onto it and lists
        its jobs as on any node. slurmctld still sends batch launches for it to SlurmdPort, so
        its job's process is started by the first instance's slurmd; what the controller reads
        (squeue's allocations, the job's checkpoint reports) is the same either way."""
        port = free_port()
        node = (
            f"NodeName={instance_id} NodeAddr=127.0.0.1 Port={port} CPUs=8 RealMemory=4000 "
            f"Gres=gpu:{self.cluster.gpu_model}:1 Feature={self.cluster.cloud_feature}"
        )
        created = self.cluster.run("scontrol", "create", node, "State=CLOUD")
        directory = self.tmp / f"slurm-conf-{instance_id}"
        directory.mkdir()
        shutil.copy(self.cluster.conf.parent / "gres.conf", directory)
        conf = directory / "slurm.conf"
        conf.write_text(self.cluster.conf.read_text() + node + "\n")
        started = subprocess.run(
            ["slurmd", "-f", str(conf), "-N", instance_id],
            env=self.cluster.env,
            capture_output=True,
            text=True,
            timeout=bound(60),
            check=False,
        )
        assert started.returncode == 0, (created, started.stderr)
        self.joined.append(instance_id)

    def submit(self, name: str, interval: float, duration: float, cost: float = 0.0) -> Training:
        directory = self.tmp / name
        done = subprocess.run(
            [
                str(EXAMPLE / "submit.sh"),
                "--parsable",
                "--",
                "--step-seconds",
                str(STEP_S),
                "--checkpoint-cost",
                str(cost),
            ],
            env={
                **self.cluster.env,
                "GPU_AUTOSCALER_URL": f"http://127.0.0.1:{self.inbox.port}",
                "GPU_AUTOSCALER_TOKEN": TOKEN,
                "CHECKPOINT_DIR": str(directory),
                "CHECKPOINT_INTERVAL": str(interval),
                "CHECKPOINT_DURATION": str(duration),
            },
            capture_output=True,
            text=True,
            timeout=bound(60),
            check=False,
        )
        assert done.returncode == 0, done.stderr
        return Training(done.stdout.strip().split(";")[0], directory)

    def fill_onprem(self) -> list[str]:
        """Jobs that hold every on-prem GPU, so new work needs the cloud."""
        return [
            self.cluster.sbatch(
                f"--gres=gpu:{self.cluster.gpus_per_node}",
                f"--nodelist={node}",
                "--wrap",
                "sleep 300",
            )
            for node in self.cluster.onprem_nodes
        ]

    def launched(self) -> str:
        reports = self.tick_until(
            "an instance is launched",
            lambda rs: any(a.kind == "launch" and a.done for a in rs[-1].actions),
        )
        launch = next(a for a in reports[-1].actions if a.kind == "launch" and a.done)
        (instance_id,) = launch.instance_ids
        return instance_id


@pytest.fixture
def world(aws: str, slurm_cluster: SlurmCluster, tmp_path: Path) -> Iterator[World]:
    sqs = boto3.client("sqs", region_name=REGION, endpoint_url=aws)
    queue_url = sqs.create_queue(QueueName="interruptions")["QueueUrl"]
    pool = Pool(
        name="g5-spot",
        provider="aws",
        region=REGION,
        instance_type="g5.xlarge",
        gpus_per_instance=1,
        market="spot",  # type: ignore[arg-type]
        boot_seconds=0,
        options={"zones": ["us-east-1a"], "launch_template": {"name": "gpu"}},
    )
    clock = SystemClock()
    provider = AwsProvider.from_config(
        {"endpoint_url": aws, "interruption_queue_url": queue_url, "queue_wait_s": 0},
        [pool],
        FLEET,
        clock,
    )
    rows = real_spot_prices("g5.xlarge", REGION, names=True)

    def real_prices(**_: Any) -> tuple[AWSResponse, dict[str, Any]]:
        answer = {"SpotPriceHistory": rows, "ResponseMetadata": {"HTTPStatusCode": 200}}
        return AWSResponse(aws, 200, {}, None), answer

    provider.client("ec2", REGION).meta.events.register(
        "before-call.ec2.DescribeSpotPriceHistory", real_prices
    )
    ledger = RecordingLedger()
    inbox = InboxServer(NoticeInbox(clock), TOKEN, checkpoints=ledger)
    inbox.start()
    slurm = SlurmAdapter.from_config({"slurm_conf": str(slurm_cluster.conf)}, "hpc")
    controller = Controller(
        ControllerConfig(
            fleet_id=FLEET, pools=(pool,), limits=Limits(max_instances=1, scale_up_cooldown_s=0)
        ),
        CostAwarePolicy(CostAwareParams(idle_seconds=3600)),
        {"aws": provider},
        clock,
        scheduler=slurm,
        retry=RetryPolicy(attempts=2, sleep=lambda _s: None),
        signals=Signals(queues=(slurm,), nodes=slurm, notices=(inbox.inbox,)),
        checkpoints=ledger,
    )
    built = World(
        aws, slurm_cluster, controller, provider, ledger, inbox, queue_url, slurm, tmp_path, []
    )
    try:
        yield built
    finally:
        provider.close()
        inbox.close()
        slurm_cluster.reset()
        for node in built.joined:
            pid_file = slurm_cluster.root / f"slurmd-{node}.pid"
            if pid_file.exists():
                subprocess.run(["kill", pid_file.read_text().strip()], check=False)
            slurm.forget(node)


def evacuations(reports: list[TickReport]) -> dict[str, list[Any]]:
    found: dict[str, list[Any]] = {}
    for report in reports:
        for action in report.actions:
            if action.kind == "evacuate" and action.job_id is not None:
                found.setdefault(action.job_id, []).append(action)
    return found


def test_sqs_warning_checkpoints_requeues_and_resumes_on_another_node(world: World) -> None:
    fillers = world.fill_onprem()
    training = world.submit("sqs", interval=1.0, duration=1.0)
    instance_id = world.launched()
    world.boot(instance_id)
    wait_for(
        "the job to run on the cloud node",
        lambda: (
            world.cluster.job_field(training.job_id, "NodeList") == instance_id
            and training.started_at_step(0) == 0
        ),
        timeout=60,
    )
    wait_for(
        "a checkpoint reported from the cloud node",
        lambda: any(
            r.job_id == training.job_id and r.node == instance_id for r in world.ledger.received
        ),
    )
    world.cluster.run("scancel", fillers[0])

    noticed = time.time()
    at = datetime.datetime.fromtimestamp(noticed, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    sqs = boto3.client("sqs", region_name=REGION, endpoint_url=world.aws_url)
    sqs.send_message(
        QueueUrl=world.queue_url,
        MessageBody=event(
            "EC2 Spot Instance Interruption Warning",
            {"instance-id": instance_id, "instance-action": "terminate"},
            at=at,
        ),
    )
    reports = world.tick_until(
        "the job is requeued after its checkpoint",
        lambda rs: any(
            a.outcome == "requeued-after-checkpoint"
            for a in evacuations(rs).get(training.job_id, [])
        ),
    )
    moves = evacuations(reports)[training.job_id]
    assert [a.outcome for a in moves] == ["checkpoint-asked", "requeued-after-checkpoint"]
    requeued_at = time.time()
    lost = moves[-1].lost_gpu_s
    assert lost is not None and 0 <= lost <= requeued_at - noticed, "lost <= notice -> requeue"
    assert "DRAIN" in world.cluster.node_field(instance_id, "State")
    assert "(signal," in training.log, "the job saved because it was asked"

    saved = training.saved_step()
    resumed = wait_for("the job to start again", lambda: training.started_at_step(1), timeout=120)
    assert resumed == saved, "it resumes from the checkpoint it wrote on the notice"
    node = world.cluster.job_field(training.job_id, "NodeList")
    assert node in world.cluster.onprem_nodes
    assert not world.cluster.run("squeue", "-h", "-w", instance_id), "nothing new on the leaver"


def test_imds_notice_too_close_for_the_checkpoint_requeues_at_once(world: World) -> None:
    fillers = world.fill_onprem()
    training = world.submit("imds", interval=1.0, duration=1.0, cost=3.0)
    instance_id = world.launched()
    world.boot(instance_id)
    wait_for(
        "a checkpoint from the cloud node (each takes 3 s)",
        lambda: any(
            r.job_id == training.job_id and r.node == instance_id for r in world.ledger.received
        ),
        timeout=60,
    )
    previous = training.saved_step()
    world.cluster.run("scancel", fillers[0])

    imds = FakeImds(instance_id)
    agent = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "autoscaler.cli",
            "agent",
            "--cloud",
            "aws",
            "--aws-metadata-url",
            imds.url,
            "--aws-poll-seconds",
            "0.2",
            "--controller-url",
            f"http://127.0.0.1:{world.inbox.port}",
            "--token-env",
            "NODE_TOKEN",
            "--listen",
            "127.0.0.1:0",
        ],
        env={**os.environ, "NODE_TOKEN": TOKEN},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        imds.set_instance_action("terminate", time.time() + 12)
        reports = world.tick_until(
            "the job is requeued",
            lambda rs: training.job_id in evacuations(rs),
        )
    finally:
        agent.terminate()
        agent.wait(bound(30))
        imds.close()
    (move,) = evacuations(reports)[training.job_id]
    assert move.outcome == "requeued" and "does not fit" in move.detail
    assert "(signal," not in training.log, "a checkpoint that cannot fit is not asked for"
    resumed = wait_for("the job to start again", lambda: training.started_at_step(1), timeout=120)
    assert resumed >= previous, "it resumes from the checkpoint it had before the notice"


def test_scale_down_gives_back_the_node_whose_job_saved_last_first(world: World) -> None:
    exporters = ExporterServer()
    scrape = ScrapeTelemetrySource(
        ScrapeSettings(targets=(exporters.url("/a"), exporters.url("/b"))), "gpus"
    )
    pool = world.controller.config.pools[0]
    controller = Controller(
        ControllerConfig(
            fleet_id=FLEET,
            pools=(pool,),
            drain_timeout_s=0,
            limits=Limits(
                max_instances=2,
                scale_up_cooldown_s=0,
                scale_down_cooldown_s=0,
                max_drains_per_tick=1,
            ),
        ),
        CostAwarePolicy(CostAwareParams(idle_seconds=0)),
        world.controller.providers,
        SystemClock(),
        scheduler=world.slurm,
        retry=RetryPolicy(attempts=2, sleep=lambda _s: None),
        signals=Signals(
            queues=(world.slurm,),
            nodes=world.slurm,
            telemetry=(scrape,),
            notices=(world.inbox.inbox,),
            tracker=IdleTracker(idle_util_pct=5.0, window_s=1, max_age_s=30),
        ),
        checkpoints=world.ledger,
    )
    world.controller = controller
    try:
        fillers = world.fill_onprem()
        launched = []
        trainings = []
        # one at a time: moto's RunInstances launches MinCount instances, never more
        for name, interval, path in (("fresh", 1.0, "/a"), ("stale", 600.0, "/b")):
            training = world.submit(name, interval=interval, duration=0.2)
            instance_id = world.launched()
            if launched:
                world.boot_beside(instance_id)
            else:
                world.boot(instance_id)
            exporters.answers[path] = Answer(
                f'DCGM_FI_DEV_GPU_UTIL{{gpu="0",Hostname="{instance_id}"}} 0\n'
            )
            wait_for(
                f"the {name} job to run on its cloud node",
                lambda t=training, i=instance_id: (
                    world.cluster.job_field(t.job_id, "NodeList") == i
                ),
                timeout=60,
            )
            launched.append(instance_id)
            trainings.append(training)
        fresh, stale = trainings
        fresh_node = world.cluster.job_field(fresh.job_id, "NodeList")
        wait_for(
            "the fresh job to report checkpoints from its node",
            lambda: (
                sum(
                    r.job_id == fresh.job_id and r.node == fresh_node for r in world.ledger.received
                )
                >= 2
            ),
        )
        world.cluster.run("scancel", fillers[0])
        time.sleep(3)  # the stale job runs on unsaved; the fresh one saves every second

        reports = world.tick_until(
            "a node is drained",
            lambda rs: any(a.kind == "drain" and a.done for a in rs[-1].actions),
        )
        view = {n.instance_id: n for n in reports[-1].view.instances}
        risk = {node: view[node].work_at_risk_gpu_s for node in launched}
        assert all(r is not None for r in risk.values()), risk
        ((drained,),) = [a.instance_ids for a in reports[-1].actions if a.kind == "drain"]
        assert drained == fresh_node, f"the node whose job saved last goes first: {risk}"
        other = next(n for n in launched if n != fresh_node)
        assert (risk[fresh_node] or 0.0) < (risk[other] or 0.0)

        if not any(
            m.outcome.startswith("requeued") for m in evacuations(reports).get(fresh.job_id, [])
        ):
            reports += world.tick_until(
                "the fresh job leaves at a checkpoint",
                lambda rs: any(
                    a.outcome.startswith("requeued") for a in evacuations(rs).get(fresh.job_id, [])
                ),
            )
        (left,) = [
            m for m in evacuations(reports)[fresh.job_id] if m.outcome.startswith("requeued")
        ]
        assert left.lost_gpu_s is not None and left.lost_gpu_s < 2.0, left
        assert stale.job_id not in evacuations(reports), "the stale job's node is not touched"
        saved = fresh.saved_step()
        resumed = wait_for(
            "the fresh job to start again", lambda: fresh.started_at_step(1), timeout=120
        )
        assert resumed == saved, "it resumes from the checkpoint it left at"
        assert world.cluster.job_field(stale.job_id, "NodeList") != fresh_node
    finally:
        scrape.close()
        exporters.close()
        for node in world.joined[1:]:
            world.slurm.forget(node)  # its job's completion comes from the other slurmd
