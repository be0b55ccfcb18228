"""Building blocks a policy is made of: what capacity is already there or on its way, which
pending jobs it cannot hold, and which new instances host the rest for the least money.

They are shared by the built-in policies and open to plugins; they read only the model.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from autoscaler.model import (
    HOLDING_STATES,
    Capacity,
    CloudNode,
    DemandGroup,
    DrainRequest,
    FleetView,
    InstanceState,
    LaunchRequest,
    Placement,
    PoolView,
)

HOUR = 3600.0


@dataclass
class Need:
    """Pending jobs of one size that may go to the same kinds of capacity, in the same order."""

    gpus_per_job: int
    jobs: int
    tiers: tuple[Capacity, ...]
    checkpoint_interval_s: float | None = None

    @property
    def spot_ok(self) -> bool:
        return Capacity.SPOT in self.tiers

    def allows(self, pool: PoolView) -> bool:
        return (Capacity.SPOT if pool.pool.is_spot else Capacity.ON_DEMAND) in self.tiers


@dataclass(frozen=True)
class Offer:
    """A pool a policy is willing to buy from, with the price it ranks it by."""

    pool: PoolView
    cost_per_hour: float
    room: int

    @property
    def name(self) -> str:
        return self.pool.pool.name

    @property
    def gpus(self) -> int:
        return self.pool.pool.gpus_per_instance

    @property
    def spot(self) -> bool:
        return self.pool.pool.is_spot

    @property
    def cost_per_gpu_hour(self) -> float:
        return self.cost_per_hour / self.gpus


@dataclass
class Supply:
    """Free GPUs on nodes that are up or on their way, bucketed by size and market.

    ``idle`` lists the cloud nodes a policy is thinking of draining; they are offered to pending
    jobs last, those with the most unsaved work first, and one that receives a job is kept.
    """

    buckets: dict[tuple[Capacity, int], int] = field(default_factory=dict)
    idle: list[tuple[CloudNode, Capacity]] = field(default_factory=list)
    kept: set[str] = field(default_factory=set)

    def add(self, free: int, kind: Capacity, count: int = 1) -> None:
        if free > 0 and count > 0:
            key = (kind, free)
            self.buckets[key] = self.buckets.get(key, 0) + count


def leaving(view: FleetView) -> set[str]:
    """Instances the cloud has told us it is taking back: not supply, whatever their state says."""
    return {notice.instance_id for notice in view.notices}


def displaced(view: FleetView, checkpoint_interval_s: float | None) -> list[DemandGroup]:
    """The work on instances that are being taken back, as demand to replace now.

    The notice comes before the jobs are requeued: launching at once, away from the pool, gets
    the replacement booting while the old node still runs (AWS gives 120 s). The view does not
    say how a node's GPUs are split between jobs, so each node counts as one job of all its
    allocated GPUs, which buys a shape that can hold whatever ran there.
    """
    gone = leaving(view)
    return [
        DemandGroup.model_construct(
            gpus_per_job=node.gpus_allocated,
            jobs=1,
            checkpoint_interval_s=checkpoint_interval_s,
            high_priority=False,
            gpu_model=None,
            oldest_submit_time=view.now,
        )
        for node in view.instances
        if node.instance_id in gone and node.gpus_allocated > 0
    ]


def supply(view: FleetView, idle: Iterable[CloudNode] = ()) -> Supply:
    idle_ids = {n.instance_id for n in idle}
    gone = leaving(view)
    result = Supply()
    for onprem in view.onprem:
        if onprem.schedulable:
            result.add(onprem.gpus_free, Capacity.ONPREM)
    pools = view.pool_by_name
    for node in view.instances:
        if node.state not in HOLDING_STATES or node.instance_id in gone:
            continue
        pool = pools.get(node.pool)
        if pool is None:
            continue  # not configured any more: act collects it this tick
        kind = Capacity.SPOT if pool.pool.is_spot else Capacity.ON_DEMAND
        if node.instance_id in idle_ids:
            result.idle.append((node, kind))
            continue
        free = node.gpus - node.gpus_allocated if node.joined else node.gpus
        result.add(free, kind)
    result.idle.sort(key=_most_at_risk_first)
    return result


def needs_from(groups: Sequence[DemandGroup], placement: Placement) -> list[Need]:
    merged: dict[tuple[int, tuple[Capacity, ...]], Need] = {}
    for group in groups:
        tiers = placement.tiers(group.checkpoint_interval_s is not None, group.high_priority)
        key = (group.gpus_per_job, tiers)
        interval = group.checkpoint_interval_s if Capacity.SPOT in tiers else None
        need = merged.get(key)
        if need is None:
            merged[key] = Need(group.gpus_per_job, group.jobs, tiers, interval)
        else:
            need.jobs += group.jobs
            if interval is not None:
                need.checkpoint_interval_s = max(need.checkpoint_interval_s or 0.0, interval)
    # Largest first (they have the fewest places to go); then the jobs with fewer kinds of
    # capacity open to them, for the same reason.
    return sorted(merged.values(), key=lambda n: (-n.gpus_per_job, len(n.tiers)))


def unmet(needs: list[Need], available: Supply) -> list[Need]:
    """Place needs into free room, tier by tier in the placement's order and best fit within a
    tier, and return what is left. Idle nodes come last; any that takes a job is kept (recorded
    in ``available.kept``)."""
    left: list[Need] = []
    for need in needs:
        remaining = need.jobs
        size = need.gpus_per_job
        for kind in need.tiers:
            for free in sorted({f for (k, f) in available.buckets if k is kind and f >= size}):
                if remaining == 0:
                    break
                count = available.buckets.get((kind, free), 0)
                if count == 0:
                    continue
                per_node = free // size
                nodes_used = min(count, math.ceil(remaining / per_node))
                hosted = min(remaining, nodes_used * per_node)
                remaining -= hosted
                available.buckets[(kind, free)] = count - nodes_used
                # All but the last node used are as full as this size can make them.
                available.add(free - per_node * size, kind, nodes_used - 1)
                last_hosted = hosted - (nodes_used - 1) * per_node
                available.add(free - last_hosted * size, kind)
        for node, kind in available.idle:
            if remaining == 0:
                break
            if kind not in need.tiers:
                continue
            free = node.gpus - node.gpus_allocated if node.joined else node.gpus
            if free >= size and node.instance_id not in available.kept:
                available.kept.add(node.instance_id)
                remaining -= min(remaining, free // size)
        if remaining:
            left.append(Need(size, remaining, need.tiers, need.checkpoint_interval_s))
    return left


def _most_at_risk_first(item: tuple[CloudNode, Capacity]) -> float:
    """Idle nodes taken for pending work are those that would lose most if drained."""
    risk = item[0].work_at_risk_gpu_s
    return -(risk or 0.0)


@dataclass
class _Bins:
    offer: Offer
    count: int = 0
    largest_job: int = 0
    partial: list[int] = field(default_factory=list)


def pack(
    needs: Sequence[Need],
    offers_for: Callable[[Need], Sequence[Offer]],
    fallbacks_for: Callable[[Need, Offer], Sequence[str]],
) -> list[LaunchRequest]:
    """Choose new instances for the needs: for each size (largest first) fill room left in
    instances already chosen, then buy the offer that hosts the rest for the least money, which
    is the least waste at that price. Returns one launch request per pool and job size class."""
    bins: dict[str, _Bins] = {}
    fallbacks: dict[str, Sequence[str]] = {}
    for need in needs:
        offers = [o for o in offers_for(need) if o.gpus >= need.gpus_per_job]
        allowed = {o.name for o in offers}
        remaining = need.jobs
        for entry in sorted(bins.values(), key=lambda b: b.offer.cost_per_gpu_hour):
            if entry.offer.name not in allowed:
                continue
            still: list[int] = []
            for free in entry.partial:
                fit = min(remaining, free // need.gpus_per_job)
                remaining -= fit
                rest = free - fit * need.gpus_per_job
                if rest:
                    still.append(rest)
            entry.partial = still
        room = {o.name: o.room - (bins[o.name].count if o.name in bins else 0) for o in offers}
        while remaining > 0:
            best: tuple[float, int, int, int] | None = None
            chosen: Offer | None = None
            for rank, offer in enumerate(offers):
                if room[offer.name] <= 0 or not math.isfinite(offer.cost_per_hour):
                    continue
                per = offer.gpus // need.gpus_per_job
                k = min(room[offer.name], math.ceil(remaining / per))
                hosted = min(remaining, k * per)
                # Cheapest per hosted job; then least waste; then smaller instances, whose GPUs
                # come back as soon as their job ends; then the offer's own rank.
                score = (
                    round(offer.cost_per_hour * k / hosted, 9),
                    k * offer.gpus - hosted * need.gpus_per_job,
                    offer.gpus,
                    rank,
                )
                if best is None or score < best:
                    best, chosen = score, offer
            if chosen is None:
                break
            per = chosen.gpus // need.gpus_per_job
            k = min(room[chosen.name], math.ceil(remaining / per))
            hosted = min(remaining, k * per)
            remaining -= hosted
            room[chosen.name] -= k
            entry = bins.setdefault(chosen.name, _Bins(chosen))
            entry.count += k
            entry.largest_job = max(entry.largest_job, need.gpus_per_job)
            last = hosted - (k - 1) * per
            rest = chosen.gpus - last * need.gpus_per_job
            if rest:
                entry.partial.append(rest)
            if chosen.name not in fallbacks:
                fallbacks[chosen.name] = fallbacks_for(need, chosen)
    return [
        LaunchRequest(
            pool=name,
            count=entry.count,
            fallbacks=tuple(f for f in fallbacks.get(name, ()) if f != name),
            reason=f"host pending jobs of up to {entry.largest_job} GPU(s)",
        )
        for name, entry in sorted(bins.items())
        if entry.count > 0
    ]


def headroom(view: FleetView, pool: PoolView) -> int:
    limit = pool.pool.max_instances
    if limit is None:
        return 1_000_000
    return max(0, limit - view.holding_by_pool.get(pool.pool.name, 0))


def effective_cost_per_hour(
    pool: PoolView,
    checkpoint_interval_s: float | None,
    restart_overhead_s: float,
    interruption_rate_per_hour: float,
    min_useful_fraction: float,
) -> float:
    """Spot price grossed up by the work interruptions waste: what an hour of *useful* work costs.

    With interruptions at rate λ per hour, each losing on average half a checkpoint interval
    plus the time to get a replacement booted and the job restarted, the useful share of a paid
    hour is ``1 - λ·(interval/2 + restart)``. A job that cannot checkpoint loses everything it
    did, so it never gets a finite price on spot. Below ``min_useful_fraction`` the pool is not
    worth buying at any price.
    """
    if pool.price is None:
        return math.inf
    price = pool.price.price_per_hour
    if not pool.pool.is_spot:
        return price
    if checkpoint_interval_s is None:
        return math.inf
    lost_hours = (checkpoint_interval_s / 2 + restart_overhead_s + pool.pool.boot_seconds) / HOUR
    useful = 1.0 - interruption_rate_per_hour * lost_hours
    if useful < min_useful_fraction:
        return math.inf
    return price / useful


def idle_nodes(
    view: FleetView, idle_seconds: float | None, *, by_allocation: bool
) -> list[CloudNode]:
    """Joined, running cloud nodes that have done nothing for ``idle_seconds``.

    ``by_allocation`` chooses the signal: the scheduler's "no job here" (what allocation-based
    autoscalers use) or measured GPU utilisation below the telemetry threshold (which also finds
    nodes whose jobs hold GPUs and use none of them).

    ``idle_seconds=None`` waits each node's boot time: the rent-or-buy break-even, since keeping
    an idle node that long costs what buying it again would, so the policy never pays more than
    twice what hindsight would have (the ski-rental bound), however jobs arrive.
    """
    pools = view.pool_by_name
    found = []
    for node in view.instances:
        if node.state is not InstanceState.RUNNING or not node.joined:
            continue
        since = node.empty_since if by_allocation else node.idle_since
        if since is not None and view.now - since >= _break_even(pools, node, idle_seconds):
            found.append(node)
    return found


def _break_even(pools: Mapping[str, PoolView], node: CloudNode, wait_s: float | None) -> float:
    """How long a node may sit unused before it goes: ``wait_s``, or its pool's boot time."""
    if wait_s is not None:
        return wait_s
    pool = pools.get(node.pool)
    return pool.pool.boot_seconds if pool is not None else 0.0


def underused_nodes(view: FleetView, wait_s: float | None) -> list[CloudNode]:
    """Running multi-GPU cloud nodes that have had at most half of their GPUs allocated for
    ``wait_s`` (each pool's boot time when None) and whose jobs all checkpoint: nodes whose few
    jobs could move at their next checkpoint and let the node go."""
    pools = view.pool_by_name
    found = []
    for node in view.instances:
        if node.state is not InstanceState.RUNNING or node.underused_since is None:
            continue
        if node.jobs_checkpoint is not True:
            continue
        if view.now - node.underused_since >= _break_even(pools, node, wait_s):
            found.append(node)
    return found


def onprem_room(available: Supply) -> list[int]:
    """Free on-prem GPUs per node left in ``available`` (after pending work took its share)."""
    room: list[int] = []
    for (kind, free), count in available.buckets.items():
        if kind is Capacity.ONPREM:
            room.extend([free] * count)
    return sorted(room)


def unobserved_nodes(view: FleetView, idle_seconds: float | None) -> list[CloudNode]:
    """Running cloud nodes no scheduler or telemetry reports on, past their boot and idle time.

    For fleets with no node telemetry (queue workers), these are what a policy can give back
    when demand no longer needs them; anywhere else, unknown must not be read as idle.
    """
    pools = view.pool_by_name
    found = []
    for node in view.instances:
        if node.state is not InstanceState.RUNNING or node.joined:
            continue
        pool = pools.get(node.pool)
        boot = pool.pool.boot_seconds if pool is not None else 0.0
        wait = boot if idle_seconds is None else boot + idle_seconds
        if view.now - node.launched_at >= wait:
            found.append(node)
    return found


def drain_requests(
    nodes: Iterable[CloudNode], keep: set[str], view: FleetView, reason: str
) -> tuple[DrainRequest, ...]:
    """Drains for idle nodes not kept for pending work: first those whose jobs would lose the
    least unsaved work (nodes of unknown risk after every known one), then the most expensive.
    The guard admits drains in this order, so a rate limit spares the nodes with most to lose."""
    pools = view.pool_by_name

    def order(node: CloudNode) -> tuple[bool, float, float, str]:
        quote = pools[node.pool].price if node.pool in pools else None
        price = quote.price_per_hour if quote is not None else 0.0
        risk = node.work_at_risk_gpu_s
        return (risk is None, risk or 0.0, -price, node.instance_id)

    chosen = [n for n in nodes if n.instance_id not in keep]
    chosen.sort(key=order)
    return tuple(DrainRequest(instance_id=n.instance_id, reason=reason) for n in chosen)
