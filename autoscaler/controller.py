"""The reconcile loop: every tick is observe → decide → guard → act, and nothing else.

The controller owns the state that must outlive a tick (instance table, capacity cache,
interruption history, cool-down memory, last plan) and wires the four steps together; each step
lives in its own module. A policy that raises, or returns a plan the guard rejects, holds the
fleet as it is for that tick and says why; interruption notices and drains already under way are
still handled, because they are not the policy's to decide.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from autoscaler.act import ActionRecord, Actuator
from autoscaler.capacity import CapacityCache, InterruptionHistory
from autoscaler.checkpoints import CheckpointLedger
from autoscaler.clock import Clock
from autoscaler.config import ControllerConfig
from autoscaler.errors import InputError, describe
from autoscaler.evacuate import EvacuationSettings, Evacuator
from autoscaler.guard import Clamp, GuardMemory, guard, validate_plan
from autoscaler.lifecycle import InstanceTable
from autoscaler.metrics import Metrics
from autoscaler.model import FleetView, InterruptionNotice, Plan
from autoscaler.observe import Observation, Observer, Signals
from autoscaler.policy import Policy
from autoscaler.provider import Provider
from autoscaler.retry import RetryPolicy
from autoscaler.sources import (
    CheckpointingScheduler,
    NodeSource,
    QueueSource,
    WorkloadScheduler,
)

log = logging.getLogger(__name__)


@dataclass
class TickReport:
    tick: int
    now: float
    view: FleetView
    plan: Plan
    held: str | None
    clamps: list[Clamp]
    actions: list[ActionRecord]
    errors: list[str] = field(default_factory=list)
    duration_s: float = 0.0


class Controller:
    def __init__(
        self,
        config: ControllerConfig,
        policy: Policy,
        providers: Mapping[str, Provider],
        clock: Clock,
        queue_sources: Sequence[QueueSource] = (),
        node_source: NodeSource | None = None,
        scheduler: WorkloadScheduler | None = None,
        incarnation: str | None = None,
        retry: RetryPolicy | None = None,
        timer: Callable[[], float] = time.perf_counter,
        signals: Signals | None = None,
        metrics: Metrics | None = None,
        checkpoints: CheckpointLedger | None = None,
    ) -> None:
        missing = sorted({p.provider for p in config.pools} - set(providers))
        if missing:
            raise InputError(
                "config",
                f"pools use provider(s) {', '.join(missing)}, which are not configured",
                field="pools",
            )
        self.config = config
        self.providers = providers
        self.policy = policy
        self.clock = clock
        self.timer = timer
        self.table = InstanceTable(request_timeout_s=config.request_timeout_s)
        self.capacity = CapacityCache(config.capacity_cache_ttl_s)
        self.history = InterruptionHistory(config.risky_pool_ttl_s)
        self.memory = GuardMemory()
        self.signals = signals or Signals(queues=tuple(queue_sources), nodes=node_source)
        self.metrics = metrics
        self.checkpoints = checkpoints if checkpoints is not None else CheckpointLedger()
        checkpointing = (
            scheduler
            if isinstance(scheduler, CheckpointingScheduler)
            and config.interruptions.checkpoint_aware
            else None
        )
        self.observer = Observer(
            config,
            providers,
            self.signals,
            self.table,
            self.capacity,
            self.history,
            checkpointing,
            self.checkpoints,
        )
        self.evacuator = (
            Evacuator(
                checkpointing,
                self.checkpoints,
                EvacuationSettings(
                    checkpoint_margin_s=config.interruptions.checkpoint_margin_s,
                    requeue_lead_s=config.interruptions.requeue_lead_s,
                    fresh_checkpoint_s=config.interruptions.fresh_checkpoint_s,
                ),
            )
            if checkpointing is not None
            else None
        )
        self.actuator = Actuator(
            config,
            providers,
            self.table,
            self.capacity,
            self.history,
            self.memory,
            scheduler,
            incarnation or uuid.uuid4().hex[:12],
            retry or RetryPolicy(),
            self.evacuator,
        )
        self.last_plan: Plan | None = None
        self._tick = 0

    @property
    def ticks(self) -> int:
        return self._tick

    def next_due(self) -> float | None:
        """When something in flight needs a tick before the regular one (a job's checkpoint
        wait ending before the node's deadline)."""
        return self.evacuator.next_due() if self.evacuator is not None else None

    def tick(self) -> TickReport:
        started = self.timer()
        now = self.clock.now()
        number = self._tick
        self._tick += 1
        observation = self.observer.observe(now, number, self.last_plan)
        view = observation.view
        plan, held = self._decide(view)
        guarded = guard(plan, view, self.config.limits, self.memory)
        actions = self.actuator.act(view, guarded)
        self._acknowledge(observation.polled, observation.errors)
        if held is None:
            self.last_plan = plan
        else:
            log.warning("tick %d held: %s", number, held)
        report = TickReport(
            tick=number,
            now=now,
            view=view,
            plan=plan,
            held=held,
            clamps=guarded.clamps,
            actions=actions,
            errors=observation.errors,
            duration_s=self.timer() - started,
        )
        if self.metrics is not None:
            self._record(self.metrics, observation, report)
        return report

    @staticmethod
    def _record(metrics: Metrics, observation: Observation, report: TickReport) -> None:
        for (kind, name), up in observation.source_status.items():
            metrics.source_up.labels(kind, name).set(1 if up else 0)
            if not up:
                metrics.source_errors.labels(kind, name).inc()
        demand = report.view.demand
        metrics.demand_known.set(1 if demand.known else 0)
        metrics.pending_gpus.set(sum(g.gpus_per_job * g.jobs for g in demand.groups))
        for action in report.actions:
            if action.kind == "evacuate":
                metrics.evacuations.labels(action.outcome).inc()
                if action.lost_gpu_s:
                    metrics.work_lost.inc(action.lost_gpu_s)
        outcome = "held" if report.held else ("degraded" if report.errors else "ok")
        metrics.ticks.labels(outcome).inc()
        metrics.tick_seconds.observe(report.duration_s)

    def _acknowledge(self, polled: dict[str, list[InterruptionNotice]], errors: list[str]) -> None:
        for name, notices in polled.items():
            if not notices:
                continue
            try:
                self.providers[name].acknowledge(notices)
            except Exception as exc:
                errors.append(f"provider {name}: acknowledging notices failed: {describe(exc)}")

    def _decide(self, view: FleetView) -> tuple[Plan, str | None]:
        try:
            return validate_plan(self.policy.decide(view), view), None
        except Exception as exc:
            placement = self.last_plan.placement if self.last_plan is not None else Plan().placement
            return Plan(placement=placement, reason="held"), f"policy failed: {describe(exc)}"
