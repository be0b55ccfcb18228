"""``keep-warm``: the built-in cost-aware policy, plus a warm pool of idle spot GPUs.

A job that lands on a booting instance waits for the boot (minutes); one that lands on an idle,
already running instance starts at once. This policy pays for ``warm_gpus`` idle spot GPUs, in
the spot pool that is cheapest per GPU, to buy that head start for bursts.

It is an example to copy: it shows how a plugin wraps another policy, reads the ``FleetView``,
reuses the building blocks in ``policies.common`` and edits the wrapped plan. Like every policy
it is pure: everything it knows comes from the view (``view.now`` is its clock), and the same
view always gives the same plan.
"""

from __future__ import annotations

import math

from pydantic import BaseModel, ConfigDict, Field

from autoscaler.model import (
    Capacity,
    CloudNode,
    FleetView,
    LaunchRequest,
    Plan,
    PoolView,
)
from policies.common import headroom, needs_from, supply, unmet
from policies.cost_aware import CostAwareParams, CostAwarePolicy

__all__ = ["KeepWarmParams", "KeepWarmPolicy"]


class KeepWarmParams(BaseModel):
    """What an ops engineer may set under ``policy.params``; validated before the policy runs,
    so a typo or a negative size is a one-line config error naming the field."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    warm_gpus: int = Field(
        8,
        ge=0,
        description="idle spot GPUs kept up (cheapest spot pool per GPU) so new jobs skip the boot",
    )
    inner: CostAwareParams = Field(
        default_factory=CostAwareParams,
        description="params of the wrapped cost-aware policy (see `cost-aware` above)",
    )


class KeepWarmPolicy:
    """Cost-aware, plus at least warm_gpus idle spot GPUs kept up so new jobs start at once."""

    Params = KeepWarmParams

    def __init__(self, params: KeepWarmParams | None = None) -> None:
        self.params = params or KeepWarmParams()
        self.inner = CostAwarePolicy(self.params.inner)

    def decide(self, view: FleetView) -> Plan:
        plan = self.inner.decide(view)
        if self.params.warm_gpus == 0:
            return plan
        nodes = {node.instance_id: node for node in view.instances}
        draining = [nodes[d.instance_id] for d in plan.drains]
        warm = self._spare_spot_gpus(view, plan, draining)

        # Take back drains of spot nodes with free GPUs, cheapest first, while the pool is short.
        kept: set[str] = set()
        for node in sorted(draining, key=lambda n: (_price_per_gpu(view, n.pool), n.instance_id)):
            if warm >= self.params.warm_gpus:
                break
            if _is_spot(view, node.pool) and _free_gpus(node) > 0:
                kept.add(node.instance_id)
                warm += _free_gpus(node)
        drains = tuple(d for d in plan.drains if d.instance_id not in kept)

        launches = plan.launches
        short = self.params.warm_gpus - warm
        if short > 0:
            launches = (*launches, *self._warm_launch(view, short))
        return Plan(
            launches=launches,
            drains=drains,
            placement=plan.placement,
            reason=f"{plan.reason}; warm pool {warm}/{self.params.warm_gpus} spot GPU(s)",
        )

    def _spare_spot_gpus(self, view: FleetView, plan: Plan, draining: list[CloudNode]) -> int:
        """Free spot GPUs left once pending jobs have taken theirs (placed the way the plan's
        placement will place them) and the plan's drains have gone: the warm pool as it stands.
        Booting nodes count: they will be warm by the time a job could use a new launch."""
        available = supply(view, idle=draining)
        unmet(needs_from(view.demand.groups, plan.placement), available)
        return sum(
            free * count
            for (kind, free, *_), count in available.buckets.items()
            if kind is Capacity.SPOT
        )

    def _warm_launch(self, view: FleetView, gpus: int) -> tuple[LaunchRequest, ...]:
        """Enough instances of the cheapest spot pool (per GPU) to carry ``gpus``; the other
        spot pools, cheapest first, as fallbacks if it has no capacity."""
        pools = sorted(
            (
                p
                for p in view.pools
                if p.pool.is_spot
                and p.price is not None
                and p.unavailable_until is None
                and headroom(view, p) > 0
            ),
            key=lambda p: (_pool_price_per_gpu(p), p.pool.name),
        )
        if not pools:
            return ()
        best = pools[0]
        count = min(math.ceil(gpus / best.pool.gpus_per_instance), headroom(view, best))
        return (
            LaunchRequest(
                pool=best.pool.name,
                count=count,
                fallbacks=tuple(p.pool.name for p in pools[1:]),
                reason=f"keep {self.params.warm_gpus} spot GPU(s) warm",
            ),
        )


def _is_spot(view: FleetView, pool: str) -> bool:
    found = view.pool_by_name.get(pool)
    return found is not None and found.pool.is_spot


def _free_gpus(node: CloudNode) -> int:
    """GPUs a new job could take; a node that has not joined the scheduler yet is all free."""
    return node.gpus - node.gpus_allocated if node.joined else node.gpus


def _pool_price_per_gpu(pool: PoolView) -> float:
    return pool.price.price_per_hour / pool.pool.gpus_per_instance if pool.price else math.inf


def _price_per_gpu(view: FleetView, pool: str) -> float:
    found = view.pool_by_name.get(pool)
    return _pool_price_per_gpu(found) if found is not None else math.inf
