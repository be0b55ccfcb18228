"""The Slurm adapter against a real Slurm 22.05 (tests/slurm_cluster.py): demand from real pending
jobs, nodes and allocation, drain/resume, evict, signals, a cloud node that joins through the
boot script and is forgotten, and broken commands at the subprocess boundary."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from slurm_cluster import SlurmCluster, stop_pid_files, wait_for
from waits import bound

from autoscaler.model import OnPremUse, Placement
from autoscaler.model.errors import InputError, SourceError
from autoscaler.sources.slurm import SlurmAdapter
from autoscaler.spi.sources import NodeSource, QueueSource, WorkloadScheduler

JOIN_SCRIPT = Path(__file__).resolve().parent.parent / "autoscaler/data/slurm/join-cloud-node.sh"
AdapterFactory = Callable[..., SlurmAdapter]


@pytest.fixture
def adapter(slurm_cluster: SlurmCluster) -> Iterator[AdapterFactory]:
    """Adapters on the shared cluster; afterwards no job is left and every on-prem node is idle."""

    def make(**settings: Any) -> SlurmAdapter:
        return SlurmAdapter.from_config({"slurm_conf": str(slurm_cluster.conf), **settings}, "hpc")

    yield make
    slurm_cluster.reset()


def _drain_onprem(cluster: SlurmCluster) -> None:
    for node in cluster.onprem_nodes:
        cluster.run("scontrol", "update", f"nodename={node}", "state=drain", "reason=test")


def _running(cluster: SlurmCluster, job_id: str) -> bool:
    return cluster.job_field(job_id, "JobState") == "RUNNING"


def test_the_adapter_plays_all_three_roles(adapter: AdapterFactory) -> None:
    slurm = adapter()
    assert isinstance(slurm, QueueSource)
    assert isinstance(slurm, NodeSource)
    assert isinstance(slurm, WorkloadScheduler)


def test_settings_errors_name_the_field() -> None:
    with pytest.raises(InputError, match=r"sources\.hpc\.command_timeout_s"):
        SlurmAdapter.from_config({"command_timeout_s": 0}, "hpc")
    with pytest.raises(InputError, match=r"sources\.hpc\.bin_dir"):
        SlurmAdapter.from_config({"bin_dir": "relative/bin"}, "hpc")
    with pytest.raises(InputError, match=r"sources\.hpc\.feature_gpu_memory_gib\.gpu80g"):
        SlurmAdapter.from_config({"feature_gpu_memory_gib": {"gpu80g": -80}}, "hpc")


def test_pending_gpu_jobs_become_demand_groups(
    adapter: AdapterFactory, slurm_cluster: SlurmCluster
) -> None:
    _drain_onprem(slurm_cluster)
    before = time.time()
    for _ in range(2):
        slurm_cluster.sbatch("--gres=gpu:2", "--wrap", "sleep 60")
    slurm_cluster.sbatch(
        "-p",
        "onprem",
        "--gres=gpu:a100:4",
        "--comment=checkpoint_interval=600 checkpoint_duration=30",
        "--wrap",
        "sleep 60",
    )
    slurm_cluster.sbatch("--gpus=2", "--priority=100000", "--wrap", "sleep 60")
    slurm_cluster.sbatch("--array=0-5%4", "--gpus-per-task=1", "-n", "2", "--wrap", "sleep 60")
    slurm_cluster.sbatch("--wrap", "sleep 60")
    slurm_cluster.sbatch("--hold", "--gres=gpu:1", "--wrap", "sleep 60")
    after = time.time()

    groups = adapter(high_priority_min=1000, gpu_models={"a100": "A100"}).read(after)

    shapes = {
        (
            g.gpus_per_job,
            g.jobs,
            g.checkpoint_interval_s,
            g.high_priority,
            g.gpu_models,
            g.partition,
        )
        for g in groups
    }
    assert shapes == {
        (2, 2 + 4, None, False, (), "gpu"),
        (2, 1, None, True, (), "gpu"),
        (4, 1, 600.0, False, ("A100",), "onprem"),
    }
    assert sum(g.gpus for g in groups) == 2 * 2 + 2 + 4 * 2 + 4
    assert all(int(before) <= g.oldest_submit_time <= after for g in groups)

    counted_held = adapter(ignored_reasons=[]).read(after)
    assert sum(g.jobs for g in counted_held) == sum(g.jobs for g in groups) + 1
    only_onprem = adapter(partitions=["onprem"]).read(after)
    assert [(g.gpus_per_job, g.jobs, g.partition) for g in only_onprem] == [(4, 1, "onprem")]


@pytest.fixture
def featured_nodes(slurm_cluster: SlurmCluster) -> Iterator[None]:
    """gpu-a carries the features ``a100,gpu80g`` and gpu-b ``h100,nvlink`` for the test (Slurm
    refuses a constraint no node has); afterwards neither has any."""
    features = {"gpu-a": "a100,gpu80g", "gpu-b": "h100,nvlink"}
    try:
        for node, names in features.items():
            slurm_cluster.run(
                "scontrol",
                "update",
                f"nodename={node}",
                f"AvailableFeatures={names}",
                f"ActiveFeatures={names}",
            )
        yield
    finally:
        slurm_cluster.run(
            "scontrol",
            "update",
            f"nodename={','.join(features)}",
            "AvailableFeatures=",
            "ActiveFeatures=",
        )


SHAPE_SETTINGS: dict[str, Any] = {
    "gpu_models": {"a100": "A100"},
    "feature_gpu_models": {"a100": "A100", "h100": "H100"},
    "feature_gpu_memory_gib": {"gpu80g": 80},
}


def test_multi_node_typed_and_constrained_jobs_carry_their_shapes(
    adapter: AdapterFactory, slurm_cluster: SlurmCluster, featured_nodes: None
) -> None:
    _drain_onprem(slurm_cluster)
    submitted = {
        "gang": ("--nodes=2", "--gres=gpu:2"),
        "spread": ("-N", "2", "--gpus=6"),
        "typed": ("--nodes=2-4", "--gres=gpu:a100:1"),
        "bigger than the partition": ("-N", "3", "--gres=gpu:a100:4"),
        "either model": ("--gres=gpu:1", "--constraint=a100|h100"),
        "memory": ("--gres=gpu:1", "--constraint=[a100|h100]&gpu80g"),
        "untyped feature": ("--gres=gpu:1", "--constraint=nvlink"),
    }
    ids = {
        name: slurm_cluster.sbatch(*args, "--wrap", "sleep 60") for name, args in submitted.items()
    }
    wait_for(
        "the 3-node job to wait for its partition to grow",
        lambda: (
            slurm_cluster.job_field(ids["bigger than the partition"], "Reason")
            == "PartitionNodeLimit"
        ),
    )

    groups = adapter(**SHAPE_SETTINGS).read(time.time())

    shapes = {(g.gpus_per_job, g.nodes, g.gpu_models, g.min_gpu_memory_gib, g.jobs) for g in groups}
    assert shapes == {
        (4, 2, (), None, 1),
        (6, 2, (), None, 1),
        (2, 2, ("A100",), None, 1),
        (12, 3, ("A100",), None, 1),
        (1, 1, ("A100", "H100"), None, 1),
        (1, 1, ("A100", "H100"), 80.0, 1),
        (1, 1, (), None, 1),
    }
    assert all(g.gpus_per_node * g.nodes == g.gpus_per_job for g in groups)
    gang = next(g for g in groups if g.gpus_per_job == 12)
    assert gang.shape.describe() == "4 GPU(s) of A100"
    limited = adapter(**SHAPE_SETTINGS, ignored_reasons=["PartitionNodeLimit"]).read(time.time())
    assert {g.nodes for g in limited} == {1, 2}, "a site may still ignore the reason"
    plain = adapter(gpu_models={"a100": "A100"}).read(time.time())
    assert {(g.gpu_models, g.min_gpu_memory_gib) for g in plain} == {((), None), (("A100",), None)}


def test_onprem_nodes_carry_gpu_memory_from_their_features(
    adapter: AdapterFactory, featured_nodes: None
) -> None:
    nodes = {n.name: n for n in adapter(**SHAPE_SETTINGS).read_nodes(time.time()).onprem}
    assert (nodes["gpu-a"].gpu_model, nodes["gpu-a"].gpu_memory_gib) == ("A100", 80.0)
    assert (nodes["gpu-b"].gpu_model, nodes["gpu-b"].gpu_memory_gib) == ("A100", None)


def test_onprem_nodes_report_gpus_allocation_and_state(
    adapter: AdapterFactory, slurm_cluster: SlurmCluster
) -> None:
    job = slurm_cluster.sbatch("-w", "gpu-a", "--gres=gpu:3", "--wrap", "sleep 60")
    wait_for("the job to run", lambda: _running(slurm_cluster, job))
    slurm = adapter(gpu_models={"a100": "A100"})

    reading = slurm.read_nodes(time.time())

    nodes = {n.name: n for n in reading.onprem}
    assert set(nodes) == {"gpu-a", "gpu-b"}
    assert (nodes["gpu-a"].gpus, nodes["gpu-a"].gpus_allocated) == (4, 3)
    assert (nodes["gpu-b"].gpus, nodes["gpu-b"].gpus_allocated) == (4, 0)
    assert all(n.gpu_model == "A100" and n.schedulable for n in nodes.values())
    assert reading.cloud == {}


def test_drain_counts_running_jobs_and_resume_reopens(
    adapter: AdapterFactory, slurm_cluster: SlurmCluster
) -> None:
    job = slurm_cluster.sbatch("-w", "gpu-a", "--gres=gpu:1", "--wrap", "sleep 60")
    wait_for("the job to run", lambda: _running(slurm_cluster, job))
    slurm = adapter()

    assert slurm.drain("gpu-a", "scale-down test") == 1
    assert slurm.drain("gpu-b", "scale-down test") == 0

    assert "DRAIN" in slurm_cluster.node_field("gpu-a", "State")
    nodes = {n.name: n for n in slurm.read_nodes(time.time()).onprem}
    assert not nodes["gpu-a"].schedulable and nodes["gpu-a"].gpus_free == 0
    slurm.resume("gpu-a")
    wait_for(
        "gpu-a to answer the controller's ping after resume",
        lambda: {n.name: n for n in slurm.read_nodes(time.time()).onprem}["gpu-a"].schedulable,
    )


def test_evict_and_requeue_put_jobs_back_in_the_queue(
    adapter: AdapterFactory, slurm_cluster: SlurmCluster
) -> None:
    first = slurm_cluster.sbatch("-w", "gpu-b", "--gres=gpu:1", "--wrap", "sleep 60")
    second = slurm_cluster.sbatch("-w", "gpu-b", "--gres=gpu:1", "--wrap", "sleep 60")
    wait_for(
        "both jobs to run",
        lambda: _running(slurm_cluster, first) and _running(slurm_cluster, second),
    )
    slurm = adapter()

    slurm.drain("gpu-b", "going away")
    assert slurm.evict("gpu-b", "drain timed out") == 2

    wait_for(
        "both jobs to be pending again",
        lambda: all(slurm_cluster.job_field(j, "JobState") == "PENDING" for j in (first, second)),
    )
    assert [slurm_cluster.job_field(j, "Restarts") for j in (first, second)] == ["1", "1"]
    with pytest.raises(
        SourceError, match=r"scontrol requeue 999999: exit status 1: .*[Ii]nvalid job id"
    ):
        slurm.requeue("999999")


def test_signal_reaches_the_batch_script(
    adapter: AdapterFactory, slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    ready, got = tmp_path / "ready", tmp_path / "got"
    script = tmp_path / "job.sh"
    script.write_text(
        "#!/bin/bash\n"
        f"trap 'echo checkpoint > {got}' USR1\n"
        f"touch {ready}\n"
        "for i in $(seq 600); do sleep 0.1 & wait $!; done\n"
    )
    job = slurm_cluster.sbatch("--gres=gpu:1", str(script))
    wait_for("the batch script to set its trap", ready.exists)

    adapter().signal(job, "USR1")

    # The shell creates the file before it writes the line: wait for a whole line, not the file.
    wait_for("the trap to write its line", lambda: got.exists() and got.read_text().endswith("\n"))
    assert got.read_text() == "checkpoint\n"
    with pytest.raises(SourceError, match="is not a signal name"):
        adapter().signal(job, "USR1; rm -rf /")


def test_a_cloud_node_joins_by_instance_id_runs_work_and_is_forgotten(
    adapter: AdapterFactory, slurm_cluster: SlurmCluster
) -> None:
    instance_id = f"i-0test{os.getpid()}"
    joined = subprocess.run(
        ["sh", str(JOIN_SCRIPT)],
        env={
            **slurm_cluster.env,
            "GPU_AUTOSCALER_NODE_NAME": instance_id,
            "GPU_AUTOSCALER_GPUS": "4",
            "GPU_AUTOSCALER_GPU_TYPE": slurm_cluster.gpu_model,
            "GPU_AUTOSCALER_NODE_CONF": "CPUs=8 RealMemory=4000",
        },
        capture_output=True,
        text=True,
        timeout=bound(60),
        check=False,
    )
    assert joined.returncode == 0, joined.stderr
    pid_file = slurm_cluster.root / f"slurmd-{instance_id}.pid"
    try:
        watcher = adapter()
        wait_for(
            "the cloud node to register",
            lambda: instance_id in watcher.read_nodes(time.time()).cloud,
        )
        slurm = adapter()
        first = slurm.read_nodes(100.0)
        assert first.cloud[instance_id].gpus_allocated == 0
        assert first.cloud[instance_id].empty_since == 100.0
        assert slurm.read_nodes(150.0).cloud[instance_id].empty_since == 100.0
        assert instance_id not in {n.name for n in first.onprem}

        slurm.apply_placement(Placement(spot_safe_onprem=OnPremUse.FIRST))
        assert slurm_cluster.node_field(instance_id, "Weight") == "1000"
        slurm.apply_placement(Placement(spot_safe_onprem=OnPremUse.AFTER_CLOUD))
        assert slurm_cluster.node_field(instance_id, "Weight") == "0"

        job = slurm_cluster.sbatch(
            f"--constraint={slurm_cluster.cloud_feature}", "--gres=gpu:2", "--wrap", "sleep 60"
        )
        wait_for("the job to run on the cloud node", lambda: _running(slurm_cluster, job))
        assert slurm_cluster.job_field(job, "NodeList") == instance_id
        busy = slurm.read_nodes(200.0).cloud[instance_id]
        assert (busy.gpus_allocated, busy.empty_since) == (2, None)

        slurm.forget(instance_id)

        assert instance_id not in slurm_cluster.run("sinfo", "-h", "-N", "-o", "%N")
        assert instance_id not in slurm.read_nodes(300.0).cloud
        wait_for(
            "the job to be requeued",
            lambda: slurm_cluster.job_field(job, "JobState") == "PENDING",
        )
        slurm.forget(instance_id)
    finally:
        stop_pid_files([pid_file])


@pytest.fixture
def fake_bin(tmp_path: Path) -> Callable[[str, str], SlurmAdapter]:
    """An adapter whose ``squeue`` is a script of the test's choosing: the real process boundary,
    without a cluster to break."""

    def install(command: str, body: str) -> SlurmAdapter:
        script = tmp_path / command
        script.write_text("#!/bin/sh\n" + body)
        script.chmod(0o755)
        return SlurmAdapter.from_config({"bin_dir": str(tmp_path), "command_timeout_s": 0.5}, "hpc")

    return install


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("echo 'slurm_load_jobs error: Unable to contact slurm controller'\n", "not JSON"),
        (
            "echo 'squeue: error: Invalid user: nobody' >&2\nexit 1\n",
            r"^squeue --json: exit status 1: squeue: error: Invalid user: nobody$",
        ),
        ("exec sleep 5\n", r"^squeue --json: no answer within 0.5s$"),
        ('echo \'{"meta": {}, "errors": []}\'\n', r"^squeue --json: output has no 'jobs' list$"),
        (
            'echo \'{"errors": [{"error": "Unable to contact slurm controller"}], "jobs": []}\'\n',
            "Slurm reported an error: Unable to contact slurm controller",
        ),
        (
            'echo \'{"jobs": [{"job_id": 7, "job_state": "PENDING", "state_reason": "Priority",'
            ' "partition": "gpu", "tres_per_node": "gres:gpu:a100:two", "submit_time": 1}]}\'\n',
            r"^squeue --json: job 7: tres_per_node 'gres:gpu:a100:two' is not a GPU count$",
        ),
    ],
)
def test_a_broken_squeue_is_one_clear_source_error(
    fake_bin: Callable[[str, str], SlurmAdapter], body: str, message: str
) -> None:
    slurm = fake_bin("squeue", body)
    with pytest.raises(SourceError, match=message) as raised:
        slurm.read(0.0)
    assert "\n" not in str(raised.value)


def test_a_missing_command_is_named(fake_bin: Callable[[str, str], SlurmAdapter]) -> None:
    slurm = fake_bin("squeue", "exit 0\n")
    with pytest.raises(SourceError, match=r"^sinfo: not found \(.*/sinfo\)$"):
        slurm.read_nodes(0.0)


def test_many_nodes_are_drained_in_one_command(
    adapter: AdapterFactory, slurm_cluster: SlurmCluster
) -> None:
    slurm = adapter()
    slurm.drain_many(list(slurm_cluster.onprem_nodes), "zone reclaim")
    for node in slurm_cluster.onprem_nodes:
        assert "DRAIN" in slurm_cluster.node_field(node, "State")
        assert slurm_cluster.node_field(node, "Reason").startswith("zone")
    with pytest.raises(SourceError, match="not a node name"):
        slurm.drain_many(["ok-node", "bad node"], "x")


def test_unreadable_partition_limits_are_one_clear_source_error(
    fake_bin: Callable[[str, str], SlurmAdapter],
) -> None:
    fake_bin(
        "squeue",
        'echo \'{"jobs": [{"job_id": 7, "job_state": "PENDING", "state_reason": '
        '"PartitionNodeLimit", "partition": "gpu", "tres_per_node": "gres:gpu:1", '
        '"node_count": 3, "submit_time": 1}]}\'\n',
    )
    slurm = fake_bin("scontrol", "echo 'PartitionName=gpu MinNodes=0 MaxNodes=lots'\n")
    with pytest.raises(
        SourceError,
        match=r"^scontrol show partition: partition gpu: MinNodes=0 MaxNodes=lots are not node",
    ):
        slurm.read(0.0)
    slurm = fake_bin("scontrol", "echo 'PartitionName=gpu MinNodes=0 MaxNodes=2'\n")
    assert slurm.read(0.0) == []
    slurm = fake_bin("scontrol", "echo 'PartitionName=gpu MinNodes=0 MaxNodes=UNLIMITED'\n")
    (group,) = slurm.read(0.0)
    assert (group.nodes, group.gpus_per_job) == (3, 3)
