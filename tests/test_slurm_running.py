"""Which jobs run where, with their GPUs and checkpoint convention: ``squeue --json`` documents
built from the job captured on the test cluster (Slurm 22.05.8), invariants over generated
allocations, and the adapter against the real Slurm of tests/slurm_cluster.py."""

from __future__ import annotations

import copy
import json
import math
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from slurm_cluster import SlurmCluster, wait_for

from autoscaler.model.errors import SourceError
from autoscaler.sources.slurm import SlurmAdapter
from autoscaler.sources.slurm_json import (
    DemandRules,
    active_jobs_on,
    parse_checkpointing,
    read_running_jobs,
)
from autoscaler.spi.sources import CheckpointingScheduler, RunningJob

CAPTURED = json.loads((Path(__file__).parent / "data" / "slurm" / "squeue.json").read_text())
TEMPLATE = next(job for job in CAPTURED["jobs"] if job["job_state"] == "RUNNING")
RULES = DemandRules()
CHECKPOINTING = "checkpoint_interval=60 checkpoint_duration=5 checkpoint_signal=USR1"


def running(job_id: int, nodes: list[str], **fields: Any) -> dict[str, Any]:
    """A running job as Slurm 22.05 prints it, on ``nodes``; ``fields`` replace the captured."""
    job = copy.deepcopy(TEMPLATE)
    job["job_id"] = job_id
    job["nodes"] = ",".join(nodes)
    job["job_resources"]["nodes"] = ",".join(nodes)
    slot = job["job_resources"]["allocated_nodes"][0]
    job["job_resources"]["allocated_nodes"] = [{**slot, "nodename": node} for node in nodes]
    job["node_count"] = len(nodes)
    job.update(fields)
    return job


def document(*jobs: dict[str, Any]) -> str:
    return json.dumps({"meta": {}, "errors": [], "jobs": list(jobs)})


def test_a_job_is_listed_on_its_node_with_its_gpus_and_convention() -> None:
    text = document(
        running(
            41,
            ["gpu-a"],
            gres_detail=["gpu:a100:2(IDX:0-1)"],
            start_time=1_700_000_000,
            comment=CHECKPOINTING,
        )
    )

    assert read_running_jobs(text, RULES) == {
        "gpu-a": [
            RunningJob(
                "41",
                "gpu-a",
                2,
                1_700_000_000.0,
                60.0,
                5.0,
                "USR1",
                submitted_at=float(TEMPLATE["submit_time"]),  # the captured job's
            )
        ]
    }


def test_a_multi_node_job_is_on_each_node_with_what_it_holds_there() -> None:
    """``--gpus=3 -N 2`` as the test cluster placed it: one GPU on gpu-a, two on gpu-b."""
    spread = running(
        8,
        ["gpu-a", "gpu-b"],
        gres_detail=["gpu:a100:1(IDX:3)", "gpu:a100:2(IDX:1-2)"],
        tres_per_node="",
        tres_per_job="gres:gpu:3",
    )
    cpu_only = running(9, ["gpu-a"], gres_detail=[], tres_per_node="")

    by_node = read_running_jobs(document(spread, cpu_only), RULES)

    assert {node: [(j.id, j.gpus) for j in jobs] for node, jobs in by_node.items()} == {
        "gpu-a": [("8", 1), ("9", 0)],
        "gpu-b": [("8", 2)],
    }
    assert all(j.checkpoint_signal is None for jobs in by_node.values() for j in jobs)


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"tres_per_node": "gres:gpu:a100:2"}, [2, 2]),
        ({"tres_per_node": "", "tres_alloc_str": "cpu=2,node=2,gres/gpu=3"}, [2, 1]),
        ({"tres_per_node": "", "tres_alloc_str": "cpu=2", "tres_per_job": "gres:gpu:4"}, [2, 2]),
        ({"tres_per_node": "", "gres_detail": ["gpu:1(IDX:0)"]}, [0, 0]),
    ],
)
def test_without_gres_detail_per_node_gpus_come_from_the_request(
    fields: dict[str, Any], expected: list[int]
) -> None:
    job = running(5, ["gpu-a", "gpu-b"], **fields)
    if "gres_detail" not in fields:
        del job["gres_detail"]

    by_node = read_running_jobs(document(job), RULES)

    assert [by_node[node][0].gpus for node in ("gpu-a", "gpu-b")] == expected


def test_only_running_and_finishing_jobs_are_listed() -> None:
    jobs = [
        running(1, ["gpu-a"], job_state="RUNNING"),
        running(2, ["gpu-a"], job_state="COMPLETING"),
        running(3, ["gpu-a"], job_state="PENDING"),
        running(4, ["gpu-a"], job_state="COMPLETED"),
        running(5, ["gpu-a"], job_state=["RUNNING", "REQUEUED"]),
    ]

    listed = read_running_jobs(document(*jobs), RULES)

    assert [job.id for job in listed["gpu-a"]] == ["1", "2", "5"]


def test_the_captured_queue_agrees_with_what_drain_counts() -> None:
    by_node = read_running_jobs(json.dumps(CAPTURED), RULES)

    for node in ("i-0abc123", "gpu-a", "gpu-b"):
        listed = [job.id for job in by_node.get(node, [])]
        assert listed == active_jobs_on(json.dumps(CAPTURED), node)


def test_renamed_comment_keys_are_read() -> None:
    rules = DemandRules(
        checkpoint_keys=("ckpt_every", "ckpt_takes"), checkpoint_signal_key="ckpt_signal"
    )
    job = running(3, ["gpu-a"], comment="ckpt_every=300 ckpt_takes=9 ckpt_signal=SIGUSR2")

    (listed,) = read_running_jobs(document(job), rules)["gpu-a"]

    assert (listed.checkpoint_interval_s, listed.checkpoint_duration_s) == (300.0, 9.0)
    assert listed.checkpoint_signal == "USR2"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("squeue: error: slurm_load_jobs", r"^squeue --json: output is not JSON"),
        (
            json.dumps({"errors": [{"error": "Unable to contact slurm controller"}], "jobs": []}),
            r"^squeue --json: Slurm reported an error: Unable to contact slurm controller$",
        ),
        (
            document(running(7, ["gpu-a"], gres_detail=["gpu:a100:x(IDX:0)"])),
            r"^squeue --json: job 7: gres_detail 'gpu:a100:x\(IDX:0\)' is not a GPU count$",
        ),
        (
            document(running(7, ["gpu-a"], gres_detail=[3])),
            r"^squeue --json: job 7: gres_detail entry 3 is not a string$",
        ),
        (
            document(running(7, ["gpu-a"], start_time=0)),
            r"^squeue --json: job 7: start_time 0 is not a time$",
        ),
        (
            document(running(7, ["gpu-a"], start_time="soon")),
            r"^squeue --json: job 7: start_time 'soon' is not an integer$",
        ),
        (
            document(running(7, [], job_resources={})),
            r"^squeue --json: job 7: is running but names no node$",
        ),
        (
            document(running(7, ["gpu-a"], job_state=3)),
            r"^squeue --json: job 7: job_state 3 is not a state$",
        ),
        (
            document(
                running(7, ["gpu-a", "gpu-b"], gres_detail=[], tres_per_node="")
                | {"tres_alloc_str": "gres/gpu=two"}
            ),
            r"^squeue --json: job 7: tres_alloc_str 'gres/gpu=two' is not a GPU count$",
        ),
        ('{"jobs": [7]}', r"^squeue --json: job \?: is a JSON int, not an object$"),
    ],
)
def test_a_malformed_document_is_one_source_error_line(text: str, message: str) -> None:
    with pytest.raises(SourceError, match=message) as raised:
        read_running_jobs(text, RULES)
    assert "\n" not in str(raised.value)


@pytest.mark.parametrize(
    ("comment", "expected"),
    [
        ("", (None, None, None)),
        ("checkpoint_interval=600 checkpoint_duration=30", (600.0, 30.0, "USR1")),
        ("checkpoint_interval=600 checkpoint_signal=USR2", (600.0, None, "USR2")),
        ("checkpoint_interval=600;checkpoint_signal=sigterm", (600.0, None, "TERM")),
        ("checkpoint_interval=600 checkpoint_signal=none", (600.0, None, None)),
        ("checkpoint_interval=600 checkpoint_signal=KILL", (600.0, None, None)),
        ("checkpoint_interval=600 checkpoint_signal=USR1!", (600.0, None, None)),
        ("checkpoint_signal=USR1 checkpoint_duration=20", (None, 20.0, "USR1")),
        ("checkpoint_interval=0 checkpoint_duration=30", (None, None, None)),
        ("checkpoint_signal=bogus checkpoint_duration=20", (None, None, None)),
    ],
)
def test_the_signal_key_of_the_comment_convention(
    comment: str, expected: tuple[float | None, float | None, str | None]
) -> None:
    found = parse_checkpointing(comment)
    assert (found.interval_s, found.duration_s, found.signal) == expected


@given(st.text(max_size=80))
def test_any_comment_gives_a_trappable_signal_or_none(comment: str) -> None:
    found = parse_checkpointing(comment)
    assert found.signal is None or found.signal.isalnum()
    assert found.signal not in {"KILL", "STOP"}
    if found.interval_s is None and found.signal is None:
        assert found.duration_s is None
    if found.interval_s is not None:
        assert math.isfinite(found.interval_s) and found.interval_s > 0


NODES = [f"n{index}" for index in range(6)]
allocations = st.lists(
    st.fixed_dictionaries(
        {
            "nodes": st.lists(st.sampled_from(NODES), min_size=1, max_size=4, unique=True),
            "gpus": st.integers(0, 8),
            "form": st.sampled_from(["detail", "per_node", "alloc"]),
            "state": st.sampled_from(["RUNNING", "COMPLETING", "PENDING", "COMPLETED"]),
        }
    ),
    max_size=20,
)


def _allocated(job_id: int, spec: dict[str, Any]) -> dict[str, Any]:
    nodes, gpus = spec["nodes"], spec["gpus"]
    fields: dict[str, Any] = {"job_state": spec["state"], "tres_per_node": ""}
    if spec["form"] == "detail":
        fields["gres_detail"] = [f"gpu:a100:{gpus + i}(IDX:0)" for i in range(len(nodes))]
    elif spec["form"] == "per_node":
        fields |= {"gres_detail": [], "tres_per_node": f"gres:gpu:{gpus}" if gpus else ""}
    else:
        fields |= {"gres_detail": [], "tres_alloc_str": f"cpu=1,gres/gpu={gpus}"}
    return running(job_id, nodes, **fields)


def _expected_gpus(spec: dict[str, Any]) -> int:
    count, gpus = len(spec["nodes"]), spec["gpus"]
    if spec["form"] == "detail":
        return sum(gpus + i for i in range(count))
    return gpus * count if spec["form"] == "per_node" else gpus


@given(allocations)
def test_every_active_job_is_on_each_of_its_nodes_once_with_all_its_gpus(
    specs: list[dict[str, Any]],
) -> None:
    by_node = read_running_jobs(
        document(*(_allocated(i, spec) for i, spec in enumerate(specs))), RULES
    )

    for job_id, spec in enumerate(specs):
        placed = {node: [j for j in jobs if j.id == str(job_id)] for node, jobs in by_node.items()}
        holders = {node for node, found in placed.items() if found}
        if spec["state"] in ("RUNNING", "COMPLETING"):
            assert holders == set(spec["nodes"])
            assert all(len(placed[node]) == 1 for node in holders)
            assert sum(placed[node][0].gpus for node in holders) == _expected_gpus(spec)
        else:
            assert holders == set()
    assert all(j.node == node for node, jobs in by_node.items() for j in jobs)


@pytest.fixture
def slurm(slurm_cluster: SlurmCluster) -> Iterator[SlurmAdapter]:
    yield SlurmAdapter.from_config({"slurm_conf": str(slurm_cluster.conf)}, "hpc")
    slurm_cluster.reset()


def _running(cluster: SlurmCluster, job_id: str) -> bool:
    return cluster.job_field(job_id, "JobState") == "RUNNING"


def test_the_real_cluster_lists_jobs_per_node_with_gpus_and_signal(
    slurm: SlurmAdapter, slurm_cluster: SlurmCluster
) -> None:
    submitted = math.floor(time.time())
    trainer = slurm_cluster.sbatch(
        "-w", "gpu-a", "--gres=gpu:2", f"--comment={CHECKPOINTING}", "--wrap", "sleep 60"
    )
    spread = slurm_cluster.sbatch("-N", "2", "--gpus=3", "--wrap", "sleep 60")
    wait_for(
        "both jobs to run",
        lambda: _running(slurm_cluster, trainer) and _running(slurm_cluster, spread),
    )
    assert isinstance(slurm, CheckpointingScheduler)

    on_a = {job.id: job for job in slurm.running_jobs("gpu-a")}
    on_b = {job.id: job for job in slurm.running_jobs("gpu-b")}

    found = on_a[trainer]
    assert (found.node, found.gpus) == ("gpu-a", 2)
    assert (found.checkpoint_interval_s, found.checkpoint_duration_s) == (60.0, 5.0)
    assert found.checkpoint_signal == "USR1"
    assert submitted <= found.started_at <= time.time()
    assert trainer not in on_b
    assert on_a[spread].gpus + on_b[spread].gpus == 3
    assert on_a[spread].checkpoint_signal is None
    by_node = slurm.running_jobs_by_node()
    assert {job.id for job in by_node["gpu-a"]} == set(on_a)
    assert {job.id for job in by_node["gpu-b"]} == set(on_b)
    assert slurm.running_jobs("i-0notanode") == []
    with pytest.raises(SourceError, match="is not a node name"):
        slurm.running_jobs("gpu-a; rm -rf /")
