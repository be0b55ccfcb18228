"""The report reads at a glance: the comparison in two tables that fit a page, a 'vs cheapest'
column, pools dearest first, cost drawn against the cheapest policy with a close-up where a much
dearer policy would squash a small difference, and lower bounds as labelled end points."""

from __future__ import annotations

import re
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_report_render import _policy, sample_report

from autoscaler.report.model import PolicyResult, PoolCost, Report
from autoscaler.report.plots import (
    CLOSE_UP_SHARE,
    cost_plot,
    plot_style,
    relative_cost_figure,
    relative_cost_plot,
)
from autoscaler.report.render import (
    comparison_tables,
    render_html,
    render_markdown,
    summary_markdown,
)

# Every column of the single comparison table the report had before it was split.
EVERY_COLUMN = {
    "Policy",
    "Cost",
    "$/useful GPU-h",
    "÷ LB W=0s",
    "÷ LB W=600s",
    "Wait p50 s",
    "Wait p95 s",
    "Wait p99 s",
    "GPU-h useful",
    "GPU-h cloud paid",
    "GPU-h cloud idle",
    "GPU-h lost",
    "Interruptions",
    "Checkpoints",
    "On-prem util",
    "GPU-h on-prem allocated idle",
    "Jobs finished/total",
}


def _with_costs(*costs: float) -> Report:
    policies = [_policy("p", f"policy {i}", cost, {}) for i, cost in enumerate(costs)]
    return sample_report().model_copy(update={"policies": policies, "lower_bounds": []})


def _svg_texts(svg: str) -> list[str]:
    """Matplotlib draws text as paths and keeps each string beside it as an XML comment."""
    return [t.strip() for t in re.findall(r"<!-- (.*?) -->", svg)]


# ---------------------------------------------------------------- the comparison tables


def test_comparison_keeps_every_column_in_two_narrow_tables() -> None:
    report = sample_report()
    cost, usage = comparison_tables(report)
    assert set(cost.headers) | set(usage.headers) == EVERY_COLUMN | {"vs cheapest"}
    assert cost.headers[0] == usage.headers[0] == "Policy"
    for table in (cost, usage):
        assert len(table.headers) <= 10, table.headers
        assert [row[0] for row in table.rows] == [
            "Cost-aware (default)",
            "On-demand only <b>",
            "Cheapest spot",
        ]


def test_vs_cheapest_ranks_every_policy_against_the_cheapest() -> None:
    cost, _ = comparison_tables(_with_costs(1010.0, 1000.0, 2700.0, 1000.4))
    column = cost.headers.index("vs cheapest")
    assert [row[column] for row in cost.rows] == ["+1.0 %", "cheapest", "+170.0 %", "+0.04 %"]


def test_one_policy_has_no_vs_cheapest_column() -> None:
    cost, _ = comparison_tables(_with_costs(500.0))
    assert "vs cheapest" not in cost.headers


def test_the_terminal_summary_prints_both_tables() -> None:
    text = summary_markdown(sample_report())
    assert "| Policy | Cost | vs cheapest |" in text
    assert "| Policy | GPU-h useful |" in text


def test_html_names_each_comparison_table() -> None:
    page = render_html(_with_costs(1000.0, 1010.0))
    assert '<table data-table="comparison-cost">' in page
    assert '<table data-table="comparison-usage">' in page


# ---------------------------------------------------------------- cost by pool


def test_cost_by_pool_lists_the_dearest_pool_first() -> None:
    pools = [
        PoolCost(pool="b-cheap", cost=5.0, instance_hours=1.0),
        PoolCost(pool="a-dear", cost=500.0, instance_hours=10.0),
        PoolCost(pool="c-unused", cost=0.0, instance_hours=0.0),
        PoolCost(pool="d-middle", cost=120.0, instance_hours=3.0),
        PoolCost(pool="c-middle", cost=120.0, instance_hours=3.0),
    ]
    report = sample_report()
    policy = report.policies[0].model_copy(update={"cost": 745.0, "cost_by_pool": pools})
    text = render_markdown(report.model_copy(update={"policies": [policy]}))
    section = text.split("## Cost by pool", 1)[1].split("\n## ", 1)[0]
    rows = [line.split("|")[1].strip() for line in section.splitlines() if line.startswith("| ")]
    assert rows == ["Pool", ":---", "a-dear", "c-middle", "d-middle", "b-cheap"]


# ---------------------------------------------------------------- cost against the cheapest


def _extra_lines(ax: Any) -> dict[str, tuple[list[float], list[float]]]:
    """Each policy line of a panel, by its legend label."""
    lines = {}
    for line in ax.get_lines():
        label = line.get_label()
        if not label.startswith("_"):
            lines[label] = (list(line.get_xdata()), list(line.get_ydata()))
    return lines


def test_a_one_percent_difference_gets_a_close_up_where_it_fills_the_panel() -> None:
    report = _with_costs(1000.0, 1010.0, 2700.0)
    with plot_style():
        drawn = relative_cost_figure(report)
        assert drawn is not None
        assert drawn.close_up and drawn.cheapest.label == "policy 0"
        top, close = drawn.panels
        assert "close-up" in close.get_title(loc="left")
        low, high = close.get_ylim()
        near = _extra_lines(close)
        assert set(near) == {r"policy 0: the cheapest, \$1,000", r"policy 1: +\$10.00 (+1.0 %)"}
        ends = near[r"policy 1: +\$10.00 (+1.0 %)"][1]
        assert ends[-1] == pytest.approx(10.0)
        assert ends[-1] / (high - low) > 0.5, "the 1 % difference fills the close-up"
        low, high = top.get_ylim()
        assert ends[-1] / (high - low) < CLOSE_UP_SHARE, "and is squashed in the full panel"


def test_differences_of_one_size_need_no_close_up() -> None:
    report = _with_costs(1300.0, 1000.0, 1600.0)
    with plot_style():
        drawn = relative_cost_figure(report)
        assert drawn is not None and not drawn.close_up
        lines = _extra_lines(drawn.panels[0])
    assert lines[r"policy 0: +\$300 (+30.0 %)"][1][-1] == pytest.approx(300.0)
    assert lines[r"policy 2: +\$600 (+60.0 %)"][1][-1] == pytest.approx(600.0)
    assert set(lines[r"policy 1: the cheapest, \$1,000"][1]) == {0.0}


def test_one_policy_has_no_relative_plot() -> None:
    report = _with_costs(700.0)
    assert relative_cost_plot(report) is None
    assert render_html(report).count("<svg") == 3


def test_a_free_cheapest_policy_shows_dollars_only() -> None:
    """Nothing to divide by: no share axis, and the labels say dollars."""
    plot = relative_cost_plot(_with_costs(0.0, 250.0))
    assert plot is not None
    texts = _svg_texts(plot.svg)
    assert "policy 1: +$250" in texts
    assert "share of the cheapest's total" not in texts


def _policy_sampled(label: str, hours: list[float], cost: list[float]) -> PolicyResult:
    base = _policy("p", label, cost[-1], {})
    timeline = base.timeline.model_copy(
        update={"cost": base.timeline.cost.model_copy(update={"t_hours": hours, "values": cost})}
    )
    return base.model_copy(update={"timeline": timeline})


@settings(max_examples=25, deadline=None)
@given(
    st.lists(st.floats(0.0, 50.0), min_size=2, max_size=12),
    st.lists(st.floats(0.0, 50.0), min_size=2, max_size=12),
)
def test_each_curve_ends_at_its_total_difference(a: list[float], b: list[float]) -> None:
    """Whatever the sample times of the two curves, each one's extra ends at its total minus
    the cheapest's total, and the cheapest's own curve is zero throughout."""
    first = _policy_sampled("a", [i * 2.0 for i in range(len(a))], _cumulative(a))
    second = _policy_sampled("b", [i * 3.0 for i in range(len(b))], _cumulative(b))
    report = sample_report().model_copy(update={"policies": [first, second], "lower_bounds": []})
    with plot_style():
        drawn = relative_cost_figure(report)
        assert drawn is not None
        lines = list(_extra_lines(drawn.panels[0]).values())
    cheapest, dearer = (first, second) if first.cost <= second.cost else (second, first)
    by_policy = dict(zip((first.label, second.label), lines, strict=True))
    assert set(by_policy[cheapest.label][1]) == {0.0}
    last = by_policy[dearer.label][1][-1]
    if dearer.timeline.cost.t_hours[-1] >= cheapest.timeline.cost.t_hours[-1]:
        assert last == pytest.approx(dearer.cost - cheapest.cost, abs=1e-9)


def _cumulative(steps: list[float]) -> list[float]:
    total, out = 0.0, []
    for step in steps:
        total += step
        out.append(total)
    return out


# ---------------------------------------------------------------- lower bounds


def test_lower_bounds_are_labelled_end_points_not_flat_lines() -> None:
    report = sample_report()
    with plot_style():
        plot = cost_plot(report)
    texts = _svg_texts(plot.svg)
    assert "lower bound W=0 s: $1,000 (total)" in texts
    assert "lower bound W=600 s: $800 (total)" in texts
    assert "end point" in plot.caption and "not as a curve over time" in plot.caption


def test_an_infeasible_bound_draws_no_marker() -> None:
    report = sample_report()
    infeasible = report.lower_bounds[0].model_copy(update={"cost": None, "status": "infeasible"})
    plot = cost_plot(report.model_copy(update={"lower_bounds": [infeasible]}))
    assert not any(t.startswith("lower bound") for t in _svg_texts(plot.svg))
    assert "end point" not in plot.caption
