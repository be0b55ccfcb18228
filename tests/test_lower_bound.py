"""The offline lower bound: never above any real schedule, exact where it can be, fast on the demo.

The reduced LP in autoscaler/sim/lowerbound_lp.py is checked three ways: against brute force over
real (non-fluid) schedules, which it must never exceed; against a literal transcription of the
formulation in docs/lower-bound.md, which its reductions must not change; and against hand
computations. The single-price tests come first; the second half checks shape classes, gangs,
model-restricted on-prem nodes and excluded jobs against brute force over discrete placements.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scipy.optimize import linprog

from autoscaler.model import NodeShape, Pool
from autoscaler.sim.cloud import PoolMarketModel
from autoscaler.sim.engine import prepare
from autoscaler.sim.lowerbound import (
    CLOSED_FORM,
    LINEAR_PROGRAM,
    BoundClass,
    BoundJob,
    BoundProblem,
    bound,
    build_problem,
    cheapest_gpu_price,
    compute_lower_bounds,
    lower_bound,
    problem_of,
)
from autoscaler.sim.lowerbound_lp import POOLED, solve
from autoscaler.sim.market import AvailabilityTrace
from autoscaler.sim.scenario import OnPremNodeSpec, default_scenario_path, load_scenario
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
    block_bins: int | None = None,
) -> float | None:
    result = lower_bound(jobs, onprem, price, horizon, max_wait, bin_s, block_bins=block_bins)
    assert result.status in {"optimal", "infeasible"}, result.status
    assert (result.cost is None) == (result.status == "infeasible")
    return result.cost


def exact_lp(
    jobs: Sequence[BoundJob],
    onprem: int,
    price: StepSeries,
    horizon: float,
    max_wait: float,
    bin_s: float,
) -> float | None:
    """The reduced exact LP, even at W = 0 (where the bound itself takes the closed form)."""
    problem = problem_of(jobs, [BoundClass(price, (0,))], [onprem], horizon)
    return solve(problem, max_wait, bin_s, block_bins=1, force_lp=True).cost


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
@given(cases(allow_closed=True), st.sampled_from([None, 1, 2, 3]))
def test_bound_never_exceeds_any_real_schedule(
    case: dict[str, object], block_bins: int | None
) -> None:
    """Exact (1), pooled in blocks (2, 3) or as chosen by the budget (None)."""
    jobs = case["jobs"]
    onprem, price, horizon = case["onprem"], case["price"], case["horizon"]
    max_wait, bin_s = case["max_wait"], case["bin_s"]
    assert isinstance(jobs, list) and isinstance(price, StepSeries)
    assert isinstance(onprem, int) and isinstance(horizon, float)
    assert isinstance(max_wait, float) and isinstance(bin_s, float)
    best = brute_force(jobs, onprem, price, horizon, max_wait, step=1.0)
    bound = bound_cost(jobs, onprem, price, horizon, max_wait, bin_s, block_bins)
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
    cost = exact_lp(jobs, onprem, price, horizon, max_wait, bin_s)
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
    cost = exact_lp(jobs, onprem, price, horizon, 0.0, bin_s)
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


def _single(case: dict[str, object]) -> tuple[BoundProblem, float, float]:
    jobs, onprem, price = case["jobs"], case["onprem"], case["price"]
    horizon, max_wait, bin_s = case["horizon"], case["max_wait"], case["bin_s"]
    assert isinstance(jobs, list) and isinstance(price, StepSeries)
    assert isinstance(onprem, int) and isinstance(horizon, float)
    assert isinstance(max_wait, float) and isinstance(bin_s, float)
    return problem_of(jobs, [BoundClass(price, (0,))], [onprem], horizon), max_wait, bin_s


@FAST
@given(cases(allow_closed=True), st.integers(1, 8))
def test_dual_function_at_the_exact_lps_prices_gives_its_optimum(
    case: dict[str, object], max_wait: int
) -> None:
    """Strong duality: the greedy evaluation of the dual function is right exactly when it gives
    the exact LP's optimum back at that LP's own dual prices."""
    problem, _, bin_s = _single(case)
    solution = solve(problem, float(max_wait), bin_s, block_bins=1, with_dual=True)
    if solution.cost is None:
        return
    assert solution.lp_cost is not None and solution.dual_cost is not None
    assert solution.dual_cost == pytest.approx(solution.lp_cost, rel=1e-6, abs=1e-6)


@FAST
@given(cases(allow_closed=True), st.sampled_from([2, 3, 4, 6]), st.integers(1, 8))
def test_pooled_bound_lies_between_the_pooled_lp_and_the_exact_lp(
    case: dict[str, object], block_bins: int, max_wait: int
) -> None:
    problem, _, bin_s = _single(case)
    exact = solve(problem, float(max_wait), bin_s, block_bins=1)
    pooled = solve(problem, float(max_wait), bin_s, block_bins=block_bins)
    if exact.cost is None:
        return
    assert pooled.cost is not None, "the pooled LP is a relaxation: feasible wherever exact is"
    assert pooled.cost <= exact.cost + 1e-6
    if pooled.method == POOLED:
        assert pooled.dual_cost is not None and pooled.lp_cost is not None
        assert pooled.dual_cost >= pooled.lp_cost - 1e-6


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
    assert results[0].method == CLOSED_FORM
    assert results[1].method in {LINEAR_PROGRAM, POOLED}
    assert all(r.status == "optimal" for r in results)
    # Every job of the demo fits the on-prem A100 nodes: nothing is left out.
    assert all(r.excluded_jobs == 0 and r.shape_classes == 2 for r in results)
    no_wait, waited = (r.cost for r in results)
    assert no_wait is not None and waited is not None
    assert no_wait >= waited > 0
    assert results[1].solve_s < 120


# ---------------------------------------------------------------- shape classes, gangs, exclusion


@dataclass(frozen=True)
class ShapeJob:
    """A job as the trace gives it: its GPUs over ``nodes`` nodes, models and memory wanted."""

    submit: float
    duration: float
    gpus: int
    nodes: int = 1
    gpu_models: tuple[str, ...] = ()
    min_gpu_memory_gib: float | None = None

    @property
    def shape(self) -> NodeShape:
        return NodeShape(
            gpus=self.gpus // self.nodes,
            gpu_models=self.gpu_models,
            min_gpu_memory_gib=self.min_gpu_memory_gib,
        )


@dataclass(frozen=True)
class Kind:
    """A kind of on-prem node (OnPremNodeSpec plus the GPU memory it may gain)."""

    name: str
    gpus: int
    gpu_model: str | None
    count: int = 1
    gpu_memory_gib: float | None = None


def _shaped_pool(name: str, gpus: int, model: str, memory: float | None) -> Pool:
    return Pool(
        name=name,
        provider="aws",
        region="r",
        instance_type=name,
        gpus_per_instance=gpus,
        gpu_model=model,
        gpu_memory_gib=memory,
        market="spot",
    )


def _series_points(series: StepSeries, horizon: float) -> list[float]:
    points: list[float] = []
    t = 0.0
    while True:
        t = series.next_change(t)
        if t >= horizon:
            return points
        points.append(t)


def _set_partitions(items: list[int]) -> Iterator[list[list[int]]]:
    if not items:
        yield []
        return
    head, rest = items[0], items[1:]
    for partition in _set_partitions(rest):
        yield [[head], *partition]
        for i in range(len(partition)):
            yield [*partition[:i], [head, *partition[i]], *partition[i + 1 :]]


def _placement_cost(
    job_nodes: list[tuple[int, NodeShape]],
    onprem: list[Kind],
    pools: Sequence[Pool],
    prices: Sequence[float],
    open_pools: Sequence[bool],
) -> float:
    """$ per hour of the cheapest discrete placement of these job-nodes right now.

    Each job-node goes on one physical on-prem node that fits it (GPUs counted per node) or on a
    cloud instance; cloud job-nodes are packed into instances of open pools that fit every member.
    As in the simulator, a gang's nodes are on distinct machines and all on-prem or all in the
    cloud. Instance counts are not limited (the bound ignores them too). ``inf`` when some
    job-node has nowhere to go.
    """
    physical = [kind for kind in onprem for _ in range(kind.count)]
    best = math.inf
    for assignment in itertools.product(range(-1, len(physical)), repeat=len(job_nodes)):
        used = [0] * len(physical)
        fits = True
        for (job, shape), where in zip(job_nodes, assignment, strict=True):
            mine = [w for (other, _), w in zip(job_nodes, assignment, strict=True) if other == job]
            if len({w < 0 for w in mine}) > 1:
                fits = False
                break
            if where < 0:
                continue
            node = physical[where]
            used[where] += shape.gpus
            if (
                not shape.accepts(node.gpus, node.gpu_model, node.gpu_memory_gib)
                or used[where] > node.gpus
                or mine.count(where) > 1
            ):
                fits = False
                break
        if not fits:
            continue
        cloud = [i for i, where in enumerate(assignment) if where < 0]
        cheapest = math.inf
        for partition in _set_partitions(cloud):
            total = 0.0
            for block in partition:
                jobs_in = [job_nodes[i][0] for i in block]
                if len(set(jobs_in)) < len(jobs_in):
                    total = math.inf
                    break
                need = sum(job_nodes[i][1].gpus for i in block)
                total += min(
                    (
                        price
                        for pool, price, is_open in zip(pools, prices, open_pools, strict=True)
                        if is_open
                        and pool.gpus_per_instance >= need
                        and all(pool.can_host(job_nodes[i][1]) for i in block)
                    ),
                    default=math.inf,
                )
            cheapest = min(cheapest, total)
        best = min(best, cheapest)
    return best


def _runnable(
    job: ShapeJob,
    onprem: list[Kind],
    pools: Sequence[Pool],
    markets: dict[str, PoolMarketModel],
    horizon: float,
) -> bool:
    """Whether the simulator could ever run the job: enough on-prem nodes it fits for all its
    nodes, or a pool it fits that is on offer at some moment."""
    shape = job.shape
    fitting = sum(k.count for k in onprem if shape.accepts(k.gpus, k.gpu_model, k.gpu_memory_gib))
    if fitting >= job.nodes:
        return True
    for pool in pools:
        market = markets[pool.name]
        moments = [0.0]
        if market.availability is not None:
            moments += _series_points(market.availability.series, horizon)
        if pool.can_host(shape) and any(market.capacity(t) > 0 for t in moments):
            return True
    return False


def discrete_brute_force(
    jobs: list[ShapeJob],
    onprem: list[Kind],
    pools: Sequence[Pool],
    markets: dict[str, PoolMarketModel],
    horizon: float,
    max_wait: float,
) -> float:
    """The cheapest schedule that starts each runnable job on a 1 s grid within the wait, runs
    it without pause, and places its nodes discretely (re-placed freely at every moment, which
    only lowers the cost)."""
    kept = [j for j in jobs if _runnable(j, onprem, pools, markets, horizon)]
    changes = {0.0, horizon}
    for pool in pools:
        market = markets[pool.name]
        changes.update(_series_points(market.price, horizon))
        if market.availability is not None:
            changes.update(_series_points(market.availability.series, horizon))
    cache: dict[tuple[object, ...], float] = {}

    def rate(running: tuple[int, ...], t: float) -> float:
        prices = tuple(markets[p.name].price.at(t) for p in pools)
        open_pools = tuple(markets[p.name].capacity(t) > 0 for p in pools)
        key = (running, prices, open_pools)
        if key not in cache:
            job_nodes = [(i, kept[i].shape) for i in running for _ in range(kept[i].nodes)]
            cache[key] = _placement_cost(job_nodes, onprem, pools, prices, open_pools)
        return cache[key]

    choices = [[j.submit + i for i in range(math.floor(max_wait + 1e-9) + 1)] for j in kept]
    best = math.inf
    for starts in itertools.product(*choices):
        points = set(changes)
        for job, s in zip(kept, starts, strict=True):
            points.update(t for t in (s, s + job.duration) if 0 < t < horizon)
        cost = 0.0
        for lo, hi in itertools.pairwise(sorted(points)):
            mid = (lo + hi) / 2
            running = tuple(
                i
                for i, (job, s) in enumerate(zip(kept, starts, strict=True))
                if s <= mid < s + job.duration
            )
            if running:
                cost += rate(running, mid) * (hi - lo) / HOUR
            if math.isinf(cost):
                break
        best = min(best, cost)
    return best


MODELS = ("A100-80GB", "A100-40GB", "V100", None)


@st.composite
def fleets(draw: st.DrawFn) -> dict[str, Any]:
    """Small fleets and jobs of several shapes: gangs, pinned models, memory needs."""
    horizon = float(draw(st.integers(6, 14)))
    onprem = [
        Kind(
            f"k{i}",
            draw(st.sampled_from([1, 2, 4])),
            model := draw(st.sampled_from(MODELS)),
            draw(st.integers(1, 2)),
            {"A100-80GB": 80.0, "A100-40GB": 40.0, "V100": 16.0, None: None}[model],
        )
        for i in range(draw(st.integers(0, 2)))
    ]
    pools = []
    markets = {}
    for i in range(draw(st.integers(1, 3))):
        model = draw(st.sampled_from(["A100-40GB", "V100"]))
        pool = _shaped_pool(
            f"p{i}", draw(st.sampled_from([1, 2, 4])), model, 40.0 if "A100" in model else 16.0
        )
        pools.append(pool)
        cut = float(draw(st.integers(1, int(horizon) - 1)))
        levels = [0.5, 1.0, 2.0, 4.0]
        price = StepSeries(
            [0.0, cut], [draw(st.sampled_from(levels)) * pool.gpus_per_instance for _ in range(2)]
        )
        availability = None
        if draw(st.booleans()):
            gap = sorted({float(draw(st.integers(1, int(horizon) - 1))) for _ in range(2)})
            values = [1.0, 0.0, 1.0][: len(gap) + 1]
            availability = AvailabilityTrace("a", 1, StepSeries([0.0, *gap], values))
        markets[pool.name] = PoolMarketModel(price, availability=availability)
    jobs: list[ShapeJob] = []
    budget = 4  # job-nodes in all, so that the placements can be enumerated
    for _ in range(draw(st.integers(1, 3))):
        nodes = draw(st.integers(1, 2)) if budget >= 2 else 1
        if budget < nodes:
            break
        budget -= nodes
        per_node = draw(st.sampled_from([1, 2, 4, 8]))
        jobs.append(
            ShapeJob(
                float(draw(st.integers(0, int(horizon) - 1))),
                float(draw(st.integers(1, 8))),
                per_node * nodes,
                nodes,
                draw(st.sampled_from([(), ("a100",), ("v100",), ("a100", "v100")])),
                draw(st.sampled_from([None, None, 32.0])),
            )
        )
    return {
        "jobs": jobs,
        "onprem": onprem,
        "pools": pools,
        "markets": markets,
        "horizon": horizon,
        "max_wait": float(draw(st.integers(0, 3))),
        "bin_s": float(draw(st.sampled_from([1, 2, 3, 5]))),
    }


def _fleet_bound(
    case: dict[str, Any], block_bins: int | None = None
) -> tuple[BoundProblem, float | None]:
    problem = build_problem(
        case["jobs"], case["onprem"], case["pools"], case["markets"], case["horizon"]
    )
    result = bound(problem, case["max_wait"], case["bin_s"], block_bins=block_bins)
    assert result.status in {"optimal", "infeasible"}, result.status
    return problem, result.cost


SLOW = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SLOW
@given(fleets(), st.sampled_from([None, 1, 2]))
def test_class_bound_never_exceeds_a_discrete_schedule(
    case: dict[str, Any], block_bins: int | None
) -> None:
    best = discrete_brute_force(
        case["jobs"],
        case["onprem"],
        case["pools"],
        case["markets"],
        case["horizon"],
        case["max_wait"],
    )
    _, cost = _fleet_bound(case, block_bins)
    if cost is None:
        assert math.isinf(best), "the bound says infeasible but a schedule exists"
    else:
        assert cost <= best + 1e-6


@SLOW
@given(fleets())
def test_class_bound_is_at_least_the_cheapest_gpu_bound(case: dict[str, Any]) -> None:
    """Pricing each class at the shapes that can host it, and giving it only the on-prem nodes it
    fits, can only raise the bound over one price and one pool of on-prem GPUs for all."""
    problem, cost = _fleet_bound(case, block_bins=1)
    if problem.excluded_jobs:
        return
    price = cheapest_gpu_price(case["markets"], case["pools"], case["horizon"])
    everyone = [BoundJob(j.submit, j.duration, j.gpus) for j in case["jobs"]]
    onprem = sum(k.gpus * k.count for k in case["onprem"])
    old = lower_bound(
        everyone, onprem, price, case["horizon"], case["max_wait"], case["bin_s"], block_bins=1
    )
    if old.cost is None:
        assert cost is None
    elif cost is not None:
        assert cost >= old.cost - 1e-6


def _flat_market(price: float) -> PoolMarketModel:
    return PoolMarketModel(StepSeries([0.0], [price]))


def test_whole_node_jobs_pay_for_the_cheapest_shape_that_hosts_them() -> None:
    pools = [_shaped_pool("v1", 1, "V100", 16.0), _shaped_pool("v8", 8, "V100", 16.0)]
    markets = {"v1": _flat_market(1.0), "v8": _flat_market(12.0)}
    jobs = [ShapeJob(0.0, 3600.0, 8), ShapeJob(0.0, 3600.0, 16, nodes=2)]
    problem = build_problem(jobs, [], pools, markets, 7200.0)
    result = bound(problem, 0.0, 300.0)
    # 24 GPU-hours at the 8-GPU shape's $1.50 per GPU-hour, not the 1-GPU shape's $1.
    assert result.cost == pytest.approx(36.0)
    old = lower_bound(
        [BoundJob(j.submit, j.duration, j.gpus) for j in jobs],
        0,
        cheapest_gpu_price(markets, pools, 7200.0),
        7200.0,
        0.0,
        300.0,
    )
    assert old.cost == pytest.approx(24.0)
    waited = bound(problem, 600.0, 300.0)
    assert waited.cost == pytest.approx(36.0)


def test_jobs_nothing_can_host_are_excluded_and_counted() -> None:
    pools = [_shaped_pool("v8", 8, "V100", 16.0)]
    markets = {"v8": _flat_market(8.0)}
    onprem = [Kind("a", 8, "A100-80GB", 2, 80.0)]
    fits = [ShapeJob(0.0, 3600.0, 8, nodes=1), ShapeJob(0.0, 3600.0, 16, nodes=2)]
    never = [
        ShapeJob(0.0, 7200.0, 12),  # one node of 12 GPUs: no shape has 12
        ShapeJob(100.0, 3600.0, 1, gpu_models=("h100",)),  # no H100 anywhere
        ShapeJob(0.0, 1800.0, 1, min_gpu_memory_gib=96.0),  # no GPU has 96 GiB
    ]
    problem = build_problem([*fits, *never], onprem, pools, markets, 10_000.0)
    assert problem.excluded_jobs == 3
    assert problem.excluded_gpu_hours == pytest.approx(12 * 2 + 1 * 1 + 1 * 0.5)
    alone = build_problem(fits, onprem, pools, markets, 10_000.0)
    for wait in (0.0, 600.0):
        with_them = bound(problem, wait, 300.0)
        assert with_them.excluded_jobs == 3
        assert with_them.excluded_gpu_hours == pytest.approx(25.5)
        assert with_them.cost == pytest.approx(bound(alone, wait, 300.0).cost)
    # 24 GPUs of 8-GPU nodes for an hour, 16 of them on-prem: 8 GPU-hours at $1.
    assert bound(problem, 0.0, 300.0).cost == pytest.approx(8.0)


def test_gangs_use_onprem_only_where_enough_nodes_fit_them() -> None:
    pools = [_shaped_pool("a8", 8, "A100-40GB", 40.0)]
    markets = {"a8": _flat_market(16.0)}
    gang = [ShapeJob(0.0, 3600.0, 16, nodes=2)]
    # One 8-GPU on-prem node cannot hold a gang of two: it buys both nodes ($2 per GPU-hour).
    lonely = build_problem(gang, [Kind("a", 8, "A100-80GB", 1, 80.0)], pools, markets, 7200.0)
    assert bound(lonely, 0.0, 300.0).cost == pytest.approx(32.0)
    # Two can, and then nothing is bought.
    pair = build_problem(gang, [Kind("a", 8, "A100-80GB", 2, 80.0)], pools, markets, 7200.0)
    assert bound(pair, 0.0, 300.0).cost == pytest.approx(0.0)
    assert bound(pair, 600.0, 300.0).cost == pytest.approx(0.0)
    # A gang of four that no pool may launch at once and too few on-prem nodes can hold never
    # runs: it is left out, as the report's unhostable count leaves it out.
    capped = [
        Pool(
            name="a8",
            provider="aws",
            region="r",
            instance_type="a8",
            gpus_per_instance=8,
            gpu_model="A100-40GB",
            gpu_memory_gib=40.0,
            market="spot",
            max_instances=2,
        )
    ]
    four = [ShapeJob(0.0, 3600.0, 32, nodes=4), *gang]
    problem = build_problem(four, [Kind("a", 8, "A100-80GB", 2, 80.0)], capped, markets, 7200.0)
    assert problem.excluded_jobs == 1
    assert problem.excluded_gpu_hours == pytest.approx(32.0)
    assert bound(problem, 0.0, 300.0).cost == pytest.approx(0.0)


def test_onprem_memory_comes_from_the_model_name_when_not_given() -> None:
    """As the simulator's on-prem nodes take it: an A100-SXM4-80GB node has 80 GiB GPUs."""
    spec = OnPremNodeSpec(name="a", gpus=8, gpu_model="A100-SXM4-80GB", count=1)
    pools = [_shaped_pool("a1", 1, "A100-40GB", 40.0)]
    job = ShapeJob(0.0, 3600.0, 1, min_gpu_memory_gib=80.0)
    problem = build_problem([job], [spec], pools, {"a1": _flat_market(3.0)}, 7200.0)
    assert problem.excluded_jobs == 0
    assert bound(problem, 0.0, 300.0).cost == pytest.approx(0.0)


def test_jobs_whose_only_pools_are_never_on_offer_are_excluded() -> None:
    pools = [_shaped_pool("v1", 1, "V100", 16.0)]
    gone = AvailabilityTrace("t", 1, StepSeries([0.0], [0.0]))
    markets = {"v1": PoolMarketModel(StepSeries([0.0], [1.0]), availability=gone)}
    problem = build_problem([ShapeJob(0.0, 3600.0, 1)], [], pools, markets, 7200.0)
    assert problem.excluded_jobs == 1 and not problem.classes
    assert bound(problem, 600.0, 300.0).cost == 0.0


def test_pinned_jobs_cannot_use_onprem_nodes_of_another_model() -> None:
    pools = [_shaped_pool("v2", 2, "V100", 16.0), _shaped_pool("a2", 2, "A100-40GB", 40.0)]
    markets = {"v2": _flat_market(2.0), "a2": _flat_market(6.0)}
    onprem = [Kind("a", 4, "A100-80GB", 1, 80.0)]
    jobs = [ShapeJob(0.0, 3600.0, 1, gpu_models=("v100",)), ShapeJob(0.0, 3600.0, 2)]
    problem = build_problem(jobs, onprem, pools, markets, 3600.0)
    # The V100 job pays $1 although 2 on-prem A100 GPUs sit idle; the other fits on-prem.
    assert bound(problem, 0.0, 300.0).cost == pytest.approx(1.0)
    # Needing 80 GiB, a job fits only the on-prem A100s: on-prem goes to it, and the 2-GPU job
    # pays for the cheapest GPUs that can host it.
    big = [ShapeJob(0.0, 3600.0, 4, min_gpu_memory_gib=80.0), ShapeJob(0.0, 3600.0, 2)]
    problem = build_problem(big, onprem, pools, markets, 3600.0)
    assert problem.excluded_jobs == 0
    assert len(problem.classes) == 2
    assert bound(problem, 0.0, 300.0).cost == pytest.approx(2.0)
    # With 600 s of wait each job must have done 3,000 s of its work by the horizon: the big one
    # leaves 4 × 3,600 − 4 × 3,000 = 2,400 GPU-s of on-prem to the small one, which needs 6,000:
    # 3,600 GPU-s are bought at $1 per GPU-hour.
    assert bound(problem, 600.0, 300.0).cost == pytest.approx(1.0, rel=1e-9)


def test_shared_onprem_groups_go_to_the_dearest_class_that_fits() -> None:
    """Two on-prem kinds shared by three classes: the allocation LP, not a greedy per class."""
    pools = [_shaped_pool("v2", 2, "V100", 16.0), _shaped_pool("a2", 2, "A100-40GB", 40.0)]
    markets = {"v2": _flat_market(2.0), "a2": _flat_market(8.0)}
    onprem = [Kind("a", 2, "A100-80GB", 1, 80.0), Kind("v", 2, "V100", 1, 16.0)]
    jobs = [
        ShapeJob(0.0, 3600.0, 2, gpu_models=("a100",)),  # $4, fits the A100s
        ShapeJob(0.0, 3600.0, 2),  # $1 anywhere, fits either kind
        ShapeJob(0.0, 3600.0, 2, gpu_models=("v100",)),  # $1, fits the V100s only
    ]
    problem = build_problem(jobs, onprem, pools, markets, 7200.0)
    assert len(problem.onprem_gpus) == 2
    # The A100 job takes the A100s, one $1 job the V100s, the other pays 2 GPU-hours.
    assert bound(problem, 0.0, 300.0).cost == pytest.approx(2.0)
    # With 600 s of wait the pinned jobs each free their GPUs for 600 s, one after the other,
    # and the $1 job runs there 1,200 s: it buys 2 GPUs for the other 2,400 s.
    assert bound(problem, 600.0, 300.0).cost == pytest.approx(4 / 3)
