"""The dry-run cost report as data: what the JSON holds and what the Markdown and HTML show."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from autoscaler.model import Frozen
from autoscaler.sim.lowerbound_result import LowerBoundResult


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
    cloud GPU-hours with no job on them (booting, waiting to be drained, packing waste);
    ``onprem_allocated_idle`` on-prem GPU-hours allocated to jobs while their node read idle
    by utilisation (below the idle threshold): held, and unused. ``None`` is a figure the
    source cannot know (a journal records what was paid, not how the jobs used it; one written
    before it recorded idle on-prem GPUs, or a node with no reading), shown as unknown rather
    than as a zero."""

    useful: float | None
    allocated_onprem: float | None
    allocated_cloud: float | None
    cloud_paid: float
    cloud_idle: float | None
    lost: float
    checkpointing: float | None
    onprem_allocated_idle: float | None = None


class NodeIdle(Frozen):
    """One on-prem node's GPU-hours allocated while it read idle, over the report's period."""

    node: str
    gpu_hours: float


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


class TeamResult(Frozen):
    """One team's part of a replay: its jobs' waits, the GPU-hours they held and the share of
    the cloud bill that was theirs (``autoscaler.fleet.attribution``); ``(idle)`` is the paid
    time no job held."""

    team: str
    jobs: int
    wait_s: Percentiles | None
    gpu_hours_onprem: float
    gpu_hours_cloud: float
    cost_cents: int
    guaranteed_gpus: int | None = None
    # on-prem GPU-hours the team was short of min(guarantee, its work) while it had work
    # waiting, and the share of ticks it was (None: no guarantee)
    short_gpu_hours: float | None = None
    short_share: float | None = None
    # the same once short without a break for longer than teams.reclaim_within_s
    late_gpu_hours: float | None = None
    late_share: float | None = None


class StaticTeam(Frozen):
    """One team as static per-team pools would have served it, beside the shared fleet."""

    team: str
    onprem_gpus: int
    jobs: int
    static_cost: float
    static_wait_s: Percentiles | None
    shared_cost: float
    shared_wait_s: Percentiles | None


class StaticPools(Frozen):
    """The baseline a shared fleet is judged against (``autoscaler.sim.static_pools``): each
    team's jobs replayed alone on its slice of the on-prem fleet, with the same policy."""

    policy: str
    teams: list[StaticTeam]
    shared_total: float  # the shared replay's whole bill, idle time included

    @property
    def static_cost(self) -> float:
        return sum(t.static_cost for t in self.teams)


class Fragmentation(Frozen):
    """Where GPUs may be shared (scenario ``gpu_sharing``): the mean over sampled ticks of the
    free slices stranded on partly used shared GPUs (room only another fractional job can use),
    in GPUs, and of all free room (those slices and the GPUs with nothing on them)."""

    stranded_gpus: float
    free_gpus: float
    ticks: int

    @property
    def stranded_share(self) -> float | None:
        return self.stranded_gpus / self.free_gpus if self.free_gpus else None


class PolicyResult(Frozen):
    policy: str
    label: str
    params: dict[str, Any] = Field(default_factory=dict)
    cost: float
    cost_by_pool: list[PoolCost]
    cost_per_useful_gpu_hour: float | None
    # None where the source cannot know the figure (a journal report): unknown, not zero
    wait_s: Percentiles | None
    jobs_total: int | None
    jobs_finished: int | None
    jobs_never_started: int | None
    gpu_hours: GpuHours
    onprem_utilisation: float | None
    interruptions: int
    checkpoints: int | None
    requeues: int
    migrations: int | None = 0
    instances_launched: int
    capacity_failures: int
    held_ticks: int
    clamps: dict[str, int] = Field(default_factory=dict)
    ratio_to_lower_bound: dict[str, float | None] = Field(default_factory=dict)
    ticks: int
    replay_wall_s: float | None
    tick_ms: Percentiles
    timeline: PolicyTimeline
    # by team where the scenario names teams (empty otherwise); the costs add up to ``cost``
    teams: list[TeamResult] = Field(default_factory=list)
    # where the scenario lets jobs share GPUs; None otherwise
    fragmentation: Fragmentation | None = None


class PoolRow(Frozen):
    name: str
    provider: str
    region: str | None
    zone: str | None
    instance_type: str | None
    gpus: int
    market: str | None
    price_per_hour_at_start: float | None
    interruptions: str


class WindowInfo(Frozen):
    trace: str
    start_s: float
    end_s: float
    days: float
    jobs: int | None
    carried_jobs: int | None
    gpu_hours_submitted: float | None
    skipped: dict[str, int] = Field(default_factory=dict)
    unhostable_jobs: int | None = None
    unhostable_gpu_hours: float | None = None
    unhostable_examples: list[str] = Field(default_factory=list)


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


class JournalFacts(Frozen):
    """What a live controller's journal records over a period, for a report of real spend.

    ``actions`` counts every journaled action by kind and outcome (an evacuation's outcome is
    the move its job made); ``budget_capped_hours`` is, per guard rule (``budget``,
    ``monthly_budget``), the time from each tick the rule clamped to the next tick."""

    where: str
    since: str | None
    until: str | None
    first_tick: str | None
    last_tick: str | None
    ticks_by_outcome: dict[str, int]
    instances_billed: int
    cost_by_provider: dict[str, float]
    actions: dict[str, dict[str, int]]
    instances_launched: int
    instances_terminated: int
    interruptions: int
    lost_gpu_hours: float
    budget_capped_hours: dict[str, float]
    cloud_calls_cut_short: int
    # on-prem GPU-hours allocated on nodes that read idle (None: no tick in the period knew),
    # the nodes with the most first, and the ticks that could not know
    onprem_idle_gpu_hours: float | None = None
    onprem_idle_top_nodes: list[NodeIdle] = Field(default_factory=list)
    onprem_idle_unknown_ticks: int = 0


class Report(Frozen):
    scenario: str
    description: str
    source: str
    seed: int | None
    start: str
    wait_target_s: float | None
    onprem_gpus: int | None
    window: WindowInfo
    assumptions: list[str]
    pools: list[PoolRow]
    lower_bounds: list[LowerBoundResult]
    policies: list[PolicyResult]
    default_policy: str
    findings: list[str]
    checkpoint_comparison: CheckpointComparison | None = None
    static_pools: StaticPools | None = None
    kind: Literal["dry-run", "journal"] = "dry-run"
    journal: JournalFacts | None = None
