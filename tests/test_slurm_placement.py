"""Placement enforced by Slurm itself, on a real Slurm 22.05 (tests/slurm_cluster.py) laid out as
docs/slurm.md tells operators to: on-prem nodes in ``gpu``, spot cloud nodes only in its spot
twin ``gpu-spot``, on-demand cloud nodes in its on-demand twin ``gpu-od``; and, beside it, the
layout without on-demand twins (``legacy``: on-prem and on-demand nodes, ``legacy-spot``).

* Cloud nodes join with features that say their market, pool and GPU model: the boot script
  renders them from its environment (``slurm_join.user_data``) or reads the market from the
  cloud's metadata server.
* What Slurm does with a job's partitions: it tries them in the order the job lists them, unless
  their PriorityTier (or the job's priority in each) differs.
* Jobs go where the placement's tiers say: a new job waits for its judgement before spot; a
  judged spot-safe job takes spot room before on-demand room and a protected job on-demand room,
  never spot; on-prem first holds, and with on-prem after the cloud spot-safe jobs take the
  cloud first while a protected job still takes on-prem before on-demand. A requeued job's
  partitions are put back in that order.
* 100 randomized submissions (protected or not, checkpointing or not, sizes, arrays, the user's
  own partitions and constraints, both layouts) while the adapters' ``apply_placement`` runs as
  the controller's tick would: no protected job ever runs on a spot node, every job runs, and
  spot nodes do run the jobs allowed there.
* ``move_off``: a checkpointing job on an on-prem node checkpoints on request (the example job,
  reporting to a real inbox), is requeued, stays off that node until the protected job it made
  room for has started there, and resumes from its checkpoint. A job moved off two nodes in turn
  stays off each until its own hold ends.
* ``bind``: the pending job room is made for gets its ReqNodeList at once (one node, or exactly
  two for a two-node job), waits for that room while other room is taken by others, and gets
  its own list back once it started, left the queue or waited past the bound; a running job or
  one that chose its nodes is refused.
* The same through the real controller (``rebalance_onprem``): its rule picks the job, act asks
  it to checkpoint and moves it, the protected job starts on-prem and nothing is bought for it.

Runs in about 2 to 4 minutes on the busy 2-core machine, most of it the 100 submissions.
"""

from __future__ import annotations

import contextlib
import datetime
import math
import random
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from fakes import FakeCloud
from slurm_cluster import (
    Layout,
    SlurmCluster,
    start_reserve_node,
    start_slurm_cluster,
    stop_reserve_node,
    stop_slurm_cluster,
    wait_for,
)
from test_checkpointing_job import EXAMPLE, TOKEN, RecordingLedger, Training
from waits import bound

from autoscaler.model import Instance, InstanceState, Market, OnPremUse, Placement, Pool
from autoscaler.model.clock import SystemClock
from autoscaler.model.config import ControllerConfig, InterruptionConfig
from autoscaler.model.errors import SourceError
from autoscaler.model.records import TickReport
from autoscaler.ops.inbox import InboxServer, NoticeInbox
from autoscaler.sources.slurm import SlurmAdapter
from autoscaler.sources.slurm_join import join_environment, node_features, user_data
from autoscaler.spi.sources import CheckpointingScheduler, MovesJobsOff
from autoscaler.tick.controller import Controller
from policies.cost_aware import CostAwareParams, CostAwarePolicy

JOIN_SCRIPT = Path(__file__).resolve().parent.parent / "autoscaler/data/slurm/join-cloud-node.sh"
SPOT_POOL = Pool(
    name="aws-use1-g5-spot",
    provider="aws",
    region="us-east-1",
    instance_type="g5.12xlarge",
    gpus_per_instance=4,
    gpu_model="A10G",
    market=Market.SPOT,
)
ON_DEMAND_POOL = Pool.model_validate(
    {**SPOT_POOL.model_dump(), "name": "aws-use1-g5", "market": "on-demand"}
)
ON_DEMAND_NODE = "i-0ondemand1"
JOINED = "i-0spot0"  # joins through the boot script, its market read from the fake IMDS
RESERVE = (
    (ON_DEMAND_NODE, ",".join(node_features(ON_DEMAND_POOL))),
    ("i-0spot1", ",".join(node_features(SPOT_POOL))),
)
SPOT_NODES = frozenset({JOINED, "i-0spot1"})
CRED_EXPIRE_S = 20  # a moved job stays off its node at least this long (120 s by default)
LAYOUT = Layout(
    partitions=(
        "Nodeset=cloud-on-demand Feature=market-on-demand\n"
        "Nodeset=cloud-spot Feature=market-spot\n"
        "PartitionName=gpu Nodes={onprem} Default=YES MaxTime=INFINITE State=UP\n"
        "PartitionName=gpu-spot Nodes=cloud-spot MaxTime=INFINITE State=UP\n"
        "PartitionName=gpu-od Nodes=cloud-on-demand MaxTime=INFINITE State=UP\n"
        "PartitionName=legacy Nodes={onprem},cloud-on-demand MaxTime=INFINITE State=UP\n"
        "PartitionName=legacy-spot Nodes=cloud-spot MaxTime=INFINITE State=UP\n"
        "PartitionName=onprem Nodes={onprem} MaxTime=INFINITE State=UP\n"
    ),
    reserve=RESERVE,
    scheduler="bf_interval=1,sched_interval=2",
    cred_expire=CRED_EXPIRE_S,
)
SETTINGS: dict[str, Any] = {
    "spot_partitions": {"gpu": "gpu-spot"},
    "on_demand_partitions": {"gpu": "gpu-od"},
    "high_priority_min": 1000,
}
LEGACY_SETTINGS: dict[str, Any] = {
    "spot_partitions": {"legacy": "legacy-spot"},
    "high_priority_min": 1000,
}
SUBMISSIONS = 100
SEED = 16
TICK_S = 0.5


class FakeCloudMetadata:
    """AWS IMDSv2, GCP's and Azure's metadata servers on one loopback port, answering what the
    join script asks: the instance's name and how it was bought."""

    def __init__(self, answers: dict[str, str]) -> None:
        self.answers = answers
        self.token = "imds-token"
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                """Quiet."""

            def do_PUT(self) -> None:
                ttl = self.headers.get("X-aws-ec2-metadata-token-ttl-seconds", "")
                if self.path == "/latest/api/token" and ttl.isdigit():
                    self._reply(200, fake.token)
                else:
                    self._reply(400, "")

            def do_GET(self) -> None:
                path = self.path.split("?")[0]
                signed = (
                    self.headers.get("X-aws-ec2-metadata-token") == fake.token
                    if path.startswith("/latest/")
                    else self.headers.get("Metadata-Flavor") == "Google"
                    if path.startswith("/computeMetadata/")
                    else self.headers.get("Metadata") == "true"
                )
                answer = fake.answers.get(path)
                if not signed:
                    self._reply(401, "")
                elif answer is None:
                    self._reply(404, "not found")
                else:
                    self._reply(200, answer)

            def _reply(self, status: int, body: str) -> None:
                data = body.encode()
                self.send_response(status)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def metadata() -> Iterator[Any]:
    servers: list[FakeCloudMetadata] = []

    def serve(answers: dict[str, str]) -> FakeCloudMetadata:
        servers.append(FakeCloudMetadata(answers))
        return servers[-1]

    yield serve
    for server in servers:
        server.close()


def _refused_url() -> str:
    """A loopback URL where nothing listens: a cloud whose metadata is not there."""
    probe = ThreadingHTTPServer(("127.0.0.1", 0), BaseHTTPRequestHandler)
    port = probe.server_address[1]
    probe.server_close()
    return f"http://127.0.0.1:{port}"


def join(env: dict[str, str], tmp_path: Path, script: Path = JOIN_SCRIPT) -> tuple[int, str, str]:
    """Run the boot script with a recording slurmd: (exit status, the slurmd command line, the
    script's stderr)."""
    recorder = tmp_path / "slurmd"
    recorded = tmp_path / "slurmd-args"
    recorder.write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > {recorded}\n')
    recorder.chmod(0o755)
    done = subprocess.run(
        ["sh", str(script)],
        env={"PATH": "/usr/bin:/bin", "GPU_AUTOSCALER_SLURMD": str(recorder), **env},
        capture_output=True,
        text=True,
        timeout=bound(60),
        check=False,
    )
    args = recorded.read_text() if recorded.exists() else ""
    return done.returncode, args, done.stderr


def _features(args: str) -> list[str]:
    conf = args.splitlines()[args.splitlines().index("--conf") + 1]
    feature = next(word for word in conf.split() if word.startswith("Feature="))
    return feature.removeprefix("Feature=").split(",")


def test_the_boot_script_renders_a_pools_features(tmp_path: Path) -> None:
    for pool in (SPOT_POOL, ON_DEMAND_POOL):
        env = {
            **join_environment(pool, gpu_type="a100"),
            "GPU_AUTOSCALER_NODE_NAME": "i-0abc",
            "GPU_AUTOSCALER_GPUS": "4",
        }
        status, args, _ = join(env, tmp_path)
        assert status == 0
        assert _features(args) == list(node_features(pool))
        assert "Gres=gpu:a100:4" in args.split("\n")[4]
        assert args.splitlines()[:3] == ["-Z", "-N", "i-0abc"]
    assert node_features(SPOT_POOL) == (
        "gpu-autoscaler",
        "market-spot",
        "pool-aws-use1-g5-spot",
        "gpu-a10g",
    )

    rendered = tmp_path / "user-data.sh"
    rendered.write_text(
        user_data(ON_DEMAND_POOL, environment={"GPU_AUTOSCALER_FEATURES": "a100,nvlink"})
    )
    status, args, _ = join(
        {"GPU_AUTOSCALER_NODE_NAME": "i-0def", "GPU_AUTOSCALER_GPUS": "8"}, tmp_path, rendered
    )
    assert status == 0
    assert _features(args) == [*node_features(ON_DEMAND_POOL), "a100", "nvlink"]
    with pytest.raises(ValueError, match="not an environment variable name"):
        user_data(SPOT_POOL, environment={"BAD NAME": "x"})


@pytest.mark.parametrize(
    ("cloud", "answers", "name", "market"),
    [
        (
            "aws",
            {
                "/latest/meta-data/instance-id": "i-0aws",
                "/latest/meta-data/instance-life-cycle": "spot",
            },
            "i-0aws",
            "market-spot",
        ),
        (
            "aws",
            {
                "/latest/meta-data/instance-id": "i-0aws",
                "/latest/meta-data/instance-life-cycle": "on-demand",
            },
            "i-0aws",
            "market-on-demand",
        ),
        (
            "gcp",
            {
                "/computeMetadata/v1/instance/name": "gpu-7",
                "/computeMetadata/v1/instance/scheduling/provisioning-model": "SPOT",
            },
            "gpu-7",
            "market-spot",
        ),
        (
            "gcp",
            {
                "/computeMetadata/v1/instance/name": "gpu-7",
                "/computeMetadata/v1/instance/scheduling/preemptible": "FALSE",
            },
            "gpu-7",
            "market-on-demand",
        ),
        (
            "azure",
            {
                "/metadata/instance/compute/name": "vm-3",
                "/metadata/instance/compute/priority": "Spot",
            },
            "vm-3",
            "market-spot",
        ),
        (
            "azure",
            {"/metadata/instance/compute/name": "vm-3"},
            "vm-3",
            None,
        ),
    ],
)
def test_the_boot_script_reads_the_market_from_the_clouds_metadata(
    tmp_path: Path,
    metadata: Any,
    cloud: str,
    answers: dict[str, str],
    name: str,
    market: str | None,
) -> None:
    server = metadata(answers)
    nowhere = _refused_url()
    env = {
        "GPU_AUTOSCALER_AWS_METADATA": server.url if cloud == "aws" else nowhere,
        "GPU_AUTOSCALER_GCP_METADATA": server.url if cloud == "gcp" else nowhere,
        "GPU_AUTOSCALER_AZURE_METADATA": server.url if cloud == "azure" else nowhere,
        "GPU_AUTOSCALER_GPUS": "1",
    }
    status, args, stderr = join(env, tmp_path)
    assert status == 0, stderr
    assert args.splitlines()[:3] == ["-Z", "-N", name]
    features = _features(args)
    if market is None:
        assert not any(f.startswith("market-") for f in features)
        assert "market unknown" in stderr
    else:
        assert features[:2] == ["gpu-autoscaler", market]


def test_the_boot_script_refuses_a_market_it_does_not_know(tmp_path: Path) -> None:
    status, args, stderr = join(
        {
            "GPU_AUTOSCALER_NODE_NAME": "i-0abc",
            "GPU_AUTOSCALER_GPUS": "1",
            "GPU_AUTOSCALER_MARKET": "spotty",
        },
        tmp_path,
    )
    assert (status, args) == (1, "")
    assert "'spotty' is not spot or on-demand" in stderr


# --------------------------------------------------------------------------------------------
# The cluster laid out for placement


@dataclass
class Fleet:
    cluster: SlurmCluster
    imds: FakeCloudMetadata

    def adapter(self, **settings: Any) -> SlurmAdapter:
        return SlurmAdapter.from_config(
            {"slurm_conf": str(self.cluster.conf), **SETTINGS, **settings}, "hpc"
        )

    def legacy_adapter(self) -> SlurmAdapter:
        """The adapter of a site without on-demand twins, on the ``legacy`` partitions."""
        return SlurmAdapter.from_config(
            {"slurm_conf": str(self.cluster.conf), **LEGACY_SETTINGS}, "legacy"
        )

    def nodes(self) -> dict[str, tuple[str, str]]:
        """Each node's (state, features) as sinfo lists it."""
        out = self.cluster.run("sinfo", "-h", "-N", "-o", "%N %t %f")
        return {n: (s, f) for n, s, f in (line.split() for line in out.splitlines())}


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    cluster = start_slurm_cluster(tmp_path_factory.mktemp("slurm-placement"), LAYOUT)
    imds = FakeCloudMetadata(
        {
            "/latest/meta-data/instance-id": JOINED,
            "/latest/meta-data/instance-life-cycle": "spot",
        }
    )
    built = Fleet(cluster, imds)
    try:
        env = {
            **cluster.env,
            "GPU_AUTOSCALER_AWS_METADATA": imds.url,
            "GPU_AUTOSCALER_POOL": SPOT_POOL.name,
            "GPU_AUTOSCALER_GPU_MODEL": SPOT_POOL.gpu_model or "",
            "GPU_AUTOSCALER_GPUS": str(cluster.gpus_per_node),
            "GPU_AUTOSCALER_GPU_TYPE": cluster.gpu_model,
            "GPU_AUTOSCALER_NODE_CONF": "CPUs=8 RealMemory=4000",
        }
        joined = subprocess.run(
            ["sh", str(JOIN_SCRIPT)],
            env=env,
            capture_output=True,
            text=True,
            timeout=bound(60),
            check=False,
        )
        assert joined.returncode == 0, joined.stderr
        for name, _ in RESERVE:
            start_reserve_node(cluster, name)
        everyone = {*cluster.onprem_nodes, JOINED, *cluster.reserve_nodes}
        wait_for(
            "every node to be idle",
            lambda: all(built.nodes().get(n, ("", ""))[0] == "idle" for n in everyone),
        )
        yield built
        cluster.reset()
        for name in cluster.reserve_nodes:
            stop_reserve_node(cluster, name)
        assert not set(cluster.reserve_nodes) & set(built.nodes()), "back in the reserve"
    finally:
        imds.close()
        stop_slurm_cluster(cluster)


@pytest.fixture
def clean(fleet: Fleet) -> Iterator[Fleet]:
    """The fleet; afterwards no job is left and the on-prem nodes are idle."""
    yield fleet
    fleet.cluster.reset()


def test_cloud_nodes_join_the_partitions_of_their_market(clean: Fleet) -> None:
    nodes = clean.nodes()
    assert nodes[JOINED][1].split(",") == list(node_features(SPOT_POOL))
    partitions = {
        name: set(clean.cluster.run("sinfo", "-h", "-N", "-n", name, "-o", "%P").split())
        for name in nodes
    }
    assert partitions[JOINED] == partitions["i-0spot1"] == {"gpu-spot", "legacy-spot"}
    assert partitions[ON_DEMAND_NODE] == {"gpu-od", "legacy"}
    assert partitions["gpu-a"] == partitions["gpu-b"] == {"gpu*", "legacy", "onprem"}
    reading = clean.adapter().read_nodes(time.time())
    assert set(reading.cloud) == {JOINED, *clean.cluster.reserve_nodes}


@dataclass(frozen=True)
class Submission:
    """One randomized ``sbatch``: ``protected`` is what the policy's placement says of it."""

    args: tuple[str, ...]
    protected: bool
    tasks: int


def _submission(rng: random.Random, placement: Placement, records: Path) -> Submission:
    checkpoints = rng.random() < 0.55
    urgent = rng.random() < 0.2
    gpus = rng.choice((1, 1, 2, 2, 4))
    args: list[str] = [rng.choice((f"--gres=gpu:{gpus}", f"--gres=gpu:a100:{gpus}"))]
    if checkpoints:
        args.append(f"--comment=checkpoint_interval={rng.choice((60, 600))} checkpoint_duration=5")
    if urgent:
        args.append("--priority=5000")
    # the default partition is gpu; a job only cloud nodes can hold (--constraint of their
    # feature) lists a partition that has them, or Slurm refuses it at submission
    where = rng.choice(("", "gpu,onprem", "gpu", "gpu,gpu-od", "legacy", "legacy,onprem"))
    cloud_only = rng.random() < 0.1
    if cloud_only and where in ("", "gpu", "gpu,onprem"):
        where = "gpu,gpu-od"
    if where:
        args.append(f"--partition={where}")
    if cloud_only:
        args.append("--constraint=gpu-autoscaler")
    tasks = 1
    if rng.random() < 0.1:
        tasks = 3
        args.append("--array=0-2")
    seconds = rng.choice((1, 2, 3, 4))
    script = (
        f'echo "$SLURMD_NODENAME" >> {records}/"${{SLURM_ARRAY_JOB_ID:-$SLURM_JOB_ID}}"; '
        f"sleep {seconds}"
    )
    protected = not placement.allows_spot(checkpoints, urgent)
    return Submission((*args, "--wrap", script), protected, tasks)


def _running_on(cluster: SlurmCluster) -> dict[str, str]:
    """Each running job's (array job's) id and its node, from squeue."""
    out = cluster.run("squeue", "-h", "-t", "RUNNING", "-o", "%F %N")
    return dict(line.split() for line in out.splitlines() if len(line.split()) == 2)


def test_no_protected_job_ever_runs_on_a_spot_node(clean: Fleet, tmp_path: Path) -> None:
    cluster = clean.cluster
    records = tmp_path / "ran"
    records.mkdir()
    placement = CostAwarePolicy().placement
    slurm = clean.adapter()
    legacy = clean.legacy_adapter()
    rng = random.Random(SEED)
    submissions = [_submission(rng, placement, records) for _ in range(SUBMISSIONS)]
    submitted: dict[str, Submission] = {}
    seen_on: dict[str, set[str]] = {}
    deadline = time.monotonic() + bound(600)

    def observe() -> None:
        for job_id, node in _running_on(cluster).items():
            seen_on.setdefault(job_id, set()).add(node)

    def all_ran() -> bool:
        return len(submitted) == SUBMISSIONS and all(
            (records / job_id).exists() and len((records / job_id).read_text().split()) >= s.tasks
            for job_id, s in submitted.items()
        )

    queue = list(submissions)
    burst = 20
    while not all_ran():
        assert time.monotonic() < deadline, (
            f"seed {SEED}: {sum((records / j).exists() for j in submitted)} of "
            f"{len(submitted)} jobs ran within 600s; queue: {cluster.run('squeue')}"
        )
        for _ in range(min(len(queue), burst or rng.randint(1, 5))):
            submission = queue.pop(0)
            submitted[cluster.sbatch(*submission.args)] = submission
        burst = 0
        slurm.apply_placement(placement)  # the controller's tick
        legacy.apply_placement(placement)  # another site's
        observe()
        time.sleep(TICK_S)

    ran_on = {job_id: set((records / job_id).read_text().split()) for job_id in submitted}
    for job_id, nodes in seen_on.items():
        ran_on.setdefault(job_id, set()).update(nodes)
    protected_on_spot = {
        job_id: sorted(nodes & SPOT_NODES)
        for job_id, nodes in ran_on.items()
        if submitted[job_id].protected and nodes & SPOT_NODES
    }
    assert protected_on_spot == {}, f"seed {SEED}: protected jobs ran on spot: " + ", ".join(
        f"{job} {submitted[job].args[:-2]} on {sorted(ran_on[job])}" for job in protected_on_spot
    )
    protected = sum(s.protected for s in submitted.values())
    assert 20 <= protected <= 80, "the mix has both kinds"
    spot_safe_on_spot = [j for j, n in ran_on.items() if n & SPOT_NODES]
    assert spot_safe_on_spot, "spot nodes ran none of the jobs allowed there"


def test_placement_changes_only_what_differs(clean: Fleet) -> None:
    """A tick changes each job at most once, and a tick right after changes nothing; the user's
    own partitions are kept."""
    cluster = clean.cluster
    calls: list[tuple[str, ...]] = []

    class Counting(SlurmAdapter):
        def _call(self, *args: str) -> subprocess.CompletedProcess[bytes]:
            calls.append(args)
            return super()._call(*args)

    slurm = Counting.from_config(
        {"slurm_conf": str(cluster.conf), **SETTINGS, "placement_jobs_per_tick": 3}, "hpc"
    )
    placement = CostAwarePolicy().placement
    held = [
        cluster.sbatch("--hold", "--gres=gpu:1", *extra, "--wrap", "sleep 1")
        for extra in (
            ("--comment=checkpoint_interval=60",),
            ("--comment=checkpoint_interval=60", "--partition=gpu,onprem"),
            ("--comment=checkpoint_interval=60",),
            ("--comment=checkpoint_interval=60",),
            (),
            ("--partition=gpu,gpu-spot",),
        )
    ]
    slurm.apply_placement(placement)
    updates = [c for c in calls if c[:2] == ("scontrol", "update") and "jobid" in c[2]]
    changed = [job for c in updates for job in c[2].removeprefix("jobid=").split(",")]
    assert len(changed) == len(set(changed)) == 3, "at most the tick's bound, each once"
    assert held[5] in changed, "jobs to protect go first"
    calls.clear()
    slurm.apply_placement(placement)
    slurm.apply_placement(placement)
    updates = [c for c in calls if c[:2] == ("scontrol", "update") and "jobid" in c[2]]
    assert sum(len(c[2].split(",")) for c in updates) == 3, "the deferred ones, once"
    calls.clear()
    slurm.apply_placement(placement)
    assert not [c for c in calls if c[:2] == ("scontrol", "update") and "jobid" in c[2]]
    partitions = [cluster.job_field(job, "Partition") for job in held]
    assert partitions == [
        "gpu,gpu-spot,gpu-od",
        "gpu,gpu-spot,gpu-od,onprem",
        "gpu,gpu-spot,gpu-od",
        "gpu,gpu-spot,gpu-od",
        "gpu,gpu-od",
        "gpu,gpu-od",
    ]
    calls.clear()
    assert slurm.read(time.time()) == [], "held jobs are not demand"
    slurm.apply_placement(placement)
    assert [c[0] for c in calls].count("squeue") == 1, "the tick's one squeue serves both"


# --------------------------------------------------------------------------------------------
# The order Slurm tries a job's partitions in, and the placement's tiers live

EVERY_NODE = ("gpu-a", "gpu-b", JOINED, "i-0spot1", ON_DEMAND_NODE)
CLOUD_NODES = (JOINED, "i-0spot1", ON_DEMAND_NODE)
AFTER_CLOUD = Placement(
    protect_uncheckpointable=True,
    protect_high_priority=True,
    spot_safe_onprem=OnPremUse.AFTER_CLOUD,
)
CHECKPOINTS = "--comment=checkpoint_interval=600 checkpoint_duration=5"


def _slurm_time(text: str) -> float:
    """A Slurm timestamp (local time, to the second); never, for Unknown or None."""
    try:
        return datetime.datetime.strptime(text, "%Y-%m-%dT%H:%M:%S").timestamp()
    except ValueError:
        return -math.inf


def _looked_at(cluster: SlurmCluster, job: str, since: float) -> bool:
    """Whether Slurm's scheduler has looked at the pending job in a second after ``since``: a
    job that could start by then would have."""
    evaluated = _slurm_time(cluster.job_field(job, "LastSchedEval"))
    return evaluated >= math.floor(since) + 1 and cluster.job_field(job, "JobState") == "PENDING"


def _running_where(cluster: SlurmCluster, *jobs: str) -> list[str]:
    """The node each job runs on, once every one runs."""
    wait_for(
        f"jobs {', '.join(jobs)} to run",
        lambda: all(cluster.job_field(j, "JobState") == "RUNNING" for j in jobs),
    )
    return [cluster.job_field(j, "NodeList") for j in jobs]


@contextlib.contextmanager
def _nodes_down(cluster: SlurmCluster, nodes: tuple[str, ...] = EVERY_NODE) -> Iterator[None]:
    """The nodes drained (running jobs go on, nothing new starts) until the block's end or
    ``_all_up``, which resumes them in one ``scontrol`` command, so the scheduler sees every
    pending job with every node at once, jobs in their order (a job's priority, then its id),
    whatever order they were submitted or judged in."""
    cluster.run("scontrol", "update", f"nodename={','.join(nodes)}", "state=drain", "reason=test")
    try:
        yield
    finally:
        _all_up(cluster, nodes)


def _all_up(cluster: SlurmCluster, nodes: tuple[str, ...] = EVERY_NODE) -> None:
    done = subprocess.run(
        ["scontrol", "update", f"nodename={','.join(nodes)}", "state=resume"],
        env=cluster.env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0 or "not drained" in done.stderr.lower(), done.stderr


@pytest.mark.parametrize(
    ("tiers", "order", "node"),
    [
        ("", "gpu-spot,gpu-od", "i-0spot1"),
        ("", "gpu-od,gpu-spot", ON_DEMAND_NODE),
        ("gpu-od=2", "gpu-spot,gpu-od", ON_DEMAND_NODE),
        ("gpu-spot=2", "gpu-od,gpu-spot", "i-0spot1"),
    ],
)
def test_slurm_tries_a_jobs_partitions_in_list_order_unless_their_tiers_differ(
    clean: Fleet, tiers: str, order: str, node: str
) -> None:
    """What the design rests on (docs/slurm.md): with one spot and one on-demand node free, a
    job goes to the partition it lists first, unless the other has a higher PriorityTier."""
    cluster = clean.cluster
    changed = [item.split("=") for item in tiers.split(",") if item]
    try:
        for partition, tier in changed:
            cluster.run("scontrol", "update", f"partitionname={partition}", f"prioritytier={tier}")
        with _nodes_down(cluster, (JOINED,)):
            job = cluster.sbatch("-p", order, "--gres=gpu:1", "--wrap", "sleep 60")
            assert _running_where(cluster, job) == [node]
            assert cluster.job_field(job, "Partition") == next(
                p for p in ("gpu-spot", "gpu-od") if node in _members(cluster, p)
            )
    finally:
        for partition, _ in changed:
            cluster.run("scontrol", "update", f"partitionname={partition}", "prioritytier=1")


def _members(cluster: SlurmCluster, partition: str) -> set[str]:
    return set(cluster.run("sinfo", "-h", "-N", "-p", partition, "-o", "%N").split())


def test_a_new_job_waits_for_its_judgement_then_takes_spot_before_on_demand(
    clean: Fleet,
) -> None:
    """A spot-safe job submitted to ``gpu,gpu-od`` while only spot has room waits (no tick has
    judged it); judged, it starts on spot. Then a tick that bought a spot instance for a job
    that checkpoints and an on-demand one for a job that cannot, both judged: each job lands on
    the instance bought for it, the spot-safe one on spot although the on-demand one has room."""
    cluster = clean.cluster
    slurm = clean.adapter()
    placement = CostAwarePolicy().placement
    fillers = [
        cluster.sbatch("-p", partition, "-w", node, "--gres=gpu:4", "--wrap", "sleep 600")
        for partition, node in (
            ("onprem", "gpu-a"),
            ("onprem", "gpu-b"),
            ("gpu-od", ON_DEMAND_NODE),
        )
    ]
    _running_where(cluster, *fillers)
    since = time.time()
    new = cluster.sbatch("-p", "gpu,gpu-od", "--gres=gpu:1", CHECKPOINTS, "--wrap", "sleep 600")
    wait_for("Slurm to look at the new job", lambda: _looked_at(cluster, new, since))
    assert cluster.job_field(new, "JobState") == "PENDING", "not on spot before its judgement"
    slurm.apply_placement(placement)  # the tick that judges it
    assert cluster.job_field(new, "Partition") in ("gpu,gpu-spot,gpu-od", "gpu-spot")
    (spot_node,) = _running_where(cluster, new)
    assert spot_node in SPOT_NODES

    cluster.run("scancel", fillers[2])
    wait_for("the on-demand node to be free", lambda: _state(cluster, ON_DEMAND_NODE) == "IDLE")
    other_spot = next(iter(SPOT_NODES - {spot_node}))
    safe = cluster.sbatch(
        "--hold", "-p", "gpu,gpu-od", "--gres=gpu:4", CHECKPOINTS, "--wrap", "sleep 600"
    )
    protected = cluster.sbatch("--hold", "-p", "gpu,gpu-od", "--gres=gpu:4", "--wrap", "sleep 600")
    slurm.apply_placement(placement)
    assert cluster.job_field(safe, "Partition") == "gpu,gpu-spot,gpu-od"
    assert cluster.job_field(protected, "Partition") == "gpu,gpu-od"
    cluster.run("scontrol", "release", f"{safe},{protected}")
    assert _running_where(cluster, safe, protected) == [other_spot, ON_DEMAND_NODE]


def _state(cluster: SlurmCluster, node: str) -> str:
    return cluster.node_field(node, "State")


@pytest.mark.parametrize("onprem", ["first", "after-cloud"])
def test_jobs_take_the_tiers_of_their_placement(clean: Fleet, onprem: str) -> None:
    """Every node free and three spot-safe jobs and a protected one judged, then the nodes up at
    once: on-prem first puts the first two spot-safe jobs on-prem, the third on spot and the
    protected one on on-demand; on-prem after the cloud puts the spot-safe jobs on spot, then
    on on-demand, and the protected one on-prem, though on-demand has room for it (cloud nodes
    keep their last weight: weight 0 sent it to on-demand first)."""
    cluster = clean.cluster
    slurm = clean.adapter()
    placement = CostAwarePolicy().placement if onprem == "first" else AFTER_CLOUD
    sizes = (4, 4, 4, 4) if onprem == "first" else (4, 4, 2, 2)
    with _nodes_down(cluster):
        jobs = [
            cluster.sbatch(
                "-p",
                "gpu,gpu-od",
                f"--gres=gpu:{gpus}",
                *([CHECKPOINTS] if n < 3 else []),
                "--wrap",
                "sleep 600",
            )
            for n, gpus in enumerate(sizes)
        ]
        slurm.apply_placement(placement)
        expected = ("gpu,gpu-spot,gpu-od" if onprem == "first" else "gpu-spot,gpu-od,gpu",) * 3 + (
            "gpu,gpu-od",
        )
        assert tuple(cluster.job_field(j, "Partition") for j in jobs) == expected
    where = _running_where(cluster, *jobs)
    weights = {cluster.node_field(n, "Weight") for n in CLOUD_NODES}
    assert weights == {"1000"}, "cloud nodes last in any partition that mixes them with on-prem"
    onprem_nodes = set(cluster.onprem_nodes)
    if onprem == "first":
        assert set(where[:2]) == onprem_nodes
        assert where[2] in SPOT_NODES
        assert where[3] == ON_DEMAND_NODE
    else:
        assert set(where[:2]) == SPOT_NODES
        assert where[2] == ON_DEMAND_NODE
        assert where[3] in onprem_nodes


def test_a_requeued_job_gets_its_order_back(clean: Fleet) -> None:
    """Slurm puts the partition a requeued job ran in first (``gpu-spot,gpu,gpu-od``, which would
    try spot before on-prem); the adapter's requeue writes the placement's order back in the
    update that releases the job."""
    cluster = clean.cluster
    slurm = clean.adapter()
    placement = CostAwarePolicy().placement
    fillers = [
        cluster.sbatch("-p", "onprem", "-w", node, "--gres=gpu:4", "--wrap", "sleep 600")
        for node in cluster.onprem_nodes
    ]
    _running_where(cluster, *fillers)
    job = cluster.sbatch("--hold", "-p", "gpu", "--gres=gpu:1", CHECKPOINTS, "--wrap", "sleep 600")
    slurm.apply_placement(placement)
    cluster.run("scontrol", "release", job)
    assert _running_where(cluster, job)[0] in SPOT_NODES
    with _nodes_down(cluster):
        slurm.requeue(job)
        assert cluster.job_field(job, "JobState") == "PENDING"
        assert cluster.job_field(job, "Partition") == "gpu,gpu-spot,gpu-od"


def test_an_array_with_a_task_started_is_updated_without_a_failure(clean: Fleet) -> None:
    """``scontrol update`` of several jobs, one an array with a task running, exits 1 saying the
    running task is no longer pending and ``No error`` of the pending ones, which it updated."""
    cluster = clean.cluster
    slurm = clean.adapter()
    with _nodes_down(cluster, CLOUD_NODES):
        filler = cluster.sbatch(
            "-p", "onprem", "-w", "gpu-a", "--gres=gpu:4", "--wrap", "sleep 600"
        )
        _running_where(cluster, filler)
        array = cluster.sbatch("--array=0-2", "--gres=gpu:4", CHECKPOINTS, "--wrap", "sleep 600")
        single = cluster.sbatch("--gres=gpu:4", CHECKPOINTS, "--wrap", "sleep 600")
        assert _running_where(cluster, f"{array}_0") == ["gpu-b"]
        slurm.apply_placement(CostAwarePolicy().placement)
        for job in (f"{array}_1", single):
            assert cluster.job_field(job, "Partition") == "gpu,gpu-spot,gpu-od"


def test_placement_says_when_slurm_would_not_follow_its_order(clean: Fleet) -> None:
    """Managed partitions of different PriorityTier, or one Slurm does not have: one line in
    the tick's placement error, after the jobs were updated all the same."""
    cluster = clean.cluster
    placement = CostAwarePolicy().placement
    job = cluster.sbatch("--hold", "-p", "gpu", "--gres=gpu:1", CHECKPOINTS, "--wrap", "sleep 1")
    try:
        cluster.run("scontrol", "update", "partitionname=gpu-od", "prioritytier=2")
        with pytest.raises(SourceError, match="differ in PriorityTier") as raised:
            clean.adapter().apply_placement(placement)
        assert "gpu-od 2" in str(raised.value) and "\n" not in str(raised.value)
        assert cluster.job_field(job, "Partition") == "gpu,gpu-spot,gpu-od"
    finally:
        cluster.run("scontrol", "update", "partitionname=gpu-od", "prioritytier=1")
    clean.adapter().apply_placement(placement)
    nowhere = clean.adapter(on_demand_partitions={"gpu": "gpu-nowhere"})
    with pytest.raises(SourceError, match="Slurm has no partition gpu-nowhere"):
        nowhere.apply_placement(placement)


# --------------------------------------------------------------------------------------------
# Moving a job off an on-prem node


@pytest.fixture
def inbox() -> Iterator[tuple[RecordingLedger, str]]:
    ledger = RecordingLedger()
    server = InboxServer(NoticeInbox(SystemClock()), TOKEN, checkpoints=ledger)
    server.start()
    try:
        yield ledger, f"http://127.0.0.1:{server.port}"
    finally:
        server.close()


def _submit_training(cluster: SlurmCluster, url: str, directory: Path, *sbatch: str) -> Training:
    done = subprocess.run(
        [str(EXAMPLE / "submit.sh"), "--parsable", *sbatch, "--", "--step-seconds", "0.1"],
        env={
            **cluster.env,
            "GPU_AUTOSCALER_URL": url,
            "GPU_AUTOSCALER_TOKEN": TOKEN,
            "CHECKPOINT_DIR": str(directory),
            "CHECKPOINT_INTERVAL": "3600",
            "CHECKPOINT_DURATION": "1",
        },
        capture_output=True,
        text=True,
        timeout=bound(60),
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return Training(done.stdout.strip().split(";")[0], directory)


def test_a_moved_job_checkpoints_is_requeued_and_stays_off_the_node(
    clean: Fleet, inbox: tuple[RecordingLedger, str], tmp_path: Path
) -> None:
    cluster = clean.cluster
    ledger, url = inbox
    slurm = clean.adapter()
    assert isinstance(slurm, MovesJobsOff) and isinstance(slurm, CheckpointingScheduler)
    placement = CostAwarePolicy().placement
    filler = cluster.sbatch("-p", "onprem", "-w", "gpu-b", "--gres=gpu:4", "--wrap", "sleep 600")
    wait_for("gpu-b to be full", lambda: cluster.job_field(filler, "JobState") == "RUNNING")
    moved = _submit_training(
        cluster, url, tmp_path / "moved", "-p", "onprem", "--gres=gpu:2", "--exclude=i-0spot1"
    )
    wait_for("the job to train on gpu-a", lambda: moved.started_at_step(0) == 0)
    assert cluster.job_field(moved.job_id, "NodeList") == "gpu-a"
    protected = cluster.sbatch("-p", "onprem", "--gres=gpu:4", "--wrap", "sleep 600")

    with pytest.raises(SourceError, match="runs on gpu-a"):
        slurm.move_off(moved.job_id, "gpu-b", protected)
    with pytest.raises(SourceError, match="asked for that node"):
        slurm.move_off(filler, "gpu-b", protected)
    with pytest.raises(SourceError, match="not running"):
        slurm.move_off(protected, "gpu-a", moved.job_id)
    assert cluster.job_field(filler, "Restarts") == "0"

    (job,) = slurm.running_jobs("gpu-a")
    assert (job.id, job.checkpoint_signal) == (moved.job_id, "USR1")
    slurm.signal(job.id, job.checkpoint_signal or "")
    wait_for("the requested checkpoint's report", lambda: ledger.last(moved.job_id), 60)
    saved = moved.saved_step()
    moved_at = time.monotonic()
    slurm.move_off(moved.job_id, "gpu-a", protected)

    assert [(h.job_id, h.node, h.for_job) for h in slurm.held_off()] == [
        (moved.job_id, "gpu-a", protected)
    ]
    assert set(cluster.job_field(moved.job_id, "ExcNodeList").split(",")) == {
        "gpu-a",
        "i-0spot1",
    }

    def protected_started() -> bool:
        slurm.apply_placement(placement)  # the controller's tick
        state = cluster.job_field(moved.job_id, "JobState")
        where = cluster.job_field(moved.job_id, "NodeList")
        assert not (state == "RUNNING" and where == "gpu-a"), "the moved job came back"
        return cluster.job_field(protected, "JobState") == "RUNNING"

    wait_for("the protected job to start in the room made for it", protected_started)
    assert cluster.job_field(protected, "NodeList") == "gpu-a"

    def lifted() -> bool:
        assert cluster.job_field(moved.job_id, "JobState") == "PENDING"
        assert moved.started_at_step(1) is None
        slurm.apply_placement(placement)
        return not slurm.held_off()

    wait_for("the hold to be lifted, its work done", lifted)
    assert time.monotonic() - moved_at >= CRED_EXPIRE_S, "not before the credential expired"
    assert cluster.job_field(moved.job_id, "ExcNodeList") == "i-0spot1"
    assert cluster.job_field(moved.job_id, "Restarts") == "1"

    cluster.run("scancel", protected)
    resumed = wait_for("the moved job to run again", lambda: moved.started_at_step(1))
    assert resumed == saved
    assert cluster.job_field(moved.job_id, "NodeList") == "gpu-a"


class _Counting(SlurmAdapter):
    """The adapter, with every command it runs written down."""

    commands: list[tuple[str, ...]]

    def _call(self, *args: str) -> subprocess.CompletedProcess[bytes]:
        self.__dict__.setdefault("commands", []).append(args)
        return super()._call(*args)


def _counting(fleet: Fleet, **settings: Any) -> _Counting:
    counting = _Counting.from_config(
        {"slurm_conf": str(fleet.cluster.conf), **SETTINGS, **settings}, "hpc"
    )
    counting.commands = []
    return counting


def _hosts(cluster: SlurmCluster, expression: str) -> set[str]:
    return set(cluster.run("scontrol", "show", "hostnames", expression).split())


def _busy(cluster: SlurmCluster, node: str, gpus: int = 4) -> str:
    """A job that takes ``gpus`` GPUs of ``node`` and may run only there, once it runs."""
    job = cluster.sbatch("-p", "onprem", "-w", node, f"--gres=gpu:{gpus}", "--wrap", "sleep 600")
    wait_for(f"{node} to run job {job}", lambda: cluster.job_field(job, "JobState") == "RUNNING")
    return job


def test_a_bound_job_waits_for_its_node_from_the_bind_and_gets_its_own_list_back_once_started(
    clean: Fleet,
) -> None:
    """``bind``, when the moves are decided and before any job moved, sets the pending job's
    ReqNodeList at once; binding again to the same node runs no command. Room coming free on
    another node is left to others (here a younger job takes it) and the job starts in the room
    made for it; its binding ends then, and once it is requeued its own (empty) ReqNodeList is
    given back."""
    cluster = clean.cluster
    slurm = _counting(clean, move_hold_s=600)
    placement = CostAwarePolicy().placement
    filler = _busy(cluster, "gpu-b")
    stayer = _busy(cluster, "gpu-a", 2)
    mover = cluster.sbatch(
        "-p", "onprem", "--gres=gpu:2", "--exclude=i-0spot1", "--wrap", "sleep 600"
    )
    wait_for("gpu-a to be full", lambda: cluster.job_field(mover, "JobState") == "RUNNING")
    owner = cluster.sbatch("-p", "onprem", "--gres=gpu:4", "--wrap", "sleep 600")

    slurm.bind(owner, ["gpu-a"])
    assert cluster.job_field(owner, "ReqNodeList") == "gpu-a"
    assert slurm.bound_to(owner) == ("gpu-a",)
    slurm.commands.clear()
    slurm.bind(owner, ["gpu-a"])
    assert slurm.commands == [], "the same nodes again: nothing to do"
    slurm.move_off(mover, "gpu-a", owner)
    assert cluster.job_field(owner, "ReqNodeList") == "gpu-a"
    assert cluster.job_field(owner, "JobState") == "PENDING"  # gpu-a has 2 GPUs free of 4
    cluster.run("scancel", filler)
    probe = cluster.sbatch("-p", "onprem", "--gres=gpu:4", "--wrap", "sleep 600")

    def probe_started() -> bool:
        slurm.apply_placement(placement)
        return cluster.job_field(probe, "JobState") == "RUNNING"

    wait_for("the younger job to take gpu-b, free now", probe_started)
    assert cluster.job_field(probe, "NodeList") == "gpu-b"
    assert cluster.job_field(owner, "JobState") == "PENDING", "bound to gpu-a"
    cluster.run("scancel", stayer)

    def owner_started() -> bool:
        slurm.apply_placement(placement)
        return cluster.job_field(owner, "JobState") == "RUNNING"

    wait_for("the owner to start in the room made for it", owner_started)
    assert cluster.job_field(owner, "NodeList") == "gpu-a"
    slurm.apply_placement(placement)
    assert slurm.bound_to(owner) is None, "its binding ends once it started"
    cluster.run("scontrol", "requeue", owner)

    def given_back() -> bool:
        slurm.apply_placement(placement)
        return cluster.job_field(owner, "ReqNodeList") == "(null)"

    wait_for("the owner's own node list back once it is pending", given_back)


def test_a_binding_is_replaced_by_other_nodes_and_ends_at_its_bound_or_when_the_job_leaves(
    clean: Fleet,
) -> None:
    """A binding lasts ``move_hold_s`` from the bind, no hold needed: past it, the job pending
    still, its own ReqNodeList is given back. Binding to other nodes replaces the binding; a
    job that leaves the queue takes its binding with it."""
    cluster = clean.cluster
    bound_s = 6.0
    slurm = clean.adapter(move_hold_s=bound_s)
    placement = CostAwarePolicy().placement
    for node in ("gpu-a", "gpu-b"):
        _busy(cluster, node)
    owner = cluster.sbatch("-p", "onprem", "--gres=gpu:4", "--wrap", "sleep 600")

    slurm.bind(owner, ["gpu-a"])
    slurm.bind(owner, ["gpu-b"])
    bound_at = time.monotonic()
    assert cluster.job_field(owner, "ReqNodeList") == "gpu-b"
    assert slurm.bound_to(owner) == ("gpu-b",)

    def given_back() -> bool:
        slurm.apply_placement(placement)
        assert cluster.job_field(owner, "JobState") == "PENDING"
        return cluster.job_field(owner, "ReqNodeList") == "(null)"

    wait_for("the binding to end at its bound", given_back)
    assert time.monotonic() - bound_at >= bound_s, "not before its bound"
    assert slurm.bound_to(owner) is None

    slurm.bind(owner, ["gpu-a"])
    assert cluster.job_field(owner, "ReqNodeList") == "gpu-a", "a new binding"
    cluster.run("scancel", owner)

    def forgotten() -> bool:
        slurm.apply_placement(placement)
        return slurm.bound_to(owner) is None

    wait_for("the binding of a cancelled job to end", forgotten)


def test_a_job_that_is_not_pending_or_chose_its_nodes_is_not_bound(clean: Fleet) -> None:
    """Refused with one clear error, the job unchanged: a running job, a job that asked for
    nodes itself (``--nodelist``), a one-node job given two nodes (Slurm would keep it waiting
    for both)."""
    cluster = clean.cluster
    slurm = clean.adapter()
    running = _busy(cluster, "gpu-a")
    _busy(cluster, "gpu-b")
    chose = cluster.sbatch("-p", "onprem", "-w", "gpu-a", "--gres=gpu:4", "--wrap", "sleep 600")
    single = cluster.sbatch("-p", "onprem", "--gres=gpu:4", "--wrap", "sleep 600")

    with pytest.raises(SourceError, match="it is RUNNING, not pending"):
        slurm.bind(running, ["gpu-b"])
    with pytest.raises(SourceError, match=r"nodes of its own \(--nodelist gpu-a\)"):
        slurm.bind(chose, ["gpu-b"])
    with pytest.raises(SourceError, match=r"it asks 1 node\(s\), not 2"):
        slurm.bind(single, ["gpu-a", "gpu-b"])
    assert cluster.job_field(chose, "ReqNodeList") == "gpu-a"
    assert cluster.job_field(single, "ReqNodeList") == "(null)"
    assert slurm.bound_to(chose) is slurm.bound_to(single) is None


def test_a_multi_node_job_is_bound_to_exactly_the_nodes_freed_for_it(clean: Fleet) -> None:
    """A two-node job bound to gpu-a and gpu-b (in ``legacy``, with an on-demand node beside
    them) does not start when gpu-a and the on-demand node are free, which an unbound two-node
    job submitted after it takes; it starts on gpu-a and gpu-b once both are free."""
    cluster = clean.cluster
    slurm = clean.adapter(move_hold_s=600)
    placement = CostAwarePolicy().placement
    slurm.apply_placement(placement)
    filler_a, filler_b = _busy(cluster, "gpu-a"), _busy(cluster, "gpu-b")
    two = cluster.sbatch("-p", "legacy", "-N2", "--gres=gpu:4", "--wrap", "sleep 600")

    slurm.bind(two, ["gpu-a", "gpu-b"])
    assert _hosts(cluster, cluster.job_field(two, "ReqNodeList")) == {"gpu-a", "gpu-b"}
    assert cluster.job_field(two, "NumNodes").startswith("2")
    other = cluster.sbatch("-p", "legacy", "-N2", "--gres=gpu:4", "--wrap", "sleep 600")
    cluster.run("scancel", filler_a)

    def other_started() -> bool:
        slurm.apply_placement(placement)
        assert cluster.job_field(two, "JobState") == "PENDING", "bound to gpu-a and gpu-b"
        return cluster.job_field(other, "JobState") == "RUNNING"

    wait_for("the unbound job to take gpu-a and the on-demand node", other_started)
    assert _hosts(cluster, cluster.job_field(other, "NodeList")) == {"gpu-a", ON_DEMAND_NODE}
    assert slurm.bound_to(two) == ("gpu-a", "gpu-b")
    cluster.run("scancel", other, filler_b)

    def bound_started() -> bool:
        slurm.apply_placement(placement)
        return cluster.job_field(two, "JobState") == "RUNNING"

    wait_for("the bound job to start on its two nodes", bound_started)
    assert _hosts(cluster, cluster.job_field(two, "NodeList")) == {"gpu-a", "gpu-b"}
    slurm.apply_placement(placement)
    assert slurm.bound_to(two) is None


def test_a_job_moved_off_two_nodes_stays_off_each_until_its_own_hold_ends(clean: Fleet) -> None:
    """A job moved off gpu-a for one owner, then (having started on gpu-b) off gpu-b for
    another, is kept off both: its ExcNodeList has its own exclusion and both nodes. The hold
    off gpu-a ends when its owner starts there, and the job is still kept off gpu-b, where it
    would fit, until that owner starts too; then its own list alone is back."""
    cluster = clean.cluster
    slurm = clean.adapter(move_hold_s=600)
    placement = CostAwarePolicy().placement
    filler_b = _busy(cluster, "gpu-b")
    stayer_a = _busy(cluster, "gpu-a", 2)
    moved = cluster.sbatch(
        "-p", "onprem", "--gres=gpu:2", "--exclude=i-0spot1", "--wrap", "sleep 600"
    )
    assert _running_where(cluster, moved) == ["gpu-a"]
    owner_a = cluster.sbatch("-p", "onprem", "--gres=gpu:4", "--wrap", "sleep 600")
    slurm.bind(owner_a, ["gpu-a"])
    cluster.run("scancel", filler_b)
    wait_for("gpu-b to be free", lambda: _state(cluster, "gpu-b").startswith("IDLE"))
    slurm.move_off(moved, "gpu-a", owner_a)

    def moved_started() -> bool:
        slurm.apply_placement(placement)
        return cluster.job_field(moved, "JobState") == "RUNNING"

    wait_for("the moved job to start on gpu-b", moved_started)
    assert cluster.job_field(moved, "NodeList") == "gpu-b"
    stayer_b = _busy(cluster, "gpu-b", 2)
    owner_b = cluster.sbatch("-p", "onprem", "--gres=gpu:4", "--wrap", "sleep 600")
    slurm.bind(owner_b, ["gpu-b"])
    slurm.move_off(moved, "gpu-b", owner_b)

    assert {(h.job_id, h.node, h.for_job) for h in slurm.held_off()} == {
        (moved, "gpu-a", owner_a),
        (moved, "gpu-b", owner_b),
    }
    excluded = cluster.job_field(moved, "ExcNodeList")
    assert _hosts(cluster, excluded) == {"i-0spot1", "gpu-a", "gpu-b"}
    # bound to a node it is kept off, it could start nowhere: refused, nothing written
    with pytest.raises(SourceError, match="held off gpu-b"):
        slurm.bind(moved, ["gpu-b"])
    assert slurm.bound_to(moved) is None
    assert not cluster.job_field(moved, "ReqNodeList").strip("()").replace("null", "")
    cluster.run("scancel", stayer_a)

    def hold_a_over() -> bool:
        slurm.apply_placement(placement)
        assert cluster.job_field(moved, "JobState") == "PENDING", "kept off both nodes"
        return {h.node for h in slurm.held_off()} == {"gpu-b"}

    wait_for("the hold off gpu-a to end, its owner started there", hold_a_over)
    assert cluster.job_field(owner_a, "NodeList") == "gpu-a"
    assert _hosts(cluster, cluster.job_field(moved, "ExcNodeList")) == {"i-0spot1", "gpu-b"}
    since = time.time()

    def looked_at() -> bool:
        slurm.apply_placement(placement)
        assert cluster.job_field(moved, "JobState") == "PENDING", "back on gpu-b, its hold on"
        return _looked_at(cluster, moved, since)

    wait_for("the scheduler to pass the moved job over, gpu-b half free", looked_at)
    cluster.run("scancel", stayer_b)

    def hold_b_over() -> bool:
        slurm.apply_placement(placement)
        return not slurm.held_off()

    wait_for("the hold off gpu-b to end, its owner started there", hold_b_over)
    assert cluster.job_field(owner_b, "NodeList") == "gpu-b"
    assert cluster.job_field(moved, "ExcNodeList") == "i-0spot1", "its own list alone"
    assert cluster.job_field(moved, "JobState") == "PENDING"  # both nodes full


def test_the_controller_rebalances_on_prem_live(
    clean: Fleet, inbox: tuple[RecordingLedger, str], tmp_path: Path
) -> None:
    """``rebalance_onprem`` through the real controller on the real Slurm: a job that must stay
    off spot waits for on-prem while a smaller spot-safe job holds part of gpu-a and a joined
    spot node has free GPUs. The controller's rule asks to move that job; act asks it to
    checkpoint, moves it off gpu-a once it reports (``move_off``), the protected job starts on
    gpu-a and the moved one resumes from its checkpoint on a cloud node; the policy buys nothing
    for the protected job meanwhile."""
    cluster = clean.cluster
    ledger, url = inbox
    slurm = clean.adapter()
    cloud = FakeCloud(name="aws", price_table={SPOT_POOL.name: 1.0, ON_DEMAND_POOL.name: 3.0})
    cloud.now = time.time
    cloud.instances[JOINED] = Instance(
        id=JOINED,
        pool=SPOT_POOL.name,
        state=InstanceState.RUNNING,
        launched_at=time.time(),
        request_id="before-the-test",
        gpus=SPOT_POOL.gpus_per_instance,
    )
    config = ControllerConfig(
        fleet_id="rebalance",
        pools=(SPOT_POOL, ON_DEMAND_POOL),
        interruptions=InterruptionConfig(checkpoint_margin_s=60.0),
    )
    controller = Controller(
        config,
        CostAwarePolicy(CostAwareParams(idle_seconds=3600)),
        {"aws": cloud},
        SystemClock(),
        queue_sources=[slurm],
        node_source=slurm,
        scheduler=slurm,
        checkpoints=ledger,
    )
    try:
        controller.tick()  # the placement in force: cloud nodes weigh more than on-prem
        filler = cluster.sbatch(
            "-p", "onprem", "-w", "gpu-b", "--gres=gpu:4", "--wrap", "sleep 600"
        )
        wait_for("gpu-b to be full", lambda: cluster.job_field(filler, "JobState") == "RUNNING")
        moved = _submit_training(cluster, url, tmp_path / "moved", "--gres=gpu:2")
        wait_for("the job to train on gpu-a", lambda: moved.started_at_step(0) == 0)
        assert cluster.job_field(moved.job_id, "NodeList") == "gpu-a"
        protected = cluster.sbatch("-p", "onprem", "--gres=gpu:4", "--wrap", "sleep 600")
        reports: list[TickReport] = []

        def protected_started() -> bool:
            reports.append(controller.tick())
            where = cluster.job_field(moved.job_id, "NodeList")
            state = cluster.job_field(moved.job_id, "JobState")
            assert not (state == "RUNNING" and where == "gpu-a" and moved.started_at_step(1)), (
                "the moved job came back"
            )
            return cluster.job_field(protected, "JobState") == "RUNNING"

        wait_for("the protected job to start in the room made for it", protected_started, 180)
        assert cluster.job_field(protected, "NodeList") == "gpu-a"
        moves = [
            (a.outcome, a.job_id)
            for r in reports
            for a in r.actions
            if a.kind == "evacuate" and a.outcome in ("checkpoint-asked", "moved-off")
        ]
        assert moves == [("checkpoint-asked", moved.job_id), ("moved-off", moved.job_id)]
        assert cloud.launch_calls == [], "nothing bought for the job room was made for"
        saved = moved.saved_step()

        def resumed() -> int | None:
            controller.tick()
            return moved.started_at_step(1)

        assert wait_for("the moved job to resume on a cloud node", resumed, 180) == saved
        assert cluster.job_field(moved.job_id, "NodeList") in {JOINED, *cluster.reserve_nodes}
    finally:
        controller.close()
