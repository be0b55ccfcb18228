"""The ``kubernetes`` source's move path (``MovesJobsOff``), through the official client against
the API emulator: a Job's pod moved off a node for a pending pod is deleted and made again by
its Job, the node keeps the room for the pending pod (a taint only it tolerates), the hold is
listed from the node (so a restarted controller sees it) and lifted once it has done its work;
a bare pod is never moved; a hold annotation edited by hand is a named problem, never a silent
"no holds" nor a lifted taint. And end to end, the real controller reclaims a team's guaranteed
on-prem GPUs from a borrowing team's pod."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from k8s_api_emulator import K8sApi, merge_patch
from k8s_cluster import (
    POD_GROUP,
    JobController,
    bind,
    daemonset_owner,
    finish,
    node,
    pod,
    schedule,
    wait_for,
)
from k8s_source_support import make_source
from waits import bound

from autoscaler.app.assembly import Mode, Parts, build_controller
from autoscaler.fleet.telemetry import IdleTracker
from autoscaler.model import Placement
from autoscaler.model.clock import ManualClock
from autoscaler.model.config import ControllerConfig
from autoscaler.model.errors import InputError, SourceError
from autoscaler.model.records import TickReport
from autoscaler.sources.kubernetes import KubernetesSource
from autoscaler.sources.kubernetes.moves import (
    HOLD_TAINT_KEY,
    HOLDS_ANNOTATION,
    Hold,
    Moved,
    node_patch,
    read_holds,
    write_holds,
)
from autoscaler.spi.policy import load_policy
from autoscaler.tick.controller import Controller
from autoscaler.tick.observe import Signals
from autoscaler.tick.retry import RetryPolicy
from providers.sim import LiveSimProvider, SimProvider

GPU_NODE = "gpu-a"
MAINTENANCE = {"key": "example.com/maintenance", "value": "soon", "effect": "PreferNoSchedule"}
HOLD_TOLERATION = {
    "key": HOLD_TAINT_KEY,
    "operator": "Equal",
    "value": GPU_NODE,
    "effect": "NoSchedule",
}


@pytest.fixture
def source(k8s_api: K8sApi, monkeypatch: pytest.MonkeyPatch) -> Iterator[KubernetesSource]:
    made = make_source(k8s_api, monkeypatch)
    yield made
    made.close()


@pytest.fixture
def jobs(k8s_api: K8sApi) -> JobController:
    return JobController(k8s_api)


def gpu_node(k8s_api: K8sApi, name: str = GPU_NODE, **extra: Any) -> None:
    k8s_api.put("nodes", node(name, 4, taints=[MAINTENANCE], **extra))


def borrower(k8s_api: K8sApi, jobs: JobController, where: str = GPU_NODE, **extra: Any) -> str:
    """A Job's 4-GPU pod in namespace ``team-b``, running on ``where``; returns its id."""
    made = pod("t", "team-b", gpus=4, **extra)
    template = {"metadata": {"labels": made["metadata"]["labels"]}, "spec": made["spec"]}
    job = jobs.add_job("borrow", template, namespace="team-b")
    (created,) = [
        p
        for p in k8s_api.items("pods")
        if (p["metadata"].get("labels") or {}).get("job-name") == job["metadata"]["name"]
    ]
    name = created["metadata"]["name"]
    bind(k8s_api, name, "team-b", where)
    return f"team-b/{name}"


def owner(k8s_api: K8sApi, name: str = "owner") -> str:
    """A bare 4-GPU pod of ``team-a``, pending."""
    k8s_api.put("pods", pod(name, "team-a", gpus=4))
    return f"team-a/{name}"


def node_of(k8s_api: K8sApi, name: str = GPU_NODE) -> dict[str, Any]:
    found = k8s_api.get("nodes", name)
    assert found is not None
    return found


def hold_taints(k8s_api: K8sApi, name: str = GPU_NODE) -> list[dict[str, Any]]:
    taints = node_of(k8s_api, name)["spec"].get("taints") or []
    return [t for t in taints if t["key"] == HOLD_TAINT_KEY]


def holds_annotation(k8s_api: K8sApi, name: str = GPU_NODE) -> str | None:
    annotations = node_of(k8s_api, name)["metadata"].get("annotations") or {}
    value = annotations.get(HOLDS_ANNOTATION)
    return value if isinstance(value, str) else None


def pod_at(k8s_api: K8sApi, ident: str) -> dict[str, Any] | None:
    namespace, name = ident.split("/")
    return k8s_api.get("pods", name, namespace)


def bound_to(k8s_api: K8sApi, ident: str) -> str | None:
    found = pod_at(k8s_api, ident)
    return found["spec"].get("nodeName") if found else None


# -- the move and its hold ---------------------------------------------------------------------


def test_a_moved_pod_leaves_and_its_room_is_kept_for_the_owner_until_it_starts(
    k8s_api: K8sApi,
    jobs: JobController,
    source: KubernetesSource,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    gpu_node(k8s_api)
    k8s_api.put("nodes", node("gpu-z", 4))  # room elsewhere: where the moved pod may go
    moved = borrower(k8s_api, jobs, priority=1000)  # tried first by the scheduler
    waiting = owner(k8s_api)

    before = time.time()
    source.move_off(moved, GPU_NODE, waiting)

    assert pod_at(k8s_api, moved) is None, "the borrower was deleted"
    (again,) = jobs.recreated
    assert again.startswith("team-b/borrow-") and again != moved
    assert hold_taints(k8s_api) == [
        {"key": HOLD_TAINT_KEY, "value": GPU_NODE, "effect": "NoSchedule"}
    ]
    assert MAINTENANCE in node_of(k8s_api)["spec"]["taints"], "other taints are kept"
    recorded = json.loads(holds_annotation(k8s_api) or "null")
    assert [(h["job"], h["for"]) for h in recorded] == [(moved, waiting)]
    owner_pod = pod_at(k8s_api, waiting)
    assert owner_pod is not None
    assert owner_pod["spec"]["tolerations"] == [HOLD_TOLERATION]
    (held,) = source.held_off()
    assert (held.job_id, held.node, held.for_job) == (moved, GPU_NODE, waiting)
    assert before <= held.since <= time.time()

    # a controller that restarts reads the hold back from the node
    restarted = make_source(k8s_api, monkeypatch, name="restarted")
    try:
        assert restarted.held_off() == [held]
    finally:
        restarted.close()

    # the recreated pod is tried first (higher priority) and kept off the held node; the owner
    # lands there
    source.apply_placement(Placement())
    assert hold_taints(k8s_api), "not lifted while the owner waits"
    bound = schedule(k8s_api)
    assert bound_to(k8s_api, waiting) == GPU_NODE
    assert bound_to(k8s_api, again) == "gpu-z"
    assert set(bound) == {waiting, again}

    source.apply_placement(Placement())
    assert hold_taints(k8s_api) == [], "lifted once the owner is bound"
    assert holds_annotation(k8s_api) is None
    assert MAINTENANCE in node_of(k8s_api)["spec"]["taints"]
    assert source.held_off() == []


def test_the_recreated_pod_stays_off_the_held_node_while_the_owner_cannot_start(
    k8s_api: K8sApi, jobs: JobController, source: KubernetesSource
) -> None:
    gpu_node(k8s_api)
    moved = borrower(k8s_api, jobs)
    waiting = owner(k8s_api)
    # the owner cannot start anywhere yet: it asks for a node label no node has
    k8s_api.mutate(
        "pods", "owner", lambda p: p["spec"].update(nodeSelector={"zone": "nowhere"}), "team-a"
    )
    source.move_off(moved, GPU_NODE, waiting)
    (again,) = jobs.recreated
    for _ in range(3):
        schedule(k8s_api)
        source.apply_placement(Placement())
    assert bound_to(k8s_api, again) is None, "the room is the owner's"
    recreated = pod_at(k8s_api, again)
    assert recreated is not None
    (condition,) = recreated["status"]["conditions"]
    assert HOLD_TAINT_KEY in condition["message"]
    assert len(source.held_off()) == 1


@pytest.mark.parametrize("how", ["bound elsewhere", "deleted", "namesake", "finished", "bound"])
def test_a_hold_ends_once_its_owner_no_longer_waits(
    k8s_api: K8sApi, jobs: JobController, source: KubernetesSource, how: str
) -> None:
    gpu_node(k8s_api)
    k8s_api.put("nodes", node("gpu-z", 4))
    moved = borrower(k8s_api, jobs)
    waiting = owner(k8s_api)
    source.move_off(moved, GPU_NODE, waiting)
    if how == "bound elsewhere":
        bind(k8s_api, "owner", "team-a", "gpu-z")
    elif how == "bound":
        bind(k8s_api, "owner", "team-a", GPU_NODE)
    elif how == "deleted":
        k8s_api.remove("pods", "owner", "team-a")
    elif how == "namesake":
        k8s_api.remove("pods", "owner", "team-a")
        owner(k8s_api)
    else:
        k8s_api.mutate("pods", "owner", lambda p: p["status"].update(phase="Failed"), "team-a")
    source.apply_placement(Placement())
    assert hold_taints(k8s_api) == [] and holds_annotation(k8s_api) is None
    assert source.held_off() == []


def test_a_hold_ends_at_its_bound(
    k8s_api: K8sApi, jobs: JobController, source: KubernetesSource
) -> None:
    gpu_node(k8s_api)
    moved = borrower(k8s_api, jobs)
    waiting = owner(k8s_api)
    source.move_off(moved, GPU_NODE, waiting)
    source.mover.move_hold_s = 0.001
    time.sleep(0.01)
    assert source.held_off() == [], "a hold past its bound is not listed"
    source.apply_placement(Placement())
    assert hold_taints(k8s_api) == [] and holds_annotation(k8s_api) is None


def test_the_hold_bound_is_the_sources_move_hold_s(
    k8s_api: K8sApi, jobs: JobController, monkeypatch: pytest.MonkeyPatch
) -> None:
    gpu_node(k8s_api)
    made = make_source(k8s_api, monkeypatch, move_hold_s=7200)
    try:
        made.move_off(borrower(k8s_api, jobs), GPU_NODE, owner(k8s_api))
        assert len(made.held_off()) == 1
        # the bound test_a_hold_ends_at_its_bound exercises is the one configured
        assert made.mover.move_hold_s == 7200
    finally:
        made.close()
    with pytest.raises(InputError, match="move_hold_s"):
        make_source(k8s_api, monkeypatch, move_hold_s=0)


def test_two_holds_on_one_node_share_its_taint_until_the_last_ends(
    k8s_api: K8sApi, jobs: JobController, source: KubernetesSource
) -> None:
    k8s_api.put("nodes", node(GPU_NODE, 8))
    first = borrower(k8s_api, jobs)
    made = pod("t", "team-b", gpus=4)
    template = {"metadata": {}, "spec": made["spec"]}
    jobs.add_job("other", template, namespace="team-b")
    (other,) = [p for p in k8s_api.items("pods") if p["metadata"]["name"].startswith("other-")]
    bind(k8s_api, other["metadata"]["name"], "team-b", GPU_NODE)
    one, two = owner(k8s_api, "one"), owner(k8s_api, "two")
    source.move_off(first, GPU_NODE, one)
    source.move_off(f"team-b/{other['metadata']['name']}", GPU_NODE, two)
    assert len(hold_taints(k8s_api)) == 1, "one taint per node (unique by key and effect)"
    assert {h.for_job for h in source.held_off()} == {one, two}
    bind(k8s_api, "one", "team-a", GPU_NODE)
    source.apply_placement(Placement())
    assert [h.for_job for h in source.held_off()] == [two]
    assert len(hold_taints(k8s_api)) == 1, "still held for the other owner"
    bind(k8s_api, "two", "team-a", GPU_NODE)
    source.apply_placement(Placement())
    assert hold_taints(k8s_api) == [] and holds_annotation(k8s_api) is None


def test_holds_are_listed_and_lifted_through_the_watch_cache(
    k8s_api: K8sApi, jobs: JobController, monkeypatch: pytest.MonkeyPatch
) -> None:
    cached = make_source(k8s_api, monkeypatch, name="cached", watch_cache=True)
    try:
        gpu_node(k8s_api)
        moved = borrower(k8s_api, jobs)
        waiting = owner(k8s_api)
        assert cached.held_off() == []
        cached.move_off(moved, GPU_NODE, waiting)
        assert wait_for(lambda: len(cached.held_off()) == 1, bound(30))
        bind(k8s_api, "owner", "team-a", GPU_NODE)
        cached.apply_placement(Placement())
        assert hold_taints(k8s_api) == [] and holds_annotation(k8s_api) is None
        assert wait_for(lambda: cached.held_off() == [], bound(30))
    finally:
        cached.close()


def test_a_node_changed_meanwhile_is_read_again_and_kept(
    k8s_api: K8sApi, jobs: JobController, source: KubernetesSource
) -> None:
    gpu_node(k8s_api)
    moved = borrower(k8s_api, jobs)
    waiting = owner(k8s_api)

    def relabel() -> None:
        k8s_api.mutate("nodes", GPU_NODE, lambda n: n["metadata"]["labels"].update(rack="r7"))

    k8s_api.before_next("PATCH", relabel)  # the node changes under the first write: a 409
    source.move_off(moved, GPU_NODE, waiting)
    assert [r.status for r in k8s_api.served("PATCH")][:1] == [409]
    assert node_of(k8s_api)["metadata"]["labels"]["rack"] == "r7", "the change made is kept"
    assert len(hold_taints(k8s_api)) == 1 and pod_at(k8s_api, moved) is None


def test_a_move_that_fails_takes_its_hold_back(
    k8s_api: K8sApi, jobs: JobController, source: KubernetesSource
) -> None:
    gpu_node(k8s_api)
    moved = borrower(k8s_api, jobs)
    waiting = owner(k8s_api)
    k8s_api.before_next("DELETE", lambda: k8s_api.fail(403, times=1))
    with pytest.raises(SourceError, match="HTTP 403"):
        source.move_off(moved, GPU_NODE, waiting)
    assert pod_at(k8s_api, moved) is not None and not jobs.recreated
    assert hold_taints(k8s_api) == [] and holds_annotation(k8s_api) is None
    assert MAINTENANCE in node_of(k8s_api)["spec"]["taints"]
    assert source.held_off() == []


# -- binding: the room kept from the moment the moves are decided ------------------------------


def annotated(k8s_api: K8sApi, name: str = GPU_NODE) -> list[dict[str, Any]]:
    recorded = json.loads(holds_annotation(k8s_api, name) or "[]")
    assert isinstance(recorded, list)
    return recorded


def tolerations(k8s_api: K8sApi, ident: str) -> list[dict[str, Any]]:
    found = pod_at(k8s_api, ident)
    assert found is not None
    return list(found["spec"].get("tolerations") or [])


def job_pod(
    k8s_api: K8sApi, jobs: JobController, name: str, where: str, gpus: int = 4, **extra: Any
) -> str:
    """A Job's pod in ``team-b`` running on ``where``; returns its id."""
    made = pod("t", "team-b", gpus=gpus, **extra)
    template = {"metadata": {"labels": made["metadata"]["labels"]}, "spec": made["spec"]}
    jobs.add_job(name, template, namespace="team-b")
    (created,) = [p for p in k8s_api.items("pods") if p["metadata"]["name"].startswith(f"{name}-")]
    bind(k8s_api, created["metadata"]["name"], "team-b", where)
    return f"team-b/{created['metadata']['name']}"


def test_bind_holds_the_node_at_once_and_keeps_other_pods_off_while_the_movers_checkpoint(
    k8s_api: K8sApi, jobs: JobController, source: KubernetesSource
) -> None:
    k8s_api.put("nodes", node(GPU_NODE, 8))
    k8s_api.put("nodes", node("gpu-z", 4))
    first = job_pod(k8s_api, jobs, "first", GPU_NODE)
    second = job_pod(k8s_api, jobs, "second", GPU_NODE)
    k8s_api.put("pods", pod("owner", "team-a", gpus=8))
    waiting = "team-a/owner"

    before = time.time()
    source.bind(waiting, [GPU_NODE])

    assert pod_at(k8s_api, first) is not None and pod_at(k8s_api, second) is not None
    assert k8s_api.served("DELETE") == [], "nothing is moved by a bind"
    assert hold_taints(k8s_api) == [
        {"key": HOLD_TAINT_KEY, "value": GPU_NODE, "effect": "NoSchedule"}
    ]
    (record,) = annotated(k8s_api)
    assert record["for"] == waiting and record["bound"] is True and record["moved"] == []
    assert before <= record["since"] <= time.time()
    assert tolerations(k8s_api, waiting) == [HOLD_TOLERATION]
    assert source.held_off() == [], "no pod is held off yet: none was moved"

    # one mover leaves by itself (its checkpoint ended the pod) while the other checkpoints:
    # a pod that is not the owner, tried before it, is kept off the room that came free
    finish(k8s_api, first.split("/")[1], "team-b")
    k8s_api.put("pods", pod("intruder", "team-c", gpus=4, priority=1000))
    schedule(k8s_api)
    assert bound_to(k8s_api, "team-c/intruder") == "gpu-z", "the free half is the owner's"
    k8s_api.put("pods", pod("late", "team-c", gpus=4, priority=1000))
    schedule(k8s_api)
    assert bound_to(k8s_api, "team-c/late") is None
    assert bound_to(k8s_api, waiting) is None, "the owner needs the whole node"

    source.move_off(second, GPU_NODE, waiting)
    (record,) = annotated(k8s_api)
    assert record["bound"] is True
    assert [m["job"] for m in record["moved"]] == [second], "added to the bound hold"
    (held,) = source.held_off()
    assert (held.job_id, held.node, held.for_job) == (second, GPU_NODE, waiting)
    assert held.since >= record["since"]
    assert tolerations(k8s_api, waiting) == [HOLD_TOLERATION], "no second toleration"

    schedule(k8s_api)
    assert bound_to(k8s_api, waiting) == GPU_NODE
    assert bound_to(k8s_api, "team-c/late") is None
    source.apply_placement(Placement())
    assert hold_taints(k8s_api) == [] and holds_annotation(k8s_api) is None
    assert source.held_off() == []
    schedule(k8s_api)


def test_binding_again_to_the_same_nodes_writes_nothing(
    k8s_api: K8sApi, jobs: JobController, source: KubernetesSource
) -> None:
    gpu_node(k8s_api)
    moved = borrower(k8s_api, jobs)
    waiting = owner(k8s_api)
    source.bind(waiting, [GPU_NODE])
    recorded = holds_annotation(k8s_api)
    patches = len(k8s_api.served("PATCH"))
    source.bind(waiting, [GPU_NODE])
    source.bind(waiting, [GPU_NODE, GPU_NODE])
    assert len(k8s_api.served("PATCH")) == patches, "nothing written"
    assert holds_annotation(k8s_api) == recorded
    source.move_off(moved, GPU_NODE, waiting)
    recorded = holds_annotation(k8s_api)
    source.bind(waiting, [GPU_NODE])
    assert holds_annotation(k8s_api) == recorded, "a bind after the move changes nothing"
    assert tolerations(k8s_api, waiting) == [HOLD_TOLERATION]


def test_binding_to_other_nodes_ends_the_binding_on_those_left_out(
    k8s_api: K8sApi, jobs: JobController, source: KubernetesSource
) -> None:
    gpu_node(k8s_api)
    k8s_api.put("nodes", node("gpu-b", 4))
    k8s_api.put("nodes", node("gpu-c", 4))
    moved = borrower(k8s_api, jobs)
    job_pod(k8s_api, jobs, "other", "gpu-c")
    waiting = owner(k8s_api)
    source.bind(waiting, [GPU_NODE])
    source.move_off(moved, GPU_NODE, waiting)
    source.bind(waiting, ["gpu-c"])
    assert hold_taints(k8s_api, "gpu-c") and annotated(k8s_api, "gpu-c")[0]["bound"] is True
    # the pod moved off gpu-a stays held off it, by a hold no longer bound
    (left,) = read_holds(holds_annotation(k8s_api) or "")
    assert not left.bound and [m.job for m in left.moved] == [moved]
    assert hold_taints(k8s_api)
    source.bind(waiting, ["gpu-b"])
    assert hold_taints(k8s_api, "gpu-c") == [] and holds_annotation(k8s_api, "gpu-c") is None
    assert {t["value"] for t in tolerations(k8s_api, waiting)} == {GPU_NODE, "gpu-c", "gpu-b"}


@pytest.mark.parametrize("how", ["bound", "finished", "gone", "terminating"])
def test_bind_is_refused_having_written_nothing_for_an_owner_that_waits_no_more(
    k8s_api: K8sApi, source: KubernetesSource, how: str
) -> None:
    gpu_node(k8s_api)
    k8s_api.put("nodes", node("gpu-z", 4))
    waiting = owner(k8s_api)
    if how == "bound":
        bind(k8s_api, "owner", "team-a", "gpu-z")
    elif how == "finished":
        k8s_api.mutate("pods", "owner", lambda p: p["status"].update(phase="Failed"), "team-a")
    elif how == "gone":
        k8s_api.remove("pods", "owner", "team-a")
    else:
        k8s_api.mutate(
            "pods",
            "owner",
            lambda p: p["metadata"].update(deletionTimestamp="2026-01-01T00:00:00Z"),
            "team-a",
        )
    with pytest.raises(SourceError, match="waits no more" if how != "gone" else "is gone"):
        source.bind(waiting, [GPU_NODE])
    assert k8s_api.served("PATCH") == []
    assert hold_taints(k8s_api) == [] and holds_annotation(k8s_api) is None


@pytest.mark.parametrize("affinity", [False, True])
def test_bind_is_refused_for_an_owner_that_chose_its_nodes(
    k8s_api: K8sApi, source: KubernetesSource, affinity: bool
) -> None:
    gpu_node(k8s_api)
    hostname = "kubernetes.io/hostname"
    if affinity:
        term = {"matchExpressions": [{"key": hostname, "operator": "In", "values": ["gpu-z"]}]}
        required = {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}
        made = pod("owner", "team-a", gpus=4, affinity={"nodeAffinity": required})
    else:
        made = pod("owner", "team-a", gpus=4, node_selector={hostname: "gpu-z"})
    k8s_api.put("pods", made)
    with pytest.raises(SourceError, match=r"nodes of its own.*gpu-z"):
        source.bind("team-a/owner", [GPU_NODE])
    assert k8s_api.served("PATCH") == [] and hold_taints(k8s_api) == []


def test_a_bind_that_fails_on_one_node_takes_back_the_others(
    k8s_api: K8sApi, source: KubernetesSource
) -> None:
    gpu_node(k8s_api)
    k8s_api.put("nodes", node("gpu-z", 4))
    waiting = owner(k8s_api)
    k8s_api.fail(403, times=1, path="/nodes/gpu-z")
    with pytest.raises(SourceError, match="HTTP 403"):
        source.bind(waiting, [GPU_NODE, "gpu-z"])
    assert hold_taints(k8s_api) == [] and holds_annotation(k8s_api) is None
    assert hold_taints(k8s_api, "gpu-z") == []
    assert MAINTENANCE in node_of(k8s_api)["spec"]["taints"]


@pytest.mark.parametrize("how", ["bound", "bound elsewhere", "deleted", "past its bound"])
def test_a_bound_hold_ends_as_other_holds_do(
    k8s_api: K8sApi, source: KubernetesSource, how: str
) -> None:
    gpu_node(k8s_api)
    k8s_api.put("nodes", node("gpu-z", 4))
    waiting = owner(k8s_api)
    source.bind(waiting, [GPU_NODE])
    source.apply_placement(Placement())
    assert hold_taints(k8s_api), "kept while the owner waits"
    if how == "bound":
        bind(k8s_api, "owner", "team-a", GPU_NODE)
    elif how == "bound elsewhere":
        bind(k8s_api, "owner", "team-a", "gpu-z")
    elif how == "deleted":
        k8s_api.remove("pods", "owner", "team-a")
    else:
        source.mover.move_hold_s = 0.001
        time.sleep(0.01)
    source.apply_placement(Placement())
    assert hold_taints(k8s_api) == [] and holds_annotation(k8s_api) is None


def test_a_restarted_controller_reads_a_binding_back_and_moves_into_it(
    k8s_api: K8sApi,
    jobs: JobController,
    source: KubernetesSource,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    gpu_node(k8s_api)
    moved = borrower(k8s_api, jobs)
    waiting = owner(k8s_api)
    source.bind(waiting, [GPU_NODE])
    recorded = holds_annotation(k8s_api)
    restarted = make_source(k8s_api, monkeypatch, name="restarted")
    try:
        patches = len(k8s_api.served("PATCH"))
        restarted.bind(waiting, [GPU_NODE])
        assert len(k8s_api.served("PATCH")) == patches and holds_annotation(k8s_api) == recorded
        restarted.move_off(moved, GPU_NODE, waiting)
        (record,) = annotated(k8s_api)
        assert record["bound"] is True and [m["job"] for m in record["moved"]] == [moved]
        assert restarted.held_off() == source.held_off() != []
        bind(k8s_api, "owner", "team-a", GPU_NODE)
        restarted.apply_placement(Placement())
        assert hold_taints(k8s_api) == [] and holds_annotation(k8s_api) is None
    finally:
        restarted.close()


def test_a_hold_written_before_bind_existed_is_read_and_lifted(
    k8s_api: K8sApi, source: KubernetesSource
) -> None:
    ours = {"key": HOLD_TAINT_KEY, "value": GPU_NODE, "effect": "NoSchedule"}
    gpu_node(k8s_api)
    waiting = owner(k8s_api)
    uid = (pod_at(k8s_api, waiting) or {})["metadata"]["uid"]
    old = [{"job": "team-b/t-1", "for": waiting, "for_uid": uid, "since": time.time()}]

    def held(n: dict[str, Any]) -> None:
        n["spec"]["taints"].append(ours)
        n["metadata"]["annotations"] = {HOLDS_ANNOTATION: json.dumps(old)}

    k8s_api.mutate("nodes", GPU_NODE, held)
    (found,) = source.held_off()
    assert (found.job_id, found.for_job, found.since) == ("team-b/t-1", waiting, old[0]["since"])
    source.bind(waiting, [GPU_NODE])
    assert len(annotated(k8s_api)) == 2, "the old hold is kept beside the binding"
    bind(k8s_api, "owner", "team-a", GPU_NODE)
    source.apply_placement(Placement())
    assert hold_taints(k8s_api) == [] and holds_annotation(k8s_api) is None


def test_a_gang_is_bound_to_all_its_nodes_and_each_pod_tolerates_them(
    k8s_api: K8sApi, jobs: JobController, source: KubernetesSource
) -> None:
    nodes = ["gpu-a", "gpu-b"]
    for name in nodes:
        k8s_api.put("nodes", node(name, 4))
    k8s_api.put("nodes", node("gpu-z", 4))
    movers = [job_pod(k8s_api, jobs, f"mover-{n}", n, priority=1000) for n in nodes]
    group = {POD_GROUP: "train"}
    for index in range(2):
        k8s_api.put("pods", pod(f"train-{index}", "team-a", gpus=4, labels=group))
    schedule(k8s_api)
    gang = "team-a/train"

    source.bind(gang, nodes)
    for name in nodes:
        (record,) = annotated(k8s_api, name)
        assert (record["for"], record["gang"], record["bound"]) == (gang, True, True)
        assert hold_taints(k8s_api, name)
    for index in range(2):
        assert {t["value"] for t in tolerations(k8s_api, f"team-a/train-{index}")} == set(nodes)

    for mover, name in zip(movers, nodes, strict=True):
        source.move_off(mover, name, gang)
    assert {(h.job_id, h.node, h.for_job) for h in source.held_off()} == {
        (m, n, gang) for m, n in zip(movers, nodes, strict=True)
    }
    # the movers' replacements, tried first, go elsewhere (one fits): the gang lands on its nodes
    schedule(k8s_api)
    assert {bound_to(k8s_api, f"team-a/train-{i}") for i in range(2)} == set(nodes)
    source.apply_placement(Placement())
    for name in nodes:
        assert hold_taints(k8s_api, name) == [] and holds_annotation(k8s_api, name) is None


def test_a_gang_pod_made_after_the_bind_gets_the_tolerations(
    k8s_api: K8sApi, jobs: JobController, source: KubernetesSource
) -> None:
    gpu_node(k8s_api)
    k8s_api.put("nodes", node("gpu-b", 4))
    template = {"metadata": {}, "spec": pod("t", "team-a", gpus=4)["spec"]}
    jobs.add_job("indexed", template, namespace="team-a", parallelism=2, indexed=True)
    gang = "team-a/job/indexed"
    source.bind(gang, [GPU_NODE, "gpu-b"])
    members = [p for p in k8s_api.items("pods") if p["metadata"]["namespace"] == "team-a"]
    assert len(members) == 2
    for member in members:
        assert len(member["spec"]["tolerations"]) == 2
    # one pod is deleted before it started; its Job makes it again, without the tolerations
    k8s_api.remove("pods", members[0]["metadata"]["name"], "team-a")
    (again,) = jobs.recreated
    assert not tolerations(k8s_api, again)
    source.apply_placement(Placement())
    assert {t["value"] for t in tolerations(k8s_api, again)} == {GPU_NODE, "gpu-b"}
    assert hold_taints(k8s_api), "the gang still waits"
    for member in k8s_api.items("pods"):
        bind(k8s_api, member["metadata"]["name"], "team-a", GPU_NODE)
    source.apply_placement(Placement())
    assert hold_taints(k8s_api) == [] and hold_taints(k8s_api, "gpu-b") == []


def test_a_gang_that_waits_no_more_is_not_bound(k8s_api: K8sApi, source: KubernetesSource) -> None:
    gpu_node(k8s_api)
    k8s_api.put("pods", pod("train-0", "team-a", gpus=4, labels={POD_GROUP: "train"}))
    bind(k8s_api, "train-0", "team-a", "gpu-a")
    with pytest.raises(SourceError, match="waits no more"):
        source.bind("team-a/train", [GPU_NODE])
    with pytest.raises(SourceError, match="is gone"):
        source.bind("team-a/nothing", [GPU_NODE])
    with pytest.raises(SourceError, match="not a pod"):
        source.bind("team-a/x y", [GPU_NODE])
    with pytest.raises(SourceError, match="no node"):
        source.bind("team-a/train", [])
    assert k8s_api.served("PATCH") == [] and hold_taints(k8s_api) == []


# -- what is never moved -----------------------------------------------------------------------


def test_a_bare_pod_is_never_moved(k8s_api: K8sApi, source: KubernetesSource) -> None:
    gpu_node(k8s_api)
    k8s_api.put("pods", pod("lone", "team-b", gpus=4))
    bind(k8s_api, "lone", "team-b", GPU_NODE)
    waiting = owner(k8s_api)
    with pytest.raises(SourceError, match="bare pod"):
        source.move_off("team-b/lone", GPU_NODE, waiting)
    assert pod_at(k8s_api, "team-b/lone") is not None
    assert k8s_api.served("DELETE") == []
    assert hold_taints(k8s_api) == [] and holds_annotation(k8s_api) is None
    assert not (pod_at(k8s_api, waiting) or {})["spec"].get("tolerations")
    assert source.held_off() == []


def test_a_daemonsets_pod_a_pod_elsewhere_or_a_started_owner_is_not_moved(
    k8s_api: K8sApi, jobs: JobController, source: KubernetesSource
) -> None:
    gpu_node(k8s_api)
    k8s_api.put("nodes", node("gpu-z", 4))
    k8s_api.put("pods", pod("plugin", "kube-system", gpus=1, owner=daemonset_owner()))
    bind(k8s_api, "plugin", "kube-system", GPU_NODE)
    waiting = owner(k8s_api)
    with pytest.raises(SourceError, match="DaemonSet"):
        source.move_off("kube-system/plugin", GPU_NODE, waiting)
    moved = borrower(k8s_api, jobs, where="gpu-z")
    with pytest.raises(SourceError, match="runs on gpu-z"):
        source.move_off(moved, GPU_NODE, waiting)
    with pytest.raises(SourceError, match="is gone"):
        source.move_off(moved, "gpu-z", "team-a/nobody")
    bind(k8s_api, "owner", "team-a", GPU_NODE)
    with pytest.raises(SourceError, match="waits no more"):
        source.move_off(moved, "gpu-z", waiting)
    assert k8s_api.served("DELETE") == []
    assert hold_taints(k8s_api) == [] and hold_taints(k8s_api, "gpu-z") == []


# -- bad input ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "annotation",
    ['[{"job": "team-b/x"', '{"job": "x"}', '[{"job": "team-b/x", "for": 3}]', None],
)
def test_a_hold_annotation_edited_by_hand_is_named_and_its_taint_left_alone(
    k8s_api: K8sApi,
    jobs: JobController,
    source: KubernetesSource,
    caplog: pytest.LogCaptureFixture,
    annotation: str | None,
) -> None:
    ours = {"key": HOLD_TAINT_KEY, "value": GPU_NODE, "effect": "NoSchedule"}
    gpu_node(k8s_api)
    k8s_api.mutate("nodes", GPU_NODE, lambda n: n["spec"]["taints"].append(ours))
    if annotation is not None:
        k8s_api.mutate(
            "nodes",
            GPU_NODE,
            lambda n: (
                n["metadata"].setdefault("annotations", {}).update({HOLDS_ANNOTATION: annotation})
            ),
        )
    caplog.set_level(logging.WARNING)
    assert source.held_off() == []
    (line,) = source.problems
    assert GPU_NODE in line and (HOLDS_ANNOTATION in line if annotation else HOLD_TAINT_KEY in line)
    assert source.reading_problems()["unreadable-hold"] == 1
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "Traceback" not in warnings[0] and GPU_NODE in warnings[0]
    source.held_off()
    source.apply_placement(Placement())
    assert len([r for r in caplog.records if r.levelno == logging.WARNING]) == 1, "said once"
    assert hold_taints(k8s_api) == [ours], "a taint nobody can account for is never lifted"
    assert holds_annotation(k8s_api) == annotation
    # and no move is made onto it: its holds cannot be added to
    moved = borrower(k8s_api, jobs)
    with pytest.raises(SourceError, match=GPU_NODE):
        source.move_off(moved, GPU_NODE, owner(k8s_api))
    assert pod_at(k8s_api, moved) is not None


def test_the_emulator_refuses_to_take_a_toleration_away(
    k8s_api: K8sApi, source: KubernetesSource
) -> None:
    """As the real API server does: ``spec.tolerations`` of a pod take additions only."""
    k8s_api.put("pods", pod("p", "team-a", gpus=1, tolerations=[HOLD_TOLERATION]))
    assert source.api.change_pod(
        "team-a",
        "p",
        {"spec": {"tolerations": [HOLD_TOLERATION, {**HOLD_TOLERATION, "value": "b"}]}},
    )
    with pytest.raises(SourceError, match=r"HTTP 422.*`spec.tolerations`"):
        source.api.change_pod("team-a", "p", {"spec": {"tolerations": []}})


# -- end to end: the real controller reclaims a team's guarantee ----------------------------


FLEET = "k8s-moves"
TICK_S = 60.0
RECLAIM_WITHIN_S = 600.0
CHECKPOINTS = {
    "gpu-autoscaler.io/checkpoint_interval": "600",
    "gpu-autoscaler.io/checkpoint_duration": "30",
    "gpu-autoscaler.io/checkpoint_signal": "USR1",
}


@dataclass
class World:
    """The controller, the simulated cloud and the cluster (one on-prem 4-GPU node), moved a
    tick at a time on a manual clock."""

    api: K8sApi
    source: KubernetesSource
    provider: LiveSimProvider
    controller: Controller
    clock: ManualClock
    jobs: JobController
    reports: list[TickReport] = field(default_factory=list)

    def tick(self) -> TickReport:
        self.clock.advance(TICK_S)
        schedule(self.api)
        report = self.controller.tick()
        self.reports.append(report)
        return report


TEAMS = {
    "teams": {"alpha": {"guaranteed_gpus": 4}, "beta": {"guaranteed_gpus": 0}},
    "onprem_gpus": 4,
    "reclaim_within_s": RECLAIM_WITHIN_S,
}
CLASSES = {
    "priority_classes": {
        "batch": {"order": 0},
        "urgent": {"order": 10, "preempts": True},
    },
    "reclaim_within_s": RECLAIM_WITHIN_S,
}


@pytest.fixture(params=["teams"])
def world(
    request: pytest.FixtureRequest, k8s_api: K8sApi, monkeypatch: pytest.MonkeyPatch
) -> Iterator[World]:
    """With ``teams`` (the default): alpha guaranteed the node, beta none; with ``classes``:
    no guarantees, class ``urgent`` preempts class ``batch``."""
    clock = ManualClock(1_700_000_000.0)
    common = {
        "provider": "sim",
        "region": "us-east-1",
        "zone": "us-east-1a",
        "instance_type": "g5.12xlarge",
        "gpus_per_instance": 4,
        "gpu_model": "A10G",
        "boot_seconds": 60,
    }
    config = ControllerConfig.model_validate(
        {
            "fleet_id": FLEET,
            "tick_seconds": TICK_S,
            "policy": {"name": "karpenter"},
            "pools": [{"name": "a10g-od", "market": "on-demand", **common}],
            "teams": TEAMS if request.param == "teams" else CLASSES,
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
        incarnation=FLEET,
        retry=RetryPolicy(attempts=2, sleep=lambda _s: None),
    ).controller
    k8s_api.put("nodes", node(GPU_NODE, 4, labels={"nvidia.com/gpu.product": "A10G"}))
    made = World(k8s_api, source, provider, controller, clock, JobController(k8s_api))
    yield made
    controller.close()
    provider.close()
    source.close()


def take_back(world: World, borrowed: dict[str, Any], wanted: dict[str, Any]) -> None:
    """``borrowed``'s Job fills the node; ``wanted`` arrives and must get it back through the
    move path within the bound, without a cloud node bought for it."""
    api = world.api
    template = {"metadata": dict(borrowed["metadata"]), "spec": borrowed["spec"]}
    namespace = borrowed["metadata"]["namespace"]
    world.jobs.add_job("borrow", template, namespace=namespace)
    world.tick()
    (first,) = api.items("pods")
    moved = f"{namespace}/{first['metadata']['name']}"
    assert bound_to(api, moved) == GPU_NODE, "the node is lent while nobody else wants it"
    world.tick()

    api.put("pods", wanted)
    owner_id = f"{wanted['metadata']['namespace']}/{wanted['metadata']['name']}"
    arrived = world.clock.now()
    asked: list[str] = []
    held_while_asked: list[bool] = []
    for _ in range(int(RECLAIM_WITHIN_S / TICK_S) + 10):  # the bound, and then some
        world.tick()
        found = pod_at(api, moved)
        if found is not None:
            value = (
                found["metadata"]
                .get("annotations", {})
                .get("gpu-autoscaler.io/checkpoint-requested")
            )
            if value:
                asked.append(value)
                # bound when the moves were decided: held while the pod still checkpoints
                held_while_asked.append(hold_taints(api) != [] and owner_id in str(annotated(api)))
        if bound_to(api, owner_id) is not None:
            break
    took = world.clock.now() - arrived
    assert bound_to(api, owner_id) == GPU_NODE, world.reports[-1]
    assert took <= RECLAIM_WITHIN_S, f"taken back after {took:.0f} s"
    assert asked, "the borrowing pod was asked to checkpoint first"
    assert all(held_while_asked), "the node was held for the owner before the pod left"
    assert pod_at(api, moved) is None, "and then moved"
    (again,) = world.jobs.recreated
    assert bound_to(api, again) != GPU_NODE
    evacuated = [a for r in world.reports for a in r.actions if a.kind == "evacuate"]
    assert [(a.job_id, a.outcome) for a in evacuated] == [
        (moved, "checkpoint-asked"),
        (moved, "moved-off"),
    ], evacuated
    assert owner_id in evacuated[-1].detail, evacuated[-1]
    # the owner's room was made on-prem, not bought: nothing was launched before it was bound
    # except, after the move, for the moved pod itself (one 4-GPU node)
    launched = [a for r in world.reports for a in r.actions if a.kind == "launch"]
    assert sum(a.done for a in launched) <= 1, launched

    # the hold ends once the owner is bound
    world.tick()
    assert hold_taints(api) == [] and holds_annotation(api) is None
    assert world.source.held_off() == []


def test_the_controller_reclaims_a_guarantee_from_a_borrowing_pod(world: World) -> None:
    # priority: the scheduler tries the moved pod's replacement before the owner, so only the
    # hold keeps it off the node it left
    take_back(
        world,
        pod("t", "beta", gpus=4, annotations=CHECKPOINTS, priority=1000),
        pod("owner", "alpha", gpus=4),
    )


@pytest.mark.parametrize("world", ["classes"], indirect=True)
def test_the_controller_preempts_a_lower_class_pod(world: World) -> None:
    take_back(
        world,
        pod("t", "beta", gpus=4, annotations=CHECKPOINTS, priority_class="batch"),
        pod("urgent", "alpha", gpus=4, priority_class="urgent", priority=1000),
    )


# -- the node patch, as a property -------------------------------------------------------------

_names = st.text(alphabet="abcdefghij-", min_size=1, max_size=8)
_times = st.floats(min_value=0, max_value=2e9, allow_nan=False)
_moved = st.builds(Moved, job=_names.map(lambda n: f"team-b/{n}"), since=_times)
# a hold as move_off writes it (one pod moved, no bind: the form older controllers read too),
# or as bind and the moves after it do (any pods, or none yet)
_plain = st.builds(
    lambda m, for_job, uid: Hold(for_job, uid, m.since, (m,)),
    _moved,
    _names.map(lambda n: f"team-a/{n}"),
    _names,
)
_bound = st.builds(
    Hold,
    for_job=_names.map(lambda n: f"team-a/{n}"),
    for_uid=_names,
    since=_times,
    moved=st.lists(_moved, max_size=3, unique_by=lambda m: m.job).map(tuple),
    bound=st.just(True),
    gang=st.booleans(),
)
_holds = st.lists(st.one_of(_plain, _bound), max_size=4)
_other_taints = st.lists(
    st.builds(
        dict,
        key=_names.map(lambda n: f"example.com/{n}"),
        value=_names,
        effect=st.sampled_from(["NoSchedule", "PreferNoSchedule", "NoExecute"]),
    ),
    max_size=3,
    unique_by=lambda t: (t["key"], t["effect"]),
)


@settings(max_examples=200, deadline=None)
@given(others=_other_taints, before=_holds, after=_holds)
def test_a_node_patch_keeps_our_taint_exactly_while_holds_stand(
    others: list[dict[str, str]], before: list[Hold], after: list[Hold]
) -> None:
    ours = {"key": HOLD_TAINT_KEY, "value": GPU_NODE, "effect": "NoSchedule"}
    annotations = {HOLDS_ANNOTATION: write_holds(before)} if before else {}
    obj: dict[str, Any] = {
        "metadata": {"name": GPU_NODE, "annotations": annotations},
        "spec": {"taints": [*others, *([ours] if before else [])]},
    }
    patch = node_patch(obj, bool(before), before, after, GPU_NODE)
    patched = merge_patch(obj, patch or {})
    taints = patched["spec"]["taints"]
    assert [t for t in taints if t["key"] != HOLD_TAINT_KEY] == others, "others kept, in order"
    assert [t for t in taints if t["key"] == HOLD_TAINT_KEY] == ([ours] if after else [])
    written = patched["metadata"]["annotations"].get(HOLDS_ANNOTATION)
    assert (read_holds(written) if written is not None else []) == after
    assert (patch is None) == (before == after)
