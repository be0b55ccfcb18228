"""The ``kubernetes`` source's reading side, through the official client against the API
emulator: pending GPU pods folded into demand groups, gangs, nodes and what runs on them, a
failing API server (demand unknown, never zero) and objects that cannot be read."""

from __future__ import annotations

import itertools
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from k8s_api_emulator import K8sApi
from k8s_cluster import (
    JobController,
    bind,
    node,
    pod,
    spot_taint,
    spot_toleration,
    tried,
)
from k8s_source_support import TOKEN_ENV, clear, make_source
from kubernetes_calls import scan_source

from autoscaler.app.assembly import build_signals
from autoscaler.model.config import ControllerConfig, SourceRole
from autoscaler.model.errors import InputError, SourceError
from autoscaler.sources.kubernetes import KubernetesSource
from autoscaler.sources.kubernetes.demand import UNREADABLE_MODEL
from autoscaler.spi.sources import (
    CheckpointingScheduler,
    JobsByNode,
    NodeSource,
    QueueSource,
    RendersJoinScript,
    WorkloadScheduler,
)

ROOT = Path(__file__).resolve().parent.parent
TICKS = itertools.count(1_000)
CHECKPOINTS = {
    "gpu-autoscaler.io/checkpoint_interval": "600",
    "gpu-autoscaler.io/checkpoint_duration": "30",
}


@pytest.fixture
def source(k8s_api: K8sApi, monkeypatch: pytest.MonkeyPatch) -> Iterator[KubernetesSource]:
    made = make_source(
        k8s_api,
        monkeypatch,
        high_priority_classes=["urgent"],
        high_priority_min=1000,
        gpu_models={"NVIDIA-A100-SXM4-80GB": "A100"},
        instance_type_gpu_models={"p5.48xlarge": "H100"},
    )
    yield made
    made.close()


def groups_by_shape(source: KubernetesSource) -> dict[tuple[Any, ...], int]:
    return {
        (
            g.gpus_per_job,
            g.nodes,
            g.gpu_models,
            g.checkpoint_interval_s,
            g.high_priority,
            g.min_gpu_memory_gib,
        ): g.jobs
        for g in source.read(1.0)
    }


# -- demand --------------------------------------------------------------------------------------


def test_pending_unschedulable_gpu_pods_are_demand_and_nothing_else_is(
    k8s_api: K8sApi, source: KubernetesSource
) -> None:
    k8s_api.put("pods", tried(pod("a", gpus=1, created=100)))
    k8s_api.put("pods", tried(pod("b", gpus=1, created=50)))
    k8s_api.put("pods", tried(pod("c", "team-2", gpus=4, limits_only=True, created=70)))
    k8s_api.put("pods", pod("untried", gpus=8))  # the scheduler has not looked at it yet
    k8s_api.put("pods", tried(pod("cpu-only")))
    k8s_api.put("pods", tried(pod("init-heavy", gpus=1, init_gpus=2, created=80)))
    k8s_api.put("nodes", node("onprem-1", 8))
    k8s_api.put("pods", pod("running", gpus=2))
    bind(k8s_api, "running", "default", "onprem-1")
    preempting = tried(pod("preempting", gpus=8))
    preempting["status"]["nominatedNodeName"] = "onprem-1"  # waits for its victims to leave
    k8s_api.put("pods", preempting)
    leaving = tried(pod("leaving", gpus=2))
    leaving["metadata"]["deletionTimestamp"] = "2030-01-01T00:00:00Z"
    k8s_api.put("pods", leaving)

    groups = source.read(1.0)
    shapes = {(g.gpus_per_job, g.nodes): g for g in groups}
    assert sorted(shapes) == [(1, 1), (2, 1), (4, 1)]
    assert shapes[(1, 1)].jobs == 2
    assert shapes[(1, 1)].oldest_jobs == ("default/b", "default/a")
    assert shapes[(1, 1)].oldest_submit_time == 50.0
    assert shapes[(2, 1)].oldest_jobs == ("default/init-heavy",)
    assert shapes[(4, 1)].oldest_jobs == ("team-2/c",)
    assert all(not g.spot_safe and not g.high_priority for g in groups)
    assert source.skipped == 0


def test_model_priority_and_spot_safety_come_from_the_pod(
    k8s_api: K8sApi, source: KubernetesSource
) -> None:
    product = {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}
    affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {
                        "matchExpressions": [
                            {
                                "key": "node.kubernetes.io/instance-type",
                                "operator": "In",
                                "values": ["p5.48xlarge"],
                            },
                            {"key": "nvidia.com/gpu.memory", "operator": "Gt", "values": ["40959"]},
                        ]
                    },
                    {
                        "matchExpressions": [
                            {"key": "nvidia.com/gpu.product", "operator": "In", "values": ["L4"]}
                        ]
                    },
                ]
            }
        }
    }
    spot = [spot_toleration()]
    for name, extra in (
        ("safe", {"annotations": CHECKPOINTS, "tolerations": spot}),
        ("declares-only", {"annotations": CHECKPOINTS}),  # no toleration: kept off spot
        ("tolerates-only", {"tolerations": spot}),  # no checkpoints: kept off spot
        ("urgent", {"annotations": CHECKPOINTS, "tolerations": spot, "priority_class": "urgent"}),
        ("high", {"annotations": CHECKPOINTS, "tolerations": spot, "priority": 5000}),
        ("a100", {"node_selector": product}),
        ("h100-or-l4", {"affinity": affinity}),
        ("any-wildcard", {"tolerations": [{"operator": "Exists"}], "annotations": CHECKPOINTS}),
    ):
        k8s_api.put("pods", tried(pod(name, gpus=2, **extra)))  # type: ignore[arg-type]
    shapes = groups_by_shape(source)
    assert shapes == {
        (2, 1, (), 600.0, False, None): 2,  # safe and any-wildcard
        (2, 1, (), None, False, None): 2,  # declares-only and tolerates-only
        (2, 1, (), 600.0, True, None): 2,  # urgent and high
        (2, 1, ("A100",), None, False, None): 1,
        (2, 1, ("H100", "L4"), None, False, 40.0): 1,
    }
    safe = [g for g in source.read(2.0) if g.spot_safe]
    assert len(safe) == 1 and safe[0].jobs == 2


def test_gangs_are_one_job_of_a_node_each(k8s_api: K8sApi, source: KubernetesSource) -> None:
    group = {"scheduling.x-k8s.io/pod-group": "ring"}
    for index in range(3):
        k8s_api.put("pods", tried(pod(f"ring-{index}", "ml", gpus=8, labels=group, created=10)))
    sized = {"pod-group.scheduling.sigs.k8s.io": "big"}
    annotations = {"pod-group.scheduling.sigs.k8s.io/min-available": "4"}
    k8s_api.put("pods", tried(pod("big-0", "ml", gpus=4, labels=sized, annotations=annotations)))
    jobs = JobController(k8s_api)
    template = tried(pod("t", gpus=2))
    jobs.add_job("indexed", {"spec": template["spec"]}, namespace="ml", parallelism=2, indexed=True)
    for made in k8s_api.items("pods"):
        if made["metadata"]["name"].startswith("indexed-"):
            k8s_api.mutate(
                "pods",
                made["metadata"]["name"],
                lambda p: p["status"].update(tried(pod("x"))["status"]),
                "ml",
            )
    groups = {g.oldest_jobs: g for g in source.read(1.0)}
    ring = groups[("ml/ring",)]
    assert (ring.jobs, ring.nodes, ring.gpus_per_job, ring.gpus_per_node) == (1, 3, 24, 8)
    big = groups[("ml/big",)]
    assert (big.nodes, big.gpus_per_node) == (4, 4), "min-available counts the pods to come"
    indexed = groups[("ml/job/indexed",)]
    assert (indexed.nodes, indexed.gpus_per_node) == (2, 2)


def test_a_kueue_pod_group_is_a_gang_once_admitted_and_not_demand_while_gated(
    k8s_api: K8sApi, source: KubernetesSource
) -> None:
    kueue = {"kueue.x-k8s.io/pod-group-name": "trainer", "kueue.x-k8s.io/queue-name": "team-a"}
    total = {"kueue.x-k8s.io/pod-group-total-count": "3"}
    for index in range(2):
        made = tried(pod(f"trainer-{index}", "ml", gpus=8, labels=kueue, annotations=total))
        k8s_api.put("pods", made)
    held = pod("held-0", "ml", gpus=8, labels={"kueue.x-k8s.io/pod-group-name": "held"})
    held["spec"]["schedulingGates"] = [{"name": "kueue.x-k8s.io/admission"}]
    held["status"]["conditions"] = [
        {"type": "PodScheduled", "status": "False", "reason": "SchedulingGated"}
    ]
    k8s_api.put("pods", held)
    (trainer,) = source.read(1.0)
    assert trainer.oldest_jobs == ("ml/trainer",)
    assert (trainer.jobs, trainer.nodes, trainer.gpus_per_node) == (1, 3, 8), (
        "the total count holds the member Kueue has yet to ungate"
    )


def test_a_gang_partly_running_needs_only_the_rest(
    k8s_api: K8sApi, source: KubernetesSource
) -> None:
    labels = {"scheduling.x-k8s.io/pod-group": "g"}
    sized = {"scheduling.x-k8s.io/min-available": "4"}
    k8s_api.put("nodes", node("n", 8))
    for index in range(4):
        k8s_api.put("pods", tried(pod(f"g-{index}", gpus=8, labels=labels, annotations=sized)))
    bind(k8s_api, "g-0", "default", "n")
    (group,) = source.read(1.0)
    assert (group.nodes, group.gpus_per_node) == (3, 8)


def test_namespaces_narrow_demand(k8s_api: K8sApi, monkeypatch: pytest.MonkeyPatch) -> None:
    narrowed = make_source(k8s_api, monkeypatch, namespaces=["ml"])
    k8s_api.put("pods", tried(pod("mine", "ml", gpus=1)))
    k8s_api.put("pods", tried(pod("theirs", "web", gpus=1)))
    (group,) = narrowed.read(1.0)
    assert group.oldest_jobs == ("ml/mine",)
    narrowed.close()


pod_specs = st.lists(
    st.fixed_dictionaries(
        {
            "gpus": st.integers(0, 8),
            "tried": st.booleans(),
            "bound": st.booleans(),
            "checkpoints": st.booleans(),
            "tolerates": st.booleans(),
            "urgent": st.booleans(),
            "model": st.sampled_from([None, "NVIDIA-A100-SXM4-80GB", "L4"]),
            "namespace": st.sampled_from(["default", "ml"]),
            "created": st.integers(0, 5),
        }
    ),
    max_size=25,
)


@settings(
    max_examples=40, suppress_health_check=[HealthCheck.function_scoped_fixture], deadline=None
)
@given(pod_specs)
def test_demand_totals_equal_the_gpus_of_pending_gpu_pods(
    k8s_api: K8sApi, source: KubernetesSource, specs: list[dict[str, Any]]
) -> None:
    clear(k8s_api, "pods", "nodes")
    k8s_api.put("nodes", node("full", 0))
    expected_gpus = expected_pods = 0
    for index, spec in enumerate(specs):
        made = pod(
            f"p{index}",
            spec["namespace"],
            gpus=spec["gpus"],
            annotations=CHECKPOINTS if spec["checkpoints"] else None,
            tolerations=[spot_toleration()] if spec["tolerates"] else (),
            priority_class="urgent" if spec["urgent"] else None,
            node_selector={"nvidia.com/gpu.product": spec["model"]} if spec["model"] else None,
            created=float(spec["created"]),
        )
        if spec["tried"] and not spec["bound"]:
            tried(made)
            if spec["gpus"]:
                expected_gpus += spec["gpus"]
                expected_pods += 1
        k8s_api.put("pods", made)
        if spec["bound"]:
            bind(k8s_api, f"p{index}", spec["namespace"], "full")
    groups = source.read(float(next(TICKS)))  # a new tick: the pods are listed afresh
    assert sum(g.gpus for g in groups) == expected_gpus
    assert sum(g.jobs for g in groups) == expected_pods
    keys = [
        (g.gpus_per_job, g.checkpoint_interval_s, g.high_priority, g.gpu_models, g.team)
        for g in groups
    ]
    assert len(keys) == len(set(keys)), "one group per shape and team (the namespace)"
    assert {g.team for g in groups} <= {"default", "ml"}
    for group in groups:
        assert group.spot_safe == (
            group.checkpoint_interval_s is not None and not group.high_priority
        )
        assert 1 <= len(group.oldest_jobs) <= min(group.jobs, 8)


# -- what cannot be read --------------------------------------------------------------------------


def test_bad_pods_count_as_demand_that_cannot_be_met_with_one_warning_and_the_rest_count(
    k8s_api: K8sApi, source: KubernetesSource, caplog: pytest.LogCaptureFixture
) -> None:
    k8s_api.put("pods", tried(pod("good", gpus=2)))
    k8s_api.put("pods", tried(pod("lots", gpus="lots")))
    k8s_api.put(
        "pods",
        tried(
            pod(
                "soon",
                gpus=1,
                tolerations=[spot_toleration()],
                annotations={"gpu-autoscaler.io/checkpoint_interval": "soon"},
            )
        ),
    )
    broken = tried(pod("broken", gpus=1))
    broken["spec"]["tolerations"] = "everything"
    k8s_api.put("pods", broken)
    k8s_api.put("pods", tried(pod("amd", gpus=2, resource="amd.com/gpu")))
    k8s_api.put("pods", tried(pod("absurd", gpus=5000)))
    with caplog.at_level(logging.WARNING, "autoscaler.sources.kubernetes"):
        groups = source.read(1.0)
        source.read_nodes(1.0)
        again = source.read(2.0)
        source.read_nodes(2.0)
        assert source.reading_problems()["unreadable-bound-pod"] == 0
        again = source.read(3.0)
    assert groups == again
    shapes = {(g.gpus_per_job, g.gpu_models, g.checkpoint_interval_s): g.jobs for g in groups}
    assert shapes == {
        (2, (), None): 1,
        (1, (), None): 1,  # a checkpoint annotation it cannot read: off spot, still served
        (2, ("amd.com/gpu",), None): 1,
        # never zero demand: the GPU one could read (broken) or one (lots)
        (1, (UNREADABLE_MODEL,), None): 2,
    }
    assert source.skipped == 5
    assert source.reading_problems() == {
        "unreadable": 2,
        "unknown-gpu-resource": 1,
        "unmet-node-selector": 0,
        "too-large": 1,
        "bad-checkpoint-annotation": 1,
        "unreadable-node": 0,
        "unreadable-bound-pod": 0,
    }
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, "said once, not every tick"
    line = warnings[0]
    assert "\n" not in line and "Traceback" not in line
    assert "1 pending pod(s) ask for a GPU resource no setting counts" in line
    assert "(and 2 more)" in line
    problems = "\n".join(source.problems)
    assert "pod default/lots: spec.containers[0].resources" in problems
    assert "'lots' is not a whole number" in problems
    assert "pod default/soon counts as not checkpointing: " in problems
    assert "checkpoint_interval 'soon' is not a number of seconds" in problems
    assert "pod default/broken: spec.tolerations is 'everything', not a list" in problems
    assert "pod default/absurd: asks 5,000 GPUs of one node" in problems


def test_a_failing_api_server_is_unknown_demand_not_zero(
    k8s_api: K8sApi, source: KubernetesSource
) -> None:
    k8s_api.put("pods", tried(pod("a", gpus=1)))
    for status, said in (
        (503, "HTTP 503"),
        (403, "HTTP 403"),
        (401, "HTTP 401"),
        (500, "the server is answering 500"),
    ):
        k8s_api.fail(status, times=1)
        with pytest.raises(SourceError) as caught:
            source.read(float(status))
        message = str(caught.value)
        assert message.startswith("kubernetes source 'cluster': list pods: ")
        assert said in message and "\n" not in message
    assert [g.jobs for g in source.read(9.0)] == [1]


def test_a_server_that_does_not_answer_in_time_fails_the_read(
    k8s_api: K8sApi, monkeypatch: pytest.MonkeyPatch
) -> None:
    slow = make_source(k8s_api, monkeypatch, request_timeout_s=0.2)
    k8s_api.stall(1.0)
    with pytest.raises(SourceError, match=r"list pods: no answer within 0.2s"):
        slow.read(1.0)
    k8s_api.heal()
    slow.close()


def test_a_missing_token_or_no_server_fails_the_read_in_one_line(
    k8s_api: K8sApi, monkeypatch: pytest.MonkeyPatch
) -> None:
    unset = make_source(k8s_api, monkeypatch)
    monkeypatch.delenv(TOKEN_ENV)
    with pytest.raises(SourceError, match=f"environment variable {TOKEN_ENV} .* is not set"):
        unset.read(1.0)
    nowhere = make_source(k8s_api, monkeypatch, api_url="http://127.0.0.1:9")
    with pytest.raises(SourceError, match="list pods: cannot reach the API server"):
        nowhere.read(1.0)


def test_settings_mistakes_are_one_line_naming_the_field() -> None:
    for given_settings, field, said in (
        ({"kubeconfig": "relative/kubeconfig"}, "sources.k.kubeconfig", "absolute path"),
        ({"api_url": "http://x", "kubeconfig": "/k"}, "sources.k", "not both"),
        ({"extra_gpu_resources": ["gpu"]}, "sources.k.extra_gpu_resources", "domain/name"),
        ({"namespaces": ["Not_A_Namespace"]}, "sources.k.namespaces", "namespace name"),
        ({"drain_timeout_action": "pray"}, "sources.k.drain_timeout_action", "evict"),
        ({"token_env": "T"}, "sources.k", "go with api_url"),
    ):
        with pytest.raises(InputError) as caught:
            KubernetesSource.from_config(given_settings, "k")
        assert caught.value.field == field, given_settings
        assert said in caught.value.message


# -- nodes ----------------------------------------------------------------------------------------


def test_nodes_are_on_prem_gpu_nodes_and_our_cloud_nodes_by_instance_id(
    k8s_api: K8sApi, source: KubernetesSource
) -> None:
    ours = {"gpu-autoscaler.io/managed": "true", "gpu-autoscaler.io/market": "spot"}
    k8s_api.put(
        "nodes",
        node(
            "onprem-1",
            8,
            labels={
                "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB",
                "nvidia.com/gpu.memory": "81920",
            },
        ),
    )
    k8s_api.put("nodes", node("onprem-2", 4, unschedulable=True))
    k8s_api.put("nodes", node("cpu-only", 0))
    k8s_api.put(
        "nodes",
        node(
            "ip-10-0-0-1.ec2.internal",
            8,
            labels=ours,
            provider_id="aws:///us-east-1a/i-0abc",
            taints=[spot_taint()],
        ),
    )
    k8s_api.put(
        "nodes", node("gke-1", 4, labels=ours, provider_id="gce://proj/us-central1-a/gpu-vm-7")
    )
    k8s_api.put(
        "nodes",
        node(
            "aks-1",
            1,
            labels=ours,
            provider_id="azure:///subscriptions/s/resourcegroups/rg/providers/Microsoft.Compute/virtualMachines/VM-9",
        ),
    )
    k8s_api.put("nodes", node("i-0def", 8, labels=ours))  # kubeadm: named by its instance id
    for name, where, gpus in (
        ("a", "onprem-1", 3),
        ("b", "ip-10-0-0-1.ec2.internal", 8),
        ("c", "onprem-1", 2),
    ):
        k8s_api.put("pods", pod(name, gpus=gpus))
        bind(k8s_api, name, "default", where)
    k8s_api.put("pods", pod("done", gpus=8))
    bind(k8s_api, "done", "default", "gke-1")
    k8s_api.mutate("pods", "done", lambda p: p["status"].update(phase="Succeeded"), "default")

    reading = source.read_nodes(100.0)
    onprem = {n.name: n for n in reading.onprem}
    assert sorted(onprem) == ["onprem-1", "onprem-2"]
    first = onprem["onprem-1"]
    assert (first.gpus, first.gpus_allocated, first.gpu_model, first.gpu_memory_gib) == (
        8,
        5,
        "A100",
        80.0,
    )
    assert first.schedulable and not onprem["onprem-2"].schedulable
    assert {k: v.gpus_allocated for k, v in reading.cloud.items()} == {
        "i-0abc": 8,
        "gpu-vm-7": 0,
        "vm-9": 0,
        "i-0def": 0,
    }
    assert reading.cloud["gpu-vm-7"].empty_since == 100.0
    later = source.read_nodes(160.0)
    assert later.cloud["gpu-vm-7"].empty_since == 100.0, "empty since it was first seen empty"
    assert later.cloud["i-0abc"].empty_since is None


def test_a_node_with_a_pod_that_cannot_be_read_is_never_taken_for_empty(
    k8s_api: K8sApi, source: KubernetesSource
) -> None:
    ours = {"gpu-autoscaler.io/managed": "true"}
    k8s_api.put("nodes", node("i-1", 4, labels=ours))
    k8s_api.put("nodes", node("weird", 4, labels={"x": "y"}))
    k8s_api.mutate(
        "nodes", "weird", lambda n: n["status"].update(allocatable={"nvidia.com/gpu": "four"})
    )
    k8s_api.put("pods", pod("odd", gpus=1))
    bind(k8s_api, "odd", "default", "i-1")
    k8s_api.mutate(
        "pods",
        "odd",
        lambda p: p["spec"]["containers"][0]["resources"].update(
            requests={"nvidia.com/gpu": "one"}
        ),
        "default",
    )
    reading = source.read_nodes(1.0)
    assert reading.cloud["i-1"].gpus_allocated == 4 and reading.cloud["i-1"].empty_since is None
    assert [n.name for n in reading.onprem] == []
    assert source.skipped == 2
    k8s_api.put("nodes", node("i-2", 4, labels=ours))
    k8s_api.mutate("nodes", "i-2", lambda n: n["status"].update(allocatable={"nvidia.com/gpu": -1}))
    with pytest.raises(SourceError, match=r"list nodes: node i-2: status\.allocatable"):
        source.read_nodes(2.0)


# -- wiring ----------------------------------------------------------------------------------------


def test_a_config_with_kind_kubernetes_gets_every_role(
    k8s_api: K8sApi, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(TOKEN_ENV, k8s_api.token)
    config = ControllerConfig.model_validate(
        {
            "fleet_id": "test",
            "pools": [],
            "sources": [
                {
                    "kind": "kubernetes",
                    "name": "cluster",
                    "settings": {"api_url": k8s_api.url, "token_env": TOKEN_ENV},
                }
            ],
        }
    )
    wiring = build_signals(config)
    source = wiring.scheduler
    assert isinstance(source, KubernetesSource)
    assert wiring.signals.queues == (source,) and wiring.signals.nodes is source
    for role in (
        QueueSource,
        NodeSource,
        WorkloadScheduler,
        CheckpointingScheduler,
        JobsByNode,
        RendersJoinScript,
    ):
        assert isinstance(source, role), role
    assert {r.value for r in SourceRole} >= {"queue", "nodes", "scheduler"}
    source.close()


def test_every_api_call_is_in_one_module_and_is_what_the_docs_list() -> None:
    package = ROOT / "autoscaler" / "sources" / "kubernetes"
    expected = {
        ("", "pods", "list"),
        ("", "pods", "watch"),  # the watch cache (watch_cache: true)
        ("", "pods", "get"),
        ("", "pods", "patch"),
        ("", "pods", "delete"),
        ("", "pods/eviction", "create"),
        ("", "nodes", "list"),
        ("", "nodes", "watch"),
        ("", "nodes", "patch"),
    }
    for path in sorted(package.glob("*.py")):
        calls = scan_source(path.read_text(), path.name)
        assert not calls.unknown, calls.unknown
        assert set(calls.grants) == (expected if path.name == "api.py" else set()), path.name
    doc = (ROOT / "docs" / "kubernetes.md").read_text()
    for _, resource, verb in expected:
        assert f"| `{verb}` | `{resource}` |" in doc, (verb, resource)


def test_a_kubeconfig_and_its_context_reach_the_cluster(k8s_api: K8sApi, tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: other\n"
        f"clusters:\n- name: emu\n  cluster: {{server: '{k8s_api.url}'}}\n"
        "- name: elsewhere\n  cluster: {server: 'http://127.0.0.1:9'}\n"
        f"users:\n- name: me\n  user: {{token: '{k8s_api.token}'}}\n"
        "contexts:\n- name: emu\n  context: {cluster: emu, user: me}\n"
        "- name: other\n  context: {cluster: elsewhere, user: me}\n"
    )
    k8s_api.put("pods", tried(pod("a", gpus=1)))
    chosen = KubernetesSource.from_config(
        {"kubeconfig": str(kubeconfig), "context": "emu"}, "cluster"
    )
    assert [g.oldest_jobs for g in chosen.read(1.0)] == [("default/a",)]
    chosen.close()
