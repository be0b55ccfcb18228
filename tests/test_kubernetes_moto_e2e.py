"""End to end on a cluster's API with AWS behind it: the real controller (``build_controller``,
live mode, the karpenter policy) on a manual clock, the AWS provider against moto's server, and
the ``kubernetes`` source through the official client against the API emulator, whose tiny
scheduler binds pods and whose Job controller recreates a deleted pod.

The pools are handed to the provider as the assembly hands them (``joined_pools``): each with the
source's EKS join script as user data. Each EC2 instance moto runs "boots" here by running the
user data moto holds for it under ``sh``, with a recording stand-in for ``/etc/eks/bootstrap.sh``;
its kubelet registers the node as EKS does, named by the instance's private DNS name (so the
instance is found by ``spec.providerID`` alone, ``aws:///<az>/<instance id>``), with the labels
and taints the script passed it and the pool's GPUs allocatable. A node whose instance moto no
longer runs goes, as the cloud controller manager removes it.

Pending GPU pods → spot instances launched in moto (CreateFleet, tagged, ``InstanceLifecycle``
spot) and an on-demand one for the protected pod → nodes register → pods bind → pods finish →
each node cordoned and its pod that holds no GPU evicted, then its instance terminated in moto.
A spot interruption warning (EventBridge's event on the SQS queue the provider watches) → the
pod's ``checkpoint-requested`` annotation → the pod deleted → its Job makes it again, bound on
a replacement node; the warned instance terminated and the message acknowledged. A pod without
the spot toleration is never bound to a spot node: checked after every scheduling pass of every
test.
"""

from __future__ import annotations

import base64
import json
import logging
import shlex
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import boto3
import pytest
from aws_support import REGION
from k8s_api_emulator import K8sApi
from k8s_cluster import JobController, bind, finish, node, pod, schedule, spot_toleration
from k8s_source_support import make_source
from waits import bound

from autoscaler.app.assembly import Mode, Parts, build_controller, joined_pools
from autoscaler.fleet.telemetry import IdleTracker
from autoscaler.model import Pool
from autoscaler.model.clock import ManualClock
from autoscaler.model.config import ControllerConfig
from autoscaler.model.records import TickReport
from autoscaler.ops.metrics import Metrics
from autoscaler.sources.kubernetes import KubernetesSource
from autoscaler.sources.kubernetes_join import MARKET_LABEL, node_labels, node_taints
from autoscaler.spi.policy import load_policy
from autoscaler.spi.provider import FLEET_TAG, LAUNCHED_AT_TAG, POOL_TAG, REQUEST_TAG
from autoscaler.tick.controller import Controller
from autoscaler.tick.observe import Signals
from autoscaler.tick.retry import RetryPolicy
from providers.aws import AwsProvider

FLEET = "k8s-moto"
ZONES = (f"{REGION}a", f"{REGION}b")
TICK_S = 60.0
CHECKPOINTS = {
    "gpu-autoscaler.io/checkpoint_interval": "600",
    "gpu-autoscaler.io/checkpoint_duration": "30",
}
ASKED = "gpu-autoscaler.io/checkpoint-requested"
# the source renders every pool's boot script: EKS's bootstrap.sh with the labels and taint
JOIN = {"method": "eks", "cluster_name": "gpu", "eks_bootstrap": "bootstrap.sh"}
GONE_STATES = ("shutting-down", "terminated", "stopping", "stopped")


def pools() -> list[dict[str, Any]]:
    common = {
        "provider": "aws",
        "region": REGION,
        "instance_type": "g5.12xlarge",
        "gpus_per_instance": 4,
        "gpu_model": "A10G",
        "boot_seconds": 60,
        # two zones: a launch is one CreateFleet (instant) choosing between them, as in
        # production; moto's RunInstances makes MinCount instances only, never up to MaxCount
        "options": {"launch_template": {"name": "gpu"}, "zones": list(ZONES)},
    }
    return [
        {"name": "a10g-spot", "market": "spot", **common},
        {"name": "a10g-od", "market": "on-demand", **common},
    ]


def taint(text: str) -> dict[str, str]:
    """``key=value:Effect`` as the kubelet's ``--register-with-taints`` writes it on the node."""
    pair, effect = text.rsplit(":", 1)
    key, value = pair.split("=", 1)
    return {"key": key, "value": value, "effect": effect}


@dataclass(frozen=True)
class Joined:
    """What the boot script gave the kubelet: its labels and taints."""

    labels: dict[str, str]
    taints: list[dict[str, str]]


def boot(user_data: str, root: Path) -> Joined:
    """Run an instance's user data as cloud-init would (``sh``), with a stand-in for EKS's
    ``/etc/eks/bootstrap.sh`` that records its arguments, and read the kubelet flags the join
    passed in ``--kubelet-extra-args``, as the kubelet would register its node with them."""
    root.mkdir(parents=True, exist_ok=True)
    record = root / "bootstrap.args"
    bootstrap = root / "bootstrap.sh"
    bootstrap.write_text(
        f"#!/bin/sh\n{{ for a; do printf '%s\\037' \"$a\"; done; }} > {shlex.quote(str(record))}\n"
    )
    bootstrap.chmod(0o755)
    (root / "user-data").write_text(user_data)
    done = subprocess.run(
        ["sh", str(root / "user-data")],
        env={
            "PATH": "/usr/bin:/bin",
            "TMPDIR": str(root),
            "GPU_AUTOSCALER_EKS_BOOTSTRAP": str(bootstrap),
        },
        capture_output=True,
        text=True,
        timeout=bound(60),
        check=False,
    )
    assert done.returncode == 0, done.stderr
    args = record.read_text().split("\037")[:-1]
    assert args[:2] == [JOIN["cluster_name"], "--kubelet-extra-args"], args
    flags = dict(flag.removeprefix("--").split("=", 1) for flag in args[2].split())
    labels = dict(pair.split("=", 1) for pair in flags["node-labels"].split(","))
    taints = flags["register-with-taints"].split(",") if "register-with-taints" in flags else []
    return Joined(labels, [taint(t) for t in taints])


def tags(instance: dict[str, Any]) -> dict[str, str]:
    return {t["Key"]: t["Value"] for t in instance.get("Tags", [])}


@dataclass
class World:
    """The controller, moto and the cluster, moved a tick at a time."""

    api: K8sApi
    source: KubernetesSource
    provider: AwsProvider
    controller: Controller
    clock: ManualClock
    pools: dict[str, Pool]
    jobs: JobController
    ec2: Any
    sqs: Any
    notices: str
    root: Path
    reports: list[TickReport] = field(default_factory=list)
    # instance id -> node name, every node a kubelet registered, and what its join gave it
    registered: dict[str, str] = field(default_factory=dict)
    joined: dict[str, Joined] = field(default_factory=dict)
    # nodes seen cordoned after a tick while moto still ran their instances
    cordoned_running: set[str] = field(default_factory=set)

    def user_data(self, instance_id: str) -> str:
        """What EC2 says the instance boots with (DescribeInstanceAttribute, base64)."""
        answer = self.ec2.describe_instance_attribute(InstanceId=instance_id, Attribute="userData")
        value = answer["UserData"].get("Value")
        assert value, f"{instance_id} was launched with no user data"
        return base64.b64decode(value, validate=True).decode()

    def instances(self) -> dict[str, dict[str, Any]]:
        """Every instance moto holds with our fleet tag, in any state, by id."""
        pages = self.ec2.describe_instances(
            Filters=[{"Name": f"tag:{FLEET_TAG}", "Values": [FLEET]}]
        )["Reservations"]
        return {i["InstanceId"]: i for r in pages for i in r["Instances"]}

    def live(self) -> dict[str, dict[str, Any]]:
        return {k: i for k, i in self.instances().items() if i["State"]["Name"] not in GONE_STATES}

    def kubelets(self) -> None:
        """A running instance boots its user data (the join) and its kubelet registers the
        node as EKS does: named by the instance's private DNS name, ``spec.providerID``
        ``aws:///<az>/<instance id>``, the labels and taints the join gave it, its pool's GPUs
        allocatable. A node whose instance is going or gone is removed, as the cloud controller
        manager does."""
        instances = self.instances()
        nodes = {n["metadata"]["name"] for n in self.api.items("nodes")}
        for instance_id, instance in instances.items():
            name = instance["PrivateDnsName"]
            if instance["State"]["Name"] != "running" or instance_id in self.registered:
                continue
            pool = self.pools[tags(instance)[POOL_TAG]]
            zone = instance["Placement"]["AvailabilityZone"]
            joined = boot(self.user_data(instance_id), self.root / instance_id)
            self.joined[instance_id] = joined
            self.api.put(
                "nodes",
                node(
                    name,
                    pool.gpus_per_instance,
                    labels=joined.labels,
                    taints=joined.taints,
                    provider_id=f"aws:///{zone}/{instance_id}",
                ),
            )
            self.registered[instance_id] = name
            # a pod that holds no GPU (a log shipper of a Deployment), for the drain to evict
            helper = pod(f"shipper-{instance_id}", "ops", tolerations=[spot_toleration()])
            helper["metadata"]["ownerReferences"] = [
                {
                    "apiVersion": "apps/v1",
                    "kind": "ReplicaSet",
                    "name": "shipper-5d8f",
                    "uid": "rs-1",
                    "controller": True,
                }
            ]
            self.api.put("pods", helper)
            bind(self.api, helper["metadata"]["name"], "ops", name)
        for instance_id, name in self.registered.items():
            state = instances[instance_id]["State"]["Name"] if instance_id in instances else None
            if (state is None or state in GONE_STATES) and name in nodes:
                self.api.remove("nodes", name)

    def tick(self, advance: float = TICK_S) -> TickReport:
        """One tick ``advance`` seconds after the last (0: the run loop woken by a notice)."""
        self.clock.advance(advance)
        self.kubelets()
        self.schedule()
        report = self.controller.tick()
        self.reports.append(report)
        live = self.live()
        for found in self.api.items("nodes"):
            instance_id = found["spec"].get("providerID", "").rsplit("/", 1)[-1]
            if found["spec"].get("unschedulable") and instance_id in live:
                self.cordoned_running.add(found["metadata"]["name"])
        return report

    def schedule(self) -> None:
        schedule(self.api)
        spot = {
            n["metadata"]["name"]
            for n in self.api.items("nodes")
            if n["metadata"]["labels"].get(MARKET_LABEL) == "spot"
        }
        for made in self.api.items("pods"):
            if not made["spec"].get("tolerations"):
                assert made["spec"].get("nodeName") not in spot, (
                    f"protected pod {made['metadata']['name']} bound to a spot node"
                )

    def node_of(self, name: str, namespace: str = "ml") -> dict[str, Any] | None:
        found = self.api.get("pods", name, namespace)
        where = found["spec"].get("nodeName") if found else None
        return self.api.get("nodes", where) if where else None

    def pods(self, prefix: str) -> list[dict[str, Any]]:
        return [p for p in self.api.items("pods") if p["metadata"]["name"].startswith(prefix)]

    def bound(self, prefix: str) -> bool:
        found = self.pods(prefix)
        return bool(found) and all(p["spec"].get("nodeName") for p in found)

    def warn(self, instance_id: str) -> None:
        """EventBridge's spot interruption warning for ``instance_id``, sent to the queue the
        provider watches, stamped with the controller's clock."""
        at = datetime.fromtimestamp(self.clock.now(), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        self.sqs.send_message(
            QueueUrl=self.notices,
            MessageBody=json.dumps(
                {
                    "version": "0",
                    "id": f"warning-{instance_id}",
                    "detail-type": "EC2 Spot Instance Interruption Warning",
                    "source": "aws.ec2",
                    "account": "123456789012",
                    "time": at,
                    "region": REGION,
                    "resources": [f"arn:aws:ec2:{REGION}:123456789012:instance/{instance_id}"],
                    "detail": {"instance-id": instance_id, "instance-action": "terminate"},
                }
            ),
        )


@pytest.fixture
def world(
    aws: str, k8s_api: K8sApi, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> Iterator[World]:
    clock = ManualClock(float(int(time.time())))
    sqs = boto3.client("sqs", region_name=REGION, endpoint_url=aws)
    notices = sqs.create_queue(QueueName="interruptions")["QueueUrl"]
    config = ControllerConfig.model_validate(
        {
            "fleet_id": FLEET,
            "tick_seconds": TICK_S,
            "policy": {"name": "karpenter"},
            "providers": {
                "aws": {"endpoint_url": aws, "interruption_queue_url": notices, "queue_wait_s": 1}
            },
            "pools": pools(),
            "drain_timeout_s": 600,
        }
    )
    source = make_source(k8s_api, monkeypatch, join_user_data=True, join=JOIN)
    # the pools as the assembly hands them to the provider: each with the source's join script
    provider = AwsProvider.from_config(
        config.providers["aws"], list(joined_pools(config, source)), FLEET, clock
    )
    controller = build_controller(
        config,
        Mode.LIVE,
        load_policy(config.policy.name, config.policy.params),
        clock,
        Parts(
            {"aws": provider},
            Signals(queues=(source,), nodes=source, tracker=IdleTracker()),
            source,
        ),
        incarnation="k8s-moto-e2e",
        retry=RetryPolicy(attempts=2, sleep=lambda _s: None),
    ).controller
    made = World(
        k8s_api,
        source,
        provider,
        controller,
        clock,
        {p.name: p for p in config.pools},
        JobController(k8s_api),
        boto3.client("ec2", region_name=REGION, endpoint_url=aws),
        sqs,
        notices,
        tmp_path,
    )
    try:
        yield made
    finally:
        controller.close()
        provider.close()
        source.close()


def add_job(world: World, name: str, spot: bool) -> None:
    extra: dict[str, Any] = (
        {"annotations": CHECKPOINTS, "tolerations": [spot_toleration()]}
        if spot
        else {"priority_class": "production"}
    )
    made = pod("t", "ml", gpus=4, **extra)
    template = {
        "metadata": {"annotations": made["metadata"].get("annotations", {})},
        "spec": made["spec"],
    }
    world.jobs.add_job(name, template, namespace="ml")


def tick_until(world: World, done: Callable[[], bool], ticks: int = 30) -> None:
    for _ in range(ticks):
        world.tick()
        if done():
            return
    raise AssertionError(f"not done after {ticks} ticks: {world.reports[-1]}")


def wait_until(condition: Callable[[], bool], seconds: float = 30.0) -> bool:
    """Poll ``condition`` (a ceiling scaled by the wait knob); the caller asserts."""
    give_up = time.monotonic() + bound(seconds)
    while time.monotonic() < give_up:
        if condition():
            return True
        time.sleep(0.05)
    return condition()


def test_pending_pods_buy_spot_in_moto_nodes_join_bind_finish_drain_and_terminate(
    world: World,
) -> None:
    add_job(world, "safe-a", spot=True)
    add_job(world, "safe-b", spot=True)
    add_job(world, "protected", spot=False)
    world.schedule()  # no nodes yet: every pod is tried and found no room

    tick_until(world, lambda: world.bound("safe-") and world.bound("protected-"))
    bought = world.instances()
    by_pool: dict[str, list[dict[str, Any]]] = {}
    for instance in bought.values():
        by_pool.setdefault(tags(instance)[POOL_TAG], []).append(instance)
    assert {k: len(v) for k, v in by_pool.items()} == {"a10g-spot": 2, "a10g-od": 1}
    for pool_name, instances in by_pool.items():
        for instance in instances:
            held = tags(instance)
            assert held[FLEET_TAG] == FLEET
            assert held[REQUEST_TAG] and float(held[LAUNCHED_AT_TAG]) > 0
            assert instance["InstanceType"] == "g5.12xlarge"
            assert instance["Placement"]["AvailabilityZone"] in ZONES
            spot = pool_name == "a10g-spot"
            assert (instance.get("InstanceLifecycle") == "spot") is spot, instance
            pool = world.pools[pool_name]
            assert world.joined[instance["InstanceId"]] == Joined(
                node_labels(pool), [taint(t) for t in node_taints(pool)]
            ), "the user data moto holds joins the node with its pool's labels and taint"
    spot_ids = {i["InstanceId"] for i in by_pool["a10g-spot"]}

    for made in world.pods("safe-") + world.pods("protected-"):
        where = world.node_of(made["metadata"]["name"])
        assert where is not None
        instance_id = where["spec"]["providerID"].rsplit("/", 1)[1]
        assert where["metadata"]["name"] == bought[instance_id]["PrivateDnsName"]
        market = where["metadata"]["labels"][MARKET_LABEL]
        protected = made["metadata"]["name"].startswith("protected-")
        assert market == ("on-demand" if protected else "spot")
        assert (instance_id in spot_ids) is not protected
    assert world.source.skipped == 0

    for made in world.pods("safe-") + world.pods("protected-"):
        finish(world.api, made["metadata"]["name"], "ml")

    def all_gone() -> bool:
        return not world.live() and not world.api.items("nodes")

    tick_until(world, all_gone)
    states = {i["State"]["Name"] for i in world.instances().values()}
    assert states <= {"shutting-down", "terminated"}, states
    assert set(world.instances()) == set(bought), "nothing bought beyond the three"
    assert world.cordoned_running == set(world.registered.values()), (
        "each node was cordoned while its instance still ran"
    )
    patched = {r.path for r in world.api.served("PATCH") if r.path.startswith("/api/v1/nodes/")}
    assert patched == {f"/api/v1/nodes/{name}" for name in world.registered.values()}, (
        "the only node writes are the cordons"
    )
    evicted = {r.path for r in world.api.served("POST") if r.path.endswith("/eviction")}
    assert evicted == {
        f"/api/v1/namespaces/ops/pods/shipper-{i}/eviction" for i in world.registered
    }, "each node's pod holding no GPU was evicted by the drain"
    assert not world.pods("shipper-"), "the evicted pods are gone"
    deleted = [r for r in world.api.served("DELETE") if r.path.startswith("/api/v1/")]
    assert deleted == [], "finished GPU pods are left alone"
    when: dict[tuple[str, str], int] = {}
    for index, report in enumerate(world.reports):
        for action in report.actions:
            if action.kind in ("drain", "terminate") and action.outcome == "ok":
                for instance_id in action.instance_ids:
                    when.setdefault((action.kind, instance_id), index)
    for instance_id in bought:
        drained, ended = when[("drain", instance_id)], when[("terminate", instance_id)]
        assert drained < ended, f"{instance_id} was terminated no later than it was drained"


def test_a_protected_pod_waits_for_on_demand_beside_an_empty_spot_node(world: World) -> None:
    add_job(world, "safe", spot=True)
    world.schedule()
    tick_until(world, lambda: world.bound("safe-"))
    (spot_node,) = [
        n for n in world.api.items("nodes") if n["metadata"]["labels"][MARKET_LABEL] == "spot"
    ]
    for made in world.pods("safe-"):
        finish(world.api, made["metadata"]["name"], "ml")
    add_job(world, "guarded", spot=False)
    world.schedule()
    (guarded,) = world.pods("guarded-")
    (condition,) = [c for c in guarded["status"]["conditions"] if c["type"] == "PodScheduled"]
    assert "untolerated taint {gpu-autoscaler.io/spot: true}" in condition["message"], (
        "the spot node had room and the scheduler turned the pod away for its taint alone"
    )
    tick_until(world, lambda: world.bound("guarded-"), ticks=12)
    (guarded,) = world.pods("guarded-")
    where = world.node_of(guarded["metadata"]["name"])
    assert where is not None and where["metadata"]["name"] != spot_node["metadata"]["name"]
    assert where["metadata"]["labels"][MARKET_LABEL] == "on-demand"
    instance_id = where["spec"]["providerID"].rsplit("/", 1)[1]
    instance = world.instances()[instance_id]
    assert tags(instance)[POOL_TAG] == "a10g-od" and "InstanceLifecycle" not in instance


def test_a_spot_warning_on_sqs_asks_the_pod_to_checkpoint_then_its_job_makes_it_again(
    world: World,
) -> None:
    add_job(world, "train", spot=True)
    world.schedule()
    tick_until(world, lambda: world.bound("train-"))
    (first,) = world.pods("train-")
    name = first["metadata"]["name"]
    where = first["spec"]["nodeName"]
    victim = world.api.get("nodes", where)
    assert victim is not None
    instance_id = victim["spec"]["providerID"].rsplit("/", 1)[1]
    asked: list[str] = []

    def seen() -> bool:
        """Records the annotation while the pod lives; true once the pod is gone."""
        found = world.api.get("pods", name, "ml")
        value = (found or {}).get("metadata", {}).get("annotations", {}).get(ASKED)
        if value:
            asked.append(value)
        return found is None

    warned_at = time.time()
    world.warn(instance_id)
    watcher = world.provider.watcher
    assert watcher is not None
    assert wait_until(lambda: watcher.notices_ready() > 0), "the warning was read from SQS"
    world.tick(advance=0)  # a notice wakes the run loop at once
    assert not seen()
    assert asked, "the pod was asked to checkpoint through its annotation"
    assert int(asked[0]) >= int(warned_at), "the wall-clock time it was asked, in unix seconds"
    cordoned = world.api.get("nodes", where)
    assert cordoned is not None and cordoned["spec"].get("unschedulable") is True, (
        "the warned node takes no new pod"
    )

    tick_until(world, seen, ticks=6)
    moves = [
        a.outcome
        for r in world.reports
        for a in r.actions
        if a.kind == "evacuate" and a.job_id == f"ml/{name}"
    ]
    assert moves == ["checkpoint-asked", "requeued-at-deadline"], moves
    writes = [(r.method, r.path) for r in world.api.served() if r.method in ("PATCH", "DELETE")]
    assert writes == [
        ("PATCH", f"/api/v1/nodes/{where}"),
        ("PATCH", f"/api/v1/namespaces/ml/pods/{name}"),
        ("DELETE", f"/api/v1/namespaces/ml/pods/{name}"),
    ], "cordoned, then asked to checkpoint, then deleted"
    assert world.jobs.recreated, "the Job made the pod again"
    assert [r.path for r in world.api.served("DELETE")] == [f"/api/v1/namespaces/ml/pods/{name}"]
    again = world.jobs.recreated[0].split("/")[1]
    assert again != name
    tick_until(world, lambda: world.bound("train-"))
    moved_to = world.node_of(again)
    assert moved_to is not None and moved_to["metadata"]["name"] != where
    # (on spot or on-demand: the karpenter policy holds the interrupted offering unavailable
    # for a while, as Karpenter does, and the pod tolerates either)
    replacement = moved_to["spec"]["providerID"].rsplit("/", 1)[1]
    assert replacement != instance_id and replacement in world.live()
    # the warned instance, still running past its deadline (moto never reclaims it), is
    # terminated by the controller, and its node goes with it
    tick_until(
        world,
        lambda: instance_id not in world.live() and world.api.get("nodes", where) is None,
        ticks=6,
    )

    def acknowledged() -> bool:
        counts = world.sqs.get_queue_attributes(
            QueueUrl=world.notices,
            AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
        )["Attributes"]
        return all(int(v) == 0 for v in counts.values())

    assert wait_until(acknowledged), "the warning was deleted from the queue once handled"


def test_pods_no_pool_can_host_buy_nothing_and_are_counted_in_logs_and_metrics(
    world: World, caplog: pytest.LogCaptureFixture
) -> None:
    world.controller.metrics = Metrics()
    for name, extra in {
        "team": {"node_selector": {"team": "ml"}},  # no pool's nodes carry it
        "amd": {"resource": "amd.com/gpu"},  # a GPU resource no setting counts
        "rack": {"node_selector": {"gpu-autoscaler.io/pool": "h100-spot"}},  # no such pool
    }.items():
        made = pod("t", "ml", gpus=4, **extra)  # type: ignore[arg-type]
        world.jobs.add_job(name, {"metadata": {}, "spec": made["spec"]}, namespace="ml")
    unreadable = pod("odd", "ml", gpus=1)
    unreadable["spec"]["tolerations"] = "everything"
    world.api.put("pods", unreadable)
    world.schedule()
    with caplog.at_level(logging.WARNING):
        for _ in range(4):
            report = world.tick()
    assert world.instances() == {}, "nothing bought for pods no node of ours could take"
    assert report.view.demand.known, "never unknown, never zero"
    assert sum(g.jobs for g in report.view.demand.groups) == 4
    stuck = {u.label: u.jobs for u in report.unhostable}
    assert stuck == {
        "1x4 GPU(s) of a node with team=ml": 1,
        "1x4 GPU(s) of amd.com/gpu": 1,
        "1x4 GPU(s) of a node with gpu-autoscaler.io/pool=h100-spot": 1,
        "1x1 GPU(s) of an unreadable pod": 1,
    }
    registry = world.controller.metrics.registry
    for problem, count in {
        "unmet-node-selector": 2,
        "unknown-gpu-resource": 1,
        "unreadable": 1,
        "bad-checkpoint-annotation": 0,
    }.items():
        labels = {"source": world.source.name, "problem": problem}
        assert registry.get_sample_value("gpu_autoscaler_source_problems", labels) == count
    problems = "\n".join(world.source.problems)  # the warning line shows three of them
    assert "pod ml/team-0-" in problems and "needs a node with team=ml" in problems
    said = "\n".join(r.getMessage() for r in caplog.records)
    assert "spec.tolerations is 'everything', not a list" in said
    assert "stay pending: needs 1 node(s) of 4 GPU(s) of a node with team=ml" in said
    assert "Traceback" not in said

    # a pod that one pool can take is still bought for beside them
    world.api.remove("pods", "odd", "ml")  # the stand-in scheduler reads pods less kindly
    add_job(world, "fits", spot=True)
    world.schedule()
    tick_until(world, lambda: world.bound("fits-"))
    assert {tags(i)[POOL_TAG] for i in world.instances().values()} == {"a10g-spot"}
