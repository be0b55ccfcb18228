"""Priority classes (``teams.priority_classes``): how a job's class resolves, how aging promotes
a waiting group, how a class kept off spot and the classes' order reach the policy
(``autoscaler/model/priorities.py``), whom the preempt rule takes GPUs from and when
(``autoscaler/tick/rules/preempt.py``), and, replayed through the real controller in the
simulator, the issue's promise: work of a preempting class that arrives on a fleet full of lower
classes' work starts within its bound, with no cloud capacity to buy."""

from __future__ import annotations

import copy
import json
import logging
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from k8s_cluster import pod, tried
from team_replays import replayed, scenario, waits_of
from team_replays import row as trace_row

from autoscaler.model import Capacity, Demand, DemandGroup, FleetView, OnPremNode, Placement
from autoscaler.model.priorities import UNLISTED, ClassBook, promoted_order, resolve
from autoscaler.model.teams import PriorityClass, TeamsConfig
from autoscaler.sources.kubernetes.demand import pending_demand
from autoscaler.sources.kubernetes.pods import PodRules, Times, read_pod
from autoscaler.sources.kubernetes.settings import KubernetesSettings
from autoscaler.sources.slurm import DEFAULT_IGNORED_REASONS
from autoscaler.sources.slurm_json import (
    DemandRules,
    demand_groups,
    pending_jobs,
    read_running_jobs,
)
from autoscaler.spi.sources import GroupKey, HeldOff, RunningJob, aggregate
from autoscaler.tick.intents import MoveJobs
from autoscaler.tick.rules import preempt
from autoscaler.tick.rules.rebalance_onprem import OnPremJobs
from autoscaler.tick.rules.reclaim import Reclaim

NOW = 10_000.0
TICK = 60.0
CLASSES = {
    "batch": PriorityClass(order=0, promote_after_s=600.0),
    "normal": PriorityClass(order=5, promote_after_s=1_200.0),
    "urgent": PriorityClass(order=10, spot=False, preempts=True),
}
TEAMS = TeamsConfig(priority_classes=CLASSES, reclaim_within_s=900.0)


def group(
    cls: str | None, submitted: float = NOW, gpus: int = 1, job_id: str = "p", jobs: int = 1
) -> DemandGroup:
    return DemandGroup(
        gpus_per_job=gpus,
        jobs=jobs,
        checkpoint_interval_s=600.0,
        priority_class=cls,
        oldest_submit_time=submitted,
        oldest_jobs=(job_id,),
    )


# -- resolution and aging ----------------------------------------------------------------------


def test_a_class_the_config_does_not_list_is_order_0_on_spot_never_preempting_or_promoted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    assert resolve(CLASSES, "urgent") == CLASSES["urgent"]
    assert resolve(CLASSES, None) is UNLISTED
    assert resolve(CLASSES, "") is UNLISTED
    unknown = resolve(CLASSES, "gold")
    assert (unknown.order, unknown.spot, unknown.preempts, unknown.promote_after_s) == (
        0,
        True,
        False,
        None,
    )
    book = ClassBook(CLASSES)
    with caplog.at_level(logging.WARNING, logger="autoscaler.model.priorities"):
        for _ in range(3):
            assert book.of("gold") is UNLISTED
        book.of("urgent")
        book.of(None)
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1 and "'gold'" in said[0], said


def test_aging_promotes_one_class_per_promote_after_s_of_the_class_reached() -> None:
    assert promoted_order(CLASSES, "batch", 0.0) == 0
    assert promoted_order(CLASSES, "batch", 600.0) == 0  # longer than, not as long as
    assert promoted_order(CLASSES, "batch", 601.0) == 5
    # then normal's 1,200 s more to the next class up
    assert promoted_order(CLASSES, "batch", 600.0 + 1_200.0) == 5
    assert promoted_order(CLASSES, "batch", 600.0 + 1_201.0) == 10
    assert promoted_order(CLASSES, "batch", 1e9) == 10  # the top is as far as it goes
    assert promoted_order(CLASSES, "urgent", 1e9) == 10  # never promoted
    assert promoted_order(CLASSES, "gold", 1e9) == 0  # not listed: never promoted


def test_aging_skips_no_order_and_stops_at_a_class_never_promoted() -> None:
    classes = {
        "low": PriorityClass(order=-3, promote_after_s=10.0),
        "mid": PriorityClass(order=2),
        "top": PriorityClass(order=7),
    }
    assert promoted_order(classes, "low", 11.0) == 2
    assert promoted_order(classes, "low", 1e9) == 2


# -- placed first, kept off spot -----------------------------------------------------------------


def test_groups_are_ordered_by_aged_class_highest_first_and_stable_otherwise() -> None:
    book = ClassBook(CLASSES)
    groups = (
        group("batch", NOW, job_id="b-new"),
        group(None, NOW, job_id="none"),
        group("normal", NOW, job_id="n"),
        group("urgent", NOW, job_id="u"),
        group("batch", NOW - 700.0, job_id="b-aged"),  # aged into normal
        group("gold", NOW, job_id="gold"),
    )
    ranked = book.rank(Demand(groups=groups), NOW)
    assert [g.oldest_jobs[0] for g in ranked.groups] == [
        "u",
        "n",
        "b-aged",
        "b-new",
        "none",
        "gold",
    ]


def test_a_class_kept_off_spot_is_high_priority_so_every_placement_keeps_it_off_spot() -> None:
    book = ClassBook(CLASSES)
    ranked = book.rank(Demand(groups=(group("urgent"), group("batch"))), NOW)
    urgent, batch = ranked.groups
    assert urgent.high_priority and not urgent.spot_safe
    assert not batch.high_priority and batch.spot_safe
    placement = Placement(protect_high_priority=True)
    assert Capacity.SPOT not in placement.tiers(True, urgent.high_priority)
    assert Capacity.SPOT in placement.tiers(True, batch.high_priority)


def test_without_classes_demand_is_left_as_it_is() -> None:
    demand = Demand(groups=(group("batch"), group("urgent")))
    assert ClassBook({}).rank(demand, NOW) is demand


def test_demand_folds_per_class() -> None:
    from autoscaler.model import Job

    jobs = [
        Job(id=str(i), gpus=1, submit_time=float(i), priority_class=cls)
        for i, cls in enumerate(["a", "b", "a", None])
    ]
    folded = {g.priority_class: g.jobs for g in aggregate(jobs)}
    assert folded == {"a": 2, "b": 1, None: 1}
    assert "priority_class" in GroupKey._fields


# -- the preempt rule ----------------------------------------------------------------------------


def job(
    job_id: str,
    node: str,
    gpus: int,
    cls: str | None,
    started: float,
    *,
    signal: bool = True,
    nodes: int = 1,
) -> RunningJob:
    return RunningJob(
        job_id,
        node,
        gpus,
        started,
        600.0,
        20.0,
        "USR1" if signal else None,
        nodes=nodes,
        priority_class=cls,
    )


def view_of(nodes: Sequence[OnPremNode], groups: Sequence[DemandGroup]) -> FleetView:
    return FleetView(
        now=NOW,
        tick=1,
        fleet_id="f",
        pools=(),
        onprem=tuple(nodes),
        demand=Demand(groups=tuple(groups), known=True),
    )


def full_fleet() -> tuple[list[OnPremNode], dict[str, list[RunningJob]]]:
    """Two 4-GPU nodes full of lower classes' work."""
    nodes = [OnPremNode(name=n, gpus=4, gpus_allocated=4) for n in ("a", "b")]
    jobs = {
        "a": [job("a1", "a", 2, "batch", 100.0), job("a2", "a", 2, "normal", 900.0)],
        "b": [job("b1", "b", 1, None, 500.0), job("b2", "b", 3, "batch", 800.0)],
    }
    return nodes, jobs


def preempted(
    groups: Sequence[DemandGroup],
    nodes: Sequence[OnPremNode] | None = None,
    jobs: dict[str, list[RunningJob]] | None = None,
    teams: TeamsConfig = TEAMS,
    onprem: OnPremJobs | None = None,
    taken: Sequence[MoveJobs] = (),
) -> Reclaim:
    default_nodes, default_jobs = full_fleet()
    return preempt.preempt(
        view_of(nodes if nodes is not None else default_nodes, groups),
        teams,
        jobs if jobs is not None else default_jobs,
        onprem if onprem is not None else OnPremJobs({}),
        Placement(),
        TICK,
        taken,
    )


def test_a_preempting_class_takes_the_fewest_lower_class_gpus_by_the_bound() -> None:
    found = preempted([group("urgent", NOW - 800.0, gpus=2)]).moves
    assert len(found) == 1
    move = found[0]
    assert move.for_job == "p"
    # node a frees 2 GPUs by its youngest 2-GPU job; node b would need its 3-GPU job
    assert move.node == "a" and [j.id for j in move.jobs] == ["a2"]
    assert move.by == NOW - 800.0 + 900.0 - TICK
    assert "urgent" in move.reason and "a2 (normal)" in move.reason


def test_a_class_of_its_own_bound_keeps_it() -> None:
    classes = dict(CLASSES, urgent=CLASSES["urgent"].model_copy(update={"preempt_within_s": 300.0}))
    teams = TeamsConfig(priority_classes=classes, reclaim_within_s=900.0)
    found = preempted([group("urgent", NOW - 200.0, gpus=2)], teams=teams).moves
    assert [m.by for m in found] == [NOW - 200.0 + 300.0 - TICK]


def test_the_rule_acts_at_once_for_a_job_just_submitted() -> None:
    found = preempted([group("urgent", NOW, gpus=2)]).moves
    assert [(m.for_job, m.by) for m in found] == [("p", NOW + 900.0 - TICK)]


def test_equal_or_higher_classes_and_multi_node_jobs_are_never_taken() -> None:
    nodes = [OnPremNode(name="a", gpus=4, gpus_allocated=4)]
    jobs = {
        "a": [
            job("peer", "a", 2, "urgent", 900.0),
            job("gang", "a", 1, "batch", 800.0, nodes=2),
            job("low", "a", 1, "batch", 100.0),
        ]
    }
    assert preempted([group("urgent", NOW - 800.0, gpus=2)], nodes, jobs).moves == []
    found = preempted([group("urgent", NOW - 800.0, gpus=1)], nodes, jobs).moves
    assert [j.id for m in found for j in m.jobs] == ["low"]


def test_a_running_job_counts_in_the_class_its_age_at_its_last_start_reached() -> None:
    nodes = [OnPremNode(name="a", gpus=2, gpus_allocated=2)]

    def with_age(age: float) -> dict[str, list[RunningJob]]:
        old = job("old", "a", 2, "batch", 5_000.0)
        return {"a": [replace(old, submitted_at=5_000.0 - age)]}

    urgent = [group("urgent", NOW - 800.0, gpus=2)]
    # waited 700 s before it started: aged into normal (5), still below urgent (10)
    assert [j.id for m in preempted(urgent, nodes, with_age(700.0)).moves for j in m.jobs] == [
        "old"
    ]
    # waited 600 s + 1,201 s: aged into urgent itself, which takes only lower classes
    assert preempted(urgent, nodes, with_age(1_801.0)).moves == []


def test_a_class_that_does_not_preempt_takes_nothing() -> None:
    assert preempted([group("normal", NOW - 800.0, gpus=2)]).moves == []
    assert preempted([group(None, NOW - 800.0, gpus=2)]).moves == []


def test_free_room_that_fits_is_left_to_the_scheduler() -> None:
    nodes = [OnPremNode(name="a", gpus=4, gpus_allocated=2)]
    jobs = {"a": [job("l", "a", 2, "batch", 0.0)]}
    assert preempted([group("urgent", NOW - 800.0, gpus=2)], nodes, jobs).moves == []


def test_checkpointing_jobs_go_first_and_each_job_gets_a_node_of_its_own() -> None:
    nodes = [OnPremNode(name=n, gpus=2, gpus_allocated=2) for n in ("a", "b")]
    jobs = {
        "a": [
            job("young-silent", "a", 1, "batch", 900.0, signal=False),
            job("old-saving", "a", 1, "batch", 100.0),
        ],
        "b": [job("b1", "b", 2, "batch", 100.0)],
    }
    two = DemandGroup(
        gpus_per_job=1,
        jobs=2,
        priority_class="urgent",
        oldest_submit_time=NOW - 800.0,
        oldest_jobs=("p", "q"),
    )
    found = preempted([two], nodes, jobs).moves
    assert [(m.for_job, m.node, [j.id for j in m.jobs]) for m in found] == [
        ("p", "a", ["old-saving"]),
        ("q", "b", ["b1"]),
    ]


def test_moves_already_asked_for_and_holds_are_left_alone() -> None:
    _, jobs = full_fleet()
    other = MoveJobs("a", (jobs["a"][1],), "x", "reclaim", by=NOW)
    found = preempted([group("urgent", NOW - 800.0, gpus=2)], taken=[other]).moves
    assert [(m.node, [j.id for j in m.jobs]) for m in found] == [("b", ["b2"])]
    held = OnPremJobs({}, held=(HeldOff("a2", "a", "p", NOW - 60.0),))
    # the job already has room being made for it
    assert preempted([group("urgent", NOW - 800.0, gpus=2)], onprem=held).moves == []


def test_nothing_without_classes_or_when_demand_is_unknown() -> None:
    nodes, jobs = full_fleet()
    view = view_of(nodes, [group("urgent", NOW - 800.0, gpus=2)])
    assert preempt.preempt(view, None, jobs, OnPremJobs({}), Placement(), TICK).moves == []
    assert preempt.preempt(view, TEAMS, None, OnPremJobs({}), Placement(), TICK).moves == []
    unknown = view.model_copy(update={"demand": view.demand.model_copy(update={"known": False})})
    assert preempt.preempt(unknown, TEAMS, jobs, OnPremJobs({}), Placement(), TICK).moves == []


# -- replayed through the controller -----------------------------------------------------------

CLASSES_YAML = """
priority_classes:
  urgent: {order: 10, spot: false, preempts: true, preempt_within_s: WITHIN}
  normal: {order: 5}
  batch: {order: 0}
"""


def row(job_id: str, submit: int, duration: int, gpus: int, cls: str, preemptible: int) -> str:
    """A trace row whose team (the trace's user_group) is its class, to tell its waits apart."""
    return trace_row(job_id, submit, duration, gpus, cls, preemptible, cls)


@st.composite
def fleets(draw: st.DrawFn) -> tuple[list[int], float, list[str]]:
    nodes = draw(st.lists(st.integers(1, 4), min_size=1, max_size=3))
    within = draw(st.sampled_from([300.0, 600.0, 900.0]))
    rows = []
    # lower classes fill every GPU with long jobs, some of which cannot checkpoint
    for n, gpus in enumerate(nodes):
        left = gpus
        k = 0
        while left:
            size = draw(st.integers(1, left))
            cls = draw(st.sampled_from(["batch", "normal", "unlisted"]))
            rows.append(row(f"l{n}-{k}", 0, 20_000, size, cls, draw(st.integers(0, 1))))
            left -= size
            k += 1
    # one job of the preempting class arrives once the fleet is full (several of mixed shapes,
    # any distance apart: tests/test_bind.py)
    gpus = draw(st.integers(1, max(nodes)))
    submit = draw(st.integers(300, 6_000))
    rows.append(row("u0", submit, 3_000, gpus, "urgent", draw(st.integers(0, 1))))
    return nodes, within, rows


def replay_case(tmp_path: Path, nodes: list[int], within: float, rows: list[str]) -> list[float]:
    """The preempting class's waits, replayed."""
    text = scenario("preempt", nodes, CLASSES_YAML.replace("WITHIN", str(within)))
    return waits_of(replayed(tmp_path, text, rows), "urgent")


@settings(
    max_examples=10,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(case=fleets())
def test_replayed_a_preempting_class_starts_within_its_bound(
    tmp_path: Path, case: tuple[list[int], float, list[str]]
) -> None:
    nodes, within, rows = case
    waits = replay_case(tmp_path, nodes, within, rows)
    assert waits, "the preempting job ran"
    # No cloud capacity may be bought (max_instances 0): only preemption can start it.
    assert max(waits) <= within, (waits, within, nodes)


# -- the sources -------------------------------------------------------------------------------

CAPTURED = json.loads((Path(__file__).parent / "data" / "slurm" / "squeue.json").read_text())


def _captured(state: str) -> dict[str, Any]:
    """A GPU job in ``state`` as Slurm 22.05's ``squeue --json`` writes it (every field)."""
    for found in CAPTURED["jobs"]:
        if found["job_state"] == state and found["tres_per_node"]:
            return dict(found)
    raise AssertionError(f"the captured queue has a {state} GPU job")


def _queue(state: str, *qos: Any) -> str:
    base = _captured(state)
    jobs = []
    for index, value in enumerate(qos):
        one = copy.deepcopy(base)
        one.update(job_id=900_000 + index, qos=value, array_task_string="")
        jobs.append(one)
    return json.dumps({**CAPTURED, "jobs": jobs})


def _classes(groups: Sequence[DemandGroup]) -> dict[str | None, int]:
    found: dict[str | None, int] = {}
    for g in groups:
        found[g.priority_class] = found.get(g.priority_class, 0) + g.jobs
    return found


def test_slurm_demand_folds_per_qos_only_when_asked_and_bad_values_count_in_no_class(
    caplog: pytest.LogCaptureFixture,
) -> None:
    text = _queue("PENDING", "urgent", "urgent", "normal", "", "bad\nqos", 7, "bad\nqos")
    rules = DemandRules(ignored_reasons=frozenset(DEFAULT_IGNORED_REASONS))
    assert _classes(demand_groups(text, rules)) == {None: 7}
    folding = replace(rules, fold_classes=True)
    with caplog.at_level(logging.WARNING):
        groups = demand_groups(text, folding)
        assert demand_groups(text, folding) == groups
    assert _classes(groups) == {"urgent": 2, "normal": 1, None: 4}
    said = [r.getMessage() for r in caplog.records if "no priority class" in r.getMessage()]
    assert len(said) == 2, said  # each bad value once, whatever its jobs and reads
    assert all("\n" not in line for line in said)
    jobs = pending_jobs(text, folding)
    assert [j.priority_class for j in jobs if j.id == "900000"] == ["urgent"]


def test_slurm_running_jobs_name_their_qos() -> None:
    text = _queue("RUNNING", "batch", None)
    rules = DemandRules(ignored_reasons=frozenset(DEFAULT_IGNORED_REASONS))
    by_node = read_running_jobs(text, rules)
    found = {j.id: j.priority_class for jobs in by_node.values() for j in jobs}
    assert found == {"900000": "batch", "900001": None}


def test_kubernetes_demand_folds_per_priority_class_name_only_when_asked() -> None:
    rules = PodRules.of(KubernetesSettings())
    pods = [
        tried(pod("a", "ml", gpus=1, priority_class="urgent", created=1)),
        tried(pod("b", "ml", gpus=1, priority_class="urgent", created=2)),
        tried(pod("c", "ml", gpus=1, created=3)),
    ]
    assert _classes(pending_demand(pods, rules).groups) == {None: 3}
    folded = pending_demand(pods, replace(rules, fold_classes=True)).groups
    assert _classes(folded) == {"urgent": 2, None: 1}
    read = read_pod(pods[0], rules, Times())
    assert read.priority_class == "urgent"


AGING = """
priority_classes:
  urgent: {order: 10, spot: false, preempts: true, preempt_within_s: WITHIN}
  batch: {order: 0, promote_after_s: PROMOTE}
"""


@st.composite
def streams(draw: st.DrawFn) -> tuple[int, float, float, int, list[str]]:
    gpus = draw(st.integers(1, 4))
    promote = draw(st.sampled_from([600.0, 1_200.0, 2_400.0]))
    within = draw(st.sampled_from([300.0, 600.0]))
    urgent_s = draw(st.integers(600, 1_500))
    # a batch job on the whole node, then preempting jobs on the whole node, each arriving
    # before the last ends: without aging, the batch job is preempted at each of its starts
    rows = [row("b0", 0, draw(st.integers(2_000, 6_000)), gpus, "batch", draw(st.integers(0, 1)))]
    every = max(60, urgent_s // 2)
    for k, submit in enumerate(range(300, 25_000, every)):
        rows.append(row(f"u{k}", submit, urgent_s, gpus, "urgent", draw(st.integers(0, 1))))
    return gpus, promote, within, urgent_s, rows


@settings(
    max_examples=5,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(case=streams())
def test_replayed_aging_bounds_a_lower_class_wait_behind_a_stream_of_preempting_work(
    tmp_path: Path, case: tuple[int, float, float, int, list[str]]
) -> None:
    gpus, promote, within, urgent_s, rows = case
    classes = AGING.replace("WITHIN", str(within)).replace("PROMOTE", str(promote))
    text = scenario("aging", [gpus], classes, window_s=40_000)
    (wait,) = waits_of(replayed(tmp_path, text, rows), "batch")
    # Once it starts older than promote_after_s it counts as urgent and is not taken again: its
    # last start comes at most one preempting job's bound and run (and two ticks) after that.
    assert wait <= promote + within + urgent_s + 2 * 60.0, (wait, case[:4])


def test_replayed_two_jobs_moved_in_one_tick_do_not_swap_nodes_for_ever(tmp_path: Path) -> None:
    """Two preempting jobs free both nodes at once; each moved job, held off only the node it
    left, takes the other's. The next round moves them again, and each then keeps both holds
    (as Slurm keeps a job's ExcNodeList), so the preempting jobs start."""
    rows = [row("l0", 0, 20_000, 1, "batch", 0), row("l1", 0, 20_000, 1, "batch", 0)]
    rows += [row("u0", 300, 3_000, 1, "urgent", 0), row("u1", 300, 3_000, 1, "urgent", 0)]
    waits = replay_case(tmp_path, [1, 1], 300.0, rows)
    assert len(waits) == 2 and max(waits) <= 300.0, waits
