"""The offline lower bound of the cost report: what no schedule of the trace can beat.

The bound is the cheapest *fluid* schedule that starts every job's work within a maximum wait W of
its submission, with free on-prem GPUs (each job only on the on-prem nodes its shape fits), cloud
GPUs at the cheapest per-GPU price among the pools that can host the job's node shape, and no
boot delay, interruption or packing waste. Every real replay that keeps each job's total pending
time within W costs at least this much, so a policy's cost divided by the bound says how much
room is left. docs/lower-bound.md states the formulation and why each step keeps it a lower bound.

The shape classes and prices live in ``lowerbound_classes``, the numbers in ``lowerbound_lp``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from autoscaler.model.progress import Progress, duration
from autoscaler.sim.engine import Prepared
from autoscaler.sim.lowerbound_classes import (
    BoundClass,
    BoundProblem,
    build_problem,
    cheapest_gpu_price,
)
from autoscaler.sim.lowerbound_lp import (
    CLOSED_FORM,
    DEFAULT_MAX_PAUSE_VARIABLES,
    HOUR,
    LINEAR_PROGRAM,
    bin_edges,
    solve,
)
from autoscaler.sim.lowerbound_result import LowerBoundResult
from autoscaler.sim.series import StepSeries

__all__ = [
    "CLOSED_FORM",
    "LINEAR_PROGRAM",
    "BoundClass",
    "BoundJob",
    "BoundProblem",
    "bound",
    "build_problem",
    "cheapest_gpu_price",
    "compute_lower_bounds",
    "lower_bound",
    "problem_of",
]


# The report samples its time series to at most this many points; a bound's accrual too.
MAX_ACCRUAL_POINTS = 1500


@dataclass(frozen=True)
class BoundJob:
    """One job as the bound sees it; ``cls`` indexes the problem's classes."""

    submit_s: float
    duration_s: float
    gpus: int
    cls: int = 0


def problem_of(
    jobs: Sequence[BoundJob],
    classes: Sequence[BoundClass],
    onprem_gpus: Sequence[float],
    horizon_s: float,
) -> BoundProblem:
    """A problem from explicit jobs and classes (tests, benchmarks, the single-price form)."""
    return BoundProblem(
        submit=np.array([j.submit_s for j in jobs], dtype=np.float64),
        duration=np.array([j.duration_s for j in jobs], dtype=np.float64),
        gpus=np.array([j.gpus for j in jobs], dtype=np.float64),
        cls=np.array([j.cls for j in jobs], dtype=np.int64),
        classes=tuple(classes),
        onprem_gpus=tuple(float(h) for h in onprem_gpus),
        horizon_s=horizon_s,
    )


def accrual(
    spend_by_bin: npt.NDArray[np.float64], edges: npt.NDArray[np.float64]
) -> tuple[list[float], list[float]]:
    """(hours, cumulative $) at the bins' ends, thinned to ``MAX_ACCRUAL_POINTS`` keeping the last
    bin, so the curve ends at the total. A cumulative sum of purchases never falls, and neither
    does any subset of its points or their rounding."""
    if len(spend_by_bin) == 0:
        return [], []
    hours = edges[1:] / HOUR
    spent = np.cumsum(spend_by_bin)
    step = max(1, math.ceil(len(hours) / MAX_ACCRUAL_POINTS))
    picked = np.arange(len(hours) - 1, -1, -step)[::-1]
    return (
        [round(float(h), 6) for h in hours[picked]],
        [round(float(c), 6) for c in spent[picked]],
    )


def bound(
    problem: BoundProblem,
    max_wait_s: float,
    bin_s: float,
    max_pause_variables: int = DEFAULT_MAX_PAUSE_VARIABLES,
    block_bins: int | None = None,
) -> LowerBoundResult:
    """The bound for one maximum wait, with what it left out, how it was solved and how one
    cheapest schedule the solver found spends over the window (``accrual_*``)."""
    started = time.perf_counter()
    solution = solve(problem, max_wait_s, bin_s, max_pause_variables, block_bins)
    hours, spent = accrual(solution.spend_by_bin, bin_edges(problem.horizon_s, bin_s))
    return LowerBoundResult(
        max_wait_s=max_wait_s,
        cost=solution.cost,
        method=solution.method,
        bin_s=bin_s,
        status=solution.status,
        solve_s=time.perf_counter() - started,
        excluded_jobs=problem.excluded_jobs,
        excluded_gpu_hours=round(problem.excluded_gpu_hours, 6),
        shape_classes=len(problem.classes),
        onprem_groups=len(problem.onprem_gpus),
        block_bins=solution.block_bins,
        pause_variables=solution.variables,
        accrual_t_hours=hours,
        accrual_cost=spent,
    )


def lower_bound(
    jobs: Sequence[BoundJob],
    onprem_gpus: int,
    price: StepSeries,
    horizon_s: float,
    max_wait_s: float,
    bin_s: float,
    block_bins: int | None = None,
) -> LowerBoundResult:
    """The bound with one price for every job and interchangeable on-prem GPUs (the form before
    shape classes; every job fits everywhere)."""
    problem = problem_of(
        [BoundJob(j.submit_s, j.duration_s, j.gpus) for j in jobs],
        [BoundClass(price, (0,))],
        [onprem_gpus],
        horizon_s,
    )
    return bound(problem, max_wait_s, bin_s, block_bins=block_bins)


def compute_lower_bounds(
    prepared: Prepared, *, progress: bool = False, label: str = "lower bound"
) -> list[LowerBoundResult]:
    """The bounds the report shows: no wait at all, and the scenario's wait target.

    ``progress`` shows the steps under ``label`` (one linear program can solve for minutes: a
    log still gets a line every ~10 s, see ``autoscaler.model.progress``)."""
    scenario = prepared.loaded.scenario
    waits = [0.0]
    if scenario.wait_target_s > 0:
        waits.append(scenario.wait_target_s)
    bin_s = scenario.lower_bound.bin_seconds
    with Progress(label, len(waits), "bounds", enabled=progress) as shown:
        shown.note("building the shape classes and their prices")
        started = time.perf_counter()
        problem = build_problem(
            prepared.selection.jobs,
            scenario.onprem,
            scenario.controller.pools,
            prepared.markets,
            prepared.horizon_s,
        )
        setup_s = time.perf_counter() - started
        results = []
        for wait in waits:
            shown.note(f"solving for a maximum wait of {duration(wait)}")
            results.append(bound(problem, wait, bin_s))
            shown.advance()
    # Building the classes and their prices is shared; each result carries its share of it.
    return [r.model_copy(update={"solve_s": r.solve_s + setup_s / len(results)}) for r in results]
