"""Each team's cloud burst limits and monthly budget, held by the guard over the launches bought
for it (issue 19): burst GPUs, burst $/hour and the month projected to its end, each a clamp
naming the team; unlisted teams on the unassigned terms as teams of their own; instances of no
known team counted for no team; the fleet-wide limits split by weight when they bind; act's
fallbacks held to the same team limits; the instance table remembering whom an instance was
bought for; and every policy buying per team."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime

import pytest
from fakes import pool

from autoscaler.fleet.instances import InstanceTable, Launched
from autoscaler.fleet.memory import Cooldowns
from autoscaler.fleet.team_spend import TeamSpend
from autoscaler.model import (
    CloudNode,
    Demand,
    DemandGroup,
    FleetView,
    Instance,
    InstanceState,
    LaunchRequest,
    Plan,
    Pool,
    PoolView,
    PriceQuote,
)
from autoscaler.model.config import Limits
from autoscaler.model.teams import TeamsConfig, TeamSpec
from autoscaler.tick.guard import fallbacks_for, guard
from autoscaler.tick.intents import Intents, Requests
from autoscaler.tick.team_limits import TeamLedger
from policies.baselines import CheapestSpotPolicy, OnDemandPolicy
from policies.cost_aware import CostAwarePolicy
from policies.karpenter import KarpenterPolicy
from policies.skypilot import SkyPilotManagedPolicy
from policies.slurm_power_save import SlurmPowerSavePolicy

HOUR = 3600.0
NOW = 1_000_000.0  # 1970-01-12 13:46:40 UTC
HOURS_LEFT = (datetime(1970, 2, 1, tzinfo=UTC).timestamp() - NOW) / HOUR


def view_of(
    pools: Sequence[tuple[Pool, float | None]],
    live: Sequence[tuple[str, str, InstanceState]] = (),
    now: float = NOW,
    groups: Sequence[DemandGroup] = (),
) -> FleetView:
    """A view of ``pools`` (with their prices) holding ``live`` (instance id, pool, state)."""
    by_name = {p.name: p for p, _ in pools}
    return FleetView(
        now=now,
        tick=1,
        fleet_id="f",
        pools=tuple(
            PoolView(
                pool=p,
                price=PriceQuote(pool=p.name, price_per_hour=price, as_of=0.0)
                if price is not None
                else None,
            )
            for p, price in pools
        ),
        instances=tuple(
            CloudNode(
                instance_id=iid,
                pool=name,
                state=state,
                launched_at=0.0,
                gpus=by_name[name].gpus_per_instance,
            )
            for iid, name, state in live
        ),
        demand=Demand(groups=tuple(groups)),
    )


def granted_by_team(intents: Intents) -> dict[str | None, int]:
    found: dict[str | None, int] = {}
    for intent in intents.launches:
        found[intent.request.team] = found.get(intent.request.team, 0) + intent.granted
    return found


def run(
    view: FleetView,
    launches: Sequence[LaunchRequest],
    teams: TeamsConfig | None,
    owners: Mapping[str, str | None] | None = None,
    spend: Mapping[str, float] | None = None,
    limits: Limits | None = None,
) -> Intents:
    ledger = (
        TeamLedger(teams, dict(owners or {}), {} if spend is None else spend)
        if teams is not None
        else None
    )
    return guard(
        Plan(launches=tuple(launches)),
        Requests(),
        view,
        limits or Limits(max_launches_per_tick=1000),
        Cooldowns(),
        teams=ledger,
    )


def running(*ids_pools: tuple[str, str]) -> list[tuple[str, str, InstanceState]]:
    return [(i, p, InstanceState.RUNNING) for i, p in ids_pools]


EIGHT = pool("eight", gpus=8)
ONE = pool("one", gpus=1)


def test_burst_gpus_count_the_teams_live_instances_and_what_is_granted_this_tick() -> None:
    teams = TeamsConfig(teams={"a": TeamSpec(burst_gpus=24)})
    view = view_of([(EIGHT, 1.0)], running(("i-1", "eight")))
    intents = run(
        view,
        [
            LaunchRequest(pool="eight", count=1, team="a"),
            LaunchRequest(pool="eight", count=3, team="a"),
        ],
        teams,
        owners={"i-1": "a"},
    )
    assert [i.granted for i in intents.launches] == [1, 1], "8 held + 8 + 8 = 24"
    clamp = next(c for c in intents.clamps if c.rule == "team_burst_gpus")
    assert (clamp.pool, clamp.requested, clamp.allowed) == ("eight", 3, 1)
    assert "team a" in clamp.detail and "burst_gpus 24" in clamp.detail


def test_burst_usd_per_hour_holds_the_teams_dollars_an_hour() -> None:
    teams = TeamsConfig(teams={"a": TeamSpec(burst_usd_per_hour=10.0)})
    view = view_of([(ONE, 3.0)], running(("i-1", "one")))
    intents = run(view, [LaunchRequest(pool="one", count=5, team="a")], teams, {"i-1": "a"})
    assert granted_by_team(intents) == {"a": 2}, "$3 held + 2 x $3 = $9 <= $10"
    clamp = next(c for c in intents.clamps if c.rule == "team_burst_usd_per_hour")
    assert "team a" in clamp.detail


def test_a_pool_with_no_price_holds_a_team_with_a_dollar_limit_only() -> None:
    teams = TeamsConfig(
        teams={"a": TeamSpec(burst_usd_per_hour=100.0), "b": TeamSpec(burst_gpus=10)}
    )
    view = view_of([(ONE, None)])
    intents = run(
        view,
        [
            LaunchRequest(pool="one", count=2, team="a"),
            LaunchRequest(pool="one", count=2, team="b"),
        ],
        teams,
    )
    assert granted_by_team(intents) == {"a": 0, "b": 2}


@pytest.mark.parametrize("spent", [0.0, 100.0, 500.0, 2_000.0])
def test_the_monthly_budget_is_a_projected_ceiling_for_the_team(spent: float) -> None:
    """Spent so far, plus the team's kept instances to the month's end, plus each new one."""
    budget = 2_000.0
    teams = TeamsConfig(teams={"a": TeamSpec(monthly_budget_usd=budget)})
    view = view_of([(ONE, 1.0)], running(("i-1", "one")))
    intents = run(
        view, [LaunchRequest(pool="one", count=10, team="a")], teams, {"i-1": "a"}, {"a": spent}
    )
    fits = max(0, math.floor((budget - spent - HOURS_LEFT) / HOURS_LEFT + 1e-9))
    assert granted_by_team(intents) == {"a": min(10, fits)}
    if fits < 10:
        clamp = next(c for c in intents.clamps if c.rule == "team_monthly_budget")
        assert "team a" in clamp.detail and "projected month-end" in clamp.detail


def test_an_unknown_month_spend_holds_only_the_teams_with_a_budget() -> None:
    teams = TeamsConfig(teams={"a": TeamSpec(monthly_budget_usd=1e9), "b": TeamSpec()})
    view = view_of([(ONE, 1.0)])
    ledger = TeamLedger(teams, {}, None)
    intents = guard(
        Plan(
            launches=(
                LaunchRequest(pool="one", count=2, team="a"),
                LaunchRequest(pool="one", count=2, team="b"),
            )
        ),
        Requests(),
        view,
        Limits(),
        Cooldowns(),
        teams=ledger,
    )
    assert granted_by_team(intents) == {"a": 0, "b": 2}
    assert any("unknown" in c.detail and "team a" in c.detail for c in intents.clamps)


def test_unlisted_teams_each_get_the_unassigned_terms_as_their_own() -> None:
    teams = TeamsConfig(teams={"a": TeamSpec()}, unassigned=TeamSpec(burst_gpus=8))
    view = view_of([(EIGHT, 1.0)], running(("i-1", "eight")))
    intents = run(
        view,
        [
            LaunchRequest(pool="eight", count=2, team="x"),
            LaunchRequest(pool="eight", count=2, team="y"),
            LaunchRequest(pool="eight", count=2, team="a"),
        ],
        teams,
        owners={"i-1": "x"},
    )
    assert granted_by_team(intents) == {"x": 0, "y": 1, "a": 2}


def test_work_of_no_team_and_instances_of_unknown_team_count_for_no_team() -> None:
    """After a restart the table cannot say whom an instance was bought for: it counts for no
    team, so team a's limit sees none of them; a launch for no team is held by no team's."""
    teams = TeamsConfig(teams={"a": TeamSpec(burst_gpus=8)}, unassigned=TeamSpec(burst_gpus=0))
    view = view_of([(EIGHT, 1.0)], running(*((f"i-{n}", "eight") for n in range(5))))
    intents = run(
        view,
        [LaunchRequest(pool="eight", count=3, team="a"), LaunchRequest(pool="eight", count=3)],
        teams,
        owners={f"i-{n}": None for n in range(5)},
    )
    assert granted_by_team(intents) == {"a": 1, None: 3}


def test_without_teams_the_launches_are_granted_in_plan_order_as_before() -> None:
    view = view_of([(ONE, 1.0)])
    launches = [
        LaunchRequest(pool="one", count=8, team="a"),
        LaunchRequest(pool="one", count=8, team="b"),
    ]
    limits = Limits(max_gpus=10, max_launches_per_tick=1000)
    intents = run(view, launches, None, limits=limits)
    assert [i.granted for i in intents.launches] == [8, 2]


@pytest.mark.parametrize(
    ("weights", "asks", "room", "expected"),
    [
        ((1.0, 3.0), (100, 100), 40, (10, 30)),
        ((1.0, 3.0), (5, 100), 40, (5, 35)),
        ((1.0, 1.0, 2.0), (100, 100, 100), 40, (10, 10, 20)),
        ((2.0, 1.0), (100, 3), 10, (7, 3)),
        ((1.0, 1.0), (100, 100), 0, (0, 0)),
    ],
)
def test_binding_fleet_limits_are_split_between_the_teams_by_weight(
    weights: tuple[float, ...], asks: tuple[int, ...], room: int, expected: tuple[int, ...]
) -> None:
    names = [f"t{k}" for k in range(len(weights))]
    teams = TeamsConfig(teams={n: TeamSpec(weight=w) for n, w in zip(names, weights, strict=True)})
    view = view_of([(ONE, 1.0)])
    launches = [
        LaunchRequest(pool="one", count=ask, team=n) for n, ask in zip(names, asks, strict=True)
    ]
    intents = run(view, launches, teams, limits=Limits(max_gpus=room, max_launches_per_tick=1000))
    got = granted_by_team(intents)
    assert tuple(got[n] for n in names) == expected
    if room and sum(asks) > room:
        assert "max_gpus" in {c.rule for c in intents.clamps}


def test_the_split_takes_every_binding_limit_and_work_of_no_team_is_a_party() -> None:
    """Dollars bind, not GPUs: the $/hour budget is split by weight (the unassigned terms'
    weight for work of no team), each within its own burst limit."""
    teams = TeamsConfig(
        teams={"a": TeamSpec(weight=1.0), "b": TeamSpec(weight=1.0, burst_gpus=2)},
        unassigned=TeamSpec(weight=2.0),
    )
    view = view_of([(ONE, 2.0)])
    launches = [
        LaunchRequest(pool="one", count=50, team="a"),
        LaunchRequest(pool="one", count=50, team="b"),
        LaunchRequest(pool="one", count=50),
    ]
    limits = Limits(max_cost_per_hour=40.0, max_gpus=1000, max_launches_per_tick=1000)
    got = granted_by_team(run(view, launches, teams, limits=limits))
    # 20 instances of room: b asks 2 (its burst limit); a and no team share 18 by 1:2.
    assert got == {"a": 6, "b": 2, None: 12}


def test_a_fallback_in_act_stays_within_the_teams_limit() -> None:
    """A capacity failure gives the first choice's room back and moves its nodes to the next
    pool of the chain: the team's limit holds there too."""
    other = pool("other", gpus=8)
    teams = TeamsConfig(teams={"a": TeamSpec(burst_gpus=16)})
    view = view_of([(EIGHT, 1.0), (other, 1.0)])
    intents = run(
        view,
        [LaunchRequest(pool="eight", count=4, fallbacks=("other",), team="a")],
        teams,
    )
    assert intents.launches[0].granted == 2
    assert intents.fallbacks is not None
    room = fallbacks_for(intents.fallbacks, "a")
    assert room.admit_launch(view.pool_by_name["other"], 2) == 0, "the team is at its limit"
    room.refund(view.pool_by_name["eight"], 2)  # the first choice had no capacity
    assert room.admit_launch(view.pool_by_name["other"], 4) == 2
    # Work of another team is not held by a's limit.
    assert fallbacks_for(intents.fallbacks, "b").admit_launch(view.pool_by_name["other"], 4) == 4


def test_the_table_keeps_a_launchs_team_and_after_a_restart_the_one_its_tag_names() -> None:
    """The launch's team is the record's; a restart rebuilds the table from the listing, so an
    instance comes back with the team its cloud tag names, and with none when it has no tag
    (launched before team tags existed, or the tag removed)."""
    instance = Instance(
        id="i-1",
        pool="one",
        state=InstanceState.PENDING,
        launched_at=0.0,
        request_id="r",
        gpus=1,
    )
    table = InstanceTable()
    table.apply(Launched(instance, "fake", team="a"), 1.0)
    record = table.get("i-1")
    assert record is not None and record.team == "a"
    assert table.teams() == {"i-1": "a"}
    rebuilt = InstanceTable()  # a restart: the table is rebuilt from the clouds' listing
    tagged = instance.model_copy(update={"id": "i-2", "team": "a"})
    rebuilt.sync([("fake", instance), ("fake", tagged)], 2.0, {"fake"})
    assert rebuilt.teams() == {"i-1": None, "i-2": "a"}, "untagged: no team; tagged: its tag's"


def test_team_spend_accrues_what_each_teams_billed_instances_cost_this_month() -> None:
    spend = TeamSpend()
    pools = [(ONE, 2.0)]
    live = running(("i-a", "one"), ("i-b", "one"), ("i-none", "one"))
    owners = {"i-a": "a", "i-b": "b", "i-none": None}
    spend.accrue(view_of(pools, live, now=NOW), owners)
    first = spend.month(NOW)
    assert first["a"] == pytest.approx(2.0 * NOW / HOUR), "launched at the month's start (0)"
    spend.accrue(view_of(pools, live, now=NOW + HOUR), owners)
    assert spend.month(NOW + HOUR)["a"] == pytest.approx(first["a"] + 2.0)
    assert set(spend.month(NOW + HOUR)) == {"a", "b"}
    # Drained away and back: a terminated instance is no longer charged.
    gone = [("i-a", "one", InstanceState.TERMINATED), ("i-b", "one", InstanceState.RUNNING)]
    spend.accrue(view_of(pools, gone, now=NOW + 2 * HOUR), owners)
    after = spend.month(NOW + 2 * HOUR)
    assert after["a"] == pytest.approx(first["a"] + 2.0)
    assert after["b"] == pytest.approx(first["b"] + 4.0)
    february = datetime(1970, 2, 1, 1, tzinfo=UTC).timestamp()
    spend.accrue(view_of(pools, gone, now=february), owners)
    assert spend.month(february) == {"b": pytest.approx(2.0)}, "from the month's start"


def _group(team: str | None, jobs: int) -> DemandGroup:
    return DemandGroup(
        gpus_per_job=1, jobs=jobs, checkpoint_interval_s=600.0, oldest_submit_time=0.0, team=team
    )


def test_policies_buy_per_team_where_groups_name_teams_and_as_before_without() -> None:
    """Jobs of two teams that one 8-GPU instance would hold get an instance each."""
    pools = [(EIGHT, 8.0)]
    policy = CostAwarePolicy()
    teamless = policy.decide(view_of(pools, groups=[_group(None, 3), _group(None, 2)]))
    assert [(x.count, x.team) for x in teamless.launches] == [(1, None)]
    split = policy.decide(view_of(pools, groups=[_group("a", 3), _group("b", 2)]))
    assert sorted((x.count, x.team or "") for x in split.launches) == [(1, "a"), (1, "b")]


@pytest.mark.parametrize(
    "policy",
    [
        CostAwarePolicy,
        KarpenterPolicy,
        SkyPilotManagedPolicy,
        SlurmPowerSavePolicy,
        OnDemandPolicy,
        CheapestSpotPolicy,
    ],
)
def test_every_policy_buys_each_launch_for_one_team(policy: type) -> None:
    pools = [(EIGHT, 8.0), (pool("od", gpus=8, market="on-demand"), 20.0)]
    split = policy().decide(view_of(pools, groups=[_group("a", 3), _group("b", 2)]))
    assert {x.team for x in split.launches} == {"a", "b"}
    teamless = policy().decide(view_of(pools, groups=[_group(None, 3), _group(None, 2)]))
    assert teamless.launches and {x.team for x in teamless.launches} == {None}
