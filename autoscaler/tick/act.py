"""Act: carry out the guard's intents through providers and the scheduler, and report every
outcome. It decides nothing: which instances to drain, end or buy, and how many in which pool,
came from the policy, the rules and the guard. What happened goes back as records (for the
journal, metrics and logs) and as typed updates to the fleet memory's one writer.

Launches walk each intent's steps, each pool's grant as the guard made it. A capacity or quota
failure is reported (the fleet memory's capacity cache then skips the pool for a while), its
unbought room goes back to the guard's fallback room, and the unbought nodes move down the
chain in the same tick as far as that room admits them. Each launch carries a request id unique
to this controller incarnation, tick and position, which providers use to make a repeated call a
no-op.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping, Sequence
from functools import partial

from autoscaler.fleet.capacity import CapacityCache
from autoscaler.fleet.instances import Launched, Moved
from autoscaler.fleet.memory import FleetUpdate, PoolFailed, PoolInterrupted, ScaledDown, ScaledUp
from autoscaler.model import FleetView, InstanceState, LaunchRequest, Placement, PoolView
from autoscaler.model.config import ControllerConfig
from autoscaler.model.errors import (
    AuthError,
    CallNotMade,
    CapacityError,
    InvalidRequest,
    ProviderError,
    QuotaError,
    TransientError,
    describe,
)
from autoscaler.model.records import ActionRecord, LeadershipLost
from autoscaler.spi.provider import GangLauncher, LaunchResult, Provider
from autoscaler.spi.sources import BulkDrainer, WorkloadScheduler
from autoscaler.tick.evacuate import Evacuator, JobMove, Move
from autoscaler.tick.guard import fallbacks_for, launch_shape, node_slots
from autoscaler.tick.intents import (
    ContinueDrain,
    FallbackRoom,
    Intents,
    Interrupt,
    LaunchIntent,
    MoveJobs,
    Note,
    Terminate,
)
from autoscaler.tick.retry import RetryPolicy

log = logging.getLogger(__name__)

Report = Callable[[FleetUpdate], None]


class Actuator:
    def __init__(
        self,
        config: ControllerConfig,
        providers: Mapping[str, Provider],
        capacity: CapacityCache,
        scheduler: WorkloadScheduler | None,
        incarnation: str,
        retry: RetryPolicy,
        evacuator: Evacuator | None,
        report: Report,
    ) -> None:
        self.config = config
        self.providers = providers
        self.capacity = capacity
        self.scheduler = scheduler
        self.incarnation = incarnation
        self.retry = retry
        self.evacuator = evacuator
        self.report = report
        self._now = 0.0
        self._room: FallbackRoom = _NoRoom()

    def act(self, view: FleetView, intents: Intents) -> list[ActionRecord]:
        self._now = view.now
        self._room = intents.fallbacks or _NoRoom()
        records: list[ActionRecord] = []
        self._apply_placement(intents.plan.placement, records)
        interrupted: list[tuple[str, float]] = []
        for noticed in intents.notices:
            if isinstance(noticed, Note):
                self._note(noticed, records)
            else:
                self._interrupt(noticed, records)
                deadline = noticed.deadline if noticed.deadline is not None else view.now
                interrupted.append((noticed.instance_id, deadline))
        self._drain_interrupted([node for node, _ in interrupted], records)
        self._make_room(intents.moves, view, records)
        self._evacuate(interrupted, intents.at_risk, view, records)
        pools = {n.instance_id: n.pool for n in view.instances}
        for drain in intents.drains:
            pool = pools[drain.instance_id]
            self.report(
                Moved(
                    drain.instance_id, InstanceState.DRAINING, drain.reason, None, drain.move_jobs
                )
            )
            self.report(ScaledDown(pool))
            records.append(
                ActionRecord(
                    "drain", pool, 1, 1, "ok", drain.reason, instance_ids=(drain.instance_id,)
                )
            )
        drained = self._progress_drains(view, intents.continuing, records)
        self._terminate(drained, records)
        self._terminate(intents.terminations, records)
        failed_providers: set[str] = set()
        for intent in intents.launches:
            if intent.skipped is not None:
                continue
            if intent.request.gang_size > 1:
                self._launch_gangs(view, intent, failed_providers, records)
            else:
                self._launch(view, intent, failed_providers, records)
        return records

    def _apply_placement(self, placement: Placement, records: list[ActionRecord]) -> None:
        if self.scheduler is None:
            return
        try:
            self.scheduler.apply_placement(placement)
        except Exception as exc:
            records.append(ActionRecord("placement", None, 1, 0, "error", describe(exc)))

    def _note(self, note: Note, records: list[ActionRecord]) -> None:
        if note.interrupted:
            self.report(PoolInterrupted(note.pool))
        records.append(
            ActionRecord(
                note.kind,
                note.pool,
                1 if note.interrupted else 0,
                0,
                note.outcome,
                note.detail,
                instance_ids=(note.instance_id,),
            )
        )

    def _interrupt(self, interrupt: Interrupt, records: list[ActionRecord]) -> None:
        self.report(
            Moved(
                interrupt.instance_id,
                InstanceState.INTERRUPTED,
                interrupt.reason,
                deadline=interrupt.deadline,
            )
        )
        self.report(PoolInterrupted(interrupt.pool))
        records.append(
            ActionRecord(
                "interruption",
                interrupt.pool,
                1,
                1,
                "ok",
                interrupt.detail,
                instance_ids=(interrupt.instance_id,),
            )
        )

    def _drain_interrupted(self, nodes: list[str], records: list[ActionRecord]) -> None:
        """No new work on nodes the cloud is taking back, all of them before any job is asked to
        checkpoint; in one command per batch where the scheduler can."""
        scheduler = self.scheduler
        if scheduler is None or not nodes:
            return
        reason = "spot interruption notice"
        failures: list[tuple[str, Exception]] = []
        if isinstance(scheduler, BulkDrainer):
            try:
                scheduler.drain_many(nodes, reason)
            except Exception as batch_error:
                failures = [(node, batch_error) for node in nodes]
        else:
            for node in nodes:
                try:
                    scheduler.drain(node, reason)
                except Exception as exc:
                    failures.append((node, exc))
        for node, error in failures:
            records.append(
                ActionRecord(
                    "drain",
                    None,
                    1,
                    0,
                    "error",
                    f"draining an interrupted node failed: {describe(error)}",
                    instance_ids=(node,),
                )
            )

    def _make_room(
        self, moves: Sequence[MoveJobs], view: FleetView, records: list[ActionRecord]
    ) -> None:
        """Ask the jobs of each granted move to checkpoint; the evacuator moves them off their
        on-prem node once they report (``progress``). A move with a bound first binds the job
        it is for to every node freed for it (``move.nodes``)."""
        if self.evacuator is None:
            return
        for move in moves:
            try:
                done = self.evacuator.make_room(
                    move.node,
                    move.jobs,
                    move.for_job,
                    view.now,
                    {job: (instance, gpus) for job, instance, gpus in move.room},
                    move.by,
                    move.nodes,
                )
            except Exception as exc:
                records.append(ActionRecord("evacuate", None, 1, 0, "error", describe(exc)))
                continue
            self._record_moves(done, {}, records)

    def _evacuate(
        self,
        interrupted: list[tuple[str, float]],
        at_risk: Sequence[str],
        view: FleetView,
        records: list[ActionRecord],
    ) -> None:
        """Move the jobs off nodes the cloud is taking back, by what each can still save; a
        node at elevated risk takes no new work and is let go once its jobs have moved."""
        if self.evacuator is None:
            return
        pools = {n.instance_id: n.pool for n in view.instances}
        for node in at_risk:
            reason = "rebalance recommendation"
            self.report(Moved(node, InstanceState.DRAINING, reason))
            records.append(
                ActionRecord("drain", pools.get(node), 1, 1, "ok", reason, instance_ids=(node,))
            )
        moves: list[JobMove] = []
        try:
            if interrupted:
                moves += self.evacuator.interrupted(interrupted, view.now)
            if at_risk:
                moves += self.evacuator.at_risk(list(at_risk), view.now)
            moves += self.evacuator.progress(view.now)
        except Exception as exc:
            records.append(ActionRecord("evacuate", None, 1, 0, "error", describe(exc)))
        self._record_moves(moves, pools, records)

    def _record_moves(
        self, moves: list[JobMove], pools: Mapping[str, str], records: list[ActionRecord]
    ) -> None:
        for move in moves:
            records.append(
                ActionRecord(
                    "evacuate",
                    pools.get(move.node),
                    1,
                    0 if move.move is Move.FAILED else 1,
                    str(move.move),
                    move.detail,
                    instance_ids=(move.node,),
                    job_id=move.job_id,
                    lost_gpu_s=move.lost_gpu_s,
                )
            )

    def _progress_drains(
        self, view: FleetView, drains: Sequence[ContinueDrain], records: list[ActionRecord]
    ) -> list[Terminate]:
        """Keep each draining node closed; an empty one is let go, and one whose drain timed
        out (or whose jobs were asked to move) has its jobs moved at their checkpoints or
        evicted first. Returns the nodes to terminate."""
        usage = {n.instance_id: n for n in view.instances}
        done: list[Terminate] = []
        for drain in drains:
            node = usage.get(drain.instance_id)
            running = 0
            if self.scheduler is not None and node is not None and node.joined:
                try:
                    running = self.scheduler.drain(drain.instance_id, "scale-down")
                except Exception as exc:
                    records.append(
                        ActionRecord(
                            "drain",
                            drain.pool,
                            1,
                            0,
                            "error",
                            describe(exc),
                            instance_ids=(drain.instance_id,),
                        )
                    )
                    continue
            moving = drain.move_jobs and self.evacuator is not None
            if running and not moving and not drain.timed_out:
                continue
            if running and self._leaving_at_checkpoints(drain, view, records):
                continue
            if running and self.scheduler is not None:
                try:
                    evicted = self.scheduler.evict(drain.instance_id, "drain timed out")
                except Exception as exc:
                    records.append(
                        ActionRecord(
                            "evict",
                            drain.pool,
                            running,
                            0,
                            "error",
                            describe(exc),
                            instance_ids=(drain.instance_id,),
                        )
                    )
                    continue
                records.append(
                    ActionRecord(
                        "evict",
                        drain.pool,
                        running,
                        evicted,
                        "ok",
                        "drain timed out",
                        instance_ids=(drain.instance_id,),
                    )
                )
            done.append(Terminate(drain.instance_id, drain.provider, drain.pool, "drained"))
        return done

    def _leaving_at_checkpoints(
        self, drain: ContinueDrain, view: FleetView, records: list[ActionRecord]
    ) -> bool:
        """True while the jobs of a node being given back are leaving at a checkpoint. They are
        handed to the evacuator, which bounds the wait, when the drain times out, or at once when
        the plan asked for them to move; from then on the node waits while the evacuator waits
        on any of them, and for one tick after the hand-over, for its requeues to show."""
        evacuator = self.evacuator
        if evacuator is None:
            return False
        node = drain.instance_id
        if evacuator.handed_over(node):
            return evacuator.busy(node)
        wait_s = self.config.interruptions.drain_checkpoint_wait_s
        try:
            moves = evacuator.hand_over(node, view.now, wait_s)
        except Exception as exc:
            records.append(
                ActionRecord("evacuate", None, 1, 0, "error", describe(exc), instance_ids=(node,))
            )
            return False
        self._record_moves(moves, {node: drain.pool}, records)
        return True  # the scheduler shows the requeues by the next tick, which re-checks

    def _terminate(self, victims: Sequence[Terminate], records: list[ActionRecord]) -> None:
        """One call per provider and reason, in the order the reasons first come."""
        groups: dict[tuple[str, str], list[Terminate]] = {}
        for victim in victims:
            if victim.provider not in self.providers:
                records.append(
                    ActionRecord(
                        "terminate",
                        victim.pool,
                        1,
                        0,
                        "error",
                        f"its provider {victim.provider!r} is not configured",
                        instance_ids=(victim.instance_id,),
                    )
                )
                continue
            groups.setdefault((victim.reason, victim.provider), []).append(victim)
        for (why, provider_name), group in groups.items():
            ids = [v.instance_id for v in group]
            request_id = f"{self.incarnation}-term-{ids[0]}"
            try:
                self.retry.call(partial(self.providers[provider_name].terminate, ids, request_id))
            except LeadershipLost:
                raise
            except Exception as exc:
                records.append(
                    ActionRecord(
                        "terminate",
                        group[0].pool,
                        len(ids),
                        0,
                        "error",
                        describe(exc),
                        request_id,
                        tuple(ids),
                    )
                )
                continue
            for victim in group:
                self.report(Moved(victim.instance_id, InstanceState.TERMINATING, why))
                if self.evacuator is not None:
                    self.evacuator.release(victim.instance_id)
            for pool in sorted({v.pool for v in group}):
                pool_ids = tuple(v.instance_id for v in group if v.pool == pool)
                records.append(
                    ActionRecord(
                        "terminate",
                        pool,
                        len(pool_ids),
                        len(pool_ids),
                        "ok",
                        why,
                        request_id,
                        pool_ids,
                    )
                )

    def _usable(self, pool_view: PoolView, failed_providers: set[str]) -> bool:
        """A pool whose cloud refused us, or that ran out of capacity earlier this tick, is
        passed over: its grant moves to the next pool of the chain."""
        pool = pool_view.pool
        return pool.provider not in failed_providers and self.capacity.is_available(
            pool.name, self._now
        )

    def _launch(
        self,
        view: FleetView,
        intent: LaunchIntent,
        failed_providers: set[str],
        records: list[ActionRecord],
    ) -> None:
        """Walk the intent's steps until its nodes are bought. What is wanted is counted in
        nodes of the launch's shape, so a fallback of another size gets as many instances as
        hold the same nodes; the guard has already kept only pools that fit."""
        launch = intent.request
        shape = launch_shape(launch, view)
        first = view.pool_by_name[launch.pool].pool
        slots_wanted = launch.count * node_slots(first, shape)
        previous: str | None = None
        room = fallbacks_for(self._room, launch.team)
        missed = 0  # nodes granted to earlier steps that they did not buy
        for k, step in enumerate(intent.steps):
            if slots_wanted <= 0:
                return
            pool_view = view.pool_by_name[step.pool]
            pool = pool_view.pool
            fallback_from = previous
            previous = step.pool
            per = node_slots(pool, shape)
            if not self._usable(pool_view, failed_providers):
                room.refund(pool_view, step.granted)
                missed += step.granted * per
                continue
            want = math.ceil(slots_wanted / per)
            count = min(want, step.granted)
            if k and missed > 0 and want > count:
                count += room.admit_launch(pool_view, min(want - count, math.ceil(missed / per)))
            if count <= 0:
                continue
            request_id = f"{self.incarnation}-{view.tick}-{intent.index}-{step.position}"
            provider = self.providers[pool.provider]
            launched = self._call_launch(
                _for_team(
                    partial(provider.launch, pool, count, request_id, self.config.fleet_id), launch
                ),
                pool_view,
                count,
                launch.reason,
                request_id,
                fallback_from,
                failed_providers,
                records,
                launch.team,
            )
            room.refund(pool_view, count - launched)
            slots_wanted -= launched * per
            covered = max(0, launched - step.granted) * per
            missed = max(0, missed - covered) + max(0, min(count, step.granted) - launched) * per

    def _launch_gangs(
        self,
        view: FleetView,
        intent: LaunchIntent,
        failed_providers: set[str],
        records: list[ActionRecord],
    ) -> None:
        """Each multi-node job's instances: all of them in one pool, placed together, or none
        there and the next pool of its chain tried. A part of a gang hosts nothing."""
        launch = intent.request
        size = launch.gang_size
        room = fallbacks_for(self._room, launch.team)
        for gang, steps in enumerate(intent.gangs):
            previous: str | None = None
            failed = False  # the gang's granted pool fell through: later pools may take it
            for step in steps:
                pool_view = view.pool_by_name[step.pool]
                pool = pool_view.pool
                fallback_from = previous
                previous = step.pool
                granted = step.granted
                if not self._usable(pool_view, failed_providers):
                    room.refund(pool_view, granted)
                    failed = failed or granted > 0
                    continue
                if not granted and failed:
                    granted = room.admit_launch(pool_view, size)
                    if granted < size:
                        room.refund(pool_view, granted)
                        granted = 0
                if granted < size:
                    continue
                request_id = (
                    f"{self.incarnation}-{view.tick}-{intent.index}-g{gang}-{step.position}"
                )
                provider = self.providers[pool.provider]
                if not isinstance(provider, GangLauncher):
                    room.refund(pool_view, granted)
                    failed = True
                    records.append(
                        ActionRecord(
                            "launch",
                            step.pool,
                            size,
                            0,
                            "refused",
                            f"provider {pool.provider} cannot launch a multi-node job's nodes "
                            "together",
                            request_id,
                            (),
                            fallback_from,
                        )
                    )
                    continue
                launched = self._call_launch(
                    _for_team(
                        partial(provider.launch_gang, pool, size, request_id, self.config.fleet_id),
                        launch,
                    ),
                    pool_view,
                    size,
                    launch.reason,
                    request_id,
                    fallback_from,
                    failed_providers,
                    records,
                    launch.team,
                )
                room.refund(pool_view, size - launched)
                if launched:
                    break
                failed = True

    def _call_launch(
        self,
        call: Callable[[], LaunchResult],
        pool_view: PoolView,
        count: int,
        reason: str,
        request_id: str,
        fallback_from: str | None,
        failed_providers: set[str],
        records: list[ActionRecord],
        team: str | None = None,
    ) -> int:
        """Make one launch call and record what came of it; returns the instances launched.
        The table remembers whom each instance was bought for (``team``)."""
        pool = pool_view.pool
        name = pool.name
        try:
            result = self.retry.call(call)
        except ProviderError as exc:
            self._failed(exc, name)
            if isinstance(exc, (AuthError, InvalidRequest)):
                failed_providers.add(pool.provider)
                log.error("launch in %s refused: %s", name, exc)
            records.append(
                ActionRecord(
                    "launch",
                    name,
                    count,
                    0,
                    _outcome(exc),
                    describe(exc),
                    request_id,
                    (),
                    fallback_from,
                )
            )
            return 0
        except LeadershipLost:
            raise
        except Exception as exc:
            if isinstance(exc, CallNotMade):
                log.error("%s", exc)
            else:
                log.exception("provider %s failed unexpectedly while launching", pool.provider)
            records.append(
                ActionRecord(
                    "launch",
                    name,
                    count,
                    0,
                    "error",
                    describe(exc),
                    request_id,
                    (),
                    fallback_from,
                )
            )
            return 0
        for instance in result.instances:
            self.report(Launched(instance, pool.provider, team=team))
        launched = len(result.instances)
        if result.shortfall is not None:
            self._failed(result.shortfall, name)
        if launched:
            self.report(ScaledUp(name))
        outcome = (
            "ok" if launched >= count else ("partial" if launched else _outcome(result.shortfall))
        )
        records.append(
            ActionRecord(
                "launch",
                name,
                count,
                launched,
                outcome,
                describe(result.shortfall) if result.shortfall else reason,
                request_id,
                tuple(i.id for i in result.instances),
                fallback_from,
            )
        )
        return launched

    def _failed(self, error: ProviderError, pool: str) -> None:
        if isinstance(error, CapacityError):
            self.report(PoolFailed(pool, error.code))
        elif isinstance(error, QuotaError):
            self.report(PoolFailed(pool, error.code, error.scope))


class _NoRoom:
    """Intents made without a guard's room left (built by hand): nothing moves down a chain."""

    def admit_launch(self, pool_view: PoolView, count: int) -> int:
        return 0

    def refund(self, pool_view: PoolView, count: int) -> None:
        return None


def _for_team(
    call: Callable[..., LaunchResult], launch: LaunchRequest
) -> Callable[[], LaunchResult]:
    """The launch call, naming the launch's team when it has one so the provider tags its
    instances with it (a provider written before teams is never handed one it cannot take)."""
    return call if launch.team is None else partial(call, team=launch.team)


def _outcome(error: ProviderError | None) -> str:
    if isinstance(error, CapacityError):
        return "capacity"
    if isinstance(error, QuotaError):
        return "quota"
    if isinstance(error, TransientError):
        return "throttled"
    if isinstance(error, (AuthError, InvalidRequest)):
        return "refused"
    return "error"
