"""The simulator's workload scheduler: FIFO with backfill over on-prem and cloud nodes.

Jobs start in submission order; a job that fits nowhere does not hold back later jobs that do
fit (backfill without reservations, as Kubernetes' scheduler does — a job that never fits is
what the autoscaler is for). A job runs on one node, or, asking for several, on that many
distinct nodes of one kind of capacity at once (as Slurm starts a ``--nodes=N`` job), and only
on GPUs of a model it accepts. Within the tiers a placement rule allows, the nodes that fit most
tightly win; where the controller judges jobs (``Placement.waits_for_judgement``), a job
submitted since it last applied a placement may use on-prem nodes only, until the next placement
judges it (``UNJUDGED_TIERS``, as Slurm's spot and on-demand twin partitions do live). Each
running job checkpoints on its own schedule; an interrupted job keeps the work up to its last
finished checkpoint and goes back to the queue in its original order. Any member of a
multi-node job going away stops the whole job, which is requeued whole, as Slurm requeues it.

The same object is the controller's queue source, node source and scheduler adapter in a dry
run, so the controller reads and drives it through exactly the interfaces a real Slurm gets:
it lists each node's running jobs, signals a job to checkpoint now (the checkpoint finishes its
declared duration later and is reported to the ledger, as the example job reports it live) and
requeues a job, which keeps the work up to its last finished checkpoint. It moves a job off an
on-prem node for a pending one (``MovesJobsOff``) as the Slurm adapter does: the job is requeued
and does not start on that node again until the job it made room for has started, or for at
most ``MOVE_HOLD_S`` (the Slurm adapter's default ``move_hold_s``). A pending job the
controller binds to nodes (``bind``, when reclaim or preemption decides its moves) starts only
there, on all of them for a multi-node job, one member per node (as the Slurm adapter binds it
through its ``ReqNodeList``), until it starts or ``MOVE_HOLD_S`` has passed since the binding,
so that room made for jobs of several shapes is not taken by one of them from another, even
while some of their movers still checkpoint. It never moves a job by itself: on-prem
rebalancing is the controller's rule, live and here alike.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction

from autoscaler.fleet.checkpoints import CheckpointLedger, CheckpointReport
from autoscaler.model import Capacity, DemandGroup, NodeShape, OnPremNode, Placement
from autoscaler.model.clock import Clock
from autoscaler.model.errors import SourceError
from autoscaler.model.priorities import promoted_order
from autoscaler.model.sharing import GpuSharing, whole_gpus
from autoscaler.model.teams import UNASSIGNED, PriorityClass
from autoscaler.sim.packing import SharedGpus, Slot
from autoscaler.sim.trace import TraceJob
from autoscaler.spi.sources import NAMED_PENDING, HeldOff, NodeReading, NodeUsage, RunningJob

CHECKPOINT_SIGNAL = "USR1"


@dataclass(slots=True, eq=False)
class SimJob:
    trace: TraceJob
    seq: int
    pending_since: float
    progress: float = 0.0
    run_start: float | None = None
    run_wall: float = 0.0
    run_id: int = 0
    node: SimNode | None = None
    first_start: float | None = None
    waited: float = 0.0
    finished_at: float | None = None
    interruptions: int = 0
    lost_gpu_s: float = 0.0
    members: list[SimNode] = field(default_factory=list)
    # While it runs as a slice of a shared GPU: that slice, in GPUs (None: whole GPUs).
    slice: Fraction | None = None
    # The GPUs it holds while it runs, as its GPU-seconds are counted: its slice, or ``gpus``.
    share: float = 0.0

    @property
    def gpus(self) -> int:
        return self.trace.gpus

    @property
    def gpus_per_node(self) -> int:
        return self.trace.gpus // self.trace.nodes

    def wall_for(self, remaining: float) -> float:
        interval = self.trace.checkpoint_interval_s
        if interval is None or remaining <= 0:
            return max(remaining, 0.0)
        return remaining + self.trace.checkpoint_duration_s * (
            max(0, math.ceil(remaining / interval) - 1)
        )


@dataclass(slots=True, eq=False)
class SimNode:
    name: str
    gpus: int
    kind: Capacity
    pool: str | None
    joined_at: float
    free: int
    jobs: dict[int, SimJob] = field(default_factory=dict)
    leaving: bool = False
    util: float = 0.0
    idle_since: float | None = None
    empty_since: float | None = None
    gpu_model: str | None = None
    gpu_memory_gib: float | None = None
    version: int = 0
    # Where the node's network is: the nodes of one multi-node job must share it. One for all
    # on-prem nodes; a cloud's region for its instances (a job spanning clouds or regions
    # cannot run as one, whatever placed its nodes).
    locality: str = "onprem"
    # Up to when the node's allocated-idle GPU-seconds are counted (on-prem nodes).
    idle_counted_to: float = 0.0
    # Its GPUs' slices when they may be shared (``free`` then counts GPUs with nothing on them).
    shared: SharedGpus | None = None


@dataclass
class Accounting:
    """GPU-seconds by where they were spent; conserved: allocated = completed + lost + overhead.

    ``onprem_idle_gpu_s`` is a view across that identity, not a part of it: the on-prem
    GPU-seconds allocated to jobs while their node read idle, as telemetry would judge it live
    (every job on the node below the idle threshold by its trace utilisation; a node is idle or
    busy as a whole, as ``OnPremNode.idle_since`` says), counted exactly between job events.
    """

    allocated_gpu_s: dict[Capacity, float] = field(
        default_factory=lambda: dict.fromkeys(Capacity, 0.0)
    )
    lost_gpu_s: float = 0.0
    checkpoint_gpu_s: float = 0.0
    useful_gpu_s: float = 0.0
    interruptions: int = 0
    checkpoints: int = 0
    requeues: int = 0
    migrations: int = 0
    onprem_idle_gpu_s: float = 0.0
    # The allocated GPU-seconds again, by (team, where): a pool's name, or "on-prem". Work with
    # no team is "unassigned"'s; summed, they are ``allocated_gpu_s``.
    team_gpu_s: dict[tuple[str, str], float] = field(default_factory=dict)

    def allocate(self, job: SimJob, node: SimNode, gpu_s: float) -> None:
        self.allocated_gpu_s[node.kind] += gpu_s
        key = (job.trace.team or UNASSIGNED, node.pool or ONPREM_PLACE)
        self.team_gpu_s[key] = self.team_gpu_s.get(key, 0.0) + gpu_s


MOVE_HOLD_S = 1800.0
# Where a job submitted since the last placement may start: live, with the layout docs/slurm.md
# recommends (spot and on-demand cloud nodes each in a twin partition of their own, the base
# partition users submit to holding on-prem nodes only: "In the placement's order: the on-demand
# twin"), Slurm keeps a new job in its base partition, so on on-prem nodes, until the
# controller's next tick judges it and writes its twins in the placement's order. A job that
# arrives between ticks takes on-prem room at once or waits for that tick to use the cloud, even
# where a cloud node has room. (Without on-demand twins the base also holds on-demand nodes and
# a new job could take on-demand room at once: the simulator models the recommended layout.)
UNJUDGED_TIERS = (Capacity.ONPREM,)


@dataclass
class _Hold:
    node: str
    for_job: int
    since: float


@dataclass(frozen=True)
class _Binding:
    """The nodes a pending job may start on alone (one member on each), since ``since``."""

    nodes: tuple[str, ...]
    since: float


# gpus, checkpoint interval, high priority, nodes, accepted models, minimum GPU memory, team,
# the GPU fraction asked for (only where some GPUs may be shared; None otherwise), and the
# priority class
ONPREM_PLACE = "on-prem"  # where on-prem GPU-seconds are counted, beside the pools' names
BucketKey = tuple[
    int,
    float | None,
    bool,
    int,
    tuple[str, ...],
    float | None,
    str | None,
    float | None,
    str | None,
]
CheckpointAsked = Callable[[SimJob, int, float, float], None]


class SimCheckpoints(CheckpointLedger):
    """The ledger as the simulated jobs would fill it: every checkpoint a job finishes on its own
    schedule counts as reported the moment it finishes, without an event per checkpoint."""

    def __init__(self, scheduler: SimScheduler) -> None:
        super().__init__()
        self.scheduler = scheduler

    def last(self, job_id: str) -> float | None:
        reported = super().last(job_id)
        natural = self.scheduler.last_natural_checkpoint(job_id)
        if reported is None or natural is None:
            return natural if reported is None else reported
        return max(reported, natural)


class SimScheduler:
    name = "sim-scheduler"

    def __init__(
        self,
        clock: Clock,
        idle_util_pct: float,
        on_start: Callable[[SimJob, float], None],
        on_checkpoint_asked: CheckpointAsked | None = None,
        pool_sharing: dict[str, GpuSharing] | None = None,
        pool_names: Sequence[str] = (),
    ) -> None:
        self.clock = clock
        # The pools whose instances' GPUs may be shared; ``shares``: whether any GPU may be
        # (only then are fractional jobs queued and placed apart from whole-GPU ones).
        self.pool_sharing = dict(pool_sharing or {})
        self.shares = bool(self.pool_sharing)
        # every pool's name, to fold fractional demand only when each of them shares
        self._pool_names = tuple(pool_names) or tuple(self.pool_sharing)
        self._shared_nodes: dict[Capacity, dict[str, SimNode]] = {k: {} for k in Capacity}
        # GPUs held by running jobs as slices of shared GPUs, beside ``busy_gpus``'s whole ones
        self.busy_slices: dict[Capacity, Fraction] = dict.fromkeys(Capacity, Fraction(0))
        self.idle_fraction = idle_util_pct / 100.0
        self.on_start = on_start
        self.on_checkpoint_asked = on_checkpoint_asked
        self.checkpoints = SimCheckpoints(self)
        self.placement = Placement()
        self.nodes: dict[str, SimNode] = {}
        self.jobs: list[SimJob] = []
        self.accounting = Accounting()
        self._buckets: dict[BucketKey, list[tuple[int, SimJob]]] = {}
        self._index: dict[Capacity, dict[int, dict[str, SimNode]]] = {k: {} for k in Capacity}
        self._dirty = False
        # the config's priority classes, where pending jobs are placed by class (place_by_class)
        self._classes: dict[str, PriorityClass] = {}
        self._demand_cache: tuple[DemandGroup, ...] | None = None
        self._onprem_cache: dict[str, tuple[int, OnPremNode]] = {}
        self._max_free = 0
        self.busy_gpus: dict[Capacity, int] = dict.fromkeys(Capacity, 0)
        # by the moved job's seq: a job moved again while held keeps both holds, as Slurm keeps
        # a job's ExcNodeList when it adds the node it leaves
        self._holds: dict[int, list[_Hold]] = {}
        # by the seq of a pending job room is being made for: the nodes it is bound to
        self._bound: dict[int, _Binding] = {}
        # Jobs below this seq were submitted before the placement in force was applied; later
        # ones have not been judged by any placement yet (None: no placement applied so far).
        self._judged_below: int | None = None
        # Whether demand folds per priority class: only once the controller asks
        # (FoldsPriorityClasses), so that without classes demand is folded as before.
        self.fold_classes = False

    # -- the world changes -------------------------------------------------------------------

    def submit(self, trace: TraceJob, now: float) -> SimJob:
        job = SimJob(trace, seq=len(self.jobs), pending_since=now)
        self.jobs.append(job)
        self._enqueue(job)
        return job

    def add_node(
        self,
        name: str,
        gpus: int,
        kind: Capacity,
        pool: str | None,
        now: float,
        gpu_model: str | None = None,
        gpu_memory_gib: float | None = None,
        locality: str = "onprem",
        sharing: GpuSharing | None = None,
    ) -> SimNode:
        """A node joins. ``sharing`` (or its pool's, in ``pool_sharing``) lets fractional jobs
        share its GPUs."""
        if sharing is None and pool is not None:
            sharing = self.pool_sharing.get(pool)
        node = SimNode(
            name,
            gpus,
            kind,
            pool,
            now,
            gpus,
            idle_since=now,
            empty_since=now,
            gpu_model=gpu_model,
            gpu_memory_gib=gpu_memory_gib,
            locality=locality,
            idle_counted_to=now,
            shared=SharedGpus(sharing, gpus) if sharing is not None else None,
        )
        self.nodes[name] = node
        if node.shared is not None:
            self.shares = True
            self._shared_nodes[kind][name] = node
        self._index_add(node)
        self._dirty = True
        return node

    def remove_node(self, name: str, now: float) -> int:
        """The node is gone (terminated or reclaimed): its jobs lose unsaved work and requeue."""
        node = self.nodes.pop(name, None)
        if node is None:
            return 0
        self._count_idle(node, now)
        self._index_remove(node)
        self._shared_nodes[node.kind].pop(name, None)
        count = 0
        for job in list(node.jobs.values()):
            self._interrupt(job, now)
            count += 1
        return count

    def finish(self, job: SimJob, run_id: int, now: float) -> None:
        if job.run_id != run_id or job.node is None or job.run_start is None:
            return
        node = job.node
        elapsed = now - job.run_start
        self.accounting.allocate(job, node, job.share * elapsed)
        remaining = job.trace.duration - job.progress
        self.accounting.useful_gpu_s += job.share * remaining
        self.accounting.checkpoint_gpu_s += job.share * (elapsed - remaining)
        interval = job.trace.checkpoint_interval_s
        if interval is not None and remaining > 0:
            self.accounting.checkpoints += max(0, math.ceil(remaining / interval) - 1)
        job.progress = job.trace.duration
        job.finished_at = now
        self._detach(job, now)

    # -- the controller's adapter ------------------------------------------------------------

    def apply_placement(self, placement: Placement) -> None:
        """The placement in force from now on, for every job submitted so far: jobs submitted
        later are judged by the next one (``UNJUDGED_TIERS`` until then)."""
        if placement != self.placement or self._judged_below != len(self.jobs):
            self.placement = placement
            self._judged_below = len(self.jobs)
            self._dirty = True

    def drain(self, node: str, reason: str) -> int:
        found = self.nodes.get(node)
        if found is None:
            return 0
        if not found.leaving:
            self._index_remove(found)
            self._shared_nodes[found.kind].pop(found.name, None)
            found.leaving = True
            found.version += 1
        return len(found.jobs)

    def evict(self, node: str, reason: str) -> int:
        found = self.nodes.get(node)
        if found is None:
            return 0
        jobs = list(found.jobs.values())
        now = self.clock.now()
        for job in jobs:
            self._interrupt(job, now)
        return len(jobs)

    def running_jobs(self, node: str) -> Sequence[RunningJob]:
        found = self.nodes.get(node)
        if found is None:
            return ()
        return [self._running(job, found) for job in found.jobs.values()]

    def running_jobs_by_node(self) -> dict[str, Sequence[RunningJob]]:
        return {
            name: [self._running(job, node) for job in node.jobs.values()]
            for name, node in self.nodes.items()
            if node.jobs
        }

    def signal(self, job_id: str, signal: str) -> None:
        """Ask a running job to checkpoint now; it finishes its checkpoint duration later."""
        job = self._job(job_id)
        if job.node is None or self.on_checkpoint_asked is None:
            return
        now = self.clock.now()
        self.on_checkpoint_asked(job, job.run_id, now, now + job.trace.checkpoint_duration_s)

    def checkpointed(self, job: SimJob, run_id: int, asked_at: float, now: float) -> None:
        """A checkpoint asked for at ``asked_at`` is written: the work up to then is kept, the
        job goes on from it on the same node, and the ledger hears of it."""
        node = job.node
        if job.run_id != run_id or node is None or job.run_start is None:
            return
        job.progress += self._account_run(job, node, asked_at)
        writing = now - asked_at
        self.accounting.allocate(job, node, job.share * writing)
        self.accounting.checkpoint_gpu_s += job.share * writing
        self.accounting.checkpoints += 1
        members = list(job.members)
        self._detach(job, now)
        job.pending_since = now
        self._start(job, members, now)
        self.checkpoints.record(CheckpointReport(str(job.seq), now, writing, node.name))

    def requeue(self, job_id: str) -> None:
        job = self._job(job_id)
        if job.node is not None:
            self._interrupt(job, self.clock.now())

    def move_off(self, job_id: str, node: str, for_job: str) -> None:
        """Requeue a job running on ``node`` (keeping the work up to its last checkpoint) and keep
        it off ``node`` until ``for_job`` has started or ``MOVE_HOLD_S`` has passed (a job moved
        again keeps each hold)."""
        job = self._job(job_id)
        if job.node is None or node not in {n.name for n in job.members}:
            raise SourceError(f"move job {job_id} off {node}: it does not run there")
        now = self.clock.now()
        self._interrupt(job, now, moved=True)
        target = self._job(for_job)
        self._holds.setdefault(job.seq, []).append(_Hold(node, target.seq, now))

    def bind(self, for_job: str, nodes: Sequence[str]) -> None:
        """Start the pending ``for_job`` only on ``nodes`` (one member on each) until it starts
        or ``MOVE_HOLD_S`` has passed since this binding; the same nodes again change nothing,
        others replace the binding. A job that is not pending, nodes that are not one distinct
        node per member it asks for, or a node a standing hold keeps the job off (bound there it
        could start nowhere), are refused (``SourceError``), nothing bound."""
        job = self._known(for_job)
        if job.node is not None or job.finished_at is not None:
            raise SourceError(f"bind job {for_job}: it is not pending")
        wanted = tuple(nodes)
        if len(set(wanted)) != len(wanted) or len(wanted) != job.trace.nodes:
            raise SourceError(
                f"bind job {for_job} to {list(wanted)}: it asks for {job.trace.nodes} "
                "distinct node(s)"
            )
        kept_off = self._current_holds(job.seq).intersection(wanted)
        if kept_off:
            raise SourceError(
                f"bind job {for_job} to {list(wanted)}: it is held off {sorted(kept_off)}, where "
                "it could not start until that hold ends"
            )
        if set(self._binding(job.seq) or ()) == set(wanted):
            return
        self._bound[job.seq] = _Binding(wanted, self.clock.now())
        self._dirty = True

    def bound_to(self, job_id: str) -> tuple[str, ...]:
        """The nodes a pending job is bound to (none: it may start anywhere it fits)."""
        return self._binding(int(job_id)) or ()

    def _binding(self, seq: int) -> tuple[str, ...] | None:
        """The nodes job ``seq`` is bound to now (a binding past ``MOVE_HOLD_S`` is let go)."""
        binding = self._bound.get(seq)
        if binding is None:
            return None
        if self.clock.now() - binding.since >= MOVE_HOLD_S:
            del self._bound[seq]
            return None
        return binding.nodes

    def held_off(self) -> list[HeldOff]:
        for seq in list(self._holds):
            self._current_holds(seq)
        for seq in list(self._bound):
            if self._binding(seq) is None:
                self._dirty = True  # a job no longer bound may start elsewhere now
        return [
            HeldOff(str(seq), h.node, str(h.for_job), h.since)
            for seq, holds in self._holds.items()
            for h in holds
        ]

    def _current_holds(self, seq: int) -> frozenset[str]:
        """The nodes job ``seq`` is kept off now (holds past ``MOVE_HOLD_S`` are let go)."""
        holds = self._holds.get(seq)
        if not holds:
            return frozenset()
        now = self.clock.now()
        kept = [h for h in holds if now - h.since < MOVE_HOLD_S]
        if kept:
            self._holds[seq] = kept
        else:
            del self._holds[seq]
        return frozenset(h.node for h in kept)

    def last_natural_checkpoint(self, job_id: str) -> float | None:
        """When the job's current run last finished a checkpoint on its own schedule."""
        job = self._job(job_id)
        interval = job.trace.checkpoint_interval_s
        if interval is None or job.run_start is None:
            return None
        cycle = interval + job.trace.checkpoint_duration_s
        done = math.floor((self.clock.now() - job.run_start) / cycle)
        return job.run_start + done * cycle if done > 0 else None

    # -- the controller's sources ------------------------------------------------------------

    def fold_priority_classes(self) -> None:
        queued = [job for heap in self._buckets.values() for _, job in heap]
        self.fold_classes = True
        self._buckets = {}
        for job in queued:
            self._enqueue(job)

    def read(self, now: float) -> Sequence[DemandGroup]:
        if self._demand_cache is None:
            # Fractional jobs alike but for their fraction are one group, their slices summed
            # and rounded up once (``_folded``), where it sits in the order of its first bucket.
            merged: dict[tuple[object, ...], list[tuple[BucketKey, list[tuple[int, SimJob]]]]] = {}
            order: list[tuple[object, ...]] = []
            for key, heap in sorted(self._buckets.items(), key=_bucket_order):
                if not heap:
                    continue
                rest: tuple[object, ...] = (key[:7] + key[8:]) if key[7] is not None else key
                if rest not in merged:
                    merged[rest] = []
                    order.append(rest)
                merged[rest].append((key, heap))
            groups = []
            for rest in order:
                members = merged[rest]
                gpus, interval, high, nodes, models, memory, team, _, cls = members[0][0]
                everyone = [item for _, heap in members for item in heap]
                groups.append(
                    DemandGroup.model_construct(
                        gpus_per_job=gpus,
                        jobs=self._folded([(key[7], len(heap)) for key, heap in members]),
                        checkpoint_interval_s=interval,
                        high_priority=high,
                        nodes=nodes,
                        gpu_models=models,
                        min_gpu_memory_gib=memory,
                        partition=None,
                        oldest_submit_time=min(heap[0][1].trace.submit for _, heap in members),
                        oldest_jobs=tuple(
                            str(seq) for seq, _ in heapq.nsmallest(NAMED_PENDING, everyone)
                        ),
                        team=team,
                        priority_class=cls,
                    )
                )
            self._demand_cache = tuple(groups)
        return self._demand_cache

    def _folded(self, counts: Sequence[tuple[float | None, int]]) -> int:
        """The whole GPUs pending one-GPU jobs need, given as (fraction asked, jobs), as the
        controller is told (``autoscaler.model.sharing.whole_gpus``, which the live sources
        use too), against every pool's sharing (None for a pool whose GPUs are not shared)."""
        if not self.pool_sharing:
            return sum(n for _, n in counts)
        return whole_gpus(counts, [self.pool_sharing.get(p) for p in self._pool_names])

    def read_nodes(self, now: float) -> NodeReading:
        onprem: list[OnPremNode] = []
        cloud: dict[str, NodeUsage] = {}
        for node in self.nodes.values():
            if node.kind is Capacity.ONPREM:
                cached = self._onprem_cache.get(node.name)
                if cached is None or cached[0] != node.version:
                    built = OnPremNode.model_construct(
                        name=node.name,
                        gpus=node.gpus,
                        gpu_model=node.gpu_model,
                        gpu_memory_gib=node.gpu_memory_gib,
                        gpus_allocated=node.gpus - node.free,
                        gpu_util_pct=100.0 * node.util / node.gpus,
                        idle_since=node.idle_since,
                        schedulable=not node.leaving,
                    )
                    cached = (node.version, built)
                    self._onprem_cache[node.name] = cached
                onprem.append(cached[1])
            else:
                cloud[node.name] = NodeUsage(
                    node.gpus - node.free,
                    100.0 * node.util / node.gpus,
                    node.idle_since,
                    node.empty_since,
                    float(node.shared.held_gpus()) if node.shared is not None else None,
                )
        return NodeReading(tuple(onprem), cloud)

    # -- scheduling --------------------------------------------------------------------------

    @property
    def pending(self) -> int:
        return sum(len(h) for h in self._buckets.values())

    @property
    def pending_gpus(self) -> int:
        """The GPUs pending jobs ask for, fractional ones as the controller is told of them."""
        return sum(group.gpus_per_job * group.jobs for group in self.read(self.clock.now()))

    def team_gpus(self) -> dict[str, tuple[float, float]]:
        """By team: the on-prem GPUs its running jobs hold, and the GPUs its pending jobs ask
        for (what a guarantee is judged against). A job on a slice of a shared GPU holds its
        slice, and a pending fractional job asks its fraction, as the controller's reclaim
        counts them (``RunningJob.gpus_held``)."""
        found: dict[str, list[float]] = {}
        for key, heap in self._buckets.items():
            if heap:
                each = key[7] if key[7] is not None else key[0]
                found.setdefault(key[6] or UNASSIGNED, [0.0, 0.0])[1] += each * len(heap)
        for node in self.nodes.values():
            if node.kind is Capacity.ONPREM:
                for job in node.jobs.values():
                    held = float(job.slice) if job.slice is not None else job.gpus_per_node
                    found.setdefault(job.trace.team or UNASSIGNED, [0.0, 0.0])[0] += held
        return {team: (held, pending) for team, (held, pending) in found.items()}

    def close(self, now: float) -> None:
        """End of the replay: count the work in flight, and the wait of jobs still queued (a
        lower bound on what they would have waited)."""
        for node in self.nodes.values():
            self._count_idle(node, now)
        running = {job.seq: job for node in self.nodes.values() for job in node.jobs.values()}
        for job in running.values():
            if job.node is not None:
                self._account_run(job, job.node, now)
        for heap in self._buckets.values():
            for _, job in heap:
                job.waited += now - job.pending_since
                job.pending_since = now

    def schedule(self, now: float) -> int:
        """Start every pending job that fits, in FIFO order with backfill (by class first, where
        ``place_by_class`` was called); returns how many. A job moved off a node (``move_off``)
        does not start there again while its hold lasts."""
        if not self._dirty:
            return 0
        self._dirty = False
        heads: list[tuple[int, int, BucketKey]] = []
        for key, heap in self._buckets.items():
            if heap and (key[7] is not None or key[0] // key[3] <= self._max_free):
                heads.append((self._placed_before(heap[0][1], now), heap[0][0], key))
        heapq.heapify(heads)
        started = 0
        while heads:
            _, _, key = heapq.heappop(heads)
            heap = self._buckets[key]
            job = heap[0][1]
            nodes = self._best_fit(job)
            if nodes is None:
                if not self._bound:
                    continue
                behind = self._behind_bound(heap, key)
                if behind is None:
                    continue
                item, nodes = behind
                job = item[1]
                heap.remove(item)
                heapq.heapify(heap)
            else:
                heapq.heappop(heap)
            self._demand_cache = None
            self._start(job, nodes, now)
            started += 1
            if heap and (key[7] is not None or key[0] // key[3] <= self._max_free):
                heapq.heappush(heads, (self._placed_before(heap[0][1], now), heap[0][0], key))
        return started

    def _behind_bound(
        self, heap: list[tuple[int, SimJob]], key: BucketKey
    ) -> tuple[tuple[int, SimJob], list[SimNode]] | None:
        """A job of a bucket whose head cannot start that can start now, and where: behind a
        head waiting for the nodes it is bound to, the first job that fits (a job bound
        elsewhere does not hold back the jobs of its shape behind it: Slurm's backfill starts
        them; the scan stops at the first job neither bound nor held off a node, since none of
        its shape after it fits either); else a job of the bucket bound to nodes that now have
        its room (the nodes kept for it are no room for the jobs ahead of it)."""
        if heap[0][1].seq in self._bound:
            for item in sorted(heap)[1:]:
                job = item[1]
                nodes = self._best_fit(job)
                if nodes is not None:
                    return item, nodes
                if job.seq not in self._bound and job.seq not in self._holds:
                    break
        for seq in sorted(self._bound):
            job = self.jobs[seq]
            if job is heap[0][1] or job.node is not None or self._key(job) != key:
                continue
            nodes = self._best_fit(job)
            if nodes is not None:
                return (seq, job), nodes
        return None

    def place_by_class(self, classes: Mapping[str, PriorityClass]) -> None:
        """Start pending jobs highest (aged) priority class first, then in FIFO order, as Slurm's
        multifactor priority does with the QOS factor weighed above age, and Kubernetes'
        scheduling queue (PrioritySort) does: called where the config lists
        ``teams.priority_classes``; FIFO with backfill otherwise."""
        self._classes = dict(classes)
        self._dirty = True

    def _placed_before(self, job: SimJob, now: float) -> int:
        """The heap's first key for ``job``: minus its aged class order (0 without classes)."""
        if not self._classes:
            return 0
        return -promoted_order(self._classes, job.trace.priority_class, now - job.trace.submit)

    def _job(self, job_id: str) -> SimJob:
        return self.jobs[int(job_id)]

    def _known(self, job_id: str) -> SimJob:
        """The job named ``job_id``, or a ``SourceError`` naming it when there is none."""
        if not job_id.isdigit() or int(job_id) >= len(self.jobs):
            raise SourceError(f"no job {job_id!r} in the simulator's queue")
        return self.jobs[int(job_id)]

    def _running(self, job: SimJob, node: SimNode) -> RunningJob:
        interval = job.trace.checkpoint_interval_s
        assert job.run_start is not None
        return RunningJob(
            id=str(job.seq),
            node=node.name,
            gpus=job.gpus_per_node,
            started_at=job.run_start,
            checkpoint_interval_s=interval,
            checkpoint_duration_s=job.trace.checkpoint_duration_s if interval else None,
            checkpoint_signal=CHECKPOINT_SIGNAL if interval else None,
            nodes=job.trace.nodes,
            high_priority=job.trace.high_priority,
            gpu_models=job.trace.shape.gpu_models,
            min_gpu_memory_gib=job.trace.shape.min_gpu_memory_gib,
            team=job.trace.team,
            priority_class=job.trace.priority_class,
            submitted_at=job.trace.submit,
            gpu_share=float(job.slice) if job.slice is not None else None,
        )

    def _tiers(self, job: SimJob) -> tuple[Capacity, ...]:
        if (
            self._judged_below is not None
            and job.seq >= self._judged_below
            and self.placement.waits_for_judgement()
        ):
            return UNJUDGED_TIERS
        return self.placement.tiers(
            job.trace.checkpoint_interval_s is not None, job.trace.high_priority
        )

    def _best_fit(self, job: SimJob) -> list[SimNode] | None:
        """The nodes to start ``job`` on now: the tightest fit of the first tier that has room,
        one node per node the job asks for, all of one kind. Nodes bound to other pending jobs
        are kept for them (``kept_for_others``)."""
        shape = job.trace.shape
        avoid = self._current_holds(job.seq) if self._holds else frozenset()
        fraction = job.trace.gpu_fraction if self.shares else None
        bound = self._binding(job.seq) if self._bound else None
        if bound is not None:
            return self._on_bound(job, bound, fraction, avoid)
        kept = self._kept_for_others(job.seq) if self._bound else frozenset()
        avoid = avoid | kept if kept else avoid
        for kind in self._tiers(job):
            if fraction is not None and self._shared_nodes[kind]:
                sliced = self._tightest_slice(kind, shape, fraction, avoid)
                if sliced is not None:
                    return [sliced]
            if job.trace.nodes == 1:
                node = self._tightest(kind, shape, avoid)
                if node is not None:
                    return [node]
                continue
            nodes = self._tightest_many(kind, shape, job.trace.nodes, kept)
            if nodes is not None:
                return nodes
        return None

    def _kept_for_others(self, seq: int) -> frozenset[str]:
        """The nodes bound to pending jobs other than ``seq``: no other job starts there while
        the binding stands, so that room freed there in part (the movers that cannot
        checkpoint gone, the others still checkpointing) is not taken before the job it is
        for can start, as Slurm's scheduler, once the bound job is the first that cannot
        start, starts nothing that would delay it there, and as Kubernetes' hold taint keeps
        other pods off."""
        return frozenset(
            node
            for other in list(self._bound)
            if other != seq
            for node in self._binding(other) or ()
        )

    def _on_bound(
        self, job: SimJob, names: tuple[str, ...], fraction: float | None, avoid: frozenset[str]
    ) -> list[SimNode] | None:
        """``job`` on the nodes it is bound to, one member on each, when every one of them has
        room for it now (a node gone or drained, or of a tier the job may not use, leaves it
        waiting until the binding ends, as Slurm leaves a job whose ``ReqNodeList`` cannot be
        met)."""
        found = [self._bound_room(job, name, fraction, avoid) for name in names]
        chosen = [node for node in found if node is not None]
        return chosen if len(chosen) == len(names) else None

    def _bound_room(
        self, job: SimJob, name: str, fraction: float | None, avoid: frozenset[str]
    ) -> SimNode | None:
        """The node ``name`` when it has room for one member of ``job`` now."""
        node = self.nodes.get(name)
        if node is None or node.leaving or name in avoid or node.kind not in self._tiers(job):
            return None
        shape = job.trace.shape
        if fraction is not None and node.shared is not None and job.trace.nodes == 1:
            slices = node.shared.sharing.slices_for(fraction)
            if (
                slices is not None
                and node.shared.slot(slices) is not None
                and shape.accepts(node.gpus, node.gpu_model, node.gpu_memory_gib)
            ):
                return node
        if node.free >= shape.gpus and shape.accepts(
            node.free, node.gpu_model, node.gpu_memory_gib
        ):
            return node
        return None

    def _tightest(
        self, kind: Capacity, shape: NodeShape, avoid: frozenset[str] = frozenset()
    ) -> SimNode | None:
        """The node of this kind with the least free room that still holds one node of
        ``shape`` on GPUs it accepts (other than ``avoid``)."""
        by_free = self._index[kind]
        if not avoid and not shape.gpu_models and shape.min_gpu_memory_gib is None:
            best: int | None = None
            for free, nodes in by_free.items():
                if nodes and free >= shape.gpus and (best is None or free < best):
                    best = free
            return next(iter(by_free[best].values())) if best is not None else None
        for free in sorted(f for f, nodes in by_free.items() if nodes and f >= shape.gpus):
            for node in by_free[free].values():
                if node.name not in avoid and shape.accepts(
                    free, node.gpu_model, node.gpu_memory_gib
                ):
                    return node
        return None

    def _tightest_slice(
        self, kind: Capacity, shape: NodeShape, fraction: float, avoid: frozenset[str]
    ) -> SimNode | None:
        """The shared node of this kind whose GPU a job asking ``fraction`` of one fills most
        tightly (a partly used GPU before an empty one); None when none has a slice for it."""
        best: tuple[Slot, SimNode] | None = None
        for node in self._shared_nodes[kind].values():
            shared = node.shared
            assert shared is not None
            if node.name in avoid or (node.free == 0 and not shared.has_partial()):
                continue
            if not shape.accepts(node.gpus, node.gpu_model, node.gpu_memory_gib):
                continue
            slices = shared.sharing.slices_for(fraction)
            if slices is None:
                continue
            slot = shared.slot(slices)
            if slot is not None and slot.better_than(best[0] if best is not None else None):
                best = (slot, node)
        return best[1] if best is not None else None

    def _tightest_many(
        self, kind: Capacity, shape: NodeShape, count: int, avoid: frozenset[str] = frozenset()
    ) -> list[SimNode] | None:
        """``count`` distinct nodes of this kind and of one locality, other than ``avoid``, that
        each hold one node of ``shape``, the tightest first; None when no locality has that
        many."""
        by_free = self._index[kind]
        chosen: dict[str, list[SimNode]] = {}
        for free in sorted(f for f, nodes in by_free.items() if nodes and f >= shape.gpus):
            for node in by_free[free].values():
                if node.name not in avoid and shape.accepts(
                    free, node.gpu_model, node.gpu_memory_gib
                ):
                    together = chosen.setdefault(node.locality, [])
                    together.append(node)
                    if len(together) == count:
                        return together
        return None

    def _start(self, job: SimJob, nodes: list[SimNode], now: float) -> None:
        self._bound.pop(job.seq, None)
        if self._holds:
            for seq, holds in list(self._holds.items()):
                kept = [h for h in holds if h.for_job != job.seq]
                if not kept:
                    del self._holds[seq]
                elif len(kept) < len(holds):
                    self._holds[seq] = kept
        per_node = job.gpus_per_node
        job.slice = None
        for node in nodes:
            self._count_idle(node, now)
            self._index_remove(node)
            if node.shared is not None:
                job.slice = self._take(node.shared, job, per_node)
                node.free = node.shared.free_gpus()
            else:
                node.free -= per_node
            node.jobs[job.seq] = job
            node.util += per_node * job.trace.utilisation
            node.empty_since = None
            self._refresh_idle(node, now)
            node.version += 1
            self._index_add(node)
        node = nodes[0]
        if job.slice is not None:
            self.busy_slices[node.kind] += job.slice
            job.share = float(job.slice)
        else:
            self.busy_gpus[node.kind] += job.gpus
            job.share = float(job.gpus)
        job.waited += now - job.pending_since
        if job.first_start is None:
            job.first_start = now
        job.members = list(nodes)
        job.node = node
        job.run_start = now
        job.run_id += 1
        job.run_wall = job.wall_for(job.trace.duration - job.progress)
        self.on_start(job, now + job.run_wall)

    def _detach(self, job: SimJob, now: float) -> None:
        assert job.node is not None
        per_node = job.gpus_per_node
        if job.slice is not None:
            self.busy_slices[job.node.kind] -= job.slice
        else:
            self.busy_gpus[job.node.kind] -= job.gpus
        for node in job.members:
            self._count_idle(node, now)
            self._index_remove(node)
            del node.jobs[job.seq]
            if node.shared is not None:
                node.shared.release(job.seq)
                node.free = node.shared.free_gpus()
            else:
                node.free += per_node
            node.util -= per_node * job.trace.utilisation
            if not node.jobs:
                node.util = 0.0
                node.empty_since = now
            self._refresh_idle(node, now)
            node.version += 1
            if node.name in self.nodes:
                self._index_add(node)
        job.members = []
        job.node = None
        job.slice = None
        job.run_start = None
        job.run_id += 1
        self._dirty = True

    def _take(self, shared: SharedGpus, job: SimJob, per_node: int) -> Fraction | None:
        """Give ``job`` its room on a shared node: a slice of one GPU when it asks for a fraction
        the sharing covers (returned, in GPUs), else ``per_node`` whole GPUs (None)."""
        fraction = job.trace.gpu_fraction
        slices = shared.sharing.slices_for(fraction) if fraction is not None else None
        if slices is not None and shared.slot(slices) is not None:
            shared.place(job.seq, slices)
            return Fraction(slices, shared.units)
        shared.place_whole(job.seq, per_node)
        return None

    def fragmentation(self) -> tuple[Fraction, int]:
        """Now: the free slices stranded on partly used shared GPUs (in GPUs), and the GPUs
        with nothing on them across every node that takes work."""
        stranded = Fraction(0)
        free = 0
        for node in self.nodes.values():
            if node.leaving:
                continue
            free += node.free
            if node.shared is not None:
                stranded += node.shared.stranded()
        return stranded, free

    def _account_run(self, job: SimJob, node: SimNode, now: float) -> float:
        """Count a run that stops now with all its work kept (end of replay, or a checkpoint
        taken on request); returns the work it did."""
        assert job.run_start is not None
        elapsed = now - job.run_start
        interval = job.trace.checkpoint_interval_s
        work = elapsed
        if interval is not None:
            cycle = interval + job.trace.checkpoint_duration_s
            done = math.floor(elapsed / cycle)
            work = done * interval + min(interval, elapsed - done * cycle)
            self.accounting.checkpoints += done
        work = min(work, job.trace.duration - job.progress)
        self.accounting.allocate(job, node, job.share * elapsed)
        self.accounting.useful_gpu_s += job.share * work
        self.accounting.checkpoint_gpu_s += job.share * (elapsed - work)
        return work

    def _interrupt(self, job: SimJob, when: float, moved: bool = False) -> None:
        node = job.node
        if node is None or job.run_start is None:
            return
        elapsed = max(0.0, when - job.run_start)
        interval = job.trace.checkpoint_interval_s
        saved = 0.0
        lost = elapsed
        if interval is not None:
            cycle = interval + job.trace.checkpoint_duration_s
            done = math.floor(elapsed / cycle) if cycle > 0 else 0
            saved = min(done * interval, job.trace.duration - job.progress)
            lost = elapsed - done * cycle
            self.accounting.checkpoints += done
            self.accounting.checkpoint_gpu_s += job.share * done * job.trace.checkpoint_duration_s
        self.accounting.allocate(job, node, job.share * elapsed)
        self.accounting.useful_gpu_s += job.share * saved
        self.accounting.lost_gpu_s += job.share * lost
        job.lost_gpu_s += job.share * lost
        job.progress += saved
        if moved:
            self.accounting.migrations += 1
        else:
            self.accounting.requeues += 1
            job.interruptions += 1
        self._detach(job, when)
        job.pending_since = when
        self._enqueue(job)

    # -- indexes ---------------------------------------------------------------------------

    def _enqueue(self, job: SimJob) -> None:
        heapq.heappush(self._buckets.setdefault(self._key(job), []), (job.seq, job))
        self._demand_cache = None
        self._dirty = True

    def _key(self, job: SimJob) -> BucketKey:
        """The bucket of jobs the scheduler treats alike that ``job`` waits in."""
        trace = job.trace
        return (
            trace.gpus,
            trace.checkpoint_interval_s,
            trace.high_priority,
            trace.nodes,
            trace.gpu_models,
            trace.min_gpu_memory_gib,
            trace.team,
            trace.gpu_fraction if self.shares else None,
            trace.priority_class if self.fold_classes else None,
        )

    def _index_add(self, node: SimNode) -> None:
        if node.leaving or node.free <= 0:
            return
        self._index[node.kind].setdefault(node.free, {})[node.name] = node
        self._max_free = max(self._max_free, node.free)

    def _index_remove(self, node: SimNode) -> None:
        nodes = self._index[node.kind].get(node.free)
        if nodes is not None:
            nodes.pop(node.name, None)
        self._max_free = max(
            (f for by_free in self._index.values() for f, n in by_free.items() if n), default=0
        )

    def _count_idle(self, node: SimNode, now: float) -> None:
        """Count the on-prem node's allocated-idle GPU-seconds up to ``now``; called before
        anything changes what runs on it, so each stretch is counted with the allocation and
        idleness it had."""
        if node.kind is not Capacity.ONPREM:
            return
        if node.idle_since is not None and node.jobs and now > node.idle_counted_to:
            allocated = sum(
                j.gpus_per_node if j.slice is None else j.slice for j in node.jobs.values()
            )
            self.accounting.onprem_idle_gpu_s += allocated * (now - node.idle_counted_to)
        node.idle_counted_to = max(node.idle_counted_to, now)

    def _refresh_idle(self, node: SimNode, now: float) -> None:
        """A node is idle when every one of its GPUs is, as telemetry judges it per GPU: one busy
        GPU among seven free ones is a node at work, not a node at 2 %."""
        busy = any(job.trace.utilisation >= self.idle_fraction for job in node.jobs.values())
        if busy:
            node.idle_since = None
        elif node.idle_since is None:
            node.idle_since = now


def _bucket_order(
    item: tuple[BucketKey, object],
) -> tuple[int, float, bool, int, tuple[str, ...], float, str, float, str]:
    (gpus, interval, high, nodes, models, memory, team, fraction, cls), _ = item
    order = (gpus, -1.0 if interval is None else interval, high, nodes, models, memory or 0.0)
    return (*order, team or "", 1.0 if fraction is None else fraction, cls or "")
