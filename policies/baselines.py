"""Reactive baselines: the price of never touching spot, and of buying spot by price alone.

* ``on-demand``: launch the cheapest on-demand capacity for whatever is pending; remove a node once
  the scheduler has had nothing on it for ``idle_seconds`` (0 s, as Karpenter v1's default
  ``consolidateAfter``).
* ``cheapest-spot``: the same, buying the lowest spot *price*: no interruption risk, no checkpoint
  awareness, every job may land on spot; when spot fails for capacity it falls back to other spot
  pools, then to on-demand; on a spot interruption warning it starts a replacement at once. It is
  an ablation (what raw price buys without any risk signal), not a model of a product: Karpenter
  launches spot with price-capacity-optimized and consolidates within budgets; that is the
  ``karpenter`` peer (``policies/karpenter.py``, docs/peers.md).
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict, Field

from autoscaler.model import FleetView, Placement, Plan
from policies.common import (
    Need,
    Offer,
    displaced,
    drain_requests,
    headroom,
    idle_nodes,
    needs_from,
    pack,
    supply,
    unmet,
)


class ReactiveParams(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    idle_seconds: float = Field(
        0.0,
        ge=0,
        description="remove a cloud node once the scheduler has shown no job on it this long",
    )


class _Reactive:
    Params = ReactiveParams
    spot = False
    placement = Placement()

    def __init__(self, params: ReactiveParams | None = None) -> None:
        self.params = params or ReactiveParams()

    def decide(self, view: FleetView) -> Plan:
        idle = idle_nodes(view, self.params.idle_seconds, by_allocation=True)
        available = supply(view, idle)
        groups = list(view.demand.groups)
        if self.spot:
            groups += displaced(view, checkpoint_interval_s=None)
        needs = unmet(needs_from(groups, self.placement), available)
        launches = pack(
            needs,
            lambda need: self._offers(view, need),
            lambda need, chosen: self._fallbacks(view, need),
            view.pool_by_name,
        )
        drains = drain_requests(idle, available.kept, view, "no job allocated")
        return Plan(launches=tuple(launches), drains=drains, placement=self.placement)

    def _offers(self, view: FleetView, need: Need) -> Sequence[Offer]:
        offers = [
            Offer(pool, pool.price.price_per_hour, headroom(view, pool))
            for pool in view.pools
            if pool.price is not None
            and pool.unavailable_until is None
            and pool.pool.is_spot == self.spot
        ]
        offers.sort(key=lambda o: o.cost_per_gpu_hour)
        return offers

    def _fallbacks(self, view: FleetView, need: Need) -> list[str]:
        ranked = sorted(
            (p for p in view.pools if p.price is not None and need.fits(p)),
            key=lambda p: (
                p.pool.is_spot != self.spot,
                p.price.price_per_hour / p.pool.gpus_per_instance if p.price else 0.0,
                p.pool.name,
            ),
        )
        return [p.pool.name for p in ranked if self.spot or not p.pool.is_spot]


class OnDemandPolicy(_Reactive):
    """Reactive, on-demand only: the cost of never touching spot."""


class CheapestSpotPolicy(_Reactive):
    """Reactive, lowest spot price: no risk adjustment, no checkpoint awareness."""

    spot = True
