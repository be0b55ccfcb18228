"""Reading ``squeue --json`` and ``sinfo --json``: the captured outputs of the test cluster
(tests/data/slurm, Slurm 22.05.8: ``squeue.json``/``sinfo.json``, and ``squeue-shapes.json``/
``sinfo-shapes.json`` with multi-node, gres-typed and ``--constraint`` jobs and node features),
malformed documents, constraints, and invariants over generated queues."""

from __future__ import annotations

import json
import logging
import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autoscaler.model import DemandGroup
from autoscaler.model.errors import SourceError
from autoscaler.sources.slurm import DEFAULT_IGNORED_REASONS
from autoscaler.sources.slurm_features import FeatureSyntaxError, GpuNeeds, gpu_needs
from autoscaler.sources.slurm_json import (
    DemandRules,
    NodeRules,
    active_jobs_on,
    count_array_tasks,
    demand_groups,
    onprem_nodes,
    parse_checkpointing,
    parse_gpu_gres,
    pending_jobs,
    read_nodes,
)
from autoscaler.spi.sources import NAMED_PENDING, OldestJobs, aggregate

DATA = Path(__file__).parent / "data" / "slurm"
SQUEUE = (DATA / "squeue.json").read_text()
SINFO = (DATA / "sinfo.json").read_text()
SQUEUE_SHAPES = (DATA / "squeue-shapes.json").read_text()
SINFO_SHAPES = (DATA / "sinfo-shapes.json").read_text()
RULES = DemandRules(ignored_reasons=frozenset(DEFAULT_IGNORED_REASONS), high_priority_min=1000)


def shapes(groups: Any) -> set[tuple[Any, ...]]:
    return {
        (
            g.gpus_per_job,
            g.jobs,
            g.checkpoint_interval_s,
            g.high_priority,
            g.gpu_models,
            g.partition,
            g.nodes,
        )
        for g in groups
    }


def test_the_captured_queue_folds_into_its_shapes() -> None:
    groups = demand_groups(SQUEUE, RULES)

    assert shapes(groups) == {
        (1, 3, None, False, (), "gpu", 1),
        (2, 1, None, False, (), "gpu", 1),
        (2, 1, 600.0, False, (), "gpu", 1),
        (3, 2, None, False, (), "gpu", 1),
        (4, 1, None, False, (), "gpu", 2),
        (4, 1, 300.0, True, (), "gpu", 1),
        (4, 1, 900.0, False, ("a100",), "onprem", 1),
    }
    assert [g.gpus_per_job for g in groups] == sorted(g.gpus_per_job for g in groups)


def test_jobs_carry_checkpoint_duration_and_array_tasks() -> None:
    jobs = {job.id: job for job in pending_jobs(SQUEUE, RULES)}

    assert jobs["5"].checkpoint_interval_s == 900.0
    assert jobs["5"].checkpoint_duration_s == 45.0
    assert jobs["5"].gpu_models == ("a100",)
    assert sorted(i for i in jobs if i.startswith("7_")) == ["7_0", "7_1", "7_2"]
    assert jobs["8"].gpus == 3
    assert (jobs["9"].gpus, jobs["9"].nodes, jobs["9"].shape.gpus) == (4, 2, 2)
    assert "10" not in jobs and "11" not in jobs and "12" not in jobs
    assert "2" not in jobs


def test_gpu_model_names_map_to_the_pools() -> None:
    rules = DemandRules(gpu_models={"a100": "A100"})
    assert {g.gpu_models for g in demand_groups(SQUEUE, rules)} == {(), ("A100",)}


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
            _document(_job(8, node_count="two")),
            r"^squeue --json: job 8: node_count 'two' is not an integer$",
        ),
        (
            _document(_job(11, node_count=-3)),
            r"^squeue --json: job 11: node_count -3 is not a count$",
        ),
        (
            _document(_job(12, tres_per_node="", tres_per_task="gres:gpu:1", tasks=-1)),
            r"^squeue --json: job 12: tasks -1 is not a count$",
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


FEATURE_RULES = DemandRules(
    ignored_reasons=frozenset(DEFAULT_IGNORED_REASONS),
    high_priority_min=1000,
    gpu_models={"a100": "A100"},
    feature_gpu_models={"a100": "A100", "h100": "H100"},
    feature_gpu_memory_gib={"gpu80g": 80.0, "gpu40g": 40.0},
)

job_specs = st.fixed_dictionaries(
    {
        "gpus": st.integers(0, 8),
        "where": st.sampled_from(["tres_per_node", "tres_per_job", "tres_per_task"]),
        "nodes": st.integers(1, 4),
        "tasks": st.integers(1, 4),
        "model": st.sampled_from([None, "a100", "h100"]),
        "features": st.sampled_from(
            ["", "a100|h100", "[a100|h100]&gpu80g", "nvlink", "h100*1&gpu40g", "(a100)"]
        ),
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
        "node_count": spec["nodes"],
        "tasks": spec["tasks"],
        "features": spec["features"],
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
    """What the job counts for: every node needs the same GPUs, so a total that does not split
    evenly over the nodes is counted as the larger share on each."""
    if spec["state"] != "PENDING" or spec["reason"] in ("Dependency", "JobHeldUser"):
        return 0
    nodes = spec["nodes"]
    if spec["where"] == "tres_per_node":
        per_node = spec["gpus"]
    elif spec["where"] == "tres_per_job":
        per_node = math.ceil(spec["gpus"] / nodes)
    else:
        per_node = math.ceil(spec["gpus"] * spec["tasks"] / nodes)
    tasks = {"": 1, "0-9": 10, "0-9%3": 3, "1,5,7": 3}[spec["array"][0]]
    return int(per_node * nodes * tasks)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from([0.0, 1.0, 2.5]),
            st.from_regex(r"[0-9]{1,3}(_[0-9]{1,2})?", fullmatch=True),
        ),
        min_size=1,
        max_size=60,
        unique_by=lambda job: job[1],
    ),
    st.randoms(use_true_random=False),
)
def test_the_longest_waiting_jobs_are_named_whatever_the_listing_order(
    jobs: list[tuple[float, str]], random: Any
) -> None:
    def named(listing: list[tuple[float, str]]) -> tuple[str, ...]:
        oldest = OldestJobs(*listing[0])
        for submitted, job_id in listing[1:]:
            oldest.offer(submitted, job_id)
        return oldest.ids()

    names = named(jobs)
    assert len(names) == min(len(jobs), NAMED_PENDING)
    submitted = dict((job_id, when) for when, job_id in jobs)
    waited = [submitted[job_id] for job_id in names]
    assert waited == sorted(waited)
    unnamed = [when for when, job_id in jobs if job_id not in names]
    assert all(max(waited) <= when for when in unnamed)
    assert named(random.sample(jobs, len(jobs))) == names


@settings(max_examples=60, deadline=None)
@given(st.lists(job_specs, max_size=40), st.randoms(use_true_random=False))
def test_groups_hold_every_pending_gpu_whatever_the_order(
    specs: list[dict[str, Any]], random: Any
) -> None:
    jobs = [_spec_job(i + 1, spec) for i, spec in enumerate(specs)]
    submitted = {str(i + 1): float(spec["submit"]) for i, spec in enumerate(specs)}
    for rules in (RULES, FEATURE_RULES):
        groups = demand_groups(_document(*jobs), rules)

        assert sum(g.gpus for g in groups) == sum(_expected_gpus(s) for s in specs)
        one_by_one = aggregate(pending_jobs(_document(*jobs), rules))
        # The longest-waiting jobs are named by id; ``pending_jobs`` names each task of an array
        # record ``<record>_<n>``, while the groups name the record itself (what Slurm answers
        # to), so the one-by-one path may name a record's tasks where the groups name it once.
        assert [g.model_copy(update={"oldest_jobs": ()}) for g in groups] == [
            g.model_copy(update={"oldest_jobs": ()}) for g in one_by_one
        ]
        for folded, listed in zip(groups, one_by_one, strict=True):
            assert 1 <= len(folded.oldest_jobs) <= 8 and 1 <= len(listed.oldest_jobs) <= 8
            # the same longest wait is named first, and names come oldest first
            first = [
                submitted[listed.oldest_jobs[0].split("_")[0]],
                submitted[folded.oldest_jobs[0]],
            ]
            assert first[0] == first[1] == folded.oldest_submit_time
            for names in (listed.oldest_jobs, folded.oldest_jobs):
                waits = [submitted[name.split("_")[0]] for name in names]
                assert waits == sorted(waits)
        for group in groups:
            assert DemandGroup.model_validate(group.model_dump()) == group
            assert group.gpus_per_node * group.nodes == group.gpus_per_job
            assert list(group.gpu_models) == sorted(set(group.gpu_models))
        assert demand_groups(_document(*random.sample(jobs, len(jobs))), rules) == groups
        keys = [
            (
                g.gpus_per_job,
                g.checkpoint_interval_s,
                g.high_priority,
                g.gpu_models,
                g.partition,
                g.nodes,
                g.min_gpu_memory_gib,
            )
            for g in groups
        ]
        assert len(keys) == len(set(keys))


SHAPES_RULES = DemandRules(
    ignored_reasons=frozenset(DEFAULT_IGNORED_REASONS),
    gpu_models={"a100": "A100"},
    feature_gpu_models={"a100": "A100", "h100": "H100"},
    feature_gpu_memory_gib={"gpu80g": 80.0},
    partition_nodes={"gpu": (0, None), "onprem": (0, None)},
)


def _shapes_by_job(rules: DemandRules) -> dict[str, tuple[Any, ...]]:
    return {
        j.id: (j.gpus, j.nodes, j.gpu_models, j.min_gpu_memory_gib)
        for j in pending_jobs(SQUEUE_SHAPES, rules)
    }


def test_the_captured_multi_node_and_constrained_jobs_carry_their_shapes() -> None:
    """tests/data/slurm/squeue-shapes.json: the test cluster's jobs as submitted (both on-prem
    nodes drained so all stay pending; gpu-a has features a100,gpu80g and gpu-b h100,nvlink)."""
    assert _shapes_by_job(SHAPES_RULES) == {
        "17": (4, 2, (), None),  # -N 2 --gres=gpu:2
        "18": (6, 2, (), None),  # -N 2 --gpus=6
        "19": (2, 2, ("A100",), None),  # -N 2-4 --gres=gpu:a100:1: its minimum of nodes
        "20": (12, 3, ("A100",), None),  # -N 3 --gres=gpu:a100:4 (PartitionNodeLimit)
        "21": (4, 2, (), None),  # -N 2 -n 4 --gpus-per-task=1
        "22": (4, 2, (), None),  # -N 2 --gpus=3: 2 of each node
        "23": (1, 1, ("A100", "H100"), None),  # --constraint=a100|h100
        "24": (1, 1, ("A100", "H100"), 80.0),  # --constraint=[a100|h100]&gpu80g
        "25": (2, 1, ("A100",), None),  # --gres=gpu:a100:2 --constraint=a100|h100
        "26": (2, 2, ("A100+H100",), None),  # -N 2 --constraint=a100*1&h100*1
        "27": (1, 1, (), None),  # --constraint=nvlink (not a GPU feature)
        "28": (4, 1, ("A100",), 80.0),  # -p onprem --gres=gpu:a100:4 --constraint=gpu80g
    }
    groups = demand_groups(SQUEUE_SHAPES, SHAPES_RULES)
    two_nodes = next(g for g in groups if g.nodes == 2 and not g.gpu_models)
    assert (two_nodes.jobs, two_nodes.gpus_per_node, two_nodes.shape.gpus) == (3, 2, 2)
    onprem = next(g for g in groups if g.partition == "onprem")
    assert (onprem.checkpoint_interval_s, onprem.shape.min_gpu_memory_gib) == (600.0, 80.0)
    assert onprem.shape.describe() == "4 GPU(s) of A100 with >= 80 GiB each"


def test_without_feature_names_the_constraint_is_not_read() -> None:
    rules = replace(SHAPES_RULES, feature_gpu_models={}, feature_gpu_memory_gib={})
    jobs = _shapes_by_job(rules)
    assert jobs["24"] == (1, 1, (), None)
    assert jobs["26"] == (2, 2, (), None)
    assert jobs["28"] == (4, 1, ("A100",), None)


def test_a_job_larger_than_its_partition_is_demand_only_within_the_partitions_limits() -> None:
    """Job 20 (-N 3) waits for PartitionNodeLimit because the partition has two nodes today."""
    assert "20" in _shapes_by_job(SHAPES_RULES)
    for limits in (None, {"gpu": (0, 2)}, {"gpu": (4, None)}, {"other": (0, None)}):
        assert "20" not in _shapes_by_job(replace(SHAPES_RULES, partition_nodes=limits))
    assert "20" in _shapes_by_job(replace(SHAPES_RULES, partition_nodes={"gpu": (1, 3)}))
    ignored = replace(
        SHAPES_RULES, ignored_reasons=SHAPES_RULES.ignored_reasons | {"PartitionNodeLimit"}
    )
    assert "20" not in _shapes_by_job(ignored)


def test_node_features_give_gpu_memory_and_a_model_where_gres_has_no_type() -> None:
    rules = NodeRules(
        "gpu-autoscaler",
        gpu_models={"a100": "A100"},
        feature_gpu_models={"a100": "A100", "h100": "H100"},
        feature_gpu_memory_gib={"gpu80g": 80.0},
    )
    nodes = {n.name: n for n in onprem_nodes(read_nodes(SINFO_SHAPES, rules))}
    assert (nodes["gpu-a"].gpu_model, nodes["gpu-a"].gpu_memory_gib) == ("A100", 80.0)
    assert (nodes["gpu-b"].gpu_model, nodes["gpu-b"].gpu_memory_gib) == ("A100", None)

    untyped = json.loads(SINFO_SHAPES)
    for node in untyped["nodes"]:
        node["gres"] = "gpu:4"
    listed = {n["name"]: n for n in untyped["nodes"]}
    listed["gpu-a"]["features"] = ["h100", "gpu80g", "gpu40g-slice"]
    found = {n.name: n for n in read_nodes(json.dumps(untyped), rules)}
    assert (found["gpu-a"].gpu_model, found["gpu-a"].gpu_memory_gib) == ("H100", 80.0)
    assert found["gpu-b"].gpu_model == "H100"
    listed["gpu-b"]["features"] = 7
    with pytest.raises(SourceError, match=r"^sinfo --json: node gpu-b: features 7 is not a"):
        read_nodes(json.dumps(untyped), rules)


@pytest.mark.parametrize(
    ("constraint", "gres_model", "models", "memory"),
    [
        ("a100|h100", None, ("A100", "H100"), None),
        ("[a100|h100]&gpu80g", None, ("A100", "H100"), 80.0),
        ("(a100&gpu80g)|h100", None, ("A100", "H100"), 80.0),
        ("(a100&gpu40g)|(h100&gpu80g)", None, ("A100", "H100"), 80.0),
        ("a100|nvlink", None, ("A100",), None),
        ("nvlink&ib", None, (), None),
        ("!a100", None, (), None),
        ("a100&sxm4", None, ("A100+SXM4",), None),
        ("a100&a100-80", None, ("A100-80GB",), None),
        ("h100|a100", "A100", ("A100",), None),
        ("h100", "A100", ("A100+H100",), None),
        ("gpu80g", "A100", ("A100",), 80.0),
        ("a100*2&gpu80g*2", None, ("A100",), 80.0),
        ("a100|h100&gpu80g", None, ("A100", "H100"), 80.0),
        ("", None, (), None),
    ],
)
def test_what_a_constraint_asks_of_each_nodes_gpus(
    constraint: str, gres_model: str | None, models: tuple[str, ...], memory: float | None
) -> None:
    names = {"a100": "A100", "h100": "H100", "sxm4": "SXM4", "a100-80": "A100-80GB"}
    sizes = {"gpu80g": 80.0, "gpu40g": 40.0}
    assert gpu_needs(constraint, names, sizes, gres_model) == GpuNeeds(models, memory)


@pytest.mark.parametrize(
    ("constraint", "complaint"),
    [
        ("a100|(h100", "no closing ')'"),
        ("a100,h100", "unexpected ','"),
        ("a100)", "')' where '&' or '|' was expected"),
        ("*3", "'*3' where a feature was expected"),
        ("a100|", "it ends too soon"),
        ("a100\x00", "unexpected '\\x00'"),
        ("x" * 2000, "longer than 1024"),
    ],
)
def test_an_unreadable_constraint_fails_the_read_naming_job_and_field(
    constraint: str, complaint: str
) -> None:
    text = _document(_job(1), _job(77, features=constraint))
    with pytest.raises(SourceError) as failure:
        demand_groups(text, FEATURE_RULES)
    message = str(failure.value)
    assert message.startswith("squeue --json: job 77: features ")
    assert complaint in message and "\n" not in message
    assert [g.jobs for g in demand_groups(text, RULES)] == [2], "unread without feature names"


@given(
    st.text(alphabet="a1|&()[]*!, h0g8", max_size=40)
    | st.builds(
        lambda pad, tail: "x" * pad + tail,
        st.integers(100, 1020),
        st.sampled_from(["[a1|h0]&g8", "(", "a1&&h0", "!"]),
    )
)
def test_any_constraint_reads_or_fails_with_one_short_line(constraint: str) -> None:
    try:
        needs = gpu_needs(constraint, {"a1": "A1", "h0": "H0"}, {"g8": 8.0})
    except FeatureSyntaxError as exc:
        # found by the ten-times fuzz run: a 1,000-character constraint was quoted whole
        assert "\n" not in str(exc) and len(str(exc)) < 300
        return
    assert set(needs.gpu_models) <= {"A1", "H0", "A1+H0"}
    assert needs.min_gpu_memory_gib in (None, 8.0)


@pytest.mark.parametrize(
    ("fields", "nodes"),
    [
        ({"node_count": None}, 1),
        ({"node_count": 0}, 1),
        ({"node_count": 0xFFFFFFFE}, 1),
        ({"node_count": {"set": False, "infinite": False, "number": 0}}, 1),
        ({"node_count": {"set": True, "infinite": False, "number": 4}}, 4),
        ({"tres_per_node": "", "tres_per_task": "gres:gpu:1", "tasks": None}, 1),
    ],
)
def test_slurms_unset_counts_read_as_one(fields: dict[str, Any], nodes: int) -> None:
    """22.05 prints a count it has not set (NO_VAL) as null, as the captured document shows for
    ``tasks``; later releases print ``{"set": false}``."""
    (job,) = pending_jobs(_document(_job(5, **fields)), RULES)
    assert job.nodes == nodes


def test_an_absurd_request_is_left_out_with_its_reason(caplog: pytest.LogCaptureFixture) -> None:
    text = _document(
        _job(1, tres_per_node="gres:gpu:2"),
        _job(2, node_count=1_000_000),
        _job(3, tres_per_node="gres:gpu:50000"),
        _job(4, tres_per_node="", tres_per_job="gres:gpu:9000000", node_count=2),
    )
    with caplog.at_level(logging.WARNING):
        groups = demand_groups(text, RULES)
    assert [(g.gpus, g.jobs) for g in groups] == [(2, 1)]
    (record,) = [r for r in caplog.records if "not counted" in r.getMessage()]
    message = record.getMessage()
    assert message.startswith("squeue --json: 3 pending job(s) not counted as demand: job 2: ")
    assert "node_count 1000000 is more than 100,000 nodes" in message
    assert "job 3: asks 50,000 GPUs of each node" in message
    assert "job 4: asks 4,500,000 GPUs" in message
