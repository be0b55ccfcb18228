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
