"""Lower bounds in the cost plot as cumulative curves: the spending of one cheapest schedule found
while computing each bound, dashed, ending at the bound's marker; a caption that says what the
curve is not, and by how much a curve ends below its marker where the exact dual raised the
bound. A bound without a curve (a report written before bounds kept one) stays an end point."""

from __future__ import annotations

import itertools
import re
from typing import Any

import pytest
from matplotlib.figure import Figure
from matplotlib.patches import ConnectionPatch
from test_report_render import sample_report

from autoscaler.report.model import Report
from autoscaler.report.plots import _bound_marks, cost_plot, plot_style
from autoscaler.sim.lowerbound_result import LowerBoundResult


def _svg_texts(svg: str) -> list[str]:
    """Matplotlib draws text as paths and keeps each string beside it as an XML comment."""
    return [t.strip() for t in re.findall(r"<!-- (.*?) -->", svg)]


def _with_curve(bound: LowerBoundResult, end_short_by: float = 0.0) -> LowerBoundResult:
    """A curve over the sample report's week that ends at the bound, or short of it."""
    assert bound.cost is not None
    hours = [24.0 * d for d in range(1, 8)]
    top = bound.cost - end_short_by
    spent = [round(top * (d / 7) ** 2, 6) for d in range(1, 8)]
    return bound.model_copy(update={"accrual_t_hours": hours, "accrual_cost": spent})


def _report(*bounds: LowerBoundResult) -> Report:
    return sample_report().model_copy(update={"lower_bounds": list(bounds)})


def _drawn(report: Report) -> tuple[Any, Any]:
    with plot_style():
        fig = Figure()
        ax = fig.add_subplot()
        drawn = _bound_marks(ax, report)
    return ax, drawn


def _curves(ax: Any) -> list[Any]:
    """The bounds' dashed curves (the policies' lines are solid, markers and legend entries have
    at most one point)."""
    return [
        line
        for line in ax.lines
        if line.get_linestyle() not in {"None", "-"} and len(line.get_xdata()) > 1
    ]


def test_each_bound_is_a_dashed_curve_from_the_start_to_its_marker() -> None:
    no_wait, waited = sample_report().lower_bounds
    report = _report(_with_curve(no_wait), _with_curve(waited))
    ax, drawn = _drawn(report)
    assert (drawn.markers, drawn.curves, drawn.short) == (2, 2, ())
    curves = _curves(ax)
    assert len(curves) == 2
    for line, bound in zip(curves, report.lower_bounds, strict=True):
        xs, ys = list(line.get_xdata()), list(line.get_ydata())
        assert xs[0] == 0.0 and ys[0] == 0.0
        assert xs[-1] == pytest.approx(7.0) and ys[-1] == pytest.approx(bound.cost)
        assert all(b >= a for a, b in itertools.pairwise(ys))
    assert curves[0].get_linestyle() != curves[1].get_linestyle()
    assert curves[0].get_color() != curves[1].get_color()
    joins = [a for a in ax.get_children() if isinstance(a, ConnectionPatch)]
    assert len(joins) == 2, "a short join carries each curve to its marker beside the end"

    with plot_style():
        plot = cost_plot(report)
    texts = _svg_texts(plot.svg)
    assert "lower bound W=0 s: $1,000 (dashed: one cheapest LP schedule)" in texts
    assert "lower bound W=600 s: $800 (dashed: one cheapest LP schedule)" in texts
    assert "one cheapest schedule found while computing that bound" in plot.caption
    assert "not a bound at every moment" in plot.caption
    assert "ends below the marker" not in plot.caption
    assert "end point only" not in plot.caption


def test_a_curve_the_dual_left_short_of_its_bound_is_named_with_the_gap() -> None:
    no_wait, waited = sample_report().lower_bounds
    report = _report(_with_curve(no_wait), _with_curve(waited, end_short_by=0.17))
    _, drawn = _drawn(report)
    assert drawn.short == ("W=600 s ($0.17)",)
    with plot_style():
        plot = cost_plot(report)
    assert "its curve ends below the marker: W=600 s ($0.17)." in plot.caption


def test_a_bound_without_a_curve_stays_an_end_point_beside_one_with_a_curve() -> None:
    no_wait, waited = sample_report().lower_bounds
    report = _report(_with_curve(no_wait), waited)
    ax, drawn = _drawn(report)
    assert (drawn.markers, drawn.curves) == (2, 1)
    assert len(_curves(ax)) == 1
    with plot_style():
        plot = cost_plot(report)
    texts = _svg_texts(plot.svg)
    assert "lower bound W=0 s: $1,000 (dashed: one cheapest LP schedule)" in texts
    assert "lower bound W=600 s: $800 (total)" in texts
    assert "end point only, not as a curve over time" in plot.caption


def test_an_infeasible_bound_draws_neither_curve_nor_marker() -> None:
    no_wait, _ = sample_report().lower_bounds
    infeasible = _with_curve(no_wait).model_copy(
        update={"cost": None, "status": "infeasible", "accrual_t_hours": [], "accrual_cost": []}
    )
    ax, drawn = _drawn(_report(infeasible))
    assert (drawn.markers, drawn.curves) == (0, 0)
    assert not ax.lines and not ax.patches
