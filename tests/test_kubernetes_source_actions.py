"""The ``kubernetes`` source's actions, through the official client against the API emulator:
cordon and drain through the Eviction API (a PodDisruptionBudget's 429 kept and asked again),
the end of a drain past its timeout, the checkpoint request, requeue through a Job's
controller, running jobs by instance id, and placement's taint and labels."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from k8s_api_emulator import K8sApi
from k8s_cluster import (
    JobController,
    bind,
    daemonset_owner,
    finish,
    node,
    pdb,
    pod,
    spot_taint,
)
from k8s_source_support import make_source

from autoscaler.model import Pool
from autoscaler.model.errors import SourceError
from autoscaler.sources.kubernetes import KubernetesSource

OURS = {"gpu-autoscaler.io/managed": "true", "gpu-autoscaler.io/market": "spot"}
CHECKPOINTS = {
    "gpu-autoscaler.io/checkpoint_interval": "600",
    "gpu-autoscaler.io/checkpoint_duration": "30",
}


@pytest.fixture
def source(k8s_api: K8sApi, monkeypatch: pytest.MonkeyPatch) -> Iterator[KubernetesSource]:
    made = make_source(k8s_api, monkeypatch)
    yield made
    made.close()


@pytest.fixture
def jobs(k8s_api: K8sApi) -> JobController:
    return JobController(k8s_api)


def cloud_node(
    k8s_api: K8sApi, name: str = "ip-10-0-0-1", instance: str = "i-1", **extra: Any
) -> None:
    k8s_api.put(
        "nodes",
        node(
            name,
            8,
            labels=OURS,
            provider_id=f"aws:///us-east-1a/{instance}",
            taints=[spot_taint()],
            **extra,
        ),
    )


def on(k8s_api: K8sApi, made: dict[str, Any], where: str) -> str:
    """Store a pod and bind it to ``where``; returns its name."""
    stored = k8s_api.put("pods", made)
    name = stored["metadata"]["name"]
    bind(k8s_api, name, stored["metadata"]["namespace"], where)
    return name


def names(k8s_api: K8sApi) -> list[str]:
    return sorted(p["metadata"]["name"] for p in k8s_api.items("pods"))


def job_pod(k8s_api: K8sApi, jobs: JobController, where: str, **extra: Any) -> str:
    """A Job's GPU pod, running on ``where``."""
    made = pod("t", gpus=4, **extra)
    template = {"metadata": {"labels": made["metadata"]["labels"]}, "spec": made["spec"]}
    jobs.add_job("train", template, namespace="ml")
    (made,) = [p for p in k8s_api.items("pods") if p["metadata"]["name"].startswith("train-")]
    bind(k8s_api, made["metadata"]["name"], "ml", where)
    return str(made["metadata"]["name"])


# -- drain -------------------------------------------------------------------------------------


def test_drain_cordons_evicts_what_holds_no_gpu_and_counts_what_stays(
    k8s_api: K8sApi, source: KubernetesSource, jobs: JobController
) -> None:
    cloud_node(k8s_api)
    train = job_pod(k8s_api, jobs, "ip-10-0-0-1")
    on(k8s_api, pod("free", "web"), "ip-10-0-0-1")
    on(k8s_api, pod("guarded", "web", labels={"app": "guarded"}), "ip-10-0-0-1")
    on(k8s_api, pod("agent", "kube-system", owner=daemonset_owner()), "ip-10-0-0-1")
    k8s_api.put("poddisruptionbudgets", pdb("guarded", "web", {"app": "guarded"}, min_available=1))

    assert source.drain("i-1", "scale-down") == 3  # train, guarded, and free until it is gone
    stored = k8s_api.get("nodes", "ip-10-0-0-1")
    assert stored is not None
    assert stored["spec"]["unschedulable"] is True
    assert stored["metadata"]["annotations"]["gpu-autoscaler.io/drain-reason"] == "scale-down"
    assert names(k8s_api) == ["agent", "guarded", train]
    evictions = [r for r in k8s_api.served("POST") if r.path.endswith("/eviction")]
    assert [r.status for r in evictions] == [201, 429]

    patches = len(k8s_api.served("PATCH"))
    assert source.drain("i-1", "scale-down") == 2  # asked the budget again: still no
    assert len(k8s_api.served("PATCH")) == patches, "a cordoned node is not patched again"
    k8s_api.remove("poddisruptionbudgets", "guarded", "web")
    assert source.drain("i-1", "scale-down") == 2
    assert names(k8s_api) == ["agent", train]
    finish(k8s_api, train, "ml")
    assert source.drain("i-1", "scale-down") == 0


def test_a_drain_past_its_timeout_evicts_respecting_budgets(
    k8s_api: K8sApi, source: KubernetesSource, jobs: JobController
) -> None:
    cloud_node(k8s_api)
    train = job_pod(k8s_api, jobs, "ip-10-0-0-1", labels={"app": "train"})
    k8s_api.put("poddisruptionbudgets", pdb("train", "ml", {"app": "train"}, max_unavailable=0))
    with pytest.raises(SourceError) as caught:
        source.evict("i-1", "drain timed out")
    message = str(caught.value)
    assert "evict i-1 (drain timed out): moved 0, 1 refused" in message
    assert (
        f"ml/{train}: Cannot evict pod as it would violate the pod's disruption budget" in message
    )
    assert "The disruption budget train needs 1 healthy pods and has 1 currently" in message
    assert train in names(k8s_api)
    k8s_api.remove("poddisruptionbudgets", "train", "ml")
    assert source.evict("i-1", "drain timed out") == 1
    assert train not in names(k8s_api)
    assert jobs.recreated, "the Job controller made the pod again, to be placed elsewhere"


def test_delete_overrides_the_budget_and_waits_for_terminating_pods(
    k8s_api: K8sApi, monkeypatch: pytest.MonkeyPatch, jobs: JobController
) -> None:
    deleting = make_source(k8s_api, monkeypatch, drain_timeout_action="delete")
    cloud_node(k8s_api)
    train = job_pod(k8s_api, jobs, "ip-10-0-0-1", labels={"app": "train"})
    k8s_api.put("poddisruptionbudgets", pdb("train", "ml", {"app": "train"}, min_available=1))
    k8s_api.graceful_deletion = True
    with pytest.raises(SourceError, match=r"moved 1, 0 refused, 0 unreadable, 1 still terminating"):
        deleting.evict("i-1", "drain timed out")
    stored = k8s_api.get("pods", train, "ml")
    assert stored is not None and stored["metadata"]["deletionTimestamp"]
    with pytest.raises(SourceError, match=r"moved 0, 0 refused, 0 unreadable, 1 still terminating"):
        deleting.evict("i-1", "drain timed out")
    assert k8s_api.finish_terminating() == 1
    assert deleting.evict("i-1", "drain timed out") == 0
    deleting.close()


def test_draining_a_node_it_does_not_know_or_a_failing_server_is_one_line(
    k8s_api: K8sApi, source: KubernetesSource
) -> None:
    cloud_node(k8s_api)
    with pytest.raises(SourceError, match="no node is instance or node i-404"):
        source.drain("i-404", "scale-down")
    with pytest.raises(SourceError, match="is not a node name or instance id"):
        source.drain("i-1,spec.nodeName=x", "scale-down")
    k8s_api.fail(503, path="/api/v1/nodes/")
    with pytest.raises(SourceError, match=r"patch node ip-10-0-0-1: HTTP 503"):
        source.drain("i-1", "scale-down")
    k8s_api.heal()


# -- checkpoints, requeue, running jobs ------------------------------------------------------------


def test_running_jobs_are_gpu_pods_by_instance_id_with_their_checkpoints(
    k8s_api: K8sApi, source: KubernetesSource
) -> None:
    cloud_node(k8s_api)
    k8s_api.put("nodes", node("onprem-1", 8))
    gang = {"scheduling.x-k8s.io/pod-group": "ring"}
    on(k8s_api, pod("ckpt", "ml", gpus=2, annotations=CHECKPOINTS), "ip-10-0-0-1")
    on(k8s_api, pod("r0", "ml", gpus=4, labels=gang), "ip-10-0-0-1")
    on(k8s_api, pod("r1", "ml", gpus=4, labels=gang), "onprem-1")
    on(k8s_api, pod("cpu", "ml"), "ip-10-0-0-1")
    on(k8s_api, pod("agent", "kube-system", gpus=1, owner=daemonset_owner()), "ip-10-0-0-1")
    by_node = source.running_jobs_by_node()
    assert sorted(by_node) == ["i-1", "onprem-1"]
    jobs = {j.id: j for j in by_node["i-1"]}
    assert sorted(jobs) == ["ml/ckpt", "ml/r0"]
    ckpt = jobs["ml/ckpt"]
    assert (ckpt.node, ckpt.gpus, ckpt.checkpoint_interval_s, ckpt.checkpoint_duration_s) == (
        "i-1",
        2,
        600.0,
        30.0,
    )
    assert ckpt.checkpoint_signal == "USR1" and ckpt.started_at > 0
    assert jobs["ml/r0"].nodes == 2 and jobs["ml/r0"].checkpoint_signal is None
    assert [j.id for j in source.running_jobs("i-1")] == [j.id for j in by_node["i-1"]]


def test_signal_writes_the_checkpoint_request_annotation(
    k8s_api: K8sApi, source: KubernetesSource
) -> None:
    k8s_api.put("pods", pod("train", "ml", gpus=1, annotations=CHECKPOINTS))
    before = time.time()
    source.signal("ml/train", "USR1")
    stored = k8s_api.get("pods", "train", "ml")
    assert stored is not None
    annotations = stored["metadata"]["annotations"]
    asked = int(annotations["gpu-autoscaler.io/checkpoint-requested"])
    assert int(before) <= asked <= time.time() + 1
    assert annotations["gpu-autoscaler.io/checkpoint_interval"] == "600", "the rest is kept"
    source.signal("ml/gone", "USR1")  # a pod gone since is not an error
    with pytest.raises(SourceError, match="is not a pod"):
        source.signal("no-namespace", "USR1")


def test_requeue_deletes_a_jobs_pod_and_leaves_a_bare_pod(
    k8s_api: K8sApi, source: KubernetesSource, jobs: JobController
) -> None:
    k8s_api.put("nodes", node("n", 8))
    train = job_pod(k8s_api, jobs, "n")
    source.requeue(f"ml/{train}")
    assert k8s_api.get("pods", train, "ml") is None
    (again,) = jobs.recreated
    recreated = k8s_api.get("pods", again.split("/")[1], "ml")
    assert recreated is not None and recreated["status"]["phase"] == "Pending"
    deletes = k8s_api.served("DELETE")
    assert len(deletes) == 1

    on(k8s_api, pod("bare", "ml", gpus=1), "n")
    with pytest.raises(SourceError, match="not deleted, it is a bare pod"):
        source.requeue("ml/bare")
    on(k8s_api, pod("agent", "ml", gpus=1, owner=daemonset_owner()), "n")
    with pytest.raises(SourceError, match="not deleted, it is a DaemonSet's pod"):
        source.requeue("ml/agent")
    assert {"bare", "agent"} <= set(names(k8s_api))
    source.requeue("ml/long-gone")
    assert len(k8s_api.served("DELETE")) == 1


# -- placement and the join ------------------------------------------------------------------------


def pool(name: str, market: str, model: str = "A100") -> Pool:
    return Pool.model_validate(
        {
            "name": name,
            "provider": "aws",
            "region": "us-east-1",
            "instance_type": "p4d.24xlarge",
            "gpus_per_instance": 8,
            "gpu_model": model,
            "market": market,
        }
    )


def test_placement_keeps_the_spot_taint_and_pool_labels_on_our_nodes(
    k8s_api: K8sApi, source: KubernetesSource
) -> None:
    from autoscaler.model import Placement

    assert source.join_user_data(pool("a100-spot", "spot")) is None  # no join settings
    source.join_user_data(pool("a100-od", "on-demand"))
    spot_labels = {
        **OURS,
        "gpu-autoscaler.io/pool": "a100-spot",
        "gpu-autoscaler.io/gpu-model": "H100",
    }
    k8s_api.put("nodes", node("lost-taint", 8, labels=spot_labels))
    od_labels = {
        "gpu-autoscaler.io/managed": "true",
        "gpu-autoscaler.io/market": "on-demand",
        "gpu-autoscaler.io/pool": "a100-od",
        "gpu-autoscaler.io/gpu-model": "A100",
    }
    gpu_taint = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
    k8s_api.put(
        "nodes", node("wrongly-tainted", 8, labels=od_labels, taints=[spot_taint(), gpu_taint])
    )
    k8s_api.put("nodes", node("fine", 8, labels=od_labels))
    k8s_api.put("nodes", node("onprem", 8, labels={"gpu-autoscaler.io/market": "spot"}))

    source.apply_placement(Placement())
    lost = k8s_api.get("nodes", "lost-taint")
    wrong = k8s_api.get("nodes", "wrongly-tainted")
    assert lost is not None and wrong is not None
    assert lost["spec"]["taints"] == [
        {"key": "gpu-autoscaler.io/spot", "value": "true", "effect": "NoSchedule"}
    ]
    assert lost["metadata"]["labels"]["gpu-autoscaler.io/gpu-model"] == "A100", "the pool's model"
    assert wrong["spec"]["taints"] == [gpu_taint]
    patched = sorted(r.path.rsplit("/", 1)[1] for r in k8s_api.served("PATCH"))
    assert patched == ["lost-taint", "wrongly-tainted"], "only nodes that differ are patched"
    source.apply_placement(Placement())
    assert len(k8s_api.served("PATCH")) == 2


def test_placement_does_not_overwrite_a_change_made_since_it_read(
    k8s_api: K8sApi, source: KubernetesSource
) -> None:
    from autoscaler.model import Placement

    k8s_api.put("nodes", node("raced", 8, labels=OURS))
    not_ready = {"key": "node.kubernetes.io/not-ready", "effect": "NoExecute"}
    k8s_api.before_next(
        "PATCH",
        lambda: k8s_api.mutate("nodes", "raced", lambda n: n["spec"].update(taints=[not_ready])),
    )
    with pytest.raises(SourceError, match=r"patch node raced: HTTP 409"):
        source.apply_placement(Placement())
    source.apply_placement(Placement())
    stored = k8s_api.get("nodes", "raced")
    assert stored is not None
    assert stored["spec"]["taints"] == [
        not_ready,
        {"key": "gpu-autoscaler.io/spot", "value": "true", "effect": "NoSchedule"},
    ]
