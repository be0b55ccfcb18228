"""What the controller remembers from one tick to the next, in one place it owns.

The instance table, the capacity cache, the interruption history and the cool-downs outlive a
tick; act and sync only *report* what happened (typed updates) and ``FleetMemory.apply`` is the
one writer of all of it. A rule, the guard or plan mode reads this memory and never writes it,
so "what does the controller believe" has a single owner and a single order of changes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from autoscaler.fleet.capacity import CapacityCache, InterruptionHistory
from autoscaler.fleet.instances import InstanceTable, InstanceUpdate, Launched, Moved
from autoscaler.model import Pool
from autoscaler.model.errors import QuotaScope


@dataclass(frozen=True)
class PoolFailed:
    """A launch in ``pool`` failed for lack of capacity or quota: the pools it covers are not
    asked again until the cache's TTL passes (``scope`` widens a quota to its region or cloud)."""

    pool: str
    code: str
    scope: QuotaScope = QuotaScope.POOL


@dataclass(frozen=True)
class PoolInterrupted:
    """The cloud took back (or said it will take back) an instance of ``pool``."""

    pool: str


@dataclass(frozen=True)
class ScaledUp:
    pool: str


@dataclass(frozen=True)
class ScaledDown:
    pool: str


FleetUpdate = InstanceUpdate | PoolFailed | PoolInterrupted | ScaledUp | ScaledDown


@dataclass
class Cooldowns:
    """When each pool last grew and shrank, for the guard's cool-downs."""

    last_scale_up: dict[str, float] = field(default_factory=dict)
    last_scale_down: dict[str, float] = field(default_factory=dict)


class FleetMemory:
    def __init__(
        self,
        pools: Sequence[Pool],
        request_timeout_s: float,
        capacity_cache_ttl_s: float,
        risky_pool_ttl_s: float,
    ) -> None:
        self.pools = {p.name: p for p in pools}
        self.table = InstanceTable(request_timeout_s=request_timeout_s)
        self.capacity = CapacityCache(capacity_cache_ttl_s)
        self.history = InterruptionHistory(risky_pool_ttl_s)
        self.cooldowns = Cooldowns()

    def apply(self, update: FleetUpdate, now: float) -> None:
        if isinstance(update, (Launched, Moved)):
            self.table.apply(update, now)
        elif isinstance(update, PoolFailed):
            for name in self._covered(update.pool, update.scope):
                self.capacity.mark(name, now, update.code)
        elif isinstance(update, PoolInterrupted):
            self.history.record(update.pool, now)
        elif isinstance(update, ScaledUp):
            self.cooldowns.last_scale_up[update.pool] = now
        else:
            self.cooldowns.last_scale_down[update.pool] = now

    def _covered(self, pool_name: str, scope: QuotaScope) -> list[str]:
        pool = self.pools.get(pool_name)
        if pool is None or scope is QuotaScope.POOL:
            return [pool_name]
        return [
            p.name
            for p in self.pools.values()
            if p.provider == pool.provider
            and (scope is QuotaScope.PROVIDER or p.region == pool.region)
        ]
