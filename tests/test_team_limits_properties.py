"""Issue 19's property: no team's cloud use ever exceeds its burst limits or its monthly budget,
whatever the policy asks for and whatever act's fallbacks end up buying, tick after tick; with
no fleet-wide limit binding, every team gets what it asked within its own limits; and binding
fleet-wide limits are split between the teams by weight, within one instance."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field

from fakes import pool
from hypothesis import given, settings
from hypothesis import strategies as st
from test_team_limits import HOUR, NOW, granted_by_team, run, view_of

from autoscaler.fleet.team_spend import TeamSpend
from autoscaler.model import InstanceState, LaunchRequest, Pool, PoolView
from autoscaler.model.config import Limits
from autoscaler.model.teams import TeamsConfig, TeamSpec
from autoscaler.tick.budget import hours_to_month_end
from autoscaler.tick.guard import fallbacks_for
from autoscaler.tick.team_limits import TeamLedger

# 200 in CI; TEAM_LIMITS_EXAMPLES=5000 for a longer search (run so before the commit).
EXAMPLES = int(os.environ.get("TEAM_LIMITS_EXAMPLES", "200"))
NAMES = ("a", "b", "c")
PARTIES = (*NAMES, "unlisted", None)

specs = st.builds(
    TeamSpec,
    burst_gpus=st.none() | st.integers(0, 40),
    burst_usd_per_hour=st.none() | st.floats(0.0, 60.0),
    monthly_budget_usd=st.none() | st.floats(0.0, 40_000.0),
    weight=st.floats(0.25, 4.0),
)


@dataclass
class World:
    pools: list[tuple[Pool, float | None]]
    teams: TeamsConfig
    live: list[tuple[str, str, InstanceState]] = field(default_factory=list)
    owners: dict[str, str | None] = field(default_factory=dict)
    spent_before: dict[str, float] = field(default_factory=dict)
    limits: list[Limits] = field(default_factory=list)
    plans: list[list[LaunchRequest]] = field(default_factory=list)
    failures: list[list[bool]] = field(default_factory=list)


@st.composite
def worlds(draw: st.DrawFn) -> World:
    count = draw(st.integers(1, 3))
    pools = [
        (
            pool(f"p{k}", gpus=draw(st.sampled_from((1, 2, 4, 8)))),
            draw(st.none() | st.floats(0.25, 12.0)) if k else draw(st.floats(0.25, 12.0)),
        )
        for k in range(count)
    ]
    names = [p.name for p, _ in pools]
    teams = TeamsConfig(
        teams={n: draw(specs) for n in NAMES[: draw(st.integers(1, 3))]},
        unassigned=draw(specs),
    )
    world = World(pools, teams)
    for k in range(draw(st.integers(0, 8))):
        iid = f"old-{k}"
        world.live.append(
            (iid, draw(st.sampled_from(names)), draw(st.sampled_from(list(InstanceState))))
        )
        world.owners[iid] = draw(st.sampled_from(PARTIES))
    world.spent_before = {n: draw(st.floats(0.0, 20_000.0)) for n in (*NAMES, "unlisted")}
    for _ in range(draw(st.integers(1, 4))):
        world.limits.append(
            Limits(
                max_gpus=draw(st.none() | st.integers(0, 120)),
                max_instances=draw(st.none() | st.integers(0, 40)),
                max_cost_per_hour=draw(st.none() | st.floats(0.0, 200.0)),
                max_launches_per_tick=draw(st.integers(1, 60)),
            )
        )
        plan = []
        for _ in range(draw(st.integers(0, 5))):
            gang = draw(st.sampled_from((1, 1, 2)))
            plan.append(
                LaunchRequest(
                    pool=draw(st.sampled_from(names)),
                    count=gang * draw(st.integers(1, 12)),
                    fallbacks=tuple(draw(st.lists(st.sampled_from(names), max_size=2))),
                    gang_size=gang,
                    team=draw(st.sampled_from(PARTIES)),
                )
            )
        world.plans.append(plan)
        world.failures.append(draw(st.lists(st.booleans(), min_size=4, max_size=4)))
    return world


@dataclass
class Use:
    gpus: int = 0
    usd: float = 0.0
    kept_usd: float = 0.0


def use_of(world: World, pools: dict[str, PoolView]) -> dict[str, Use]:
    found: dict[str, Use] = {}
    for iid, name, state in world.live:
        team = world.owners.get(iid)
        if team is None or state not in LIVE:
            continue
        use = found.setdefault(team, Use())
        use.gpus += pools[name].pool.gpus_per_instance
        price = pools[name].price
        if price is not None:
            use.usd += price.price_per_hour
            if state in KEPT:
                use.kept_usd += price.price_per_hour
    return found


LIVE = {
    InstanceState.REQUESTED,
    InstanceState.PENDING,
    InstanceState.RUNNING,
    InstanceState.DRAINING,
    InstanceState.INTERRUPTED,
}
KEPT = {InstanceState.REQUESTED, InstanceState.PENDING, InstanceState.RUNNING}


@settings(max_examples=EXAMPLES, deadline=None)
@given(worlds())
def test_no_team_ever_holds_more_than_its_burst_limits_or_projects_past_its_budget(
    world: World,
) -> None:
    spend = TeamSpend()
    now = NOW
    serial = 0
    for tick, (limits, plan) in enumerate(zip(world.limits, world.plans, strict=True)):
        view = view_of(world.pools, world.live, now=now)
        pools = dict(view.pool_by_name)
        spend.accrue(view, world.owners)
        month = spend.month(now)
        spent = {t: world.spent_before.get(t, 0.0) + month.get(t, 0.0) for t in world.spent_before}
        ledger = TeamLedger(world.teams, dict(world.owners), spent)
        before = use_of(world, pools)
        intents = run(view, plan, world.teams, world.owners, spent, limits)
        assert ledger.config is world.teams
        bought: list[tuple[str | None, str, int]] = []
        failures = iter(world.failures[tick] * 100)
        assert intents.fallbacks is not None
        for intent in intents.launches:
            team = intent.request.team
            room = fallbacks_for(intents.fallbacks, team)
            chains = [intent.steps, *intent.gangs]
            for steps in chains:
                missed = 0
                for step in steps:
                    pool_view = pools[step.pool]
                    count = step.granted
                    if missed:
                        # act moves a failed step's nodes here, as far as the room admits
                        count += room.admit_launch(pool_view, missed)
                        missed = 0
                    if count and next(failures):
                        room.refund(pool_view, count)  # no capacity: the room goes back
                        missed = count
                        continue
                    if count:
                        bought.append((team, step.pool, count))
        for team, name, count in bought:
            for _ in range(count):
                iid = f"new-{serial}"
                serial += 1
                world.live.append((iid, name, InstanceState.PENDING))
                world.owners[iid] = team
        after = use_of(world, pools)
        hours = hours_to_month_end(now)
        got = {t: sum(c for team, _, c in bought if team == t) for t in before | after}
        for team, use in after.items():
            if not got.get(team):
                continue
            spec = world.teams.spec(team)
            if spec.burst_gpus is not None:
                assert use.gpus <= spec.burst_gpus, (team, use, spec)
            if spec.burst_usd_per_hour is not None:
                assert use.usd <= spec.burst_usd_per_hour + 1e-6, (team, use, spec)
            if spec.monthly_budget_usd is not None:
                projected = spent.get(team, 0.0) + use.kept_usd * hours
                assert projected <= spec.monthly_budget_usd + 1e-6, (team, projected, spec)
        now += HOUR


@st.composite
def open_fleets(
    draw: st.DrawFn,
) -> tuple[Pool, float, TeamsConfig, list[LaunchRequest], dict[str, float]]:
    the_pool = pool("p", gpus=draw(st.sampled_from((1, 2, 4, 8))))
    price = draw(st.floats(0.25, 12.0))
    teams = TeamsConfig(
        teams={n: draw(specs) for n in NAMES[: draw(st.integers(1, 3))]},
        unassigned=draw(specs),
    )
    launches = [
        LaunchRequest(pool="p", count=draw(st.integers(1, 30)), team=draw(st.sampled_from(PARTIES)))
        for _ in range(draw(st.integers(1, 6)))
    ]
    spent = {n: draw(st.floats(0.0, 20_000.0)) for n in (*NAMES, "unlisted")}
    return the_pool, price, teams, launches, spent


@settings(max_examples=EXAMPLES, deadline=None)
@given(open_fleets())
def test_with_no_fleet_limit_binding_every_team_gets_what_it_asked_within_its_limits(
    fleet: tuple[Pool, float, TeamsConfig, list[LaunchRequest], dict[str, float]],
) -> None:
    the_pool, price, teams, launches, spent = fleet
    view = view_of([(the_pool, price)])
    intents = run(view, launches, teams, {}, spent, Limits(max_launches_per_tick=10_000))
    got = granted_by_team(intents)
    hours = hours_to_month_end(NOW)
    for team in {launch.team for launch in launches}:
        asked = sum(launch.count for launch in launches if launch.team == team)
        if team is None:
            assert got[team] == asked
            continue
        spec = teams.spec(team)
        room: float = asked
        if spec.burst_gpus is not None:
            room = min(room, spec.burst_gpus // the_pool.gpus_per_instance)
        if spec.burst_usd_per_hour is not None:
            room = min(room, math.floor(spec.burst_usd_per_hour / price + 1e-9))
        if spec.monthly_budget_usd is not None:
            left = spec.monthly_budget_usd - spent.get(team, 0.0)
            room = min(room, max(0, math.floor(left / (price * hours) + 1e-9)))
        assert got[team] == room, (team, asked, spec)


@settings(max_examples=EXAMPLES, deadline=None)
@given(
    weights=st.lists(st.floats(0.25, 4.0), min_size=2, max_size=4),
    asks=st.lists(st.integers(1, 60), min_size=4, max_size=4),
    room=st.integers(0, 120),
    order=st.randoms(use_true_random=False),
)
def test_binding_fleet_limits_are_split_by_weight_within_one_instance(
    weights: list[float], asks: list[int], room: int, order: object
) -> None:
    names = [f"t{k}" for k in range(len(weights))]
    teams = TeamsConfig(teams={n: TeamSpec(weight=w) for n, w in zip(names, weights, strict=False)})
    launches = [
        LaunchRequest(pool="p", count=part, team=n)
        for n, ask in zip(names, asks, strict=False)
        for part in _parts(ask)
    ]
    order.shuffle(launches)  # type: ignore[attr-defined]
    view = view_of([(pool("p"), 1.0)])
    got = granted_by_team(
        run(view, launches, teams, limits=Limits(max_gpus=room, max_launches_per_tick=10_000))
    )
    asked = {n: a for n, a in zip(names, asks, strict=False)}
    fair = _water_fill(asked, dict(zip(names, weights, strict=False)), room)
    assert sum(got.values()) == min(room, sum(asked.values()))
    for n in names:
        assert got[n] <= asked[n]
        assert abs(got[n] - fair[n]) <= 1 + 1e-9, (got, fair)


def _parts(ask: int) -> list[int]:
    """A team's ask as one launch or two, as a policy may list it."""
    return [ask] if ask < 2 else [ask // 2, ask - ask // 2]


def _water_fill(asked: dict[str, int], weight: dict[str, float], room: float) -> dict[str, float]:
    """The continuous weighted water-filling: each gets min(ask, level x weight)."""
    if sum(asked.values()) <= room:
        return {n: float(a) for n, a in asked.items()}
    low, high = 0.0, max(a / weight[n] for n, a in asked.items())
    for _ in range(200):
        level = (low + high) / 2
        if sum(min(a, level * weight[n]) for n, a in asked.items()) > room:
            high = level
        else:
            low = level
    return {n: min(a, low * weight[n]) for n, a in asked.items()}
