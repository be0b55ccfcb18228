"""The monthly budget cap: a projected ceiling (this month's spend from the journal plus the kept
fleet's run rate to the month's end), enforced by the guard whatever the policy asks for, by
holding launches and, over it, shedding capacity in the documented order; said in the tick's
clamps and in metrics. Spend that cannot be read holds scale-up; it is never taken for zero."""

from __future__ import annotations

import math
from datetime import UTC, datetime
from pathlib import Path

import pytest
from fakes import job, pool, rig
from hypothesis import given, settings
from hypothesis import strategies as st
from test_controller import Scripted

from autoscaler.model import LaunchRequest, Plan
from autoscaler.ops.journal.base import Billed, TickEntry, open_sqlite
from autoscaler.ops.metrics import Metrics
from autoscaler.spi.sources import NodeUsage

HOUR = 3600.0


# The rig's clock starts at 1,000,000 s: 1970-01-12 13:46:40 UTC, this far from 1 February.
HOURS_LEFT = (datetime(1970, 2, 1, tzinfo=UTC).timestamp() - 1_000_000.0) / HOUR


@settings(max_examples=200, deadline=None)
@given(
    cap=st.floats(0.0, 5000.0),
    spent=st.floats(0.0, 5000.0),
    wanted=st.integers(1, 20),
)
def test_a_launch_is_granted_only_while_the_projected_month_end_fits_the_cap(
    cap: float, spent: float, wanted: int
) -> None:
    """Each $1/h instance adds its price to the month's end to the projection."""
    t = rig([pool("a")], {"a": 1.0}, limits={"max_cost_per_month": cap})
    t.controller.policy = Scripted(plan=Plan(launches=(LaunchRequest(pool="a", count=wanted),)))
    t.controller._month_spend = lambda now, billed, errors: spent  # type: ignore[method-assign]
    report = t.controller.tick()
    launched = sum(a.done for a in report.actions if a.kind == "launch")
    fits = max(0, math.floor((cap - spent) / HOURS_LEFT + 1e-9))
    assert launched == min(wanted, fits)
    if launched < wanted:
        assert "monthly_budget" in {c.rule for c in report.clamps}


def near_month_end(hours: float) -> float:
    """Seconds to move the rig's clock on so that ``hours`` remain in January 1970."""
    return datetime(1970, 2, 1, tzinfo=UTC).timestamp() - hours * HOUR - 1_000_000.0


def test_the_journal_spend_and_the_run_rate_hold_scale_up_and_metrics_say_so(
    tmp_path: Path,
) -> None:
    journal = open_sqlite(tmp_path / "j.db")
    metrics = Metrics()
    t = rig(
        [pool("a")],
        {"a": 1.0},
        limits={"max_cost_per_month": 10.0},
        journal=journal,
        metrics=metrics,
    )
    t.clock.advance(near_month_end(6))
    t.queue.jobs = [job("x")]
    report = t.controller.tick()
    assert [a.done for a in report.actions if a.kind == "launch"] == [1], "$6 to the month's end"
    t.cloud.boot_all()
    t.clock.advance(2 * HOUR)
    t.queue.jobs = [job("x"), job("y")]
    report = t.controller.tick()
    assert report.month_spend == pytest.approx(2.0)
    assert [a.done for a in report.actions if a.kind == "launch"] == [1], "$2 + 2 x $4 = $10"
    t.cloud.boot_all()
    t.clock.advance(HOUR)
    t.queue.jobs = [job("x"), job("y"), job("z")]
    report = t.controller.tick()
    assert report.month_spend == pytest.approx(4.0)
    assert [a for a in report.actions if a.kind == "launch"] == [], "$4 + 2 x $3 = $10: full"
    (clamp,) = [c for c in report.clamps if c.rule == "monthly_budget"]
    assert clamp.detail.startswith("limits.max_cost_per_month reached: projected month-end $10")
    exposed = metrics.registry.get_sample_value(
        "gpu_autoscaler_budget_exhausted", {"cap": "monthly"}
    )
    assert exposed == 1.0
    assert metrics.registry.get_sample_value("gpu_autoscaler_month_spend_dollars") == (
        pytest.approx(report.month_spend)
    )
    assert not [a for a in report.actions if a.kind == "drain"], "at the cap, nothing is shed"


def test_over_the_projection_the_fleet_sheds_idle_nodes_first() -> None:
    """Spend already past what the month allows: the idle node goes, the busy one stays while
    that is enough."""
    t = rig([pool("a"), pool("b")], {"a": 1.0, "b": 3.0}, limits={"max_cost_per_month": 100.0})
    t.controller.policy = Scripted(
        plan=Plan(launches=(LaunchRequest(pool="a", count=1), LaunchRequest(pool="b", count=1)))
    )
    t.controller._month_spend = lambda now, billed, errors: 0.0  # type: ignore[method-assign]
    t.clock.advance(near_month_end(10))
    t.controller.tick()
    t.cloud.boot_all()
    busy, idle = sorted(t.cloud.instances, key=lambda i: t.cloud.instances[i].pool)
    t.nodes.cloud[busy] = NodeUsage(gpus_allocated=1)
    t.nodes.cloud[idle] = NodeUsage(gpus_allocated=0)
    t.controller.policy = Scripted(plan=Plan())
    t.controller._month_spend = lambda now, billed, errors: 80.0  # type: ignore[method-assign]
    t.clock.advance(HOUR)
    report = t.controller.tick()  # $80 + ($1 + $3) x 9 h = $116 > $100
    drains = [a for a in report.actions if a.kind == "drain"]
    assert [a.instance_ids for a in drains] == [(idle,)], "the idle $3/h node: $89 fits"
    assert "monthly budget: projected month-end $116.00" in drains[0].detail


def test_spend_another_replica_wrote_counts_after_a_takeover(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    other = open_sqlite(path)
    now = 1_000_000.0
    other.record_tick(
        TickEntry("other", 0, 1, now, 0.0, "ok", None, True, 0, 1, 50.0, {}),
        [],
        [Billed("i-other", "fake", "a", 1, 50.0, now - HOUR)],
    )
    journal = open_sqlite(path)
    t = rig([pool("a")], {"a": 1.0}, limits={"max_cost_per_month": 40.0}, journal=journal)
    t.queue.jobs = [job("x")]
    report = t.controller.tick()
    assert report.month_spend == pytest.approx(50.0)
    assert [a for a in report.actions if a.kind == "launch"] == []


def test_unreadable_spend_holds_scale_up(tmp_path: Path) -> None:
    journal = open_sqlite(tmp_path / "j.db")
    t = rig([pool("a")], {"a": 1.0}, limits={"max_cost_per_month": 1000.0}, journal=journal)
    journal.close()
    t.queue.jobs = [job("x")]
    report = t.controller.tick()
    assert report.month_spend is None
    assert [a for a in report.actions if a.kind == "launch"] == []
    (clamp,) = [c for c in report.clamps if c.rule == "monthly_budget"]
    assert "unknown" in clamp.detail
