"""Act: turn a guarded plan into provider and scheduler calls, and record every outcome.

Launches walk the request's pools in order; a capacity or quota failure is remembered in the
capacity cache (so the next tick does not ask again) and the remaining GPUs move to the next
pool in the same tick. Each launch carries a request id unique to this controller incarnation,
tick and position, which providers use to make a repeated call a no-op.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping
from functools import partial

from autoscaler.fleet.capacity import CapacityCache, InterruptionHistory
from autoscaler.fleet.instances import InstanceRecord, InstanceTable
from autoscaler.model import (
    FleetView,
    InstanceState,
    InterruptionNotice,
    LaunchRequest,
    NoticeKind,
    Placement,
    PoolView,
)
from autoscaler.model.config import ControllerConfig
from autoscaler.model.errors import (
    AuthError,
    CallNotMade,
    CapacityError,
    InvalidRequest,
    ProviderError,
    QuotaError,
    QuotaScope,
    TransientError,
    describe,
)
from autoscaler.model.records import ActionRecord, LeadershipLost
from autoscaler.spi.provider import LaunchResult, Provider
from autoscaler.spi.sources import WorkloadScheduler
from autoscaler.tick.evacuate import Evacuator, JobMove, Move
from autoscaler.tick.guard import GuardedPlan, GuardMemory, launch_shape, node_slots
from autoscaler.tick.retry import RetryPolicy

log = logging.getLogger(__name__)

_DRAINABLE = (InstanceState.REQUESTED, InstanceState.PENDING, InstanceState.RUNNING)
INTERRUPTION_GRACE_S = 60.0


class Actuator:
    def __init__(
        self,
        config: ControllerConfig,
        providers: Mapping[str, Provider],
        table: InstanceTable,
        capacity: CapacityCache,
        history: InterruptionHistory,
        memory: GuardMemory,
        scheduler: WorkloadScheduler | None,
        incarnation: str,
        retry: RetryPolicy,
        evacuator: Evacuator | None = None,
    ) -> None:
        self.config = config
        self.providers = providers
        self.table = table
        self.capacity = capacity
        self.history = history
        self.memory = memory
        self.scheduler = scheduler
        self.incarnation = incarnation
        self.retry = retry
        self.evacuator = evacuator
        self._pools = {p.name: p for p in config.pools}
        self._scale_down_evacuations: set[str] = set()

    def act(self, view: FleetView, guarded: GuardedPlan) -> list[ActionRecord]:
        records: list[ActionRecord] = []
        self._apply_placement(guarded.plan.placement, records)
        interrupted: list[tuple[str, float]] = []
        at_risk: list[str] = []
        for notice in view.notices:
            if self._handle_notice(notice, view.now, records):
                deadline = notice.deadline if notice.deadline is not None else view.now
                interrupted.append((notice.instance_id, deadline))
            elif notice.kind is NoticeKind.REBALANCE:
                at_risk.append(notice.instance_id)
        self._drain_interrupted([node for node, _ in interrupted], records)
        self._evacuate(interrupted, at_risk, view.now, records)
        for drain in guarded.drains:
            record = self.table.get(drain.instance_id)
            if record is None or record.state not in _DRAINABLE:
                continue
            record.move(InstanceState.DRAINING, view.now, drain.reason)
            record.move_jobs = drain.move_jobs
            self.memory.last_scale_down[record.pool] = view.now
            records.append(
                ActionRecord(
                    "drain", record.pool, 1, 1, "ok", drain.reason, instance_ids=(record.id,)
                )
            )
        self._progress_drains(view, records)
        self._finish_interrupted(view.now, records)
        self._collect_orphans(view.now, records)
        failed_providers: set[str] = set()
        for index, launch in enumerate(guarded.launches):
            if guarded.allowance.fleet_full():
                guarded.allowance.note_skipped(guarded.launches[index:])
                break
            self._launch(view, guarded, launch, index, failed_providers, records)
        return records

    def _apply_placement(self, placement: Placement, records: list[ActionRecord]) -> None:
        if self.scheduler is None:
            return
        try:
            self.scheduler.apply_placement(placement)
        except Exception as exc:
            records.append(ActionRecord("placement", None, 1, 0, "error", describe(exc)))

    def _handle_notice(
        self, notice: InterruptionNotice, now: float, records: list[ActionRecord]
    ) -> bool:
        """True when the node is newly interrupted and its jobs must leave before the deadline."""
        record = self.table.get(notice.instance_id)
        if record is None or record.state in (
            InstanceState.INTERRUPTED,
            InstanceState.TERMINATING,
        ):
            return False
        if record.state is InstanceState.TERMINATED:
            if not any(state is InstanceState.TERMINATING for state, _, _ in record.history):
                # gone before we read the notice, and not by our hand: still an interruption
                self.history.record(record.pool, now)
                records.append(
                    ActionRecord(
                        "interruption",
                        record.pool,
                        1,
                        0,
                        "gone",
                        f"{notice.kind} notice for an instance already gone",
                        instance_ids=(record.id,),
                    )
                )
            return False
        if notice.kind is not NoticeKind.TERMINATE:
            records.append(
                ActionRecord(
                    "notice",
                    record.pool,
                    0,
                    0,
                    "noted",
                    f"{notice.kind} recommendation",
                    instance_ids=(record.id,),
                )
            )
            return False
        record.move(InstanceState.INTERRUPTED, now, f"{notice.kind} notice")
        record.interrupt_deadline = notice.deadline
        self.history.record(record.pool, now)
        deadline = notice.deadline if notice.deadline is not None else now
        detail = f"{notice.kind} notice, deadline in {deadline - now:.0f}s"
        records.append(
            ActionRecord("interruption", record.pool, 1, 1, "ok", detail, instance_ids=(record.id,))
        )
        return True

    def _drain_interrupted(self, nodes: list[str], records: list[ActionRecord]) -> None:
        """No new work on nodes the cloud is taking back, all of them before any job is asked to
        checkpoint; in one command per batch where the scheduler can."""
        if self.scheduler is None or not nodes:
            return
        reason = "spot interruption notice"
        drain_many = getattr(self.scheduler, "drain_many", None)
        failures: list[tuple[str, Exception]] = []
        if callable(drain_many):
            try:
                drain_many(nodes, reason)
            except Exception as batch_error:
                failures = [(node, batch_error) for node in nodes]
        else:
            for node in nodes:
                try:
                    self.scheduler.drain(node, reason)
                except Exception as exc:
                    failures.append((node, exc))
        for node, error in failures:
            record = self.table.get(node)
            records.append(
                ActionRecord(
                    "drain",
                    record.pool if record is not None else None,
                    1,
                    0,
                    "error",
                    f"draining an interrupted node failed: {describe(error)}",
                    instance_ids=(node,),
                )
            )

    def _evacuate(
        self,
        interrupted: list[tuple[str, float]],
        at_risk: list[str],
        now: float,
        records: list[ActionRecord],
    ) -> None:
        """Move the jobs off nodes the cloud is taking back, by what each can still save."""
        if self.evacuator is None:
            return
        moves: list[JobMove] = []
        try:
            if interrupted:
                moves += self.evacuator.interrupted(interrupted, now)
            if at_risk and self.config.interruptions.act_on_rebalance:
                moves += self._move_at_risk(self.evacuator, at_risk, now, records)
            moves += self.evacuator.progress(now)
        except Exception as exc:
            records.append(ActionRecord("evacuate", None, 1, 0, "error", describe(exc)))
        self._record_moves(moves, records)

    def _record_moves(self, moves: list[JobMove], records: list[ActionRecord]) -> None:
        for move in moves:
            record = self.table.get(move.node)
            records.append(
                ActionRecord(
                    "evacuate",
                    record.pool if record is not None else None,
                    1,
                    0 if move.move is Move.FAILED else 1,
                    str(move.move),
                    move.detail,
                    instance_ids=(move.node,),
                    job_id=move.job_id,
                    lost_gpu_s=move.lost_gpu_s,
                )
            )

    def _move_at_risk(
        self, evacuator: Evacuator, nodes: list[str], now: float, records: list[ActionRecord]
    ) -> list[JobMove]:
        """A node at elevated risk takes no new work and is let go once its jobs have moved."""
        moving = []
        for node in nodes:
            record = self.table.get(node)
            if record is None or record.state not in _DRAINABLE:
                continue
            record.move(InstanceState.DRAINING, now, "rebalance recommendation")
            moving.append(node)
            records.append(
                ActionRecord(
                    "drain",
                    record.pool,
                    1,
                    1,
                    "ok",
                    "rebalance recommendation",
                    instance_ids=(node,),
                )
            )
        return evacuator.at_risk(moving, now) if moving else []

    def _progress_drains(self, view: FleetView, records: list[ActionRecord]) -> None:
        usage = {n.instance_id: n for n in view.instances}
        to_terminate: list[InstanceRecord] = []
        for record in list(self.table.live()):
            if record.state is not InstanceState.DRAINING:
                continue
            node = usage.get(record.id)
            running = 0
            if self.scheduler is not None and node is not None and node.joined:
                try:
                    running = self.scheduler.drain(record.id, "scale-down")
                except Exception as exc:
                    records.append(
                        ActionRecord(
                            "drain",
                            record.pool,
                            1,
                            0,
                            "error",
                            describe(exc),
                            instance_ids=(record.id,),
                        )
                    )
                    continue
            started = record.drain_started_at if record.drain_started_at is not None else view.now
            moving = record.move_jobs and self.evacuator is not None
            if running and not moving and view.now - started < self.config.drain_timeout_s:
                continue
            if running and self._leaving_at_checkpoints(record.id, view.now, records):
                continue
            if running and self.scheduler is not None:
                try:
                    evicted = self.scheduler.evict(record.id, "drain timed out")
                except Exception as exc:
                    records.append(
                        ActionRecord(
                            "evict",
                            record.pool,
                            running,
                            0,
                            "error",
                            describe(exc),
                            instance_ids=(record.id,),
                        )
                    )
                    continue
                records.append(
                    ActionRecord(
                        "evict",
                        record.pool,
                        running,
                        evicted,
                        "ok",
                        "drain timed out",
                        instance_ids=(record.id,),
                    )
                )
            to_terminate.append(record)
        self._terminate(to_terminate, view.now, "drained", records)

    def _leaving_at_checkpoints(self, node: str, now: float, records: list[ActionRecord]) -> bool:
        """True while the jobs of a node being given back are leaving at a checkpoint. They are
        handed to the evacuator, which bounds the wait, when the drain times out, or at once when
        the plan asked for them to move; from then on the node waits while the evacuator waits
        on any of them, and for one tick after the hand-over, for its requeues to show."""
        wait_s = self.config.interruptions.drain_checkpoint_wait_s
        if self.evacuator is None:
            return False
        if node in self._scale_down_evacuations:
            return self.evacuator.busy(node)
        self._scale_down_evacuations.add(node)
        try:
            moves = self.evacuator.scale_down([node], now, wait_s)
        except Exception as exc:
            records.append(
                ActionRecord("evacuate", None, 1, 0, "error", describe(exc), instance_ids=(node,))
            )
            return False
        self._record_moves(moves, records)
        return True  # the scheduler shows the requeues by the next tick, which re-checks

    def _finish_interrupted(self, now: float, records: list[ActionRecord]) -> None:
        """An instance the cloud said it would take back and still lists well past the deadline
        is terminated by us: we never pay for capacity we have already written off."""
        overdue = [
            r
            for r in self.table.live()
            if r.state is InstanceState.INTERRUPTED
            and r.interrupt_deadline is not None
            and now > r.interrupt_deadline + INTERRUPTION_GRACE_S
        ]
        self._terminate(overdue, now, "interrupted and still running past its deadline", records)

    def _collect_orphans(self, now: float, records: list[ActionRecord]) -> None:
        orphans = [r for r in self.table.live() if r.pool not in self._pools]
        self._terminate(
            orphans, now, "collected: tagged ours but its pool is not configured", records
        )

    def _terminate(
        self, victims: list[InstanceRecord], now: float, why: str, records: list[ActionRecord]
    ) -> None:
        by_provider: dict[str, list[InstanceRecord]] = {}
        for record in victims:
            provider = record.provider
            if provider not in self.providers:
                records.append(
                    ActionRecord(
                        "terminate",
                        record.pool,
                        1,
                        0,
                        "error",
                        f"its provider {provider!r} is not configured",
                        instance_ids=(record.id,),
                    )
                )
                continue
            by_provider.setdefault(provider, []).append(record)
        for provider_name, group in by_provider.items():
            ids = [r.id for r in group]
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
            for record in group:
                record.move(InstanceState.TERMINATING, now, why)
                self._scale_down_evacuations.discard(record.id)
            for pool in sorted({r.pool for r in group}):
                pool_ids = tuple(r.id for r in group if r.pool == pool)
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

    def _launch(
        self,
        view: FleetView,
        guarded: GuardedPlan,
        launch: LaunchRequest,
        index: int,
        failed_providers: set[str],
        records: list[ActionRecord],
    ) -> None:
        """Walk the launch's pools in order until its nodes are bought. What is wanted is
        counted in nodes of the launch's shape, so a fallback of another size gets as many
        instances as hold the same nodes; the guard has already kept only pools that fit."""
        if launch.gang_size > 1:
            for gang in range(launch.count // launch.gang_size):
                self._launch_gang(view, guarded, launch, index, gang, failed_providers, records)
            return
        shape = launch_shape(launch, view)
        first = view.pool_by_name[launch.pool].pool
        slots_wanted = launch.count * node_slots(first, shape)
        previous: str | None = None
        for attempt, name in enumerate((launch.pool, *launch.fallbacks)):
            if slots_wanted <= 0:
                return
            pool_view = view.pool_by_name[name]
            pool = pool_view.pool
            fallback_from = previous
            previous = name
            if pool.provider in failed_providers:
                continue
            if not self.capacity.is_available(name, view.now):
                continue
            want = math.ceil(slots_wanted / node_slots(pool, shape))
            granted = guarded.allowance.admit_launch(pool_view, want)
            if granted == 0:
                continue
            request_id = f"{self.incarnation}-{view.tick}-{index}-{attempt}"
            provider = self.providers[pool.provider]
            launched = self._call_launch(
                partial(provider.launch, pool, granted, request_id, self.config.fleet_id),
                view,
                guarded,
                launch,
                pool_view,
                granted,
                request_id,
                fallback_from,
                failed_providers,
                records,
            )
            slots_wanted -= launched * node_slots(pool, shape)

    def _launch_gang(
        self,
        view: FleetView,
        guarded: GuardedPlan,
        launch: LaunchRequest,
        index: int,
        gang: int,
        failed_providers: set[str],
        records: list[ActionRecord],
    ) -> None:
        """One multi-node job's instances: all of them in one pool, placed together, or none
        there and the next pool tried. Admitted whole or not at all: a part of a gang hosts
        nothing."""
        size = launch.gang_size
        previous: str | None = None
        for attempt, name in enumerate((launch.pool, *launch.fallbacks)):
            pool_view = view.pool_by_name[name]
            pool = pool_view.pool
            fallback_from = previous
            previous = name
            if pool.provider in failed_providers:
                continue
            if not self.capacity.is_available(name, view.now):
                continue
            granted = guarded.allowance.admit_launch(pool_view, size)
            if granted < size:
                guarded.allowance.refund(pool_view, granted)
                continue
            request_id = f"{self.incarnation}-{view.tick}-{index}-g{gang}-{attempt}"
            provider = self.providers[pool.provider]
            # The watched wrapper always has launch_gang; whether the cloud behind it can is
            # the question, and a cloud that cannot is no reason to stop its other launches.
            inner = getattr(provider, "inner", provider)
            gang_launch = getattr(provider, "launch_gang", None)
            if not callable(gang_launch) or not callable(getattr(inner, "launch_gang", None)):
                guarded.allowance.refund(pool_view, granted)
                records.append(
                    ActionRecord(
                        "launch",
                        name,
                        size,
                        0,
                        "refused",
                        f"provider {pool.provider} cannot launch a multi-node job's nodes together",
                        request_id,
                        (),
                        fallback_from,
                    )
                )
                continue
            launched = self._call_launch(
                partial(gang_launch, pool, size, request_id, self.config.fleet_id),
                view,
                guarded,
                launch,
                pool_view,
                granted,
                request_id,
                fallback_from,
                failed_providers,
                records,
            )
            if launched:
                return

    def _call_launch(
        self,
        call: Callable[[], LaunchResult],
        view: FleetView,
        guarded: GuardedPlan,
        launch: LaunchRequest,
        pool_view: PoolView,
        granted: int,
        request_id: str,
        fallback_from: str | None,
        failed_providers: set[str],
        records: list[ActionRecord],
    ) -> int:
        """Make one launch call and record what came of it; returns the instances launched."""
        pool = pool_view.pool
        name = pool.name
        try:
            result = self.retry.call(call)
        except ProviderError as exc:
            guarded.allowance.refund(pool_view, granted)
            self._remember_failure(exc, name, view.now)
            if isinstance(exc, (AuthError, InvalidRequest)):
                failed_providers.add(pool.provider)
                log.error("launch in %s refused: %s", name, exc)
            records.append(
                ActionRecord(
                    "launch",
                    name,
                    granted,
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
            guarded.allowance.refund(pool_view, granted)
            if isinstance(exc, CallNotMade):
                log.error("%s", exc)
            else:
                log.exception("provider %s failed unexpectedly while launching", pool.provider)
            records.append(
                ActionRecord(
                    "launch",
                    name,
                    granted,
                    0,
                    "error",
                    describe(exc),
                    request_id,
                    (),
                    fallback_from,
                )
            )
            return 0
        launched = self._record_launch(result, granted, pool_view, guarded, view.now)
        if launched:
            self.memory.last_scale_up[name] = view.now
        outcome = (
            "ok" if launched >= granted else ("partial" if launched else _outcome(result.shortfall))
        )
        records.append(
            ActionRecord(
                "launch",
                name,
                granted,
                launched,
                outcome,
                describe(result.shortfall) if result.shortfall else launch.reason,
                request_id,
                tuple(i.id for i in result.instances),
                fallback_from,
            )
        )
        return launched

    def _record_launch(
        self,
        result: LaunchResult,
        granted: int,
        pool_view: PoolView,
        guarded: GuardedPlan,
        now: float,
    ) -> int:
        for instance in result.instances:
            self.table.record_launch(instance, pool_view.pool.provider, now)
        launched = len(result.instances)
        guarded.allowance.refund(pool_view, granted - launched)
        if result.shortfall is not None:
            self._remember_failure(result.shortfall, pool_view.pool.name, now)
        return launched

    def _remember_failure(self, error: ProviderError, pool: str, now: float) -> None:
        if isinstance(error, CapacityError):
            self.capacity.mark(pool, now, error.code)
        elif isinstance(error, QuotaError):
            for name in self._quota_pools(error.scope, pool):
                self.capacity.mark(name, now, error.code)

    def _quota_pools(self, scope: QuotaScope, pool_name: str) -> list[str]:
        pool = self._pools[pool_name]
        if scope is QuotaScope.PROVIDER:
            return [p.name for p in self.config.pools if p.provider == pool.provider]
        if scope is QuotaScope.REGION:
            return [
                p.name
                for p in self.config.pools
                if p.provider == pool.provider and p.region == pool.region
            ]
        return [pool_name]


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
