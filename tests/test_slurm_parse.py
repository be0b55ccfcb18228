"""Reading ``squeue --json`` and ``sinfo --json``: the captured outputs of the test cluster
(tests/data/slurm, Slurm 22.05.8), malformed documents, and invariants over generated queues."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autoscaler.sources import SourceError, aggregate
from autoscaler.sources.slurm import DEFAULT_IGNORED_REASONS
from autoscaler.sources.slurm_json import (
    DemandRules,
    active_jobs_on,
    count_array_tasks,
    demand_groups,
    onprem_nodes,
    parse_checkpointing,
    parse_gpu_gres,
    pending_jobs,
    read_nodes,
)

DATA = Path(__file__).parent / "data" / "slurm"
SQUEUE = (DATA / "squeue.json").read_text()
SINFO = (DATA / "sinfo.json").read_text()
RULES = DemandRules(ignored_reasons=frozenset(DEFAULT_IGNORED_REASONS), high_priority_min=1000)


def shapes(groups: Any) -> set[tuple[Any, ...]]:
    return {
        (g.gpus_per_job, g.jobs, g.checkpoint_interval_s, g.high_priority, g.gpu_model, g.partition)
        for g in groups
    }


def test_the_captured_queue_folds_into_its_shapes() -> None:
    groups = demand_groups(SQUEUE, RULES)

    assert shapes(groups) == {
        (1, 3, None, False, None, "gpu"),
        (2, 1, None, False, None, "gpu"),
        (2, 1, 600.0, False, None, "gpu"),
        (3, 2, None, False, None, "gpu"),
        (4, 1, None, False, None, "gpu"),
        (4, 1, 300.0, True, None, "gpu"),
        (4, 1, 900.0, False, "a100", "onprem"),
    }
    assert [g.gpus_per_job for g in groups] == sorted(g.gpus_per_job for g in groups)


def test_jobs_carry_checkpoint_duration_and_array_tasks() -> None:
    jobs = {job.id: job for job in pending_jobs(SQUEUE, RULES)}

    assert jobs["5"].checkpoint_interval_s == 900.0
    assert jobs["5"].checkpoint_duration_s == 45.0
    assert jobs["5"].gpu_model == "a100"
    assert sorted(i for i in jobs if i.startswith("7_")) == ["7_0", "7_1", "7_2"]
    assert jobs["8"].gpus == 3
    assert jobs["9"].gpus == 4
    assert "10" not in jobs and "11" not in jobs and "12" not in jobs
    assert "2" not in jobs


def test_gpu_model_names_map_to_the_pools() -> None:
    rules = DemandRules(gpu_models={"a100": "A100"})
    assert {g.gpu_model for g in demand_groups(SQUEUE, rules)} == {None, "A100"}


def test_the_captured_nodes_split_into_onprem_and_cloud() -> None:
    nodes = {n.name: n for n in read_nodes(SINFO, "gpu-autoscaler")}

    assert {name for name, n in nodes.items() if n.cloud} == {"i-0abc123"}
    onprem = {n.name: n for n in onprem_nodes(list(nodes.values()))}
    assert (onprem["gpu-a"].gpus, onprem["gpu-a"].gpus_allocated) == (4, 4)
    assert onprem["gpu-a"].schedulable
    assert not onprem["gpu-b"].schedulable
    assert onprem["gpu-b"].gpus_free == 0
    assert nodes["i-0abc123"].gpus_allocated == 3
    assert read_nodes(SINFO, "gpu-autoscaler", partitions=frozenset({"nope"})) == [
        nodes["i-0abc123"]
    ]


def test_active_jobs_are_found_by_node() -> None:
    assert active_jobs_on(SQUEUE, "i-0abc123") == ["2", "3"]
    assert active_jobs_on(SQUEUE, "gpu-a") == ["13"]
    assert active_jobs_on(SQUEUE, "gpu-b") == []


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("gres:gpu:2", (2, None)),
        ("gres:gpu:a100:2", (2, "a100")),
        ("gres:gpu", (1, None)),
        ("gres:gpu:h100", (1, "h100")),
        ("gres/gpu:4,gres/nic:1", (4, None)),
        ("gpu:a100:2(IDX:0,2),gpu:v100:1(IDX:0)", (3, "a100")),
        ("gpu:a100:0(IDX:N/A)", (0, "a100")),
        ("gres:shard:4", (0, None)),
        ("", (0, None)),
    ],
)
def test_gpu_counts_in_gres_strings(text: str, expected: tuple[int, str | None]) -> None:
    assert parse_gpu_gres(text) == expected


@pytest.mark.parametrize(
    ("spec", "throttle", "expected"),
    [("", 0, 1), ("0-99", 0, 100), ("0-99:2", 0, 50), ("1-3,7", 0, 4), ("0,2,4,6,8%3", 3, 3)],
)
def test_array_tasks(spec: str, throttle: int, expected: int) -> None:
    assert count_array_tasks(spec, throttle) == expected


def _document(*jobs: Any) -> str:
    return json.dumps({"meta": {}, "errors": [], "jobs": list(jobs)})


def _job(job_id: int, **fields: Any) -> dict[str, Any]:
    return {
        "job_id": job_id,
        "job_state": "PENDING",
        "state_reason": "Priority",
        "partition": "gpu",
        "tres_per_node": "gres:gpu:1",
        "node_count": 1,
        "tasks": 1,
        "submit_time": 1000,
        "priority": 1,
        "qos": "normal",
        "comment": "",
        "array_task_string": "",
        "array_max_tasks": 0,
        **fields,
    }


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("<html>502</html>", r"^squeue --json: output is not JSON \("),
        ("[]", r"^squeue --json: output is a JSON list, not an object$"),
        ('{"meta": {}}', r"^squeue --json: output has no 'jobs' list$"),
        (
            _document(_job(1234, tres_per_node="gres:gpu:a100:two")),
            r"^squeue --json: job 1234: tres_per_node 'gres:gpu:a100:two' is not a GPU count$",
        ),
        (
            _document(_job(7, submit_time="yesterday")),
            r"^squeue --json: job 7: submit_time 'yesterday' is not an integer$",
        ),
        (
            _document(_job(8, node_count=None)),
            r"^squeue --json: job 8: node_count None is not an integer$",
        ),
        (_document(_job(9, job_state=3)), r"^squeue --json: job 9: job_state 3 is not a state$"),
        (_document("job"), r"^squeue --json: job \?: is a JSON str, not an object$"),
        (
            _document(_job(10, array_task_string="0-x")),
            r"^squeue --json: job 10: array_task_string '0-x' is not an array range$",
        ),
    ],
)
def test_malformed_queues_are_one_clear_line(text: str, message: str) -> None:
    with pytest.raises(SourceError, match=message):
        demand_groups(text, RULES)


def test_malformed_nodes_are_one_clear_line() -> None:
    bad = json.dumps({"nodes": [{"name": "n1", "gres": "gpu:a100:lots", "state": "idle"}]})
    with pytest.raises(SourceError, match=r"^sinfo --json: node n1: gres: 'gpu:a100:lots' is not"):
        read_nodes(bad, "gpu-autoscaler")


def test_priority_and_qos_mark_high_priority() -> None:
    text = _document(
        _job(1, priority=5000), _job(2, priority=10), _job(3, qos="urgent"), _job(4, priority=None)
    )
    by_priority = DemandRules(high_priority_min=1000)
    with pytest.raises(SourceError, match="job 4: priority None is not an integer"):
        demand_groups(text, by_priority)
    text = _document(_job(1, priority=5000), _job(2, priority=10), _job(3, qos="urgent"))
    high = {j.id for j in pending_jobs(text, by_priority) if j.high_priority}
    assert high == {"1"}
    by_qos = DemandRules(high_priority_qos=frozenset({"urgent"}))
    assert {j.id for j in pending_jobs(text, by_qos) if j.high_priority} == {"3"}


@pytest.mark.parametrize(
    ("comment", "interval", "duration"),
    [
        ("checkpoint_interval=600", 600.0, None),
        ("run 3; checkpoint_interval=600,checkpoint_duration=30", 600.0, 30.0),
        ("checkpoint_interval=nan", None, None),
        ("checkpoint_interval=0 checkpoint_duration=30", None, None),
        ("checkpoint_interval=soon", None, None),
        ("checkpoint_interval=600 checkpoint_duration=-5", 600.0, None),
        ("my_checkpoint_interval=600", None, None),
    ],
)
def test_the_comment_convention(
    comment: str, interval: float | None, duration: float | None
) -> None:
    found = parse_checkpointing(comment)
    assert (found.interval_s, found.duration_s) == (interval, duration)


@given(st.text(max_size=80))
def test_any_comment_reads_without_error(comment: str) -> None:
    found = parse_checkpointing(comment)
    assert found.interval_s is None or (math.isfinite(found.interval_s) and found.interval_s > 0)


job_specs = st.fixed_dictionaries(
    {
        "gpus": st.integers(0, 8),
        "where": st.sampled_from(["tres_per_node", "tres_per_job", "tres_per_task"]),
        "multiplier": st.integers(1, 4),
        "model": st.sampled_from([None, "a100", "h100"]),
        "state": st.sampled_from(["PENDING", "PENDING", "RUNNING", "COMPLETED"]),
        "reason": st.sampled_from(["Priority", "Resources", "Dependency", "JobHeldUser"]),
        "partition": st.sampled_from(["gpu", "onprem", "gpu,onprem"]),
        "comment": st.sampled_from(["", "checkpoint_interval=600", "checkpoint_interval=60"]),
        "priority": st.integers(0, 3000),
        "submit": st.integers(0, 10_000),
        "array": st.sampled_from([("", 0), ("0-9", 0), ("0-9%3", 3), ("1,5,7", 0)]),
    }
)


def _spec_job(job_id: int, spec: dict[str, Any]) -> dict[str, Any]:
    gres = "" if spec["gpus"] == 0 else f"gres:gpu:{spec['model'] + ':' if spec['model'] else ''}"
    fields: dict[str, Any] = {
        "tres_per_node": "",
        "tres_per_job": "",
        "tres_per_task": "",
        spec["where"]: gres + str(spec["gpus"]) if gres else "",
        "node_count": spec["multiplier"] if spec["where"] == "tres_per_node" else 1,
        "tasks": spec["multiplier"] if spec["where"] == "tres_per_task" else 1,
        "job_state": spec["state"],
        "state_reason": spec["reason"],
        "partition": spec["partition"],
        "comment": spec["comment"],
        "priority": spec["priority"],
        "submit_time": spec["submit"],
        "array_task_string": spec["array"][0],
        "array_max_tasks": spec["array"][1],
    }
    return _job(job_id, **fields)


def _expected_gpus(spec: dict[str, Any]) -> int:
    if spec["state"] != "PENDING" or spec["reason"] in ("Dependency", "JobHeldUser"):
        return 0
    per_job = spec["gpus"] * (1 if spec["where"] == "tres_per_job" else spec["multiplier"])
    tasks = {"": 1, "0-9": 10, "0-9%3": 3, "1,5,7": 3}[spec["array"][0]]
    return int(per_job * tasks)


@settings(max_examples=60, deadline=None)
@given(st.lists(job_specs, max_size=40), st.randoms(use_true_random=False))
def test_groups_hold_every_pending_gpu_whatever_the_order(
    specs: list[dict[str, Any]], random: Any
) -> None:
    jobs = [_spec_job(i + 1, spec) for i, spec in enumerate(specs)]
    groups = demand_groups(_document(*jobs), RULES)

    assert sum(g.gpus for g in groups) == sum(_expected_gpus(s) for s in specs)
    assert groups == aggregate(pending_jobs(_document(*jobs), RULES))
    random.shuffle(jobs)
    assert demand_groups(_document(*jobs), RULES) == groups
    keys = [
        (g.gpus_per_job, g.checkpoint_interval_s, g.high_priority, g.gpu_model, g.partition)
        for g in groups
    ]
    assert len(keys) == len(set(keys))
