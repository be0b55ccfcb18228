"""Observe: read every source once and build the tick's immutable ``FleetView``.

A source that fails degrades the view instead of killing the tick: a failed cloud listing leaves
that cloud's records as they were (never "gone"), a failed queue source marks demand unknown
(never "zero"), and a failed node source leaves utilisation unknown (never "idle").
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

from autoscaler.fleet.capacity import CapacityCache, InterruptionHistory
from autoscaler.fleet.checkpoints import CheckpointLedger
from autoscaler.fleet.instances import InstanceTable, SyncReport
from autoscaler.fleet.memory import Observed
from autoscaler.fleet.telemetry import IdleTracker, apply
from autoscaler.model import (
    CloudNode,
    Demand,
    DemandGroup,
    FleetView,
    Instance,
    InstanceState,
    InterruptionNotice,
    NoticeKind,
    Plan,
    Pool,
    PoolView,
)
from autoscaler.model.config import ControllerConfig
from autoscaler.model.errors import describe
from autoscaler.model.priorities import ClassBook
from autoscaler.model.teams import TeamBook
from autoscaler.spi.provider import Provider
from autoscaler.spi.sources import (
    CheckpointingScheduler,
    FoldsPriorityClasses,
    JobsByNode,
    MovesJobsOff,
    NodeReading,
    NodeSource,
    NodeUsage,
    QueueSource,
    ReportsProblems,
    ReportsTargets,
    RunningJob,
    TelemetrySource,
)
from autoscaler.tick.evacuate import running_jobs_on
from autoscaler.tick.rules import rebalance_onprem
from autoscaler.tick.rules.rebalance_onprem import MovesInFlight, OnPremJobs

log = logging.getLogger(__name__)


class JobsOnNode(NamedTuple):
    """What the scheduler says of the jobs on one cloud node a policy may give back."""

    unsaved_gpu_s: float | None  # what draining it now would throw away (None: not asked)
    checkpoint: bool  # every job on it saves checkpoints
    job_gpus: tuple[int, ...]  # the GPUs each job holds on it, largest first
    multi_node: bool  # some job also runs on other nodes
    gangs: tuple[tuple[str, int], ...]  # those multi-node jobs: (job id, nodes it spans)


@dataclass
class Observation:
    view: FleetView
    sync: SyncReport
    errors: list[str] = field(default_factory=list)
    failed_providers: set[str] = field(default_factory=set)
    polled: dict[str, list[InterruptionNotice]] = field(default_factory=dict)
    source_status: dict[tuple[str, str], bool] = field(default_factory=dict)
    source_age: dict[tuple[str, str], float] = field(default_factory=dict)
    nodes_known: bool = False
    notices: tuple[InterruptionNotice, ...] = ()  # every notice for an owned instance
    onprem_jobs: OnPremJobs | None = None  # read only when on-prem rebalancing could move some
    # what each source's readings could not take as it is, by kind (``ReportsProblems``)
    source_problems: dict[str, dict[str, int]] = field(default_factory=dict)
    # Every node's running jobs, read each tick where the config lists teams (what each team
    # holds: quota reclaim and attribution); None when not read or the scheduler failed.
    running: Mapping[str, Sequence[RunningJob]] | None = None


class NoticeSource(Protocol):
    """Notices that arrive outside a provider, such as the node agents' inbox."""

    def take(self) -> list[InterruptionNotice]: ...


@dataclass
class Signals:
    """Everything observe reads besides the clouds."""

    queues: Sequence[QueueSource] = ()
    nodes: NodeSource | None = None
    telemetry: Sequence[TelemetrySource] = ()
    notices: Sequence[NoticeSource] = ()
    tracker: IdleTracker = field(default_factory=IdleTracker)


class Observer:
    def __init__(
        self,
        config: ControllerConfig,
        providers: Mapping[str, Provider],
        signals: Signals,
        table: InstanceTable,
        capacity: CapacityCache,
        history: InterruptionHistory,
        jobs: CheckpointingScheduler | None = None,
        checkpoints: CheckpointLedger | None = None,
        in_flight: MovesInFlight | None = None,
        observed: Observed | None = None,
    ) -> None:
        self.config = config
        self.jobs = jobs
        self.mover = jobs if isinstance(jobs, MovesJobsOff) else None
        self.in_flight = in_flight
        self.checkpoints = checkpoints if checkpoints is not None else CheckpointLedger()
        self.providers = providers
        self.signals = signals
        self.table = table
        self.capacity = capacity
        self.history = history
        # On-demand pools, where spot pools exist too: a policy may replace their busy nodes
        # by spot once it has room, so what their jobs are is read every tick.
        self._replaceable_pools = (
            {p.name for p in config.pools if not p.is_spot}
            if any(p.is_spot for p in config.pools)
            else set()
        )
        # The teams jobs name, said once each when the config lists teams and not theirs.
        self.teams = TeamBook(config.teams) if config.teams is not None else None
        # Teams with guarantees, or classes that preempt: the reclaim and preempt rules need
        # the moves in flight and the holds.
        self._guarantees = config.teams is not None and (
            any(t.guaranteed_gpus for t in (*config.teams.teams.values(), config.teams.unassigned))
            or any(c.preempts for c in config.teams.priority_classes.values())
        )
        # The priority classes jobs name, where the config lists classes: they order demand.
        self.classes = (
            ClassBook(config.teams.priority_classes)
            if config.teams is not None and config.teams.priority_classes
            else None
        )
        if self.classes is not None:
            for source in signals.queues:
                if isinstance(source, FoldsPriorityClasses):
                    source.fold_priority_classes()
        self._pools_by_provider: dict[str, list[Pool]] = {}
        for pool in config.pools:
            self._pools_by_provider.setdefault(pool.provider, []).append(pool)
        # What outlives the tick is the controller's (FleetMemory.observed); the node cache only
        # saves re-parsing an unchanged answer.
        self.memory = observed if observed is not None else Observed()
        self._node_cache: dict[str, tuple[object, CloudNode]] = {}

    def observe(self, now: float, tick: int, last_plan: Plan | None) -> Observation:
        errors: list[str] = []
        listed: list[tuple[str, Instance]] = []
        notices: list[InterruptionNotice] = []
        polled: dict[str, list[InterruptionNotice]] = {}
        listed_ok: set[str] = set()
        failed: set[str] = set()
        status: dict[tuple[str, str], bool] = {}
        for name, provider in self.providers.items():
            try:
                listed.extend((name, i) for i in provider.list_instances(self.config.fleet_id))
                listed_ok.add(name)
                status[("provider", name)] = True
            except Exception as exc:
                failed.add(name)
                status[("provider", name)] = False
                errors.append(f"provider {name}: listing failed: {describe(exc)}")
                continue
            try:
                polled[name] = provider.poll_notices()
                notices.extend(polled[name])
            except Exception as exc:
                errors.append(f"provider {name}: notices failed: {describe(exc)}")
            pools = self._pools_by_provider.get(name, [])
            if pools:
                try:
                    for quote in provider.prices(pools):
                        self.memory.prices[quote.pool] = quote
                except Exception as exc:
                    errors.append(f"provider {name}: prices failed: {describe(exc)}")
        sync = self.table.sync(listed, now, listed_ok)

        running: dict[str, int] = {}
        for record in self.table.live():
            if record.state is InstanceState.RUNNING:
                running[record.pool] = running.get(record.pool, 0) + 1
        self.history.expose(running, now)
        demand = self._read_demand(now, errors, status)
        if self.teams is not None:
            for group in demand.groups:
                self.teams.name(group.team)
        if self.classes is not None:
            demand = self.classes.rank(demand, now)
        reading = self._read_nodes(now, errors, status)
        underused = self._underused(now, reading.cloud)
        for inbox in self.signals.notices:
            notices.extend(inbox.take())
        notices = [self._with_pool(n) for n in notices]
        noticed = {n.instance_id for n in notices}
        at_risk = self._jobs_at_risk(now, reading.cloud, underused, noticed, errors)
        owned = {r.id for r in self.table}
        view = FleetView.model_construct(
            now=now,
            tick=tick,
            fleet_id=self.config.fleet_id,
            pools=self._pool_views(now),
            onprem=reading.onprem,
            instances=self._cloud_nodes(reading.cloud, underused, at_risk),
            demand=demand,
            notices=tuple(n for n in notices if n.instance_id in owned and self._acted_on(n)),
            last_plan=last_plan,
        )
        source = self.signals.nodes
        nodes_known = source is not None and status.get(("nodes", source.name), False)
        onprem_jobs = (
            self._onprem_jobs(view, last_plan, errors) if nodes_known and last_plan else None
        )
        every_job = self._every_job(view, errors) if nodes_known else None
        for message in errors:
            log.warning("observe: %s", message)
        problems: dict[str, dict[str, int]] = {}
        for reader in (*self.signals.queues, self.signals.nodes):
            if isinstance(reader, ReportsProblems):
                problems[reader.name] = dict(reader.reading_problems())
        return Observation(
            view,
            sync,
            errors,
            failed,
            polled,
            status,
            self._ages(now, status),
            nodes_known,
            tuple(n for n in notices if n.instance_id in owned),
            onprem_jobs,
            problems,
            every_job,
        )

    def _every_job(
        self, view: FleetView, errors: list[str]
    ) -> Mapping[str, Sequence[RunningJob]] | None:
        """Every node's running jobs, where the config lists teams: one listing where the
        scheduler lists every node at once, else one per node that holds a job."""
        if self.teams is None or self.jobs is None:
            return None
        try:
            if isinstance(self.jobs, JobsByNode):
                return self.jobs.running_jobs_by_node()
            busy = [n.name for n in view.onprem if n.gpus_allocated > 0]
            busy += [n.instance_id for n in view.instances if n.gpus_allocated > 0]
            return running_jobs_on(self.jobs, busy)
        except Exception as exc:
            errors.append(f"scheduler: listing every node's jobs failed: {describe(exc)}")
            return None

    def _onprem_jobs(
        self, view: FleetView, last_plan: Plan, errors: list[str]
    ) -> OnPremJobs | None:
        """What the on-prem rebalance rule decides by, where the placement in force rebalances
        and the scheduler can move jobs: the moves in flight and the scheduler's holds always,
        the on-prem nodes' jobs only where one could be moved (a group may displace, cloud room
        is free); None when the rule does not apply or the scheduler could not be read."""
        if self.mover is None or self.jobs is None:
            return None
        if not last_plan.placement.rebalance_onprem and not self._guarantees:
            return None
        nodes = rebalance_onprem.worth_reading(view, last_plan.placement)
        try:
            held = tuple(self.mover.held_off())
            jobs = running_jobs_on(self.jobs, nodes) if nodes else {}
        except Exception as exc:
            errors.append(f"scheduler: listing on-prem jobs failed: {describe(exc)}")
            return None
        flight = self.in_flight
        return OnPremJobs(
            jobs,
            held,
            frozenset(flight.waiting()) if flight is not None else frozenset(),
            frozenset(flight.making_room_for()) if flight is not None else frozenset(),
            dict(flight.reserved()) if flight is not None else {},
        )

    def _acted_on(self, notice: InterruptionNotice) -> bool:
        """A rebalance recommendation is in the view only while the controller acts on them
        (``interruptions.act_on_rebalance``): otherwise a policy would buy a replacement for a
        node nobody drains, and pay for both."""
        return notice.kind is not NoticeKind.REBALANCE or self.config.interruptions.act_on_rebalance

    def _ages(
        self, now: float, status: dict[tuple[str, str], bool]
    ) -> dict[tuple[str, str], float]:
        """Seconds since each source last answered (since the first tick, if it never has)."""
        memory = self.memory
        first = memory.first_observed
        if first is None:
            first = memory.first_observed = now
        for key, up in status.items():
            if up:
                memory.answered_at[key] = now
        return {key: now - memory.answered_at.get(key, first) for key in status}

    def _with_pool(self, notice: InterruptionNotice) -> InterruptionNotice:
        """A notice from a node agent knows its instance, not its pool: the table does."""
        record = self.table.get(notice.instance_id)
        if record is None or notice.pool == record.pool:
            return notice
        return notice.model_copy(update={"pool": record.pool})

    def _read_demand(
        self, now: float, errors: list[str], status: dict[tuple[str, str], bool]
    ) -> Demand:
        groups: list[DemandGroup] = []
        failed: list[str] = []
        for source in self.signals.queues:
            try:
                groups.extend(source.read(now))
                status[("queue", source.name)] = True
            except Exception as exc:
                failed.append(source.name)
                status[("queue", source.name)] = False
                errors.append(f"queue source {source.name}: {describe(exc)}")
        return Demand.model_construct(
            groups=tuple(groups), known=not failed, failed_sources=tuple(failed)
        )

    def _read_nodes(
        self, now: float, errors: list[str], status: dict[tuple[str, str], bool]
    ) -> NodeReading:
        reading = NodeReading()
        source = self.signals.nodes
        if source is not None:
            try:
                reading = source.read_nodes(now)
                status[("nodes", source.name)] = True
            except Exception as exc:
                status[("nodes", source.name)] = False
                errors.append(f"node source {source.name}: {describe(exc)}")
        tracker = self.signals.tracker
        for telemetry in self.signals.telemetry:
            try:
                tracker.observe(telemetry.read_gpus(now))
                status[("telemetry", telemetry.name)] = True
            except Exception as exc:
                status[("telemetry", telemetry.name)] = False
                errors.append(f"telemetry {telemetry.name}: {describe(exc)}")
            if isinstance(telemetry, ReportsTargets):
                for url, problem in telemetry.target_status().items():
                    status[("target", f"{telemetry.name} {url}")] = problem is None
        if not self.signals.telemetry:
            return reading
        measured = tracker.nodes(now)
        onprem = tuple(
            node
            if node.name not in measured
            else node.model_copy(
                update={
                    "gpu_util_pct": measured[node.name].util_pct,
                    "idle_since": measured[node.name].idle_since,
                }
            )
            for node in reading.onprem
        )
        return NodeReading(onprem, apply(reading.cloud, measured))

    def _underused(self, now: float, usage: Mapping[str, NodeUsage]) -> dict[str, float]:
        """Since when each running node has had at most half of its GPUs allocated (and at least
        one): a node kept up for a job or two it could hand on."""
        since: dict[str, float] = {}
        for record in self.table.live():
            seen = usage.get(record.id)
            if record.state is not InstanceState.RUNNING or seen is None:
                continue
            held = seen.gpus_held if seen.gpus_held is not None else seen.gpus_allocated
            # A node of shared GPUs holding only slices is underused by what they add up to,
            # not by how many GPUs carry one.
            if 0 < held * 2 <= record.gpus:
                since[record.id] = self.memory.underused_since.get(record.id, now)
        self.memory.underused_since = since
        return since

    def _jobs_at_risk(
        self,
        now: float,
        usage: Mapping[str, NodeUsage],
        underused: Mapping[str, float],
        noticed: set[str],
        errors: list[str],
    ) -> dict[str, JobsOnNode]:
        """For each node a policy may give back, what draining it would throw away, whether
        all its jobs checkpoint, and the GPUs each of its jobs holds there. Only nodes whose
        GPUs read idle, that are underused, that the cloud is taking back (their jobs' sizes
        are what a replacement must hold) or that are on-demand where spot pools exist (a
        policy may replace them) are asked about, in one scheduler query. The work at risk,
        which grows every second, is left unknown on the busy on-demand nodes, so that their
        view objects stay the same from tick to tick while their jobs do."""
        if self.jobs is None:
            return {}
        found: dict[str, JobsOnNode] = {}
        ask: list[str] = []
        sized_only: set[str] = set()
        for record in self.table.live():
            seen = usage.get(record.id)
            if record.state is not InstanceState.RUNNING or seen is None:
                continue
            if seen.gpus_allocated == 0:
                found[record.id] = JobsOnNode(0.0, True, (), False, ())
            elif seen.idle_since is not None or record.id in underused or record.id in noticed:
                ask.append(record.id)
            elif record.pool in self._replaceable_pools:
                ask.append(record.id)
                sized_only.add(record.id)
        if not ask:
            return found
        try:
            running = running_jobs_on(self.jobs, ask)
        except Exception as exc:
            errors.append(f"scheduler: listing running jobs failed: {describe(exc)}")
            return found
        for node in ask:
            jobs = running.get(node, ())
            found[node] = JobsOnNode(
                None
                if node in sized_only
                else sum(
                    self.checkpoints.unsaved_gpu_s(job.id, job.gpus, job.started_at, now)
                    for job in jobs
                ),
                all(
                    job.checkpoint_interval_s is not None or job.checkpoint_signal is not None
                    for job in jobs
                ),
                tuple(sorted((job.gpus for job in jobs), reverse=True)),
                any(job.nodes > 1 for job in jobs),
                tuple(sorted((job.id, job.nodes) for job in jobs if job.nodes > 1)),
            )
        return found

    def _cloud_nodes(
        self,
        usage: Mapping[str, NodeUsage],
        underused: Mapping[str, float],
        at_risk: Mapping[str, JobsOnNode],
    ) -> tuple[CloudNode, ...]:
        """One ``CloudNode`` per live record; last tick's object is reused when nothing about
        the node changed, since most of a large fleet is the same from one tick to the next."""
        nodes = []
        cache: dict[str, tuple[object, CloudNode]] = {}
        for record in self.table.live():
            seen = usage.get(record.id)
            since = underused.get(record.id)
            risk = at_risk.get(record.id)
            key = (record.state, record.team, seen, since, risk)
            cached = self._node_cache.get(record.id)
            if cached is not None and cached[0] == key:
                node = cached[1]
            else:
                node = CloudNode.model_construct(
                    instance_id=record.id,
                    pool=record.pool,
                    state=record.state,
                    launched_at=record.launched_at,
                    gpus=record.gpus,
                    gpus_allocated=seen.gpus_allocated if seen else 0,
                    gpu_util_pct=seen.gpu_util_pct if seen else None,
                    idle_since=seen.idle_since if seen else None,
                    empty_since=seen.empty_since if seen else None,
                    joined=seen is not None,
                    underused_since=since,
                    work_at_risk_gpu_s=risk.unsaved_gpu_s if risk is not None else None,
                    jobs_checkpoint=risk.checkpoint if risk is not None else None,
                    job_gpus=risk.job_gpus if risk is not None else None,
                    multi_node_jobs=risk.multi_node if risk is not None else None,
                    gang_jobs=risk.gangs if risk is not None else None,
                    team=record.team,
                )
            cache[record.id] = (key, node)
            nodes.append(node)
        self._node_cache = cache
        return tuple(nodes)

    def _pool_views(self, now: float) -> tuple[PoolView, ...]:
        return tuple(
            PoolView.model_construct(
                pool=pool,
                price=self.memory.prices.get(pool.name),
                unavailable_until=self.capacity.unavailable_until(pool.name, now),
                risky_until=self.history.risky_until(pool.name, now),
                recent_interruptions=self.history.recent(pool.name, now),
                recent_instance_hours=self.history.exposure_hours(pool.name, now),
                recent_reclaims=self.history.reclaims(pool.name, now),
            )
            for pool in self.config.pools
        )
