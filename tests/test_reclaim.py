"""Guaranteed on-prem GPUs reclaimed by checkpoint (``autoscaler/tick/rules/reclaim.py``): whom
the rule takes GPUs from and when, how the evacuator keeps the bound, and, replayed through the
real controller in the simulator, the issue's property: a team below its guarantee with work
waiting gets its on-prem GPUs back within ``teams.reclaim_within_s``."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from team_replays import replayed, row, scenario, waits_of
from test_evacuate import running
from test_rebalance_onprem import MovingFake

from autoscaler.fleet.checkpoints import CheckpointLedger
from autoscaler.model import Demand, DemandGroup, FleetView, OnPremNode, Placement
from autoscaler.model.teams import TeamsConfig, TeamSpec
from autoscaler.spi.sources import HeldOff, RunningJob
from autoscaler.tick.evacuate import EvacuationSettings, Evacuator, Move
from autoscaler.tick.intents import MoveJobs
from autoscaler.tick.rules import reclaim
from autoscaler.tick.rules.rebalance_onprem import OnPremJobs, view_for_policy

NOW = 10_000.0
TICK = 60.0
TEAMS = TeamsConfig(
    teams={"owner": TeamSpec(guaranteed_gpus=4), "lender": TeamSpec(guaranteed_gpus=2)},
    reclaim_within_s=900.0,
)


def job(
    job_id: str, node: str, gpus: int, team: str, started: float, *, signal: bool = True
) -> RunningJob:
    return RunningJob(
        job_id,
        node,
        gpus,
        started,
        600.0,
        20.0,
        "USR1" if signal else None,
        team=team,
    )


def pending(gpus: int, job_id: str, team: str, submitted: float) -> DemandGroup:
    return DemandGroup(
        gpus_per_job=gpus,
        jobs=1,
        team=team,
        oldest_submit_time=submitted,
        oldest_jobs=(job_id,),
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
    """Two 4-GPU nodes, all eight GPUs held by the lender (guaranteed 2)."""
    nodes = [OnPremNode(name=n, gpus=4, gpus_allocated=4) for n in ("a", "b")]
    jobs = {
        "a": [job("a1", "a", 2, "lender", 100.0), job("a2", "a", 2, "lender", 900.0)],
        "b": [job("b1", "b", 1, "lender", 500.0), job("b2", "b", 3, "lender", 800.0)],
    }
    return nodes, jobs


def moves_for(
    groups: Sequence[DemandGroup],
    nodes: Sequence[OnPremNode] | None = None,
    jobs: dict[str, list[RunningJob]] | None = None,
    teams: TeamsConfig = TEAMS,
) -> list[MoveJobs]:
    default_nodes, default_jobs = full_fleet()
    return reclaim.reclaim(
        view_of(nodes if nodes is not None else default_nodes, groups),
        teams,
        jobs if jobs is not None else default_jobs,
        OnPremJobs({}),
        Placement(),
        TICK,
    ).moves


def test_an_owner_below_its_guarantee_takes_the_fewest_borrowed_gpus_by_the_bound() -> None:
    found = moves_for([pending(2, "p", "owner", NOW - 800.0)])
    assert len(found) == 1
    move = found[0]
    assert move.for_job == "p"
    # node a frees 2 GPUs by moving its youngest 2-GPU job; node b would need the 3-GPU job
    assert move.node == "a" and [j.id for j in move.jobs] == ["a2"]
    assert move.by == NOW - 800.0 + 900.0 - TICK
    assert "team owner" in move.reason and "lender" in move.reason


def test_the_rule_acts_at_once_and_the_policy_is_not_shown_the_job_meanwhile() -> None:
    nodes, jobs = full_fleet()
    view = view_of(nodes, [pending(2, "p", "owner", NOW)])
    found = reclaim.reclaim(view, TEAMS, jobs, OnPremJobs({}), Placement(), TICK).moves
    assert [(m.for_job, m.by) for m in found] == [("p", NOW + 900.0 - TICK)]
    shown = view_for_policy(view, OnPremJobs({}), found)
    assert shown.demand.groups == ()


def test_a_lender_is_never_taken_below_its_own_guarantee() -> None:
    teams = TeamsConfig(
        teams={"owner": TeamSpec(guaranteed_gpus=4), "lender": TeamSpec(guaranteed_gpus=7)}
    )
    # the lender holds 8, one over its 7: a 2-GPU job cannot be freed from it
    assert moves_for([pending(2, "p", "owner", NOW - 800.0)], teams=teams) == []
    found = moves_for([pending(1, "p", "owner", NOW - 800.0)], teams=teams)
    assert [j.id for m in found for j in m.jobs] == ["b1"]


def test_an_owner_at_its_guarantee_takes_nothing() -> None:
    nodes = [OnPremNode(name="a", gpus=8, gpus_allocated=8)]
    jobs = {"a": [job("o", "a", 4, "owner", 0.0), job("l", "a", 4, "lender", 0.0)]}
    assert moves_for([pending(1, "p", "owner", NOW - 800.0)], nodes, jobs) == []


def test_a_job_on_a_slice_counts_its_slice_toward_the_guarantee_and_is_never_taken() -> None:
    """Ten owner jobs of a tenth of a GPU hold one GPU's worth, not ten: the owner (guaranteed
    4) is still entitled to a 2-GPU job. The lender's slices on node b are not taken (moving
    them frees no whole GPU), so room is made on node a, though it moves more."""
    sliced = [replace(job(f"o{i}", "b", 1, "owner", 0.0), gpu_share=0.1) for i in range(10)] + [
        replace(job(f"s{i}", "b", 1, "lender", 0.0), gpu_share=0.5) for i in range(6)
    ]
    nodes = [
        OnPremNode(name="a", gpus=4, gpus_allocated=4),
        OnPremNode(name="b", gpus=4, gpus_allocated=4),
    ]
    jobs = {
        "a": [job("a1", "a", 3, "lender", 100.0), job("a2", "a", 1, "lender", 900.0)],
        "b": sliced,
    }
    found = moves_for([pending(2, "p", "owner", NOW - 800.0)], nodes, jobs)
    # node a moves 4 GPUs' worth of jobs where two of b's slices would count as 2
    assert [(m.node, [j.id for j in m.jobs]) for m in found] == [("a", ["a2", "a1"])]
    # counted as whole GPUs the owner would hold 10 and be over its guarantee of 4
    whole = {n: [replace(j, gpu_share=None) for j in js] for n, js in jobs.items()}
    assert moves_for([pending(2, "p", "owner", NOW - 800.0)], nodes, whole) == []


def test_free_room_that_fits_is_left_to_the_scheduler() -> None:
    nodes = [OnPremNode(name="a", gpus=4, gpus_allocated=2)]
    jobs = {"a": [job("l", "a", 2, "lender", 0.0)]}
    assert moves_for([pending(2, "p", "owner", NOW - 800.0)], nodes, jobs) == []


def test_jobs_that_cannot_checkpoint_go_last_and_each_owner_job_once() -> None:
    nodes = [OnPremNode(name="a", gpus=4, gpus_allocated=4)]
    jobs = {
        "a": [
            job("young-silent", "a", 2, "lender", 900.0, signal=False),
            job("old-saving", "a", 2, "lender", 100.0),
        ]
    }
    groups = [pending(2, "p", "owner", NOW - 800.0), pending(2, "q", "owner", NOW - 700.0)]
    found = moves_for(groups, nodes, jobs)
    assert [(m.for_job, [j.id for j in m.jobs]) for m in found] == [("p", ["old-saving"])]


def test_the_evacuator_keeps_the_bound() -> None:
    fake = MovingFake()
    evacuator = Evacuator(fake, CheckpointLedger(), EvacuationSettings(checkpoint_margin_s=10.0))
    fits = running("fits", "a", gpus=1, started_at=0.0)  # 20 s checkpoint + 10 s margin
    silent = RunningJob("silent", "a", 1, 0.0)
    asked = evacuator.make_room("a", [fits, silent], "p", 1_000.0, by=1_100.0)
    assert sorted((m.job_id, m.move) for m in asked) == [
        ("fits", Move.CHECKPOINT_ASKED),
        ("silent", Move.MOVED_OFF),
    ]
    assert fake.moved == [("silent", "a", "p")]
    # a checkpoint that would end after the bound is not waited for
    late = running("late", "b", gpus=1, started_at=0.0)
    asked = evacuator.make_room("b", [late], "q", 1_080.0, by=1_100.0)
    assert [(m.job_id, m.move) for m in asked] == [("late", Move.MOVED_OFF)]
    # without a bound a job that cannot checkpoint stays where it is (on-prem rebalancing)
    assert evacuator.make_room("c", [RunningJob("stays", "c", 1, 0.0)], "r", 1_000.0) == []
    evacuator.close()


# -- replayed through the controller -----------------------------------------------------------


def side_by_side(nodes: Sequence[int], jobs: Sequence[int]) -> bool:
    """Whether single-node jobs of these sizes all fit on nodes of these sizes at once."""
    if not jobs:
        return True
    first, rest = jobs[0], jobs[1:]
    for i, free in enumerate(nodes):
        if free >= first:
            left = [*nodes[:i], free - first, *nodes[i + 1 :]]
            if side_by_side(left, rest):
                return True
    return False


@st.composite
def fleets(draw: st.DrawFn) -> tuple[list[int], int, float, list[str]]:
    nodes = draw(st.lists(st.integers(1, 4), min_size=1, max_size=3))
    total = sum(nodes)
    guarantee = draw(st.integers(1, total))
    reclaim_within = draw(st.sampled_from([300.0, 600.0, 900.0]))
    rows = []
    # the lender fills every GPU with long jobs, some of which cannot checkpoint
    for n, gpus in enumerate(nodes):
        for k in range(gpus):
            rows.append(row(f"l{n}-{k}", 0, 20_000, 1, "lender", draw(st.integers(0, 1))))
    # the owner's jobs, of any shapes, within its guarantee together and no more than the
    # nodes can host side by side (a 4-GPU job has only the 4-GPU nodes, whatever the team is
    # guaranteed), arrive once the fleet is full: a borrower requeued for one may take the room
    # freed for the next (the scheduler orders by age, not guarantees), which the rule must see
    # and free again; and room freed in one tick for two shapes is kept for each, the job it
    # was made for bound to its node while the hold stands.
    owners: list[int] = []
    for n in range(draw(st.integers(1, 3))):
        gpus = draw(st.integers(1, min(guarantee, max(nodes))))
        if sum(owners) + gpus > guarantee or not side_by_side(nodes, [*owners, gpus]):
            break
        owners.append(gpus)
        submit = draw(st.integers(300, 6_000))
        rows.append(row(f"o{n}", submit, 3_000, gpus, "owner", draw(st.integers(0, 1))))
    return nodes, guarantee, reclaim_within, rows


@settings(
    max_examples=10,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(case=fleets())
@example(  # two shapes in one tick: the 1-GPU job on a 3-GPU node, leaving the 4-GPU one
    case=(
        [4, 3, 3],
        5,
        300.0,
        [row(f"l{n}", 0, 20_000, 1, "lender", 0) for n in range(10)]
        + [row("o0", 300, 3_000, 1, "owner", 0), row("o1", 300, 3_000, 4, "owner", 0)],
    )
)
@example(  # o1 starts in part of o0's room before its own movers have checkpointed: o0 bound
    # to a node o1 holds is freed for again elsewhere, and n1, freed for o1 that needs it no
    # longer, is not held (for 1,800 s) for it
    case=(
        [3, 3],
        5,
        300.0,
        [row(f"l{n}", 0, 20_000, 1, "lender", f) for n, f in enumerate((0, 0, 1, 0, 1, 1))]
        + [row("o0", 302, 3_000, 3, "owner", 0), row("o1", 304, 3_000, 2, "owner", 0)],
    )
)
@example(  # a 4-GPU owner job whose only possible node, the 4-GPU one, the lender fills
    case=(
        [1, 3, 4],
        8,
        300.0,
        [row(f"l{n}", 0, 20_000, 1, "lender", 0) for n in range(8)]
        + [row("o0", 300, 3_000, 4, "owner", 0)],
    )
)
@example(  # the room freed for o0 taken by a requeued lender, then o1's by another
    case=(
        [3, 1, 1],
        2,
        300.0,
        [row(f"l{n}", 0, 20_000, 1, "lender", 0) for n in range(5)]
        + [row("o0", 300, 3_000, 1, "owner", 0), row("o1", 300, 3_000, 1, "owner", 0)],
    )
)
def test_replayed_an_owner_below_its_guarantee_starts_within_the_bound(
    tmp_path: Path, case: tuple[list[int], int, float, list[str]]
) -> None:
    nodes, guarantee, reclaim_within, rows = case
    teams = f"""
reclaim_within_s: {reclaim_within}
teams:
  owner: {{guaranteed_gpus: {guarantee}}}
  lender: {{guaranteed_gpus: 0}}
"""
    result = replayed(tmp_path, scenario("reclaim", nodes, teams), rows)
    owner_waits = waits_of(result, "owner")
    assert owner_waits, "the owner's jobs ran"
    # No cloud capacity may be bought (max_instances 0): only reclaim can start them.
    assert max(owner_waits) <= reclaim_within, (owner_waits, reclaim_within, nodes, guarantee)


def test_room_another_job_took_is_made_again_once_two_ticks_have_passed() -> None:
    nodes, jobs = full_fleet()
    view = view_of(nodes, [pending(2, "p", "owner", NOW - 800.0)])
    fresh = OnPremJobs({}, held=(HeldOff("x", "a", "p", NOW - TICK),))
    assert reclaim.reclaim(view, TEAMS, jobs, fresh, Placement(), TICK).moves == []
    lost = OnPremJobs({}, held=(HeldOff("x", "a", "p", NOW - 2 * TICK),))
    (move,) = reclaim.reclaim(view, TEAMS, jobs, lost, Placement(), TICK).moves
    assert move.for_job == "p" and move.node == "a"  # the node it was held on is free again


def test_a_node_the_owner_is_held_off_is_never_its_room() -> None:
    """The owner job was itself moved off node a for another job (a rebalancing, a preemption)
    and that hold stands: bound to a it could start nowhere until the hold ended (the three-team
    replay found a job bound to, and held off, the same node for 1,800 s). Its room is found on
    b instead, though a frees the fewest GPUs."""
    nodes, jobs = full_fleet()
    view = view_of(nodes, [pending(2, "p", "owner", NOW - 800.0)])
    held_off_a = OnPremJobs({}, held=(HeldOff("p", "a", "q", NOW - TICK),))
    (move,) = reclaim.reclaim(view, TEAMS, jobs, held_off_a, Placement(), TICK).moves
    assert move.node == "b" and move.nodes == ("b",)
    # free room on a is no room for it either: the rule makes room on b
    freed = [OnPremNode(name="a", gpus=4, gpus_allocated=2), nodes[1]]
    room_on_a = {"a": [job("a1", "a", 2, "lender", 100.0)], "b": jobs["b"]}
    view = view_of(freed, [pending(2, "p", "owner", NOW - 800.0)])
    (move,) = reclaim.reclaim(view, TEAMS, room_on_a, held_off_a, Placement(), TICK).moves
    assert move.node == "b"
