"""The dry run: replay a trace through the REAL controller, event by event.

The world (job arrivals and completions, instance boots, capacity changes, interruptions) is
simulated exactly in continuous time; the controller ticks every ``tick_seconds`` of simulated
time, reads the simulated scheduler and clouds through the same interfaces it reads live, and
acts through the ``sim`` provider found in the provider registry. Deterministic for a seed.
"""

from __future__ import annotations

import heapq
import itertools
import math
import time
from array import array
from collections.abc import Callable
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from autoscaler.app.assembly import Mode, Parts, build_controller
from autoscaler.fleet.attribution import TeamBill, bill
from autoscaler.model import Capacity
from autoscaler.model.catalog import SpotAdvisor
from autoscaler.model.clock import ManualClock
from autoscaler.model.errors import InputError
from autoscaler.model.gpus import memory_gib
from autoscaler.model.records import TickReport
from autoscaler.model.teams import UNASSIGNED
from autoscaler.ops.journal import Journal
from autoscaler.ops.metrics import Metrics
from autoscaler.sim.cloud import PoolMarketModel, SimCloud
from autoscaler.sim.demand_series import load_series
from autoscaler.sim.market import AvailabilityFile, PriceBook
from autoscaler.sim.scenario import LoadedScenario, PolicySpec, PoolMarket, Scenario
from autoscaler.sim.scheduler import SimJob, SimScheduler
from autoscaler.sim.series import StepSeries
from autoscaler.sim.synthetic import trace_path
from autoscaler.sim.trace import TraceSelection, load_trace
from autoscaler.spi.policy import PROVIDER_GROUP, Policy, load_entry_point, load_policy
from autoscaler.tick.controller import Controller
from autoscaler.tick.observe import Signals
from autoscaler.tick.retry import RetryPolicy

_ORDER = {
    "reclaim": 0,
    "finish": 1,
    "ready": 2,
    "capacity": 3,
    "interrupt": 4,
    "checkpoint": 5,
    "wake": 6,
}
# What wakes the live run loop before its next tick: a notice arriving (the cloud posts a wake
# with it), a checkpoint report, and the end of a checkpoint wait.
_WAKES = frozenset({"checkpoint", "wake"})


@dataclass
class Prepared:
    """What every policy's replay shares: the jobs and the markets, read once."""

    loaded: LoadedScenario
    selection: TraceSelection
    markets: dict[str, PoolMarketModel]

    @property
    def horizon_s(self) -> float:
        return self.selection.horizon_s


@dataclass
class Timeline:
    """Sampled once per controller tick."""

    t: array[float] = field(default_factory=lambda: array("d"))
    cost: array[float] = field(default_factory=lambda: array("d"))
    cost_per_hour: array[float] = field(default_factory=lambda: array("d"))
    pending_gpus: array[float] = field(default_factory=lambda: array("d"))
    running_gpus: array[float] = field(default_factory=lambda: array("d"))
    cloud_gpus: array[float] = field(default_factory=lambda: array("d"))
    onprem_busy_gpus: array[float] = field(default_factory=lambda: array("d"))


@dataclass(frozen=True)
class TickSeen:
    """One ``Controller.tick()`` call as the replay made it, for soaks and profilers.

    ``wall_s`` and ``cpu_s`` cover the whole call, journal write and metrics included (which
    ``report.duration_s`` leaves out); CPU time is the process's own, so a busy machine does not
    inflate it the way it inflates wall time.
    """

    controller: Controller
    report: TickReport
    wall_s: float
    cpu_s: float


@dataclass
class SimResult:
    policy: str
    label: str
    params: dict[str, Any]
    horizon_s: float
    cost: float
    cost_by_pool: dict[str, float]
    instance_hours_by_pool: dict[str, float]
    waits_s: list[float]
    wait_job_ids: list[str]
    jobs_total: int
    jobs_finished: int
    jobs_never_started: int
    useful_gpu_s: float
    allocated_gpu_s: dict[str, float]
    lost_gpu_s: float
    checkpoint_gpu_s: float
    cloud_paid_gpu_s: float
    onprem_gpus: int
    interruptions: int
    checkpoints: int
    requeues: int
    migrations: int
    launched: int
    capacity_failures: int
    held_ticks: int
    clamps: dict[str, int]
    ticks: int
    tick_ms: list[float]
    wall_s: float
    timeline: Timeline
    onprem_idle_gpu_s: float = 0.0
    # each counted job's team, beside ``waits_s`` ("unassigned" for none)
    wait_teams: list[str] = field(default_factory=list)
    # the pools' bills split by team (and idle), GPU-seconds by team and place
    team_bill: TeamBill = field(default_factory=TeamBill)
    # by team with a guarantee: GPU-seconds it was short of min(guarantee, its work) on-prem
    # while it had work waiting, and on how many of the sampled ticks
    team_short_gpu_s: dict[str, float] = field(default_factory=dict)
    team_short_ticks: dict[str, int] = field(default_factory=dict)
    # the same, counted only once the team has been short longer than reclaim_within_s: what
    # the guarantee's bound did not keep
    team_late_gpu_s: dict[str, float] = field(default_factory=dict)
    team_late_ticks: dict[str, int] = field(default_factory=dict)
    sampled_ticks: int = 0
    # where GPUs may be shared (scenario gpu_sharing): free slices stranded on partly used GPUs
    # and GPUs with nothing on them, in GPUs, summed over the sampled ticks (``frag_ticks``)
    shares_gpus: bool = False
    stranded_gpu_ticks: float = 0.0
    free_gpu_ticks: float = 0.0
    frag_ticks: int = 0


def prepare(loaded: LoadedScenario) -> Prepared:
    scenario = loaded.scenario
    if scenario.trace.series is not None:
        selection = load_series(
            loaded.path(scenario.trace.series.file),
            scenario.trace,
            scenario.checkpointing,
            scenario.high_priority,
            scenario.seed,
        )
        return Prepared(loaded, selection, build_markets(loaded))
    selection = load_trace(
        trace_path(loaded),
        scenario.trace,
        scenario.checkpointing,
        scenario.high_priority,
        scenario.seed,
        largest_node(scenario),
        scenario.teams,
    )
    return Prepared(loaded, selection, build_markets(loaded))


def largest_node(scenario: Scenario) -> int | None:
    """The most GPUs one node of the scenario has, on-prem or in a pool's instance."""
    sizes = [n.gpus for n in scenario.onprem] + [
        p.gpus_per_instance for p in scenario.controller.pools
    ]
    return max(sizes, default=None)


def build_markets(loaded: LoadedScenario) -> dict[str, PoolMarketModel]:
    scenario = loaded.scenario
    spec = scenario.market
    book = PriceBook([loaded.path(f) for f in spec.price_files])
    advisor = (
        SpotAdvisor(loaded.path(spec.advisor_file), spec.advisor_snapshot)
        if spec.advisor_file
        else None
    )
    availability = (
        AvailabilityFile(loaded.path(spec.availability_file)) if spec.availability_file else None
    )
    origin = scenario.start_epoch
    markets: dict[str, PoolMarketModel] = {}
    for index, pool in enumerate(scenario.controller.pools):
        where = loaded.source
        field_name = f"controller.pools[{index}]"
        market = spec.pools.get(pool.name, PoolMarket())
        if market.price_per_hour is not None:
            price: StepSeries | None = StepSeries([0.0], [market.price_per_hour])
            source = "fixed in scenario"
        else:
            price = book.series(
                pool.provider,
                pool.region,
                pool.instance_type,
                spot=pool.is_spot,
                zone=market.price_zone,
                origin=origin,
            )
            source = ", ".join(book.files)
        kind = "spot" if pool.is_spot else "on-demand"
        if price is None:
            raise InputError(
                where,
                f"no {kind} price for {pool.provider} {pool.region} "
                f"{pool.instance_type}{' zone ' + market.price_zone if market.price_zone else ''}"
                " in market.price_files",
                field=field_name,
            )
        if price.times[0] > 0:
            raise InputError(
                where,
                f"the first {kind} price for pool {pool.name!r} is "
                f"{price.times[0] / 86400:.1f} days after the scenario start; "
                "move start later or add older prices",
                field=field_name,
            )
        on_demand = book.series(
            pool.provider, pool.region, pool.instance_type, spot=False, zone=None, origin=origin
        )
        trace = None
        if market.availability_trace is not None:
            if availability is None:
                raise InputError(
                    where,
                    "availability_trace needs market.availability_file",
                    field=f"market.pools.{pool.name}",
                )
            trace = availability.trace(
                market.availability_trace, market.availability_offset_s, market.availability_loop
            )
        quoted = (
            advisor.rate_per_hour(pool.region, pool.instance_type)
            if (advisor is not None and pool.is_spot and pool.provider == "aws")
            else None
        )
        rate = market.interruption_rate_per_hour
        if rate is None and trace is None and pool.is_spot:
            rate = quoted
        if pool.is_spot and trace is None and rate is None:
            raise InputError(
                where,
                f"spot pool {pool.name!r} has no interruption model: give "
                "market.pools.<pool>.availability_trace or interruption_rate_per_hour",
                field=field_name,
            )
        markets[pool.name] = PoolMarketModel(price, on_demand, trace, rate, quoted, source)
    return markets


def simulate(
    prepared: Prepared,
    spec: PolicySpec,
    index: int = 0,
    progress: Callable[[float], None] | None = None,
    policy: Policy | None = None,
    checkpoint_aware: bool | None = None,
    journal: Journal | None = None,
    metrics: Metrics | None = None,
    on_tick: Callable[[TickSeen], None] | None = None,
) -> SimResult:
    """Replay the prepared scenario through the controller with one policy.

    The policy is looked up by ``spec.name`` in the policy registry, or given directly (to test a
    policy before it is packaged as a plugin). ``checkpoint_aware`` overrides the scenario's
    ``controller.interruptions.checkpoint_aware`` (the report's comparison on the same trace).

    The controller ticks every ``tick_seconds`` and, as the live run loop does, also at once when
    an interruption notice or a checkpoint report arrives and when a checkpoint wait ends.

    ``journal`` and ``metrics`` go to the controller as they would live, so a soak can run the
    production bookkeeping for thousands of ticks; without them the replay is unchanged.
    ``on_tick`` sees every tick as a ``TickSeen``.
    """
    started_wall = time.perf_counter()
    loaded = prepared.loaded
    scenario = loaded.scenario
    config = scenario.controller
    if checkpoint_aware is not None:
        config = config.model_copy(
            update={
                "interruptions": config.interruptions.model_copy(
                    update={"checkpoint_aware": checkpoint_aware}
                )
            }
        )
    horizon = prepared.horizon_s
    clock = ManualClock(0.0)
    heap: list[tuple[float, int, int, str, Any]] = []
    counter = itertools.count()

    def post(when: float, kind: str, payload: object) -> None:
        if when <= horizon:
            heapq.heappush(heap, (when, _ORDER[kind], next(counter), kind, payload))

    def on_start(job: SimJob, end: float) -> None:
        post(end, "finish", (job, job.run_id))

    def on_checkpoint_asked(job: SimJob, run_id: int, asked_at: float, done_at: float) -> None:
        post(done_at, "checkpoint", (job, run_id, asked_at))

    scheduler = SimScheduler(
        clock,
        scenario.idle_util_pct,
        on_start,
        on_checkpoint_asked,
        {p.name: sharing for p in config.pools if (sharing := scenario.sharing_of(p)) is not None},
        [p.name for p in config.pools],
    )
    if config.teams is not None and config.teams.priority_classes:
        # live schedulers place higher classes first (Slurm's QOS priority, Kubernetes'
        # PrioritySort); without classes the replay stays FIFO with backfill
        scheduler.place_by_class(config.teams.priority_classes)
    onprem_gpus = 0
    for node in scenario.onprem:
        for i in range(node.count):
            name = node.name if node.count == 1 else f"{node.name}-{i}"
            scheduler.add_node(
                name,
                node.gpus,
                Capacity.ONPREM,
                None,
                0.0,
                node.gpu_model,
                memory_gib(node.gpu_model),
                sharing=scenario.gpu_sharing.for_node(node),
            )
            onprem_gpus += node.gpus
    cloud = SimCloud(
        config.pools, prepared.markets, scenario.notice_lead_s, scenario.seed, scheduler, post
    )
    for name, market in prepared.markets.items():
        if market.availability is not None:
            post(market.availability.next_change(0.0), "capacity", name)
    provider_factory = load_entry_point(PROVIDER_GROUP, "sim", "provider")
    providers = {p.provider: provider_factory(cloud, p.provider, clock) for p in config.pools}
    if policy is None:
        policy = load_policy(
            spec.name, spec.params, where=loaded.source, field_prefix=f"policies[{index}].params"
        )
    controller = build_controller(
        config,
        Mode.SIM,
        policy,
        clock,
        Parts(
            providers,
            Signals(queues=(scheduler,), nodes=scheduler),
            scheduler,
            checkpoints=scheduler.checkpoints,
            journal=journal,
            metrics=metrics,
        ),
        incarnation="sim",
        retry=RetryPolicy(attempts=1, sleep=lambda _s: None),
    ).controller

    jobs = prepared.selection.jobs
    next_arrival = 0
    next_tick = 0.0
    timeline = Timeline()
    guarantees = (
        {name: t.guaranteed_gpus for name, t in config.teams.teams.items() if t.guaranteed_gpus}
        if scenario.teams is not None and config.teams is not None
        else {}
    )
    shortfall = Shortfall()
    fragments = Fragments()
    shares = scenario.shares_gpus
    # One unboxed double per tick rather than a float object: a long replay or a soak holds
    # 8 bytes per tick here, and the soak's memory figures are not swamped by its own record.
    tick_ms = array("d")
    clamps: dict[str, int] = {}
    held = 0
    while True:
        t = min(
            heap[0][0] if heap else math.inf,
            jobs[next_arrival].submit if next_arrival < len(jobs) else math.inf,
            next_tick,
        )
        if t > horizon:
            break
        clock.set(t)
        while next_arrival < len(jobs) and jobs[next_arrival].submit <= t:
            scheduler.submit(jobs[next_arrival], t)
            next_arrival += 1
        woken = False
        while heap and heap[0][0] <= t:
            _, _, _, kind, payload = heapq.heappop(heap)
            _dispatch(kind, payload, t, scheduler, cloud)
            woken = woken or kind in _WAKES
        regular = next_tick <= t
        if regular or woken:
            scheduler.schedule(t)
            called, cpu = time.perf_counter(), time.process_time()
            report = controller.tick()
            if on_tick is not None:
                wall_s, cpu_s = time.perf_counter() - called, time.process_time() - cpu
                on_tick(TickSeen(controller, report, wall_s, cpu_s))
            tick_ms.append(report.duration_s * 1000.0)
            if report.held is not None:
                held += 1
            for clamp in report.clamps:
                clamps[clamp.rule] = clamps.get(clamp.rule, 0) + 1
            due = controller.next_due()
            if due is not None and due > t:
                post(due, "wake", None)
            if regular:
                _sample(timeline, t, cloud, scheduler)
                if guarantees:
                    count_short(
                        shortfall,
                        scheduler,
                        guarantees,
                        config.tick_seconds,
                        t,
                        config.teams.reclaim_within_s if config.teams is not None else 0.0,
                    )
                if shares:
                    fragments.sample(scheduler)
                next_tick += config.tick_seconds
                if progress is not None:
                    progress(t)
        scheduler.schedule(t)

    clock.set(horizon)
    cloud.settle(horizon)
    scheduler.close(horizon)
    if controller.evacuator is not None:
        controller.evacuator.close()
    accounting = scheduler.accounting
    counted = [job for job in scheduler.jobs if not job.trace.carried]
    return SimResult(
        policy=spec.name,
        label=spec.title,
        params=dict(spec.params),
        horizon_s=horizon,
        cost=cloud.total_cost(),
        cost_by_pool={name: m.cost for name, m in cloud.meters.items()},
        instance_hours_by_pool={name: m.instance_s / 3600 for name, m in cloud.meters.items()},
        waits_s=[job.waited for job in counted],
        wait_job_ids=[job.trace.id for job in counted],
        jobs_total=len(scheduler.jobs),
        jobs_finished=sum(1 for j in scheduler.jobs if j.finished_at is not None),
        jobs_never_started=sum(1 for j in scheduler.jobs if j.first_start is None),
        useful_gpu_s=accounting.useful_gpu_s,
        allocated_gpu_s={str(k): v for k, v in accounting.allocated_gpu_s.items()},
        lost_gpu_s=accounting.lost_gpu_s,
        checkpoint_gpu_s=accounting.checkpoint_gpu_s,
        cloud_paid_gpu_s=sum(m.gpu_s for m in cloud.meters.values()),
        onprem_gpus=onprem_gpus,
        interruptions=cloud.stats.interruptions,
        checkpoints=accounting.checkpoints,
        requeues=accounting.requeues,
        migrations=accounting.migrations,
        launched=cloud.stats.launched,
        capacity_failures=cloud.stats.capacity_failures,
        held_ticks=held,
        clamps=clamps,
        ticks=controller.ticks,
        tick_ms=list(tick_ms),
        wall_s=time.perf_counter() - started_wall,
        timeline=timeline,
        onprem_idle_gpu_s=accounting.onprem_idle_gpu_s,
        wait_teams=[job.trace.team or UNASSIGNED for job in counted],
        team_short_gpu_s=shortfall.gpu_s,
        team_short_ticks=shortfall.ticks,
        team_late_gpu_s=shortfall.late_gpu_s,
        team_late_ticks=shortfall.late_ticks,
        sampled_ticks=shortfall.samples,
        shares_gpus=shares,
        stranded_gpu_ticks=float(fragments.stranded),
        free_gpu_ticks=float(fragments.free),
        frag_ticks=fragments.ticks,
        team_bill=bill(
            {name: m.cost for name, m in cloud.meters.items()},
            {name: m.gpu_s for name, m in cloud.meters.items()},
            accounting.team_gpu_s,
        ),
    )


def _dispatch(
    kind: str, payload: Any, now: float, scheduler: SimScheduler, cloud: SimCloud
) -> None:
    if kind == "finish":
        job, run_id = payload
        scheduler.finish(job, run_id, now)
    elif kind == "ready":
        cloud.ready(payload, now)
    elif kind == "capacity":
        cloud.capacity_changed(payload, now)
    elif kind == "interrupt":
        cloud.interrupt(payload, now)
    elif kind == "reclaim":
        cloud.reclaim(payload, now)
    elif kind == "checkpoint":
        job, run_id, asked_at = payload
        scheduler.checkpointed(job, run_id, asked_at, now)


@dataclass
class Shortfall:
    gpu_s: dict[str, float] = field(default_factory=dict)
    ticks: dict[str, int] = field(default_factory=dict)
    samples: int = 0
    late_gpu_s: dict[str, float] = field(default_factory=dict)
    late_ticks: dict[str, int] = field(default_factory=dict)
    since: dict[str, float] = field(default_factory=dict)  # short without a break since


def count_short(
    shortfall: Shortfall,
    scheduler: SimScheduler,
    guarantees: dict[str, int],
    period_s: float,
    now: float = 0.0,
    bound_s: float = 0.0,
) -> None:
    """A team with work waiting is short while it holds fewer on-prem GPUs than its guarantee
    or its work, whichever is less (what quotas with borrowing give it back); late once it has
    been short without a break for longer than ``bound_s`` (what the bound did not keep)."""
    shortfall.samples += 1
    held = scheduler.team_gpus()
    for team, guaranteed in guarantees.items():
        holds, waiting = held.get(team, (0.0, 0.0))
        short = max(0.0, min(guaranteed, holds + waiting) - holds) if waiting else 0.0
        if not short:
            shortfall.since.pop(team, None)
            continue
        shortfall.gpu_s[team] = shortfall.gpu_s.get(team, 0.0) + short * period_s
        shortfall.ticks[team] = shortfall.ticks.get(team, 0) + 1
        if now - shortfall.since.setdefault(team, now) > bound_s:
            shortfall.late_gpu_s[team] = shortfall.late_gpu_s.get(team, 0.0) + short * period_s
            shortfall.late_ticks[team] = shortfall.late_ticks.get(team, 0) + 1


@dataclass
class Fragments:
    """Stranded slices (free on partly used shared GPUs) and all free room, summed per tick."""

    stranded: Fraction = Fraction(0)
    free: Fraction = Fraction(0)
    ticks: int = 0

    def sample(self, scheduler: SimScheduler) -> None:
        stranded, free = scheduler.fragmentation()
        self.stranded += stranded
        self.free += stranded + free
        self.ticks += 1


def _sample(timeline: Timeline, t: float, cloud: SimCloud, scheduler: SimScheduler) -> None:
    cloud.settle(t)
    running = sum(scheduler.busy_gpus.values()) + float(sum(scheduler.busy_slices.values()))
    onprem_busy = scheduler.busy_gpus[Capacity.ONPREM] + float(
        scheduler.busy_slices[Capacity.ONPREM]
    )
    timeline.t.append(t)
    timeline.cost.append(cloud.total_cost())
    timeline.cost_per_hour.append(cloud.cost_per_hour(t))
    timeline.pending_gpus.append(scheduler.pending_gpus)
    timeline.running_gpus.append(running)
    timeline.cloud_gpus.append(cloud.live_gpus())
    timeline.onprem_busy_gpus.append(onprem_busy)
