"""The API emulator the ``kubernetes`` source is tested against, through the official client:
lists with selectors and resourceVersion, watch with its 410, patches, eviction with a
PodDisruptionBudget, deletion, and the tiny scheduler and Job controller of ``k8s_cluster``.
The source's own tests trust these shapes; these tests hold the emulator to the real server's.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from k8s_api_emulator import K8sApi
from k8s_cluster import (
    GPU,
    JobController,
    bind,
    daemonset_owner,
    node,
    pdb,
    pod,
    schedule,
    spot_taint,
    spot_toleration,
)
from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException
from waits import bound


@pytest.fixture
def core(k8s_api: K8sApi) -> Iterator[client.CoreV1Api]:
    config = client.Configuration(host=k8s_api.url)
    config.api_key["BearerToken"] = f"Bearer {k8s_api.token}"
    config.retries = 0
    api_client = client.ApiClient(config)
    yield client.CoreV1Api(api_client)
    api_client.close()


def status_of(exc: ApiException) -> dict[str, Any]:
    body = exc.body if exc.body else exc.data
    found: dict[str, Any] = json.loads(body)
    return found


def test_lists_filter_by_labels_and_fields_and_carry_the_resource_version(
    k8s_api: K8sApi, core: client.CoreV1Api
) -> None:
    k8s_api.put("nodes", node("gpu-1", 8))
    k8s_api.put("pods", pod("a", gpus=1, labels={"team": "x"}))
    k8s_api.put("pods", pod("b", "other", gpus=2, labels={"team": "y"}))
    bind(k8s_api, "a", "default", "gpu-1")

    every = core.list_pod_for_all_namespaces()
    assert [p.metadata.name for p in every.items] == ["a", "b"]
    assert every.metadata.resource_version == str(k8s_api.revision)
    pending = core.list_pod_for_all_namespaces(field_selector="status.phase=Pending")
    assert [p.metadata.name for p in pending.items] == ["b"]
    running = core.list_pod_for_all_namespaces(
        field_selector="spec.nodeName=gpu-1,status.phase!=Succeeded"
    )
    assert [p.metadata.name for p in running.items] == ["a"]
    assert [p.metadata.name for p in core.list_namespaced_pod("other").items] == ["b"]
    for selector, names in (
        ("team=x", ["a"]),
        ("team!=x", ["b"]),
        ("team in (x, y)", ["a", "b"]),
        ("team notin (x)", ["b"]),
        ("team", ["a", "b"]),
        ("!team", []),
    ):
        found = core.list_pod_for_all_namespaces(label_selector=selector)
        assert [p.metadata.name for p in found.items] == names, selector
    with pytest.raises(ApiException) as caught:
        core.list_pod_for_all_namespaces(field_selector="spec.madeUp=1")
    assert caught.value.status == 400
    assert status_of(caught.value)["message"] == "field label not supported: spec.madeUp"
    nodes = core.list_node(field_selector="spec.unschedulable=false")
    assert [n.metadata.name for n in nodes.items] == ["gpu-1"]


def test_a_watch_streams_changes_after_its_resource_version(
    k8s_api: K8sApi, core: client.CoreV1Api
) -> None:
    k8s_api.put("pods", pod("a", gpus=1))
    start = core.list_pod_for_all_namespaces(field_selector="status.phase=Pending")
    seen: list[tuple[str, str]] = []
    done = threading.Event()

    def follow() -> None:
        for event in watch.Watch().stream(
            core.list_pod_for_all_namespaces,
            field_selector="status.phase=Pending",
            resource_version=start.metadata.resource_version,
            timeout_seconds=int(bound(20)),
        ):
            seen.append((event["type"], event["object"].metadata.name))
            if len(seen) == 3:
                break
        done.set()

    thread = threading.Thread(target=follow, daemon=True)
    thread.start()
    k8s_api.put("pods", pod("b", gpus=2))
    k8s_api.put("nodes", node("gpu-1", 8))
    bind(k8s_api, "a", "default", "gpu-1")  # no longer Pending: gone from this watch
    k8s_api.mutate(
        "pods", "b", lambda p: p["metadata"].setdefault("labels", {}).update(x="1"), "default"
    )
    assert done.wait(bound(30))
    assert seen == [("ADDED", "b"), ("DELETED", "a"), ("MODIFIED", "b")]


def test_a_watch_from_a_compacted_version_is_410_gone(
    k8s_api: K8sApi, core: client.CoreV1Api
) -> None:
    k8s_api.put("pods", pod("a"))
    old = core.list_pod_for_all_namespaces().metadata.resource_version
    k8s_api.put("pods", pod("b"))
    k8s_api.compact()
    with pytest.raises(ApiException) as caught:
        for _ in watch.Watch().stream(
            core.list_pod_for_all_namespaces, resource_version=old, timeout_seconds=5
        ):
            pass
    assert caught.value.status == 410
    assert "too old resource version" in str(caught.value.reason)


def test_patches_merge_labels_and_replace_taints_and_invalid_values_are_422(
    k8s_api: K8sApi, core: client.CoreV1Api
) -> None:
    k8s_api.put("nodes", node("n", 4, labels={"keep": "1", "drop": "2"}, taints=[spot_taint()]))
    before = k8s_api.get("nodes", "n")
    assert before is not None
    patched = core.patch_node(
        "n",
        {
            "metadata": {"labels": {"drop": None, "new": "3"}},
            "spec": {"unschedulable": True, "taints": []},
        },
    )
    assert patched.spec.unschedulable is True
    stored = k8s_api.get("nodes", "n")
    assert stored is not None
    assert stored["metadata"]["labels"] == {"kubernetes.io/hostname": "n", "keep": "1", "new": "3"}
    assert stored["spec"]["taints"] == []
    assert int(stored["metadata"]["resourceVersion"]) > int(before["metadata"]["resourceVersion"])
    with pytest.raises(ApiException) as caught:
        core.patch_node("n", {"metadata": {"labels": {"bad": "no spaces allowed"}}})
    assert caught.value.status == 422
    assert status_of(caught.value)["reason"] == "Invalid"
    with pytest.raises(ApiException) as missing:
        core.patch_node("nope", {"spec": {"unschedulable": True}})
    body = status_of(missing.value)
    assert (missing.value.status, body["reason"], body["details"]["name"]) == (
        404,
        "NotFound",
        "nope",
    )
    assert body["message"] == 'nodes "nope" not found'


def test_eviction_respects_a_disruption_budget(k8s_api: K8sApi, core: client.CoreV1Api) -> None:
    k8s_api.put("nodes", node("n", 8))
    for name in ("a", "b"):
        k8s_api.put("pods", pod(name, "ml", gpus=1, labels={"app": "serve"}))
        bind(k8s_api, name, "ml", "n")
    k8s_api.put("poddisruptionbudgets", pdb("serve", "ml", {"app": "serve"}, min_available=1))
    body = client.V1Eviction(metadata=client.V1ObjectMeta(name="a", namespace="ml"))
    core.create_namespaced_pod_eviction("a", "ml", body)
    assert k8s_api.get("pods", "a", "ml") is None
    with pytest.raises(ApiException) as caught:
        core.create_namespaced_pod_eviction(
            "b", "ml", client.V1Eviction(metadata=client.V1ObjectMeta(name="b", namespace="ml"))
        )
    assert caught.value.status == 429
    status = status_of(caught.value)
    assert status["reason"] == "TooManyRequests"
    assert status["details"]["causes"][0]["reason"] == "DisruptionBudget"
    assert (
        "serve needs 1 healthy pods and has 1 currently"
        in status["details"]["causes"][0]["message"]
    )
    assert k8s_api.get("pods", "b", "ml") is not None
    budget = client.PolicyV1Api(core.api_client).read_namespaced_pod_disruption_budget(
        "serve", "ml"
    )
    assert budget.status.disruptions_allowed == 0
    k8s_api.put("poddisruptionbudgets", pdb("again", "ml", {"app": "serve"}, max_unavailable=1))
    with pytest.raises(ApiException) as two:
        core.create_namespaced_pod_eviction(
            "b", "ml", client.V1Eviction(metadata=client.V1ObjectMeta(name="b", namespace="ml"))
        )
    assert two.value.status == 500


def test_deletion_checks_preconditions_and_can_leave_a_pod_terminating(
    k8s_api: K8sApi, core: client.CoreV1Api
) -> None:
    k8s_api.put("pods", pod("a"))
    with pytest.raises(ApiException) as caught:
        core.delete_namespaced_pod(
            "a",
            "default",
            body=client.V1DeleteOptions(preconditions=client.V1Preconditions(uid="x")),
        )
    assert caught.value.status == 409
    k8s_api.graceful_deletion = True
    core.delete_namespaced_pod("a", "default")
    stored = k8s_api.get("pods", "a", "default")
    assert stored is not None and stored["metadata"]["deletionTimestamp"]
    assert k8s_api.finish_terminating() == 1
    assert k8s_api.get("pods", "a", "default") is None


def test_the_job_controller_recreates_a_deleted_pod(
    k8s_api: K8sApi, core: client.CoreV1Api
) -> None:
    jobs = JobController(k8s_api)
    template = {"spec": pod("t", gpus=1)["spec"]}
    jobs.add_job("train", template, namespace="ml", parallelism=2, indexed=True)
    first = sorted(p["metadata"]["name"] for p in k8s_api.items("pods"))
    assert len(first) == 2
    core.delete_namespaced_pod(first[0], "ml")
    now = sorted(p["metadata"]["name"] for p in k8s_api.items("pods"))
    assert first[0] not in now and len(now) == 2
    assert jobs.recreated and jobs.recreated[0].startswith("ml/train-")
    indexes = sorted(
        p["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"]
        for p in k8s_api.items("pods")
    )
    assert indexes == ["0", "1"]


def test_the_scheduler_binds_what_fits_and_marks_the_rest_unschedulable(k8s_api: K8sApi) -> None:
    k8s_api.put("nodes", node("spot-1", 4, taints=[spot_taint()], labels={"model": "A100"}))
    k8s_api.put("nodes", node("od-1", 2, labels={"model": "A100"}))
    k8s_api.put("nodes", node("cpu-1"))
    k8s_api.put("nodes", daemonless := node("cordoned", 8))
    k8s_api.mutate("nodes", "cordoned", lambda n: n["spec"].update(unschedulable=True))
    assert daemonless["metadata"]["name"] == "cordoned"
    k8s_api.put("pods", pod("protected", gpus=2))
    k8s_api.put("pods", pod("tolerant", gpus=4, tolerations=[spot_toleration()]))
    k8s_api.put("pods", pod("too-big", gpus=3))
    k8s_api.put("pods", pod("elsewhere", gpus=1, node_selector={"model": "H100"}))
    for member in ("g1", "g2"):
        k8s_api.put("pods", pod(member, gpus=2, labels={"scheduling.x-k8s.io/pod-group": "gang"}))
    k8s_api.put("pods", pod("agent", owner=daemonset_owner()))
    bound = schedule(k8s_api)
    assert sorted(bound) == ["default/agent", "default/protected", "default/tolerant"]
    placed = {p["metadata"]["name"]: p["spec"].get("nodeName") for p in k8s_api.items("pods")}
    assert placed["protected"] == "od-1" and placed["tolerant"] == "spot-1"
    for name in ("too-big", "elsewhere", "g1", "g2"):
        stored = k8s_api.get("pods", name, "default")
        assert stored is not None
        condition = stored["status"]["conditions"][-1]
        assert (condition["type"], condition["status"], condition["reason"]) == (
            "PodScheduled",
            "False",
            "Unschedulable",
        )
    assert schedule(k8s_api) == []
    version = k8s_api.revision
    assert schedule(k8s_api) == []
    assert k8s_api.revision == version, "an unchanged verdict is not written again"
    k8s_api.put("nodes", node("big", 8, resource=GPU))
    assert sorted(schedule(k8s_api)) == ["default/g1", "default/g2", "default/too-big"]
