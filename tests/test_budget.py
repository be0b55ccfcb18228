"""The monthly budget cap: read from the journal's spend, enforced by the guard whatever the
policy asks for, and said in the tick's clamps and in metrics. Spend that cannot be read holds
scale-up; it is never taken for zero."""

from __future__ import annotations

from pathlib import Path

import pytest
from fakes import job, pool, rig
from hypothesis import given, settings
from hypothesis import strategies as st
from test_controller import Scripted

from autoscaler.model import LaunchRequest, Plan
from autoscaler.ops.journal.base import Billed, TickEntry, open_sqlite
from autoscaler.ops.metrics import Metrics

HOUR = 3600.0


@settings(max_examples=200, deadline=None)
@given(
    cap=st.floats(0.0, 500.0),
    spent=st.floats(0.0, 1000.0),
    wanted=st.integers(1, 20),
)
def test_scale_up_stops_once_the_month_spend_reaches_the_cap(
    cap: float, spent: float, wanted: int
) -> None:
    t = rig([pool("a")], {"a": 1.0}, limits={"max_cost_per_month": cap})
    t.controller.policy = Scripted(plan=Plan(launches=(LaunchRequest(pool="a", count=wanted),)))
    t.controller._month_spend = lambda now, billed, errors: spent  # type: ignore[method-assign]
    report = t.controller.tick()
    launched = sum(a.done for a in report.actions if a.kind == "launch")
    if spent >= cap:
        assert launched == 0
        assert "monthly_budget" in {c.rule for c in report.clamps}
    else:
        assert launched == wanted


def test_a_journal_full_month_stops_scale_up_and_metrics_say_so(tmp_path: Path) -> None:
    journal = open_sqlite(tmp_path / "j.db")
    metrics = Metrics()
    t = rig(
        [pool("a")],
        {"a": 10.0},
        limits={"max_cost_per_month": 25.0},
        journal=journal,
        metrics=metrics,
    )
    t.queue.jobs = [job("x")]
    t.controller.tick()
    t.cloud.boot_all()
    t.clock.advance(2 * HOUR)
    t.queue.jobs = [job("x"), job("y")]
    report = t.controller.tick()
    assert report.month_spend == pytest.approx(20.0)
    assert [a.done for a in report.actions if a.kind == "launch"] == [1], "under the cap"
    t.cloud.boot_all()
    t.clock.advance(HOUR)
    t.queue.jobs = [job("x"), job("y"), job("z")]
    report = t.controller.tick()
    assert report.month_spend is not None and report.month_spend >= 25.0
    assert [a for a in report.actions if a.kind == "launch"] == []
    (clamp,) = [c for c in report.clamps if c.rule == "monthly_budget"]
    assert "limits.max_cost_per_month reached" in clamp.detail
    exposed = metrics.registry.get_sample_value(
        "gpu_autoscaler_budget_exhausted", {"cap": "monthly"}
    )
    assert exposed == 1.0
    assert metrics.registry.get_sample_value("gpu_autoscaler_month_spend_dollars") == (
        pytest.approx(report.month_spend)
    )


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
