"""The domain model every step speaks: what the controller sees, what a policy plans, what acts.

Values are frozen pydantic models so a view handed to a policy cannot be changed under it and a
plan cannot be edited after the guard has checked it. Times are seconds on the controller's clock
(epoch seconds live, trace seconds in the simulator), never datetimes, so the simulator and the
live loop share every line of arithmetic.

Hot paths build these objects with ``model_construct`` from data already validated at the edge
(config, sources, providers); the boundary stays typed without paying validation twice a tick.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from enum import StrEnum
from functools import cached_property
from typing import Annotated, Any

from pydantic import (
    Field,
    NonNegativeFloat,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    model_validator,
)

from autoscaler.model.frozen import Frozen as Frozen  # noqa: PLC0414 (re-exported)
from autoscaler.model.sharing import GpuSharing, SharingMode

Name = Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.:-]*$")]


class Market(StrEnum):
    SPOT = "spot"
    ON_DEMAND = "on-demand"


def _model_tokens(name: str) -> frozenset[str]:
    return frozenset(t for t in re.split(r"[^a-z0-9]+", name.lower()) if t)


# A fleet names a handful of models and jobs a handful more; each pair is judged once.
@functools.lru_cache(maxsize=8192)
def gpu_model_matches(wanted: str, offered: str | None) -> bool:
    """Whether a GPU of model ``offered`` is one a job asking for ``wanted`` accepts.

    Names differ between a scheduler (Slurm's gres type ``a100``), a catalog (``A100-40GB``) and
    an inventory (``A100-SXM4-80GB``): every token of the wanted name must be a token of the
    offered one, case-insensitively, so ``a100`` accepts both A100s and ``a100-80gb`` only the
    80 GB one. An unknown model never matches a job that names one.
    """
    if offered is None:
        return False
    return _model_tokens(wanted) <= _model_tokens(offered)


class NodeShape(Frozen):
    """What one node must offer a job: GPUs, one of these GPU models (any when empty), at
    least this much memory per GPU (any when unset), and GPUs shared the way ``gpu_sharing``
    says (None: whole GPUs, as every job but a slice holder asks).

    A launch carries the shape of the jobs it is bought for, and no pool that cannot host that
    shape is ever launched for them, as first choice or as fallback. A job asking a slice of a
    shared GPU (a Kubernetes ``nvidia.com/gpu.shared`` or ``nvidia.com/mig-<profile>`` pod, a
    Slurm ``--gres=shard:N`` job) can only run where the node offers that slice, so its shape
    names the sharing and only pools whose ``gpu_sharing`` is of that mode can host it.
    """

    gpus: PositiveInt
    gpu_models: tuple[str, ...] = ()
    min_gpu_memory_gib: PositiveFloat | None = None
    gpu_sharing: SharingMode | None = None

    def accepts(self, gpus: int, gpu_model: str | None, gpu_memory_gib: float | None) -> bool:
        if gpus < self.gpus:
            return False
        if self.gpu_models and not any(gpu_model_matches(w, gpu_model) for w in self.gpu_models):
            return False
        return self.min_gpu_memory_gib is None or (
            gpu_memory_gib is not None and gpu_memory_gib >= self.min_gpu_memory_gib
        )

    def shares_like(self, sharing: GpuSharing | None) -> bool:
        """Whether GPUs shared as ``sharing`` says (None: not shared) can give these jobs what
        they ask: anything for whole-GPU jobs (as before slices were read), GPUs shared in the
        same mode for a slice. On-prem nodes are judged by the sources, which only count a
        slice as demand where a pool or an on-prem node offers it."""
        wanted = self.gpu_sharing
        return wanted is None or (sharing is not None and sharing.mode == wanted)

    def describe(self) -> str:
        text = f"{self.gpus} GPU(s)"
        if self.gpu_models:
            text += " of " + "|".join(self.gpu_models)
        if self.min_gpu_memory_gib is not None:
            text += f" with >= {self.min_gpu_memory_gib:g} GiB each"
        if self.gpu_sharing is not None:
            text += f" shared by {self.gpu_sharing.value}"
        return text


class Pool(Frozen):
    """One kind of capacity we can launch: a provider, a place and a shape, bought one way.

    ``options`` are the provider's own (subnets, launch template, placement group, ...), checked
    by the provider when it is built, so the core stays ignorant of every cloud.
    ``gpu_model`` and ``gpu_memory_gib`` decide which jobs the pool can host; the config fills
    them from the shipped catalogs when they are not given. ``joins_scheduler`` says whether its
    instances join the workload scheduler as nodes (false for queue workers that only pull
    work): only those are replaced when they fail to register in time. ``user_data`` is what
    its instances boot with; the assembly fills it with the scheduler's join script for a pool
    that joins the scheduler and gives none of its own.
    """

    name: Name
    provider: Name
    region: str
    zone: str | None = None
    instance_type: str
    gpus_per_instance: PositiveInt
    gpu_model: str | None = None
    gpu_memory_gib: PositiveFloat | None = None
    market: Market
    max_instances: NonNegativeInt | None = None
    boot_seconds: NonNegativeFloat = 300.0
    joins_scheduler: bool = True
    user_data: str | None = Field(
        None,
        repr=False,
        description="the boot script (or cloud-init) the pool's instances start with, as the "
        "cloud takes it: AWS user data, GCP metadata startup-script, Azure custom data. Unset: "
        "the scheduler's join script when the scheduler renders one (the Slurm or Kubernetes "
        "source's join_user_data) and "
        "the pool joins it, else none. An empty string is none, and keeps the scheduler from "
        "filling it (the launch template's or image's own boot data stays).",
    )
    options: dict[str, Any] = Field(default_factory=dict)
    gpu_sharing: GpuSharing | None = Field(
        None,
        description="how the pool's instances share their GPUs between jobs that each ask for "
        "a fraction of one: {mode: time-slicing, replicas: N} or {mode: mig, profiles: [1g.10gb, "
        "...]} (autoscaler/model/sharing.py). It states what the operator's bootstrap sets up "
        "(the NVIDIA device plugin's time-slicing config, or the MIG config the GPU operator "
        "applies); the autoscaler does not configure it. Set on every pool a fractional job may "
        "land on, pending fractional jobs are folded into fewer whole GPUs when buying for them "
        "(model/sharing.whole_gpus); unset on any, each counts one GPU.",
    )

    @property
    def is_spot(self) -> bool:
        return self.market is Market.SPOT

    def can_host(self, shape: NodeShape) -> bool:
        """Whether one instance of this pool can run a node of a job of this shape."""
        return shape.accepts(
            self.gpus_per_instance, self.gpu_model, self.gpu_memory_gib
        ) and shape.shares_like(self.gpu_sharing)


class PriceQuote(Frozen):
    """What an hour of one instance in a pool costs now, and how likely it is to be taken away."""

    pool: str
    price_per_hour: NonNegativeFloat
    on_demand_price_per_hour: NonNegativeFloat | None = None
    interruption_rate_per_hour: NonNegativeFloat | None = None
    as_of: float
    source: str = ""


class InstanceState(StrEnum):
    """The controller's lifecycle of a cloud instance; allowed moves live in ``lifecycle``."""

    REQUESTED = "requested"
    PENDING = "pending"
    RUNNING = "running"
    DRAINING = "draining"
    INTERRUPTED = "interrupted"
    TERMINATING = "terminating"
    TERMINATED = "terminated"


LIVE_STATES = frozenset(
    {
        InstanceState.REQUESTED,
        InstanceState.PENDING,
        InstanceState.RUNNING,
        InstanceState.DRAINING,
        InstanceState.INTERRUPTED,
    }
)
# What the clouds bill: from boot until the instance is told to go.
BILLED_STATES = frozenset(
    {
        InstanceState.PENDING,
        InstanceState.RUNNING,
        InstanceState.DRAINING,
        InstanceState.INTERRUPTED,
    }
)
# What a drain may start from: capacity the controller still counts on.
DRAINABLE_STATES = frozenset(
    {InstanceState.REQUESTED, InstanceState.PENDING, InstanceState.RUNNING}
)
# Capacity jobs may be placed on, now or once it boots.
CAPACITY_STATES = DRAINABLE_STATES


HOLDING_STATES = frozenset({InstanceState.REQUESTED, InstanceState.PENDING, InstanceState.RUNNING})


class Instance(Frozen):
    """A cloud instance as its provider lists it (the cloud is the source of truth)."""

    id: str
    pool: str
    state: InstanceState
    launched_at: float
    request_id: str
    gpus: PositiveInt
    team: str | None = Field(
        None,
        max_length=253,
        description="whom the instance was bought for, as its team tag says (None: no team)",
    )


class CloudNode(Frozen):
    """A cloud instance we own, joined with what the workload scheduler and telemetry say of it.

    ``gpu_util_pct`` is measured utilisation (NVML), ``idle_since`` the moment it last fell below
    the idle threshold; both are ``None`` while unknown, which is never the same as idle.
    ``empty_since`` is the scheduler's view (no job allocated since then), the signal that
    allocation-based autoscalers use.

    ``underused_since`` is when the node last went from more than half of its GPUs allocated
    to at most half (and at least one), ``None`` while more are, or none.

    ``work_at_risk_gpu_s`` is what draining the node now would throw away: GPUs × time since
    each of its jobs last saved a checkpoint; ``jobs_checkpoint`` says whether every job on it
    saves checkpoints, so that moving them costs only what they have not saved yet. Both are
    known (0 and True when it holds no job) for the nodes a policy may give back, those whose
    GPUs read idle and those underused, where a checkpointing scheduler is configured; ``None``
    elsewhere. ``job_gpus`` is the GPUs each of its jobs holds on it, and ``multi_node_jobs``
    whether any of them also runs on other nodes, known for the same nodes and for those under
    an interruption notice (what a replacement must hold); ``gang_jobs`` names those multi-node
    jobs with the number of nodes each spans, so a policy can tell when it sees a gang whole.
    """

    instance_id: str
    pool: str
    state: InstanceState
    launched_at: float
    gpus: PositiveInt
    gpus_allocated: NonNegativeInt = 0
    gpu_util_pct: float | None = None
    idle_since: float | None = None
    empty_since: float | None = None
    joined: bool = False
    underused_since: float | None = None
    work_at_risk_gpu_s: NonNegativeFloat | None = None
    jobs_checkpoint: bool | None = None
    job_gpus: tuple[PositiveInt, ...] | None = None
    multi_node_jobs: bool | None = None
    gang_jobs: tuple[tuple[str, PositiveInt], ...] | None = None
    team: str | None = Field(
        None, max_length=253, description="whom the instance was bought for (None: no team)"
    )


class OnPremNode(Frozen):
    name: str
    gpus: NonNegativeInt
    gpu_model: str | None = None
    gpu_memory_gib: PositiveFloat | None = None
    gpus_allocated: NonNegativeInt = 0
    gpu_util_pct: float | None = None
    idle_since: float | None = None
    schedulable: bool = True

    @property
    def gpus_free(self) -> int:
        return max(0, self.gpus - self.gpus_allocated) if self.schedulable else 0


def _whole_nodes(gpus: int, nodes: int) -> None:
    if gpus % nodes:
        raise ValueError(
            f"a job of {gpus} GPU(s) on {nodes} node(s) must ask the same number of GPUs of "
            "each node: its GPUs must be a multiple of its nodes"
        )


class Job(Frozen):
    """One pending GPU job as a queue source reports it.

    ``gpus`` is the whole job's; a job of several ``nodes`` (a gang) needs ``gpus / nodes`` on
    each of them, all at once. ``gpu_models`` are the models it accepts (any when empty).
    """

    id: str
    gpus: PositiveInt
    submit_time: float
    high_priority: bool = False
    checkpoint_interval_s: float | None = Field(default=None, gt=0)
    checkpoint_duration_s: NonNegativeFloat | None = None
    nodes: PositiveInt = 1
    gpu_models: tuple[str, ...] = ()
    min_gpu_memory_gib: PositiveFloat | None = None
    partition: str | None = None
    team: str | None = Field(
        None, max_length=253, description="the team the scheduler names the job's (teams.py)"
    )
    priority_class: str | None = Field(
        None,
        max_length=253,
        description="the priority class the scheduler names the job's (Slurm QOS, Kubernetes "
        "priorityClassName; priorities.py)",
    )

    @model_validator(mode="after")
    def _whole(self) -> Job:
        _whole_nodes(self.gpus, self.nodes)
        return self

    @property
    def checkpointable(self) -> bool:
        return self.checkpoint_interval_s is not None

    @property
    def shape(self) -> NodeShape:
        return NodeShape.model_construct(
            gpus=self.gpus // self.nodes,
            gpu_models=self.gpu_models,
            min_gpu_memory_gib=self.min_gpu_memory_gib,
        )


class DemandGroup(Frozen):
    """Pending jobs that are interchangeable for capacity planning, counted rather than listed.

    A tick may see 100,000 pending jobs; a policy needs their shapes, not their names.
    ``gpus_per_job`` is each job's total; a job of several ``nodes`` needs ``gpus_per_node`` on
    each, all at once, close together.
    """

    gpus_per_job: PositiveInt
    jobs: PositiveInt
    checkpoint_interval_s: float | None = None
    high_priority: bool = False
    nodes: PositiveInt = 1
    gpu_models: tuple[str, ...] = ()
    min_gpu_memory_gib: PositiveFloat | None = None
    partition: str | None = Field(
        default=None, description="the queue or partition the jobs wait in, if the source has one"
    )
    oldest_submit_time: float
    oldest_jobs: tuple[str, ...] = Field(
        default=(),
        description="the ids of the jobs that have waited longest, oldest first (at most "
        "eight), where the source names jobs: what on-prem rebalancing makes room for",
    )
    team: str | None = Field(
        None, max_length=253, description="the team the jobs are counted under (teams.py)"
    )
    priority_class: str | None = Field(
        None, max_length=253, description="the priority class of the jobs (priorities.py)"
    )
    class_order: int = Field(
        0,
        description="the order the jobs are placed and bought in: their class's, raised by "
        "aging (priorities.py); set by the observer where the config lists classes, 0 elsewhere",
    )
    gpu_sharing: SharingMode | None = Field(
        None,
        description="the jobs ask slices of GPUs shared this way (their whole GPUs are the "
        "slices folded, model/sharing.whole_gpus) and run only on GPUs so shared; None: whole "
        "GPUs",
    )

    @model_validator(mode="after")
    def _whole(self) -> DemandGroup:
        _whole_nodes(self.gpus_per_job, self.nodes)
        return self

    @property
    def gpus(self) -> int:
        return self.gpus_per_job * self.jobs

    @property
    def gpus_per_node(self) -> int:
        return self.gpus_per_job // self.nodes

    @property
    def shape(self) -> NodeShape:
        """What each node of one of these jobs must offer."""
        return NodeShape.model_construct(
            gpus=self.gpus_per_node,
            gpu_models=self.gpu_models,
            min_gpu_memory_gib=self.min_gpu_memory_gib,
            gpu_sharing=self.gpu_sharing,
        )

    @property
    def spot_safe(self) -> bool:
        """May run on capacity that can be taken away: it checkpoints and is not urgent."""
        return self.checkpoint_interval_s is not None and not self.high_priority


class Demand(Frozen):
    """Pending demand, or the admission that we do not know it.

    ``known`` is False when a queue source failed this tick. A policy must not read a failed
    source as "no demand"; the guard holds scale-down while it is False.
    """

    groups: tuple[DemandGroup, ...] = ()
    known: bool = True
    failed_sources: tuple[str, ...] = ()

    @property
    def gpus(self) -> int:
        return sum(g.gpus for g in self.groups)

    @property
    def jobs(self) -> int:
        return sum(g.jobs for g in self.groups)


class NoticeKind(StrEnum):
    TERMINATE = "terminate"
    REBALANCE = "rebalance"


class InterruptionNotice(Frozen):
    """A cloud saying it will take an instance back (``deadline``), or that it is at elevated
    risk of doing so (a rebalance recommendation, with no deadline)."""

    instance_id: str
    pool: str
    kind: NoticeKind = NoticeKind.TERMINATE
    received_at: float
    deadline: float | None = None


class PoolView(Frozen):
    """A pool with what the controller knows of it this tick.

    ``recent_interruptions`` happened during ``recent_instance_hours`` of our instances running
    in the pool, over the controller's interruption window: their ratio is the pool's observed
    interruption rate per instance-hour. ``recent_reclaims`` is how many distinct reclaims
    (interruptions in one tick) they came in: how many instances one reclaim takes at once says
    how much more a job spread over several instances risks than a job on one.
    """

    pool: Pool
    price: PriceQuote | None = None
    unavailable_until: float | None = None
    risky_until: float | None = None
    recent_interruptions: NonNegativeInt = 0
    recent_instance_hours: NonNegativeFloat = 0.0
    recent_reclaims: NonNegativeInt = 0

    @property
    def name(self) -> str:
        return self.pool.name


class Capacity(StrEnum):
    """Where a job can run, in the terms a placement rule speaks."""

    ONPREM = "onprem"
    ON_DEMAND = "on-demand"
    SPOT = "spot"


class OnPremUse(StrEnum):
    """How jobs that may run on spot use on-prem GPUs."""

    FIRST = "first"
    AFTER_CLOUD = "after-cloud"
    NEVER = "never"


class Placement(Frozen):
    """Where the workload scheduler may put pending jobs, in order of preference.

    A policy states it with its plan; act hands it to the scheduler (node features and weights in
    Slurm, node selectors elsewhere) and the simulator's scheduler obeys it. Policies plan
    capacity with the same ``tiers`` so that what they count on is where jobs will go.

    ``rebalance_onprem`` gives on-prem GPUs to the work that is hardest to place elsewhere: a
    pending job that must stay off spot, or that needs several GPUs (large cloud shapes cost more
    per GPU and are scarcer), may take an on-prem node from smaller jobs that may run on spot,
    when each of those can restart at once on free cloud room; they checkpoint on request first,
    so they lose no work, only the time to write the checkpoint.
    """

    protect_uncheckpointable: bool = False
    protect_high_priority: bool = False
    spot_safe_onprem: OnPremUse = OnPremUse.FIRST
    rebalance_onprem: bool = False
    # Who says whether a job may use spot: the controller, judging each pending job every tick
    # (Slurm's spot and on-demand twin partitions: a job submitted since the last tick may use
    # on-prem nodes only until the next tick judges it), or the job's own submission (a
    # peer's users pick an on-demand NodePool or partition by hand, so a job is placed on
    # arrival). The simulator's scheduler follows it.
    judged_each_tick: bool = True

    def waits_for_judgement(self) -> bool:
        """Whether a job submitted since the last tick stays off spot until the next one: only
        when the controller judges jobs and some jobs are kept off spot."""
        return self.judged_each_tick and (
            self.protect_uncheckpointable or self.protect_high_priority
        )

    def allows_spot(self, checkpointable: bool, high_priority: bool) -> bool:
        if self.protect_uncheckpointable and not checkpointable:
            return False
        return not (self.protect_high_priority and high_priority)

    def tiers(self, checkpointable: bool, high_priority: bool) -> tuple[Capacity, ...]:
        if not self.allows_spot(checkpointable, high_priority):
            return _PROTECTED_TIERS
        return _SPOT_SAFE_TIERS[self.spot_safe_onprem]

    def may_displace(self, gpus: int, checkpointable: bool, high_priority: bool) -> bool:
        """Whether a pending job of this kind may take on-prem GPUs from movable jobs."""
        if not self.rebalance_onprem:
            return False
        return gpus >= 2 or not self.allows_spot(checkpointable, high_priority)

    def movable(
        self,
        gpus: int,
        checkpointable: bool,
        high_priority: bool,
        for_gpus: int,
        for_protected: bool,
    ) -> bool:
        """Whether a running job may be moved off on-prem to make room for a pending one: it
        checkpoints and may run on spot, and it is smaller than the job it makes room for (or,
        for a job that must stay off spot, no larger)."""
        if not (checkpointable and self.allows_spot(checkpointable, high_priority)):
            return False
        return gpus < for_gpus or (for_protected and gpus <= for_gpus)


_PROTECTED_TIERS = (Capacity.ONPREM, Capacity.ON_DEMAND)
_SPOT_SAFE_TIERS = {
    OnPremUse.FIRST: (Capacity.ONPREM, Capacity.SPOT, Capacity.ON_DEMAND),
    OnPremUse.AFTER_CLOUD: (Capacity.SPOT, Capacity.ON_DEMAND, Capacity.ONPREM),
    OnPremUse.NEVER: (Capacity.SPOT, Capacity.ON_DEMAND),
}


class LaunchRequest(Frozen):
    """Launch ``count`` instances of ``pool``; on capacity or quota failure try ``fallbacks``.

    ``shape`` is what each instance must host (the largest node of the jobs it is bought for);
    the guard drops any pool, first choice or fallback, that cannot host it, and a fallback gets
    as many instances as hold the same number of such nodes. Without a shape, a whole instance
    of the first pool is the shape. ``gang_size`` > 1 launches the instances in groups of that
    many that come up together, close together, or not at all (a multi-node job's nodes).
    ``team`` is whom the instances are bought for: the guard holds that team's burst limits and
    budget over them, and the instance table remembers it (None: no team's, no team limit).
    """

    pool: str
    count: PositiveInt
    fallbacks: tuple[str, ...] = ()
    reason: str = ""
    shape: NodeShape | None = None
    gang_size: PositiveInt = 1
    team: str | None = Field(
        None, max_length=253, description="the team the instances are bought for (teams.py)"
    )

    @model_validator(mode="after")
    def _whole_gangs(self) -> LaunchRequest:
        if self.count % self.gang_size:
            raise ValueError(
                f"count {self.count} is not a whole number of gangs of {self.gang_size}"
            )
        return self


class DrainRequest(Frozen):
    """Give a node back. Its jobs may finish first (up to the drain timeout), or, with
    ``move_jobs``, leave at once at their next checkpoint (consolidating an underused node)."""

    instance_id: str
    reason: str = ""
    move_jobs: bool = False


class Plan(Frozen):
    launches: tuple[LaunchRequest, ...] = ()
    drains: tuple[DrainRequest, ...] = ()
    placement: Placement = Placement()
    reason: str = ""

    @property
    def is_empty(self) -> bool:
        return not self.launches and not self.drains


class FleetView(Frozen):
    """Everything a policy may know at one tick; built once by observe, never changed after."""

    now: float
    tick: NonNegativeInt
    fleet_id: str
    pools: tuple[PoolView, ...]
    onprem: tuple[OnPremNode, ...] = ()
    instances: tuple[CloudNode, ...] = ()
    demand: Demand = Demand()
    notices: tuple[InterruptionNotice, ...] = ()
    last_plan: Plan | None = None

    @cached_property
    def pool_by_name(self) -> Mapping[str, PoolView]:
        return {p.pool.name: p for p in self.pools}

    @cached_property
    def instances_by_pool(self) -> Mapping[str, tuple[CloudNode, ...]]:
        grouped: dict[str, list[CloudNode]] = {p.pool.name: [] for p in self.pools}
        for node in self.instances:
            grouped.setdefault(node.pool, []).append(node)
        return {name: tuple(nodes) for name, nodes in grouped.items()}

    @cached_property
    def holding_by_pool(self) -> Mapping[str, int]:
        """Instances per pool that hold or will hold capacity (requested, booting or running)."""
        counts: dict[str, int] = {}
        for node in self.instances:
            if node.state in HOLDING_STATES:
                counts[node.pool] = counts.get(node.pool, 0) + 1
        return counts

    @cached_property
    def onprem_kinds(self) -> Mapping[tuple[int, str | None, float | None], int]:
        """On-prem nodes counted by what they have (GPUs, model, memory per GPU): what a shape
        check needs of a fleet of thousands of nodes, counted once per view."""
        counts: dict[tuple[int, str | None, float | None], int] = {}
        for node in self.onprem:
            key = (node.gpus, node.gpu_model, node.gpu_memory_gib)
            counts[key] = counts.get(key, 0) + 1
        return counts

    @property
    def onprem_gpus(self) -> int:
        return sum(n.gpus for n in self.onprem)

    @property
    def onprem_gpus_free(self) -> int:
        return sum(n.gpus_free for n in self.onprem)

    def cost_per_hour(self, states: frozenset[InstanceState] = BILLED_STATES) -> float:
        """What the instances in ``states`` cost per hour at this tick's prices: the one
        definition every step uses (billed now by default; the guard counts every live one,
        the monthly projection the capacity kept)."""
        total = 0.0
        for name, nodes in self.instances_by_pool.items():
            view = self.pool_by_name.get(name)
            if view is None or view.price is None:
                continue
            total += sum(1 for n in nodes if n.state in states) * view.price.price_per_hour
        return total
