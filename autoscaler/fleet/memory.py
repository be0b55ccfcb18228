"""What the controller remembers from one tick to the next, in one place it owns.

Everything a later tick decides from lives in ``FleetMemory``, each part with one writer:

* the instance table, the capacity cache, the interruption history and the cool-downs: act and
  sync only *report* what happened (typed updates) and ``FleetMemory.apply`` writes them;
* what observe carries over (``Observed``: the last good price per pool, since when each cloud
  node is underused, when each provider role last answered): written by observe alone;
* the checkpoint ledger (when each job last saved, what it reported): written by the
  evacuator and the inbox as reports arrive, read by observe and the rules;
* the plan in force (its placement is what the next tick's rules and scheduler apply) and the
  set of billed instances the journal last recorded: written by the controller as a tick ends.

A rule, the guard or plan mode reads this memory and never writes it, so "what does the
controller believe" has a single owner and a single order of changes. Two things outlive a tick
elsewhere on purpose: evacuations under way are the evacuator's work in progress (a wait for a
checkpoint is an open call, not a belief), and caches derived from this memory (observe's
parsed nodes, the controller's unhostable groups) can be dropped at any time without changing a
decision.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from autoscaler.fleet.capacity import CapacityCache, InterruptionHistory
from autoscaler.fleet.checkpoints import CheckpointLedger
from autoscaler.fleet.instances import InstanceTable, InstanceUpdate, Launched, Moved
from autoscaler.fleet.team_spend import TeamSpend
from autoscaler.model import Plan, Pool, PriceQuote
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


@dataclass
class Observed:
    """What observe carries from one tick to the next: the last good price quote per pool (a
    pool whose quote fails keeps its last one), since when each cloud node has been underused,
    when each (provider, role) last answered and when the first tick observed (how long a
    source has been silent)."""

    prices: dict[str, PriceQuote] = field(default_factory=dict)
    underused_since: dict[str, float] = field(default_factory=dict)
    answered_at: dict[tuple[str, str], float] = field(default_factory=dict)
    first_observed: float | None = None


class FleetMemory:
    def __init__(
        self,
        pools: Sequence[Pool],
        request_timeout_s: float,
        capacity_cache_ttl_s: float,
        risky_pool_ttl_s: float,
        checkpoints: CheckpointLedger | None = None,
    ) -> None:
        self.pools = {p.name: p for p in pools}
        self.table = InstanceTable(request_timeout_s=request_timeout_s)
        self.capacity = CapacityCache(capacity_cache_ttl_s)
        self.history = InterruptionHistory(risky_pool_ttl_s)
        self.cooldowns = Cooldowns()
        self.observed = Observed()
        self.checkpoints = checkpoints if checkpoints is not None else CheckpointLedger()
        self.last_plan: Plan | None = None
        self.billed: frozenset[str] = frozenset()
        self.team_spend = TeamSpend()  # what each team's instances billed this month

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
