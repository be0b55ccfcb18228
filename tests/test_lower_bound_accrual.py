"""The lower bound's accrual curve: how one cheapest schedule the closed form or the LP found
spends over the window. The report draws it beside the policies' cumulative costs, so it must
never fall, must end at that optimum (the bound itself, unless the exact dual raised the bound
above a pooled LP), and must stay small however many bins the window has."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from test_lower_bound import FAST, SLOW, _single, cases, fleets

from autoscaler.sim.lowerbound import (
    CLOSED_FORM,
    LINEAR_PROGRAM,
    MAX_ACCRUAL_POINTS,
    BoundClass,
    BoundJob,
    bound,
    build_problem,
    lower_bound,
    problem_of,
)
from autoscaler.sim.lowerbound_classes import BoundProblem
from autoscaler.sim.lowerbound_lp import POOLED, solve
from autoscaler.sim.lowerbound_result import LowerBoundResult
from autoscaler.sim.series import StepSeries

HOUR = 3600.0


def check_curve(problem: BoundProblem, max_wait: float, bin_s: float, block: int | None) -> None:
    """Non-decreasing, sampled at increasing times up to the horizon, ending at the optimum of
    the closed form or LP behind the bound; never above the bound."""
    result = bound(problem, max_wait, bin_s, block_bins=block)
    solution = solve(problem, max_wait, bin_s, block_bins=block)
    assert result.cost == solution.cost, "the curve changes nothing about the bound's value"
    if result.cost is None:
        assert result.accrual_t_hours == [] and result.accrual_cost == []
        return
    hours, spent = result.accrual_t_hours, result.accrual_cost
    assert len(hours) == len(spent) >= 1
    assert all(b > a for a, b in itertools.pairwise(hours))
    assert hours[-1] == pytest.approx(problem.horizon_s / HOUR, abs=1e-6)
    assert spent[0] >= 0
    assert all(b >= a for a, b in itertools.pairwise(spent)), spent
    assert solution.lp_cost is not None
    assert spent[-1] == pytest.approx(solution.lp_cost, rel=1e-6, abs=1e-6)
    assert spent[-1] <= result.cost + 1e-6
    if result.method != POOLED:
        assert spent[-1] == pytest.approx(result.cost, rel=1e-6, abs=1e-6)


@FAST
@given(cases(allow_closed=True), st.sampled_from([None, 1, 2, 3]))
def test_the_curve_never_falls_and_ends_at_the_optimum(
    case: dict[str, object], block: int | None
) -> None:
    problem, max_wait, bin_s = _single(case)
    check_curve(problem, max_wait, bin_s, block)
    check_curve(problem, 0.0, bin_s, block)  # the closed form


@SLOW
@given(fleets(), st.sampled_from([None, 1, 2]))
def test_the_curve_of_shape_classes_and_several_groups_ends_at_the_optimum(
    case: dict[str, Any], block: int | None
) -> None:
    """Several on-prem groups take the allocation LP even without a wait."""
    problem = build_problem(
        case["jobs"], case["onprem"], case["pools"], case["markets"], case["horizon"]
    )
    check_curve(problem, case["max_wait"], case["bin_s"], block)
    check_curve(problem, 0.0, case["bin_s"], block)


def test_hand_computed_curves_with_and_without_a_wait() -> None:
    """One 1-GPU job over 3000 s; $4 an hour for the first 600 s, then $1. Without a wait it
    pays $4 for two bins, then $1; allowed 600 s, it waits them out and pays $1 from then on."""
    price = StepSeries([0.0, 600.0], [4.0, 1.0])
    jobs = [BoundJob(0.0, 3000.0, 1)]
    closed = lower_bound(jobs, 0, price, 7200.0, 0.0, 300.0)
    waited = lower_bound(jobs, 0, price, 7200.0, 600.0, 300.0)
    assert closed.method == CLOSED_FORM and waited.method == LINEAR_PROGRAM
    ends = [round(300.0 * k / HOUR, 6) for k in range(1, 25)]

    def at(result: LowerBoundResult, seconds: float) -> float:
        return result.accrual_cost[result.accrual_t_hours.index(round(seconds / HOUR, 6))]

    for result in (closed, waited):
        assert result.accrual_t_hours == ends
    assert at(closed, 300) == pytest.approx(4 * 300 / HOUR)
    assert at(closed, 600) == pytest.approx(4 * 600 / HOUR)
    assert at(closed, 3000) == pytest.approx((4 * 600 + 2400) / HOUR)
    assert at(closed, 7200) == pytest.approx(closed.cost)
    assert at(waited, 600) == pytest.approx(0.0, abs=1e-9)
    assert at(waited, 1800) == pytest.approx(1200 / HOUR)
    assert at(waited, 3600) == pytest.approx(3000 / HOUR)
    assert at(waited, 7200) == pytest.approx(waited.cost)


def test_nothing_bought_is_a_flat_curve_at_zero() -> None:
    result = lower_bound([BoundJob(0.0, 600.0, 1)], 4, StepSeries([0.0], [2.0]), 3600.0, 0.0, 300)
    assert result.cost == 0.0
    assert result.accrual_cost == [0.0] * 12


def test_a_window_of_many_bins_keeps_at_most_the_report_s_points_and_the_last() -> None:
    """25 days of 60 s bins are 36,000 points: thinned, with the window's end kept."""
    horizon = 25 * 86_400.0
    jobs = [BoundJob(3600.0 * h, 5400.0, 2) for h in range(0, 600, 7)]
    problem = problem_of(jobs, [BoundClass(StepSeries([0.0], [3.0]), (0,))], [1], horizon)
    result = bound(problem, 0.0, 60.0)
    assert result.cost is not None
    assert 1000 < len(result.accrual_t_hours) <= MAX_ACCRUAL_POINTS
    assert result.accrual_t_hours[-1] == pytest.approx(horizon / HOUR)
    assert result.accrual_cost[-1] == pytest.approx(result.cost, rel=1e-9)
    spent = result.accrual_cost
    assert all(b >= a for a, b in itertools.pairwise(spent))


def test_where_the_exact_dual_raised_the_bound_the_curve_ends_below_it() -> None:
    """A 2 s job allowed a 2 s wait, $2 an hour for 3 s then $1, bins of 3 s pooled in pairs:
    the pooled LP lets the job shift its pause into the cheap bin and spends 2 GPU-s at $1;
    the exact dual raises the bound to the exact LP's 3 GPU-s' worth. The curve is the pooled
    schedule's, so it ends below the bound (the report's caption says so)."""
    price = StepSeries([0.0, 3.0], [2.0, 1.0])
    problem = problem_of([BoundJob(0.0, 2.0, 1)], [BoundClass(price, (0,))], [0], 6.0)
    result = bound(problem, 2.0, 3.0, block_bins=2)
    assert result.method == POOLED and result.cost is not None
    assert result.cost == pytest.approx(solve(problem, 2.0, 3.0, block_bins=1).cost)
    assert result.cost == pytest.approx(3.0 / HOUR)
    assert result.accrual_t_hours == [round(3.0 / HOUR, 6), round(6.0 / HOUR, 6)]
    assert result.accrual_cost[-1] == pytest.approx(2.0 / HOUR, abs=1e-6)
    assert result.accrual_cost[-1] < result.cost
