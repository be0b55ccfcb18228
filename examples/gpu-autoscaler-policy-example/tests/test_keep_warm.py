"""Tests for the keep-warm policy: a unit test on a hand-built view, and a replay of real traces.

Run them from this folder with ``pytest`` (the package's ``src`` is put on the path by
``pyproject.toml``), or after ``pip install -e .``.
"""

from __future__ import annotations

import pytest
from gpu_autoscaler_keep_warm import KeepWarmPolicy
from pydantic import ValidationError

from autoscaler.model import (
    CloudNode,
    Demand,
    DemandGroup,
    FleetView,
    InstanceState,
    Market,
    OnPremNode,
    Pool,
    PoolView,
    PriceQuote,
)
from autoscaler.sim import (
    Prepared,
    SimResult,
    default_scenario_path,
    load_scenario,
    prepare,
    replay,
)

NOW = 100_000.0


def pool(name: str, gpus: int, price: float, market: Market = Market.SPOT) -> PoolView:
    return PoolView(
        pool=Pool(
            name=name,
            provider="aws",
            region="us-east-1",
            instance_type=f"{gpus}gpu",
            gpus_per_instance=gpus,
            market=market,
        ),
        price=PriceQuote(pool=name, price_per_hour=price, as_of=NOW),
    )


# Per GPU, the 8-GPU spot pool is the cheapest ($0.75), then the 1-GPU one ($1.00).
POOLS = (
    pool("spot-1g", 1, 1.00),
    pool("spot-8g", 8, 6.00),
    pool("od-1g", 1, 3.00, Market.ON_DEMAND),
)


def idle_node(instance_id: str, pool_name: str, idle_for_s: float = 3600.0) -> CloudNode:
    """A running, joined node whose GPUs have been idle long enough for cost-aware to drain it."""
    return CloudNode(
        instance_id=instance_id,
        pool=pool_name,
        state=InstanceState.RUNNING,
        launched_at=0.0,
        gpus=1,
        joined=True,
        gpu_util_pct=0.0,
        idle_since=NOW - idle_for_s,
    )


def view(**fields: object) -> FleetView:
    return FleetView.model_validate(
        {"now": NOW, "tick": 1, "fleet_id": "test", "pools": POOLS, **fields}
    )


def keep_warm(warm_gpus: int) -> KeepWarmPolicy:
    return KeepWarmPolicy(KeepWarmPolicy.Params(warm_gpus=warm_gpus))


def test_empty_fleet_launches_the_warm_pool_in_the_cheapest_spot_pool() -> None:
    plan = keep_warm(12).decide(view())

    (launch,) = plan.launches
    assert launch.pool == "spot-8g"
    assert launch.count == 2  # 12 GPUs need two 8-GPU instances
    assert launch.fallbacks == ("spot-1g",)  # other spot pools only, never on-demand
    assert plan.drains == ()


def test_no_warm_pool_is_exactly_the_wrapped_policy() -> None:
    fleet = view(instances=(idle_node("i-1", "spot-1g"),))
    plan = keep_warm(0).decide(fleet)

    assert plan.launches == ()
    assert [d.instance_id for d in plan.drains] == ["i-1"]


def test_drains_that_would_break_the_warm_pool_are_dropped() -> None:
    nodes = (*(idle_node(f"i-{n}", "spot-1g") for n in range(3)), idle_node("od", "od-1g"))
    plan = keep_warm(2).decide(view(instances=nodes))

    # Cost-aware drains all four idle nodes; two spot GPUs stay warm, the rest go.
    assert plan.launches == ()
    drained = {d.instance_id for d in plan.drains}
    assert "od" in drained
    assert len(drained & {"i-0", "i-1", "i-2"}) == 1


def test_pending_jobs_take_warm_gpus_first_so_the_pool_is_topped_up() -> None:
    # On-prem is full, and 3 pending spot-safe jobs will land on the 3 warm spot GPUs.
    full = OnPremNode(name="onprem", gpus=8, gpus_allocated=8)
    demand = Demand(
        groups=(
            DemandGroup(gpus_per_job=1, jobs=3, checkpoint_interval_s=1800, oldest_submit_time=0),
        )
    )
    warm = tuple(idle_node(f"i-{n}", "spot-1g", idle_for_s=0) for n in range(3))
    plan = keep_warm(3).decide(view(onprem=(full,), instances=warm, demand=demand))

    (launch,) = plan.launches
    assert (launch.pool, launch.count) == ("spot-8g", 1)
    assert plan.drains == ()


def test_params_are_validated_including_the_wrapped_policys() -> None:
    params = KeepWarmPolicy.Params.model_validate({"warm_gpus": 4, "inner": {"idle_seconds": 300}})
    assert KeepWarmPolicy(params).inner.params.idle_seconds == 300
    with pytest.raises(ValidationError, match="warm_gpus"):
        KeepWarmPolicy.Params.model_validate({"warm_gpus": -1})
    with pytest.raises(ValidationError, match="idle_secs"):
        KeepWarmPolicy.Params.model_validate({"inner": {"idle_secs": 300}})


# -- replaying the shipped scenario ------------------------------------------------------------


@pytest.fixture(scope="module")
def one_busy_day() -> Prepared:
    """The shipped 25-day scenario cut down to its busiest day: a fast but real replay."""
    loaded = load_scenario(default_scenario_path())
    trace = loaded.scenario.trace.model_copy(update={"busiest_days": 1})
    return prepare(loaded.derive(trace=trace))


def spot_safe_jobs_that_waited(prepared: Prepared, result: SimResult) -> int:
    """How many jobs allowed on spot (they checkpoint, not high priority) waited longer than a
    tick. A new job may wait up to one tick whatever is warm: the controller judges it spot-safe
    at its next tick (Slurm's twin partitions hold it until then), so only a longer wait is one
    for an instance to boot."""
    jobs = {job.id: job for job in prepared.selection.jobs}
    tick = prepared.loaded.scenario.controller.tick_seconds
    return sum(
        1
        for job_id, wait in zip(result.wait_job_ids, result.waits_s, strict=True)
        if jobs[job_id].checkpoint_interval_s is not None
        and not jobs[job_id].high_priority
        and wait > tick
    )


def test_replay_keeps_the_pool_warm_and_spot_jobs_skip_the_boot(one_busy_day: Prepared) -> None:
    base = replay(one_busy_day, keep_warm(0))
    warm = replay(one_busy_day, keep_warm(8))

    # The warm pool is there from the first tick to the last ...
    assert min(warm.timeline.cloud_gpus) >= 8
    # ... so jobs that may run on spot rarely wait for an instance to boot ...
    assert spot_safe_jobs_that_waited(one_busy_day, warm) * 2 <= spot_safe_jobs_that_waited(
        one_busy_day, base
    )
    # ... no job is worse off for it, and the idle GPUs are paid for.
    assert warm.jobs_finished >= base.jobs_finished
    assert warm.cost > base.cost
