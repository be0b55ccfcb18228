"""The default policy: on-prem first, then the spot capacity with the lowest *effective* cost.

Effective cost prices in what an interruption wastes (see ``common.effective_cost_per_hour``), so a
cheap pool that keeps taking instances away loses to a slightly dearer, steadier one. Jobs that
cannot checkpoint, or are marked high priority, are kept off spot. Cloud nodes are drained when
their GPUs have been idle by measured utilisation for ``idle_seconds``, not when the scheduler
happens to show no allocation.
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict, Field

from autoscaler.model import FleetView, OnPremUse, Placement, Plan, PoolView
from policies.common import (
    Need,
    Offer,
    drain_requests,
    effective_cost_per_hour,
    headroom,
    idle_nodes,
    needs_from,
    pack,
    supply,
    unmet,
)


class CostAwareParams(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    idle_seconds: float = Field(
        600.0,
        ge=0,
        description="drain a cloud node after its GPUs have "
        "been idle (measured utilisation) this long",
    )
    restart_overhead_s: float = Field(
        120.0,
        ge=0,
        description="time a restarted job needs before "
        "it does useful work again (load checkpoint, warm up)",
    )
    min_useful_fraction: float = Field(
        0.5,
        gt=0,
        le=1,
        description="never buy spot whose expected useful share of a paid hour is below this",
    )
    default_interruption_rate_per_hour: float = Field(
        0.0, ge=0, description="prior rate for spot pools whose price source gives none"
    )
    prior_instance_hours: float = Field(
        24.0,
        gt=0,
        description="how many instance-hours of our "
        "own observation weigh as much as the quoted rate",
    )
    risky_interruption_rate_per_hour: float = Field(
        0.5,
        ge=0,
        description="rate assumed for a pool while it is marked risky after an interruption",
    )
    keep_uncheckpointable_off_spot: bool = True
    keep_high_priority_off_spot: bool = True
    spot_safe_onprem: OnPremUse = Field(
        OnPremUse.FIRST,
        description="how jobs that may run on "
        "spot use on-prem GPUs: first, after-cloud or never "
        "(keeping them for jobs that must stay off spot)",
    )
    on_demand_fallback: bool = Field(
        True,
        description="let spot-safe jobs use on-demand when no "
        "spot pool is worth buying or has capacity",
    )


class CostAwarePolicy:
    """On-prem first; burst to the lowest effective cost; protect jobs that cannot checkpoint."""

    Params = CostAwareParams

    def __init__(self, params: CostAwareParams | None = None) -> None:
        self.params = params or CostAwareParams()
        self.placement = Placement(
            protect_uncheckpointable=self.params.keep_uncheckpointable_off_spot,
            protect_high_priority=self.params.keep_high_priority_off_spot,
            spot_safe_onprem=self.params.spot_safe_onprem,
        )

    def decide(self, view: FleetView) -> Plan:
        idle = idle_nodes(view, self.params.idle_seconds, by_allocation=False)
        available = supply(view, idle)
        needs = unmet(needs_from(view.demand.groups, self.placement), available)
        launches = pack(
            needs,
            lambda need: self._offers(view, need),
            lambda need, chosen: [o.name for o in self._offers(view, need)],
        )
        drains = drain_requests(idle, available.kept, view, "GPUs idle by measured utilisation")
        return Plan(
            launches=tuple(launches),
            drains=drains,
            placement=self.placement,
            reason=f"{sum(n.jobs for n in needs)} pending job(s) need new capacity",
        )

    def _offers(self, view: FleetView, need: Need) -> Sequence[Offer]:
        offers = []
        for pool in view.pools:
            if pool.unavailable_until is not None or pool.price is None:
                continue
            if not need.allows(pool):
                continue
            if not pool.pool.is_spot and need.spot_ok and not self.params.on_demand_fallback:
                continue
            cost = effective_cost_per_hour(
                pool,
                need.checkpoint_interval_s,
                self.params.restart_overhead_s,
                self._interruption_rate(pool, view.now),
                self.params.min_useful_fraction,
            )
            offers.append(Offer(pool, cost, headroom(view, pool)))
        offers.sort(key=lambda o: o.cost_per_gpu_hour)
        return offers

    def _interruption_rate(self, pool: PoolView, now: float) -> float:
        """Per instance-hour: the quoted rate as a prior, sharpened by what we saw ourselves
        (the posterior mean of a Poisson rate under a gamma prior worth ``prior_instance_hours``
        of observation)."""
        quoted = pool.price.interruption_rate_per_hour if pool.price is not None else None
        prior = quoted if quoted is not None else self.params.default_interruption_rate_per_hour
        weight = self.params.prior_instance_hours
        rate = (pool.recent_interruptions + prior * weight) / (pool.recent_instance_hours + weight)
        if pool.risky_until is not None and pool.risky_until > now:
            rate = max(rate, self.params.risky_interruption_rate_per_hour)
        return rate
