"""What the offline lower bound found for one maximum wait: a value the report carries as is."""

from __future__ import annotations

from pydantic import Field

from autoscaler.model import Frozen


class LowerBoundResult(Frozen):
    """The offline lower bound for one maximum wait (see docs/lower-bound.md)."""

    max_wait_s: float
    cost: float | None
    method: str
    bin_s: float
    status: str
    solve_s: float
    excluded_jobs: int = Field(
        0, description="jobs left out because no on-prem node and no pool can ever host them"
    )
    excluded_gpu_hours: float = Field(0.0, description="the GPU-hours of those jobs")
    shape_classes: int | None = Field(
        None, description="classes of jobs that fit the same pools and on-prem nodes"
    )
    onprem_groups: int | None = Field(
        None, description="on-prem node kinds merged by the classes they can host"
    )
    block_bins: int | None = Field(
        None,
        description="1: every job's pauses are exact; more: long jobs' pauses are pooled within "
        "blocks of this many bins (a relaxation that keeps the LP small)",
    )
    pause_variables: int | None = None
    accrual_t_hours: list[float] = Field(
        default_factory=list,
        description="ends of the bins (hours since the window start) at which accrual_cost is "
        "sampled; at most a few thousand points, the last bin always kept",
    )
    accrual_cost: list[float] = Field(
        default_factory=list,
        description="what one cheapest schedule the closed form or the LP found has spent by "
        "each of accrual_t_hours: a curve ending at that optimum, not a bound at every moment; "
        "below cost where the exact dual raised the bound above a pooled LP's optimum; empty "
        "where there is none",
    )
