"""One controller tick at scale, through the real ``Controller`` and the default policy.

The fake world: 10,000 running cloud instances spread over 200 pools (spot and on-demand; 1, 4
and 8 GPUs per instance; each pool priced), 2,000 on-prem nodes of 8 GPUs with varied allocation
and utilisation, and 100,000 pending jobs (1/2/4/8 GPUs, some checkpointable, some high priority)
folded into demand groups by ``aggregate`` inside the queue source's ``read`` on every tick,
because a live queue source pays for that aggregation every tick too.

The world keeps its size: launches are accepted but nothing materialises (the provider returns
no instances), and an instance the controller terminates is replaced at once by a fresh one in
the same pool, so every tick sees 10,000 live instances. Controller state (instance table,
capacity cache, cool-downs, last plan) carries over from tick to tick as it would live.

Prints median, p95 and max tick time, a per-step breakdown (observe / decide / guard / act and
their main parts, measured by wrapping the steps in place for a few extra ticks) and the cProfile
top functions by cumulative time for one tick. Figures only; nothing is asserted.

    .venv/bin/python bench/bench_tick.py [--ticks 40] [--json OUT.json]
"""

from __future__ import annotations

import argparse
import cProfile
import functools
import gc
import io
import json
import math
import pstats
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import autoscaler.tick.controller as controller_module
import policies.cost_aware as cost_aware_module
from autoscaler.model import (
    DemandGroup,
    Instance,
    InstanceState,
    InterruptionNotice,
    Job,
    Market,
    OnPremNode,
    Placement,
    Pool,
    PriceQuote,
)
from autoscaler.model.clock import ManualClock
from autoscaler.model.config import ControllerConfig, Limits
from autoscaler.ops.journal.base import open_sqlite
from autoscaler.ops.metrics import Metrics
from autoscaler.spi.policy import load_policy
from autoscaler.spi.provider import LaunchResult
from autoscaler.spi.sources import NodeReading, NodeUsage, aggregate
from autoscaler.tick.controller import Controller
from autoscaler.tick.retry import RetryPolicy

TARGET_MEDIAN_MS = 200.0
PROVIDERS = ("aws", "gcp", "azure")
SHAPES = (1, 4, 8)
GPU_MODELS = {1: "L4", 4: "A10G", 8: "A100-80GB"}
# Hourly on-demand price of one GPU of each model; spot trades at 30-70 % of it.
GPU_PRICE = {"L4": 0.8, "A10G": 1.2, "A100-80GB": 4.1}
START = 1_700_000_000.0
TICK_S = 60.0


# -- the fake world ----------------------------------------------------------------------------


@dataclass
class World:
    """Everything the fakes serve, kept at the size it was built with.

    A launched instance is listed (pending, then running once its pool's boot time has passed)
    and the oldest instance of its pool leaves the listing in exchange, as if reclaimed; a
    terminated instance is replaced by a fresh running one in the same pool. Either way every
    pool keeps its instance count, so every tick sees the same number of live instances.
    """

    pools: list[Pool]
    quotes: dict[str, tuple[float, float, float | None]]
    by_pool: dict[str, dict[str, Instance]]  # pool -> id -> instance, oldest first
    usage: dict[str, NodeUsage]
    onprem: tuple[OnPremNode, ...] = ()
    jobs: list[Job] = field(default_factory=list)
    pool_by_name: dict[str, Pool] = field(default_factory=dict)
    pools_of: dict[str, list[str]] = field(default_factory=dict)
    booting: dict[str, float] = field(default_factory=dict)  # id -> ready at
    serial: int = 0
    launched: int = 0
    retired: int = 0
    replaced: int = 0

    def __post_init__(self) -> None:
        self.pool_by_name = {p.name: p for p in self.pools}
        for pool in self.pools:
            self.pools_of.setdefault(pool.provider, []).append(pool.name)
            self.by_pool.setdefault(pool.name, {})

    def add(
        self,
        pool: Pool,
        launched_at: float,
        usage: NodeUsage,
        state: InstanceState = InstanceState.RUNNING,
        request_id: str | None = None,
    ) -> Instance:
        self.serial += 1
        instance = Instance(
            id=f"i-{self.serial:08x}",
            pool=pool.name,
            state=state,
            launched_at=launched_at,
            request_id=request_id or f"bench-{pool.name}-{self.serial}",
            gpus=pool.gpus_per_instance,
        )
        self.by_pool[pool.name][instance.id] = instance
        self.usage[instance.id] = usage
        if state is InstanceState.PENDING:
            self.booting[instance.id] = launched_at + pool.boot_seconds
        return instance

    def remove(self, pool_name: str, instance_id: str) -> Instance | None:
        gone = self.by_pool[pool_name].pop(instance_id, None)
        if gone is not None:
            self.usage.pop(instance_id, None)
            self.booting.pop(instance_id, None)
        return gone

    def listing(self, provider: str, now: float) -> list[Instance]:
        for instance_id, ready_at in list(self.booting.items()):
            if ready_at <= now:
                del self.booting[instance_id]
                for name in self.pools_of[provider]:
                    found = self.by_pool[name].get(instance_id)
                    if found is not None:
                        self.by_pool[name][instance_id] = found.model_copy(
                            update={"state": InstanceState.RUNNING}
                        )
        listed: list[Instance] = []
        for name in self.pools_of[provider]:
            listed.extend(self.by_pool[name].values())
        return listed

    @property
    def live_instances(self) -> int:
        return sum(len(v) for v in self.by_pool.values())


class FakeProvider:
    """Serves the fake world through the provider protocol; every call returns at once."""

    def __init__(self, name: str, world: World, clock: ManualClock) -> None:
        self.name = name
        self.world = world
        self.clock = clock

    def list_instances(self, fleet_id: str) -> list[Instance]:
        return self.world.listing(self.name, self.clock.now())

    def launch(
        self, pool: Pool, count: int, request_id: str, fleet_id: str, *, team: str | None = None
    ) -> LaunchResult:
        now = self.clock.now()
        world = self.world
        launched = []
        for _ in range(count):
            oldest = next(iter(world.by_pool[pool.name]), None)
            if oldest is not None:
                world.remove(pool.name, oldest)
                world.retired += 1
            usage = NodeUsage(0, None)  # booting: not joined yet
            launched.append(world.add(pool, now, usage, InstanceState.PENDING, request_id))
        world.launched += count
        return LaunchResult(instances=tuple(launched))

    def terminate(self, instance_ids: Sequence[str], request_id: str) -> None:
        now = self.clock.now()
        world = self.world
        for instance_id in instance_ids:
            for name in world.pools_of[self.name]:
                gone = world.remove(name, instance_id)
                if gone is not None:
                    world.replaced += 1
                    pool = world.pool_by_name[name]
                    world.add(pool, now, NodeUsage(pool.gpus_per_instance, 90.0))
                    break

    def prices(self, pools: Sequence[Pool]) -> list[PriceQuote]:
        now = self.clock.now()
        quotes = []
        for pool in pools:
            price, on_demand, rate = self.world.quotes[pool.name]
            quotes.append(
                PriceQuote.model_construct(
                    pool=pool.name,
                    price_per_hour=price,
                    on_demand_price_per_hour=on_demand,
                    interruption_rate_per_hour=rate,
                    as_of=now,
                    source="bench",
                )
            )
        return quotes

    def poll_notices(self) -> list[InterruptionNotice]:
        return []


class FakeQueue:
    """Folds the 100k pending jobs into demand groups on every read, as a live source would."""

    name = "bench-queue"

    def __init__(self, jobs: list[Job]) -> None:
        self.jobs = jobs

    def read(self, now: float) -> Sequence[DemandGroup]:
        return aggregate(self.jobs)


class FakeNodes:
    name = "bench-nodes"

    def __init__(self, world: World) -> None:
        self.world = world

    def read_nodes(self, now: float) -> NodeReading:
        return NodeReading(self.world.onprem, self.world.usage)


class FakeScheduler:
    def apply_placement(self, placement: Placement) -> None:
        return None

    def drain(self, node: str, reason: str) -> int:
        return 0

    def evict(self, node: str, reason: str) -> int:
        return 0


def build_world(
    n_pools: int, n_instances: int, n_onprem: int, n_jobs: int, seed: int, now: float
) -> World:
    rng = random.Random(seed)
    pools: list[Pool] = []
    quotes: dict[str, tuple[float, float, float | None]] = {}
    for i in range(n_pools):
        provider = PROVIDERS[i % len(PROVIDERS)]
        gpus = SHAPES[(i // len(PROVIDERS)) % len(SHAPES)]
        spot = i % 4 != 3  # three spot pools in four
        model = GPU_MODELS[gpus]
        region = f"{provider}-region-{i % 7}"
        pools.append(
            Pool(
                name=f"{provider}-{i:03d}-{gpus}g-{'spot' if spot else 'od'}",
                provider=provider,
                region=region,
                zone=f"{region}{'abc'[i % 3]}",
                instance_type=f"{model.lower()}.{gpus}x",
                gpus_per_instance=gpus,
                gpu_model=model,
                market=Market.SPOT if spot else Market.ON_DEMAND,
                max_instances=2 * math.ceil(n_instances / n_pools),
                boot_seconds=180,
            )
        )
        on_demand = GPU_PRICE[model] * gpus * rng.uniform(0.95, 1.1)
        if spot:
            rate = rng.choice((None, rng.uniform(0.005, 0.3)))
            quotes[pools[-1].name] = (on_demand * rng.uniform(0.3, 0.7), on_demand, rate)
        else:
            quotes[pools[-1].name] = (on_demand, on_demand, None)

    world = World(pools, quotes, {}, {})
    for k in range(n_instances):
        pool = pools[k % n_pools]
        world.add(
            pool, now - rng.uniform(600, 3 * 86_400), _cloud_usage(rng, pool.gpus_per_instance, now)
        )

    onprem = []
    for k in range(n_onprem):
        allocated = rng.choices((8, 6, 4, 2, 1, 0), weights=(60, 10, 10, 8, 4, 8))[0]
        util = None if rng.random() < 0.02 else rng.uniform(0, 100) * allocated / 8
        onprem.append(
            OnPremNode(
                name=f"onprem-{k:05d}",
                gpus=8,
                gpu_model="A100-80GB" if k % 2 else "H100",
                gpus_allocated=allocated,
                gpu_util_pct=util,
                idle_since=now - rng.uniform(0, 7200) if util is not None and util < 5 else None,
                schedulable=rng.random() > 0.01,
            )
        )
    world.onprem = tuple(onprem)

    jobs = []
    for k in range(n_jobs):
        gpus = rng.choices((1, 2, 4, 8), weights=(70, 12, 10, 8))[0]
        checkpointable = rng.random() < 0.55
        jobs.append(
            Job(
                id=f"job-{k:06d}",
                gpus=gpus,
                submit_time=now - rng.uniform(0, 6 * 3600),
                high_priority=rng.random() < 0.1,
                checkpoint_interval_s=rng.choice((900.0, 1800.0, 3600.0))
                if checkpointable
                else None,
                checkpoint_duration_s=60.0 if checkpointable else None,
                gpu_models=rng.choices(((), ("A100-80GB",), ("H100",)), weights=(80, 15, 5))[0],
                partition=rng.choice(("batch", "train", "interactive")),
            )
        )
    world.jobs = jobs
    return world


def _cloud_usage(rng: random.Random, gpus: int, now: float) -> NodeUsage:
    roll = rng.random()
    if roll < 0.75:  # busy: fully allocated
        return NodeUsage(gpus, rng.uniform(40, 100))
    if roll < 0.92:  # partly allocated
        allocated = rng.randint(1, gpus) if gpus > 1 else 1
        return NodeUsage(allocated, rng.uniform(5, 100) * allocated / gpus)
    if roll < 0.97:  # allocated but its GPUs do nothing (idle by measured utilisation)
        return NodeUsage(gpus, rng.uniform(0, 4), idle_since=now - rng.uniform(0, 3600))
    since = now - rng.uniform(0, 3600)  # empty
    return NodeUsage(0, 0.0, idle_since=since, empty_since=since)


def build_controller(
    world: World, clock: ManualClock, n_instances: int, journal_dir: Path | None = None
) -> Controller:
    live_cost = sum(world.quotes[name][0] * len(group) for name, group in world.by_pool.items())
    config = ControllerConfig(
        fleet_id="bench",
        pools=tuple(world.pools),
        limits=Limits(
            max_instances=2 * n_instances,
            max_gpus=20 * n_instances,
            max_cost_per_hour=round(live_cost * 1.25, 2),
            max_launches_per_tick=50,
            max_drains_per_tick=50,
            scale_down_cooldown_s=300,
        ),
    )
    providers = {name: FakeProvider(name, world, clock) for name in PROVIDERS}
    return Controller(
        config,
        load_policy("cost-aware", {}),
        providers,
        clock,
        [FakeQueue(world.jobs)],
        FakeNodes(world),
        FakeScheduler(),
        incarnation="bench",
        retry=RetryPolicy(sleep=lambda _s: None),
        journal=open_sqlite(journal_dir / "journal.db") if journal_dir is not None else None,
        metrics=Metrics() if journal_dir is not None else None,
    )


# -- measuring ---------------------------------------------------------------------------------


class Probes:
    """Wraps named callables in place and sums their time per tick (restored by ``remove``)."""

    def __init__(self) -> None:
        self.order: list[str] = []
        self.current: dict[str, float] = {}
        self.ticks: list[dict[str, float]] = []
        self._undo: list[Callable[[], None]] = []

    def wrap(self, owner: Any, attribute: str, label: str) -> None:
        original = getattr(owner, attribute, None)
        if original is None:  # renamed or gone in this version of the code: skip the probe
            return
        self.order.append(label)

        @functools.wraps(original)
        def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                self.current[label] = self.current.get(label, 0.0) + time.perf_counter() - started

        had_own = isinstance(owner, type) or attribute in getattr(owner, "__dict__", {})
        setattr(owner, attribute, timed)
        if had_own or not hasattr(owner, "__dict__"):
            self._undo.append(lambda: setattr(owner, attribute, original))
        else:
            self._undo.append(lambda: delattr(owner, attribute))

    def end_tick(self) -> None:
        self.ticks.append(self.current)
        self.current = {}

    def remove(self) -> None:
        for undo in reversed(self._undo):
            undo()
        self._undo.clear()

    def mean_ms(self, label: str) -> float:
        return statistics.fmean(t.get(label, 0.0) for t in self.ticks) * 1000.0


def install_probes(ctl: Controller, probes: Probes) -> None:
    observer, actuator, policy = ctl.observer, ctl.actuator, ctl.policy
    for name, provider in observer.providers.items():
        probes.wrap(provider, "list_instances", f"  provider.list_instances ({name})")
    probes.wrap(ctl.observer, "observe", "observe")
    probes.wrap(ctl.table, "sync", "  table.sync")
    probes.wrap(ctl.history, "expose", "  history.expose")
    probes.wrap(observer.signals.queues[0], "read", "  queue read = aggregate(100k jobs)")
    probes.wrap(observer, "_read_nodes", "  node source read")
    probes.wrap(observer, "_cloud_nodes", "  _cloud_nodes (CloudNode per instance)")
    probes.wrap(observer, "_pool_views", "  _pool_views")
    probes.wrap(ctl, "_decide", "decide (policy + validate_plan)")
    probes.wrap(controller_module, "validate_plan", "  validate_plan")
    probes.wrap(cost_aware_module, "idle_nodes", "  idle_nodes")
    probes.wrap(cost_aware_module, "supply", "  supply")
    probes.wrap(cost_aware_module, "displaced", "  displaced")
    probes.wrap(cost_aware_module, "needs_from", "  needs_from")
    probes.wrap(cost_aware_module, "unmet", "  unmet")
    probes.wrap(cost_aware_module, "pack", "  pack")
    probes.wrap(policy, "_offers", "    _offers (incl. headroom)")
    probes.wrap(cost_aware_module, "drain_requests", "  drain_requests")
    probes.wrap(controller_module, "guard", "guard")
    probes.wrap(actuator, "act", "act")
    probes.wrap(actuator, "_progress_drains", "  _progress_drains")
    probes.wrap(actuator, "_collect_orphans", "  _collect_orphans")
    probes.wrap(actuator, "_launch", "  _launch (all launches)")


TOP_LEVEL = ("observe", "decide (policy + validate_plan)", "guard", "act")


class GcWatch:
    """Counts the garbage collector's passes and the time they take while installed."""

    def __init__(self) -> None:
        self.passes = [0, 0, 0]
        self.seconds = 0.0
        self._started = 0.0

    def __enter__(self) -> GcWatch:
        gc.callbacks.append(self._callback)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self._callback)

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.seconds += time.perf_counter() - self._started
            self.passes[info["generation"]] += 1


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def describe_view(ctl: Controller, world: World, clock: ManualClock) -> dict[str, Any]:
    report = ctl.tick()
    clock.advance(TICK_S)
    view = report.view
    return {
        "cloud_instances_in_view": len(view.instances),
        "live_instances_listed": world.live_instances,
        "pools": len(view.pools),
        "onprem_nodes": len(view.onprem),
        "onprem_gpus": view.onprem_gpus,
        "pending_jobs": view.demand.jobs,
        "demand_groups": len(view.demand.groups),
        "launch_requests": len(report.plan.launches),
        "instances_requested": sum(x.count for x in report.plan.launches),
        "drains_planned": len(report.plan.drains),
        "clamps": len(report.clamps),
        "actions": len(report.actions),
    }


def run(
    ticks: int = 40,
    warmup: int = 3,
    breakdown_ticks: int = 10,
    n_pools: int = 200,
    n_instances: int = 10_000,
    n_onprem: int = 2_000,
    n_jobs: int = 100_000,
    seed: int = 1,
    profile_top: int = 15,
    journal_dir: Path | None = None,
) -> dict[str, Any]:
    started = time.perf_counter()
    world = build_world(n_pools, n_instances, n_onprem, n_jobs, seed, START)
    clock = ManualClock(START)
    ctl = build_controller(world, clock, n_instances, journal_dir)
    build_s = time.perf_counter() - started
    print(
        f"world: {n_instances:,} cloud instances in {n_pools} pools, {n_onprem:,} on-prem nodes "
        f"x 8 GPUs, {n_jobs:,} pending jobs; built in {build_s:.1f} s"
    )

    for _ in range(warmup):
        ctl.tick()
        clock.advance(TICK_S)

    times_ms: list[float] = []
    cpu_ms: list[float] = []
    with GcWatch() as gc_watch:
        for _ in range(ticks):
            t0, c0 = time.perf_counter(), time.process_time()
            ctl.tick()
            cpu_ms.append((time.process_time() - c0) * 1000.0)
            times_ms.append((time.perf_counter() - t0) * 1000.0)
            clock.advance(TICK_S)

    shape = describe_view(ctl, world, clock)

    probes = Probes()
    install_probes(ctl, probes)
    probe_total: list[float] = []
    try:
        for _ in range(breakdown_ticks):
            t0 = time.perf_counter()
            ctl.tick()
            probe_total.append((time.perf_counter() - t0) * 1000.0)
            probes.end_tick()
            clock.advance(TICK_S)
    finally:
        probes.remove()

    profiler = cProfile.Profile()
    profiler.enable()
    ctl.tick()
    profiler.disable()
    clock.advance(TICK_S)
    stream = io.StringIO()
    stats = pstats.Stats(profiler, stream=stream)
    stats.sort_stats("cumulative").print_stats(profile_top)

    median = statistics.median(times_ms)
    result: dict[str, Any] = {
        "ticks": ticks,
        "warmup": warmup,
        "median_ms": median,
        "p95_ms": percentile(times_ms, 0.95),
        "max_ms": max(times_ms),
        "min_ms": min(times_ms),
        "cpu_median_ms": statistics.median(cpu_ms),
        "cpu_p95_ms": percentile(cpu_ms, 0.95),
        "mean_ms": statistics.fmean(times_ms),
        "target_median_ms": TARGET_MEDIAN_MS,
        "target_met": median <= TARGET_MEDIAN_MS,
        "shape": shape,
        "breakdown_ticks": breakdown_ticks,
        "breakdown_mean_tick_ms": statistics.fmean(probe_total),
        "breakdown_ms": {label: probes.mean_ms(label) for label in probes.order},
        "tick_ms": times_ms,
        "gc_passes_by_generation": gc_watch.passes,
        "gc_ms_total": gc_watch.seconds * 1000.0,
        "instances_launched": world.launched,
        "instances_retired_for_launches": world.retired,
        "instances_terminated_and_replaced": world.replaced,
    }

    print()
    print(f"tick time over {ticks} ticks (after {warmup} warm-up ticks, 60 s apart):")
    print(
        f"  median {median:8.1f} ms   p95 {result['p95_ms']:8.1f} ms   "
        f"max {result['max_ms']:8.1f} ms   (min {result['min_ms']:.1f}, "
        f"mean {result['mean_ms']:.1f})"
    )
    print(
        f"  CPU time of this process per tick: median {result['cpu_median_ms']:.1f} ms, "
        f"p95 {result['cpu_p95_ms']:.1f} ms (wall minus this = time lost to other processes)"
    )
    print(
        f"  garbage collector during the timed ticks: {gc_watch.seconds * 1000.0:.0f} ms in "
        f"{sum(gc_watch.passes)} pass(es) (by generation {gc_watch.passes})"
    )
    verdict = "met" if result["target_met"] else "MISSED"
    print(f"  target: median <= {TARGET_MEDIAN_MS:.0f} ms -> {verdict}")
    print()
    print("what a tick sees (one tick after the timed ones):")
    for key, value in shape.items():
        print(f"  {key:28s} {value:>10,}")
    print(
        f"  (whole run: {world.launched:,} instance(s) launched, each retiring the oldest of its "
        f"pool; {world.replaced:,} terminated and replaced)"
    )
    print()
    total = result["breakdown_mean_tick_ms"]
    print(
        f"breakdown: mean per tick over {breakdown_ticks} probed ticks "
        f"(mean tick with probes {total:.1f} ms; indented rows are parts of the row above)"
    )
    for label in probes.order:
        ms = result["breakdown_ms"][label]
        share = 100.0 * ms / total if total else 0.0
        print(f"  {label:48s} {ms:8.2f} ms  {share:5.1f} %")
    accounted = sum(result["breakdown_ms"][label] for label in TOP_LEVEL)
    print(f"  {'(tick overhead outside the four steps)':48s} {total - accounted:8.2f} ms")
    print()
    print(f"cProfile of one tick, top {profile_top} by cumulative time:")
    print(_trim_profile(stream.getvalue()))
    return result


def _trim_profile(text: str) -> str:
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.lstrip().startswith("ncalls"):
            return "\n".join([*lines[max(0, i - 4) : i], *lines[i:]]).rstrip()
    return text.rstrip()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--ticks", type=int, default=40, help="timed ticks (>= 30 advised)")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--breakdown-ticks", type=int, default=10)
    parser.add_argument("--pools", type=int, default=200)
    parser.add_argument("--instances", type=int, default=10_000)
    parser.add_argument("--onprem", type=int, default=2_000)
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--profile-top", type=int, default=15)
    parser.add_argument("--json", type=Path, help="also write the figures here as JSON")
    parser.add_argument(
        "--production",
        action="store_true",
        help="as `gpu-autoscaler run` ticks: an SQLite journal (in a temporary folder) and metrics",
    )
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as folder:
        return _main(args, Path(folder) if args.production else None)


def _main(args: argparse.Namespace, journal_dir: Path | None) -> int:
    result = run(
        ticks=args.ticks,
        warmup=args.warmup,
        breakdown_ticks=args.breakdown_ticks,
        n_pools=args.pools,
        n_instances=args.instances,
        n_onprem=args.onprem,
        n_jobs=args.jobs,
        seed=args.seed,
        profile_top=args.profile_top,
        journal_dir=journal_dir,
    )
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
