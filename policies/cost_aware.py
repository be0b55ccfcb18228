"""The default policy: on-prem first, then the spot capacity with the lowest *effective* cost.

Effective cost prices in what an interruption wastes (see ``common.effective_cost_per_hour``), so a
cheap pool that keeps taking instances away loses to a slightly dearer, steadier one. Jobs that
cannot checkpoint, or are marked high priority, are kept off spot. Cloud nodes are drained when
their GPUs have been idle by measured utilisation for ``idle_seconds``, not when the scheduler
happens to show no allocation.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from autoscaler.model import (
    Capacity,
    CloudNode,
    DrainRequest,
    FleetView,
    OnPremUse,
    Placement,
    Plan,
    PoolView,
)
from policies.common import (
    Need,
    Offer,
    Supply,
    can_ever_host,
    displaced,
    drain_requests,
    effective_cost_per_hour,
    headroom,
    idle_nodes,
    needs_from,
    on_demand_gangs_to_replace,
    on_demand_nodes_to_replace,
    onprem_room,
    pack,
    supply,
    underused_nodes,
    unmet,
    unobserved_nodes,
)


class CostAwareParams(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    idle_seconds: float | None = Field(
        None,
        ge=0,
        description="drain a cloud node after its GPUs have been idle (measured utilisation) "
        "this long; unset: the pool's boot time, the rent-or-buy break-even",
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
    replace_on_notice: bool = Field(
        True,
        description="launch replacements for the work on an instance as soon as its "
        "interruption notice arrives, away from its pool",
    )
    displaced_checkpoint_interval_s: float = Field(
        3600.0,
        gt=0,
        description="checkpoint interval assumed for work displaced by a notice when pricing "
        "its replacement",
    )
    consolidate_below: float | None = Field(
        0.5,
        gt=0,
        le=1,
        description="move the jobs off a multi-GPU cloud node that has had at most half of its "
        "GPUs allocated for idle_seconds, when they all checkpoint and hosting them elsewhere "
        "(free on-prem GPUs, or the cheapest offer) costs at most this share of the node's "
        "price; they leave at their next checkpoint. Unset: never",
    )
    keep_uncheckpointable_off_spot: bool = Field(
        True, description="run jobs that cannot checkpoint on on-prem or on-demand only"
    )
    keep_high_priority_off_spot: bool = Field(
        True, description="run high-priority jobs on on-prem or on-demand only"
    )
    spot_safe_onprem: OnPremUse = Field(
        OnPremUse.FIRST,
        description="how jobs that may run on "
        "spot use on-prem GPUs: first, after-cloud or never "
        "(keeping them for jobs that must stay off spot)",
    )
    rebalance_onprem: bool = Field(
        True,
        description="let a pending job that must stay off spot, or needs several GPUs, take an "
        "on-prem node from smaller spot-safe jobs that can restart at once on free cloud room "
        "(they checkpoint on request first)",
    )
    unobserved_nodes: Literal["keep", "surplus"] = Field(
        "keep",
        description="cloud nodes no scheduler or telemetry reports on: keep them (their use is "
        "unknown), or drain those pending demand does not need (fleets of queue workers without "
        "node telemetry)",
    )
    replace_on_demand: bool = Field(
        True,
        description="give back an on-demand node whose jobs all checkpoint once spot or free "
        "on-prem GPUs would host them for at most consolidate_below of its price (on-demand "
        "bought while spot had no capacity); its jobs move at their next checkpoint",
    )
    replace_on_demand_after_s: float = Field(
        3600.0,
        ge=0,
        description="replace an on-demand node only once it has run this long: long-running "
        "work is likely to run on and pays for its move, short work is left to finish",
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
            rebalance_onprem=self.params.rebalance_onprem,
        )

    def decide(self, view: FleetView) -> Plan:
        idle = idle_nodes(view, self.params.idle_seconds, by_allocation=False)
        if self.params.unobserved_nodes == "surplus":
            idle += unobserved_nodes(view, self.params.idle_seconds)
        idle_ids = {n.instance_id for n in idle}
        underused = (
            [
                n
                for n in underused_nodes(view, self.params.idle_seconds)
                if n.instance_id not in idle_ids
            ]
            if self.params.consolidate_below is not None
            else []
        )
        replaceable = (
            [
                n
                for n in on_demand_nodes_to_replace(view, self.params.replace_on_demand_after_s)
                if n.instance_id not in idle_ids and n not in underused
            ]
            if self.params.consolidate_below is not None and self.params.replace_on_demand
            else []
        )
        available = supply(view, idle + underused + replaceable)
        groups = list(view.demand.groups)
        if self.params.replace_on_notice:
            groups += displaced(view, self.params.displaced_checkpoint_interval_s)
        needs = unmet(needs_from(groups, self.placement, by_class=True), available)
        rates = self.interruption_rates(view)
        offers: dict[tuple[object, ...], list[Offer]] = {}

        def offers_for(need: Need) -> list[Offer]:
            key = (need.shape, need.nodes, need.tiers, need.checkpoint_interval_s)
            if key not in offers:
                offers[key] = self._offers(view, need, rates)
            return offers[key]

        launches = pack(
            needs,
            offers_for,
            lambda need, chosen: [o.name for o in offers_for(need)],
        )
        waiting = [n for n in needs if not can_ever_host(view, n)]
        drains = drain_requests(idle, available.kept, view, "GPUs idle by measured utilisation")
        moves = self._consolidations(view, underused, available, offers_for)
        moves += self._replacements(view, replaceable, available, offers_for)
        if self.params.consolidate_below is not None and self.params.replace_on_demand:
            moves += self._gang_replacements(
                view,
                on_demand_gangs_to_replace(view, self.params.replace_on_demand_after_s),
                offers_for,
            )
        return Plan(
            launches=tuple(launches),
            drains=drains + moves,
            placement=self.placement,
            reason=f"{sum(n.jobs for n in needs)} pending job(s) need new capacity"
            + (
                f"; {sum(n.jobs for n in waiting)} no configured capacity can host"
                if waiting
                else ""
            ),
        )

    def _replacements(
        self,
        view: FleetView,
        nodes: list[CloudNode],
        available: Supply,
        offers_for: Callable[[Need], list[Offer]],
    ) -> tuple[DrainRequest, ...]:
        """On-demand nodes whose checkpointing jobs spot (or free on-prem GPUs) would now host
        for at most ``consolidate_below`` of their price: on-demand bought while spot had no
        capacity is given back once it has, each job moving at its next checkpoint (Karpenter's
        replacement of a node by a cheaper one, priced by effective cost)."""
        limit = self.params.consolidate_below
        if limit is None or not nodes:
            return ()
        room = onprem_room(available)
        tiers = self.placement.tiers(True, False)
        moves = []
        for node in sorted(nodes, key=lambda n: n.instance_id):
            if node.instance_id in available.kept:
                continue
            pool = view.pool_by_name.get(node.pool)
            if pool is None or pool.price is None or pool.price.price_per_hour <= 0:
                continue
            model = pool.pool.gpu_model
            elsewhere = 0.0
            for size in node.job_gpus or (node.gpus_allocated,):
                home = next((i for i, free in enumerate(room) if free >= size), None)
                if home is not None:
                    room[home] -= size
                    room.sort()
                    continue
                need = Need(
                    size,
                    1,
                    tiers,
                    self.params.displaced_checkpoint_interval_s,
                    gpu_models=(model,) if model else (),
                )
                elsewhere += min(
                    (o.cost_per_gpu_hour * size for o in offers_for(need) if o.spot),
                    default=math.inf,
                )
            if elsewhere <= limit * pool.price.price_per_hour:
                moves.append(
                    DrainRequest(
                        instance_id=node.instance_id,
                        reason=f"on-demand while spot has room again: its jobs move at their "
                        f"next checkpoint to capacity costing ${elsewhere:.2f}/h instead of "
                        f"${pool.price.price_per_hour:.2f}/h",
                        move_jobs=True,
                    )
                )
        return tuple(moves)

    def _gang_replacements(
        self,
        view: FleetView,
        gangs: list[tuple[CloudNode, ...]],
        offers_for: Callable[[Need], list[Offer]],
    ) -> tuple[DrainRequest, ...]:
        """Multi-node jobs on on-demand nodes that a spot gang would now host for at most
        ``consolidate_below`` of their price, priced as a gang (its risk grows with its
        members): on-demand bought while no spot pool had room for the whole gang is given back
        once one has. All its nodes are drained together, the job leaving at its next
        checkpoint, and the requeued gang is launched like any other pending one."""
        limit = self.params.consolidate_below
        if limit is None or not gangs:
            return ()
        tiers = self.placement.tiers(True, False)
        moves: list[DrainRequest] = []
        for nodes in gangs:
            pools = [view.pool_by_name.get(n.pool) for n in nodes]
            prices = [p.price.price_per_hour for p in pools if p is not None and p.price]
            if len(prices) != len(nodes) or any(price <= 0 for price in prices):
                continue
            per_node = nodes[0].job_gpus[0] if nodes[0].job_gpus else nodes[0].gpus_allocated
            models = {p.pool.gpu_model for p in pools if p is not None}
            model = models.pop() if len(models) == 1 else None
            need = Need(
                per_node * len(nodes),
                1,
                tiers,
                self.params.displaced_checkpoint_interval_s,
                nodes=len(nodes),
                gpu_models=(model,) if model else (),
            )
            elsewhere = min(
                (o.cost_per_gpu_hour * need.gpus_per_job for o in offers_for(need) if o.spot),
                default=math.inf,
            )
            if elsewhere <= limit * sum(prices):
                moves += [
                    DrainRequest(
                        instance_id=node.instance_id,
                        reason=f"on-demand gang of {len(nodes)} while spot has room again: its "
                        f"job moves at its next checkpoint to a spot gang costing "
                        f"${elsewhere:.2f}/h instead of ${sum(prices):.2f}/h",
                        move_jobs=True,
                    )
                    for node in nodes
                ]
        return tuple(moves)

    def _consolidations(
        self,
        view: FleetView,
        underused: list[CloudNode],
        available: Supply,
        offers_for: Callable[[Need], list[Offer]],
    ) -> tuple[DrainRequest, ...]:
        """Underused nodes no pending job is using whose jobs are cheaper to host elsewhere:
        on on-prem GPUs left free, or on the cheapest offer for their GPUs."""
        limit = self.params.consolidate_below
        if limit is None or not underused:
            return ()
        room = onprem_room(available)
        moves = []
        for node in sorted(underused, key=lambda n: (n.gpus_allocated, n.instance_id)):
            if node.instance_id in available.kept:
                continue
            pool = view.pool_by_name.get(node.pool)
            if pool is None or pool.price is None or pool.price.price_per_hour <= 0:
                continue
            size = node.gpus_allocated
            tiers = (
                self.placement.tiers(True, False)
                if pool.pool.is_spot
                else (Capacity.ONPREM, Capacity.ON_DEMAND)
            )
            home = next((i for i, free in enumerate(room) if free >= size), None)
            if home is not None and Capacity.ONPREM in tiers:
                room[home] -= size
                room.sort()
                elsewhere = 0.0
            else:
                model = pool.pool.gpu_model
                need = Need(
                    size,
                    1,
                    tiers,
                    self.params.displaced_checkpoint_interval_s,
                    gpu_models=(model,) if model else (),
                )
                elsewhere = min(
                    (o.cost_per_hour for o in offers_for(need) if o.name != node.pool),
                    default=math.inf,
                )
            if elsewhere <= limit * pool.price.price_per_hour:
                moves.append(
                    DrainRequest(
                        instance_id=node.instance_id,
                        reason=f"underused: {size} of {node.gpus} GPUs allocated; its jobs "
                        f"move at their next checkpoint to capacity costing "
                        f"${elsewhere:.2f}/h instead of ${pool.price.price_per_hour:.2f}/h",
                        move_jobs=True,
                    )
                )
        return tuple(moves)

    def _offers(self, view: FleetView, need: Need, rates: Mapping[str, float]) -> list[Offer]:
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
                rates[pool.name],
                self.params.min_useful_fraction,
                need.nodes,
                pool.recent_interruptions / pool.recent_reclaims if pool.recent_reclaims else 1.0,
            )
            offers.append(Offer(pool, cost, headroom(view, pool)))
        offers.sort(key=lambda o: o.cost_per_gpu_hour)
        return offers

    def interruption_rates(self, view: FleetView) -> dict[str, float]:
        """Interruptions per instance-hour for every pool, from what we saw and what we were told.

        Two levels of evidence, each the posterior mean of a Poisson rate under a gamma prior
        worth ``prior_instance_hours`` of observation: the pools of one instance type on one
        cloud share a market, so their pooled record (starting from the quoted rate) is the
        prior of each pool, which its own record then sharpens. A pool we have never used thus
        starts as risky as its siblings have proven, not as safe as a brochure says.
        """
        weight = self.params.prior_instance_hours
        families: dict[tuple[str, str], list[PoolView]] = {}
        for pool in view.pools:
            families.setdefault((pool.pool.provider, pool.pool.instance_type), []).append(pool)
        noticed = {notice.pool for notice in view.notices}
        rates: dict[str, float] = {}
        for members in families.values():
            quoted = [
                p.price.interruption_rate_per_hour
                for p in members
                if p.price is not None and p.price.interruption_rate_per_hour is not None
            ]
            told = (
                sum(quoted) / len(quoted)
                if quoted
                else self.params.default_interruption_rate_per_hour
            )
            seen = sum(p.recent_interruptions for p in members)
            exposure = sum(p.recent_instance_hours for p in members)
            family_rate = (seen + told * weight) / (exposure + weight)
            for pool in members:
                rate = (pool.recent_interruptions + family_rate * weight) / (
                    pool.recent_instance_hours + weight
                )
                risky = pool.risky_until is not None and pool.risky_until > view.now
                if risky or pool.name in noticed:
                    rate = max(rate, self.params.risky_interruption_rate_per_hour)
                rates[pool.name] = rate
        return rates
