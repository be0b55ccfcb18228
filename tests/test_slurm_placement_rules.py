"""Placement's decisions without a cluster: which pending jobs get their partitions' spot twins
(property tests over generated queues and placements), how holds of moved jobs end, how the
queue is read, and what a failed ``scontrol`` does, at the process boundary (scripts standing in
for the Slurm commands). The same code runs against a real Slurm in test_slurm_placement.py."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from slurm_queue_strategies import applied, placements, queued_jobs
from slurm_queue_strategies import queues as queues_of

from autoscaler.model import Placement
from autoscaler.model.errors import InputError, SourceError
from autoscaler.sources.slurm import SlurmAdapter
from autoscaler.sources.slurm_json import DemandRules, QueuedJob, read_queue
from autoscaler.sources.slurm_placement import (
    Binding,
    ForJob,
    Hold,
    QueueIndex,
    Step,
    binding_steps,
    exclusions,
    hold_steps,
    partition_plan,
    wanted_partitions,
)

DATA = Path(__file__).resolve().parent / "data" / "slurm"
TWINS = {"gpu": "gpu-spot", "big": "big-spot"}

queues = queues_of(queued_jobs(["gpu", "gpu-spot", "big", "big-spot", "onprem", "debug"], 4))


def _applied(queue: list[QueuedJob], placement: Placement, most: int) -> list[QueuedJob]:
    return applied(queue, placement, TWINS, most)


@settings(max_examples=300, deadline=None)
@given(queues, placements)
def test_twins_follow_the_placement_and_a_second_tick_changes_nothing(
    queue: list[QueuedJob], placement: Placement
) -> None:
    after = _applied(queue, placement, most=10_000)
    for before, job in zip(queue, after, strict=True):
        managed = before.pending and before.asks_gpus and any(p in TWINS for p in before.partitions)
        if not managed:
            assert job.partitions == before.partitions, "placement leaves other jobs alone"
            continue
        allowed = placement.allows_spot(before.checkpointable, before.high_priority)
        spot = {TWINS[p] for p in before.partitions if p in TWINS}
        assert (
            spot <= set(job.partitions) if allowed else not set(job.partitions) & {*TWINS.values()}
        )
        others = [p for p in before.partitions if p not in TWINS.values()]
        assert [p for p in job.partitions if p not in TWINS.values()] == others
    assert partition_plan(after, placement, TWINS, 10_000).updates == ()


@settings(max_examples=200, deadline=None)
@given(queues, placements, st.integers(1, 12))
def test_a_tick_changes_at_most_its_bound_each_job_once_protected_first(
    queue: list[QueuedJob], placement: Placement, most: int
) -> None:
    plan = partition_plan(queue, placement, TWINS, most)
    ids = [job_id for update in plan.updates for job_id in update.job_ids]
    assert len(ids) == len(set(ids)) == plan.jobs <= most
    changed = {
        j.id
        for j in queue
        if (wanted := wanted_partitions(j, placement, TWINS)) is not None
        and set(wanted) != set(j.partitions)
    }
    assert set(ids) <= changed and len(ids) + plan.deferred == len(changed)
    protecting = {
        j.id
        for j in queue
        if j.id in changed and not placement.allows_spot(j.checkpointable, j.high_priority)
    }
    if len(protecting) >= most:
        assert set(ids) <= protecting, "jobs to protect go before jobs to widen"
    else:
        assert set(ids) >= protecting, "every job to protect is protected this tick"
    for _ in range(len(changed) // most + 1):
        queue = _applied(queue, placement, most)
    assert partition_plan(queue, placement, TWINS, most).updates == (), "deferred jobs follow"


def test_a_user_who_chose_only_spot_is_left_alone() -> None:
    job = QueuedJob("1", True, ("gpu-spot",), True, False, False)
    assert wanted_partitions(job, Placement(protect_uncheckpointable=True), TWINS) is None


def _hold(**changes: object) -> Hold:
    base: dict[str, object] = {
        "job_id": "10",
        "node": "gpu-a",
        "for_job": "20",
        "since": 0.0,
        "not_before": 100.0,
        "until": 1000.0,
        "excluded": "gpu-x",
        "applied": True,
    }
    return Hold(**{**base, **changes})  # type: ignore[arg-type]


def _queue(*jobs: QueuedJob) -> QueueIndex:
    return QueueIndex.of(list(jobs))


MOVED_PENDING = QueuedJob("10", True, ("onprem",), True, True, False)
MOVED_RUNNING = QueuedJob("10", False, ("onprem",), True, True, False, nodes=("gpu-b",))
FOR_PENDING = QueuedJob("20", True, ("onprem",), True, False, False)
FOR_THERE = QueuedJob("20", False, ("onprem",), True, False, False, nodes=("gpu-a",))
FOR_ELSEWHERE = QueuedJob("20", False, ("onprem",), True, False, False, nodes=("gpu-b",))


@pytest.mark.parametrize(
    ("hold", "queue", "now", "step"),
    [
        (_hold(), _queue(MOVED_PENDING, FOR_PENDING), 500.0, Step.KEEP),
        (_hold(applied=False), _queue(MOVED_PENDING, FOR_PENDING), 500.0, Step.APPLY),
        (_hold(), _queue(MOVED_PENDING, FOR_THERE), 50.0, Step.KEEP),
        (_hold(), _queue(MOVED_PENDING, FOR_THERE), 500.0, Step.RESTORE),
        (_hold(), _queue(MOVED_PENDING, FOR_ELSEWHERE), 500.0, Step.RESTORE),
        (_hold(), _queue(MOVED_PENDING), 500.0, Step.RESTORE),
        (_hold(), _queue(MOVED_PENDING, FOR_PENDING), 1000.0, Step.RESTORE),
        (_hold(), _queue(MOVED_RUNNING, FOR_THERE), 500.0, Step.KEEP),
        (_hold(), _queue(FOR_THERE), 500.0, Step.DROP),
    ],
)
def test_a_hold_ends_when_its_work_is_done_and_never_before_the_credential(
    hold: Hold, queue: QueueIndex, now: float, step: Step
) -> None:
    (found,) = hold_steps([hold], queue, now)
    assert found.step is step


def test_a_hold_found_over_stays_over_until_the_job_is_pending_again() -> None:
    hold = _hold()
    assert hold_steps([hold], _queue(MOVED_RUNNING, FOR_THERE), 500.0)[0].step is Step.KEEP
    assert hold.over
    back = _queue(MOVED_PENDING, FOR_PENDING)
    assert hold_steps([hold], back, 500.0)[0].step is Step.RESTORE


def test_a_job_is_kept_off_every_node_whose_hold_stands_and_gets_its_own_list_back_last() -> None:
    off_a, off_b = _hold(), _hold(node="gpu-b", for_job="21", until=2000.0)
    assert exclusions([off_a, off_b]) == "gpu-x,gpu-a,gpu-b"
    waiting = QueuedJob("21", True, ("onprem",), True, False, False)
    steps = hold_steps([off_a, off_b], _queue(MOVED_PENDING, FOR_THERE, waiting), 500.0)
    assert [s.step for s in steps] == [Step.RESTORE, Step.KEEP]
    assert exclusions([off_a, off_b]) == "gpu-x,gpu-b", "a's hold ended, b's stands"
    off_b.over = True
    assert exclusions([off_b]) == "gpu-x"
    assert exclusions([_hold(excluded="", over=True)]) == ""


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["gpu-a", "gpu-b", "gpu-c"]),
            st.sampled_from(["pending", "there", "gone"]),
            st.floats(0, 1000),
            st.floats(0, 1000),
        ),
        min_size=1,
        max_size=3,
        unique_by=lambda h: h[0],
    ),
    st.floats(0, 1000),
)
def test_a_moved_job_is_kept_off_exactly_the_nodes_whose_holds_stand(
    moves: list[tuple[str, str, float, float]], now: float
) -> None:
    """Whatever its holds' owners do and whenever the tick comes: the list written for a job
    moved off several nodes is its own and the node of every hold not ended, and no other."""
    holds, owners = [], []
    for number, (node, owner, not_before, bound) in enumerate(moves):
        owner_id = str(20 + number)
        holds.append(_hold(node=node, for_job=owner_id, not_before=not_before, until=bound))
        if owner != "gone":
            where = () if owner == "pending" else (node,)
            owners.append(
                QueuedJob(owner_id, owner == "pending", ("onprem",), True, False, False, where)
            )
    hold_steps(holds, _queue(MOVED_PENDING, *owners), now)
    standing = {
        node
        for node, owner, not_before, bound in moves
        if now < not_before or (owner == "pending" and now < bound)
    }
    assert exclusions(holds).split(",") == ["gpu-x", *[h.node for h in holds if h.node in standing]]


def _binding(**changes: object) -> Binding:
    base: dict[str, object] = {
        "for_job": "20",
        "nodes": ("gpu-a", "gpu-b"),
        "since": 0.0,
        "until": 1000.0,
        "applied": True,
    }
    return Binding(**{**base, **changes})  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("binding", "queue", "now", "step"),
    [
        (_binding(), _queue(FOR_PENDING), 500.0, Step.KEEP),
        (_binding(applied=False), _queue(FOR_PENDING), 500.0, Step.APPLY),
        (_binding(), _queue(FOR_PENDING), 1000.0, Step.RESTORE),
        (_binding(), _queue(FOR_THERE), 500.0, Step.KEEP),
        (_binding(applied=False), _queue(FOR_THERE), 500.0, Step.DROP),
        (_binding(), _queue(MOVED_PENDING), 500.0, Step.DROP),
    ],
)
def test_a_binding_lasts_while_its_job_is_pending_within_its_bound(
    binding: Binding, queue: QueueIndex, now: float, step: Step
) -> None:
    """Whatever the holds do: none is passed in."""
    (found,) = binding_steps([binding], queue, now)
    assert found.step is step


def test_a_binding_found_over_is_given_back_once_its_job_is_pending_again() -> None:
    binding = _binding()
    assert binding_steps([binding], _queue(FOR_THERE), 500.0)[0].step is Step.KEEP
    assert binding.over
    assert binding_steps([binding], _queue(FOR_PENDING), 500.0)[0].step is Step.RESTORE


def test_array_tasks_are_found_by_their_array_and_task() -> None:
    task = QueuedJob("31", False, ("gpu",), True, False, False, ("gpu-a",), array_task="30_2")
    waiting = QueuedJob("30", True, ("gpu",), True, False, False, array_pending="30")
    index = _queue(task, waiting)
    assert index.where("30_2", "gpu-a") is ForJob.THERE
    assert index.where("30_5", "gpu-a") is ForJob.PENDING
    assert index.where("40_1", "gpu-a") is ForJob.GONE


def test_the_queue_is_read_with_the_placement_facts_of_the_jobs_asked_for() -> None:
    text = (DATA / "squeue.json").read_bytes()
    rules = DemandRules(high_priority_min=1000)
    queue = {j.id: j for j in read_queue(text, rules, ids=frozenset({"13", "7_4"}))}
    assert queue["14"].high_priority and queue["14"].pending
    assert not queue["13"].pending and queue["13"].nodes == ("gpu-a",)
    assert "2" not in queue, "a running job no hold names is not read"
    assert queue["7"].array_pending == "7"
    assert all(j.partitions for j in queue.values())
    assert any(j.checkpointable for j in queue.values())
    assert any(not j.asks_gpus for j in queue.values()), "the CPU-only job"
    onprem = read_queue(text, rules, partitions=frozenset({"onprem"}))
    assert {j.id for j in onprem} == {"5"}


def test_spot_twins_are_partition_names_and_never_bases() -> None:
    with pytest.raises(InputError, match=r"sources\.hpc\.spot_partitions"):
        SlurmAdapter.from_config({"spot_partitions": {"gpu": "gpu spot"}}, "hpc")
    with pytest.raises(InputError, match="both a base partition and a spot twin"):
        SlurmAdapter.from_config({"spot_partitions": {"gpu": "big", "big": "x"}}, "hpc")


SQUEUE = (
    '{"jobs": [{"job_id": 5, "job_state": "PENDING", "partition": "gpu", "tres_per_node": '
    '"gres:gpu:1", "comment": "checkpoint_interval=60", "priority": 1}]}'
)


@pytest.fixture
def commands(tmp_path: Path) -> Callable[[str], SlurmAdapter]:
    """An adapter whose squeue and sinfo print a queue and no node, and whose scontrol is a script
    of the test's choosing: the real process boundary, without a cluster."""

    def install(scontrol: str) -> SlurmAdapter:
        for name, body in {
            "squeue": f"echo '{SQUEUE}'\n",
            "sinfo": "echo '{\"nodes\": []}'\n",
            "scontrol": scontrol,
        }.items():
            script = tmp_path / name
            script.write_text("#!/bin/sh\n" + body)
            script.chmod(0o755)
        return SlurmAdapter.from_config(
            {"bin_dir": str(tmp_path), "spot_partitions": {"gpu": "gpu-spot"}}, "hpc"
        )

    return install


def test_a_job_that_started_since_the_read_is_not_a_failure(
    commands: Callable[[str], SlurmAdapter], tmp_path: Path
) -> None:
    slurm = commands(
        f'echo "$@" >> {tmp_path}/asked\n'
        "echo 'Job is no longer pending execution for job 5' >&2\nexit 1\n"
    )
    slurm.apply_placement(Placement(protect_uncheckpointable=True))
    assert (tmp_path / "asked").read_text() == "update jobid=5 partition=gpu,gpu-spot\n"


def test_a_refused_update_is_one_clear_line(commands: Callable[[str], SlurmAdapter]) -> None:
    slurm = commands("echo 'Invalid partition name specified' >&2\nexit 1\n")
    with pytest.raises(SourceError) as raised:
        slurm.apply_placement(Placement(protect_uncheckpointable=True))
    assert str(raised.value) == (
        "scontrol update jobid=5 partition=gpu,gpu-spot: exit status 1: "
        "Invalid partition name specified"
    )


def test_move_off_and_bind_refuse_bad_names_before_any_command(
    commands: Callable[[str], SlurmAdapter],
) -> None:
    slurm = commands("exit 1\n")
    with pytest.raises(SourceError, match="is not a job id"):
        slurm.move_off("5; rm", "gpu-a", "6")
    with pytest.raises(SourceError, match="is not a node name"):
        slurm.move_off("5", "gpu a", "6")
    with pytest.raises(SourceError, match="is not a job id"):
        slurm.move_off("5", "gpu-a", "")
    with pytest.raises(SourceError, match="is not a job id"):
        slurm.bind("5; rm", ["gpu-a"])
    with pytest.raises(SourceError, match="is not a node name"):
        slurm.bind("5", ["gpu-a", "gpu b"])
    with pytest.raises(SourceError, match="no nodes"):
        slurm.bind("5", [])


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner),
    max_leaves=5,
)
PLACEMENT_FIELDS = (
    "job_id",
    "job_state",
    "partition",
    "tres_per_node",
    "tres_per_job",
    "comment",
    "priority",
    "qos",
    "array_job_id",
    "array_task_id",
    "nodes",
    "job_resources",
    "node_count",
)


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 27), st.sampled_from(PLACEMENT_FIELDS), json_values)
def test_a_field_placement_cannot_read_is_one_clear_line(
    index: int, name: str, value: object
) -> None:
    document = json.loads((DATA / "squeue.json").read_text())
    jobs = document["jobs"]
    jobs[index % len(jobs)][name] = value
    try:
        read_queue(json.dumps(document), DemandRules(high_priority_min=10), ids=frozenset({"2"}))
    except SourceError as exc:
        assert "\n" not in str(exc) and len(str(exc)) < 400
