"""The built-in policies on hand-built views: pure functions of what they are shown."""

from __future__ import annotations

import math

from fakes import pool
from hypothesis import given, settings
from hypothesis import strategies as st

from autoscaler.fleet.capacity import InterruptionHistory
from autoscaler.model import (
    CloudNode,
    Demand,
    DemandGroup,
    FleetView,
    InstanceState,
    OnPremNode,
    Plan,
    Pool,
    PoolView,
    PriceQuote,
)
from policies.baselines import CheapestSpotPolicy, OnDemandPolicy, ReactiveParams
from policies.common import effective_cost_per_hour
from policies.cost_aware import CostAwareParams, CostAwarePolicy

NOW = 100_000.0


def pv(
    p: Pool,
    price: float,
    *,
    rate: float | None = None,
    risky: bool = False,
    interruptions: int = 0,
    hours: float = 0.0,
    unavailable: bool = False,
) -> PoolView:
    return PoolView(
        pool=p,
        price=PriceQuote(
            pool=p.name, price_per_hour=price, interruption_rate_per_hour=rate, as_of=NOW
        ),
        risky_until=NOW + 600 if risky else None,
        recent_interruptions=interruptions,
        recent_instance_hours=hours,
        unavailable_until=NOW + 60 if unavailable else None,
    )


def group(
    gpus: int, jobs: int, *, checkpoint: float | None = 1800.0, high: bool = False
) -> DemandGroup:
    return DemandGroup(
        gpus_per_job=gpus,
        jobs=jobs,
        checkpoint_interval_s=checkpoint,
        high_priority=high,
        oldest_submit_time=NOW - 30,
    )


def view(
    pools: list[PoolView],
    groups: list[DemandGroup] = (),
    onprem: list[OnPremNode] = (),  # type: ignore[assignment]
    instances: list[CloudNode] = (),
    known: bool = True,
) -> FleetView:  # type: ignore[assignment]
    return FleetView(
        now=NOW,
        tick=1,
        fleet_id="t",
        pools=tuple(pools),
        onprem=tuple(onprem),
        instances=tuple(instances),
        demand=Demand(groups=tuple(groups), known=known),
    )


def launches(plan: Plan) -> dict[str, int]:
    counts: dict[str, int] = {}
    for launch in plan.launches:
        counts[launch.pool] = counts.get(launch.pool, 0) + launch.count
    return counts


SPOT1 = pool("spot-1", gpus=1)
SPOT8 = pool("spot-8", gpus=8)
OD1 = pool("od-1", gpus=1, market="on-demand")
OD8 = pool("od-8", gpus=8, market="on-demand")


def test_onprem_first_then_cheapest_effective_spot() -> None:
    v = view(
        [pv(SPOT1, 1.0), pv(OD1, 3.0)],
        [group(1, 5)],
        onprem=[OnPremNode(name="n", gpus=8, gpus_allocated=5)],
    )
    assert launches(CostAwarePolicy().decide(v)) == {"spot-1": 2}


def test_jobs_that_cannot_checkpoint_or_are_urgent_stay_off_spot() -> None:
    v = view(
        [pv(SPOT1, 1.0), pv(OD1, 3.0)],
        [group(1, 2, checkpoint=None), group(1, 3, high=True), group(1, 4)],
    )
    plan = CostAwarePolicy().decide(v)
    assert launches(plan) == {"od-1": 5, "spot-1": 4}
    assert plan.placement.allows_spot(checkpointable=False, high_priority=False) is False
    assert plan.placement.allows_spot(checkpointable=True, high_priority=True) is False
    protected = next(launch for launch in plan.launches if launch.pool == "od-1")
    assert "spot-1" not in protected.fallbacks


def test_packing_chooses_the_shape_that_hosts_the_jobs_for_least() -> None:
    # seven 1-GPU jobs: an 8-GPU instance at 6.0 beats seven 1-GPU ones at 1.0 each
    v = view([pv(SPOT1, 1.0), pv(SPOT8, 6.0)], [group(1, 7)])
    assert launches(CostAwarePolicy().decide(v)) == {"spot-8": 1}
    # three of them: three small instances are cheaper than one big
    v = view([pv(SPOT1, 1.0), pv(SPOT8, 6.0)], [group(1, 3)])
    assert launches(CostAwarePolicy().decide(v)) == {"spot-1": 3}
    # an 8-GPU job and four 1-GPU jobs: the big job needs the big shape, the rest fill nothing
    v = view([pv(SPOT1, 1.0), pv(SPOT8, 6.0)], [group(8, 1), group(1, 4)])
    assert launches(CostAwarePolicy().decide(v)) == {"spot-8": 1, "spot-1": 4}


def test_a_pool_that_keeps_interrupting_loses_to_a_slightly_dearer_steady_one() -> None:
    flaky, steady = pool("flaky"), pool("steady")
    # 24 interruptions in 24 instance-hours: each loses ~19 min of a 30-min-checkpoint job
    v = view([pv(flaky, 1.0, interruptions=24, hours=24.0), pv(steady, 1.1)], [group(1, 1)])
    assert launches(CostAwarePolicy().decide(v)) == {"steady": 1}
    assert launches(CheapestSpotPolicy().decide(v)) == {"flaky": 1}, "price only"
    v = view([pv(flaky, 1.0, risky=True), pv(steady, 1.1)], [group(1, 1)])
    assert launches(CostAwarePolicy().decide(v)) == {"steady": 1}


def test_pools_in_the_capacity_cache_are_not_planned() -> None:
    v = view([pv(SPOT1, 1.0, unavailable=True), pv(pool("other"), 1.2)], [group(1, 1)])
    assert launches(CostAwarePolicy().decide(v)) == {"other": 1}


def test_booting_capacity_counts_as_supply() -> None:
    booting = CloudNode(
        instance_id="i-1", pool="spot-1", state=InstanceState.PENDING, launched_at=NOW - 30, gpus=1
    )
    v = view([pv(SPOT1, 1.0)], [group(1, 2)], instances=[booting])
    assert launches(CostAwarePolicy().decide(v)) == {"spot-1": 1}


def node(
    instance_id: str,
    *,
    allocated: int,
    util: float,
    idle_for: float | None,
    empty_for: float | None,
    gpus: int = 1,
    pool_name: str = "spot-1",
) -> CloudNode:
    return CloudNode(
        instance_id=instance_id,
        pool=pool_name,
        state=InstanceState.RUNNING,
        launched_at=0.0,
        gpus=gpus,
        gpus_allocated=allocated,
        gpu_util_pct=util,
        idle_since=NOW - idle_for if idle_for is not None else None,
        empty_since=NOW - empty_for if empty_for is not None else None,
        joined=True,
    )


def test_idle_is_measured_utilisation_for_the_default_and_allocation_for_the_baselines() -> None:
    nodes = [
        node("held-idle", allocated=1, util=0.0, idle_for=900, empty_for=None),
        node("empty-busy", allocated=0, util=90.0, idle_for=None, empty_for=900),
        node("fresh-idle", allocated=0, util=0.0, idle_for=30, empty_for=30),
    ]
    v = view([pv(SPOT1, 1.0)], instances=nodes)
    default = CostAwarePolicy(CostAwareParams(idle_seconds=600)).decide(v)
    assert [d.instance_id for d in default.drains] == ["held-idle"]
    reactive = CheapestSpotPolicy(ReactiveParams(idle_seconds=60)).decide(v)
    assert sorted(d.instance_id for d in reactive.drains) == ["empty-busy"]


def test_an_idle_node_that_pending_work_fits_is_kept() -> None:
    idle = node("idle", allocated=0, util=0.0, idle_for=3600, empty_for=3600)
    v = view([pv(SPOT1, 1.0)], [group(1, 1)], instances=[idle])
    plan = CostAwarePolicy().decide(v)
    assert plan.drains == () and plan.launches == ()


def test_unknown_utilisation_is_never_idle() -> None:
    unknown = node("unknown", allocated=0, util=0.0, idle_for=None, empty_for=None)
    plan = CostAwarePolicy(CostAwareParams(idle_seconds=0)).decide(
        view([pv(SPOT1, 1.0)], instances=[unknown])
    )
    assert plan.drains == ()


def test_on_demand_baseline_never_buys_spot() -> None:
    v = view([pv(SPOT1, 0.5), pv(OD1, 3.0), pv(OD8, 24.0)], [group(1, 3), group(8, 1)])
    assert launches(OnDemandPolicy().decide(v)) == {"od-1": 3, "od-8": 1}


def test_effective_cost_rises_with_interruption_rate_and_checkpoint_interval() -> None:
    p = pv(SPOT1, 1.0)
    calm = effective_cost_per_hour(p, 1800.0, 120.0, 0.0, 0.5)
    assert calm == 1.0
    stormy = effective_cost_per_hour(p, 1800.0, 120.0, 0.5, 0.5)
    rare_checkpoints = effective_cost_per_hour(p, 3 * 3600.0, 120.0, 0.1, 0.5)
    assert stormy > calm and rare_checkpoints > calm
    assert math.isinf(effective_cost_per_hour(p, None, 120.0, 0.0, 0.5)), "no checkpoint"
    assert math.isinf(effective_cost_per_hour(p, 1800.0, 120.0, 5.0, 0.5)), "not worth it"
    assert effective_cost_per_hour(pv(OD1, 3.0), None, 120.0, 9.0, 0.5) == 3.0


def test_a_gang_risks_more_than_one_node_unless_the_pool_reclaims_them_together() -> None:
    p = pv(SPOT1, 1.0)
    one = effective_cost_per_hour(p, 1800.0, 120.0, 0.2, 0.1)
    alone = effective_cost_per_hour(p, 1800.0, 120.0, 0.2, 0.1, members=4)
    together = effective_cost_per_hour(p, 1800.0, 120.0, 0.2, 0.1, members=4, reclaim_size=8)
    pairs = effective_cost_per_hour(p, 1800.0, 120.0, 0.2, 0.1, members=4, reclaim_size=2)
    assert together == one, "reclaims that take every instance stop a gang no more often"
    assert one < pairs < alone, "one-at-a-time reclaims stop a gang of four four times as often"


def test_reclaims_count_interruptions_of_one_moment_once() -> None:
    history = InterruptionHistory(risky_ttl_s=3600.0)
    for when in (100.0, 100.0, 100.0, 500.0):
        history.record("p", when)
    assert (history.recent("p", 600.0), history.reclaims("p", 600.0)) == (4, 2)
    assert history.reclaims("p", 100.0 + 3 * 86_400 + 1) == 1, "the window forgets the first"
    assert history.reclaims("q", 600.0) == 0


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from([1, 2, 4, 8]), st.integers(1, 30), st.booleans()),
        min_size=1,
        max_size=6,
    ),
    st.lists(
        st.tuples(st.sampled_from([1, 4, 8]), st.floats(0.2, 30.0), st.booleans()),
        min_size=1,
        max_size=5,
    ),
)
def test_planned_capacity_hosts_every_job_it_can(
    groups: list[tuple[int, int, bool]], offers: list[tuple[int, float, bool]]
) -> None:
    pools = [
        pv(pool(f"p{i}", gpus=g, market="spot" if spot else "on-demand"), price)
        for i, (g, price, spot) in enumerate(offers)
    ]
    demand = [group(g, n, checkpoint=1800.0 if safe else None) for g, n, safe in groups]
    plan = CostAwarePolicy().decide(view(pools, demand))
    bought: dict[str, int] = {}
    for launch in plan.launches:
        bought[launch.pool] = bought.get(launch.pool, 0) + launch.count
    # every bought instance is a shape that fits at least one pending job, and a job that some
    # allowed pool can host is covered by the GPUs bought for its class
    by_name = {p.pool.name: p.pool for p in pools}
    for name, count in bought.items():
        assert count > 0
        assert any(g <= by_name[name].gpus_per_instance for g, _, _ in groups)
    for safe in (False, True):
        want = [(g, n) for g, n, s in groups if s == safe]
        allowed = [p.pool for p in pools if p.pool.is_spot is False or safe]
        hostable = sum(g * n for g, n in want if any(a.gpus_per_instance >= g for a in allowed))
        if not safe:
            bought_gpus = sum(
                by_name[n].gpus_per_instance * c
                for n, c in bought.items()
                if not by_name[n].is_spot
            )
            assert bought_gpus >= hostable
