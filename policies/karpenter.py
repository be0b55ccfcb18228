"""``karpenter``: Karpenter v1 as its documentation says it behaves, for "better than Karpenter"
to mean better than Karpenter as it really runs.

Sources, and the behaviour taken from each:

* Disruption, https://karpenter.sh/docs/concepts/disruption/ (``website/content/en/docs/concepts/
  disruption.md`` in aws/karpenter-provider-aws):
  - ``consolidationPolicy`` defaults to ``WhenEmptyOrUnderutilized``; a node is consolidatable
    once ``consolidateAfter`` has passed since a pod last scheduled on or left it, empty or not.
  - Consolidation in order: empty nodes are deleted in parallel; then a node is deleted when all
    its pods fit on the free capacity of other nodes, or replaced when they fit on one
    lower-priced node. Candidates running fewer pods go first.
  - Spot-to-spot replacement (feature gate ``SpotToSpotConsolidation``) picks the cheaper node
    with price-capacity-optimized and only when at least 15 cheaper instance types are on offer
    for a single-node replacement, so as not to "race to the bottom" of interruption-prone types.
  - Graceful methods "pre-spin any replacement nodes ... and wait for them to become ready"
    before deleting; they are rate limited by NodePool disruption budgets, one budget of
    ``nodes: 10%`` by default, counted as ``roundup(total * 10 %)`` minus nodes being deleted or
    not ready (kubernetes-sigs/karpenter ``pkg/controllers/disruption/helpers.go``).
  - Interruption (with ``--interruption-queue``, the SQS queue fed by EventBridge): on a spot
    interruption warning Karpenter taints, drains and terminates the node, and "the NodePool will
    start a new node as soon as it sees the Spot interruption warning"; rebalance
    recommendations are not acted on. Interruption is a forceful method: it does not wait for a
    pre-spun replacement. The interrupted offering (instance type, zone, spot) is marked
    unavailable (aws/karpenter-provider-aws ``pkg/controllers/interruption/controller.go``).
* NodePool API, https://github.com/kubernetes-sigs/karpenter/blob/main/pkg/apis/v1/nodepool.go:
  ``consolidateAfter`` defaults to ``0s`` (``+kubebuilder:default:={consolidateAfter: "0s"}``),
  ``consolidationPolicy`` to ``WhenEmptyOrUnderutilized``, budgets to ``nodes: 10%``.
* NodePools, https://karpenter.sh/docs/concepts/nodepools/: "Karpenter prioritizes Spot
  offerings if the NodePool allows Spot and on-demand instances"; when spot is unavailable
  "Karpenter will attempt to provision on-demand instances".
* Scheduling (kubernetes-sigs/karpenter ``pkg/controllers/provisioning/scheduling``,
  ``scheduler.go``, ``nodeclaim.go``): pending pods, largest first, go to existing capacity, then
  to node claims being planned, then to a new one; a pod joins a claim while some instance type
  can still hold all of the claim's pods, so claims fill up to the largest type ("an incoming pod
  pushed the claim to a larger instance type than earlier pods needed",
  ``nodeclaim_optimization.go``) and launch with every type that still fits.
* Allocation strategy, https://docs.aws.amazon.com/AWSEC2/latest/APIReference/
  API_SpotOptionsRequest.html and https://aws.amazon.com/blogs/compute/introducing-price-
  capacity-optimized-allocation-strategy-for-ec2-spot-instances/: price-capacity-optimized
  "identifies the pools with the highest capacity availability ... then requests Spot Instances
  from the lowest priced of these pools"; Karpenter launches spot with it (aws/karpenter#3044)
  and on-demand with lowest-price.

What the simulator cannot model, and what is done instead:

* AWS's real-time capacity signal is invisible: PCO's "highest capacity availability" is the
  best Spot Advisor bucket (quoted rate, sharpened by our own interruptions) among the fitting
  pools, and the lowest price within it. PCO ranks one cloud's pools; across clouds the one
  whose PCO choice is cheapest goes first.
* Pods request only GPUs here (no CPU or memory), and pods of different GPU requirements never
  share a node claim. Pods pending in one controller tick are one batch (Karpenter batches for 1
  to 10 s), so claims pack more pods than they would live. The opt-in node claim optimization
  pass that splits over-grown claims (``EnableNodeClaimOptimization``) is not modelled.
* Karpenter is AWS-only and runs one cluster; here one NodePool spans every configured cloud
  pool (``providers`` narrows it). Jobs that must stay off spot model a second NodePool restricted
  to on-demand that those pods select, the documented way to keep pods off spot.
* A node's jobs are one block of its allocated GPUs on the node's GPU model (the view does not
  split them). Besides empty nodes, only nodes with at most half their GPUs allocated are
  consolidation candidates: the view says whether the jobs on such nodes checkpoint, and not on
  fuller ones. Jobs that cannot checkpoint are taken to carry ``karpenter.sh/do-not-disrupt``
  (the docs' advice for "a long batch job (such as you might have with machine learning) that
  would need to start over"), so their nodes stay; ``do_not_disrupt_uncheckpointable: false``
  lets Karpenter evict them. Multi-node consolidation with a replacement is not modelled;
  deletions of several nodes happen one by one.
* ``consolidateAfter`` runs from when the node went empty, or from when it went down to half
  its GPUs allocated; later pod changes do not restart it (the view holds no such time).
* The offering marked unavailable after an interruption is skipped for the tick of the notice
  only, not for Karpenter's cache lifetime; ICE caching is the controller's capacity cache.
* Budgets are counted over all our nodes as one NodePool, per tick, not per 10 s loop.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from autoscaler.model import (
    Capacity,
    CloudNode,
    DrainRequest,
    FleetView,
    InstanceState,
    LaunchRequest,
    NodeShape,
    Placement,
    Plan,
    PoolView,
    SharingMode,
)
from policies.common import (
    Need,
    displaced,
    drain_requests,
    headroom,
    idle_nodes,
    leaving,
    needs_from,
    supply,
    underused_nodes,
    unmet,
)
from policies.peers_common import (
    advisor_bucket,
    booting,
    combined_shape,
    interruption_rate,
    peer_placement,
    pool_order,
    price_of,
    terminations_only,
    usable,
)

CapacityType = Literal["spot", "on-demand"]
# Pods share a node claim only when they ask for the same GPUs and capacity types.
# GPU models, memory per GPU, tiers, the team the claim is bought for (None: no teams), and
# how the pods' GPUs must be shared (None: whole GPUs; slices only on pools shared that way).
_ClaimKey = tuple[
    tuple[str, ...], float | None, tuple[Capacity, ...], str | None, SharingMode | None
]


class KarpenterParams(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    consolidation_policy: Literal["WhenEmpty", "WhenEmptyOrUnderutilized"] = Field(
        "WhenEmptyOrUnderutilized",
        description="NodePool spec.disruption.consolidationPolicy (Karpenter v1 default)",
    )
    consolidate_after_s: float | None = Field(
        0.0,
        ge=0,
        description="NodePool spec.disruption.consolidateAfter in seconds (v1 default 0s); "
        "unset: Never",
    )
    spot_to_spot_consolidation: bool = Field(
        True,
        description="the SpotToSpotConsolidation feature gate (off in a stock install; on here "
        "so the peer is Karpenter configured for spot savings)",
    )
    min_spot_to_spot_instance_types: int = Field(
        15,
        ge=1,
        description="cheaper instance types a single-node spot-to-spot replacement needs",
    )
    disruption_budget_nodes_pct: float = Field(
        10.0,
        ge=0,
        le=100,
        description="NodePool spec.disruption.budgets[].nodes as a percentage (default 10%)",
    )
    do_not_disrupt_uncheckpointable: bool = Field(
        True,
        description="pods that cannot checkpoint carry karpenter.sh/do-not-disrupt (the docs' "
        "advice for long ML jobs that would start over): their nodes are never consolidated",
    )
    interruption_handling: bool = Field(
        True,
        description="the --interruption-queue setting: drain on a spot interruption warning and "
        "start a new node at once",
    )
    capacity_types: tuple[CapacityType, ...] = Field(
        ("spot", "on-demand"),
        min_length=1,
        description="karpenter.sh/capacity-type values the NodePool allows",
    )
    providers: tuple[str, ...] = Field(
        (), description="providers the NodePool may launch in (empty: every configured one)"
    )
    keep_uncheckpointable_off_spot: bool = Field(
        True, description="pods that cannot checkpoint select an on-demand-only NodePool"
    )
    keep_high_priority_off_spot: bool = Field(
        True, description="high-priority pods select an on-demand-only NodePool"
    )
    default_interruption_rate_per_hour: float = Field(
        0.0, ge=0, description="capacity-risk prior for spot pools whose price source gives none"
    )
    prior_instance_hours: float = Field(
        24.0,
        gt=0,
        description="instance-hours of our own observation that weigh as much as the quoted rate",
    )


@dataclass
class _Claim:
    """A node claim being planned: its pods' GPUs and the pools that can still hold them all."""

    key: _ClaimKey
    used: int
    candidates: list[PoolView]
    spot: bool
    on_demand: bool


@dataclass
class _Room:
    """Free GPUs on one ready node, for the consolidation simulation."""

    name: str
    kind: Capacity
    free: int
    gpu_model: str | None
    gpu_memory_gib: float | None
    received: bool = False


@dataclass
class _Market:
    """What this tick's plan may launch: the pools, their room and their ranking."""

    pools: list[PoolView]
    room: dict[str, int]
    rank: dict[str, tuple[float, ...]]
    excluded: set[str] = field(default_factory=set)


class KarpenterPolicy:
    """Karpenter v1 as documented: price-capacity-optimized spot, consolidation, notice handling.

    Pending pods are bin-packed into node claims; empty and underutilized nodes are consolidated
    after consolidateAfter within the disruption budget; a spot interruption warning starts a new
    node at once."""

    Params = KarpenterParams

    def __init__(self, params: KarpenterParams | None = None) -> None:
        self.params = params or KarpenterParams()
        self.placement: Placement = peer_placement(
            self.params.keep_uncheckpointable_off_spot, self.params.keep_high_priority_off_spot
        )

    def decide(self, view: FleetView) -> Plan:
        view = terminations_only(view)
        wait = self.params.consolidate_after_s
        empty = idle_nodes(view, wait, by_allocation=True) if wait is not None else []
        empty_ids = {n.instance_id for n in empty}
        underused: list[CloudNode] = []
        if wait is not None and self.params.consolidation_policy == "WhenEmptyOrUnderutilized":
            underused = [
                n for n in self._underutilized(view, wait) if n.instance_id not in empty_ids
            ]
        available = supply(view, empty + underused)
        groups = list(view.demand.groups)
        if self.params.interruption_handling:
            # The evicted pods go pending at once; the work they were doing ran on spot.
            groups += displaced(view, checkpoint_interval_s=3600.0)
        needs = needs_from(groups, self.placement)
        left = unmet(needs, available)
        market = self._market(view) if left or underused else _Market([], {}, {})
        launches = self._provision(left, market)
        drains, replacements = self._consolidate(
            view, empty, underused, available.kept, needs, market
        )
        return Plan(
            launches=tuple(launches + replacements),
            drains=drains,
            placement=self.placement,
            reason=f"{len(launches)} node claim launch(es), {len(drains)} disruption(s)",
        )

    def _underutilized(self, view: FleetView, wait: float) -> list[CloudNode]:
        """Nodes at most half allocated for ``consolidateAfter`` whose pods may be evicted: all
        of them when jobs that cannot checkpoint are not marked ``do-not-disrupt``, else only
        nodes whose jobs all checkpoint."""
        if self.params.do_not_disrupt_uncheckpointable:
            return underused_nodes(view, wait)
        return [
            n
            for n in view.instances
            if n.state is InstanceState.RUNNING
            and n.underused_since is not None
            and n.jobs_checkpoint is not None
            and view.now - n.underused_since >= wait
        ]

    # -- provisioning ---------------------------------------------------------------------------

    def _market(self, view: FleetView) -> _Market:
        order = pool_order(view)
        pools = [
            p
            for p in view.pools
            if usable(p)
            and (not self.params.providers or p.pool.provider in self.params.providers)
            and ("spot" if p.pool.is_spot else "on-demand") in self.params.capacity_types
        ]
        rank: dict[str, tuple[float, ...]] = {}
        for p in pools:
            if p.pool.is_spot:
                rate = interruption_rate(
                    p,
                    self.params.default_interruption_rate_per_hour,
                    self.params.prior_instance_hours,
                )
                rank[p.name] = (advisor_bucket(rate), price_of(p), order[p.name])
            else:
                rank[p.name] = (price_of(p), order[p.name])
        # An interruption warning marks its spot offering unavailable.
        excluded = {n.pool for n in view.notices} if self.params.interruption_handling else set()
        return _Market(pools, {p.name: headroom(view, p) for p in pools}, rank, excluded)

    def _nodepool(self, need: Need, market: _Market) -> tuple[list[PoolView], bool, bool]:
        spot = Capacity.SPOT in need.tiers
        on_demand = Capacity.ON_DEMAND in need.tiers
        pools = [
            p
            for p in market.pools
            if need.allows(p) and market.room[p.name] > 0 and p.name not in market.excluded
        ]
        return pools, spot, on_demand

    def _provision(self, needs: Sequence[Need], market: _Market) -> list[LaunchRequest]:
        """Pods, largest first, into node claims that stay launchable, then one launch per claim
        on the pool price-capacity-optimized picks among the types that hold it."""
        claims: list[_Claim] = []
        limit = sum(market.room.values())
        for need in needs:
            pools, spot, on_demand = self._nodepool(need, market)
            if not pools:
                continue
            key: _ClaimKey = (
                need.gpu_models,
                need.min_gpu_memory_gib,
                need.tiers,
                need.team,
                need.gpu_sharing,
            )
            mine = [c for c in claims if c.key == key]
            size = need.gpus_per_node
            if need.nodes == 1:
                remaining = need.jobs
                for claim in mine:
                    if remaining == 0:
                        break
                    fit = min(remaining, (_largest(claim.candidates) - claim.used) // size)
                    if fit > 0:
                        _grow(claim, fit * size)
                        remaining -= fit
                per_claim = _largest(pools) // size
                while remaining > 0 and len(claims) < limit:
                    fit = min(remaining, per_claim)
                    claims.append(_Claim(key, 0, list(pools), spot, on_demand))
                    _grow(claims[-1], fit * size)
                    remaining -= fit
                continue
            for _ in range(need.jobs):
                # Each pod of a multi-node job on a node of its own (pod anti-affinity).
                placed = 0
                for claim in mine:
                    if placed == need.nodes:
                        break
                    if claim.used + size <= _largest(claim.candidates):
                        _grow(claim, size)
                        placed += 1
                while placed < need.nodes and len(claims) < limit:
                    claims.append(_Claim(key, 0, list(pools), spot, on_demand))
                    _grow(claims[-1], size)
                    mine.append(claims[-1])
                    placed += 1
        return self._launch(claims, market)

    def _launch(self, claims: list[_Claim], market: _Market) -> list[LaunchRequest]:
        counts: dict[tuple[str, NodeShape, tuple[str, ...], str | None], int] = {}
        for claim in claims:
            ordered = self._preference(claim.candidates, claim.spot, claim.on_demand, market)
            chosen = next((p for p in ordered if market.room[p.name] > 0), None)
            if chosen is None:
                continue
            market.room[chosen.name] -= 1
            models, memory, _, team, sharing = claim.key
            shape = combined_shape(claim.used, models, memory, sharing)
            fallbacks = tuple(p.name for p in ordered if p.name != chosen.name)
            slot = (chosen.name, shape, fallbacks, team)
            counts[slot] = counts.get(slot, 0) + 1
        return [
            LaunchRequest(
                pool=name,
                count=count,
                fallbacks=fallbacks,
                reason=f"node claim for pending pods of {shape.describe()}",
                shape=shape,
                team=team,
            )
            for (name, shape, fallbacks, team), count in counts.items()
        ]

    def _preference(
        self, pools: Sequence[PoolView], spot: bool, on_demand: bool, market: _Market
    ) -> list[PoolView]:
        """Spot first when allowed, by price-capacity-optimized; then on-demand, lowest price.

        An EC2 Fleet request spans one cloud, and one cloud's capacity signal says nothing of
        another's: each provider's pools are ranked on their own, and providers are taken in
        the order of the price of their first choice."""
        spot_pools = _by_provider(
            [p for p in pools if spot and p.pool.is_spot], lambda p: market.rank[p.name]
        )
        od_pools = _by_provider(
            [p for p in pools if on_demand and not p.pool.is_spot], lambda p: market.rank[p.name]
        )
        return spot_pools + od_pools

    # -- disruption -----------------------------------------------------------------------------

    def _consolidate(
        self,
        view: FleetView,
        empty: list[CloudNode],
        underused: list[CloudNode],
        kept: set[str],
        pending: list[Need],
        market: _Market,
    ) -> tuple[tuple[DrainRequest, ...], list[LaunchRequest]]:
        allowed = self._budget(view)
        rooms = _ready_rooms(view)
        for need in pending:
            _take(rooms, need)
        by_name = {room.name: room for room in rooms}
        gone: set[str] = set()
        moves: list[DrainRequest] = []
        replacements: list[LaunchRequest] = []
        pools = view.pool_by_name

        def fewest_pods_first(node: CloudNode) -> tuple[int, float, str]:
            pool = pools.get(node.pool)
            return (node.gpus_allocated, -price_of(pool) if pool else 0.0, node.instance_id)

        candidates = sorted(
            (n for n in underused if n.instance_id not in kept), key=fewest_pods_first
        )
        for node in candidates:
            pool = view.pool_by_name.get(node.pool)
            own = by_name.get(node.instance_id)
            if pool is None or own is None or own.received:
                continue
            model = pool.pool.gpu_model
            shape = NodeShape.model_construct(
                gpus=node.gpus_allocated,
                gpu_models=(model,) if model else (),
                min_gpu_memory_gib=None,
            )
            tiers = self.placement.tiers(node.jobs_checkpoint is True, False)
            home = _best_fit(rooms, shape, tiers, avoid=gone | {node.instance_id})
            if home is not None:
                home.free -= node.gpus_allocated
                home.received = True
                own.free = 0
                gone.add(node.instance_id)
                moves.append(
                    DrainRequest(
                        instance_id=node.instance_id,
                        reason=f"consolidation: its {node.gpus_allocated} GPU(s) of work fit on "
                        f"{home.name}",
                        move_jobs=True,
                    )
                )
                continue
            replacement = self._replacement(view, node, pool, shape, tiers, market)
            if replacement is not None:
                replacements.append(replacement)
        empties = [
            d
            for d in drain_requests(empty, kept, view, "consolidation: empty")
            if not (d.instance_id in by_name and by_name[d.instance_id].received)
        ]
        chosen = list(empties[:allowed])
        allowed -= len(chosen)
        chosen += moves[:allowed]
        allowed -= min(allowed, len(moves))
        return tuple(chosen), replacements[:allowed]

    def _replacement(
        self,
        view: FleetView,
        node: CloudNode,
        pool: PoolView,
        shape: NodeShape,
        tiers: tuple[Capacity, ...],
        market: _Market,
    ) -> LaunchRequest | None:
        """One lower-priced node for the work of ``node``: on-demand to on-demand or spot, spot
        to spot only with the gate on and enough cheaper instance types to keep availability."""
        price = price_of(pool)
        spot_node = pool.pool.is_spot
        if spot_node and not self.params.spot_to_spot_consolidation:
            return None
        options = [
            p
            for p in market.pools
            if p.pool.can_host(shape)
            and price_of(p) < price
            and p.name not in market.excluded
            and (Capacity.SPOT if p.pool.is_spot else Capacity.ON_DEMAND) in tiers
            and (p.pool.is_spot or not spot_node)
        ]
        if not options:
            return None
        if spot_node:
            types = {(p.pool.provider, p.pool.instance_type) for p in options}
            if len(types) < self.params.min_spot_to_spot_instance_types:
                return None
        names = {p.name for p in options}
        if any(booting(n) and n.pool in names for n in view.instances):
            return None  # a replacement is already coming up; wait for it to become ready
        ordered = self._preference(options, True, True, market)
        chosen = next((p for p in ordered if market.room[p.name] > 0), None)
        if chosen is None:
            return None
        market.room[chosen.name] -= 1
        return LaunchRequest(
            pool=chosen.name,
            count=1,
            fallbacks=tuple(p.name for p in ordered if p.name != chosen.name),
            reason=f"consolidation: lower-priced replacement for {node.instance_id} "
            f"(${price_of(chosen):.2f}/h instead of ${price:.2f}/h)",
            shape=shape,
            team=node.team,  # bought for the team the replaced node was: its limits hold it
        )

    def _budget(self, view: FleetView) -> int:
        """Disruptions the NodePool budget allows now: ``roundup(nodes * pct)`` minus those
        already being deleted or not ready, over initialized nodes."""
        initialized = [
            n
            for n in view.instances
            if n.joined
            and n.state
            in (InstanceState.RUNNING, InstanceState.DRAINING, InstanceState.INTERRUPTED)
        ]
        disrupting = sum(1 for n in initialized if n.state is not InstanceState.RUNNING)
        total = math.ceil(len(initialized) * self.params.disruption_budget_nodes_pct / 100.0)
        return max(0, total - disrupting)


def _by_provider(
    pools: Sequence[PoolView], rank: Callable[[PoolView], tuple[float, ...]]
) -> list[PoolView]:
    groups: dict[str, list[PoolView]] = {}
    for pool in sorted(pools, key=rank):
        groups.setdefault(pool.pool.provider, []).append(pool)
    ordered = sorted(groups.values(), key=lambda g: (price_of(g[0]), rank(g[0])))
    return [pool for group in ordered for pool in group]


def _largest(pools: Sequence[PoolView]) -> int:
    return max((p.pool.gpus_per_instance for p in pools), default=0)


def _grow(claim: _Claim, gpus: int) -> None:
    claim.used += gpus
    claim.candidates = [p for p in claim.candidates if p.pool.gpus_per_instance >= claim.used]


def _ready_rooms(view: FleetView) -> list[_Room]:
    """Free GPUs on nodes pods can be moved to now: on-prem and running, joined cloud nodes."""
    rooms = [
        _Room(n.name, Capacity.ONPREM, n.gpus_free, n.gpu_model, n.gpu_memory_gib)
        for n in view.onprem
        if n.schedulable
    ]
    gone = leaving(view)
    for node in view.instances:
        if node.state is not InstanceState.RUNNING or not node.joined:
            continue
        pool = view.pool_by_name.get(node.pool)
        if pool is None or node.instance_id in gone:
            continue
        kind = Capacity.SPOT if pool.pool.is_spot else Capacity.ON_DEMAND
        rooms.append(
            _Room(
                node.instance_id,
                kind,
                node.gpus - node.gpus_allocated,
                pool.pool.gpu_model,
                pool.pool.gpu_memory_gib,
            )
        )
    return rooms


def _best_fit(
    rooms: list[_Room], shape: NodeShape, tiers: tuple[Capacity, ...], avoid: set[str]
) -> _Room | None:
    for kind in tiers:
        fitting = [
            r
            for r in rooms
            if r.kind is kind
            and r.name not in avoid
            and shape.accepts(r.free, r.gpu_model, r.gpu_memory_gib)
        ]
        if fitting:
            return min(fitting, key=lambda r: (r.free, r.name))
    return None


def _take(rooms: list[_Room], need: Need) -> None:
    """Let pending pods have the ready room they fit first: the scheduler binds them before any
    consolidation moves."""
    shape = need.shape
    size = need.gpus_per_node
    if need.nodes == 1:
        remaining = need.jobs
        for kind in need.tiers:
            fitting = sorted(
                (
                    r
                    for r in rooms
                    if r.kind is kind and shape.accepts(r.free, r.gpu_model, r.gpu_memory_gib)
                ),
                key=lambda r: (r.free, r.name),
            )
            for room in fitting:
                if remaining == 0:
                    return
                fit = min(remaining, room.free // size)
                if fit > 0:
                    room.free -= fit * size
                    room.received = True
                    remaining -= fit
        return
    for _ in range(need.jobs):
        placed: list[_Room] = []
        for _ in range(need.nodes):
            found = _best_fit(rooms, shape, need.tiers, avoid={r.name for r in placed})
            if found is None:
                return  # the other pods of this job wait with it
            placed.append(found)
        for room in placed:
            room.free -= size
            room.received = True
