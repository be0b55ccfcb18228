"""Slurm's MIG instances read as slices of a GPU (issue 19, item 4).

Slurm (21.08 and later) treats each MIG instance as a GPU of its own: ``AutoDetect=nvml`` in
``gres.conf``, and in ``slurm.conf`` a gres type per profile that is a substring of the profile
NVML reports (``nvidia_a100_3g.20gb``), e.g. ``Gres=gpu:a100:1,gpu:a100_3g.20gb:2``
(https://slurm.schedmd.com/gres.html#MIG_Management). A job asks ``--gres=gpu:1g.10gb:1`` or
``--gres=gpu:a100_3g.40gb:1``: one instance, c/7 of a GPU's compute.

The documents are the ones captured from a real Slurm 22.05 in tests/data/slurm
(``squeue-shards.json``), their gres strings written as that Slurm prints a typed GPU request
(``tres_per_node`` ``gres:gpu:a100:1``, ``gres_detail`` ``gpu:a100:1(IDX:3)``) with a MIG
profile's type; and a real Slurm 22.05 of tests/slurm_cluster.py whose fake GPUs are typed
``a100_1g.10gb`` (``Layout(gpu_type=...)``): its fake GPUs cannot be cut, but a type is only a
name to Slurm, so it schedules and prints them as a MIG site's instances.
"""

from __future__ import annotations

import copy
import json
import logging
from collections.abc import Iterator
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from slurm_cluster import Layout, SlurmCluster, start_slurm_cluster, stop_slurm_cluster, wait_for

from autoscaler.model import DemandGroup, Market, Pool
from autoscaler.model.sharing import GpuSharing, SharingMode
from autoscaler.sources.slurm import SlurmAdapter
from autoscaler.sources.slurm_json import (
    DemandRules,
    NodeRules,
    demand_groups,
    read_nodes,
    read_running_jobs,
)
from autoscaler.sources.slurm_shards import NO_MIG, mig_type, shard_pools

DATA = Path(__file__).parent / "data" / "slurm"

PLAIN = Pool(
    name="gcp-a2",
    provider="gcp",
    region="us-central1",
    instance_type="a2-ultragpu-1g",
    gpus_per_instance=1,
    gpu_model="A100",
    market=Market.ON_DEMAND,
)
MIG = PLAIN.model_copy(
    update={
        "name": "gcp-a2-mig",
        "gpu_sharing": GpuSharing(mode=SharingMode.MIG, profiles=("1g.10gb", "3g.40gb")),
    }
)
MIG_COARSE = PLAIN.model_copy(
    update={
        "name": "gcp-a2-mig-coarse",
        "gpu_sharing": GpuSharing(mode=SharingMode.MIG, profiles=("1g.10gb", "2g.20gb")),
    }
)
SLICED = PLAIN.model_copy(
    update={
        "name": "gcp-a2-sliced",
        "gpu_sharing": GpuSharing(mode=SharingMode.TIME_SLICING, replicas=4),
    }
)


def _rules(*pools: Pool, models: dict[str, str] | None = None) -> DemandRules:
    return DemandRules(
        shard_pools=shard_pools([p.gpu_sharing for p in pools]), gpu_models=models or {}
    )


def _captured() -> dict[str, Any]:
    document: dict[str, Any] = json.loads((DATA / "squeue-shards.json").read_text())
    return document


def _queue(*requests: str) -> str:
    """The captured document's pending job (6), once per request, each asking it per node."""
    document = _captured()
    template = next(j for j in document["jobs"] if j["job_state"] == "PENDING")
    jobs = []
    for index, request in enumerate(requests):
        job = copy.deepcopy(template)
        job.update(job_id=100 + index, tres_per_node=request, submit_time=1_700_000_000 + index)
        jobs.append(job)
    document["jobs"] = jobs
    return json.dumps(document)


def _running(**details: list[str]) -> str:
    """The captured running whole-GPU job (5) on gpu-a, once per job id, with these gres
    details (and the request the first one names)."""
    document = _captured()
    template = next(j for j in document["jobs"] if j["job_id"] == 5)
    jobs = []
    for ident, detail in details.items():
        job = copy.deepcopy(template)
        request = detail[0].split("(", 1)[0]
        job.update(job_id=int(ident.removeprefix("j")), gres_detail=detail)
        job.update(tres_per_node="gres:" + request, nodes="gpu-a")
        jobs.append(job)
    document["jobs"] = jobs
    return json.dumps(document)


def _groups(text: str, rules: DemandRules) -> dict[tuple[SharingMode | None, tuple[str, ...]], int]:
    found: dict[tuple[SharingMode | None, tuple[str, ...]], int] = {}
    for group in demand_groups(text, rules):
        key = (group.gpu_sharing, group.gpu_models)
        found[key] = found.get(key, 0) + group.gpus_per_job * group.jobs
    return found


def test_a_gres_type_names_a_mig_profile_as_slurm_types_are_written() -> None:
    assert mig_type("1g.10gb") == ("1g.10gb", None)
    assert mig_type("a100_3g.20gb") == ("3g.20gb", "a100")
    assert mig_type("nvidia_a100_3g.20gb") == ("3g.20gb", "nvidia_a100")
    assert mig_type("a100-7g.80gb") == ("7g.80gb", "a100")
    assert mig_type("1g.10gb+me") == ("1g.10gb+me", None)
    # whole GPUs' types, and compute sizes no MIG GPU cuts
    assert mig_type("a100") is None
    assert mig_type("tesla_t4") is None
    assert mig_type("5g.40gb") is None
    assert mig_type("a100_80gb") is None


def test_pending_mig_jobs_are_slices_folded_against_the_pools_that_cut_their_profile() -> None:
    # seven 1g.10gb jobs and two 3g.40gb ones: 7/7 + 6/7 of a GPU are 2 GPUs, not 9
    text = _queue(*["gres:gpu:a100_1g.10gb:1"] * 7, *["gres:gpu:a100_3g.40gb:1"] * 2, "gres:gpu:1")
    rules = _rules(MIG, PLAIN, SLICED, models={"a100": "A100"})
    groups = {g.gpu_sharing: g for g in demand_groups(text, rules)}
    assert groups[SharingMode.MIG].jobs == 2
    assert groups[SharingMode.MIG].gpus_per_job == 1
    # the slices are a group apart from the whole-GPU job, which may run on any pool
    assert groups[None].jobs == 1
    # the GPU model is the type before the profile, renamed as the site maps types
    assert _groups(text, rules) == {(SharingMode.MIG, ("A100",)): 2, (None, ()): 1}
    # a job asking two instances on its node is two slices of the group
    two = _queue("gres:gpu:1g.10gb:2", *["gres:gpu:1g.10gb:1"] * 5)
    assert _groups(two, _rules(MIG)) == {(SharingMode.MIG, ()): 1}


def test_a_slice_is_folded_as_the_coarsest_pool_that_lists_its_profile_cuts_it() -> None:
    # both pools list 1g.10gb: seven of them are one GPU on either
    text = _queue(*["gres:gpu:1g.10gb:1"] * 7)
    assert _groups(text, _rules(MIG, MIG_COARSE)) == {(SharingMode.MIG, ()): 1}
    # only MIG lists 3g.40gb, so MIG_COARSE's profiles do not round the 3g slices up
    text = _queue(*["gres:gpu:3g.40gb:1"] * 4)
    assert _groups(text, _rules(MIG, MIG_COARSE)) == {(SharingMode.MIG, ()): 2}


def test_a_share_of_a_gpu_or_more_is_whole_gpus_of_a_mig_pool() -> None:
    text = _queue("gres:gpu:a100_7g.80gb:1", "gres:gpu:3g.40gb:3")
    pools = _rules(
        MIG.model_copy(
            update={
                "gpu_sharing": GpuSharing(mode=SharingMode.MIG, profiles=("3g.40gb", "7g.80gb"))
            }
        )
    )
    # 7/7 is a GPU; 9/7 are two GPUs
    assert sorted((g.gpus_per_job, g.jobs) for g in demand_groups(text, pools)) == [(1, 1), (2, 1)]
    assert all(g.gpu_sharing is SharingMode.MIG for g in demand_groups(text, pools))


def test_a_mig_job_no_pool_can_host_is_unmet_demand_counted_and_named(
    caplog: pytest.LogCaptureFixture,
) -> None:
    text = _queue("gres:gpu:a100_2g.20gb:1", "gres:gpu:a100_2g.20gb:1", "gres:gpu:1g.10gb:1")
    with caplog.at_level(logging.WARNING, logger="autoscaler.sources.slurm_json"):
        found = _groups(text, _rules(MIG, PLAIN, SLICED))
    unmet = NO_MIG.format(profile="2g.20gb")
    assert found == {(SharingMode.MIG, (unmet,)): 2, (SharingMode.MIG, ()): 1}
    assert (
        "2 pending shard or MIG job(s) no pool can host: job 100 asks 1 MIG 2g.20gb "
        "instance(s): gres/gpu:2g.20gb: no pool's GPUs are cut in MIG 2g.20gb instances; "
        "job 101 asks" in caplog.text
    )
    # no pool cuts its GPUs in MIG at all: every MIG job is unmet
    assert _groups(text, _rules(PLAIN, SLICED)) == {
        (SharingMode.MIG, (unmet,)): 2,
        (SharingMode.MIG, (NO_MIG.format(profile="1g.10gb"),)): 1,
    }


def test_before_the_pools_are_known_each_instance_counts_a_gpu() -> None:
    text = _queue("gres:gpu:1g.10gb:1", "gres:gpu:1g.10gb:2")
    assert _groups(text, DemandRules()) == {(SharingMode.MIG, ()): 3}


def test_a_mig_job_over_several_nodes_counts_a_gpu_per_node() -> None:
    document = json.loads(_queue("gres:gpu:1g.10gb:1"))
    document["jobs"][0]["node_count"] = 2
    groups = demand_groups(json.dumps(document), _rules(MIG))
    assert [(g.gpus_per_job, g.nodes, g.gpu_sharing) for g in groups] == [(2, 2, SharingMode.MIG)]


def test_running_mig_jobs_hold_a_gpu_and_their_instances_share_of_it() -> None:
    text = _running(
        j7=["gpu:a100_1g.10gb:1(IDX:0)"],
        j8=["gpu:a100_3g.40gb:2(IDX:1-2)"],
        j9=["gpu:a100_4g.40gb:2(IDX:3-4)"],
        j10=["gpu:a100:1(IDX:5)"],
    )
    running = {j.id: (j.gpus, j.gpu_share) for j in read_running_jobs(text, DemandRules())["gpu-a"]}
    assert running == {
        "7": (1, pytest.approx(1 / 7)),
        "8": (1, pytest.approx(6 / 7)),
        "9": (2, None),  # 8/7 of a GPU: two GPUs
        "10": (1, None),  # a whole GPU
    }
    # without a gres_detail, the request's profile and Slurm's count of instances
    document = json.loads(text)
    for job in document["jobs"]:
        job["gres_detail"] = []
    again = read_running_jobs(json.dumps(document), DemandRules())["gpu-a"]
    assert {j.id: (j.gpus, j.gpu_share) for j in again} == running


def test_a_node_of_mig_instances_counts_the_gpus_they_are_cut_from() -> None:
    """``sinfo`` as the captured 22.05 prints a typed node, with MIG types: gpu-a is one A100 cut
    in seven 1g.10gb instances (two in use) beside three whole A100s (one in use); gpu-b is the
    docs' example, a whole A100 and one cut in two 3g.20gb instances, none in use."""
    document = json.loads((DATA / "sinfo-shards.json").read_text())
    nodes = {n["name"]: n for n in document["nodes"]}
    nodes["gpu-a"].update(
        gres="gpu:a100:3,gpu:a100_1g.10gb:7",
        gres_used="gpu:a100:1(IDX:0),gpu:a100_1g.10gb:2(IDX:3-4)",
    )
    nodes["gpu-b"].update(
        gres="gpu:a100:1,gpu:a100_3g.20gb:2",
        gres_used="gpu:a100:0(IDX:N/A),gpu:a100_3g.20gb:0(IDX:N/A)",
    )
    nodes["dyn1"].update(gres="gpu:1g.10gb:14", gres_used="gpu:1g.10gb:3(IDX:0-2)")
    read = {
        n.name: (n.gpus, n.gpus_allocated, n.gpu_model)
        for n in read_nodes(json.dumps(document), NodeRules("gpu-autoscaler", {"a100": "A100"}))
    }
    assert read == {
        "gpu-a": (4, 2, "A100"),  # 3 whole + 1 cut; 1 whole in use + the cut one
        "gpu-b": (2, 0, "A100"),
        "dyn1": (2, 2, None),  # 14 sevenths; three instances may sit on both GPUs
    }


@settings(max_examples=60, deadline=None)
@given(
    ones=st.integers(0, 30),
    threes=st.integers(0, 12),
    coarse=st.booleans(),
)
def test_the_gpus_told_cover_the_slices_and_never_exceed_a_gpu_per_job(
    ones: int, threes: int, coarse: bool
) -> None:
    """Never fewer GPUs than the slices need, cut as the coarsest pool that lists each profile
    would; never more than a GPU per job."""
    requests = ["gres:gpu:1g.10gb:1"] * ones + ["gres:gpu:3g.40gb:1"] * threes
    if not requests:
        return
    pools = (MIG, MIG_COARSE) if coarse else (MIG,)
    groups: list[DemandGroup] = demand_groups(_queue(*requests), _rules(*pools))
    told = sum(g.gpus_per_job * g.jobs for g in groups)
    needed = Fraction(ones, 7) + Fraction(3 * threes, 7)
    assert needed <= told <= len(requests)
    assert told == -(-needed // 1)


# -- a real Slurm whose GPUs are typed as MIG instances -------------------------------------------

INSTANCE = "a100_1g.10gb"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    started = start_slurm_cluster(tmp_path_factory.mktemp("slurm-mig"), Layout(gpu_type=INSTANCE))
    try:
        yield started
    finally:
        stop_slurm_cluster(started)


@pytest.fixture
def slurm(cluster: SlurmCluster) -> Iterator[SlurmAdapter]:
    yield SlurmAdapter.from_config(
        {"slurm_conf": str(cluster.conf), "gpu_models": {"a100": "A100"}}, "hpc"
    )
    cluster.reset()


def _states(cluster: SlurmCluster, jobs: list[str]) -> dict[str, str]:
    out = cluster.run("squeue", "-h", "-j", ",".join(jobs), "-o", "%i %T %r")
    return {line.split()[0]: " ".join(line.split()[1:]) for line in out.splitlines()}


def test_pending_mig_jobs_of_a_real_slurm_are_folded_against_the_pools_that_cut_them(
    cluster: SlurmCluster, slurm: SlurmAdapter
) -> None:
    for node in cluster.onprem_nodes:
        cluster.run("scontrol", "update", f"nodename={node}", "state=drain", "reason=test")
    jobs = [cluster.sbatch(f"--gres=gpu:{INSTANCE}:1", "--wrap=sleep 60") for _ in range(7)]
    jobs.append(cluster.sbatch(f"--gres=gpu:{INSTANCE}:2", "--wrap=sleep 60"))
    wait_for(
        "every job to wait for a reason",
        lambda: (
            len(_states(cluster, jobs)) == len(jobs)
            and all(
                s.startswith("PENDING ") and "None" not in s
                for s in _states(cluster, jobs).values()
            )
        ),
    )
    printed = {j["tres_per_node"] for j in json.loads(cluster.run("squeue", "--json"))["jobs"]}
    assert printed == {f"gres:gpu:{INSTANCE}:1", f"gres:gpu:{INSTANCE}:2"}
    # the pools not known: each instance a GPU, as Slurm counts it
    assert sum(g.gpus_per_job * g.jobs for g in slurm.read(0.0)) == 9
    slurm.know_pools([MIG, PLAIN, SLICED])
    # 7 x 1/7 + 2/7 of a GPU: 2 GPUs of the pool cut in 1g.10gb, an A100 as the type says
    groups = list(slurm.read(0.0))
    assert [(g.gpus_per_job, g.jobs, g.gpu_sharing, g.gpu_models) for g in groups] == [
        (1, 2, SharingMode.MIG, ("A100",))
    ]
    three_only = MIG.model_copy(
        update={"gpu_sharing": GpuSharing(mode=SharingMode.MIG, profiles=("3g.40gb",))}
    )
    slurm.know_pools([three_only, PLAIN])
    assert _groups_of(list(slurm.read(0.0))) == {
        (SharingMode.MIG, (NO_MIG.format(profile="1g.10gb"),)): 8
    }


def _groups_of(groups: list[DemandGroup]) -> dict[tuple[SharingMode | None, tuple[str, ...]], int]:
    found: dict[tuple[SharingMode | None, tuple[str, ...]], int] = {}
    for group in groups:
        key = (group.gpu_sharing, group.gpu_models)
        found[key] = found.get(key, 0) + group.gpus_per_job * group.jobs
    return found


def test_running_mig_jobs_of_a_real_slurm_hold_their_share_and_the_gpu_it_is_cut_from(
    cluster: SlurmCluster, slurm: SlurmAdapter
) -> None:
    asked = (1, 2)
    on_a = ("-p", "onprem", "-w", "gpu-a")
    jobs = [cluster.sbatch(*on_a, f"--gres=gpu:{INSTANCE}:{n}", "--wrap=sleep 60") for n in asked]
    wait_for(
        "the jobs to run",
        lambda: all(s.startswith("RUNNING") for s in _states(cluster, jobs).values()),
    )
    running = {job.id: (job.gpus, job.gpu_share) for job in slurm.running_jobs("gpu-a")}
    assert running == {job: (1, pytest.approx(n / 7)) for job, n in zip(jobs, asked, strict=True)}
    # four instances of 1g.10gb are one GPU cut (4/7 of it), in use: no whole GPU's room
    nodes = {n.name: n for n in slurm.read_nodes(0.0).onprem}
    assert (nodes["gpu-a"].gpus, nodes["gpu-a"].gpus_allocated) == (1, 1)
    assert (nodes["gpu-b"].gpus, nodes["gpu-b"].gpus_allocated) == (1, 0)
    assert nodes["gpu-a"].gpu_model == "A100"
