"""What placement changes in Slurm's queue each tick, decided from one reading of it.

**Off spot, by partition.** Spot cloud nodes join a partition of their own, the *spot twin* of a
base partition (``gpu-spot`` beside ``gpu``; docs/slurm.md gives the slurm.conf lines), and a job
is in that partition only when the controller put it there: for every pending GPU job in a base
partition, the twin is added to the job's partitions when the policy's ``Placement`` lets the job
run on spot and removed when it does not. Slurm itself then keeps every other job off spot nodes,
including jobs submitted since the last tick and every job while the controller is down: the safe
side is the default, and the controller only ever widens a job it has judged. A partition is the
one per-job lever Slurm has for this: ``--constraint`` has no negation (a feature on spot nodes
cannot be refused), and a feature ANDed into protected jobs would leave a new job unprotected
until the next tick.

**In the placement's order, by list order.** With on-demand twins as well (``gpu-od``, the
on-demand cloud nodes' own partition; the base then holds on-prem nodes only), each partition is
one kind of capacity and a judged job's partitions are written in its ``Placement.tiers`` order:
``gpu,gpu-spot,gpu-od`` for a spot-safe job while on-prem comes first, ``gpu-spot,gpu-od,gpu``
while it comes after the cloud, ``gpu,gpu-od`` for a job kept off spot. Slurm 22.05 tries a job's
partitions by PriorityTier, then by the job's priority in each (PriorityJobFactor), then in the
order the job lists them (tested in tests/test_slurm_placement.py), so the managed partitions must
share one PriorityTier and one PriorityJobFactor. A job kept off spot is written only when its set
of partitions must change (its on-demand twin added, a spot twin taken away), never for the order
alone: Slurm 22.05 recomputes the priority of a pending job it holds for ``BadConstraints`` when
it is updated (tests/test_slurm_placement.py), which drops an operator's ``sbatch --priority``,
and a job kept off spot for its priority would then be judged spot-safe by the next tick. Such a
job keeps the order Slurm shows, on-prem or on-demand first.

Without on-demand twins, on-demand nodes share the base with on-prem nodes and only the set of
partitions is managed (the order within the base is the node weights'): a spot-safe job then
takes on-demand room in the base before spot room.

The twins are the controller's own: a job's other partitions are never touched, a job in a twin
but in no base partition (a user who chose spot, or on-demand) is left alone, and only jobs whose
partitions must change are updated, grouped by their new partition list so that a tick costs a
few ``scontrol`` commands, at most one per changed job. Jobs to take off spot go first, and at
most ``most`` jobs change per tick; the rest follow next tick, which only delays a job's use of
spot (or of the order it should have).

**Holds.** A job moved off an on-prem node to make room there (``MovesJobsOff``) is kept off that
node through its ``ExcNodeList`` until the job it made room for has started there (or elsewhere,
or has left the queue), and at least until its last run's credential has expired there, or until
a bound has passed. A job moved off several nodes in turn has one hold per node: its
``ExcNodeList`` is its own list and every node whose hold stands, each hold ends on its own, and
the list it had before the first move is restored when the last one ends (``exclusions``).

**Bindings.** When the moves for a pending job are decided (reclaim, preemption), the job is
bound to the nodes being freed for it through its ``ReqNodeList`` (``Binding``), all of them at
once, as the simulator binds it: it starts only there (a multi-node job on exactly those nodes),
so that it does not take room coming free elsewhere (made for another job, perhaps in the same
tick) and leave the room made for it to others. A binding has its own lifetime:
it ends when the job has started, has left the queue, or the hold bound has passed since the
bind, whatever the holds of the moved jobs do; then the job's own (empty) ``ReqNodeList`` is
given back (once it is pending: a running job's cannot be changed, and matters only if it is
requeued). A job that asked for nodes itself (``--nodelist``) is not bound.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from autoscaler.model import Capacity, Placement
from autoscaler.sources.slurm_json import QueuedJob


@dataclass(frozen=True)
class PartitionUpdate:
    """Set these pending jobs' partitions to ``partitions`` (a comma-separated list)."""

    partitions: str
    job_ids: tuple[str, ...]


@dataclass(frozen=True)
class PartitionPlan:
    """The updates of one tick, and how many changed jobs were left for the next."""

    updates: tuple[PartitionUpdate, ...] = ()
    deferred: int = 0

    @property
    def jobs(self) -> int:
        return sum(len(u.job_ids) for u in self.updates)


def wanted_partitions(
    job: QueuedJob,
    placement: Placement,
    twins: Mapping[str, str],
    on_demand: Mapping[str, str] | None = None,
) -> tuple[str, ...] | None:
    """The partitions a pending GPU job in a base partition should be in, in the order Slurm
    should try them; None for a job placement leaves alone (running, CPU-only, or in no base
    partition). ``twins`` maps each base to its spot twin, ``on_demand`` (when given) to its
    on-demand twin."""
    if not job.pending or not job.asks_gpus:
        return None
    bases = [p for p in job.partitions if p in twins]
    if not bases:
        return None
    allowed = placement.allows_spot(job.checkpointable, job.high_priority)
    if on_demand:
        tiers = placement.tiers(job.checkpointable, job.high_priority)
        wanted = _in_tier_order(job.partitions, bases, tiers, allowed, twins, on_demand)
        if not allowed and set(wanted) == set(job.partitions):
            return job.partitions  # kept off spot: only a change of its set is written
        return wanted
    if allowed:
        added = [twins[b] for b in bases]
        return tuple(dict.fromkeys([*job.partitions, *added]))
    spot = set(twins.values())
    return tuple(p for p in job.partitions if p not in spot)


def _in_tier_order(
    partitions: tuple[str, ...],
    bases: list[str],
    tiers: tuple[Capacity, ...],
    allowed: bool,
    twins: Mapping[str, str],
    on_demand: Mapping[str, str],
) -> tuple[str, ...]:
    """The job's partitions with its bases and their twins written as one block, where its first
    base was, in the order of its ``tiers`` over every base it lists (the bases themselves last when
    a spot-safe job uses on-prem after the cloud, or never: a base stays in the list, since it is
    what makes the job the controller's). Its other partitions keep their places; a spot twin of
    a base it does not list is dropped for a job kept off spot."""
    kinds = {Capacity.ONPREM: bases, Capacity.SPOT: [twins[b] for b in bases]}
    kinds[Capacity.ON_DEMAND] = [on_demand[b] for b in bases]
    block = [p for tier in tiers for p in kinds[tier]]
    block += bases
    placed = {*block, *kinds[Capacity.SPOT]}
    spot = set(twins.values())
    wanted: list[str] = []
    for partition in partitions:
        if partition == bases[0]:
            wanted += block
        elif partition not in placed and (allowed or partition not in spot):
            wanted.append(partition)
    return tuple(dict.fromkeys(wanted))


def requeued_order(
    partitions: tuple[str, ...],
    placement: Placement,
    twins: Mapping[str, str],
    on_demand: Mapping[str, str],
) -> tuple[str, ...] | None:
    """The order a job's partitions should be in again after a requeue, or None when they are
    in it: Slurm puts the partition a job ran in first in its list (so a job requeued off a
    spot node would try spot before on-prem), and the job was judged by the tick that put it
    in its spot twin, or it is in none. The set of partitions is kept; only the order changes."""
    bases = [p for p in partitions if p in twins]
    if not on_demand or not bases:
        return None
    if any(twins[b] in partitions for b in bases):
        tiers = placement.tiers(True, False)
    else:
        tiers = (Capacity.ONPREM, Capacity.ON_DEMAND)
    wanted = _in_tier_order(partitions, bases, tiers, True, twins, on_demand)
    kept = set(partitions)
    order = tuple(p for p in wanted if p in kept)
    return order if order != partitions else None


def partition_plan(
    jobs: Iterable[QueuedJob],
    placement: Placement,
    twins: Mapping[str, str],
    most: int,
    skip: frozenset[str] = frozenset(),
    on_demand: Mapping[str, str] | None = None,
) -> PartitionPlan:
    """The changed jobs, jobs taken off spot first, grouped by their new partition list; at most
    ``most`` jobs. Jobs in ``skip`` are left for the caller (it updates them another way). With
    ``on_demand`` twins a job whose partitions are right but out of order changes too."""
    protect: dict[str, list[str]] = {}
    widen: dict[str, list[str]] = {}
    spot = frozenset(twins.values())
    # A queue holds a few distinct partition lists: each list's answer is worked out once.
    answers: dict[tuple[tuple[str, ...], bool], tuple[dict[str, list[str]], str] | None] = {}
    for job in jobs:
        if not job.pending or not job.asks_gpus or job.id in skip:
            continue
        allowed = placement.allows_spot(job.checkpointable, job.high_priority)
        key = (job.partitions, allowed)
        if key in answers:
            answer = answers[key]
        else:
            wanted = wanted_partitions(job, placement, twins, on_demand)
            answer = None
            if wanted is not None and _changes(wanted, job.partitions, bool(on_demand)):
                leaves_spot = not spot.intersection(job.partitions) <= set(wanted)
                into = protect if leaves_spot else widen
                answer = (into, ",".join(wanted))
            answers[key] = answer
        if answer is not None:
            answer[0].setdefault(answer[1], []).append(job.id)
    updates: list[PartitionUpdate] = []
    room = most
    deferred = 0
    for groups in (protect, widen):
        for partitions, ids in groups.items():
            taken = ids[: max(room, 0)]
            deferred += len(ids) - len(taken)
            room -= len(taken)
            if taken:
                updates.append(PartitionUpdate(partitions, tuple(taken)))
    return PartitionPlan(tuple(updates), deferred)


def _changes(wanted: tuple[str, ...], partitions: tuple[str, ...], ordered: bool) -> bool:
    """Whether the job must be updated: its list differs, or (without on-demand twins, where
    the order is the node weights') its set of partitions does."""
    return wanted != partitions if ordered else set(wanted) != set(partitions)


class ForJob(StrEnum):
    """Where the job a move made room for is."""

    PENDING = "pending"
    THERE = "started there"
    ELSEWHERE = "started elsewhere"
    GONE = "left the queue"


@dataclass
class Hold:
    """A moved job kept off ``node`` for ``for_job``, from ``not_before`` at the earliest to
    ``until`` at the latest (both on the monotonic clock). ``not_before`` is when the job's
    last run's credential has expired on that node: a requeued job that starts again on the node
    it left sooner is killed there ("Job credential revoked", and fails for good), which is what
    the begin-time hold Slurm puts on a requeued job guards against, and the move lifts that
    hold. ``excluded`` is the job's own ``ExcNodeList`` before the move (restored after);
    ``applied`` says whether the exclusion is in place (a job still completing when it was
    requeued gets it on a later tick, inside Slurm's begin-time hold); ``over`` that it has
    done its work and only the restore is left, which waits while the job runs. A job has one
    hold per node it was moved off; they share ``excluded``, the list before the first move."""

    job_id: str
    node: str
    for_job: str
    since: float
    not_before: float
    until: float
    excluded: str = ""
    applied: bool = False
    over: bool = False


class Step(StrEnum):
    KEEP = "keep"
    APPLY = "apply"
    RESTORE = "restore"
    DROP = "drop"


@dataclass(frozen=True)
class HoldStep:
    hold: Hold
    step: Step
    why: str = ""


@dataclass
class QueueIndex:
    """The queue by job id, by array task (``A_T``) and by array with pending tasks."""

    by_id: dict[str, QueuedJob] = field(default_factory=dict)
    by_task: dict[str, QueuedJob] = field(default_factory=dict)
    pending_arrays: set[str] = field(default_factory=set)

    @classmethod
    def of(cls, jobs: Sequence[QueuedJob]) -> QueueIndex:
        index = cls()
        for job in jobs:
            index.by_id[job.id] = job
            if job.array_task is not None:
                index.by_task[job.array_task] = job
            if job.array_pending is not None:
                index.pending_arrays.add(job.array_pending)
        return index

    def where(self, for_job: str, node: str) -> ForJob:
        job = self.by_id.get(for_job) or self.by_task.get(for_job)
        if job is None:
            array, underscore, _ = for_job.partition("_")
            return ForJob.PENDING if underscore and array in self.pending_arrays else ForJob.GONE
        if job.pending:
            return ForJob.PENDING
        return ForJob.THERE if node in job.nodes else ForJob.ELSEWHERE


def hold_steps(holds: Iterable[Hold], index: QueueIndex, now: float) -> list[HoldStep]:
    """What each hold needs this tick (``now`` on the monotonic clock the hold's bounds are
    on). A hold found over stays over: only its restore is left, done once the job is pending
    (a running job's exclusions cannot be changed, and matter only when it is requeued)."""
    steps: list[HoldStep] = []
    for hold in holds:
        job = index.by_id.get(hold.job_id)
        if job is None:
            steps.append(HoldStep(hold, Step.DROP, "the moved job left the queue"))
            continue
        why = "its exclusions are restored once it is pending"
        if not hold.over:
            ended = _ended(hold, index, now)
            if ended is None:
                applies = job.pending and not hold.applied
                steps.append(HoldStep(hold, Step.APPLY if applies else Step.KEEP))
                continue
            hold.over, why = True, ended
        steps.append(HoldStep(hold, Step.RESTORE if job.pending else Step.KEEP, why))
    return steps


def _ended(hold: Hold, index: QueueIndex, now: float) -> str | None:
    """Why the hold has done its work, or None while it has not."""
    if now < hold.not_before:
        return None
    where = index.where(hold.for_job, hold.node)
    if where is not ForJob.PENDING:
        return f"job {hold.for_job} {where.value}"
    if now >= hold.until:
        return f"job {hold.for_job} still pending at the hold's bound"
    return None


def exclusions(holds: Iterable[Hold]) -> str:
    """The ``ExcNodeList`` a moved job's holds (all of one job) want: its own list (from before
    the first move) and the node of every hold that stands, once each; only its own when none
    stands (the restore)."""
    kept = list(holds)
    own = [n for n in kept[0].excluded.split(",") if n] if kept else []
    standing = [h.node for h in kept if not h.over]
    return ",".join(dict.fromkeys([*own, *standing]))


@dataclass
class Binding:
    """The pending job ``for_job`` bound to ``nodes`` (its ``ReqNodeList``) from the monotonic
    ``since`` to ``until`` at the latest; its own ``ReqNodeList`` is empty (a job with one of
    its own is not bound), which is what is given back. ``applied`` says whether the binding
    is in place, ``over`` that only the give-back is left."""

    for_job: str
    nodes: tuple[str, ...]
    since: float
    until: float
    applied: bool = False
    over: bool = False

    @property
    def node_list(self) -> str:
        return ",".join(self.nodes)


@dataclass(frozen=True)
class BindingStep:
    binding: Binding
    step: Step
    why: str = ""


def binding_steps(bindings: Iterable[Binding], index: QueueIndex, now: float) -> list[BindingStep]:
    """What each binding needs this tick: it lasts while its job is pending and its bound has
    not passed, whatever the holds of the jobs moved for it do."""
    steps: list[BindingStep] = []
    for binding in bindings:
        job = index.by_id.get(binding.for_job) or index.by_task.get(binding.for_job)
        if job is None:
            steps.append(BindingStep(binding, Step.DROP, f"job {binding.for_job} left the queue"))
            continue
        why = "its node list is given back once it is pending"
        if not binding.over:
            if job.pending and now < binding.until:
                applies = not binding.applied
                steps.append(BindingStep(binding, Step.APPLY if applies else Step.KEEP))
                continue
            binding.over = True
            why = "still pending at the binding's bound" if job.pending else "it started"
        if not binding.applied:
            steps.append(BindingStep(binding, Step.DROP, why))
        else:
            steps.append(BindingStep(binding, Step.RESTORE if job.pending else Step.KEEP, why))
    return steps
