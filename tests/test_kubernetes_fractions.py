"""Fractional GPUs under Kubernetes (issue 19, item 4), through the official client against the
API emulator: nodes whose GPUs the NVIDIA GPU operator shares (time-slicing replicas, renamed
or not; MIG mixed and single) count their physical GPUs, the GPUs their slices sit on and the
GPUs' worth those slices hold; pending pods asking slices are folded into whole GPUs against
the pools' ``gpu_sharing`` as the simulator folds them; a slice nothing offers is demand that
cannot be met, never none."""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator
from fractions import Fraction
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from k8s_api_emulator import K8sApi
from k8s_cluster import bind, node, pod, schedule, tried
from k8s_source_support import clear, make_source

from autoscaler.model import Market, Pool
from autoscaler.model.sharing import GpuSharing, SharingMode
from autoscaler.sources.kubernetes import KubernetesSource
from autoscaler.sources.kubernetes.demand import UNSHARED_SLICE

TICKS = itertools.count(1_000, 100)
OURS = {"gpu-autoscaler.io/managed": "true", "gpu-autoscaler.io/market": "spot"}
SHARED = "nvidia.com/gpu.shared"
A100_40GB = ("1g.5gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb")


def sliced(replicas: int) -> GpuSharing:
    return GpuSharing(mode=SharingMode.TIME_SLICING, replicas=replicas)


MIG = GpuSharing(mode=SharingMode.MIG, profiles=A100_40GB)


def pool(name: str, sharing: GpuSharing | None) -> Pool:
    return Pool(
        name=name,
        provider="aws",
        region="us-east-1",
        instance_type="g5.xlarge",
        gpus_per_instance=1,
        market=Market.SPOT,
        gpu_sharing=sharing,
    )


@pytest.fixture
def source(k8s_api: K8sApi, monkeypatch: pytest.MonkeyPatch) -> Iterator[KubernetesSource]:
    made = make_source(k8s_api, monkeypatch)
    yield made
    made.close()


def time_sliced(
    name: str, gpus: int, replicas: int, *, renamed: bool = False, **kw: Any
) -> dict[str, Any]:
    """A node as the GPU operator leaves it with time-slicing: GPUs x replicas advertised as
    nvidia.com/gpu (or nvidia.com/gpu.shared, with renameByDefault), GFD's labels."""
    made = node(name, gpus * replicas, resource=SHARED if renamed else "nvidia.com/gpu", **kw)
    labels = made["metadata"]["labels"]
    labels["nvidia.com/gpu.count"] = str(gpus)
    labels["nvidia.com/gpu.replicas"] = str(replicas)
    labels["nvidia.com/gpu.sharing-strategy"] = "time-slicing"
    labels["nvidia.com/gpu.product"] = "NVIDIA-A10G" + ("" if renamed else "-SHARED")
    if renamed:
        for key in ("capacity", "allocatable"):
            made["status"][key]["nvidia.com/gpu"] = "0"
    return made


def mig_mixed(name: str, gpus: int, instances: dict[str, int], whole: int = 0) -> dict[str, Any]:
    made = node(name, whole)
    made["metadata"]["labels"].update(
        {
            "nvidia.com/mig.strategy": "mixed",
            "nvidia.com/mig.config": "custom",
            "nvidia.com/gpu.count": str(gpus),
            "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB",
        }
    )
    for key in ("capacity", "allocatable"):
        for profile, count in instances.items():
            made["status"][key][f"nvidia.com/mig-{profile}"] = str(count)
    return made


def slice_pod(name: str, units: int = 1, resource: str = SHARED, **kw: Any) -> dict[str, Any]:
    return pod(name, gpus=units, resource=resource, **kw)


def one_gpu_jobs(source: KubernetesSource) -> dict[tuple[str, ...], int]:
    """The one-GPU groups' jobs by GPU model, read afresh (a tick apart from the last); a slice
    group (of its sharing mode) and a whole-GPU group of the same model are summed."""
    found: dict[tuple[str, ...], int] = {}
    for g in source.read(next(TICKS)):
        if g.gpus_per_job == 1:
            found[g.gpu_models] = found.get(g.gpu_models, 0) + g.jobs
    return found


# -- nodes ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("renamed", [False, True])
def test_a_time_sliced_node_is_its_physical_gpus_and_its_slices_their_worth(
    k8s_api: K8sApi, source: KubernetesSource, renamed: bool
) -> None:
    resource = SHARED if renamed else "nvidia.com/gpu"
    k8s_api.put(
        "nodes",
        time_sliced("i-0ts", 2, 4, renamed=renamed, labels=OURS, provider_id="aws:///a/i-0ts"),
    )
    k8s_api.put("nodes", time_sliced("onprem-ts", 4, 4, renamed=renamed))
    for i in range(3):
        k8s_api.put("pods", slice_pod(f"cloud-{i}", resource=resource))
        bind(k8s_api, f"cloud-{i}", "default", "i-0ts")
    k8s_api.put("pods", slice_pod("onprem-a", 2, resource=resource))
    bind(k8s_api, "onprem-a", "default", "onprem-ts")

    reading = source.read_nodes(1.0)
    usage = reading.cloud["i-0ts"]
    # three replicas may sit on three GPUs: both are taken; they hold three quarters of one
    assert (usage.gpus_allocated, usage.gpus_held) == (2, 0.75)
    (onprem,) = reading.onprem
    assert (onprem.gpus, onprem.gpus_allocated, onprem.gpu_model) == (4, 2, "NVIDIA-A10G")


def test_an_empty_shared_node_is_empty_and_a_node_not_shared_holds_no_slices(
    k8s_api: K8sApi, source: KubernetesSource
) -> None:
    k8s_api.put("nodes", time_sliced("i-0ts", 1, 8, labels=OURS, provider_id="aws:///a/i-0ts"))
    k8s_api.put("nodes", node("i-0whole", 4, labels=OURS, provider_id="aws:///a/i-0whole"))
    k8s_api.put("pods", pod("whole", gpus=2))
    bind(k8s_api, "whole", "default", "i-0whole")
    cloud = source.read_nodes(5.0).cloud
    assert (cloud["i-0ts"].gpus_allocated, cloud["i-0ts"].gpus_held) == (0, 0.0)
    assert cloud["i-0ts"].empty_since == 5.0
    assert (cloud["i-0whole"].gpus_allocated, cloud["i-0whole"].gpus_held) == (2, None)


def test_mig_nodes_count_gpus_not_instances(k8s_api: K8sApi, source: KubernetesSource) -> None:
    # mixed: one GPU cut in seven 1g.5gb, another in two 3g.20gb, one whole
    k8s_api.put("nodes", mig_mixed("mixed", 3, {"1g.5gb": 7, "3g.20gb": 2}, whole=1))
    # single: every GPU cut alike, the instances advertised as nvidia.com/gpu
    single = node(
        "single",
        4,
        labels={
            "nvidia.com/mig.strategy": "single",
            "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB-MIG-3g.20gb",
            "nvidia.com/gpu.count": "4",
        },
    )
    k8s_api.put("nodes", single)
    k8s_api.put("pods", slice_pod("small", 2, "nvidia.com/mig-1g.5gb"))
    k8s_api.put("pods", slice_pod("half", 1, "nvidia.com/mig-3g.20gb"))
    k8s_api.put("pods", pod("one", gpus=1))
    assert sorted(schedule(k8s_api)) == ["default/half", "default/one", "default/small"]
    nodes = {n.name: n for n in source.read_nodes(1.0).onprem}
    assert nodes["mixed"].gpus == 3 and nodes["mixed"].gpus_allocated == 3
    assert nodes["single"].gpus == 2 and nodes["single"].gpu_model == "NVIDIA-A100-SXM4-40GB"
    assert nodes["single"].gpus_allocated == 0


def test_a_slice_holder_runs_as_a_one_gpu_job(k8s_api: K8sApi, source: KubernetesSource) -> None:
    k8s_api.put("nodes", time_sliced("onprem-ts", 1, 4))
    k8s_api.put("pods", slice_pod("a", 1, "nvidia.com/gpu"))
    k8s_api.put("pods", slice_pod("b", 2, "nvidia.com/gpu"))
    assert len(schedule(k8s_api)) == 2
    k8s_api.put("nodes", node("onprem-whole", 2))
    k8s_api.put("pods", pod("c", gpus=2))
    assert schedule(k8s_api) == ["default/c"]
    jobs = source.running_jobs_by_node()
    # the simulator's fractional job: one GPU, shared; its share is what it holds
    assert sorted((j.id, j.gpus, j.gpu_share) for j in jobs["onprem-ts"]) == [
        ("default/a", 1, 0.25),
        ("default/b", 1, 0.5),
    ]
    assert [(j.gpus, j.gpu_share, j.gpus_held) for j in jobs["onprem-whole"]] == [(2, None, 2.0)]


def test_a_drain_leaves_slice_holders_as_it_leaves_gpu_pods(
    k8s_api: K8sApi, source: KubernetesSource
) -> None:
    k8s_api.put("nodes", mig_mixed("i-0mig", 1, {"1g.5gb": 7}))
    made = k8s_api.get("nodes", "i-0mig")
    assert made is not None
    made["metadata"]["labels"].update(OURS)
    made["spec"]["providerID"] = "aws:///a/i-0mig"
    k8s_api.put("nodes", made)
    k8s_api.put("pods", slice_pod("sliver", 1, "nvidia.com/mig-1g.5gb"))
    k8s_api.put("pods", pod("web"))
    assert sorted(schedule(k8s_api)) == ["default/sliver", "default/web"]
    assert source.drain("i-0mig", "scale-down") == 2  # the slice holder, and web until gone
    left = sorted(p["metadata"]["name"] for p in k8s_api.items("pods"))
    assert left == ["sliver"]
    assert source.read_nodes(next(TICKS)).cloud["i-0mig"].gpus_held == pytest.approx(1 / 7)


# -- demand --------------------------------------------------------------------------------------


def test_pending_slices_are_folded_into_whole_gpus_as_the_simulator_folds_them(
    k8s_api: K8sApi, source: KubernetesSource
) -> None:
    source.know_pools([pool("ts-4", sliced(4)), pool("ts-8", sliced(8))])
    for i in range(9):
        k8s_api.put("pods", tried(slice_pod(f"quarter-{i}", created=100 + i)))
    for i in range(2):
        k8s_api.put("pods", tried(slice_pod(f"half-{i}", 2, created=50 + i)))
    k8s_api.put("pods", tried(pod("whole", gpus=1, created=10)))
    whole, group = source.read(next(TICKS))  # whole GPUs' group first, then the slices'
    # each slice as the pool that cuts it coarsest: the pods say no replicas, so against 4
    # (the fewest any time-slicing pool cuts a GPU in): 9/4 + 2 x 2/4 = 3.25 -> 4; the whole
    # pod is a group of its own (it cannot run on a slice), bought on any pool
    assert (group.gpus_per_job, group.jobs, group.gpu_sharing) == (1, 4, SharingMode.TIME_SLICING)
    assert group.oldest_jobs[0] == "default/half-0" and group.oldest_submit_time == 50
    assert (whole.gpus_per_job, whole.jobs, whole.gpu_sharing) == (1, 1, None)
    assert whole.oldest_jobs == ("default/whole",) and whole.oldest_submit_time == 10
    # counted from the first slice nothing offers: a cluster that never meets one has no count
    assert UNSHARED_SLICE not in source.reading_problems()


def test_a_pod_selecting_replicas_asks_k_of_them(k8s_api: K8sApi, source: KubernetesSource) -> None:
    source.know_pools([pool("ts-8", sliced(8))])
    on_replicas = {"nvidia.com/gpu.replicas": "8"}
    for i in range(8):
        k8s_api.put("pods", tried(pod(f"eighth-{i}", gpus=1, node_selector=on_replicas)))
    strategy = {"nvidia.com/gpu.sharing-strategy": "time-slicing"}
    for i in range(4):
        k8s_api.put("pods", tried(pod(f"quarter-{i}", gpus=2, node_selector=strategy)))
    assert one_gpu_jobs(source) == {(): 2}  # 8 x 1/8 + 4 x 2/8
    k8s_api.put("pods", tried(pod("plain", gpus=1)))  # no selector: a whole GPU
    assert one_gpu_jobs(source) == {(): 3}


def test_slices_are_folded_only_against_the_pools_that_can_host_them(
    k8s_api: K8sApi, source: KubernetesSource
) -> None:
    """A slice group is bought only on pools that share its way (``NodeShape.shares_like``), so
    a pool that does not share, or shares another way, neither rounds its slices up to a GPU
    each nor cuts them coarser: six quarter pods are 2 GPUs of the 4-replica pool, however
    many other pools there are."""
    source.know_pools([pool("ts-4", sliced(4)), pool("whole", None)])
    for i in range(6):
        k8s_api.put("pods", tried(slice_pod(f"q-{i}")))
    assert one_gpu_jobs(source) == {(): 2}
    # a MIG pool would cut a quarter as 2/7 (its smallest profile covering it): not a host
    source.know_pools([pool("ts-4", sliced(4)), pool("mig", MIG), pool("whole", None)])
    for i in range(6, 8):
        k8s_api.put("pods", tried(slice_pod(f"q-{i}")))
    assert one_gpu_jobs(source) == {(): 2}  # 8 x 1/4, not 8 x 2/7 (3)
    # pods selecting 8 replicas run only on the 8-replica pool's GPUs, not the 4-replica one's
    clear(k8s_api, "pods")
    source.know_pools([pool("ts-4", sliced(4)), pool("ts-8", sliced(8))])
    on_eight = {"nvidia.com/gpu.replicas": "8"}
    for i in range(8):
        k8s_api.put("pods", tried(pod(f"e-{i}", gpus=1, node_selector=on_eight)))
    assert one_gpu_jobs(source) == {(): 1}  # 8 x 1/8, not 8 x 1/4 (2)
    # the MIG pods beside them are folded against the MIG pool alone
    source.know_pools([pool("ts-8", sliced(8)), pool("mig", MIG), pool("whole", None)])
    for i in range(7):
        k8s_api.put("pods", tried(slice_pod(f"m-{i}", 1, "nvidia.com/mig-1g.5gb")))
    groups = {g.gpu_sharing: g.jobs for g in source.read(next(TICKS))}
    assert groups == {SharingMode.TIME_SLICING: 1, SharingMode.MIG: 1}
    assert UNSHARED_SLICE not in source.reading_problems()


def test_mig_slices_are_their_profiles_sevenths_and_keep_their_gpu_model(
    k8s_api: K8sApi, source: KubernetesSource
) -> None:
    source.know_pools([pool("mig", MIG)])
    product = {"nvidia.com/gpu.product": "A100-SXM4-40GB-MIG-1g.5gb"}
    for i in range(7):
        k8s_api.put("pods", tried(slice_pod(f"s-{i}", 1, "nvidia.com/mig-1g.5gb")))
    for i in range(2):
        k8s_api.put(
            "pods", tried(slice_pod(f"single-{i}", 1, "nvidia.com/gpu", node_selector=product))
        )
    k8s_api.put("pods", tried(slice_pod("three", 1, "nvidia.com/mig-3g.20gb")))
    assert one_gpu_jobs(source) == {(): 2, ("A100-SXM4-40GB",): 1}  # 7/7 + 3/7; 2/7


def test_a_slice_nothing_offers_is_demand_that_cannot_be_met(
    k8s_api: K8sApi, source: KubernetesSource
) -> None:
    source.know_pools([pool("whole", None), pool("ts", sliced(4))])
    k8s_api.put("pods", tried(slice_pod("mig", 1, "nvidia.com/mig-3g.20gb")))
    k8s_api.put("pods", tried(slice_pod("ts-a")))
    jobs = one_gpu_jobs(source)
    assert jobs[("a slice of a GPU cut in MIG 3g.20gb instances",)] == 1
    assert jobs[()] == 1  # a quarter of the time-sliced pool's GPU: one GPU
    assert source.reading_problems()[UNSHARED_SLICE] == 1
    assert any("default/mig" in line and "MIG 3g.20gb" in line for line in source.problems)
    # an on-prem node cut in that profile offers it (as the last node reading saw the nodes)
    k8s_api.put("nodes", mig_mixed("onprem-mig", 1, {"3g.20gb": 2}))
    source.read_nodes(next(TICKS))
    assert one_gpu_jobs(source) == {(): 2}
    assert source.reading_problems()[UNSHARED_SLICE] == 0  # seen once: counted, now none


def test_without_pools_known_slices_are_not_judged(
    k8s_api: K8sApi, source: KubernetesSource
) -> None:
    k8s_api.put("pods", tried(slice_pod("a")))
    k8s_api.put("pods", tried(slice_pod("m", 1, "nvidia.com/mig-1g.5gb")))
    assert one_gpu_jobs(source) == {(): 2}
    assert UNSHARED_SLICE not in source.reading_problems()


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    st.lists(st.sampled_from([2, 3, 4, 8]), min_size=1, max_size=3),
    st.lists(st.tuples(st.integers(1, 7), st.booleans()), min_size=1, max_size=12),
)
def test_folded_slices_never_buy_fewer_gpus_than_they_need(
    k8s_api: K8sApi,
    source: KubernetesSource,
    replicas: list[int],
    asked: list[tuple[int, bool]],
) -> None:
    """However many pods ask however many replicas, the GPUs told are at least what their
    slices need on the pool that cuts GPUs coarsest, and at most a GPU a pod."""
    clear(k8s_api, "pods")
    source.know_pools([pool(f"ts-{i}", sliced(r)) for i, r in enumerate(replicas)])
    fewest = min(replicas)
    need = Fraction(0)
    for i, (units, selects) in enumerate(asked):
        if selects:  # the pod names the replicas it counts against
            chosen = replicas[i % len(replicas)]
            made = pod(f"p-{i}", gpus=units, node_selector={"nvidia.com/gpu.replicas": str(chosen)})
        else:
            chosen = fewest
            made = slice_pod(f"p-{i}", units)
        k8s_api.put("pods", tried(made))
        share = Fraction(units, chosen)
        need += share if share < 1 else math.ceil(share)
    told = sum(g.gpus_per_job * g.jobs for g in source.read(next(TICKS)))
    assert math.ceil(need) <= told <= sum(max(1, math.ceil(Fraction(u, 2))) for u, _ in asked)
