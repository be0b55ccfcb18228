"""Higher priority classes are bought for and placed first when limits bind (issue 19, item 3).

cost-aware buys each class order's new instances in launches of their own, highest first, and
the guard grants in plan order, so a fleet limit that binds trims the lower classes; the
scheduler then places the higher class first (Slurm's QOS factor, Kubernetes' PrioritySort; the
simulator's scheduler where the config lists classes). Without classes nothing changes.
"""

from __future__ import annotations

from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from team_replays import replayed, scenario
from team_replays import row as trace_row

from autoscaler.model import (
    Demand,
    DemandGroup,
    FleetView,
    Market,
    Pool,
    PoolView,
    PriceQuote,
)
from policies.cost_aware import CostAwarePolicy

NOW = 10_000.0


def group(jobs: int, order: int, cls: str | None, submitted: float) -> DemandGroup:
    return DemandGroup(
        gpus_per_job=1,
        jobs=jobs,
        checkpoint_interval_s=600.0,
        oldest_submit_time=submitted,
        priority_class=cls,
        class_order=order,
    )


def view_of(groups: list[DemandGroup], max_instances: int = 100) -> FleetView:
    pool = Pool(
        name="od",
        provider="aws",
        region="r1",
        instance_type="small",
        gpus_per_instance=1,
        market=Market.ON_DEMAND,
        max_instances=max_instances,
    )
    quote = PriceQuote(pool="od", price_per_hour=3.0, as_of=NOW)
    return FleetView(
        now=NOW,
        tick=1,
        fleet_id="test",
        pools=(PoolView(pool=pool, price=quote),),
        demand=Demand(groups=tuple(groups)),
    )


def test_each_class_order_is_bought_in_launches_of_its_own_highest_first() -> None:
    older_batch = group(4, 0, "batch", NOW - 500.0)
    urgent = group(2, 10, "urgent", NOW - 100.0)
    plan = CostAwarePolicy().decide(view_of([urgent, older_batch]))
    assert [(launch.pool, launch.count) for launch in plan.launches] == [("od", 2), ("od", 4)]


def test_without_class_orders_one_shape_is_one_launch_as_before() -> None:
    plan = CostAwarePolicy().decide(
        view_of([group(2, 0, "urgent", NOW - 100.0), group(4, 0, "batch", NOW - 500.0)])
    )
    assert [(launch.pool, launch.count) for launch in plan.launches] == [("od", 6)]


# -- replayed through the controller: the guard trims the lower class -------------------------

CLASSES = """
priority_classes:
  urgent: {order: 10}
  batch: {order: 0}
"""
LIMITED = "{max_gpus: LIMIT, scale_down_cooldown_s: 0}"
POOLS = (
    "{name: b-t4, market: on-demand, provider: aws, region: r1, instance_type: small, "
    "gpus_per_instance: 1, gpu_model: T4, boot_seconds: 60}\n"
    "    - {name: a-v100, market: on-demand, provider: aws, region: r1, instance_type: small, "
    "gpus_per_instance: 2, gpu_model: V100, boot_seconds: 60}"
)
RUN_S = 6_000


def on(row: str, model: str) -> str:
    """The trace row asking for ``model`` GPUs (its ``gpu_model`` column)."""
    head, tail = row.rsplit(",,none,", 1)
    return f"{head},{model},none,{tail}"


def replay_waits(
    tmp_path: Path, limit: int, batch: int, urgent: int, gap: int, classes: bool
) -> tuple[list[float], list[float]]:
    """Waits of the urgent and of the batch jobs: ``batch`` long two-GPU V100 batch jobs
    submitted first, ``urgent`` one-GPU T4 urgent ones ``gap`` seconds later (before the
    controller's first tick), the one on-prem GPU held by a longer job, and a fleet of at most
    ``limit`` cloud GPUs. Where classes do not order them, cost-aware lists its launches by
    pool (the batch jobs' ``a-v100`` first); the GPU models keep the scheduler from putting one
    class on the other's instances."""
    rows = [trace_row("hold", 0, 40_000, 1, "lab", 0, "batch")]
    rows += [on(trace_row(f"b{i}", 5, RUN_S, 2, "lab", 1, "batch"), "V100") for i in range(batch)]
    rows += [
        on(trace_row(f"u{i}", 5 + gap, RUN_S, 1, "lab", 1, "urgent"), "T4") for i in range(urgent)
    ]
    text = scenario(
        "class-order",
        [1],
        CLASSES if classes else "unassigned: {guaranteed_gpus: 0}",
        window_s=40_000,
        limits=LIMITED.replace("LIMIT", str(limit)),
        pool=POOLS,
    )
    result = replayed(tmp_path, text, rows)
    waits = dict(zip(result.wait_job_ids, result.waits_s, strict=True))
    return (
        [w for job, w in waits.items() if job.startswith("u")],
        [w for job, w in waits.items() if job.startswith("b")],
    )


def test_a_binding_limit_trims_the_lower_class_not_the_higher(tmp_path: Path) -> None:
    urgent, batch = replay_waits(tmp_path, limit=2, batch=2, urgent=2, gap=10, classes=True)
    assert len(urgent) == 2 and len(batch) == 2
    # bought for at the first tick, started as the instances join
    assert max(urgent) < 600.0, urgent
    assert min(batch) >= RUN_S - 120.0, batch


def test_without_classes_the_plan_order_decides_what_the_limit_trims(tmp_path: Path) -> None:
    urgent, batch = replay_waits(tmp_path, limit=2, batch=2, urgent=2, gap=10, classes=False)
    assert min(batch) < 600.0, batch
    assert min(urgent) >= RUN_S - 120.0, urgent


@settings(
    max_examples=8,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    limit=st.integers(1, 6),
    batch=st.integers(1, 4),
    urgent=st.integers(1, 4),
    gap=st.integers(0, 50),
)
def test_replayed_the_urgent_jobs_get_the_first_gpus_the_limit_allows(
    tmp_path: Path, limit: int, batch: int, urgent: int, gap: int
) -> None:
    """However the limit binds, as many urgent jobs as it allows start once the first
    instances join, and no batch job takes a GPU an urgent job was waiting for."""
    urgent_waits, batch_waits = replay_waits(tmp_path, limit, batch, urgent, gap, classes=True)
    first = sorted(urgent_waits)[: min(limit, urgent)]
    assert max(first) < 600.0, (urgent_waits, limit)
    if urgent >= limit:
        assert min(batch_waits) >= RUN_S - 120.0, (batch_waits, limit)


def test_the_instances_bought_go_to_the_higher_class_though_lower_ones_waited_longer(
    tmp_path: Path,
) -> None:
    """One pool and one shape: the scheduler, not the plan, decides who starts on the two
    instances the limit allows; the older batch jobs would take them in FIFO order."""
    rows = [trace_row("hold", 0, 40_000, 1, "lab", 0, "batch")]
    rows += [trace_row(f"b{i}", 5, RUN_S, 1, "lab", 1, "batch") for i in range(4)]
    rows += [trace_row(f"u{i}", 15, RUN_S, 1, "lab", 1, "urgent") for i in range(2)]
    text = scenario(
        "placed-first", [1], CLASSES, window_s=40_000, limits=LIMITED.replace("LIMIT", "2")
    )
    result = replayed(tmp_path, text, rows)
    waits = dict(zip(result.wait_job_ids, result.waits_s, strict=True))
    assert max(w for job, w in waits.items() if job.startswith("u")) < 600.0, waits
    assert min(w for job, w in waits.items() if job.startswith("b")) >= RUN_S - 120.0, waits
