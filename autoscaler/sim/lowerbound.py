"""The offline lower bound of the cost report: what no schedule of the trace can beat.

The bound is the cheapest *fluid* schedule that starts every job's work within a maximum wait W of
its submission, with free on-prem GPUs, cloud GPUs at the cheapest price on offer at each moment
and no boot delay, interruption or packing waste. Every real replay that keeps each job's total
pending time within W costs at least this much, so a policy's cost divided by the bound says how
much room is left. docs/lower-bound.md states the formulation and why each step keeps it a lower
bound; the code follows that page's notation (jobs j, bins k, pause p, load row, deadline row).
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from scipy import sparse
from scipy.optimize import linprog

from autoscaler.model import Pool
from autoscaler.report.model import LowerBoundResult
from autoscaler.sim.cloud import PoolMarketModel
from autoscaler.sim.engine import Prepared
from autoscaler.sim.series import StepSeries

HOUR = 3600.0
CLOSED_FORM = "closed form"
LINEAR_PROGRAM = "linear program (HiGHS)"

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

# linprog's status codes, in the words the report prints.
_STATUS = {
    0: "optimal",
    1: "iteration limit reached",
    2: "infeasible",
    3: "unbounded",
    4: "numerical difficulties",
}


@dataclass(frozen=True)
class BoundJob:
    submit_s: float
    duration_s: float
    gpus: int


def cheapest_gpu_price(
    markets: Mapping[str, PoolMarketModel], pools: Sequence[Pool], horizon_s: float
) -> StepSeries:
    """$ per GPU-hour of the cheapest pool on offer at each moment of [0, horizon].

    A pool counts only while its availability trace gives it capacity; how much capacity does not
    matter, because the bound may buy any amount at the cheapest price (a relaxation). ``inf``
    where nothing is on offer, so the bound knows the cloud cannot be used then.
    """
    changes = {0.0}
    for pool in pools:
        market = markets[pool.name]
        followers = [market.price.next_change]
        if market.availability is not None:
            followers.append(market.availability.next_change)
        for follow in followers:
            changes.update(_changes(follow, horizon_s))
    times: list[float] = []
    values: list[float] = []
    for t in sorted(changes):
        value = min(
            (
                markets[pool.name].price.at(t) / pool.gpus_per_instance
                for pool in pools
                if markets[pool.name].capacity(t) > 0
            ),
            default=math.inf,
        )
        if not values or values[-1] != value:
            times.append(t)
            values.append(value)
    return StepSeries(times, values)


def _changes(follow: Callable[[float], float], horizon_s: float) -> list[float]:
    """The change points in (0, horizon) of a series given by its ``next_change``.

    A looping series computes its next change with ``divmod``, which can round back onto the
    moment it was asked about; stepping past it keeps the walk from stalling there.
    """
    found: list[float] = []
    t = 0.0
    while True:
        following = follow(t)
        probe = t
        while following <= t:
            probe = max(math.nextafter(probe, math.inf), probe + 1e-9 * abs(probe))
            following = follow(probe)
        if following >= horizon_s:
            return found
        found.append(following)
        t = following


def _bin_edges(horizon_s: float, bin_s: float) -> FloatArray:
    """Edges 0, Δ, 2Δ, ..., T; the last bin is shorter when Δ does not divide T, never empty."""
    count = max(1, math.ceil(horizon_s / bin_s - 1e-9))
    edges = np.minimum(np.arange(count + 1, dtype=np.float64) * bin_s, horizon_s)
    edges[-1] = horizon_s
    return edges


def _expand(
    edges: FloatArray, start: FloatArray, end: FloatArray
) -> tuple[IntArray, IntArray, FloatArray]:
    """Every (interval, bin) pair that overlaps, with the overlap in seconds.

    Vectorised with ``np.repeat`` because a long job spans thousands of bins and the demo has
    thousands of jobs: Python loops over job-bins would dominate the solve time.
    """
    first = np.searchsorted(edges, start, side="right") - 1
    last = np.searchsorted(edges, end, side="left") - 1
    nbins = len(edges) - 1
    first = np.clip(first, 0, nbins - 1)
    last = np.clip(last, first, nbins - 1)
    counts = last - first + 1
    owner = np.repeat(np.arange(len(start)), counts)
    offsets = np.cumsum(counts) - counts
    position = np.arange(int(counts.sum())) - np.repeat(offsets, counts)
    k = first[owner] + position
    overlap = np.minimum(edges[k + 1], end[owner]) - np.maximum(edges[k], start[owner])
    return owner.astype(np.int64), k.astype(np.int64), np.maximum(overlap, 0.0)


def _job_arrays(jobs: Sequence[BoundJob]) -> tuple[FloatArray, FloatArray, FloatArray]:
    submit = np.array([j.submit_s for j in jobs], dtype=np.float64)
    duration = np.array([j.duration_s for j in jobs], dtype=np.float64)
    gpus = np.array([j.gpus for j in jobs], dtype=np.float64)
    return submit, duration, gpus


def _bin_prices(price: StepSeries, edges: FloatArray) -> FloatArray:
    """Each bin's lowest price: paying it for the bin's whole purchase never overstates cost."""
    return np.array(
        [price.minimum(float(s), float(e)) for s, e in itertools.pairwise(edges)],
        dtype=np.float64,
    )


def _closed_form(
    jobs: Sequence[BoundJob], onprem_gpus: int, price: StepSeries, horizon_s: float, bin_s: float
) -> tuple[float | None, str]:
    """W = 0 fixes every job's occupancy, so only the per-bin excess over on-prem is left."""
    edges = _bin_edges(horizon_s, bin_s)
    widths = np.diff(edges)
    submit, duration, gpus = _job_arrays(jobs)
    start = np.maximum(submit, 0.0)
    end = np.minimum(submit + duration, horizon_s)
    keep = end > start
    owner, k, overlap = _expand(edges, start[keep], end[keep])
    energy = np.bincount(k, weights=gpus[keep][owner] * overlap, minlength=len(widths))
    excess = np.maximum(energy - onprem_gpus * widths, 0.0) / HOUR
    prices = _bin_prices(price, edges)
    bought = excess > 1e-12
    if np.any(np.isinf(prices[bought])):
        return None, "infeasible"
    return float(np.sum(prices[bought] * excess[bought])), "optimal"


def _linear_program(
    jobs: Sequence[BoundJob],
    onprem_gpus: int,
    price: StepSeries,
    horizon_s: float,
    max_wait_s: float,
    bin_s: float,
) -> tuple[float | None, str]:
    """The LP of docs/lower-bound.md in its pause form, reduced without changing its optimum.

    Units are GPU-hours so that the coefficients HiGHS sees are of order one.
    """
    edges = _bin_edges(horizon_s, bin_s)
    widths = np.diff(edges)
    nbins = len(widths)
    submit, duration, gpus = _job_arrays(jobs)
    start = np.maximum(submit, 0.0)
    end = np.minimum(submit + max_wait_s + duration, horizon_s)
    keep = end > start
    submit, duration, gpus = submit[keep], duration[keep], gpus[keep]
    start, end = start[keep], end[keep]
    owner, k, _ = _expand(edges, start, end)
    if len(k) == 0:
        return 0.0, "optimal"
    g = gpus[owner]
    # A bin's cap runs to its end even past the window's end: the formulation's |bin ∩ [a, T]|.
    cap = g * (edges[k + 1] - np.maximum(edges[k], submit[owner])) / HOUR
    t_end = edges[k + 1]
    since = t_end - submit[owner]
    # Deadline row at edge t_k: the pause P_k = g(t_k - a) - O_j(t_k) may be at most
    # R_k = g(t_k - a) - L_j(t_k), written by cases so the middle stretch is exactly g·W.
    dur = duration[owner]
    allowed = (
        g
        * np.where(
            since <= max_wait_s,
            since,
            np.where(since <= max_wait_s + dur, max_wait_s, since - dur),
        )
        / HOUR
    )
    # The caps of a job's bins telescope, so their running sum needs no cumsum (and no
    # cancellation between jobs).
    capped = g * (t_end - start[owner]) / HOUR
    counts = np.bincount(owner, minlength=len(gpus))
    job_start = np.cumsum(counts) - counts
    tol = 1e-10 * max(1.0, float(np.max(gpus)) * horizon_s / HOUR)
    is_last = np.append(owner[1:] != owner[:-1], True)
    next_allowed = np.append(allowed[1:], np.inf)
    # A row is kept only if the caps do not already imply it and no later row of the same job
    # implies it (pauses only accumulate and R never decreases along a job's bins).
    binding = (allowed < capped - tol) & (is_last | (next_allowed > allowed + tol))
    row_entry = np.flatnonzero(binding)
    # Past a job's last deadline row nothing forces it to run, so it rests there (p = cap).
    last_row = np.full(len(gpus), -1, dtype=np.int64)
    last_row[owner[row_entry]] = row_entry
    live = np.arange(len(k)) <= last_row[owner]
    energy = np.bincount(k[live], weights=cap[live], minlength=nbins)
    onprem = onprem_gpus * widths / HOUR
    prices = _bin_prices(price, edges)
    # Only bins whose full-rate load exceeds on-prem, at a positive price, are worth a pause:
    # elsewhere c_k = 0 (or is free), so fixing those pauses to 0 keeps the optimum.
    hot = (energy > onprem + 1e-12) & (prices > 0)
    hot_index = np.full(nbins, -1, dtype=np.int64)
    hot_bins = np.flatnonzero(hot)
    hot_index[hot_bins] = np.arange(len(hot_bins))
    is_var = live & hot[k]
    var_of_entry = np.full(len(k), -1, dtype=np.int64)
    var_entries = np.flatnonzero(is_var)
    n_pause = len(var_entries)
    var_of_entry[var_entries] = np.arange(n_pause)
    n_hot = len(hot_bins)
    if n_hot == 0:
        return 0.0, "optimal"

    # Deadline rows: row r (entry m of job j) sums job j's pauses at entries job_start[j]..m.
    row_len = row_entry - job_start[owner[row_entry]] + 1
    row_of = np.repeat(np.arange(len(row_entry)), row_len)
    row_offsets = np.cumsum(row_len) - row_len
    member = job_start[owner[row_entry]][row_of] + (
        np.arange(int(row_len.sum())) - np.repeat(row_offsets, row_len)
    )
    member_var = var_of_entry[member]
    used = member_var >= 0
    deadline_rows = row_of[used]
    deadline_cols = member_var[used]
    deadline_rhs = allowed[row_entry]

    # Load rows: -Σ_j p_jk - c_k <= H|bin k| - E_k for each hot bin.
    n_deadline = len(row_entry)
    load_rows = n_deadline + hot_index[k[var_entries]]
    rows = np.concatenate((deadline_rows, load_rows, n_deadline + np.arange(n_hot)))
    cols = np.concatenate((deadline_cols, np.arange(n_pause), n_pause + np.arange(n_hot)))
    data = np.concatenate(
        (np.ones(len(deadline_rows)), -np.ones(n_pause), -np.ones(n_hot)),
    )
    matrix = sparse.csr_array((data, (rows, cols)), shape=(n_deadline + n_hot, n_pause + n_hot))
    rhs = np.concatenate((deadline_rhs, onprem[hot_bins] - energy[hot_bins]))
    hot_prices = prices[hot_bins]
    closed = np.isinf(hot_prices)
    objective = np.concatenate((np.zeros(n_pause), np.where(closed, 0.0, hot_prices)))
    upper = np.concatenate((cap[var_entries], np.where(closed, 0.0, np.inf)))
    bounds = np.column_stack((np.zeros(n_pause + n_hot), upper))
    result = linprog(objective, A_ub=matrix, b_ub=rhs, bounds=bounds, method="highs")
    status = _STATUS.get(int(result.status), f"HiGHS status {result.status}")
    if result.status != 0:
        return None, status
    return max(float(result.fun), 0.0), status


def lower_bound(
    jobs: Sequence[BoundJob],
    onprem_gpus: int,
    price: StepSeries,
    horizon_s: float,
    max_wait_s: float,
    bin_s: float,
) -> LowerBoundResult:
    """The bound for one maximum wait: closed form at W = 0, the LP otherwise."""
    started = time.perf_counter()
    if max_wait_s <= 0:
        cost, status = _closed_form(jobs, onprem_gpus, price, horizon_s, bin_s)
        method = CLOSED_FORM
    else:
        cost, status = _linear_program(jobs, onprem_gpus, price, horizon_s, max_wait_s, bin_s)
        method = LINEAR_PROGRAM
    return LowerBoundResult(
        max_wait_s=max_wait_s,
        cost=cost,
        method=method,
        bin_s=bin_s,
        status=status,
        solve_s=time.perf_counter() - started,
    )


def compute_lower_bounds(prepared: Prepared) -> list[LowerBoundResult]:
    """The bounds the report shows: no wait at all, and the scenario's wait target."""
    scenario = prepared.loaded.scenario
    horizon = prepared.horizon_s
    jobs = [BoundJob(j.submit, j.duration, j.gpus) for j in prepared.selection.jobs]
    onprem = sum(node.gpus * node.count for node in scenario.onprem)
    price = cheapest_gpu_price(prepared.markets, scenario.controller.pools, horizon)
    bin_s = scenario.lower_bound.bin_seconds
    waits = [0.0]
    if scenario.wait_target_s > 0:
        waits.append(scenario.wait_target_s)
    return [lower_bound(jobs, onprem, price, horizon, w, bin_s) for w in waits]
