"""The simulated clouds: instances that boot, bill by the second at the real price of the moment,
run out of spot capacity when the availability trace says so, and get interrupted with the
cloud's own notice lead time.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from autoscaler.model import (
    Capacity,
    Instance,
    InstanceState,
    InterruptionNotice,
    NoticeKind,
    Pool,
    PriceQuote,
)
from autoscaler.model.errors import CapacityError
from autoscaler.sim.market import AvailabilityTrace
from autoscaler.sim.scheduler import SimScheduler
from autoscaler.sim.series import StepSeries
from autoscaler.spi.provider import LaunchResult

HOUR = 3600.0


@dataclass
class PoolMarketModel:
    """Everything the simulator knows about one pool's market."""

    price: StepSeries
    on_demand: StepSeries | None = None
    availability: AvailabilityTrace | None = None
    interruption_rate_per_hour: float | None = None
    quoted_rate_per_hour: float | None = None
    source: str = ""

    def capacity(self, t: float) -> float:
        return self.availability.capacity(t) if self.availability is not None else math.inf


@dataclass(slots=True, eq=False)
class SimInstance:
    id: str
    pool: Pool
    request_id: str
    launched_at: float
    ready_at: float
    state: InstanceState
    listed: Instance
    noticed_at: float | None = None
    deadline: float | None = None


@dataclass
class Meter:
    """Running instances of one pool and what they have cost so far."""

    count: int = 0
    since: float = 0.0
    cost: float = 0.0
    gpu_s: float = 0.0
    instance_s: float = 0.0


@dataclass
class CloudStats:
    launched: int = 0
    capacity_failures: int = 0
    interruptions: int = 0
    notices_missed: int = 0
    by_pool_interruptions: dict[str, int] = field(default_factory=dict)


EventSink = Callable[[float, str, object], None]


class SimCloud:
    def __init__(
        self,
        pools: Sequence[Pool],
        markets: Mapping[str, PoolMarketModel],
        notice_lead_s: Mapping[str, float],
        seed: int,
        scheduler: SimScheduler,
        post: EventSink,
    ) -> None:
        self.pools = {p.name: p for p in pools}
        self.markets = markets
        self.notice_lead_s = notice_lead_s
        self.rng = random.Random(seed)
        self.scheduler = scheduler
        self.post = post
        self.instances: dict[str, SimInstance] = {}
        self.by_request: dict[str, list[str]] = {}
        self.meters = {name: Meter() for name in self.pools}
        self.stats = CloudStats()
        self._notices: dict[str, list[InterruptionNotice]] = {}
        self._counter = 0
        self._live_gpus = 0

    # -- provider calls ----------------------------------------------------------------------

    def list_instances(self, provider: str) -> list[Instance]:
        return [i.listed for i in self.instances.values() if i.pool.provider == provider]

    def launch(
        self, pool: Pool, count: int, request_id: str, now: float, team: str | None = None
    ) -> LaunchResult:
        existing = self.by_request.get(request_id)
        if existing is not None:
            return LaunchResult(
                tuple(self.instances[i].listed for i in existing if i in self.instances),
                already_existed=True,
            )
        market = self.markets[pool.name]
        room = market.capacity(now) - self._holding(pool.name)
        granted = count if room >= count else max(0, int(room))
        launched: list[Instance] = []
        for _ in range(granted):
            launched.append(self._start_instance(pool, request_id, now, team).listed)
        self.by_request[request_id] = [i.id for i in launched]
        shortfall = None
        if granted < count:
            self.stats.capacity_failures += 1
            shortfall = CapacityError(
                f"{pool.name}: spot capacity for {granted} of {count}",
                pool=pool.name,
                code="InsufficientInstanceCapacity",
            )
        return LaunchResult(tuple(launched), shortfall)

    def launch_gang(
        self, pool: Pool, count: int, request_id: str, now: float, team: str | None = None
    ) -> LaunchResult:
        """All ``count`` instances or none: a gang the pool cannot hold whole is not started
        (the simulated placement group has room for the whole gang or for nothing)."""
        existing = self.by_request.get(request_id)
        if existing is not None:
            return LaunchResult(
                tuple(self.instances[i].listed for i in existing if i in self.instances),
                already_existed=True,
            )
        room = self.markets[pool.name].capacity(now) - self._holding(pool.name)
        if room < count:
            self.stats.capacity_failures += 1
            raise CapacityError(
                f"{pool.name}: spot capacity for {max(0, int(room))} of a gang of {count}; "
                "none launched",
                pool=pool.name,
                code="InsufficientInstanceCapacity",
            )
        launched = [self._start_instance(pool, request_id, now, team).listed for _ in range(count)]
        self.by_request[request_id] = [i.id for i in launched]
        return LaunchResult(tuple(launched))

    def terminate(self, ids: Sequence[str], now: float) -> None:
        for instance_id in ids:
            instance = self.instances.get(instance_id)
            if instance is not None:
                self._remove(instance, now)

    def take_notices(self, provider: str) -> list[InterruptionNotice]:
        return self._notices.pop(provider, [])

    def quote(self, pool: Pool, now: float) -> PriceQuote:
        market = self.markets[pool.name]
        return PriceQuote.model_construct(
            pool=pool.name,
            price_per_hour=market.price.at(now),
            on_demand_price_per_hour=market.on_demand.at(now)
            if market.on_demand is not None
            else None,
            interruption_rate_per_hour=market.quoted_rate_per_hour,
            as_of=now,
            source=market.source,
        )

    # -- world events ------------------------------------------------------------------------

    def ready(self, instance_id: str, now: float) -> None:
        instance = self.instances.get(instance_id)
        if instance is None or instance.state is not InstanceState.PENDING:
            return
        instance.state = InstanceState.RUNNING
        instance.listed = instance.listed.model_copy(update={"state": InstanceState.RUNNING})
        kind = Capacity.SPOT if instance.pool.is_spot else Capacity.ON_DEMAND
        self.scheduler.add_node(
            instance.id,
            instance.pool.gpus_per_instance,
            kind,
            instance.pool.name,
            now,
            instance.pool.gpu_model,
            instance.pool.gpu_memory_gib,
            locality=f"{instance.pool.provider}:{instance.pool.region}",
        )
        if instance.noticed_at is not None:
            self.scheduler.drain(instance.id, "interruption notice before boot finished")

    def capacity_changed(self, pool_name: str, now: float) -> None:
        market = self.markets[pool_name]
        capacity = market.capacity(now)
        holding = [
            i for i in self.instances.values() if i.pool.name == pool_name and i.noticed_at is None
        ]
        excess = len(holding) - capacity
        if excess > 0:
            victims = self.rng.sample(sorted(holding, key=lambda i: i.id), int(excess))
            for victim in sorted(victims, key=lambda i: i.id):
                self.interrupt(victim.id, now)
        if market.availability is not None:
            self.post(market.availability.next_change(now), "capacity", pool_name)

    def interrupt(self, instance_id: str, now: float) -> None:
        instance = self.instances.get(instance_id)
        if instance is None or instance.noticed_at is not None:
            return
        lead = self.notice_lead_s.get(instance.pool.provider, 0.0)
        instance.noticed_at = now
        instance.deadline = now + lead
        self.stats.interruptions += 1
        self.stats.by_pool_interruptions[instance.pool.name] = (
            self.stats.by_pool_interruptions.get(instance.pool.name, 0) + 1
        )
        self._notices.setdefault(instance.pool.provider, []).append(
            InterruptionNotice.model_construct(
                instance_id=instance.id,
                pool=instance.pool.name,
                kind=NoticeKind.TERMINATE,
                received_at=now,
                deadline=instance.deadline,
            )
        )
        self.post(instance.deadline, "reclaim", instance.id)
        self.post(now, "wake", None)  # a notice wakes the live loop before its next tick

    def reclaim(self, instance_id: str, now: float) -> None:
        instance = self.instances.get(instance_id)
        if instance is not None:
            self._remove(instance, now)

    # -- accounting --------------------------------------------------------------------------

    def settle(self, now: float) -> None:
        for name in self.meters:
            self._settle(name, now)

    def total_cost(self) -> float:
        return sum(m.cost for m in self.meters.values())

    def cost_per_hour(self, now: float) -> float:
        return sum(m.count * self.markets[name].price.at(now) for name, m in self.meters.items())

    def live_gpus(self) -> int:
        return self._live_gpus

    # -- internals ---------------------------------------------------------------------------

    def _holding(self, pool_name: str) -> int:
        return sum(
            1 for i in self.instances.values() if i.pool.name == pool_name and i.noticed_at is None
        )

    def _start_instance(
        self, pool: Pool, request_id: str, now: float, team: str | None = None
    ) -> SimInstance:
        """A new instance, listed with the team it was bought for, as a cloud's tag keeps it."""
        self._counter += 1
        instance_id = f"sim-{self._counter:07d}"
        listed = Instance.model_construct(
            id=instance_id,
            pool=pool.name,
            state=InstanceState.PENDING,
            launched_at=now,
            request_id=request_id,
            gpus=pool.gpus_per_instance,
            team=team or None,
        )
        instance = SimInstance(
            instance_id,
            pool,
            request_id,
            now,
            now + pool.boot_seconds,
            InstanceState.PENDING,
            listed,
        )
        self.instances[instance_id] = instance
        self._settle(pool.name, now)
        self.meters[pool.name].count += 1
        self._live_gpus += pool.gpus_per_instance
        self.stats.launched += 1
        self.post(instance.ready_at, "ready", instance_id)
        rate = self.markets[pool.name].interruption_rate_per_hour
        if pool.is_spot and rate:
            self.post(now + self.rng.expovariate(rate / HOUR), "interrupt", instance_id)
        return instance

    def _remove(self, instance: SimInstance, now: float) -> None:
        del self.instances[instance.id]
        self._settle(instance.pool.name, now)
        self.meters[instance.pool.name].count -= 1
        self._live_gpus -= instance.pool.gpus_per_instance
        self.scheduler.remove_node(instance.id, now)

    def _settle(self, pool_name: str, now: float) -> None:
        meter = self.meters[pool_name]
        if now > meter.since:
            if meter.count:
                price = self.markets[pool_name].price
                meter.cost += meter.count * price.integral(meter.since, now) / HOUR
                meter.instance_s += meter.count * (now - meter.since)
                meter.gpu_s += (
                    meter.count * self.pools[pool_name].gpus_per_instance * (now - meter.since)
                )
            meter.since = now
