"""End to end on a cluster's API: the real controller (``build_controller``, live mode, the
karpenter policy) on a manual clock, the simulated cloud, and the ``kubernetes`` source through
the official client against the API emulator, whose tiny scheduler binds pods and whose Job
controller recreates a deleted pod.

Pending GPU pods → instances launched (spot for the pods that checkpoint and tolerate the spot
taint, on-demand for the protected one) → nodes register with the join's labels and taint →
pods bind (the protected pod never on a spot node) → pods finish → nodes drained and
terminated. And a spot interruption notice → the pod's checkpoint-requested annotation → the
pod deleted at its deadline → its Job makes it again, pending for a new node.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from k8s_api_emulator import K8sApi
from k8s_cluster import (
    JobController,
    finish,
    node,
    pod,
    schedule,
    spot_taint,
    spot_toleration,
    tried,
)
from k8s_source_support import make_source

from autoscaler.app.assembly import Mode, Parts, build_controller
from autoscaler.fleet.telemetry import IdleTracker
from autoscaler.model import InstanceState, Pool
from autoscaler.model.clock import ManualClock
from autoscaler.model.config import ControllerConfig
from autoscaler.model.records import TickReport
from autoscaler.sources.kubernetes import KubernetesSource
from autoscaler.sources.kubernetes_join import node_labels
from autoscaler.spi.policy import load_policy
from autoscaler.tick.controller import Controller
from autoscaler.tick.observe import Signals
from autoscaler.tick.retry import RetryPolicy
from providers.sim import LiveSimProvider, SimProvider

FLEET = "k8s-e2e"
TICK_S = 60.0
CHECKPOINTS = {
    "gpu-autoscaler.io/checkpoint_interval": "600",
    "gpu-autoscaler.io/checkpoint_duration": "30",
}


def pools() -> list[dict[str, Any]]:
    common = {
        "provider": "sim",
        "region": "us-east-1",
        "zone": "us-east-1a",
        "instance_type": "g5.12xlarge",
        "gpus_per_instance": 4,
        "gpu_model": "A10G",
        "boot_seconds": 60,
    }
    return [
        {"name": "a10g-spot", "market": "spot", **common},
        {"name": "a10g-od", "market": "on-demand", **common},
    ]


@dataclass
class World:
    """The controller, the cloud and the cluster, moved a tick at a time."""

    api: K8sApi
    source: KubernetesSource
    provider: LiveSimProvider
    controller: Controller
    clock: ManualClock
    pools: dict[str, Pool]
    jobs: JobController
    reports: list[TickReport] = field(default_factory=list)

    def instances(self) -> dict[str, Any]:
        return {i.id: i for i in self.provider.list_instances(FLEET)}

    def kubelets(self) -> None:
        """A booted instance's kubelet registers its node as the join makes it (named by its
        instance id, the pool's labels, the spot taint); a terminated instance's node goes, as
        the cloud controller manager removes it."""
        live = {i.id: i for i in self.instances().values() if i.state is InstanceState.RUNNING}
        nodes = {n["metadata"]["name"] for n in self.api.items("nodes")}
        for instance_id, instance in live.items():
            if instance_id in nodes:
                continue
            pool = self.pools[instance.pool]
            self.api.put(
                "nodes",
                node(
                    instance_id,
                    pool.gpus_per_instance,
                    labels=node_labels(pool),
                    taints=[spot_taint()] if pool.is_spot else [],
                    provider_id=f"aws:///us-east-1a/{instance_id}",
                ),
            )
        for name in nodes - set(live):
            self.api.remove("nodes", name)

    def tick(self) -> TickReport:
        self.clock.advance(TICK_S)
        self.kubelets()
        schedule(self.api)
        report = self.controller.tick()
        self.reports.append(report)
        return report

    def node_of(self, name: str, namespace: str = "ml") -> dict[str, Any] | None:
        found = self.api.get("pods", name, namespace)
        where = found["spec"].get("nodeName") if found else None
        return self.api.get("nodes", where) if where else None

    def pods(self, prefix: str) -> list[dict[str, Any]]:
        return [p for p in self.api.items("pods") if p["metadata"]["name"].startswith(prefix)]


@pytest.fixture
def world(k8s_api: K8sApi, monkeypatch: pytest.MonkeyPatch) -> Iterator[World]:
    clock = ManualClock(1_700_000_000.0)
    config = ControllerConfig.model_validate(
        {
            "fleet_id": FLEET,
            "tick_seconds": TICK_S,
            "policy": {"name": "karpenter"},
            "pools": pools(),
            "drain_timeout_s": 600,
        }
    )
    provider = SimProvider.from_config({"boot_seconds": 60}, list(config.pools), FLEET, clock)
    source = make_source(k8s_api, monkeypatch)
    controller = build_controller(
        config,
        Mode.LIVE,
        load_policy(config.policy.name, config.policy.params),
        clock,
        Parts(
            {"sim": provider},
            Signals(queues=(source,), nodes=source, tracker=IdleTracker()),
            source,
        ),
        incarnation="k8s-e2e",
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
    )
    yield made
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


def tick_until(world: World, done: Any, ticks: int = 30) -> None:
    for _ in range(ticks):
        world.tick()
        if done():
            return
    raise AssertionError(f"not done after {ticks} ticks: {world.reports[-1]}")


def test_pending_pods_get_nodes_that_join_bind_finish_and_go(world: World) -> None:
    add_job(world, "safe-a", spot=True)
    add_job(world, "safe-b", spot=True)
    add_job(world, "protected", spot=False)
    schedule(world.api)  # no nodes yet: every pod is tried and found no room

    def all_bound() -> bool:
        return all(p["spec"].get("nodeName") for p in world.api.items("pods"))

    tick_until(world, all_bound)
    markets = {
        p["metadata"]["name"].rsplit("-", 2)[0]: world.node_of(p["metadata"]["name"])
        for p in world.api.items("pods")
    }
    for name, where in markets.items():
        assert where is not None
        market = where["metadata"]["labels"]["gpu-autoscaler.io/market"]
        assert market == ("on-demand" if name == "protected" else "spot"), name
    bought = {i.pool for i in world.instances().values()}
    assert bought == {"a10g-spot", "a10g-od"}
    assert world.source.skipped == 0

    for made in world.api.items("pods"):
        finish(world.api, made["metadata"]["name"], "ml")

    def all_gone() -> bool:
        live = [i for i in world.instances().values() if i.state is not InstanceState.TERMINATED]
        return not live and not world.api.items("nodes")

    tick_until(world, all_gone)
    cordoned = {r.path for r in world.api.served("PATCH") if r.path.startswith("/api/v1/nodes/")}
    assert len(cordoned) == 3, "each node was cordoned before it went"
    deleted = [r for r in world.api.served("DELETE") if r.path.startswith("/api/v1/")]
    assert deleted == [], "finished pods are left alone"


def test_a_protected_pod_never_lands_on_spot_even_with_spot_room(world: World) -> None:
    add_job(world, "safe", spot=True)
    schedule(world.api)
    tick_until(world, lambda: bool(world.pods("safe-")[0]["spec"].get("nodeName")))
    spot_nodes = [
        n["metadata"]["name"]
        for n in world.api.items("nodes")
        if n["metadata"]["labels"]["gpu-autoscaler.io/market"] == "spot"
    ]
    assert spot_nodes
    # a second spot node with room, then a pod that must stay off spot
    for made in world.pods("safe-"):
        finish(world.api, made["metadata"]["name"], "ml")
    add_job(world, "guarded", spot=False)
    for _ in range(12):
        world.tick()
        where = world.node_of(world.pods("guarded-")[0]["metadata"]["name"])
        if where is not None:
            assert where["metadata"]["labels"]["gpu-autoscaler.io/market"] == "on-demand"
            return
        guarded = world.pods("guarded-")[0]
        assert not guarded["spec"].get("nodeName")
    raise AssertionError("the protected pod never got an on-demand node")


def test_a_notice_asks_the_pod_to_checkpoint_then_its_job_makes_it_again(world: World) -> None:
    add_job(world, "train", spot=True)
    schedule(world.api)
    tick_until(world, lambda: bool(world.pods("train-")[0]["spec"].get("nodeName")))
    (first,) = world.pods("train-")
    name = first["metadata"]["name"]
    where = first["spec"]["nodeName"]
    asked: list[str] = []

    def seen_annotation() -> bool:
        found = world.api.get("pods", name, "ml")
        value = (
            (found or {})
            .get("metadata", {})
            .get("annotations", {})
            .get("gpu-autoscaler.io/checkpoint-requested")
        )
        if value:
            asked.append(value)
        return found is None

    world.provider.interrupt(where)
    tick_until(world, lambda: bool(asked) or seen_annotation(), ticks=3)
    seen_annotation()
    assert asked, "the pod was asked to checkpoint through its annotation"
    assert int(asked[0]) > 1_600_000_000, "the wall-clock time it was asked, in unix seconds"

    tick_until(world, seen_annotation, ticks=6)
    assert world.jobs.recreated, "the Job made the pod again"
    assert [r.path for r in world.api.served("DELETE")] == [f"/api/v1/namespaces/ml/pods/{name}"]
    again = world.jobs.recreated[0].split("/")[1]
    assert again != name
    tick_until(
        world,
        lambda: bool((world.api.get("pods", again, "ml") or {}).get("spec", {}).get("nodeName")),
    )
    moved_to = world.node_of(again)
    assert moved_to is not None and moved_to["metadata"]["name"] != where


def test_a_failing_api_server_holds_scale_down_and_says_which_call(world: World) -> None:
    add_job(world, "work", spot=True)
    schedule(world.api)
    tick_until(world, lambda: bool(world.pods("work-")[0]["spec"].get("nodeName")))
    for made in world.pods("work-"):
        finish(world.api, made["metadata"]["name"], "ml")
    world.api.fail(503, path=r"^/api/v1/pods")
    for _ in range(4):  # long past the node's consolidation wait
        report = world.tick()
        assert not report.view.demand.known
        assert any("list pods: HTTP 503" in e for e in report.errors), report.errors
        assert not [a for a in report.actions if a.kind in ("drain", "terminate")], report.actions
    assert all(i.state is InstanceState.RUNNING for i in world.instances().values())
    world.api.heal()
    tick_until(
        world,
        lambda: (
            not world.instances()
            or all(i.state is InstanceState.TERMINATED for i in world.instances().values())
        ),
    )


def test_a_pod_asking_for_a_resource_no_pool_has_is_reported_unhostable(world: World) -> None:
    made = tried(pod("amd", "ml", gpus=2, resource="amd.com/gpu"))
    world.api.put("pods", made)
    report = world.tick()
    assert report.view.demand.known
    assert [(u.jobs, u.shape.gpu_models) for u in report.unhostable] == [(1, ("amd.com/gpu",))]
    assert not world.instances(), "nothing is bought for it"
