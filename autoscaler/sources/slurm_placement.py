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

The twins are the controller's own: a job's other partitions are never touched, a job in a twin
but in no base partition (a user who chose spot) is left alone, and only jobs whose twins must
change are updated, grouped by their new partition list so that a tick costs a few ``scontrol``
commands, at most one per changed job. Jobs to protect go first, and at most ``most`` jobs change
per tick; the rest follow next tick, which only delays a job's use of spot.

**Holds.** A job moved off an on-prem node to make room there (``MovesJobsOff``) is kept off that
node through its ``ExcNodeList`` until the job it made room for has started there (or elsewhere,
or has left the queue), and at least until its last run's credential has expired there, or until
a bound has passed; then the list it had before is restored.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from autoscaler.model import Placement
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
    job: QueuedJob, placement: Placement, twins: Mapping[str, str]
) -> tuple[str, ...] | None:
    """The partitions a pending GPU job in a base partition should be in; None for a job placement
    leaves alone (running, CPU-only, or in no base partition)."""
    if not job.pending or not job.asks_gpus:
        return None
    bases = [p for p in job.partitions if p in twins]
    if not bases:
        return None
    if placement.allows_spot(job.checkpointable, job.high_priority):
        added = [twins[b] for b in bases]
        return tuple(dict.fromkeys([*job.partitions, *added]))
    spot = set(twins.values())
    return tuple(p for p in job.partitions if p not in spot)


def partition_plan(
    jobs: Iterable[QueuedJob],
    placement: Placement,
    twins: Mapping[str, str],
    most: int,
    skip: frozenset[str] = frozenset(),
) -> PartitionPlan:
    """The changed jobs, protected ones first, grouped by their new partition list; at most
    ``most`` jobs. Jobs in ``skip`` are left for the caller (it updates them another way)."""
    protect: dict[str, list[str]] = {}
    widen: dict[str, list[str]] = {}
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
            wanted = wanted_partitions(job, placement, twins)
            answer = None
            if wanted is not None and set(wanted) != set(job.partitions):
                into = widen if len(wanted) > len(set(job.partitions)) else protect
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
    done its work and only the restore is left, which waits while the job runs."""

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
