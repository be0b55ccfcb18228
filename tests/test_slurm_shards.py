"""Slurm's GPU sharing (``gres/shard``) read live (issue 19, item 4): pending shard jobs are folded
into whole GPUs of the pools that share, running ones hold the GPUs their shards are on, a cloud
node of a sharing pool joins with shards and says the GPUs' worth its jobs hold, and gres strings
that are not Slurm's are one line naming the job or node and the field.

Against a real Slurm 22.05 of tests/slurm_cluster.py with eight shards per fake A100
(``Layout(shards_per_gpu=8)``), and against ``squeue-shards.json``/``sinfo-shards.json`` in
tests/data/slurm, captured from that cluster: four shard jobs and a whole-GPU job running on
gpu-a (2 and 3 shards on GPU 0, 8 on GPU 1, 5 on GPU 2, the GPU job on GPU 3), a 9-shard job
pending, and a dynamic cloud node joined with ``Gres=gpu:a100:4,shard:16``.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from slurm_cluster import (
    Layout,
    SlurmCluster,
    start_slurm_cluster,
    stop_pid_files,
    stop_slurm_cluster,
    wait_for,
)
from waits import bound

from autoscaler.app.assembly import joined_pools
from autoscaler.model import DemandGroup, Market, Pool
from autoscaler.model.config import ControllerConfig
from autoscaler.model.errors import InputError, SourceError
from autoscaler.model.sharing import GpuSharing, SharingMode
from autoscaler.sources.slurm import SlurmAdapter
from autoscaler.sources.slurm_join import join_environment, user_data
from autoscaler.sources.slurm_json import (
    DemandRules,
    demand_groups,
    read_nodes,
    read_running_jobs,
    shards_by_node,
)
from autoscaler.sources.slurm_shards import (
    NO_SHARDS,
    TOO_MANY_SHARDS,
    ShardSyntaxError,
    parse_shards,
    shard_pools,
)

DATA = Path(__file__).parent / "data" / "slurm"
JOIN_SCRIPT = Path(__file__).resolve().parent.parent / "autoscaler/data/slurm/join-cloud-node.sh"
SHARDS_PER_GPU = 8

PLAIN = Pool(
    name="aws-p4d",
    provider="aws",
    region="us-east-1",
    instance_type="p4d.24xlarge",
    gpus_per_instance=8,
    gpu_model="A100",
    market=Market.ON_DEMAND,
)
SLICED = PLAIN.model_copy(
    update={
        "name": "aws-p4d-sliced",
        "gpu_sharing": GpuSharing(mode=SharingMode.TIME_SLICING, replicas=4),
    }
)
MIG = PLAIN.model_copy(
    update={
        "name": "aws-p4d-mig",
        "gpu_sharing": GpuSharing(mode=SharingMode.MIG, profiles=("1g.5gb", "3g.20gb")),
    }
)


def _pools(*pools: Pool) -> DemandRules:
    return DemandRules(shard_pools=shard_pools([p.gpu_sharing for p in pools]))


def _by_models(groups: list[DemandGroup]) -> dict[tuple[str, ...], int]:
    found: dict[tuple[str, ...], int] = {}
    for group in groups:
        assert group.gpus_per_job == 1
        found[group.gpu_models] = found.get(group.gpu_models, 0) + group.jobs
    return found


# -- the captured output -----------------------------------------------------------------------


def test_the_captured_nodes_count_the_gpus_shards_are_on() -> None:
    nodes = {
        n.name: n for n in read_nodes((DATA / "sinfo-shards.json").read_text(), "gpu-autoscaler")
    }
    # GresUsed gpu:a100:1(IDX:3),shard:a100:3(IDX:0-2): the GPU job's GPU and three GPUs with
    # shards on them, none of which a whole-GPU job can have
    assert (nodes["gpu-a"].gpus, nodes["gpu-a"].gpus_allocated) == (4, 4)
    assert (nodes["gpu-a"].shards, nodes["gpu-a"].shard_gpus) == (32, 3)
    assert (nodes["gpu-b"].gpus_allocated, nodes["gpu-b"].shard_gpus) == (0, 0)
    assert nodes["dyn1"].cloud and nodes["dyn1"].shards == 16


def test_the_captured_running_shard_jobs_hold_one_gpu_each_and_their_shards_share() -> None:
    text = (DATA / "squeue-shards.json").read_text()
    running = {job.id: job.gpus for job in read_running_jobs(text, DemandRules())["gpu-a"]}
    assert running == {"1": 1, "2": 1, "3": 1, "4": 1, "5": 1}
    # the node's shards not known: the share is unknown, the GPU counted whole
    assert all(job.gpu_share is None for job in read_running_jobs(text, DemandRules())["gpu-a"])
    shared = read_running_jobs(text, DemandRules(), {"gpu-a": (32, 4)})["gpu-a"]
    assert {job.id: job.gpu_share for job in shared} == {
        "1": 0.25,
        "2": 0.375,
        "3": 1.0,
        "4": 0.625,
        "5": None,  # the whole-GPU job
    }
    assert sum(job.gpus_held for job in shared) == 1 + 18 / 8
    # 2 + 3 + 8 + 5 shards: what 22.05's GresUsed (shard:a100:3) does not say
    assert shards_by_node(text, frozenset({"gpu-a", "gpu-b"})) == {"gpu-a": 18}


def test_the_captured_pending_shard_job_is_demand_as_the_pools_allow() -> None:
    text = (DATA / "squeue-shards.json").read_text()
    # pools unknown: one GPU, as without sharing
    assert _by_models(demand_groups(text, DemandRules())) == {(): 1}
    # nine shards of one GPU: no 4-replica pool can host it
    assert _by_models(demand_groups(text, _pools(SLICED, PLAIN))) == {
        (TOO_MANY_SHARDS.format(most=4),): 1
    }
    assert _by_models(demand_groups(text, _pools(PLAIN, MIG))) == {(NO_SHARDS,): 1}
    sixteen = SLICED.model_copy(
        update={"gpu_sharing": GpuSharing(mode=SharingMode.TIME_SLICING, replicas=16)}
    )
    assert _by_models(demand_groups(text, _pools(sixteen))) == {(): 1}


def _document(name: str, edit: dict[str, Any], key: str = "jobs") -> str:
    document = json.loads((DATA / name).read_text())
    for item in document[key]:
        ident = item.get("job_id", item.get("name"))
        item.update(edit.get(str(ident), {}))
    return json.dumps(document)


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        ({"6": {"tres_per_node": "gres:shard:²"}}, r"job 6: tres_per_node 'gres:shard:²'"),
        ({"6": {"tres_per_node": "gres:shard:a:b:4"}}, r"job 6: tres_per_node .* shard count"),
        ({"6": {"tres_per_node": "gres:shard:a100:-4"}}, r"job 6: tres_per_node .* shard count"),
        ({"6": {"tres_per_job": "gres:shard:" + "9" * 30}}, r"job 6: tres_per_job .* count"),
    ],
)
def test_a_malformed_shard_request_is_one_line_naming_the_job(
    edit: dict[str, Any], message: str
) -> None:
    with pytest.raises(SourceError, match=rf"^squeue --json: {message}"):
        demand_groups(_document("squeue-shards.json", edit), _pools(SLICED))


@pytest.mark.parametrize(
    "detail",
    ["shard:x(IDX:0)", "shard:2(IDX:0", "shard:2(IDX:2-0)", "shard:2(IDX:a)", "shard:2(0)"],
)
def test_a_malformed_shard_allocation_is_one_line_naming_the_job(detail: str) -> None:
    text = _document("squeue-shards.json", {"1": {"gres_detail": [detail]}})
    with pytest.raises(SourceError, match=r"^squeue --json: job 1: gres_detail "):
        read_running_jobs(text, DemandRules())
    with pytest.raises(SourceError, match=r"^squeue --json: job 1: gres_detail "):
        shards_by_node(text, frozenset({"gpu-a"}))


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        ({"gres": "gpu:a100:4,shard:a100:x"}, r"node gpu-a: gres: 'shard:a100:x'"),
        ({"gres_used": "gpu:a100:1(IDX:3),shard:a100:3(IDX:0-)"}, r"node gpu-a: gres: .*index"),
        ({"gres": "shard:32"}, r"node gpu-a: gres 'shard:32': shards without GPUs"),
        (
            {"gres_used": "gpu:a100:0(IDX:N/A),shard:a100:5(IDX:0-4)"},
            r"node gpu-a: gres_used .*: shards on more GPUs than it has",
        ),
    ],
)
def test_malformed_node_shards_are_one_line_naming_the_node(
    edit: dict[str, Any], message: str
) -> None:
    text = _document("sinfo-shards.json", {"gpu-a": edit}, key="nodes")
    with pytest.raises(SourceError, match=rf"^sinfo --json: {message}"):
        read_nodes(text, "gpu-autoscaler")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("gres:shard:2", (2, None)),
        ("gres/shard:4", (4, None)),
        ("shard", (1, None)),
        ("gpu:a100:4,shard:a100:32", (32, None)),
        ("gpu:a100:1(IDX:3),shard:a100:3(IDX:0-2)", (3, 3)),
        ("shard:a100:0(IDX:N/A)", (0, None)),
        ("shard:5(IDX:0,2-3)", (5, 3)),
        ("gres:gpu:2", (0, None)),
    ],
)
def test_shards_in_gres_strings(text: str, expected: tuple[int, int | None]) -> None:
    assert parse_shards(text) == expected


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.sampled_from("shardgpu:a10(IDX:N/A)-,²9 "), max_size=40))
def test_any_gres_string_reads_or_is_refused_by_name(text: str) -> None:
    try:
        shards, gpus = parse_shards(text)
    except ShardSyntaxError as exc:
        assert str(exc)
    else:
        assert shards >= 0 and (gpus is None or gpus >= 1)


def _shard_job(job_id: int, shards: int, **fields: Any) -> dict[str, Any]:
    return {
        "job_id": job_id,
        "job_state": "PENDING",
        "state_reason": "Resources",
        "partition": "gpu",
        "tres_per_node": f"gres:shard:{shards}" if shards else "gres:gpu:1",
        "node_count": 1,
        "submit_time": 1_700_000_000 + job_id,
        **fields,
    }


@settings(max_examples=300, deadline=None)
@given(
    replicas=st.integers(2, 64),
    asked=st.lists(st.integers(1, 64), max_size=40),
    whole=st.integers(0, 3),
)
def test_pending_shards_fold_into_the_fewest_whole_gpus_that_hold_them(
    replicas: int, asked: list[int], whole: int
) -> None:
    """N shards of a pool with R per GPU are N/R of a GPU, summed and rounded up once; a job
    asking more than R is unhostable, one asking R is a whole GPU."""
    pool = SLICED.model_copy(
        update={"gpu_sharing": GpuSharing(mode=SharingMode.TIME_SLICING, replicas=replicas)}
    )
    jobs = [_shard_job(i, n) for i, n in enumerate(asked)]
    jobs += [_shard_job(100 + i, 0) for i in range(whole)]
    groups = demand_groups(json.dumps({"jobs": jobs}), _pools(pool))
    fits = [n for n in asked if n < replicas]
    expected: dict[tuple[str, ...], int] = {
        (): whole + asked.count(replicas) - (-sum(fits) // replicas)
    }
    too_many = sum(1 for n in asked if n > replicas)
    if too_many:
        expected[(TOO_MANY_SHARDS.format(most=replicas),)] = too_many
    assert _by_models(groups) == {k: v for k, v in expected.items() if v}


def test_multi_node_and_per_task_shard_jobs() -> None:
    jobs = [
        _shard_job(1, 2, node_count=2),  # two nodes: a GPU on each
        _shard_job(2, 0, tres_per_node="", tres_per_task="gres:shard:1", tasks=3),  # 3 of a GPU
        _shard_job(3, 0, tres_per_node="", tres_per_job="gres:shard:1"),
    ]
    groups = demand_groups(json.dumps({"jobs": jobs}), _pools(SLICED))
    shapes = {(g.gpus_per_job, g.nodes): g.jobs for g in groups}
    assert shapes == {(2, 2): 1, (1, 1): 1}  # 3/4 + 1/4 of a GPU: one GPU


# -- the join script ---------------------------------------------------------------------------


def _join(env: dict[str, str], tmp_path: Path) -> tuple[int, str, str]:
    recorder = tmp_path / "slurmd"
    recorded = tmp_path / "slurmd-args"
    recorder.write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > {recorded}\n')
    recorder.chmod(0o755)
    done = subprocess.run(
        ["sh", str(JOIN_SCRIPT)],
        env={"PATH": "/usr/bin:/bin", "GPU_AUTOSCALER_SLURMD": str(recorder), **env},
        capture_output=True,
        text=True,
        timeout=bound(60),
        check=False,
    )
    return done.returncode, recorded.read_text() if recorded.exists() else "", done.stderr


def _gres(args: str) -> str:
    conf = args.splitlines()[args.splitlines().index("--conf") + 1]
    return next(w for w in conf.split() if w.startswith("Gres=")).removeprefix("Gres=")


def test_a_time_sliced_pool_joins_with_its_replicas_as_shards(tmp_path: Path) -> None:
    assert "export GPU_AUTOSCALER_SHARDS=4\n" in user_data(SLICED, gpu_type="a100")
    for pool, gres in ((SLICED, "gpu:a100:4,shard:16"), (MIG, "gpu:a100:4"), (PLAIN, "gpu:a100:4")):
        env = {
            **join_environment(pool, gpu_type="a100"),
            "GPU_AUTOSCALER_NODE_NAME": "i-0abc",
            "GPU_AUTOSCALER_GPUS": "4",
        }
        status, args, stderr = _join(env, tmp_path)
        assert status == 0, stderr
        assert _gres(args) == gres
    for bad in ("0", "x", "-4", "08"):
        status, _, stderr = _join(
            {
                "GPU_AUTOSCALER_NODE_NAME": "i-0abc",
                "GPU_AUTOSCALER_GPUS": "4",
                "GPU_AUTOSCALER_SHARDS": bad,
            },
            tmp_path,
        )
        assert status == 1
        assert f"GPU_AUTOSCALER_SHARDS '{bad}' is not a number of shards per GPU" in stderr
    with pytest.raises(InputError, match="_SHARDS is set for each pool by the adapter"):
        SlurmAdapter.from_config(
            {"join_user_data": True, "join_environment": {"GPU_AUTOSCALER_SHARDS": "4"}}, "hpc"
        )


def _hosts(slurm: SlurmAdapter) -> tuple[GpuSharing, ...] | None:
    return slurm.rules.shard_pools


def test_the_assembly_tells_the_adapter_which_pools_have_shards() -> None:
    """The config's pools reach the adapter (``KnowsPools``) and each time-slicing pool's boot
    script joins its nodes with shards; the MIG pool's slices are gres types (the adapter knows
    it too, for MIG demand); a pool that does not join Slurm has none for it."""
    workers = SLICED.model_copy(update={"name": "workers", "joins_scheduler": False})
    config = ControllerConfig(fleet_id="shards", pools=(SLICED, PLAIN, MIG, workers))
    slurm = SlurmAdapter.from_config({"join_user_data": True}, "hpc")
    scripts = {p.name: p.user_data or "" for p in joined_pools(config, slurm)}
    assert _hosts(slurm) == (SLICED.gpu_sharing, MIG.gpu_sharing)
    assert "export GPU_AUTOSCALER_SHARDS=4\n" in scripts["aws-p4d-sliced"]
    assert not any(
        "export GPU_AUTOSCALER_SHARDS" in scripts[name]
        for name in ("aws-p4d", "aws-p4d-mig", "workers")
    )
    only_plain = ControllerConfig(fleet_id="shards", pools=(PLAIN, workers))
    joined_pools(only_plain, slurm)
    assert _hosts(slurm) == ()


# -- a real Slurm with shards --------------------------------------------------------------------


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    started = start_slurm_cluster(
        tmp_path_factory.mktemp("slurm-shards"), Layout(shards_per_gpu=SHARDS_PER_GPU)
    )
    try:
        yield started
    finally:
        stop_slurm_cluster(started)


@pytest.fixture
def slurm(cluster: SlurmCluster) -> Iterator[SlurmAdapter]:
    yield SlurmAdapter.from_config({"slurm_conf": str(cluster.conf)}, "hpc")
    cluster.reset()


def _states(cluster: SlurmCluster, jobs: list[str]) -> dict[str, str]:
    out = cluster.run("squeue", "-h", "-j", ",".join(jobs), "-o", "%i %T %r")
    return {line.split()[0]: " ".join(line.split()[1:]) for line in out.splitlines()}


def test_pending_shard_jobs_are_folded_into_whole_gpus_of_the_pools_that_share(
    cluster: SlurmCluster, slurm: SlurmAdapter
) -> None:
    for node in cluster.onprem_nodes:
        cluster.run("scontrol", "update", f"nodename={node}", "state=drain", "reason=test")
    jobs = [cluster.sbatch("--gres=shard:1", "--wrap=sleep 60") for _ in range(5)]
    jobs += [cluster.sbatch("--gres=shard:2", "--wrap=sleep 60") for _ in range(3)]
    jobs.append(cluster.sbatch("--gres=gpu:1", "--wrap=sleep 60"))
    jobs.append(cluster.sbatch("--gres=shard:9", "--wrap=sleep 60"))
    wait_for(
        "every job to wait for a reason",
        lambda: (
            all(
                s.startswith("PENDING ") and "None" not in s
                for s in _states(cluster, jobs).values()
            )
            and len(_states(cluster, jobs)) == len(jobs)
        ),
    )
    # the pools not known yet: a GPU each, as without sharing
    assert _by_models(list(slurm.read(0.0))) == {(): 10}
    slurm.know_pools([SLICED, PLAIN, MIG])
    # 5 x 1/4 + 3 x 2/4 of a GPU are 3 GPUs, beside the whole-GPU job; 9 shards fit no pool
    assert _by_models(list(slurm.read(0.0))) == {(): 4, (TOO_MANY_SHARDS.format(most=4),): 1}
    slurm.know_pools([PLAIN, MIG])
    assert _by_models(list(slurm.read(0.0))) == {(): 1, (NO_SHARDS,): 9}


def test_running_shard_jobs_hold_the_gpus_their_shards_are_on(
    cluster: SlurmCluster, slurm: SlurmAdapter
) -> None:
    asked = (2, 3, 8, 5)
    jobs = [
        cluster.sbatch("-p", "onprem", "-w", "gpu-a", f"--gres=shard:{n}", "--wrap=sleep 60")
        for n in asked
    ]
    whole = cluster.sbatch("-p", "onprem", "-w", "gpu-a", "--gres=gpu:1", "--wrap=sleep 60")
    wait_for(
        "the jobs to run",
        lambda: all(s.startswith("RUNNING") for s in _states(cluster, [*jobs, whole]).values()),
    )
    details = json.loads(cluster.run("squeue", "--json"))["jobs"]
    shard_gpus = {
        d["gres_detail"][0].split("IDX:")[1].rstrip(")")
        for d in details
        if str(d["job_id"]) in jobs
    }
    node = next(n for n in slurm.read_nodes(0.0).onprem if n.name == "gpu-a")
    assert node.gpus_allocated == 1 + len(shard_gpus)
    running = {job.id: (job.gpus, job.gpu_share) for job in slurm.running_jobs("gpu-a")}
    assert running == {
        **{job: (1, n / SHARDS_PER_GPU) for job, n in zip(jobs, asked, strict=True)},
        whole: (1, None),
    }


def test_a_cloud_node_of_a_sharing_pool_says_the_gpus_worth_its_shard_jobs_hold(
    cluster: SlurmCluster, slurm: SlurmAdapter
) -> None:
    instance_id = f"i-0shards{os.getpid()}"
    joined = subprocess.run(
        ["sh", str(JOIN_SCRIPT)],
        env={
            **cluster.env,
            **join_environment(SLICED, cluster.cloud_feature, cluster.gpu_model),
            "GPU_AUTOSCALER_NODE_NAME": instance_id,
            "GPU_AUTOSCALER_GPUS": "4",
            "GPU_AUTOSCALER_NODE_CONF": "CPUs=8 RealMemory=4000",
        },
        capture_output=True,
        text=True,
        timeout=bound(60),
        check=False,
    )
    assert joined.returncode == 0, joined.stderr
    try:
        wait_for("the cloud node to register", lambda: instance_id in slurm.read_nodes(0.0).cloud)
        assert "shard" in cluster.node_field(instance_id, "Gres")
        empty = slurm.read_nodes(0.0).cloud[instance_id]
        assert (empty.gpus_allocated, empty.gpus_held) == (0, 0.0)
        jobs = [
            cluster.sbatch(
                f"--constraint={cluster.cloud_feature}", f"--gres=shard:{n}", "--wrap=sleep 60"
            )
            for n in (1, 2)
        ]
        wait_for(
            "the shard jobs to run on the cloud node",
            lambda: all(s.startswith("RUNNING") for s in _states(cluster, jobs).values()),
        )
        busy = slurm.read_nodes(0.0).cloud[instance_id]
        # 16 shards over 4 GPUs: 3 shards are three quarters of a GPU, on one or two GPUs
        assert busy.gpus_held == 0.75
        assert busy.gpus_allocated in (1, 2)
        cluster.run("scancel", *jobs)
        wait_for("the shard jobs to end", lambda: not _states(cluster, jobs))
        slurm.forget(instance_id)
    finally:
        stop_pid_files([cluster.root / f"slurmd-{instance_id}.pid"])
    assert instance_id not in slurm.read_nodes(time.time()).cloud
