"""The numbers of the lower bound: per-bin loads, the bins where money is at stake, the closed form
and the linear program, in the notation of docs/lower-bound.md (jobs j, classes c, on-prem groups
m, bins k, blocks b, pauses p).

Everything is built with numpy from per-job numbers in O(jobs + classes × bins) memory; only the
pause variables of the LP grow with job-bins, and ``max_pause_variables`` caps them by pooling the
pauses of long jobs within blocks of bins (a relaxation, so still a bound).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt
from scipy import sparse
from scipy.optimize import linprog

from autoscaler.sim.lowerbound_classes import BoundProblem
from autoscaler.sim.series import StepSeries

HOUR = 3600.0
CLOSED_FORM = "closed form"
LINEAR_PROGRAM = "linear program (HiGHS)"
POOLED = "pooled linear program (HiGHS) + exact dual"
# Above this many pause variables the LP pools long jobs' pauses within blocks of bins.
DEFAULT_MAX_PAUSE_VARIABLES = 100_000
BLOCK_CHOICES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 36, 48, 72, 96, 144, 288, 576, 1152, 2304)
# Beyond this many on-prem groups the hot-bin test (2^groups subsets) is skipped: every bin with
# priced load is then treated as hot, which keeps the optimum and only grows the LP.
MAX_HALL_GROUPS = 10

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]

# linprog's status codes, in the words the report prints.
_STATUS = {
    0: "optimal",
    1: "iteration limit reached",
    2: "infeasible",
    3: "unbounded",
    4: "numerical difficulties",
}


@dataclass(frozen=True)
class Solution:
    """A bound and how it was reached. ``lp_cost`` is the optimum of the closed form or the LP
    (the pooled one where ``block_bins`` > 1) and ``dual_cost`` the exact dual function at its
    dual prices, where computed; ``cost`` is the larger, both being bounds.

    ``spend_by_bin`` is what the schedule behind ``lp_cost`` buys in each bin: it adds up to
    ``lp_cost``, not to a dual that raised ``cost`` above it, and it is one cheapest schedule
    among possibly many, not a bound at every moment. Empty where there is no solution."""

    cost: float | None
    status: str
    method: str
    block_bins: int
    variables: int
    lp_cost: float | None = None
    dual_cost: float | None = None
    spend_by_bin: FloatArray = field(default_factory=lambda: np.zeros(0))


def bin_edges(horizon_s: float, bin_s: float) -> FloatArray:
    """Edges 0, Δ, 2Δ, ..., T; the last bin is shorter when Δ does not divide T, never empty."""
    count = max(1, math.ceil(horizon_s / bin_s - 1e-9))
    edges = np.minimum(np.arange(count + 1, dtype=np.float64) * bin_s, horizon_s)
    edges[-1] = horizon_s
    return edges


def bin_minimum(price: StepSeries, edges: FloatArray) -> FloatArray:
    """Each bin's lowest price: paying it for the bin's whole purchase never overstates cost."""
    if price.period is not None:
        return np.array(
            [price.minimum(float(s), float(e)) for s, e in itertools.pairwise(edges)],
            dtype=np.float64,
        )
    times = np.asarray(price.times, dtype=np.float64)
    values = np.asarray(price.values, dtype=np.float64)
    starts, ends = edges[:-1], edges[1:]
    result = values[np.maximum(np.searchsorted(times, starts, side="right") - 1, 0)]
    # Changes strictly inside bin i are values[first_i:last_i]; the ranges never overlap and
    # never go backwards, so one reduceat over (first, last) pairs takes every bin's minimum.
    first = np.searchsorted(times, starts, side="right")
    last = np.searchsorted(times, ends, side="left")
    inside = last > first
    if np.any(inside):
        padded = np.append(values, math.inf)
        pairs = np.empty(2 * len(first), dtype=np.int64)
        pairs[0::2] = first
        pairs[1::2] = last
        lows = np.minimum.reduceat(padded, pairs)[0::2]
        result = np.where(inside, np.minimum(result, lows), result)
    return result


def class_energy(
    edges: FloatArray,
    start: FloatArray,
    end: FloatArray,
    gpus: FloatArray,
    cls: IntArray,
    classes: int,
) -> FloatArray:
    """GPU-seconds each class occupies in each bin when job j runs at g_j over [start_j, end_j].

    Partial first and last bins are added per job and the full bins between them with a
    difference array, so memory stays O(jobs + classes × bins) whatever the durations.
    """
    nbins = len(edges) - 1
    out = np.zeros(classes * nbins, dtype=np.float64)
    keep = end > start
    if not np.any(keep):
        return out.reshape(classes, nbins)
    s, e, g, c = start[keep], end[keep], gpus[keep], cls[keep]
    ks = np.clip(np.searchsorted(edges, s, side="right") - 1, 0, nbins - 1)
    ke = np.clip(np.searchsorted(edges, e, side="left") - 1, ks, nbins - 1)
    same = ks == ke
    base = c * nbins
    out += np.bincount(
        base[same] + ks[same], weights=g[same] * (e[same] - s[same]), minlength=out.size
    )
    d = ~same
    out += np.bincount(
        base[d] + ks[d], weights=g[d] * (edges[ks[d] + 1] - s[d]), minlength=out.size
    )
    out += np.bincount(base[d] + ke[d], weights=g[d] * (e[d] - edges[ke[d]]), minlength=out.size)
    # Full bins ks+1 .. ke-1: +g at ks+1, -g at ke, per class.
    rate = np.zeros(classes * (nbins + 1), dtype=np.float64)
    stride = nbins + 1
    rate += np.bincount(c[d] * stride + ks[d] + 1, weights=g[d], minlength=rate.size)
    rate -= np.bincount(c[d] * stride + ke[d], weights=g[d], minlength=rate.size)
    running = np.cumsum(rate.reshape(classes, stride), axis=1)[:, :nbins]
    widths = np.diff(edges)
    return out.reshape(classes, nbins) + running * widths


def _neighbour_masks(problem: BoundProblem) -> list[int]:
    return [sum(1 << m for m in cl.onprem) for cl in problem.classes]


def hot_bins(
    energy: FloatArray, prices: FloatArray, problem: BoundProblem, widths: FloatArray
) -> BoolArray:
    """Bins whose priced load on-prem cannot serve at full rate: only there can money be spent.

    A bin is cold when the classes with a positive price can all be served by the on-prem groups
    they may use, which (Hall's theorem for a transportation problem) holds exactly when, for
    every set S of groups, the classes that may use only groups in S need at most S's GPUs.
    """
    priced = np.where(prices > 0, energy, 0.0)
    groups = len(problem.onprem_gpus)
    tol = 1e-9
    if groups > MAX_HALL_GROUPS:
        return np.asarray(np.any(priced > tol, axis=0), dtype=bool)
    masks = _neighbour_masks(problem)
    hot = np.zeros(energy.shape[1], dtype=bool)
    for subset in range(1 << groups):
        inside = [c for c, mask in enumerate(masks) if mask & ~subset == 0]
        if not inside:
            continue
        need = priced[inside].sum(axis=0)
        have = sum(problem.onprem_gpus[m] for m in range(groups) if subset >> m & 1) * widths
        hot |= need > have + tol
    return hot


def closed_form(
    energy: FloatArray, prices: FloatArray, problem: BoundProblem, widths: FloatArray
) -> tuple[float | None, str, FloatArray]:
    """W = 0 with at most one on-prem group: in each bin on-prem goes to the dearest classes first.

    With a single shared resource and linear costs this greedy allocation is optimal (a
    fractional knapsack per bin), so no solver is needed. Also returns what it buys in each bin.
    """
    usable = np.array([0 in cl.onprem for cl in problem.classes], dtype=bool)
    onprem = (problem.onprem_gpus[0] if problem.onprem_gpus else 0.0) * widths / HOUR
    hours = energy / HOUR
    rank = np.where(usable[:, None], prices, -1.0)
    order = np.argsort(-rank, axis=0, kind="stable")
    sorted_load = np.take_along_axis(hours * usable[:, None], order, axis=0)
    before = np.cumsum(sorted_load, axis=0) - sorted_load
    covered_sorted = np.clip(onprem[None, :] - before, 0.0, sorted_load)
    covered = np.empty_like(covered_sorted)
    np.put_along_axis(covered, order, covered_sorted, axis=0)
    excess = hours - covered
    bought = excess > 1e-12
    if np.any(np.isinf(prices[bought])):
        return None, "infeasible", np.zeros(0)
    # Zero first, then multiply: a closed cell (price inf) with nothing bought spends 0, not nan.
    spend = (np.where(bought, prices, 0.0) * np.where(bought, excess, 0.0)).sum(axis=0)
    return float(np.sum(prices[bought] * excess[bought])), "optimal", spend


@dataclass(frozen=True)
class _Windows:
    """Per job: where its bins run and which of its deadline rows bind (see the docs' step 2)."""

    start: FloatArray
    gpus: FloatArray
    cls: IntArray
    k0: IntArray
    ke: IntArray
    row_m: BoolArray
    r_m: FloatArray
    r_e: FloatArray


def _windows(problem: BoundProblem, edges: FloatArray, max_wait_s: float) -> _Windows:
    """Jobs that must work inside the horizon, with their two possible deadline rows.

    Row e bounds all the job's pauses up to the end of its window's last bin k_e by
    R(t) = g(t − a) − L(t); row m, at the edge before it, carries the plateau g·W whenever the
    window ends inside bin k_e. Other rows are implied (pauses accumulate, R never falls). A job
    with no binding row may rest throughout and drops out.
    """
    horizon = problem.horizon_s
    nbins = len(edges) - 1
    a, d, g = problem.submit, problem.duration, problem.gpus
    start = np.maximum(a, 0.0)
    wend = a + max_wait_s + d
    end = np.minimum(wend, horizon)
    keep = (end > start) & (g > 0)
    a, d, g, start, wend, end = a[keep], d[keep], g[keep], start[keep], wend[keep], end[keep]
    cls = problem.cls[keep]
    k0 = np.clip(np.searchsorted(edges, start, side="right") - 1, 0, nbins - 1)
    ke = np.clip(np.searchsorted(edges, end, side="left") - 1, k0, nbins - 1)

    def allowed(t: FloatArray) -> FloatArray:
        since = t - a
        middle = np.where(since <= max_wait_s + d, max_wait_s, since - d)
        return g * np.where(since <= max_wait_s, since, middle) / HOUR

    tol = 1e-10 * max(1.0, float(np.max(g, initial=0.0)) * horizon / HOUR)
    t_e = edges[ke + 1]
    r_e = allowed(t_e)
    row_e = r_e < g * (t_e - start) / HOUR - tol
    t_m = edges[ke]
    r_m = allowed(t_m)
    row_m = (
        (t_e > wend)
        & (ke > k0)
        & (r_m < g * (t_m - start) / HOUR - tol)
        & (r_e > r_m + tol)
        & row_e
    )
    live = row_e
    return _Windows(
        start=start[live],
        gpus=g[live],
        cls=cls[live],
        k0=k0[live],
        ke=ke[live],
        row_m=row_m[live],
        r_m=r_m[live],
        r_e=r_e[live],
    )


def _expand_ranges(lo: IntArray, hi: IntArray) -> tuple[IntArray, IntArray]:
    """(owner, value) for every value in [lo_i, hi_i) of every range i, vectorised."""
    counts = np.maximum(hi - lo, 0)
    owner = np.repeat(np.arange(len(lo), dtype=np.int64), counts)
    offsets = np.cumsum(counts) - counts
    value = lo[owner] + np.arange(int(counts.sum()), dtype=np.int64) - offsets[owner]
    return owner, value


@dataclass(frozen=True)
class _Cells:
    """The (class, bin) pairs where money is at stake, numbered class-major, bins ascending."""

    active: BoolArray  # classes × bins
    cls: IntArray
    bin: IntArray
    prefix: IntArray  # classes × (bins + 1): active cells of the class before each bin
    offset: IntArray  # first cell of each class

    @classmethod
    def of(cls, active: BoolArray) -> _Cells:
        classes, bins = np.nonzero(active)
        counts = active.sum(axis=1)
        prefix = np.zeros((active.shape[0], active.shape[1] + 1), dtype=np.int64)
        prefix[:, 1:] = np.cumsum(active, axis=1)
        offset = np.cumsum(counts) - counts
        return cls(active, classes.astype(np.int64), bins.astype(np.int64), prefix, offset)


@dataclass(frozen=True)
class _Pauses:
    """The pause part of the LP, in local numbering: its columns (all ≥ 0, at most ``caps``),
    its own rows (job deadline rows, block link rows) and which load row each column relieves."""

    caps: FloatArray
    rows: IntArray
    cols: IntArray
    vals: FloatArray
    rhs: FloatArray
    relief_cell: IntArray
    relief_col: IntArray


def _exact_pauses(win: _Windows, cells: _Cells, edges: FloatArray, widths: FloatArray) -> _Pauses:
    """One pause variable per job and active cell of its window: the LP of the docs, exactly."""
    njobs = len(win.cls)
    lo = cells.offset[win.cls] + cells.prefix[win.cls, win.k0]
    hi = cells.offset[win.cls] + cells.prefix[win.cls, win.ke + 1]
    job, cell = _expand_ranges(lo, hi)
    k = cells.bin[cell]
    part = np.where(k == win.k0[job], edges[k + 1] - win.start[job], widths[k])
    caps = win.gpus[job] * part / HOUR
    cols = np.arange(len(cell), dtype=np.int64)
    row_m_id = np.full(njobs, -1, dtype=np.int64)
    row_m_id[win.row_m] = njobs + np.arange(int(win.row_m.sum()))
    in_m = (row_m_id[job] >= 0) & (k < win.ke[job])
    return _Pauses(
        caps=caps,
        rows=np.concatenate((job, row_m_id[job[in_m]])),
        cols=np.concatenate((cols, cols[in_m])),
        vals=np.ones(len(cols) + int(in_m.sum())),
        rhs=np.concatenate((win.r_e, win.r_m[win.row_m])),
        relief_cell=cell,
        relief_col=cols,
    )


@dataclass(frozen=True)
class _Merged:
    """Jobs merged by (class, first block, last block, row m): their constraints summed."""

    group: IntArray  # per job
    cls: IntArray  # per merged job
    last_block: IntArray
    row_m: BoolArray
    r_m: FloatArray
    r_e: FloatArray


def _sums(index: IntArray, weights: FloatArray, count: int) -> FloatArray:
    return np.bincount(index, weights=weights, minlength=count).astype(np.float64)


def _merge(win: _Windows, block: int, nblocks: int) -> _Merged:
    first = win.k0 // block
    last = win.ke // block
    flag = win.row_m & (last > first)
    key = ((win.cls * nblocks + first) * nblocks + last) * 2 + flag
    keys, group = np.unique(key, return_inverse=True)
    count = len(keys)
    return _Merged(
        group=group.astype(np.int64),
        cls=(keys // 2 // nblocks // nblocks).astype(np.int64),
        last_block=(keys // 2 % nblocks).astype(np.int64),
        row_m=(keys % 2).astype(bool),
        r_m=_sums(group, np.where(flag, win.r_m, 0.0), count),
        r_e=_sums(group, win.r_e, count),
    )


def _segments(
    win: _Windows,
    cells: _Cells,
    edges: FloatArray,
    widths: FloatArray,
    block: int,
    merged: _Merged,
    nblocks: int,
) -> tuple[IntArray, IntArray, FloatArray]:
    """(merged job, block, cap) of every block a merged job's window meets in an active cell."""
    owner, b = _expand_ranges(win.k0 // block, win.ke // block + 1)
    c = win.cls[owner]
    k0 = win.k0[owner]
    lo = np.maximum(k0, b * block)
    hi = np.minimum(win.ke[owner], b * block + block - 1)
    active_time = np.zeros((cells.active.shape[0], len(widths) + 1))
    active_time[:, 1:] = np.cumsum(cells.active * widths, axis=1)
    seconds = active_time[c, hi + 1] - active_time[c, lo]
    head = (lo == k0) & cells.active[c, k0]
    seconds -= np.where(head, win.start[owner] - edges[k0], 0.0)
    key = merged.group[owner] * nblocks + b
    keys, where = np.unique(key, return_inverse=True)
    caps = _sums(where, win.gpus[owner] * seconds / HOUR, len(keys))
    useful = caps > 1e-15
    keys = keys[useful]
    return (keys // nblocks).astype(np.int64), (keys % nblocks).astype(np.int64), caps[useful]


def _pooled_pauses(
    win: _Windows,
    cells: _Cells,
    load: FloatArray,
    edges: FloatArray,
    widths: FloatArray,
    block: int,
) -> _Pauses:
    """Pauses pooled per class within blocks of ``block`` bins (the docs' pooled LP).

    Per merged job one variable per block its window meets, capped by its active GPU-hours
    there; per class and active cell a pooled pause r ≤ E that relieves the load row; per class
    and block a link row Σ_k r_{c,k} ≤ Σ_j q_{j,b}. Each is a sum of the exact LP's constraints,
    so every exact solution maps onto a pooled one: a relaxation.
    """
    nblocks = -(-len(widths) // block)
    merged = _merge(win, block, nblocks)
    owner, b, caps = _segments(win, cells, edges, widths, block, merged, nblocks)
    njobs = len(merged.cls)
    nseg = len(owner)
    seg_cols = np.arange(nseg, dtype=np.int64)
    row_m_id = np.full(njobs, -1, dtype=np.int64)
    row_m_id[merged.row_m] = njobs + np.arange(int(merged.row_m.sum()))
    in_m = (row_m_id[owner] >= 0) & (b < merged.last_block[owner])
    nrows = njobs + int(merged.row_m.sum())
    # Pooled r per active cell, then the link rows per (class, block).
    r_cols = nseg + np.arange(len(cells.cls), dtype=np.int64)
    r_caps = load[cells.cls, cells.bin] / HOUR
    link_keys, link = np.unique(
        np.concatenate((merged.cls[owner] * nblocks + b, cells.cls * nblocks + cells.bin // block)),
        return_inverse=True,
    )
    link_row = nrows + link
    return _Pauses(
        caps=np.concatenate((caps, r_caps)),
        rows=np.concatenate((owner, row_m_id[owner[in_m]], link_row)),
        cols=np.concatenate((seg_cols, seg_cols[in_m], seg_cols, r_cols)),
        vals=np.concatenate(
            (np.ones(nseg + int(in_m.sum())), -np.ones(nseg), np.ones(len(r_cols)))
        ),
        rhs=np.concatenate((merged.r_e, merged.r_m[merged.row_m], np.zeros(len(link_keys)))),
        relief_cell=np.arange(len(cells.cls), dtype=np.int64),
        relief_col=r_cols,
    )


def _pooled_columns(win: _Windows, cells: _Cells, block: int) -> int:
    """How many columns the pooled pauses would have (a close upper estimate, without building):
    per merged job the blocks of its range where its class has an active cell, plus one pooled
    pause per active cell."""
    classes, nbins = cells.active.shape
    nblocks = -(-nbins // block)
    merged = _merge(win, block, nblocks)
    first = np.zeros(len(merged.cls), dtype=np.int64)
    first[merged.group] = win.k0 // block
    padded = np.zeros((classes, nblocks * block), dtype=bool)
    padded[:, :nbins] = cells.active
    busy = padded.reshape(classes, nblocks, block).any(axis=2)
    prefix = np.zeros((classes, nblocks + 1), dtype=np.int64)
    prefix[:, 1:] = np.cumsum(busy, axis=1)
    segments = prefix[merged.cls, merged.last_block + 1] - prefix[merged.cls, first]
    return int(segments.sum()) + len(cells.cls)


def choose_block(win: _Windows, cells: _Cells, max_pause_variables: int) -> int:
    """1 (every job exact) when it fits the budget, else the finest pooling that does."""
    exact = int(np.sum(cells.prefix[win.cls, win.ke + 1] - cells.prefix[win.cls, win.k0]))
    if exact <= max_pause_variables:
        return 1
    for block in BLOCK_CHOICES[1:]:
        if _pooled_columns(win, cells, block) <= max_pause_variables:
            return block
    return BLOCK_CHOICES[-1]


@dataclass(frozen=True)
class _LpResult:
    value: float | None
    status: str
    prices: FloatArray  # the load rows' dual prices λ per active cell ($ per GPU-hour)
    spend_by_bin: FloatArray  # what the optimum buys in each bin ($); empty without one


def _allocation_lp(
    problem: BoundProblem,
    cells: _Cells,
    load: FloatArray,
    prices: FloatArray,
    widths: FloatArray,
    pauses: _Pauses | None,
) -> _LpResult:
    """On-prem allocation o, cloud purchase x and (optionally) pauses, over the active cells.

    Load row per active cell: −Σ pauses − Σ_m o_{c,m,k} − x_{c,k} ≤ −E_{c,k}; group row per
    group and bin: Σ_c o_{c,m,k} ≤ H_m·|bin k|; cost Σ p_{c,k}·x_{c,k}.
    """
    nbins = len(widths)
    ncells = len(cells.cls)
    ngroups = len(problem.onprem_gpus)
    group_cap = np.array(problem.onprem_gpus, dtype=np.float64).reshape(ngroups)
    n_pause = len(pauses.caps) if pauses is not None else 0
    pause_rows = len(pauses.rhs) if pauses is not None else 0
    cell_price = prices[cells.cls, cells.bin]
    closed = np.isinf(cell_price)
    x = n_pause + np.arange(ncells, dtype=np.int64)
    o_cell = np.concatenate(
        [np.flatnonzero(cells.cls == c) for c, cl in enumerate(problem.classes) for _ in cl.onprem]
        or [np.zeros(0, dtype=np.int64)]
    ).astype(np.int64)
    o_group = np.concatenate(
        [
            np.full(int(np.sum(cells.cls == c)), g, dtype=np.int64)
            for c, cl in enumerate(problem.classes)
            for g in cl.onprem
        ]
        or [np.zeros(0, dtype=np.int64)]
    )
    o = n_pause + ncells + np.arange(len(o_cell), dtype=np.int64)
    load_row = pause_rows + np.arange(ncells, dtype=np.int64)
    gkeys, ginverse = np.unique(o_group * nbins + cells.bin[o_cell], return_inverse=True)
    group_row = pause_rows + ncells + ginverse
    rows = [load_row, load_row[o_cell], group_row]
    cols = [x, o, o]
    vals = [-np.ones(ncells), -np.ones(len(o)), np.ones(len(o))]
    if pauses is not None:
        rows += [pauses.rows, load_row[pauses.relief_cell]]
        cols += [pauses.cols, pauses.relief_col]
        vals += [pauses.vals, -np.ones(len(pauses.relief_col))]
    nrows = pause_rows + ncells + len(gkeys)
    nvars = n_pause + ncells + len(o)
    matrix = sparse.csr_array(
        (np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))), shape=(nrows, nvars)
    )
    del rows, cols, vals
    b_ub = np.concatenate(
        (
            pauses.rhs if pauses is not None else np.zeros(0),
            -load[cells.cls, cells.bin] / HOUR,
            group_cap[gkeys // nbins] * widths[gkeys % nbins] / HOUR,
        )
    )
    upper = np.concatenate(
        (
            pauses.caps if pauses is not None else np.zeros(0),
            np.where(closed, 0.0, np.inf),
            group_cap[o_group] * widths[cells.bin[o_cell]] / HOUR,
        )
    )
    objective = np.zeros(nvars)
    objective[x] = np.where(closed, 0.0, cell_price)
    bounds = np.column_stack((np.zeros(nvars), upper))
    result = linprog(objective, A_ub=matrix, b_ub=b_ub, bounds=bounds, method="highs")
    status = _STATUS.get(int(result.status), f"HiGHS status {result.status}")
    if result.status != 0:
        return _LpResult(None, status, np.zeros(ncells), np.zeros(0))
    duals = -np.asarray(result.ineqlin.marginals, dtype=np.float64)[load_row]
    # A purchase HiGHS leaves a hair below its bound of 0 is no refund.
    bought = np.maximum(np.asarray(result.x, dtype=np.float64)[x], 0.0)
    spend = np.bincount(
        cells.bin, weights=np.where(closed, 0.0, cell_price) * bought, minlength=nbins
    ).astype(np.float64)
    return _LpResult(max(float(result.fun), 0.0), status, duals, spend)


def _pause_value(win: _Windows, lam: FloatArray, edges: FloatArray, widths: FloatArray) -> float:
    """Σ_j max over job j's exact pause set of Σ_k λ_{c,k}·p_{j,k}, by the greedy.

    A job's pause set is a polymatroid (caps per bin, nested budgets R_m over bins before k_e and
    R_e over all), so taking bins in falling λ, each as far as the budgets allow, is optimal.
    Done in chunks of jobs so that memory stays bounded whatever the durations.
    """
    total = 0.0
    spans = win.ke - win.k0
    chunk = 1_000_000
    cumulative = np.cumsum(spans)
    cuts = np.searchsorted(cumulative, np.arange(chunk, int(spans.sum()), chunk), side="left")
    limits = np.unique(np.concatenate(([0], cuts, [len(spans)]))).tolist()
    for i0, i1 in itertools.pairwise(limits):
        sl = slice(i0, i1)
        c, k0, ke, g, start = win.cls[sl], win.k0[sl], win.ke[sl], win.gpus[sl], win.start[sl]
        r_m = np.where(win.row_m[sl], win.r_m[sl], np.inf)
        r_e = win.r_e[sl]
        n = i1 - i0
        lam_last = lam[c, ke]
        cap_last = g * np.where(ke == k0, edges[k0 + 1] - start, widths[ke]) / HOUR
        owner, k = _expand_ranges(k0, ke)
        value = lam[c[owner], k]
        positive = value > 0
        owner, k, value = owner[positive], k[positive], value[positive]
        part = np.where(k == k0[owner], edges[k + 1] - start[owner], widths[k])
        cap = g[owner] * part / HOUR
        higher = value > lam_last[owner]
        s_hi = np.bincount(owner[higher], weights=cap[higher], minlength=n)
        used_hi = np.minimum(s_hi, np.minimum(r_m, r_e))
        y = np.where(lam_last > 0, np.clip(r_e - used_hi, 0.0, cap_last), 0.0)
        budget = np.minimum(r_m, r_e - y)
        order = np.lexsort((-value, owner))
        owner, value, cap = owner[order], value[order], cap[order]
        before = np.cumsum(cap) - cap
        counts = np.bincount(owner, minlength=n)
        first = np.cumsum(counts) - counts
        base = np.zeros(n)
        has = counts > 0
        base[has] = before[first[has]]
        before = before - base[owner]
        take = np.clip(budget[owner] - before, 0.0, cap)
        total += float(np.sum(value * take)) + float(np.sum(lam_last * y))
    return total


def dual_bound(
    problem: BoundProblem,
    win: _Windows,
    cells: _Cells,
    load: FloatArray,
    prices: FloatArray,
    edges: FloatArray,
    cell_duals: FloatArray,
) -> float:
    """The exact LP's Lagrangian dual function at prices λ (load rows relaxed).

    D(λ) = Σ λ_{c,k}E_{c,k} − Σ_{m,k} H_m|k|·max_{c uses m} λ_{c,k} − Σ_j max_{p_j} λ·p_j for
    any 0 ≤ λ ≤ p (the class's bin price): by weak duality never above the exact LP's optimum,
    whatever λ is. With λ the duals of the pooled LP it is at least the pooled optimum, because
    each job's exact pause set lies inside the pooled one.
    """
    widths = np.diff(edges)
    lam = np.zeros_like(prices)
    cell_price = prices[cells.cls, cells.bin]
    lam[cells.cls, cells.bin] = np.clip(cell_duals, 0.0, cell_price)
    value = float(np.sum(lam[cells.cls, cells.bin] * load[cells.cls, cells.bin])) / HOUR
    for m, gpus in enumerate(problem.onprem_gpus):
        users = [c for c, cl in enumerate(problem.classes) if m in cl.onprem]
        if users:
            value -= float(np.sum(np.max(lam[users], axis=0) * gpus * widths)) / HOUR
    return value - _pause_value(win, lam, edges, widths)


def solve(
    problem: BoundProblem,
    max_wait_s: float,
    bin_s: float,
    max_pause_variables: int = DEFAULT_MAX_PAUSE_VARIABLES,
    block_bins: int | None = None,
    force_lp: bool = False,
    with_dual: bool = False,
) -> Solution:
    """The bound for one maximum wait W.

    W = 0 with at most one on-prem group: the closed form; W = 0 otherwise: the allocation LP.
    W > 0 (or ``force_lp``): the exact LP when its pause variables fit ``max_pause_variables``
    (or ``block_bins`` is 1), else the pooled LP and then the exact dual function at its dual
    prices. ``with_dual`` also evaluates the dual function after an exact LP (for the tests:
    by strong duality it must give the LP's optimum back).
    """
    edges = bin_edges(problem.horizon_s, bin_s)
    widths = np.diff(edges)
    nothing = np.zeros(len(widths))  # where no cell is at stake, nothing is bought anywhere
    nclasses = len(problem.classes)
    prices = np.array([bin_minimum(cl.price, edges) for cl in problem.classes]).reshape(
        nclasses, len(widths)
    )
    if max_wait_s <= 0 and not force_lp:
        start = np.maximum(problem.submit, 0.0)
        end = np.minimum(problem.submit + problem.duration, problem.horizon_s)
        load = class_energy(edges, start, end, problem.gpus, problem.cls, nclasses)
        if len(problem.onprem_gpus) <= 1:
            cost, status, spend = closed_form(load, prices, problem, widths)
            return Solution(cost, status, CLOSED_FORM, 1, 0, cost, spend_by_bin=spend)
        hot = hot_bins(load, prices, problem, widths)
        cells = _Cells.of(hot[None, :] & (load > 0) & (prices > 0))
        if len(cells.cls) == 0:
            return Solution(0.0, "optimal", LINEAR_PROGRAM, 1, 0, 0.0, spend_by_bin=nothing)
        result = _allocation_lp(problem, cells, load, prices, widths, None)
        return Solution(
            result.value,
            result.status,
            LINEAR_PROGRAM,
            1,
            0,
            result.value,
            spend_by_bin=result.spend_by_bin,
        )
    win = _windows(problem, edges, max(max_wait_s, 0.0))
    load = class_energy(edges, win.start, edges[win.ke + 1], win.gpus, win.cls, nclasses)
    active = hot_bins(load, prices, problem, widths)[None, :] & (load > 0) & (prices > 0)
    cells = _Cells.of(active)
    if len(cells.cls) == 0:
        return Solution(0.0, "optimal", LINEAR_PROGRAM, 1, 0, 0.0, 0.0, nothing)
    block = block_bins or choose_block(win, cells, max_pause_variables)
    if block == 1:
        pauses = _exact_pauses(win, cells, edges, widths)
        method = LINEAR_PROGRAM
    else:
        pauses = _pooled_pauses(win, cells, load, edges, widths, block)
        method = POOLED
    result = _allocation_lp(problem, cells, load, prices, widths, pauses)
    count = len(pauses.caps)
    if result.value is None:
        # The pooled LP is a relaxation: where it has no solution, neither has the exact one.
        return Solution(None, result.status, method, block, count)
    spend = result.spend_by_bin
    if block == 1 and not with_dual:
        return Solution(
            result.value, result.status, method, block, count, result.value, spend_by_bin=spend
        )
    dual = dual_bound(problem, win, cells, load, prices, edges, result.prices)
    return Solution(
        max(result.value, dual), result.status, method, block, count, result.value, dual, spend
    )
