"""The simulator's provider: one cloud of the simulated world, behind the same protocol as AWS,
GCP and Azure, so a dry run exercises the controller's real act step.

``SimProvider.from_config`` gives the same cloud to the live controller on the wall clock: a
cloud with no network and no bill, so the controller, its container image and its dashboards can
be run and watched end to end before any credentials exist. Instances boot after the pool's
``boot_seconds``; spot instances may be interrupted at a configured rate, with a notice
``notice_lead_s`` ahead as a real cloud gives one.
"""

from __future__ import annotations

import heapq
import itertools
import math
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, NonNegativeFloat, NonNegativeInt

from autoscaler.model import Instance, InterruptionNotice, Pool, PriceQuote
from autoscaler.model.catalog import AWS_CATALOG, InstanceCatalog
from autoscaler.model.clock import Clock, SystemClock
from autoscaler.model.errors import InputError, InvalidRequest
from autoscaler.model.inputfile import validate_settings
from autoscaler.sim.cloud import PoolMarketModel, SimCloud
from autoscaler.sim.scheduler import SimScheduler
from autoscaler.sim.series import StepSeries
from autoscaler.spi.provider import LaunchResult


class SimProvider:
    # what ``providers.sim`` and a pool's ``options`` hold (``gpu-autoscaler schema``); set
    # below, where the models are
    Settings: ClassVar[type[BaseModel]]
    PoolOptions: ClassVar[type[BaseModel]]

    def __init__(self, cloud: SimCloud, provider: str, clock: Clock) -> None:
        self.name = provider
        self.cloud = cloud
        self.clock = clock

    @classmethod
    def from_config(
        cls,
        settings: Mapping[str, Any],
        pools: Sequence[Pool],
        fleet_id: str,
        clock: Clock | None = None,
    ) -> LiveSimProvider:
        """A simulated cloud for the live controller (``providers: {sim: ...}`` in its config)."""
        parsed = validate_settings(SimSettings, dict(settings), field="providers.sim")
        return LiveSimProvider(parsed, pools, clock or SystemClock())

    def list_instances(self, fleet_id: str) -> list[Instance]:
        return self.cloud.list_instances(self.name)

    def launch(
        self, pool: Pool, count: int, request_id: str, fleet_id: str, *, team: str | None = None
    ) -> LaunchResult:
        return self.cloud.launch(pool, count, request_id, self.clock.now(), team)

    def launch_gang(
        self, pool: Pool, count: int, request_id: str, fleet_id: str, *, team: str | None = None
    ) -> LaunchResult:
        return self.cloud.launch_gang(pool, count, request_id, self.clock.now(), team)

    def terminate(self, instance_ids: Sequence[str], request_id: str) -> None:
        self.cloud.terminate(instance_ids, self.clock.now())

    def prices(self, pools: Sequence[Pool]) -> list[PriceQuote]:
        now = self.clock.now()
        return [self.cloud.quote(pool, now) for pool in pools]

    def poll_notices(self) -> list[InterruptionNotice]:
        return self.cloud.take_notices(self.name)

    def acknowledge(self, notices: Sequence[InterruptionNotice]) -> None:
        """Simulated notices are gone once read."""


class SimSettings(BaseModel):
    """``providers.sim`` of a live controller's config."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    boot_seconds: NonNegativeFloat | None = Field(
        None, description="boot delay of every pool's instances (unset: each pool's own)"
    )
    prices: dict[str, NonNegativeFloat] = Field(
        default_factory=dict, description="price per hour by pool name"
    )
    spot_discount: float = Field(
        0.35, gt=0, le=1, description="a spot pool's price as a fraction of its on-demand price"
    )
    catalog: str | None = Field(
        None, description="instance type catalog CSV pricing pools (default: the shipped AWS one)"
    )
    capacity: dict[str, NonNegativeInt] = Field(
        default_factory=dict, description="most instances a pool holds at once (unset: no limit)"
    )
    interruption_rate_per_hour: NonNegativeFloat = Field(
        0.0, description="interruptions per spot instance-hour"
    )
    notice_lead_s: NonNegativeFloat = 120.0
    seed: int = 0


class SimPoolOptions(BaseModel):
    """``options`` of a pool on the simulated cloud: its prices, ahead of settings and catalog."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    price_per_hour: NonNegativeFloat | None = None
    on_demand_price_per_hour: NonNegativeFloat | None = None


SimProvider.Settings = SimSettings
SimProvider.PoolOptions = SimPoolOptions


@dataclass
class _Capped(PoolMarketModel):
    """A market whose spot capacity is a fixed number of instances."""

    limit: float = math.inf

    def capacity(self, t: float) -> float:
        return self.limit


class LiveSimProvider(SimProvider):
    """The simulated cloud on the wall clock. The cloud's events (boots, interruptions, reclaims)
    are kept in a heap and applied when they fall due: before every provider call, so what a tick
    sees never depends on thread timing, and from a thread between ticks, so an interruption
    notice wakes the run loop as a real cloud's would."""

    def __init__(self, settings: SimSettings, pools: Sequence[Pool], clock: Clock) -> None:
        self.settings = settings
        self._pools = {
            p.name: p.model_copy(update={"boot_seconds": settings.boot_seconds})
            if settings.boot_seconds is not None
            else p
            for p in pools
        }
        markets = _markets(settings, pools)
        self._events: list[tuple[float, int, str, object]] = []
        self._counter = itertools.count()
        self._lock = threading.RLock()
        self._wakeup: Callable[[], None] | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        scheduler = SimScheduler(clock, 5.0, lambda job, end: None)
        cloud = SimCloud(
            list(self._pools.values()),
            markets,
            {"sim": settings.notice_lead_s},
            settings.seed,
            scheduler,
            self._post,
        )
        super().__init__(cloud, "sim", clock)

    # -- the provider protocol, each call first catching the world up with the clock ---------

    def list_instances(self, fleet_id: str) -> list[Instance]:
        with self._lock:
            self._catch_up()
            return super().list_instances(fleet_id)

    def launch(
        self, pool: Pool, count: int, request_id: str, fleet_id: str, *, team: str | None = None
    ) -> LaunchResult:
        known = self._pools.get(pool.name)
        if known is None:
            raise InvalidRequest(
                f"pool {pool.name!r} is not a pool of the sim cloud", pool=pool.name
            )
        with self._lock:
            self._catch_up()
            return super().launch(known, count, request_id, fleet_id, team=team)

    def launch_gang(
        self, pool: Pool, count: int, request_id: str, fleet_id: str, *, team: str | None = None
    ) -> LaunchResult:
        known = self._pools.get(pool.name)
        if known is None:
            raise InvalidRequest(
                f"pool {pool.name!r} is not a pool of the sim cloud", pool=pool.name
            )
        with self._lock:
            self._catch_up()
            return super().launch_gang(known, count, request_id, fleet_id, team=team)

    def terminate(self, instance_ids: Sequence[str], request_id: str) -> None:
        with self._lock:
            self._catch_up()
            super().terminate(instance_ids, request_id)

    def prices(self, pools: Sequence[Pool]) -> list[PriceQuote]:
        with self._lock:
            return super().prices([p for p in pools if p.name in self._pools])

    def poll_notices(self) -> list[InterruptionNotice]:
        with self._lock:
            self._catch_up()
            return super().poll_notices()

    def interrupt(self, instance_id: str) -> None:
        """Take a spot instance away now, with the configured notice (for drills and tests)."""
        with self._lock:
            self._catch_up()
            self.cloud.interrupt(instance_id, self.clock.now())
            woken = self._catch_up()
        if woken and self._wakeup is not None:
            self._wakeup()

    # -- the run loop's hooks ----------------------------------------------------------------

    def start(self, wakeup: Callable[[], None]) -> None:
        self._wakeup = wakeup
        self._stop.clear()
        self._thread = threading.Thread(target=self._watch, name="sim-cloud", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    # -- the world's events ------------------------------------------------------------------

    def _post(self, when: float, kind: str, payload: object) -> None:
        heapq.heappush(self._events, (when, next(self._counter), kind, payload))

    def _catch_up(self) -> bool:
        """Apply every event now due; True when one of them should wake the run loop."""
        woken = False
        now = self.clock.now()
        while self._events and self._events[0][0] <= now:
            when, _, kind, payload = heapq.heappop(self._events)
            if kind == "ready":
                self.cloud.ready(str(payload), when)
            elif kind == "interrupt":
                self.cloud.interrupt(str(payload), when)
            elif kind == "reclaim":
                self.cloud.reclaim(str(payload), when)
            elif kind == "wake":
                woken = True
        return woken

    def _watch(self) -> None:
        while True:
            with self._lock:
                woken = self._catch_up()
                due = self._events[0][0] - self.clock.now() if self._events else 1.0
            if woken and self._wakeup is not None:
                self._wakeup()
            if self._stop.wait(min(max(due, 0.01), 1.0)):
                return


def _markets(settings: SimSettings, pools: Sequence[Pool]) -> dict[str, PoolMarketModel]:
    """Each pool's price: its own options first, then the settings, then the catalog's on-demand
    price (a spot pool's at ``spot_discount``), so a config needs no price for a listed type."""
    names = {p.name for p in pools}
    for key in ("prices", "capacity"):
        unknown = sorted(set(getattr(settings, key)) - names)
        if unknown:
            raise InputError(
                "config",
                f"{', '.join(map(repr, unknown))} is not a pool of the sim cloud",
                field=f"providers.sim.{key}",
            )
    catalog = InstanceCatalog(Path(settings.catalog) if settings.catalog else AWS_CATALOG)
    markets: dict[str, PoolMarketModel] = {}
    for index, pool in enumerate(pools):
        field = f"pools[{index}].options"
        options = validate_settings(SimPoolOptions, pool.options, field=field)
        on_demand = options.on_demand_price_per_hour
        if on_demand is None:
            known = catalog.get(pool.instance_type)
            if known is not None and known.on_demand_price_per_hour is not None:
                scale = pool.gpus_per_instance / known.gpus if known.gpus else 1.0
                on_demand = known.on_demand_price_per_hour * scale
        price = options.price_per_hour
        if price is None:
            price = settings.prices.get(pool.name)
        if price is None and on_demand is not None:
            price = on_demand * settings.spot_discount if pool.is_spot else on_demand
        if price is None:
            raise InputError(
                "config",
                f"no price for pool {pool.name!r}: set options.price_per_hour, "
                f"providers.sim.prices.{pool.name}, or use an instance type the catalog lists",
                field=field,
            )
        markets[pool.name] = _Capped(
            price=StepSeries([0.0], [price]),
            on_demand=StepSeries([0.0], [on_demand]) if on_demand is not None else None,
            interruption_rate_per_hour=settings.interruption_rate_per_hour if pool.is_spot else 0.0,
            quoted_rate_per_hour=settings.interruption_rate_per_hour if pool.is_spot else None,
            source="sim",
            limit=float(settings.capacity.get(pool.name, math.inf)),
        )
    return markets
