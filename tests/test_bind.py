"""Room made for a pending job is kept for it: the job reclaim or preemption frees room for is
bound to the nodes being freed when its moves are decided (``MovesJobsOff.bind``), and the
simulator's scheduler starts it only there, one member on each for a multi-node job (as the
Slurm adapter binds it through its ``ReqNodeList``), until it starts or ``MOVE_HOLD_S`` has
passed since the binding; so room freed for owner jobs of several shapes is not taken by one
from another, even while some of their movers still checkpoint. Replayed through the real
controller, several preempting jobs of mixed shapes start within their bound (the reclaim
property is in tests/test_reclaim.py)."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from team_replays import replayed, scenario, waits_of
from test_priority_classes import CLASSES_YAML, row
from test_sim_scheduler import World, trace_job

from autoscaler.model import Capacity, OnPremUse, Placement
from autoscaler.model.errors import SourceError
from autoscaler.sim.scheduler import MOVE_HOLD_S
from autoscaler.sim.trace import TraceJob
from autoscaler.spi.sources import HeldOff, RunningJob
from autoscaler.tick.rules.rebalance_onprem import OnPremJobs
from autoscaler.tick.rules.taking import Claims


def test_a_job_bound_when_its_moves_are_decided_starts_only_there_until_it_starts() -> None:
    """Room is being made on x for "first" (bound to x when its moves were decided; one of its
    two movers moved, the other still checkpointing) while y is already free for "second":
    without the binding "first", older, would take y and "second" would wait for x's second
    mover. The binding holds from the decision, before any mover has moved."""
    world = World()
    s = world.scheduler
    s.apply_placement(Placement())
    s.add_node("x", 2, Capacity.ONPREM, None, 0.0)
    s.add_node("y", 2, Capacity.ONPREM, None, 0.0)
    fillers = [s.submit(trace_job(f"f{n}", duration=9e4, interval=600.0), 0.0) for n in range(4)]
    s.schedule(0.0)
    on = {name: [f for f in fillers if f.node is not None and f.node.name == name] for name in "xy"}
    assert len(on["x"]) == len(on["y"]) == 2
    first = s.submit(trace_job("first", gpus=2, duration=100.0), 10.0)
    second = s.submit(trace_job("second", gpus=2, duration=100.0), 11.0)
    # the moved jobs may no longer use on-prem (they would take either room back otherwise)
    s.apply_placement(Placement(protect_uncheckpointable=True, spot_safe_onprem=OnPremUse.NEVER))
    s.bind(str(first.seq), ["x"])
    s.bind(str(second.seq), ["y"])
    assert (s.bound_to(str(first.seq)), s.bound_to(str(second.seq))) == (("x",), ("y",))
    assert s.held_off() == [], "binding holds nobody off"
    s.move_off(str(on["x"][0].seq), "x", str(first.seq))
    for f in on["y"]:
        s.move_off(str(f.seq), "y", str(second.seq))
    s.schedule(12.0)
    assert first.node is None
    assert second.node is not None and second.node.name == "y"
    s.move_off(str(on["x"][1].seq), "x", str(first.seq))
    s.schedule(13.0)
    assert first.node is not None and first.node.name == "x"
    assert s.bound_to(str(first.seq)) == () and s.held_off() == []


def test_room_that_comes_free_before_any_mover_has_moved_is_kept_for_the_bound_job() -> None:
    """A job on y ends by itself while x's movers for "owner" still checkpoint: the owner, bound
    to x, does not take y (another job made room for may need it), and an older job behind it,
    of its shape and not bound, does (backfill)."""
    world = World()
    s = world.scheduler
    s.apply_placement(Placement())
    s.add_node("x", 1, Capacity.ONPREM, None, 0.0)
    s.add_node("y", 1, Capacity.ONPREM, None, 0.0)
    mover = s.submit(trace_job("mover", duration=9e4, interval=600.0), 0.0)
    ending = s.submit(trace_job("ending", duration=50.0), 0.0)
    s.schedule(0.0)
    assert mover.node is not None and mover.node.name == "x"
    owner = s.submit(trace_job("owner", duration=100.0), 10.0)
    other = s.submit(trace_job("other", duration=100.0), 11.0)
    s.bind(str(owner.seq), ["x"])
    world.run_until(60.0)
    assert ending.finished_at == 50.0
    s.schedule(60.0)
    assert owner.node is None and other.node is not None and other.node.name == "y"
    s.move_off(str(mover.seq), "x", str(owner.seq))
    s.schedule(61.0)
    assert owner.node is not None and owner.node.name == "x"


def test_a_binding_ends_move_hold_s_after_it_was_made_and_binding_again_changes_nothing() -> None:
    world = World()
    s = world.scheduler
    s.apply_placement(Placement())
    s.add_node("a", 1, Capacity.ONPREM, None, 0.0)
    first = s.submit(trace_job("first", duration=90_000.0), 0.0)
    s.schedule(0.0)
    s.add_node("b", 1, Capacity.ONPREM, None, 1.0)
    owner = s.submit(trace_job("owner", duration=100.0), 5.0)
    world.clock.set(5.0)
    s.bind(str(owner.seq), ["a"])
    s.schedule(5.0)
    assert owner.node is None, "bound to a, the job leaves the free b alone"
    world.clock.set(100.0)
    s.bind(str(owner.seq), ["a"])  # the same nodes: the binding still dates from 5 s
    world.clock.set(4.0 + MOVE_HOLD_S)
    s.held_off()
    s.schedule(4.0 + MOVE_HOLD_S)
    assert owner.node is None and s.bound_to(str(owner.seq)) == ("a",)
    world.clock.set(5.0 + MOVE_HOLD_S)
    s.held_off()
    s.schedule(5.0 + MOVE_HOLD_S)
    assert s.bound_to(str(owner.seq)) == ()
    assert owner.node is not None and owner.node.name == "b"
    assert first.node is not None and first.node.name == "a"


def test_no_other_job_starts_on_a_node_bound_to_a_pending_job() -> None:
    """Room freed in part on x (its mover that cannot checkpoint gone, the other still
    checkpointing) is kept for the 2-GPU job bound there: a 1-GPU job submitted since waits,
    as Slurm starts nothing that would delay the bound job and Kubernetes' hold taint keeps
    other pods off."""
    world = World()
    s = world.scheduler
    s.apply_placement(Placement())
    s.add_node("x", 2, Capacity.ONPREM, None, 0.0)
    stays = s.submit(trace_job("stays", duration=9e4, interval=600.0), 0.0)
    goes = s.submit(trace_job("goes", duration=9e4), 0.0)
    s.schedule(0.0)
    owner = s.submit(trace_job("owner", gpus=2, duration=100.0), 10.0)
    s.bind(str(owner.seq), ["x"])
    s.apply_placement(Placement(protect_uncheckpointable=True, spot_safe_onprem=OnPremUse.NEVER))
    s.move_off(str(goes.seq), "x", str(owner.seq))
    newcomer = s.submit(trace_job("newcomer", duration=100.0), 11.0)
    s.schedule(11.0)
    assert newcomer.node is None and owner.node is None and s.nodes["x"].free == 1
    s.move_off(str(stays.seq), "x", str(owner.seq))
    s.schedule(13.0)
    assert owner.node is not None and owner.node.name == "x"


def test_a_bound_job_behind_older_jobs_of_its_shape_starts_on_its_room() -> None:
    """The jobs ahead of it in the queue may not use the node kept for it; it does."""
    world = World()
    s = world.scheduler
    s.apply_placement(Placement())
    s.add_node("x", 1, Capacity.ONPREM, None, 0.0)
    older = s.submit(trace_job("older", duration=100.0), 0.0)
    owner = s.submit(trace_job("owner", duration=100.0), 1.0)
    s.bind(str(owner.seq), ["x"])
    s.schedule(2.0)
    assert older.node is None
    assert owner.node is not None and owner.node.name == "x"


def test_binding_to_other_nodes_replaces_the_binding() -> None:
    world = World()
    s = world.scheduler
    s.apply_placement(Placement())
    s.add_node("a", 1, Capacity.ONPREM, None, 0.0)
    s.add_node("b", 1, Capacity.ONPREM, None, 0.0)
    filler = s.submit(trace_job("filler", duration=9e4), 0.0)
    s.schedule(0.0)
    assert filler.node is not None
    free = "b" if filler.node.name == "a" else "a"
    owner = s.submit(trace_job("owner", duration=100.0), 1.0)
    s.bind(str(owner.seq), [filler.node.name])
    s.schedule(2.0)
    assert owner.node is None, "bound to the busy node, it leaves the free one alone"
    world.clock.set(3.0)
    s.bind(str(owner.seq), [free])
    s.schedule(3.0)
    assert owner.node is not None and owner.node.name == free


def test_only_a_pending_job_is_bound_and_to_one_node_per_member() -> None:
    """A job that started elsewhere while its moves were decided is not bound: the controller
    then moves nothing for it. Nodes that are not one per member are refused, as is a job the
    simulator never saw."""
    world = World()
    s = world.scheduler
    s.apply_placement(Placement())
    s.add_node("a", 1, Capacity.ONPREM, None, 0.0)
    s.add_node("b", 1, Capacity.ONPREM, None, 0.0)
    s.add_node("c", 1, Capacity.ONPREM, None, 0.0)
    mover = s.submit(trace_job("mover", duration=90_000.0), 0.0)
    s.schedule(0.0)
    owner = s.submit(trace_job("owner", duration=100.0), 1.0)
    s.schedule(1.0)
    assert owner.node is not None and mover.node is not None
    with pytest.raises(SourceError, match="not pending"):
        s.bind(str(owner.seq), [mover.node.name])
    assert s.bound_to(str(owner.seq)) == ()
    gang = s.submit(_gang("gang", 2), 2.0)
    for nodes in (["a"], ["a", "a"], ["a", "b", "c"]):
        with pytest.raises(SourceError, match="2 distinct node"):
            s.bind(str(gang.seq), nodes)
    for unknown in ("99", "x; rm"):
        with pytest.raises(SourceError, match="no job"):
            s.bind(unknown, ["a"])
    assert s.bound_to(str(gang.seq)) == ()


def test_a_job_is_not_bound_to_a_node_it_is_held_off() -> None:
    """A job moved off a for another job is kept off a while that hold stands: bound there as
    well, it could start nowhere until the hold ended, so the binding is refused and the
    controller moves nothing for it (the rule looks elsewhere: tests/test_reclaim.py)."""
    world = World()
    s = world.scheduler
    s.apply_placement(Placement())
    s.add_node("a", 1, Capacity.ONPREM, None, 0.0)
    s.add_node("b", 1, Capacity.ONPREM, None, 0.0)
    moved = s.submit(trace_job("moved", duration=90_000.0, interval=600.0), 0.0)
    other = s.submit(trace_job("other", duration=90_000.0), 0.0)
    s.schedule(0.0)
    assert moved.node is not None and other.node is not None
    left = moved.node.name
    waiter = s.submit(trace_job("waiter", duration=100.0), 1.0)
    s.move_off(str(moved.seq), left, str(waiter.seq))
    with pytest.raises(SourceError, match=f"held off \\['{left}'\\]"):
        s.bind(str(moved.seq), [left])
    assert s.bound_to(str(moved.seq)) == ()
    s.bind(str(moved.seq), [other.node.name])  # elsewhere it may be bound
    assert s.bound_to(str(moved.seq)) == (other.node.name,)


def _gang(job_id: str, nodes: int, per_node: int = 1, duration: float = 100.0) -> TraceJob:
    return TraceJob(job_id, 0.0, duration, nodes * per_node, 1.0, None, 0.0, False, nodes=nodes)


def test_a_bound_multi_node_job_starts_only_on_all_its_nodes_one_member_each() -> None:
    """A 2-node job bound to x and y waits while only x has room, though z and w are free, and
    starts on exactly x and y once both have."""
    world = World()
    s = world.scheduler
    s.apply_placement(Placement())
    for name in "xyzw":
        s.add_node(name, 2, Capacity.ONPREM, None, 0.0)
    on_x = s.submit(trace_job("on-x", gpus=2, duration=9e4, interval=600.0), 0.0)
    on_y = s.submit(trace_job("on-y", gpus=2, duration=9e4, interval=600.0), 0.0)
    s.schedule(0.0)
    assert {j.node.name for j in (on_x, on_y) if j.node is not None} <= {"x", "y", "z", "w"}
    x, y = on_x.node, on_y.node
    assert x is not None and y is not None
    gang = s.submit(_gang("gang", 2, per_node=2), 10.0)
    s.bind(str(gang.seq), [x.name, y.name])
    s.schedule(10.0)
    assert gang.node is None, "z and w are free, but the gang is bound to x and y"
    s.move_off(str(on_x.seq), x.name, str(gang.seq))
    s.schedule(11.0)
    assert gang.node is None, "half of its room starts nothing"
    s.move_off(str(on_y.seq), y.name, str(gang.seq))
    s.schedule(12.0)
    assert sorted(n.name for n in gang.members) == sorted([x.name, y.name])
    assert s.bound_to(str(gang.seq)) == () and s.held_off() == []
    assert x.free == y.free == 0


def test_jobs_behind_a_bound_multi_node_job_still_start_elsewhere() -> None:
    world = World()
    s = world.scheduler
    s.apply_placement(Placement())
    for name in "wxyz":
        s.add_node(name, 1, Capacity.ONPREM, None, 0.0)
    busy = s.submit(trace_job("busy", duration=9e4, interval=600.0), 0.0)
    s.schedule(0.0)
    assert busy.node is not None
    free = sorted({"w", "x", "y", "z"} - {busy.node.name})
    gang = s.submit(_gang("gang", 2), 1.0)
    behind = s.submit(_gang("behind", 2), 2.0)
    s.bind(str(gang.seq), [busy.node.name, free[0]])
    s.schedule(3.0)
    assert gang.node is None, "half of its nodes have room"
    assert sorted(n.name for n in behind.members) == free[1:], "the gang's free node is kept"


def test_a_hold_for_a_job_that_runs_keeps_no_node_busy() -> None:
    running = {"a": [RunningJob("p", "a", 1, 0.0)], "b": [RunningJob("x", "b", 1, 0.0)]}
    onprem = OnPremJobs({}, held=(HeldOff("m", "b", "p", 0.0), HeldOff("n", "a", "q", 0.0)))
    claims = Claims.of(onprem, running, ())
    assert claims.busy_nodes == {"a"}


# -- preemption replayed: several preempting jobs of mixed shapes --------------------------------


@st.composite
def fleets(draw: st.DrawFn) -> tuple[list[int], float, list[str]]:
    nodes = draw(st.lists(st.integers(1, 4), min_size=1, max_size=3))
    within = draw(st.sampled_from([300.0, 600.0, 900.0]))
    rows = []
    for n, gpus in enumerate(nodes):
        left = gpus
        k = 0
        while left:
            size = draw(st.integers(1, left))
            cls = draw(st.sampled_from(["batch", "normal", "unlisted"]))
            rows.append(row(f"l{n}-{k}", 0, 20_000, size, cls, draw(st.integers(0, 1))))
            left -= size
            k += 1
    # up to three jobs of the preempting class, arriving any distance apart (in one tick too):
    # each is bound to the room made for it when its moves are decided, so room freed at once
    # for one while the movers for another still checkpoint is not taken by the other. Their
    # shapes fit the nodes side by side whichever nodes the earlier ones are given: the rule
    # serves jobs oldest first and does not foresee (an earlier smaller job may be given the
    # only node a later bigger one fits on, and an equal class is never taken back), which no
    # binding can mend (docs/teams.md)
    urgent: list[tuple[int, int]] = []
    for n in range(draw(st.integers(1, 3))):
        gpus = draw(st.integers(1, max(nodes)))
        submit = draw(st.integers(300, 6_000))
        if not fits_as_they_come(nodes, [*urgent, (submit, gpus)]):
            break
        urgent.append((submit, gpus))
        rows.append(row(f"u{n}", submit, 3_000, gpus, "urgent", draw(st.integers(0, 1))))
    return nodes, within, rows


def fits_as_they_come(nodes: Sequence[int], jobs: Sequence[tuple[int, int]]) -> bool:
    """Whether single-node jobs of these (submit, gpus) all fit on nodes of these sizes, taken
    oldest first (jobs of one age in any order), whichever node with room each is given."""
    orders = (
        [gpus for _, gpus in order]
        for order in itertools.permutations(jobs)
        if all(a[0] <= b[0] for a, b in itertools.pairwise(order))
    )
    return all(_always_fits(list(nodes), order) for order in orders)


def _always_fits(free: list[int], jobs: Sequence[int]) -> bool:
    if not jobs:
        return True
    first, rest = jobs[0], jobs[1:]
    room = [i for i, f in enumerate(free) if f >= first]
    return bool(room) and all(
        _always_fits([*free[:i], free[i] - first, *free[i + 1 :]], rest) for i in room
    )


@settings(
    max_examples=10,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(case=fleets())
@example(  # a 1-GPU and a 2-GPU job in one tick: the small one must not take the big one's room
    case=(
        [3, 2],
        300.0,
        [row(f"l{n}", 0, 20_000, 1, "batch", 0) for n in range(5)]
        + [row("u0", 300, 3_000, 1, "urgent", 0), row("u1", 300, 3_000, 2, "urgent", 0)],
    )
)
@example(  # in one tick: the 2-GPU job's room on n1 is free at once (its jobs cannot
    # checkpoint) while the 1-GPU job's mover on n0 checkpoints; bound only once a mover had
    # moved, the older 1-GPU job took part of n1 and the 2-GPU one waited 3,000 s
    case=(
        [1, 2],
        300.0,
        [
            row("l0-0", 0, 20_000, 1, "batch", 1),
            row("l1-0", 0, 20_000, 1, "batch", 0),
            row("l1-1", 0, 20_000, 1, "batch", 0),
            row("u0", 300, 3_000, 1, "urgent", 0),
            row("u1", 300, 3_000, 2, "urgent", 0),
        ],
    )
)
@example(  # the 1-GPU job, arriving a second after the tick that freed part of n1 for the
    # 3-GPU one (its other mover still checkpointing), took that part: a node bound to a
    # pending job takes no other job
    case=(
        [2, 3],
        300.0,
        [row(f"l0-{k}", 0, 20_000, 1, "batch", 0) for k in range(2)]
        + [row(f"l1-{k}", 0, 20_000, 1, "batch", int(k == 2)) for k in range(3)]
        + [row("u0", 361, 3_000, 3, "urgent", 0), row("u1", 421, 3_000, 1, "urgent", 0)],
    )
)
def test_replayed_preempting_jobs_of_mixed_shapes_start_within_their_bound(
    tmp_path: Path, case: tuple[list[int], float, list[str]]
) -> None:
    nodes, within, rows = case
    text = scenario("preempt", nodes, CLASSES_YAML.replace("WITHIN", str(within)))
    waits = waits_of(replayed(tmp_path, text, rows), "urgent")
    assert waits, "the preempting jobs ran"
    # No cloud capacity may be bought (max_instances 0): only preemption can start them.
    assert max(waits) <= within, (waits, within, nodes)
