"""Evacuating a node the cloud is taking back, one job at a time, by what each job can save.

On a termination notice every job on the node is weighed against the deadline: a job that can
be asked to checkpoint (it traps a signal) and whose expected checkpoint time, plus a margin,
fits before the deadline is signalled now and requeued as soon as it reports the checkpoint, or
at the deadline if no report comes; any other job is requeued at once from its last checkpoint,
because waiting would only lose more. The work lost is what ran since the checkpoint the job
resumes from, in GPU-seconds.

On a rebalance recommendation (AWS's "elevated risk", opt-in), jobs whose checkpoint is fresh
move at once and the others move as soon as they next report a checkpoint, before any warning.

To make room on an on-prem node (``Placement.rebalance_onprem``), each job chosen is asked to
checkpoint and, once it reports (or its wait is over), moved off the node through the
scheduler's ``MovesJobsOff.move_off``, which requeues it and keeps it off that node until the
job it made room for has started. A move that keeps a promise within a bound (reclaim,
preemption) first binds that job to the nodes being freed for it (``MovesJobsOff.bind``), before
any job is asked to checkpoint, so that room coming free before the last mover has left is not
taken by other work.

On a scale-down whose drain outlived its jobs' welcome, each job leaves at whichever checkpoint
comes first within a bounded wait, its next natural one or one asked for now, instead of being
killed just before it would have saved; a job with neither in reach leaves at once.

Signals and requeues of many nodes go out in parallel (a zone-wide reclaim is hundreds of nodes
in one tick); the run loop is woken by each checkpoint report and at the next wait's end, so a
waiting job is requeued within moments of either.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from enum import StrEnum

from autoscaler.fleet.checkpoints import CheckpointLedger
from autoscaler.model.errors import describe
from autoscaler.spi.sources import CheckpointingScheduler, JobsByNode, MovesJobsOff, RunningJob

log = logging.getLogger(__name__)


class Move(StrEnum):
    CHECKPOINT_ASKED = "checkpoint-asked"
    REQUEUED = "requeued"
    REQUEUED_AFTER_CHECKPOINT = "requeued-after-checkpoint"
    REQUEUED_AT_DEADLINE = "requeued-at-deadline"
    MOVED_OFF = "moved-off"
    CHECKPOINT_AWAITED = "checkpoint-awaited"
    FAILED = "failed"


@dataclass(frozen=True)
class JobMove:
    """What happened to one job; ``lost_gpu_s`` is set once the job has left the node."""

    job_id: str
    node: str
    move: Move
    lost_gpu_s: float | None = None
    detail: str = ""


@dataclass(frozen=True)
class EvacuationSettings:
    checkpoint_margin_s: float = 10.0
    requeue_lead_s: float = 5.0
    fresh_checkpoint_s: float = 300.0
    concurrency: int = 32


@dataclass
class _Waiting:
    job: RunningJob
    since: float
    resume_from: float
    requeue_by: float
    for_job: str | None = None  # moved off its node for this pending job, not just requeued
    room: tuple[str, int] | None = None  # the cloud instance and GPUs held for it meanwhile


@dataclass
class _Evacuation:
    node: str
    deadline: float | None
    waiting: dict[str, _Waiting] = field(default_factory=dict)


class Evacuator:
    def __init__(
        self,
        scheduler: CheckpointingScheduler,
        ledger: CheckpointLedger,
        settings: EvacuationSettings | None = None,
    ) -> None:
        self.scheduler = scheduler
        self.ledger = ledger
        self.settings = settings or EvacuationSettings()
        self.mover = scheduler if isinstance(scheduler, MovesJobsOff) else None
        self._nodes: dict[str, _Evacuation] = {}
        self._handed: set[str] = set()
        # the bindings asked for at the tick of this time, so that the k moves of a multi-node
        # job's room bind it once (binding is idempotent; this only saves scheduler calls)
        self._bound_at: tuple[float, set[tuple[str, tuple[str, ...]]]] = (float("nan"), set())
        self._pool = ThreadPoolExecutor(self.settings.concurrency, thread_name_prefix="evacuate")

    def interrupted(self, nodes: Sequence[tuple[str, float]], now: float) -> list[JobMove]:
        """Nodes with a termination notice and their deadlines."""
        jobs = running_jobs_on(self.scheduler, [node for node, _ in nodes])
        calls: list[tuple[Callable[[], None], JobMove]] = []
        for node, deadline in nodes:
            evacuation = self._nodes.setdefault(node, _Evacuation(node, deadline))
            evacuation.deadline = deadline
            for job in jobs.get(node, ()):
                if job.id in evacuation.waiting:
                    continue
                resume_from = self.ledger.resume_point(job.id, job.started_at)
                expected = self.ledger.expected_duration(job.id, job.checkpoint_duration_s)
                requeue_by = deadline - self.settings.requeue_lead_s
                fits = (
                    job.checkpoint_signal is not None
                    and expected is not None
                    and now + expected + self.settings.checkpoint_margin_s <= requeue_by
                )
                if fits and job.checkpoint_signal is not None:
                    evacuation.waiting[job.id] = _Waiting(job, now, resume_from, requeue_by)
                    calls.append(
                        (
                            _bind(self.scheduler.signal, job.id, job.checkpoint_signal),
                            JobMove(
                                job.id,
                                node,
                                Move.CHECKPOINT_ASKED,
                                detail=f"checkpoint expected to take {expected:.0f}s, "
                                f"{deadline - now:.0f}s to the deadline",
                            ),
                        )
                    )
                else:
                    why = (
                        "it cannot be asked to checkpoint"
                        if job.checkpoint_signal is None or expected is None
                        else f"a {expected:.0f}s checkpoint does not fit in {deadline - now:.0f}s"
                    )
                    calls.append(self._requeue(job, now, resume_from, Move.REQUEUED, why))
        return self._ask(calls, now)

    def make_room(
        self,
        node: str,
        jobs: Sequence[RunningJob],
        for_job: str,
        now: float,
        room: Mapping[str, tuple[str, int]] | None = None,
        by: float | None = None,
        nodes: Sequence[str] = (),
    ) -> list[JobMove]:
        """Move ``jobs`` off the on-prem ``node`` for the pending ``for_job``: each is asked to
        checkpoint and moved once it reports, or once its checkpoint's expected time (the wait
        for a report when none is known) and the margin are over. ``room`` (by job id: a cloud
        instance and GPUs) is held for each job until then (``reserved``). With ``by`` (a
        reclaimed guarantee's bound) every job is gone by then: one that cannot checkpoint, or
        whose checkpoint would not end by then, is moved off at once from its last checkpoint;
        without it such a job is left where it is.

        Only a move with ``by`` binds ``for_job``, to ``nodes`` (every node freed for it this
        tick, ``MoveJobs.nodes``; ``node`` alone when empty), and does so before any job is
        signalled: a promise is kept there from the moment it is made, while a rebalancing's
        job may start wherever room comes free first. A binding the scheduler refuses (the job
        started or left meanwhile) moves nothing: the room would be for nobody."""
        if self.mover is None:
            return [
                JobMove(j.id, node, Move.FAILED, None, "the scheduler cannot move jobs")
                for j in jobs
            ]
        if by is not None:
            refused = self._bind_owner(for_job, tuple(nodes) or (node,), now)
            if refused is not None:
                return [
                    JobMove(
                        j.id,
                        node,
                        Move.FAILED,
                        None,
                        f"not moved for job {for_job}: binding it failed: {refused}",
                    )
                    for j in jobs
                ]
        evacuation = self._nodes.setdefault(node, _Evacuation(node, None))
        calls: list[tuple[Callable[[], None], JobMove]] = []
        for job in jobs:
            if job.id in evacuation.waiting or (job.checkpoint_signal is None and by is None):
                continue
            resume_from = self.ledger.resume_point(job.id, job.started_at)
            expected = self.ledger.expected_duration(job.id, job.checkpoint_duration_s)
            wait = (
                expected + self.settings.checkpoint_margin_s
                if expected is not None
                else self.settings.fresh_checkpoint_s
            )
            waiting = _Waiting(job, now, resume_from, now + wait, for_job, (room or {}).get(job.id))
            if job.checkpoint_signal is None or (by is not None and now + wait > by):
                why = (
                    "it cannot checkpoint"
                    if job.checkpoint_signal is None
                    else f"a {wait:.0f}s checkpoint does not end by the bound"
                )
                calls.append(self._leave(waiting, now, resume_from, Move.REQUEUED, why))
                continue
            evacuation.waiting[job.id] = waiting
            calls.append(
                (
                    _bind(self.scheduler.signal, job.id, job.checkpoint_signal),
                    JobMove(
                        job.id,
                        node,
                        Move.CHECKPOINT_ASKED,
                        detail=f"to make room for job {for_job}; moved once it reports or in "
                        f"{wait:.0f}s",
                    ),
                )
            )
        return self._ask(calls, now)

    def _bind_owner(self, for_job: str, nodes: tuple[str, ...], now: float) -> str | None:
        """Bind ``for_job`` to ``nodes`` unless this tick already did; why it failed, if it
        did (nothing is remembered then, so a later move asks again)."""
        assert self.mover is not None
        at, done = self._bound_at
        if at != now:
            done = set()
            self._bound_at = (now, done)
        if (for_job, nodes) in done:
            return None
        try:
            self.mover.bind(for_job, nodes)
        except Exception as exc:
            log.info("evacuate: binding job %s to %s failed: %s", for_job, nodes, describe(exc))
            return describe(exc)
        done.add((for_job, nodes))
        return None

    def at_risk(self, nodes: Sequence[str], now: float) -> list[JobMove]:
        """Nodes the cloud says are at elevated risk: move what has just saved, and the rest as
        soon as it next saves; the node is not waited on past that."""
        calls: list[tuple[Callable[[], None], JobMove]] = []
        for evacuation, job in self._jobs_to_move(nodes):
            last = self.ledger.last(job.id)
            if last is not None and now - last <= self.settings.fresh_checkpoint_s:
                calls.append(
                    self._requeue(
                        job, now, last, Move.REQUEUED, "rebalance: its checkpoint is fresh"
                    )
                )
            elif job.checkpoint_signal is not None:
                resume_from = self.ledger.resume_point(job.id, job.started_at)
                evacuation.waiting[job.id] = _Waiting(job, now, resume_from, float("inf"))
        return self._run(calls)

    def scale_down(self, nodes: Sequence[str], now: float, wait_s: float) -> list[JobMove]:
        """Nodes the plan gives back whose jobs are still there when the drain times out."""
        margin = self.settings.checkpoint_margin_s
        moves: list[JobMove] = []
        calls: list[tuple[Callable[[], None], JobMove]] = []
        for evacuation, job in self._jobs_to_move(nodes):
            node = evacuation.node
            resume_from = self.ledger.resume_point(job.id, job.started_at)
            expected = self.ledger.expected_duration(job.id, job.checkpoint_duration_s)
            natural: float | None = None
            if job.checkpoint_interval_s is not None:
                natural = resume_from + job.checkpoint_interval_s + (expected or 0.0)
                if natural <= now:
                    natural = None  # overdue and unreported: not to be counted on
            asked = (
                now + expected
                if job.checkpoint_signal is not None and expected is not None
                else None
            )
            in_reach = [t for t in (natural, asked) if t is not None and t + margin <= now + wait_s]
            if now - resume_from <= margin or not in_reach:
                why = (
                    "it saved or started moments ago"
                    if now - resume_from <= margin
                    else f"no checkpoint of its comes within {wait_s:.0f}s"
                )
                calls.append(
                    self._requeue(job, now, resume_from, Move.REQUEUED, f"scale-down: {why}")
                )
                continue
            ready = min(in_reach)
            evacuation.waiting[job.id] = _Waiting(job, now, resume_from, ready + margin)
            if asked is not None and (natural is None or asked < natural):
                calls.append(
                    (
                        _bind(self.scheduler.signal, job.id, job.checkpoint_signal or ""),
                        JobMove(
                            job.id,
                            node,
                            Move.CHECKPOINT_ASKED,
                            detail=f"scale-down: a checkpoint now ({expected:.0f}s) comes "
                            "before its next one",
                        ),
                    )
                )
            else:
                moves.append(
                    JobMove(
                        job.id,
                        node,
                        Move.CHECKPOINT_AWAITED,
                        detail=f"scale-down: its next checkpoint is due in {ready - now:.0f}s",
                    )
                )
        return moves + self._ask(calls, now)

    def _jobs_to_move(self, nodes: Sequence[str]) -> Iterator[tuple[_Evacuation, RunningJob]]:
        """Each job on these nodes that is not already being waited on, with its node's
        evacuation (opened when new)."""
        jobs = running_jobs_on(self.scheduler, nodes)
        for node in nodes:
            evacuation = self._nodes.setdefault(node, _Evacuation(node, None))
            for job in jobs.get(node, ()):
                if job.id not in evacuation.waiting:
                    yield evacuation, job

    def handed_over(self, node: str) -> bool:
        """Whether a drained node's jobs were handed over (``hand_over``) and not released."""
        return node in self._handed

    def hand_over(self, node: str, now: float, wait_s: float) -> list[JobMove]:
        """A drained node's jobs, from now on moved at their checkpoints (``scale_down``)."""
        self._handed.add(node)
        return self.scale_down([node], now, wait_s)

    def release(self, node: str) -> None:
        """The node is gone: nothing more to wait on there."""
        self._handed.discard(node)

    def busy(self, node: str) -> bool:
        """Whether jobs on ``node`` are still being waited on."""
        evacuation = self._nodes.get(node)
        return evacuation is not None and bool(evacuation.waiting)

    def progress(self, now: float) -> list[JobMove]:
        """Requeue the jobs that have reported their checkpoint, and those whose wait is over."""
        calls: list[tuple[Callable[[], None], JobMove]] = []
        for evacuation in list(self._nodes.values()):
            for job_id, waiting in list(evacuation.waiting.items()):
                last = self.ledger.last(job_id)
                if last is not None and last > waiting.resume_from:
                    del evacuation.waiting[job_id]
                    calls.append(
                        self._leave(
                            waiting,
                            now,
                            last,
                            Move.REQUEUED_AFTER_CHECKPOINT,
                            f"checkpointed {last - waiting.since:.1f}s after the request",
                        )
                    )
                elif now >= waiting.requeue_by:
                    del evacuation.waiting[job_id]
                    calls.append(
                        self._leave(
                            waiting,
                            now,
                            waiting.resume_from,
                            Move.REQUEUED_AT_DEADLINE,
                            "no checkpoint reported before the deadline",
                        )
                    )
            if not evacuation.waiting:
                del self._nodes[evacuation.node]
        return self._run(calls)

    def next_due(self) -> float | None:
        """When the next wait ends, so the run loop can wake for it."""
        dues = [w.requeue_by for e in self._nodes.values() for w in e.waiting.values()]
        finite = [d for d in dues if d != float("inf")]
        return min(finite) if finite else None

    def waiting(self) -> set[str]:
        return {job for e in self._nodes.values() for job in e.waiting}

    def reserved(self) -> dict[str, int]:
        """Cloud GPUs held, by instance, for jobs being moved off on-prem nodes that have not
        moved yet: room the rule found for them, which nothing else may count on meanwhile."""
        held: dict[str, int] = {}
        for evacuation in self._nodes.values():
            for waiting in evacuation.waiting.values():
                if waiting.room is not None:
                    instance, gpus = waiting.room
                    held[instance] = held.get(instance, 0) + gpus
        return held

    def making_room_for(self) -> set[str]:
        """The pending jobs for which jobs are being moved off on-prem nodes (still waiting on
        their checkpoints)."""
        return {w.for_job for e in self._nodes.values() for w in e.waiting.values() if w.for_job}

    def forget(self, nodes: Iterable[str]) -> None:
        for node in nodes:
            self._nodes.pop(node, None)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _ask(self, calls: list[tuple[Callable[[], None], JobMove]], now: float) -> list[JobMove]:
        """Send the signals and requeues; a job whose signal failed is requeued at once (one
        that was only to make room stays where it is: moving it would lose its work)."""
        moves = self._run(calls)
        retries = []
        for move in moves:
            if move.move is Move.FAILED and move.detail.startswith(Move.CHECKPOINT_ASKED):
                waiting = self._nodes[move.node].waiting.pop(move.job_id)
                if waiting.for_job is not None:
                    continue
                retries.append(
                    self._requeue(
                        waiting.job, now, waiting.resume_from, Move.REQUEUED, "the signal failed"
                    )
                )
        return moves + self._run(retries)

    def _leave(
        self, waiting: _Waiting, now: float, resume_from: float, move: Move, why: str
    ) -> tuple[Callable[[], None], JobMove]:
        """A waited-on job leaves its node: requeued, or moved off it for a pending job."""
        if waiting.for_job is None or self.mover is None:
            return self._requeue(waiting.job, now, resume_from, move, why)
        job = waiting.job
        return (
            functools.partial(self.mover.move_off, job.id, job.node, waiting.for_job),
            JobMove(
                job.id,
                job.node,
                Move.MOVED_OFF,
                job.gpus * max(0.0, now - resume_from),
                f"for job {waiting.for_job}: {why}",
            ),
        )

    def _requeue(
        self, job: RunningJob, now: float, resume_from: float, move: Move, why: str
    ) -> tuple[Callable[[], None], JobMove]:
        lost = job.gpus * max(0.0, now - resume_from)
        return (
            _bind(self.scheduler.requeue, job.id),
            JobMove(job.id, job.node, move, lost, why),
        )

    def _run(self, calls: list[tuple[Callable[[], None], JobMove]]) -> list[JobMove]:
        if not calls:
            return []
        outcomes = list(self._pool.map(_attempt, calls))
        for move in outcomes:
            log.info("evacuate %s on %s: %s (%s)", move.job_id, move.node, move.move, move.detail)
        return outcomes


def running_jobs_on(
    scheduler: CheckpointingScheduler, nodes: Sequence[str]
) -> dict[str, Sequence[RunningJob]]:
    """The jobs on each node, in one listing where the scheduler can list every node at once."""
    if not nodes:
        return {}
    if len(nodes) > 1 and isinstance(scheduler, JobsByNode):
        every = scheduler.running_jobs_by_node()
        return {node: every.get(node, ()) for node in nodes}
    return {node: scheduler.running_jobs(node) for node in nodes}


def _bind(function: Callable[..., None], *args: str) -> Callable[[], None]:
    return lambda: function(*args)


def _attempt(call: tuple[Callable[[], None], JobMove]) -> JobMove:
    action, move = call
    try:
        action()
    except Exception as exc:
        return JobMove(
            move.job_id, move.node, Move.FAILED, None, f"{move.move} failed: {describe(exc)}"
        )
    return move
