"""The guard's promise: whatever a policy asks for, and whatever act ends up buying through
fallbacks, no tick leaves the fleet above a limit or the budget."""

from __future__ import annotations

from dataclasses import replace

from fakes import Rig, pool, rig
from hypothesis import given, settings
from hypothesis import strategies as st
from test_controller import Scripted
from test_rebalance_onprem import move, view_of

from autoscaler.fleet.memory import Cooldowns
from autoscaler.model import DrainRequest, Instance, InstanceState, LaunchRequest, Plan, Pool
from autoscaler.model.config import Limits
from autoscaler.model.errors import CapacityError
from autoscaler.tick.guard import guard
from autoscaler.tick.intents import MoveJobs, Requests

GPU_SHAPES = (1, 2, 4, 8)


@st.composite
def worlds(
    draw: st.DrawFn,
) -> tuple[Rig, list[Pool], dict[str, float], dict[str, int | float | None]]:
    count = draw(st.integers(1, 5))
    pools = [
        pool(
            f"p{i}",
            gpus=draw(st.sampled_from(GPU_SHAPES)),
            market=draw(st.sampled_from(["spot", "on-demand"])),
            max_instances=draw(st.none() | st.integers(0, 8)),
        )
        for i in range(count)
    ]
    prices = {p.name: draw(st.floats(0.1, 10.0)) for p in pools}
    existing = {
        p.name: draw(st.integers(0, p.max_instances if p.max_instances is not None else 6))
        for p in pools
    }
    existing_gpus = sum(existing[p.name] * p.gpus_per_instance for p in pools)
    existing_cost = sum(existing[p.name] * prices[p.name] for p in pools)
    limits: dict[str, int | float | None] = {
        "max_instances": draw(st.none() | st.integers(sum(existing.values()), 40)),
        "max_gpus": draw(st.none() | st.integers(existing_gpus, 200)),
        "max_cost_per_hour": draw(st.none() | st.floats(existing_cost, existing_cost + 60)),
        "max_launches_per_tick": draw(st.integers(1, 20)),
        "max_drains_per_tick": draw(st.integers(1, 5)),
        "scale_down_cooldown_s": 0.0,
    }
    t = rig(pools, prices, limits=limits)
    for p in pools:
        for n in range(existing[p.name]):
            t.cloud.instances[f"{p.name}-old-{n}"] = Instance(
                id=f"{p.name}-old-{n}",
                pool=p.name,
                state=InstanceState.RUNNING,
                launched_at=0.0,
                request_id="old",
                gpus=p.gpus_per_instance,
            )
    names = [p.name for p in pools]
    launches = tuple(
        LaunchRequest(
            pool=draw(st.sampled_from(names)),
            count=draw(st.integers(1, 30)),
            fallbacks=tuple(draw(st.lists(st.sampled_from(names), max_size=4))),
        )
        for _ in range(draw(st.integers(0, 4)))
    )
    drains = (
        tuple(
            DrainRequest(instance_id=i)
            for i in draw(st.lists(st.sampled_from(sorted(t.cloud.instances)), unique=True))
        )
        if t.cloud.instances
        else ()
    )
    t.controller.policy = Scripted(plan=Plan(launches=launches, drains=drains))
    t.cloud.faults = draw(st.lists(st.sampled_from([None, CapacityError("ICE")]), max_size=4))
    return t, pools, prices, limits


@settings(max_examples=300, deadline=None)
@given(worlds())
def test_no_tick_leaves_the_fleet_above_a_limit_or_the_budget(
    world: tuple[Rig, list[Pool], dict[str, float], dict[str, int | float | None]],
) -> None:
    t, pools, prices, limits = world
    before = len(t.cloud.instances)
    report = t.controller.tick()
    assert report.held is None
    live = list(t.cloud.instances.values())
    by_pool = {p.name: sum(1 for i in live if i.pool == p.name) for p in pools}
    for p in pools:
        if p.max_instances is not None:
            assert by_pool[p.name] <= p.max_instances, p.name
    if limits["max_instances"] is not None:
        assert len(live) <= limits["max_instances"]
    if limits["max_gpus"] is not None:
        assert sum(i.gpus for i in live) <= limits["max_gpus"]
    if limits["max_cost_per_hour"] is not None:
        assert sum(prices[i.pool] for i in live) <= limits["max_cost_per_hour"] + 1e-6
    launched = sum(a.done for a in report.actions if a.kind == "launch")
    assert launched <= limits["max_launches_per_tick"]
    terminated = sum(a.done for a in report.actions if a.kind == "terminate")
    assert terminated <= limits["max_drains_per_tick"]
    assert len(live) == before + launched - terminated


def test_a_pool_that_just_scaled_up_is_not_drained_within_the_cool_down() -> None:
    t = rig([pool("a")], {"a": 1.0}, limits={"scale_down_cooldown_s": 600})
    t.controller.policy = Scripted(plan=Plan(launches=(LaunchRequest(pool="a", count=1),)))
    t.controller.tick()
    (instance,) = t.cloud.instances
    t.controller.policy = Scripted(plan=Plan(drains=(DrainRequest(instance_id=instance),)))
    t.clock.advance(300)
    report = t.controller.tick()
    assert [c.rule for c in report.clamps] == ["scale_down_cooldown"]
    assert instance in t.cloud.instances
    t.clock.advance(301)
    t.controller.tick()
    assert instance not in t.cloud.instances


def test_scale_up_cool_down_blocks_a_second_launch_in_the_same_pool_only() -> None:
    t = rig([pool("a"), pool("b")], {"a": 1.0, "b": 2.0}, limits={"scale_up_cooldown_s": 300})
    t.controller.policy = Scripted(plan=Plan(launches=(LaunchRequest(pool="a", count=1),)))
    t.controller.tick()
    t.clock.advance(60)
    t.controller.policy = Scripted(
        plan=Plan(launches=(LaunchRequest(pool="a", count=1, fallbacks=("b",)),))
    )
    report = t.controller.tick()
    assert [(a.pool, a.done) for a in report.actions if a.kind == "launch"] == [("b", 1)]
    assert [c.rule for c in report.clamps] == ["scale_up_cooldown"]


def test_budget_counts_instances_already_running_and_unknown_prices_hold_scale_up() -> None:
    t = rig([pool("a"), pool("b")], {"a": 3.0}, limits={"max_cost_per_hour": 10.0})
    t.controller.policy = Scripted(plan=Plan(launches=(LaunchRequest(pool="a", count=5),)))
    report = t.controller.tick()
    assert sum(a.done for a in report.actions if a.kind == "launch") == 3
    assert [c.rule for c in report.clamps] == ["budget"]
    t.cloud.instances["stray"] = Instance(
        id="stray", pool="b", state=InstanceState.RUNNING, launched_at=0, request_id="x", gpus=1
    )
    t.clock.advance(60)
    t.controller.policy = Scripted(plan=Plan(launches=(LaunchRequest(pool="a", count=1),)))
    report = t.controller.tick()
    assert not [a for a in report.actions if a.kind == "launch"]
    assert "no price known" in report.clamps[0].detail


# -- job moves: a multi-node job's room all or none ---------------------------------------------


def gang_move(node: str, jobs: int, for_job: str, together: tuple[str, ...]) -> MoveJobs:
    return replace(move(node, jobs, for_job), together=together)


def test_a_multi_node_jobs_moves_are_granted_together_or_not_at_all() -> None:
    ab = ("a", "b")
    requests = Requests(
        moves=[
            move("x", 1, "p1"),
            gang_move("a", 2, "gang", ab),
            move("y", 1, "p2"),
            gang_move("b", 2, "gang", ab),
        ]
    )
    view = view_of([], [], [])
    # 1 + 4 + 1 = 6 jobs: all granted at 6
    granted = guard(Plan(), requests, view, Limits(max_job_moves_per_tick=6), Cooldowns())
    assert [(m.node, m.for_job) for m in granted.moves] == [
        ("x", "p1"),
        ("a", "gang"),
        ("y", "p2"),
        ("b", "gang"),
    ]
    # at 5 the gang's 4 jobs after p1's 1 fit, p2's do not: never half of the gang's room
    granted = guard(Plan(), requests, view, Limits(max_job_moves_per_tick=5), Cooldowns())
    assert [m.node for m in granted.moves] == ["x", "a", "b"]
    # at 3 the gang is refused whole, with one clamp naming it, and p2 still fits
    granted = guard(Plan(), requests, view, Limits(max_job_moves_per_tick=3), Cooldowns())
    assert [m.node for m in granted.moves] == ["x", "y"]
    (clamp,) = granted.clamps
    assert clamp.rule == "job_move_rate" and clamp.requested == 4 and clamp.allowed == 0
    assert "job gang's 2 nodes are freed together" in clamp.detail


@settings(max_examples=100)
@given(
    st.lists(
        st.tuples(st.integers(0, 3), st.integers(1, 3), st.sampled_from(["g1", "g2", ""])),
        max_size=8,
    ),
    st.integers(1, 10),
)
def test_granted_moves_stay_within_the_move_rate_and_keep_every_gang_whole(
    drawn: list[tuple[int, int, str]], limit: int
) -> None:
    gangs = {g: tuple(f"{g}-n{i}" for i, _ in enumerate(drawn)) for g in ("g1", "g2")}
    moves = [
        gang_move(f"{gang}-n{i}", jobs, gang, gangs[gang])
        if gang
        else move(f"solo-{i}", jobs, f"p{owner}")
        for i, (owner, jobs, gang) in enumerate(drawn)
    ]
    granted = guard(
        Plan(),
        Requests(moves=moves),
        view_of([], [], []),
        Limits(max_job_moves_per_tick=limit),
        Cooldowns(),
    ).moves
    assert sum(len(m.jobs) for m in granted) <= limit
    assert [m for m in moves if m in granted] == list(granted), "the rule's order is kept"
    for gang in gangs:
        mine = [m for m in moves if m.for_job == gang]
        assert all(m in granted for m in mine) or not any(m in granted for m in mine)
