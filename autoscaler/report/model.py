"""The dry-run cost report as data: what the JSON holds and what the Markdown and HTML show."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from autoscaler.model import Frozen


class Percentiles(Frozen):
    p50: float
    p95: float
    p99: float
    max: float


class PoolCost(Frozen):
    pool: str
    cost: float
    instance_hours: float


class GpuHours(Frozen):
    """Where GPU-hours went. ``useful`` is the trace's work done; ``lost`` the work thrown away by
    interruptions; ``checkpointing`` the time spent writing checkpoints; ``cloud_idle`` paid
    cloud GPU-hours with no job on them (booting, waiting to be drained, packing waste)."""

    useful: float
    allocated_onprem: float
    allocated_cloud: float
    cloud_paid: float
    cloud_idle: float
    lost: float
    checkpointing: float


class Series(Frozen):
    """A time series for plots, downsampled to at most a few thousand points."""

    t_hours: list[float]
    values: list[float]


class PolicyTimeline(Frozen):
    cost: Series
    cost_per_hour: Series
    pending_gpus: Series
    running_gpus: Series
    cloud_gpus: Series
    onprem_busy_gpus: Series
    wait_p95_by_hour: Series


class PolicyResult(Frozen):
    policy: str
    label: str
    params: dict[str, Any] = Field(default_factory=dict)
    cost: float
    cost_by_pool: list[PoolCost]
    cost_per_useful_gpu_hour: float | None
    wait_s: Percentiles
    jobs_total: int
    jobs_finished: int
    jobs_never_started: int
    gpu_hours: GpuHours
    onprem_utilisation: float
    interruptions: int
    checkpoints: int
    requeues: int
    migrations: int = 0
    instances_launched: int
    capacity_failures: int
    held_ticks: int
    clamps: dict[str, int] = Field(default_factory=dict)
    ratio_to_lower_bound: dict[str, float | None] = Field(default_factory=dict)
    ticks: int
    replay_wall_s: float
    tick_ms: Percentiles
    timeline: PolicyTimeline


class LowerBoundResult(Frozen):
    """The offline lower bound for one maximum wait (see docs/lower-bound.md)."""

    max_wait_s: float
    cost: float | None
    method: str
    bin_s: float
    status: str
    solve_s: float


class PoolRow(Frozen):
    name: str
    provider: str
    region: str
    zone: str | None
    instance_type: str
    gpus: int
    market: str
    price_per_hour_at_start: float
    interruptions: str


class WindowInfo(Frozen):
    trace: str
    start_s: float
    end_s: float
    days: float
    jobs: int
    carried_jobs: int
    gpu_hours_submitted: float
    skipped: dict[str, int] = Field(default_factory=dict)


class CheckpointSide(Frozen):
    checkpoint_aware: bool
    gpu_hours_lost: float
    cost: float
    wait_p95_s: float
    requeues: int
    interruptions: int


class CheckpointComparison(Frozen):
    """One policy replayed twice on the same trace, with and without checkpoint-aware
    interruption handling and scale-down: what awareness saves in work lost."""

    policy: str
    label: str
    aware: CheckpointSide
    unaware: CheckpointSide


class Report(Frozen):
    scenario: str
    description: str
    source: str
    seed: int
    start: str
    wait_target_s: float
    onprem_gpus: int
    window: WindowInfo
    assumptions: list[str]
    pools: list[PoolRow]
    lower_bounds: list[LowerBoundResult]
    policies: list[PolicyResult]
    default_policy: str
    findings: list[str]
    checkpoint_comparison: CheckpointComparison | None = None
