"""Reclaim and preemption for multi-node jobs (``autoscaler/tick/rules/taking.py``): a pending
job of k nodes gets k distinct on-prem nodes, each freeing its per-node share, all or none;
what a borrowing team lends is counted once over all k; its entitlement counts the whole job;
nodes with the room already count toward the k and are named in every move (``together``) but
moved off of by none; the next job of the same tick leaves all k alone; and a multi-node job's
room, lost when any part of it was taken, is found again whole. Replayed through the real
controller in the simulator: a team's job of several nodes, below its guarantee, starts within
``teams.reclaim_within_s`` while borrowers fill the on-prem fleet; and a job of several nodes of
a preempting class starts within its bound on a fleet full of lower classes' work."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from team_replays import replayed, row, scenario, waits_of
from test_priority_classes import CLASSES_YAML
from test_priority_classes import row as class_row
from test_reclaim import NOW, TICK, job, moves_for, side_by_side

from autoscaler.model import Demand, DemandGroup, FleetView, OnPremNode, Placement
from autoscaler.model.teams import PriorityClass, TeamsConfig, TeamSpec
from autoscaler.spi.sources import HeldOff, RunningJob
from autoscaler.tick.intents import MoveJobs
from autoscaler.tick.rules import preempt, reclaim
from autoscaler.tick.rules.rebalance_onprem import OnPremJobs
from autoscaler.tick.rules.taking import Claims, room_lost


def teams(owner: int, lender: int = 0) -> TeamsConfig:
    return TeamsConfig(
        teams={
            "owner": TeamSpec(guaranteed_gpus=owner),
            "lender": TeamSpec(guaranteed_gpus=lender),
        },
        reclaim_within_s=900.0,
    )


def gang(gpus: int, nodes: int, job_id: str, team: str | None, submitted: float) -> DemandGroup:
    """One pending job of ``gpus`` in all, ``gpus // nodes`` on each of ``nodes`` nodes."""
    return DemandGroup(
        gpus_per_job=gpus,
        jobs=1,
        nodes=nodes,
        team=team,
        checkpoint_interval_s=600.0,
        oldest_submit_time=submitted,
        oldest_jobs=(job_id,),
    )


def lent(names: str, gpus: int = 4) -> tuple[list[OnPremNode], dict[str, list[RunningJob]]]:
    """Nodes of ``gpus`` GPUs each filled by one lender job, the later nodes' jobs younger."""
    nodes = [OnPremNode(name=n, gpus=gpus, gpus_allocated=gpus) for n in names]
    jobs = {n: [job(f"{n}1", n, gpus, "lender", 100.0 * i)] for i, n in enumerate(names)}
    return nodes, jobs


def moved(found: Sequence[MoveJobs]) -> list[tuple[str, list[str], tuple[str, ...]]]:
    return [(m.node, [j.id for j in m.jobs], m.together) for m in found]


# -- reclaim -----------------------------------------------------------------------------------


def test_a_two_node_owner_gets_two_nodes_freed_together_by_one_bound() -> None:
    nodes, jobs = lent("abc")
    found = moves_for([gang(8, 2, "p", "owner", NOW - 100.0)], nodes, jobs, teams(8))
    # as many GPUs moved on each node: the first two by name
    assert sorted(moved(found)) == [("a", ["a1"], ("a", "b")), ("b", ["b1"], ("a", "b"))]
    assert {m.for_job for m in found} == {"p"}
    assert {m.by for m in found} == {NOW - 100.0 + 900.0 - TICK}
    assert all("2 nodes" in m.reason for m in found)


def test_a_node_with_room_already_counts_toward_the_k_and_is_moved_off_of_by_none() -> None:
    nodes, jobs = lent("bc")
    free = OnPremNode(name="a", gpus=4, gpus_allocated=0)
    found = moves_for([gang(8, 2, "p", "owner", NOW)], [free, *nodes], jobs, teams(8))
    (move,) = found
    assert move.node == "b" and [j.id for j in move.jobs] == ["b1"]
    assert move.together == ("a", "b") and move.nodes == ("a", "b")


def test_when_all_k_nodes_have_room_nothing_is_moved() -> None:
    nodes, jobs = lent("c")
    free = [OnPremNode(name=n, gpus=4, gpus_allocated=0) for n in "ab"]
    assert moves_for([gang(8, 2, "p", "owner", NOW)], [*free, *nodes], jobs, teams(8)) == []


def test_all_or_none_when_only_one_node_can_be_freed() -> None:
    """The lender is guaranteed 8 of the 12 GPUs it holds: 4 can be taken, one node's worth.
    Freeing one of the owner job's two nodes would start nothing."""
    nodes, jobs = lent("abc")
    assert moves_for([gang(8, 2, "p", "owner", NOW)], nodes, jobs, teams(8, lender=8)) == []
    # a single-node job of one node's worth is still freed for
    single = gang(4, 1, "q", "owner", NOW)
    assert [m.node for m in moves_for([single], nodes, jobs, teams(8, lender=8))] == ["a"]


def test_what_a_team_lends_is_counted_once_over_all_the_nodes() -> None:
    """Each node alone could be freed (the lender has 6 spare GPUs, a node needs 4), but not
    both: 8 of the 6 spare."""
    nodes, jobs = lent("abc")
    assert moves_for([gang(8, 2, "p", "owner", NOW)], nodes, jobs, teams(8, lender=6)) == []
    found = moves_for([gang(8, 2, "p", "owner", NOW)], nodes, jobs, teams(8, lender=4))
    assert len(found) == 2


def test_a_multi_node_owner_is_entitled_by_its_whole_job() -> None:
    nodes, jobs = lent("abc")
    # 8 GPUs over two nodes: the team's guarantee of 6 does not cover the job, 4 a node or not
    assert moves_for([gang(8, 2, "p", "owner", NOW)], nodes, jobs, teams(6)) == []
    # what the team holds already counts: 2 held + 8 > 9
    mine = OnPremNode(name="d", gpus=2, gpus_allocated=2)
    held = {**jobs, "d": [job("d1", "d", 2, "owner", 0.0)]}
    assert moves_for([gang(8, 2, "p", "owner", NOW)], [*nodes, mine], held, teams(9)) == []
    assert len(moves_for([gang(8, 2, "p", "owner", NOW)], [*nodes, mine], held, teams(10))) == 2


def test_the_next_owner_in_the_tick_leaves_every_node_of_a_gang_alone() -> None:
    """p's room is the free node a and node b; q, a single-node job after it, does not count
    a's free room as its own (the scheduler would start it there and p would start nowhere):
    room is made for it on c."""
    nodes, jobs = lent("bc")
    free = OnPremNode(name="a", gpus=4, gpus_allocated=0)
    groups = [gang(8, 2, "p", "owner", NOW - 10.0), gang(4, 1, "q", "owner", NOW)]
    found = moves_for(groups, [free, *nodes], jobs, teams(12))
    assert sorted((m.for_job, m.node, set(m.nodes)) for m in found) == [
        ("p", "b", {"a", "b"}),
        ("q", "c", {"c"}),
    ]


def test_a_job_of_more_nodes_chooses_first_in_a_tick() -> None:
    """q waited longer, and moving one 1-GPU job off a or b is cheapest for it; but p needs two
    whole 4-GPU nodes, a and b, so p chooses first and q's room is made on c."""
    nodes, jobs = lent("c", gpus=2)
    for name in "ab":
        nodes.append(OnPremNode(name=name, gpus=4, gpus_allocated=4))
        jobs[name] = [job(f"{name}{i}", name, 1, "lender", 10.0 * i) for i in range(4)]
    groups = [gang(1, 1, "q", "owner", NOW - 30.0), gang(8, 2, "p", "owner", NOW)]
    found = moves_for(groups, nodes, jobs, teams(9))
    assert sorted((m.for_job, m.node) for m in found) == [("p", "a"), ("p", "b"), ("q", "c")]


def test_multi_node_running_jobs_are_never_taken() -> None:
    nodes = [OnPremNode(name=n, gpus=4, gpus_allocated=4) for n in "abc"]
    jobs = {
        n: [RunningJob(f"g-{n}", n, 4, 0.0, 600.0, 20.0, "USR1", nodes=3, team="lender")]
        for n in "abc"
    }
    assert moves_for([gang(8, 2, "p", "owner", NOW)], nodes, jobs, teams(8)) == []
    assert moves_for([gang(4, 1, "q", "owner", NOW)], nodes, jobs, teams(8)) == []


# -- claims and lost room ----------------------------------------------------------------------


def test_moves_another_rule_asked_for_claim_every_node_of_their_gang() -> None:
    _, jobs = lent("bc")
    other = MoveJobs("c", tuple(jobs["c"]), "x", "reclaim", by=NOW, together=("a", "c"))
    claims = Claims.of(OnPremJobs({}), jobs, [other])
    assert claims.busy_nodes == {"a", "c"} and claims.kept == {"a"}
    assert claims.leaving == {"c1"} and claims.served == {"x"}


def test_a_multi_node_owner_loses_all_its_room_when_any_part_was_taken() -> None:
    """p's room was b (moved off) and a (free already); one of them was taken, so p still
    waits though no move for it is under way: every hold of it is let go (its nodes no longer
    busy for it) and its room found again."""
    fresh = HeldOff("b1", "b", "p", NOW - TICK)
    assert room_lost(OnPremJobs({}, held=(fresh,)), {"p"}, NOW, TICK) == set()
    old = HeldOff("b1", "b", "p", NOW - 2 * TICK)
    second = HeldOff("c1", "c", "p", NOW - TICK)
    onprem = OnPremJobs({}, held=(old, second))
    lost = room_lost(onprem, {"p"}, NOW, TICK)
    assert lost == {"p"}
    _, jobs = lent("bc")
    claims = Claims.of(onprem, jobs, (), lost)
    assert claims.busy_nodes == set() and "p" not in claims.served
    # while a move for it is under way its room is still being made
    making = OnPremJobs({}, held=(old, second), making_room_for=frozenset({"p"}))
    assert room_lost(making, {"p"}, NOW, TICK) == set()
    # a job that no longer waits lost nothing
    assert room_lost(onprem, set(), NOW, TICK) == set()


def test_a_lost_gang_is_freed_for_again_and_its_own_held_nodes_come_first() -> None:
    """p's room on b and c was taken (c by another job since): the holds are two ticks old and
    p still waits, so room is made again; b, free again and still one of p's nodes, counts."""
    nodes, jobs = lent("acd")
    back = OnPremNode(name="b", gpus=4, gpus_allocated=0)
    held = OnPremJobs(
        {}, held=(HeldOff("b1", "b", "p", NOW - 3 * TICK), HeldOff("c9", "c", "p", NOW - 3 * TICK))
    )
    view = FleetView(
        now=NOW,
        tick=1,
        fleet_id="f",
        pools=(),
        onprem=(*nodes, back),
        demand=Demand(groups=(gang(8, 2, "p", "owner", NOW - 400.0),), known=True),
    )
    found = reclaim.reclaim(view, teams(8), jobs, held, Placement(), TICK).moves
    (move,) = found
    assert move.node == "a" and move.nodes == ("b", "a")


# -- preemption --------------------------------------------------------------------------------

CLASSES = {
    "batch": PriorityClass(order=0),
    "urgent": PriorityClass(order=10, spot=False, preempts=True),
}


def preempted(
    groups: Sequence[DemandGroup],
    nodes: Sequence[OnPremNode],
    jobs: dict[str, list[RunningJob]],
    taken: Sequence[MoveJobs] = (),
) -> list[MoveJobs]:
    view = FleetView(
        now=NOW,
        tick=1,
        fleet_id="f",
        pools=(),
        onprem=tuple(nodes),
        demand=Demand(groups=tuple(groups), known=True),
    )
    config = TeamsConfig(priority_classes=CLASSES, reclaim_within_s=900.0)
    return preempt.preempt(view, config, jobs, OnPremJobs({}), Placement(), TICK, taken).moves


def urgent(gpus: int, nodes: int, job_id: str = "u") -> DemandGroup:
    return gang(gpus, nodes, job_id, None, NOW - 60.0).model_copy(
        update={"priority_class": "urgent"}
    )


def classed(node: str, cls: str, started: float) -> RunningJob:
    return RunningJob(node + "1", node, 4, started, 600.0, 20.0, "USR1", priority_class=cls)


def test_a_two_node_preempting_job_gets_two_lower_class_nodes_freed_together() -> None:
    nodes = [OnPremNode(name=n, gpus=4, gpus_allocated=4) for n in "abc"]
    jobs = {"a": [classed("a", "urgent", 0.0)], "b": [classed("b", "batch", 0.0)]}
    jobs["c"] = [classed("c", "batch", 100.0)]
    found = preempted([urgent(8, 2)], nodes, jobs)
    assert sorted(moved(found)) == [("b", ["b1"], ("b", "c")), ("c", ["c1"], ("b", "c"))]
    assert {m.by for m in found} == {NOW - 60.0 + 900.0 - TICK}


def test_preemption_is_all_or_none_when_only_one_lower_class_node_exists() -> None:
    nodes = [OnPremNode(name=n, gpus=4, gpus_allocated=4) for n in "abc"]
    jobs = {
        "a": [classed("a", "urgent", 0.0)],
        "b": [classed("b", "urgent", 0.0)],
        "c": [classed("c", "batch", 0.0)],
    }
    assert preempted([urgent(8, 2)], nodes, jobs) == []
    assert [m.node for m in preempted([urgent(4, 1)], nodes, jobs)] == ["c"]


def test_preemption_leaves_a_gang_another_rule_claimed_alone_free_node_too() -> None:
    nodes = [
        OnPremNode(name="a", gpus=4, gpus_allocated=0),
        *(OnPremNode(name=n, gpus=4, gpus_allocated=4) for n in "bcd"),
    ]
    jobs = {n: [classed(n, "batch", 0.0)] for n in "bcd"}
    other = MoveJobs("b", tuple(jobs["b"]), "x", "reclaim", by=NOW, together=("a", "b"))
    found = preempted([urgent(8, 2)], nodes, jobs, [other])
    assert sorted(m.node for m in found) == ["c", "d"]
    assert all(set(m.nodes) == {"c", "d"} for m in found)


# -- replayed through the controller -----------------------------------------------------------


@st.composite
def gang_fleets(draw: st.DrawFn) -> tuple[list[int], int, float, list[str]]:
    """``n`` nodes of ``size`` GPUs (and perhaps one smaller) filled by a lender's long 1-GPU
    jobs, some that cannot checkpoint; the owner's job of ``k`` whole nodes (the simulator
    spreads a job bigger than the largest node over as few as hold it), and perhaps a
    single-node one that the other nodes can host, submitted with it or later (one submitted a
    tick earlier may take a node the job of k needs: the rule does not foresee, docs/teams.md)."""
    size = draw(st.sampled_from([2, 4]))
    nodes = [size] * draw(st.integers(2, 3))
    if draw(st.booleans()):
        nodes.append(draw(st.integers(1, size - 1)))
    within = draw(st.sampled_from([300.0, 600.0]))
    rows = [
        row(f"l{n}-{i}", 0, 20_000, 1, "lender", draw(st.integers(0, 1)))
        for n, gpus in enumerate(nodes)
        for i in range(gpus)
    ]
    k = draw(st.integers(2, nodes.count(size)))
    submit = draw(st.integers(300, 3_000))
    rows.append(row("o0", submit, 3_000, k * size, "owner", draw(st.integers(0, 1))))
    guarantee = k * size
    single = draw(st.integers(0, size))
    if single and side_by_side(nodes[k:], [single]):
        later = draw(st.integers(submit, 3_600))
        rows.append(row("o1", later, 3_000, single, "owner", draw(st.integers(0, 1))))
        guarantee += single
    return nodes, guarantee, within, rows


@settings(
    max_examples=10,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(case=gang_fleets())
@example(  # two 4-GPU nodes full of 1-GPU borrowers, half unable to checkpoint
    case=(
        [4, 4],
        8,
        300.0,
        [row(f"l{n}", 0, 20_000, 1, "lender", n % 2) for n in range(8)]
        + [row("o0", 300, 3_000, 8, "owner", 0)],
    )
)
@example(  # a 1-GPU job the tick a job of two 4-GPU nodes comes: moving 1 GPU off n0 is
    # cheapest for it, but the job of two nodes chooses first and takes n0 and n1, so it is
    # moved off n2's 2-GPU job instead
    case=(
        [4, 4, 2],
        9,
        300.0,
        [row("big", 0, 20_000, 2, "lender", 0)]
        + [row(f"l{n}", 0, 20_000, 1, "lender", n % 2) for n in range(8)]
        + [row("o1", 310, 3_000, 1, "owner", 0), row("o0", 311, 3_000, 8, "owner", 0)],
    )
)
@example(  # a gang of two and a 2-GPU job of the same team, half a minute apart
    case=(
        [4, 4, 4],
        10,
        300.0,
        [row(f"l{n}", 0, 20_000, 2, "lender", n % 2) for n in range(6)]
        + [row("o0", 300, 3_000, 8, "owner", 1), row("o1", 330, 3_000, 2, "owner", 0)],
    )
)
def test_replayed_a_multi_node_owner_below_its_guarantee_starts_within_the_bound(
    tmp_path: Path, case: tuple[list[int], int, float, list[str]]
) -> None:
    nodes, guarantee, within, rows = case
    config = f"""
reclaim_within_s: {within}
teams:
  owner: {{guaranteed_gpus: {guarantee}}}
  lender: {{guaranteed_gpus: 0}}
"""
    result = replayed(tmp_path, scenario("multinode-reclaim", nodes, config), rows)
    owner_waits = waits_of(result, "owner")
    assert len(owner_waits) == sum(1 for r in rows if ",owner," in r), "the owner's jobs ran"
    # No cloud capacity may be bought (max_instances 0): only reclaim can start them.
    assert max(owner_waits) <= within, (owner_waits, within, nodes, guarantee)


@st.composite
def preempt_fleets(draw: st.DrawFn) -> tuple[list[int], float, list[str]]:
    """As ``gang_fleets``, the nodes filled by 1-GPU jobs of lower classes (some that cannot
    checkpoint) and the jobs of k nodes and of one node of the preempting class."""
    size = draw(st.sampled_from([2, 4]))
    nodes = [size] * draw(st.integers(2, 3))
    if draw(st.booleans()):
        nodes.append(draw(st.integers(1, size - 1)))
    within = draw(st.sampled_from([300.0, 600.0]))
    rows = [
        class_row(
            f"l{n}-{i}",
            0,
            20_000,
            1,
            draw(st.sampled_from(["batch", "normal", "unlisted"])),
            draw(st.integers(0, 1)),
        )
        for n, gpus in enumerate(nodes)
        for i in range(gpus)
    ]
    k = draw(st.integers(2, nodes.count(size)))
    submit = draw(st.integers(300, 3_000))
    rows.append(class_row("u0", submit, 3_000, k * size, "urgent", draw(st.integers(0, 1))))
    single = draw(st.integers(0, size))
    if single and side_by_side(nodes[k:], [single]):
        later = draw(st.integers(submit, 3_600))
        rows.append(class_row("u1", later, 3_000, single, "urgent", draw(st.integers(0, 1))))
    return nodes, within, rows


@settings(
    max_examples=10,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(case=preempt_fleets())
@example(  # two 4-GPU nodes of batch work, half unable to checkpoint
    case=(
        [4, 4],
        300.0,
        [class_row(f"l{n}", 0, 20_000, 1, "batch", n % 2) for n in range(8)]
        + [class_row("u0", 300, 3_000, 8, "urgent", 0)],
    )
)
def test_replayed_a_multi_node_preempting_job_starts_within_its_bound(
    tmp_path: Path, case: tuple[list[int], float, list[str]]
) -> None:
    nodes, within, rows = case
    text = scenario("multinode-preempt", nodes, CLASSES_YAML.replace("WITHIN", str(within)))
    waits = waits_of(replayed(tmp_path, text, rows), "urgent")
    assert len(waits) == sum(1 for r in rows if ",urgent," in r), "the preempting jobs ran"
    # No cloud capacity may be bought (max_instances 0): only preemption can start them.
    assert max(waits) <= within, (waits, within, nodes)
