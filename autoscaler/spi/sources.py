"""The interfaces observe reads from and act writes to, besides the clouds.

Queue sources report pending demand; a node source reports on-prem nodes and what runs on cloud
nodes (scheduler allocation plus measured utilisation); a workload scheduler adapter drains
nodes, requeues their jobs and applies a policy's placement rule; a telemetry source reports GPU
readings. One configured source may play several roles (Slurm is a queue, a node source and the
scheduler); wiring finds the roles by the methods it has. The simulator implements them too.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol, runtime_checkable

from autoscaler.model import DemandGroup, Job, OnPremNode, Placement, Pool
from autoscaler.model.sharing import SharingMode


@runtime_checkable
class QueueSource(Protocol):
    name: str

    def read(self, now: float) -> Sequence[DemandGroup]: ...


@runtime_checkable
class FoldsPriorityClasses(Protocol):
    """A queue source that can fold its demand per priority class (a Slurm job's QOS, a pod's
    ``priorityClassName``, a trace's ``priority_class``): each group then names its class.

    It folds without classes until asked, so that where the config lists no
    ``teams.priority_classes`` demand is folded, and so planned, exactly as before; the observer
    asks where the config lists classes. Running jobs name their class either way."""

    def fold_priority_classes(self) -> None: ...


@dataclass(frozen=True)
class NodeUsage:
    """What the scheduler and telemetry say of one node (on-prem or a joined cloud instance)."""

    gpus_allocated: int
    gpu_util_pct: float | None = None
    idle_since: float | None = None
    empty_since: float | None = None
    # Where GPUs are shared (time-slicing, MIG): the GPUs' worth the jobs' slices hold, which
    # may be less than the GPUs with a slice on them (``gpus_allocated``). None: not shared.
    gpus_held: float | None = None


@dataclass(frozen=True)
class NodeReading:
    onprem: tuple[OnPremNode, ...] = ()
    cloud: Mapping[str, NodeUsage] = field(default_factory=dict)


@runtime_checkable
class NodeSource(Protocol):
    name: str

    def read_nodes(self, now: float) -> NodeReading: ...


@dataclass(frozen=True)
class GpuSample:
    """One GPU's reading as NVML or dcgm-exporter gives it (``at``: when it was taken)."""

    host: str
    gpu: str
    util_pct: float
    at: float
    uuid: str | None = None
    model: str | None = None
    memory_used_mib: float | None = None


@runtime_checkable
class TelemetrySource(Protocol):
    """GPU readings per host: our agents, a dcgm-exporter ops already run, or Prometheus.

    Hosts are named as the workload scheduler names nodes (a cloud node's name is its instance
    id), so readings and allocations meet on the same node."""

    name: str

    def read_gpus(self, now: float) -> Sequence[GpuSample]: ...


@runtime_checkable
class ReportsTargets(Protocol):
    """A telemetry source that reads many targets and can say which of them failed."""

    def target_status(self) -> Mapping[str, str | None]: ...


@runtime_checkable
class WorkloadScheduler(Protocol):
    def apply_placement(self, placement: Placement) -> None: ...

    def drain(self, node: str, reason: str) -> int:
        """Stop new work landing on ``node``; returns how many jobs still run there."""
        ...

    def evict(self, node: str, reason: str) -> int:
        """Requeue every job on ``node`` now (it is going away); returns how many were requeued."""
        ...


@dataclass(frozen=True)
class RunningJob:
    """A job running on a node, as the scheduler knows it: what an interruption would cost it and
    how to ask it to checkpoint. ``checkpoint_signal`` is the signal its batch script traps to
    write a checkpoint now (None: it cannot be asked). ``nodes`` is how many nodes the job runs
    on (``gpus`` is its share of this one)."""

    id: str
    node: str
    gpus: int
    started_at: float
    checkpoint_interval_s: float | None = None
    checkpoint_duration_s: float | None = None
    checkpoint_signal: str | None = None
    nodes: int = 1
    high_priority: bool = False
    # What the job asks of a node's GPUs (any model when empty): where it may restart if moved.
    gpu_models: tuple[str, ...] = ()
    min_gpu_memory_gib: float | None = None
    # The team the job's GPUs count for (the source's ``team_from``), None when it names none.
    team: str | None = None
    # Its priority class (Slurm QOS, Kubernetes priorityClassName), None when it names none.
    priority_class: str | None = None
    # When it was submitted (None: not known): how old it was when it last started is what its
    # class has aged to while it runs (autoscaler/model/priorities.py).
    submitted_at: float | None = None
    # Where it runs on a slice of a shared GPU (time-slicing, MIG, Slurm shards): that slice, in
    # GPUs (``gpus`` is then 1, the GPU it shares). None: it holds ``gpus`` whole GPUs.
    gpu_share: float | None = None

    @property
    def gpus_held(self) -> float:
        """The GPUs' worth it holds: its slice, or its whole GPUs."""
        return self.gpu_share if self.gpu_share is not None else float(self.gpus)


@runtime_checkable
class CheckpointingScheduler(Protocol):
    """A scheduler that can list a node's jobs, ask one to checkpoint and requeue it: what
    checkpoint-aware interruption handling needs on top of draining."""

    def running_jobs(self, node: str) -> Sequence[RunningJob]: ...

    def signal(self, job_id: str, signal: str) -> None: ...

    def requeue(self, job_id: str) -> None: ...


@runtime_checkable
class BulkDrainer(Protocol):
    """A scheduler that closes many nodes in one command (a zone-wide reclaim is hundreds)."""

    def drain_many(self, nodes: Sequence[str], reason: str) -> None: ...


@runtime_checkable
class JobsByNode(Protocol):
    """A scheduler that lists every node's running jobs in one read, not one read per node."""

    def running_jobs_by_node(self) -> Mapping[str, Sequence[RunningJob]]: ...


@dataclass(frozen=True)
class HeldOff:
    """A job moved off ``node`` to make room there for the pending job ``for_job``: the scheduler
    keeps it off that node until ``for_job`` has started there, has started elsewhere or has left
    the queue, or the scheduler's own bound on such holds has passed, and never for less than the
    scheduler's own minimum (Slurm: its job credential lifetime, during which a job starting
    again on the node it left is killed there). ``since`` is the wall-clock time of the move."""

    job_id: str
    node: str
    for_job: str
    since: float


@runtime_checkable
class MovesJobsOff(Protocol):
    """A scheduler that moves running jobs off a node to make room there for a pending job: the
    live side of ``Placement.rebalance_onprem``.

    The controller picks the jobs (``Placement.movable``) and asks each to checkpoint first
    through ``CheckpointingScheduler.signal`` (as interruption handling does), then, once the
    checkpoint is reported or its wait is over, calls ``move_off``. The scheduler lifts each hold
    by itself in its per-tick ``apply_placement`` once the hold has done its work."""

    def move_off(self, job_id: str, node: str, for_job: str) -> None:
        """Requeue ``job_id``, now running on ``node``, and keep it off ``node`` until ``for_job``
        has started there. A job moved off several nodes in turn is kept off each until its own
        hold ends. Raises ``SourceError`` without requeueing when the job is not running on
        ``node`` or can only run there."""
        ...

    def bind(self, for_job: str, nodes: Sequence[str]) -> None:
        """Keep the room being made on ``nodes`` for the pending ``for_job`` from the moment the
        moves are decided: ``for_job`` starts only there (on all of them, one node each, for a
        multi-node job: Slurm's ``ReqNodeList``, the simulator's scheduler alike; Kubernetes
        holds the nodes for it) until it has started, has left the queue, or the scheduler's
        bound on holds has passed. The controller binds for moves that keep a promise within a
        bound (reclaim, preemption: ``MoveJobs.by``), before the first job is asked to
        checkpoint, so that room coming free before the last move is not taken by other work;
        not for on-prem rebalancing, whose job may as well start on room that comes free
        elsewhere first. Binding again to the same nodes changes nothing; binding to others
        replaces the binding. Raises ``SourceError`` having bound nothing when ``for_job`` is
        not pending or asked for nodes of its own."""
        ...

    def held_off(self) -> Sequence[HeldOff]:
        """The moves still keeping a job off its node."""
        ...


class GroupKey(NamedTuple):
    """What makes pending jobs interchangeable for capacity planning."""

    gpus: int
    checkpoint_interval_s: float | None
    high_priority: bool
    gpu_models: tuple[str, ...]
    partition: str | None
    nodes: int = 1
    min_gpu_memory_gib: float | None = None
    team: str | None = None
    priority_class: str | None = None
    # the jobs ask slices of GPUs shared this way (DemandGroup.gpu_sharing); None: whole GPUs
    gpu_sharing: SharingMode | None = None


# A Job asks whole GPUs: its key is every field but the sharing, which keeps its default.
_job_key = operator.attrgetter(*GroupKey._fields[:-1])


def aggregate(jobs: Iterable[Job]) -> list[DemandGroup]:
    """Fold pending jobs into demand groups: same shape, checkpoint interval, urgency, queue,
    team and priority class."""
    counts: dict[tuple[object, ...], int] = {}
    named: dict[tuple[object, ...], OldestJobs] = {}
    bounds: dict[tuple[object, ...], float] = {}
    for job in jobs:
        # A plain tuple equal to the job's GroupKey, read in C (this runs for every pending
        # job); the groups are built from GroupKeys.
        key = _job_key(job)
        submitted = job.submit_time
        if key in counts:
            counts[key] += 1
            if submitted <= bounds[key]:
                bounds[key] = named[key].offer(submitted, job.id)
        else:
            counts[key] = 1
            named[key] = OldestJobs(submitted, job.id)
            bounds[key] = math.inf
    return groups_from_counts(
        {_whole_gpus_key(k): v for k, v in counts.items()},
        {_whole_gpus_key(k): v.submitted() for k, v in named.items()},
        {_whole_gpus_key(k): v.ids() for k, v in named.items()},
    )


def _whole_gpus_key(fields: tuple[object, ...]) -> GroupKey:
    """The GroupKey of a job's key (every field but the sharing: a Job asks whole GPUs)."""
    return GroupKey._make((*fields, None))


NAMED_PENDING = 8


class OldestJobs:
    """The ids of a group's ``NAMED_PENDING`` longest-waiting jobs, kept as jobs are offered
    one by one. Ties in submit time go to the smaller id (as strings), so the names do not
    depend on the order the scheduler listed the jobs in; a job later than every kept one costs
    a comparison, so 100,000 jobs stay cheap."""

    __slots__ = ("_bound", "_kept")

    def __init__(self, submitted: float, job_id: str) -> None:
        self._kept: list[tuple[float, str]] = [(submitted, job_id)]
        self._bound = math.inf

    def offer(self, submitted: float, job_id: str) -> float:
        """Keep the job if it may be among the longest-waiting; returns the submit time past
        which no later offer can be (callers on a hot path skip those without a call)."""
        if submitted > self._bound:
            return self._bound
        kept = self._kept
        kept.append((submitted, job_id))
        if len(kept) >= 4 * NAMED_PENDING:
            kept.sort()
            del kept[NAMED_PENDING:]
            self._bound = kept[-1][0]
        return self._bound

    def submitted(self) -> float:
        """When the longest-waiting job was submitted (it is always kept)."""
        return min(self._kept)[0]

    def ids(self) -> tuple[str, ...]:
        return tuple(job_id for _, job_id in sorted(self._kept)[:NAMED_PENDING])


def groups_from_counts(
    counts: Mapping[GroupKey, int],
    oldest: Mapping[GroupKey, float],
    oldest_ids: Mapping[GroupKey, tuple[str, ...]] | None = None,
) -> list[DemandGroup]:
    """Demand groups from jobs counted per group key, in a stable order; ``oldest_ids`` names
    each group's longest-waiting jobs where the source knows them."""
    ids = oldest_ids or {}
    return [
        DemandGroup.model_construct(
            gpus_per_job=key.gpus,
            jobs=counts[key],
            checkpoint_interval_s=key.checkpoint_interval_s,
            high_priority=key.high_priority,
            nodes=key.nodes,
            gpu_models=key.gpu_models,
            min_gpu_memory_gib=key.min_gpu_memory_gib,
            partition=key.partition,
            oldest_submit_time=oldest[key],
            oldest_jobs=ids.get(key, ()),
            team=key.team,
            priority_class=key.priority_class,
            gpu_sharing=key.gpu_sharing,
        )
        for key in sorted(counts, key=_group_order)
    ]


def _group_order(
    key: GroupKey,
) -> tuple[int, float, bool, tuple[str, ...], str, int, float, str, str, str]:
    return (
        key.gpus,
        key.checkpoint_interval_s if key.checkpoint_interval_s is not None else -1.0,
        key.high_priority,
        key.gpu_models,
        key.partition or "",
        key.nodes,
        key.min_gpu_memory_gib or 0.0,
        key.team or "",
        key.priority_class or "",
        key.gpu_sharing or "",
    )


@runtime_checkable
class RendersJoinScript(Protocol):
    """A scheduler that renders the boot script a cloud instance joins it with: the script that
    starts the node under its instance id with the features its pool gives it (market, pool,
    GPU model), so that what the cloud launched and what the scheduler places work on meet.

    The assembly puts it in the user data of each pool that joins the scheduler and brings none
    of its own; each provider hands it to the cloud at launch."""

    def join_user_data(self, pool: Pool) -> str | None:
        """The boot script for an instance of ``pool``, or None when this scheduler was not
        asked to render one."""
        ...


@runtime_checkable
class KnowsPools(Protocol):
    """A scheduler that judges pending work against what the pools' nodes will be (Kubernetes:
    a node selector no pool's nodes can meet is demand that cannot be met). The assembly hands
    it the pools once their user data is settled, after ``RendersJoinScript``."""

    def know_pools(self, pools: Sequence[Pool]) -> None: ...


@runtime_checkable
class ReportsProblems(Protocol):
    """A source whose readings count what they could not take as it is, by kind (a pod that
    cannot be read, a GPU resource nobody counts): ``gpu_autoscaler_source_problems``."""

    def reading_problems(self) -> Mapping[str, int]: ...
