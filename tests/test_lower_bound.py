"""The offline lower bound: never above any real schedule, exact where it can be, fast on the demo.

The reduced LP in autoscaler/sim/lowerbound.py is checked three ways: against brute force over
real (non-fluid) schedules, which it must never exceed; against a literal transcription of the
formulation in docs/lower-bound.md, which its reductions must not change; and against hand
computations.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scipy.optimize import linprog

from autoscaler.model import Pool
from autoscaler.sim.cloud import PoolMarketModel
from autoscaler.sim.engine import prepare
from autoscaler.sim.lowerbound import (
    CLOSED_FORM,
    LINEAR_PROGRAM,
    BoundJob,
    _linear_program,
    cheapest_gpu_price,
    compute_lower_bounds,
    lower_bound,
)
from autoscaler.sim.market import AvailabilityTrace
from autoscaler.sim.scenario import default_scenario_path, load_scenario
from autoscaler.sim.series import StepSeries

HOUR = 3600.0


def schedule_cost(
    jobs: Sequence[BoundJob],
    starts: Sequence[float],
    onprem: int,
    price: StepSeries,
    horizon: float,
) -> float:
    """The exact cloud cost of running each job from its start for its duration, within [0, T]."""
    points = {0.0, horizon}
    points.update(t for t in price.times if 0 < t < horizon)
    for job, s in zip(jobs, starts, strict=True):
        points.update(t for t in (s, s + job.duration_s) if 0 < t < horizon)
    cost = 0.0
    for lo, hi in itertools.pairwise(sorted(points)):
        mid = (lo + hi) / 2
        load = sum(
            job.gpus for job, s in zip(jobs, starts, strict=True) if s <= mid < s + job.duration_s
        )
        excess = max(0, load - onprem)
        if excess:
            cost += excess * price.at(mid) * (hi - lo) / HOUR
    return cost


def brute_force(
    jobs: Sequence[BoundJob],
    onprem: int,
    price: StepSeries,
    horizon: float,
    max_wait: float,
    step: float,
) -> float:
    """The cheapest schedule whose jobs start on a grid within the wait and never pause."""
    choices = [
        [job.submit_s + i * step for i in range(math.floor(max_wait / step + 1e-9) + 1)]
        for job in jobs
    ]
    return min(
        schedule_cost(jobs, starts, onprem, price, horizon)
        for starts in itertools.product(*choices)
    )


def reference_lp(
    jobs: Sequence[BoundJob],
    onprem: int,
    price: StepSeries,
    horizon: float,
    max_wait: float,
    bin_s: float,
) -> float | None:
    """The formulation exactly as docs/lower-bound.md writes it, with no reduction, dense.

    Variables: z_{j,k} (cumulative occupancy at each bin end of the job's window), then c_k. Only
    for jobs submitted at or after 0: it has no notion of work done before the window.
    """
    count = max(1, math.ceil(horizon / bin_s - 1e-9))
    edges = [min(i * bin_s, horizon) for i in range(count + 1)]
    edges[-1] = horizon
    index: dict[tuple[int, int], int] = {}
    for j, job in enumerate(jobs):
        end = min(horizon, job.submit_s + max_wait + job.duration_s)
        for k in range(count):
            if edges[k + 1] > job.submit_s and edges[k] < end:
                index[(j, k)] = len(index)
    n_z = len(index)
    n = n_z + count
    rows: list[list[float]] = []
    rhs: list[float] = []

    def row() -> list[float]:
        r = [0.0] * n
        rows.append(r)
        return r

    bounds: list[tuple[float, float | None]] = [(0.0, None)] * n
    for (j, k), v in index.items():
        job = jobs[j]
        t = edges[k + 1]
        low = job.gpus * min(job.duration_s, max(0.0, t - job.submit_s - max_wait))
        high = job.gpus * max(0.0, t - job.submit_s)
        bounds[v] = (low, high)
        cap = job.gpus * max(0.0, edges[k + 1] - max(edges[k], job.submit_s))
        previous = index.get((j, k - 1))
        r = row()  # y = z_k - z_{k-1} <= cap
        r[v] = 1.0
        if previous is not None:
            r[previous] = -1.0
        rhs.append(cap)
        r = row()  # y >= 0
        r[v] = -1.0
        if previous is not None:
            r[previous] = 1.0
        rhs.append(0.0)
    objective = [0.0] * n
    for k in range(count):
        width = edges[k + 1] - edges[k]
        r = row()  # sum_j y_jk - c_k <= H |bin|
        for j in range(len(jobs)):
            here = index.get((j, k))
            if here is not None:
                r[here] += 1.0
                before = index.get((j, k - 1))
                if before is not None:
                    r[before] -= 1.0
        r[n_z + k] = -1.0
        rhs.append(onprem * width)
        p = price.minimum(edges[k], edges[k + 1])
        if math.isinf(p):
            bounds[n_z + k] = (0.0, 0.0)
        else:
            objective[n_z + k] = p / HOUR
    result = linprog(objective, A_ub=np.array(rows), b_ub=rhs, bounds=bounds, method="highs")
    if result.status == 2:
        return None
    assert result.status == 0, result.message
    return float(result.fun)


def bound_cost(
    jobs: Sequence[BoundJob],
    onprem: int,
    price: StepSeries,
    horizon: float,
    max_wait: float,
    bin_s: float,
) -> float | None:
    result = lower_bound(jobs, onprem, price, horizon, max_wait, bin_s)
    assert result.status in {"optimal", "infeasible"}, result.status
    assert (result.cost is None) == (result.status == "infeasible")
    return result.cost


@st.composite
def cases(
    draw: st.DrawFn, allow_closed: bool = False, allow_early: bool = True
) -> dict[str, object]:
    """Small cases; ``allow_early`` lets jobs be submitted before the window opens."""
    horizon = float(draw(st.integers(6, 24)))
    bin_s = float(draw(st.sampled_from([1, 2, 3, 4, 5, 7])))
    jobs = [
        BoundJob(
            float(draw(st.integers(-6 if allow_early else 0, int(horizon) - 1))),
            float(draw(st.integers(0, 12))),
            draw(st.integers(1, 3)),
        )
        for _ in range(draw(st.integers(1, 3)))
    ]
    cuts = sorted(set(draw(st.lists(st.integers(1, int(horizon) - 1), max_size=2))))
    levels = [0.5, 1.0, 2.0, 3.5, *([math.inf] if allow_closed else [])]
    values = [draw(st.sampled_from(levels)) for _ in range(len(cuts) + 1)]
    price = StepSeries([0.0, *map(float, cuts)], values)
    return {
        "jobs": jobs,
        "onprem": draw(st.integers(0, 2)),
        "price": price,
        "horizon": horizon,
        "max_wait": float(draw(st.integers(0, 8))),
        "bin_s": bin_s,
    }


FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FAST
@given(cases(allow_closed=True))
def test_bound_never_exceeds_any_real_schedule(case: dict[str, object]) -> None:
    jobs = case["jobs"]
    onprem, price, horizon = case["onprem"], case["price"], case["horizon"]
    max_wait, bin_s = case["max_wait"], case["bin_s"]
    assert isinstance(jobs, list) and isinstance(price, StepSeries)
    assert isinstance(onprem, int) and isinstance(horizon, float)
    assert isinstance(max_wait, float) and isinstance(bin_s, float)
    best = brute_force(jobs, onprem, price, horizon, max_wait, step=1.0)
    bound = bound_cost(jobs, onprem, price, horizon, max_wait, bin_s)
    if bound is None:
        assert math.isinf(best), "the bound says infeasible but a schedule exists"
    else:
        assert bound <= best + 1e-6


@FAST
@given(cases(allow_closed=True, allow_early=False))
def test_reductions_keep_the_lp_optimum(case: dict[str, object]) -> None:
    jobs = case["jobs"]
    onprem, price, horizon = case["onprem"], case["price"], case["horizon"]
    max_wait, bin_s = case["max_wait"], case["bin_s"]
    assert isinstance(jobs, list) and isinstance(price, StepSeries)
    assert isinstance(onprem, int) and isinstance(horizon, float)
    assert isinstance(max_wait, float) and isinstance(bin_s, float)
    expected = reference_lp(jobs, onprem, price, horizon, max_wait, bin_s)
    cost, _ = _linear_program(jobs, onprem, price, horizon, max_wait, bin_s)
    if expected is None:
        assert cost is None
    else:
        assert cost == pytest.approx(expected, rel=1e-7, abs=1e-7)


@FAST
@given(cases(allow_closed=True))
def test_closed_form_equals_lp_without_wait(case: dict[str, object]) -> None:
    jobs = case["jobs"]
    onprem, price, horizon, bin_s = case["onprem"], case["price"], case["horizon"], case["bin_s"]
    assert isinstance(jobs, list) and isinstance(price, StepSeries)
    assert isinstance(onprem, int) and isinstance(horizon, float) and isinstance(bin_s, float)
    closed = lower_bound(jobs, onprem, price, horizon, 0.0, bin_s)
    assert closed.method == CLOSED_FORM
    cost, status = _linear_program(jobs, onprem, price, horizon, 0.0, bin_s)
    assert status == closed.status
    if closed.cost is None:
        assert cost is None
    else:
        assert cost == pytest.approx(closed.cost, rel=1e-7, abs=1e-7)


@FAST
@given(cases(), st.integers(0, 8), st.integers(0, 8))
def test_bound_never_rises_with_a_longer_wait(case: dict[str, object], w1: int, w2: int) -> None:
    jobs = case["jobs"]
    onprem, price, horizon, bin_s = case["onprem"], case["price"], case["horizon"], case["bin_s"]
    assert isinstance(jobs, list) and isinstance(price, StepSeries)
    assert isinstance(onprem, int) and isinstance(horizon, float) and isinstance(bin_s, float)
    short, long = sorted((float(w1), float(w2)))
    tight = bound_cost(jobs, onprem, price, horizon, short, bin_s)
    loose = bound_cost(jobs, onprem, price, horizon, long, bin_s)
    assert tight is not None and loose is not None
    assert loose <= tight + 1e-7


def test_explicit_cases_below_brute_force() -> None:
    price = StepSeries([0.0, 1800.0, 3000.0], [2.0, 0.5, 3.0])
    jobs = [BoundJob(0.0, 1500.0, 2), BoundJob(300.0, 2400.0, 1), BoundJob(900.0, 600.0, 3)]
    for onprem in (0, 1, 2):
        for wait in (0.0, 300.0, 600.0, 1200.0):
            best = brute_force(jobs, onprem, price, 4200.0, wait, step=75.0)
            bound = bound_cost(jobs, onprem, price, 4200.0, wait, 300.0)
            assert bound is not None
            assert bound <= best + 1e-6
            expected = reference_lp(jobs, onprem, price, 4200.0, wait, 300.0)
            assert bound == pytest.approx(expected, rel=1e-7, abs=1e-7)


def test_waiting_moves_work_to_the_cheap_hours() -> None:
    """A job may wait for the price to fall: the bound must see that, and the closed form not."""
    price = StepSeries([0.0, 600.0], [4.0, 1.0])
    jobs = [BoundJob(0.0, 3000.0, 1)]
    closed = lower_bound(jobs, 0, price, 7200.0, 0.0, 300.0)
    waited = lower_bound(jobs, 0, price, 7200.0, 600.0, 300.0)
    assert closed.cost == pytest.approx((600 * 4.0 + 2400 * 1.0) / HOUR)
    assert waited.method == LINEAR_PROGRAM and waited.status == "optimal"
    assert waited.cost == pytest.approx(3000 * 1.0 / HOUR)


def test_hand_computed_closed_form() -> None:
    price = StepSeries([0.0], [3.0])
    result = lower_bound([BoundJob(300.0, 7200.0, 2)], 1, price, 10_000.0, 0.0, 300.0)
    assert result.method == CLOSED_FORM and result.status == "optimal"
    assert result.cost == pytest.approx(1 * 7200.0 * 3.0 / HOUR, abs=1e-12)
    assert result.max_wait_s == 0.0 and result.bin_s == 300.0
    # Off the bin grid, on-prem's idle time in the partly used end bins is counted against the
    # job's excess: bin [0, 300) holds 400 GPU-s against 300 on-prem, bin [7200, 7500) 200 against
    # 300, and the 23 bins between 300 GPU-s of excess each.
    shifted = lower_bound([BoundJob(100.0, 7200.0, 2)], 1, price, 10_000.0, 0.0, 300.0)
    assert shifted.cost == pytest.approx((100 + 23 * 300) * 3.0 / HOUR, abs=1e-12)


def test_tight_for_a_single_job_at_a_constant_price() -> None:
    price = StepSeries([0.0], [2.5])
    jobs = [BoundJob(600.0, 3000.0, 2)]
    for horizon in (6000.0, 3900.0, 2400.0):
        best = brute_force(jobs, 0, price, horizon, 600.0, step=75.0)
        bound = bound_cost(jobs, 0, price, horizon, 600.0, 300.0)
        assert bound == pytest.approx(best, rel=1e-9, abs=1e-9)
    assert bound_cost(jobs, 0, price, 6000.0, 600.0, 300.0) == pytest.approx(
        2.5 * 2 * 3000.0 / HOUR
    )


def test_zero_when_onprem_covers_all_demand() -> None:
    price = StepSeries([0.0, 1000.0], [3.0, 1.0])
    jobs = [BoundJob(0.0, 5000.0, 4), BoundJob(200.0, 800.0, 2), BoundJob(4000.0, 20000.0, 1)]
    for wait in (0.0, 600.0):
        result = lower_bound(jobs, 7, price, 8000.0, wait, 300.0)
        assert result.status == "optimal"
        assert result.cost == pytest.approx(0.0, abs=1e-12)


def test_no_cloud_on_offer_makes_the_bound_infeasible() -> None:
    price = StepSeries([0.0, 600.0, 1200.0], [1.0, math.inf, 1.0])
    jobs = [BoundJob(0.0, 3000.0, 2)]
    # Even a fluid pause of g·W = 600 GPU-s cannot empty the 1200 GPU-s of the closed stretch.
    for wait in (0.0, 300.0):
        result = lower_bound(jobs, 0, price, 3600.0, wait, 300.0)
        assert result.status == "infeasible" and result.cost is None
    # With enough wait the job sits the closed stretch out.
    result = lower_bound([BoundJob(0.0, 1200.0, 2)], 0, price, 3600.0, 1200.0, 300.0)
    assert result.status == "optimal"
    assert result.cost == pytest.approx(2 * 1200.0 * 1.0 / HOUR)


def test_jobs_submitted_before_the_window_ran_for_free_before_it() -> None:
    jobs = [BoundJob(-1000.0, 1500.0, 1)]
    for wait in (0.0, 600.0):
        result = lower_bound(jobs, 0, StepSeries([0.0], [1.0]), 3600.0, wait, 300.0)
        assert result.cost == pytest.approx(500.0 / HOUR)


def test_no_jobs_costs_nothing() -> None:
    for wait in (0.0, 600.0):
        result = lower_bound([], 0, StepSeries([0.0], [1.0]), 3600.0, wait, 300.0)
        assert result.cost == 0.0 and result.status == "optimal"


def _pool(name: str, gpus: int) -> Pool:
    return Pool(
        name=name,
        provider="aws",
        region="us-east-1",
        instance_type="p3",
        gpus_per_instance=gpus,
        market="spot",
    )


def test_cheapest_price_follows_availability() -> None:
    pools = [_pool("small", 1), _pool("big", 8)]
    blinking = AvailabilityTrace("t", 1, StepSeries([0.0, 100.0, 200.0], [1.0, 0.0, 1.0]))
    markets = {
        "small": PoolMarketModel(StepSeries([0.0], [2.0]), availability=blinking),
        "big": PoolMarketModel(StepSeries([0.0, 150.0], [24.0, 20.0])),
    }
    series = cheapest_gpu_price(markets, pools, 300.0)
    assert [series.at(t) for t in (0.0, 99.0, 100.0, 149.0, 150.0, 199.0, 200.0, 299.0)] == [
        2.0,
        2.0,
        3.0,
        3.0,
        2.5,
        2.5,
        2.0,
        2.0,
    ]
    assert series.minimum(100.0, 150.0) == 3.0


def test_cheapest_price_is_infinite_when_nothing_is_on_offer() -> None:
    pools = [_pool("small", 1), _pool("big", 8)]
    gap = AvailabilityTrace("a", 1, StepSeries([0.0, 100.0, 200.0], [1.0, 0.0, 1.0]))
    # A multi-node trace counts instances: 0 instances is nothing on offer.
    counted = AvailabilityTrace("b", 8, StepSeries([0.0, 50.0, 250.0], [3.0, 0.0, 2.0]))
    markets = {
        "small": PoolMarketModel(StepSeries([0.0], [2.0]), availability=gap),
        "big": PoolMarketModel(StepSeries([0.0], [8.0]), availability=counted),
    }
    series = cheapest_gpu_price(markets, pools, 400.0)
    assert series.at(0.0) == 1.0
    assert series.at(60.0) == 2.0
    assert math.isinf(series.at(100.0)) and math.isinf(series.at(199.0))
    assert series.at(200.0) == 2.0
    assert series.at(300.0) == 1.0


def test_cheapest_price_follows_looping_availability() -> None:
    pools = [_pool("small", 1), _pool("big", 8)]
    looping = AvailabilityTrace("l", 1, StepSeries([0.0, 10.0], [1.0, 0.0], period=20.0))
    markets = {
        "small": PoolMarketModel(StepSeries([0.0], [1.0]), availability=looping),
        "big": PoolMarketModel(StepSeries([0.0], [40.0])),
    }
    series = cheapest_gpu_price(markets, pools, 100.0)
    for cycle in range(5):
        assert series.at(20.0 * cycle + 5) == 1.0
        assert series.at(20.0 * cycle + 15) == 5.0


def test_shipped_scenario_bounds() -> None:
    prepared = prepare(load_scenario(default_scenario_path()))
    results = compute_lower_bounds(prepared)
    wait = prepared.loaded.scenario.wait_target_s
    assert [r.max_wait_s for r in results] == [0.0, wait]
    assert [r.method for r in results] == [CLOSED_FORM, LINEAR_PROGRAM]
    assert all(r.status == "optimal" for r in results)
    no_wait, waited = (r.cost for r in results)
    assert no_wait is not None and waited is not None
    assert no_wait >= waited > 0
    assert results[1].solve_s < 120
