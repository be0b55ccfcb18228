"""The reconcile loop: every tick is observe → decide → guard → act, and nothing else.

The controller owns the state that must outlive a tick (``FleetMemory``: the instance table,
capacity cache, interruption history and cool-downs, what observe carries over, the checkpoint
ledger, the plan in force, what the journal last billed) and wires the steps together; each
lives in its own module. Decisions come from the policy's plan and the controller's own rules
(``autoscaler.tick.rules``), the guard alone grants them, act carries out the intents and
reports what happened as typed updates, which ``FleetMemory.apply`` writes. A policy that
raises, or returns a plan the guard rejects, holds the fleet as it is for that tick and says
why; interruption notices and drains already under way are still handled, because they are not
the policy's to decide.

Under a leader lock the controller acts only under its fencing token (``token``, checked by
``fence`` before act and before each cloud call); with a journal, every cloud call is written
ahead and each tick's decision, actions and accrued cost are recorded when it ends.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Mapping, Sequence

from autoscaler.fleet.capacity import CapacityCache, InterruptionHistory
from autoscaler.fleet.checkpoints import CheckpointLedger
from autoscaler.fleet.instances import InstanceTable, is_billed
from autoscaler.fleet.memory import FleetMemory, FleetUpdate
from autoscaler.fleet.team_spend import month_start
from autoscaler.fleet.team_usage import TickHolders, tick_holders
from autoscaler.model import DemandGroup, FleetView, InterruptionNotice, Plan
from autoscaler.model.clock import Clock
from autoscaler.model.config import ControllerConfig
from autoscaler.model.errors import CallNotMade, InputError, describe
from autoscaler.model.records import TickReport
from autoscaler.model.shapes import OnPremKinds, Unhostable, offers_of, unhostable_groups
from autoscaler.ops.journal import Journal, JournalError
from autoscaler.ops.journal.base import Billed, TickEntry
from autoscaler.ops.metrics import Metrics
from autoscaler.ops.onprem_idle import onprem_idle
from autoscaler.ops.provider_calls import watch
from autoscaler.spi.policy import Policy
from autoscaler.spi.provider import Provider
from autoscaler.spi.sources import (
    CheckpointingScheduler,
    NodeSource,
    QueueSource,
    WorkloadScheduler,
)
from autoscaler.tick.act import Actuator
from autoscaler.tick.evacuate import EvacuationSettings, Evacuator
from autoscaler.tick.guard import guard, validate_plan
from autoscaler.tick.intents import Intents
from autoscaler.tick.observe import Observation, Observer, Signals
from autoscaler.tick.retry import RetryPolicy
from autoscaler.tick.rules import controller_requests, preempt, rebalance_onprem, reclaim
from autoscaler.tick.team_limits import TeamLedger
from autoscaler.tick.tick_metrics import TickMetrics, tick_outcome

log = logging.getLogger(__name__)


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
        journal: Journal | None = None,
        fence: Callable[[int], None] | None = None,
    ) -> None:
        missing = sorted({p.provider for p in config.pools} - set(providers))
        if missing:
            raise InputError(
                "config",
                f"pools use provider(s) {', '.join(missing)}, which are not configured",
                field="pools",
            )
        self.config = config
        self.incarnation = incarnation or uuid.uuid4().hex[:12]
        self.journal = journal
        self.fence = fence
        self.token = 1
        ledger = CallLedger(self) if journal is not None or fence is not None else None
        self.providers: Mapping[str, Provider] = {
            name: watch(provider, metrics, ledger) for name, provider in providers.items()
        }
        providers = self.providers
        self.policy = policy
        self.clock = clock
        self.timer = timer
        self.fleet = FleetMemory(
            config.pools,
            config.request_timeout_s,
            config.capacity_cache_ttl_s,
            config.risky_pool_ttl_s,
            checkpoints,
        )
        self.signals = signals or Signals(queues=tuple(queue_sources), nodes=node_source)
        self.recorder: TickMetrics | None = None
        self.checkpoints = self.fleet.checkpoints
        self.metrics = metrics
        checkpointing = (
            scheduler
            if isinstance(scheduler, CheckpointingScheduler)
            and config.interruptions.checkpoint_aware
            else None
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
        self.observer = Observer(
            config,
            providers,
            self.signals,
            self.table,
            self.capacity,
            self.history,
            checkpointing,
            self.checkpoints,
            self.evacuator,
            self.fleet.observed,
        )
        self.actuator = Actuator(
            config,
            providers,
            self.fleet.capacity,
            scheduler,
            self.incarnation,
            retry or RetryPolicy(),
            self.evacuator,
            self._apply,
        )
        self._unhostable_said: set[str] = set()
        self._unhostable_cache: (
            tuple[tuple[DemandGroup, ...], OnPremKinds, list[Unhostable]] | None
        ) = None
        self._tick = 0
        self.last_observation: Observation | None = None
        self.last_intents: Intents | None = None

    @property
    def ticks(self) -> int:
        return self._tick

    @property
    def last_plan(self) -> Plan | None:
        """The plan in force: the last one the policy made (its placement outlives the tick)."""
        return self.fleet.last_plan

    @property
    def table(self) -> InstanceTable:
        return self.fleet.table

    @property
    def capacity(self) -> CapacityCache:
        return self.fleet.capacity

    @property
    def history(self) -> InterruptionHistory:
        return self.fleet.history

    def _apply(self, update: FleetUpdate) -> None:
        """Act's reports of what happened, written by the fleet memory's one writer."""
        self.fleet.apply(update, self.clock.now())

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
        unhostable = self._unhostable(view)
        placement = (self.last_plan or Plan()).placement
        moves = rebalance_onprem.moves(view, placement, observation.onprem_jobs, self.config.teams)
        reclaimed = reclaim.reclaim(
            view,
            self.config.teams,
            observation.running,
            observation.onprem_jobs,
            placement,
            self.config.tick_seconds,
            moves,
        )
        moves += reclaimed.moves
        preempted = preempt.preempt(
            view,
            self.config.teams,
            observation.running,
            observation.onprem_jobs,
            placement,
            self.config.tick_seconds,
            moves,
        )
        moves += preempted.moves
        plan, held = self._decide(
            rebalance_onprem.view_for_policy(view, observation.onprem_jobs, moves)
        )
        billed = self._billed_now(view) if self.journal is not None else []
        month_spend = self._month_spend(now, billed, observation.errors)
        requests = controller_requests(
            view,
            observation.notices,
            self.fleet.table,
            self.config,
            can_evacuate=self.evacuator is not None,
            nodes_known=observation.nodes_known,
            unlisted=observation.failed_providers,
            moves=moves,
        )
        intents = guard(
            plan,
            requests,
            view,
            self.config.limits,
            self.fleet.cooldowns,
            month_spend,
            self.config.drain_timeout_s,
            self._team_ledger(view),
        )
        self.last_observation, self.last_intents = observation, intents
        self.check_fence()
        actions = self.actuator.act(view, intents)
        self._acknowledge(observation.polled, observation.errors)
        self.checkpoints.expire(now)
        if held is None:
            self.fleet.last_plan = plan
        else:
            log.warning("tick %d held: %s", number, held)
        report = TickReport(
            tick=number,
            now=now,
            view=view,
            plan=plan,
            held=held,
            clamps=intents.clamps,
            actions=actions,
            errors=observation.errors,
            duration_s=self.timer() - started,
            month_spend=month_spend,
            failing_sources=sorted(
                f"{kind}/{name}" for (kind, name), up in observation.source_status.items() if not up
            ),
            unhostable=unhostable,
        )
        holders = tick_holders(observation.running, ((n.name, n.gpus) for n in view.onprem))
        self._journal_tick(report, billed, holders)
        if self.recorder is not None:
            self.recorder.record(
                observation,
                report,
                self.checkpoints.reports,
                self.token,
                holders,
                self.journal.last_team_usage if self.journal is not None else None,
            )
        return report

    @property
    def metrics(self) -> Metrics | None:
        return self.recorder.metrics if self.recorder is not None else None

    @metrics.setter
    def metrics(self, metrics: Metrics | None) -> None:
        self.recorder = (
            TickMetrics(metrics, self.config.pools, self.checkpoints.reports, self.config.teams)
            if metrics is not None
            else None
        )

    def _unhostable(self, view: FleetView) -> list[Unhostable]:
        """Pending jobs no configured capacity can ever host: they stay pending, never put on
        other GPUs, and are said once each time the set of such shapes changes."""
        groups = view.demand.groups
        onprem = view.onprem_kinds
        cached = self._unhostable_cache
        if cached is not None and cached[0] is groups and cached[1] == onprem:
            found = cached[2]
        else:
            found = unhostable_groups(groups, offers_of(self.config.pools, onprem))
            self._unhostable_cache = (groups, onprem, found)
        labels = {u.label for u in found}
        if labels != self._unhostable_said:
            for item in found:
                if item.label not in self._unhostable_said:
                    log.warning("%d pending job(s) stay pending: %s", item.jobs, item.reason)
            self._unhostable_said = labels
        return found

    def close(self) -> None:
        """Lets go of the threads the controller holds (the evacuator's)."""
        if self.evacuator is not None:
            self.evacuator.close()

    def check_fence(self) -> None:
        """Raises ``LeadershipLost`` when this replica may no longer act under its token."""
        if self.fence is not None:
            self.fence(self.token)

    def _team_ledger(self, view: FleetView) -> TeamLedger | None:
        """What the guard holds the teams' own limits by: whom each instance was bought for and
        each team's spend this month, accrued here each tick (None: the config lists no
        teams)."""
        teams = self.config.teams
        if teams is None:
            return None
        owners = self.fleet.table.teams()
        spend = self.fleet.team_spend
        if self.journal is not None and spend.wants_journal(view.now):
            try:  # after a restart: the month so far, by each cost row's team (else its tag)
                spend.recover(self.journal.spend(since=month_start(view.now)[1]), view.now)
            except JournalError as exc:
                log.error("the teams' month spend could not be read from the journal: %s", exc)
                spend.recover(None, view.now)
        spend.accrue(view, owners)
        return TeamLedger(teams, owners, spend.month(view.now))

    def _month_spend(self, now: float, billed: list[Billed], errors: list[str]) -> float | None:
        """This month's spend up to now: what the journal holds plus what the instances have run
        up since their last record."""
        if self.journal is None:
            return None
        try:
            return self.journal.month_spend(now) + self.journal.unbilled(billed, now)
        except JournalError as exc:
            errors.append(str(exc))
            return None

    def _journal_tick(self, report: TickReport, billed: list[Billed], holders: TickHolders) -> None:
        """The tick, and what it cost split between the teams by ``holders`` (whose jobs held
        each node's GPUs: ``autoscaler.fleet.team_usage``)."""
        if self.journal is None:
            return
        try:
            accrued = self.journal.record_tick(self._entry(report), report.actions, billed, holders)
        except JournalError as exc:
            report.errors.append(str(exc))
            log.error("tick %d not journaled: %s", report.tick, exc)
            return
        report.accrued = accrued
        now_billed = frozenset(node.instance_id for node in billed)
        self.journal.forget(sorted(self.fleet.billed - now_billed))
        self.fleet.billed = now_billed

    def _billed_now(self, view: FleetView) -> list[Billed]:
        prices = {p.pool.name: p.price for p in view.pools}
        billed = []
        for node in view.instances:
            price = prices.get(node.pool)
            record = self.table.get(node.instance_id)
            if not is_billed(node.state) or price is None or record is None:
                continue
            billed.append(
                Billed(
                    node.instance_id,
                    record.provider,
                    node.pool,
                    node.gpus,
                    price.price_per_hour,
                    node.launched_at,
                    record.team,  # kept on its cost rows: the teams' month is the journal's sum
                )
            )
        return billed

    def _entry(self, report: TickReport) -> TickEntry:
        demand = report.view.demand
        return TickEntry(
            incarnation=self.incarnation,
            tick=report.tick,
            token=self.token,
            at=report.now,
            duration_s=report.duration_s,
            outcome=_outcome(report),
            held=report.held,
            demand_known=demand.known,
            pending_gpus=sum(g.gpus_per_job * g.jobs for g in demand.groups),
            instances=len(report.view.instances),
            cost_per_hour=report.view.cost_per_hour(),
            plan=report.plan.model_dump(mode="json", exclude={"placement"}),
            clamps=[
                {"rule": c.rule, "pool": c.pool, "requested": c.requested, "allowed": c.allowed}
                for c in report.clamps
            ],
            onprem_idle=onprem_idle(report.view.onprem, report.failing_sources),
        )

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


def _outcome(report: TickReport) -> str:
    return tick_outcome(report.held, report.errors)


class CallLedger:
    """Fences and journals the controller's cloud calls (see ``provider_calls``)."""

    def __init__(self, controller: Controller) -> None:
        self.controller = controller

    def started(
        self, kind: str, provider: str, pool: str | None, count: int, request_id: str
    ) -> None:
        controller = self.controller
        controller.check_fence()
        if controller.journal is None:
            return
        try:
            controller.journal.call_started(
                request_id,
                kind,
                provider,
                pool,
                count,
                controller.token,
                controller.incarnation,
                controller.clock.now(),
            )
        except JournalError as exc:
            raise CallNotMade(f"{kind} in {pool or provider} not made: {exc}") from exc

    def finished(
        self, request_id: str, outcome: str, instance_ids: Sequence[str], detail: str
    ) -> None:
        journal = self.controller.journal
        if journal is None:
            return
        try:
            journal.call_finished(
                request_id, outcome, instance_ids, detail, self.controller.clock.now()
            )
        except JournalError as exc:
            log.error("the outcome of %s was not journaled: %s", request_id, exc)
