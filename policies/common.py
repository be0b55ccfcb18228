"""Building blocks a policy is made of: what capacity is already there or on its way, which
pending jobs it cannot hold, and which new instances host the rest for the least money.

They are shared by the built-in policies and open to plugins; they read only the model.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import NamedTuple

from autoscaler.model import (
    HOLDING_STATES,
    Capacity,
    CloudNode,
    DemandGroup,
    DrainRequest,
    FleetView,
    GpuSharing,
    InstanceState,
    LaunchRequest,
    NodeShape,
    Placement,
    Pool,
    PoolView,
    SharingMode,
)

HOUR = 3600.0


@dataclass
class Need:
    """Pending jobs of one shape that may go to the same kinds of capacity, in the same order.

    ``gpus_per_job`` is each job's total; a job of several ``nodes`` needs ``gpus_per_node`` on
    each of that many distinct nodes at once. ``gpu_models`` (any when empty) and
    ``min_gpu_memory_gib`` say which GPUs it accepts. ``team`` is whose jobs they are: where
    the config names teams, jobs of different teams are never one need, so every launch is
    bought for one team and the guard can hold that team's limits over it. ``class_order`` is
    the (aged) order of the jobs' priority class where the policy buys by class
    (``needs_from(by_class=True)``): needs of a higher order come first and are bought in
    launches of their own, ahead of lower ones, so that limits that bind trim the lower
    classes; 0 everywhere otherwise.
    """

    gpus_per_job: int
    jobs: int
    tiers: tuple[Capacity, ...]
    checkpoint_interval_s: float | None = None
    nodes: int = 1
    gpu_models: tuple[str, ...] = ()
    min_gpu_memory_gib: float | None = None
    team: str | None = None
    class_order: int = 0
    # how the jobs' GPUs must be shared (DemandGroup.gpu_sharing); None: whole GPUs
    gpu_sharing: SharingMode | None = None

    @property
    def gpus_per_node(self) -> int:
        return self.gpus_per_job // self.nodes

    @functools.cached_property
    def shape(self) -> NodeShape:
        return NodeShape.model_construct(
            gpus=self.gpus_per_node,
            gpu_models=self.gpu_models,
            min_gpu_memory_gib=self.min_gpu_memory_gib,
            gpu_sharing=self.gpu_sharing,
        )

    @property
    def spot_ok(self) -> bool:
        return Capacity.SPOT in self.tiers

    def fits(self, pool: PoolView) -> bool:
        """One instance of the pool can be one node of one of these jobs."""
        return pool.pool.can_host(self.shape)

    def allows(self, pool: PoolView) -> bool:
        """The pool is of a market these jobs may use and an instance of it can host them."""
        market = Capacity.SPOT if pool.pool.is_spot else Capacity.ON_DEMAND
        return market in self.tiers and self.fits(pool)

    def with_jobs(self, jobs: int) -> Need:
        return replace(self, jobs=jobs)


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


class Slot(NamedTuple):
    """Free room of one kind on a node: how many GPUs, which GPUs they are, and how a cloud
    node's pool shares them (``gpu_sharing``, None: not shared): a slice need is placed only
    where that is its way (``NodeShape.shares_like``, as for buying). On-prem room says no
    sharing (the model does not carry an on-prem node's), and the sources count a slice as
    demand only where a pool or an on-prem node offers it, so it is matched as before."""

    kind: Capacity
    free: int
    gpu_model: str | None = None
    gpu_memory_gib: float | None = None
    gpu_sharing: GpuSharing | None = None

    def hosts(self, shape: NodeShape) -> bool:
        """Whether jobs of ``shape`` can take this room."""
        return shape.accepts(self.free, self.gpu_model, self.gpu_memory_gib) and (
            self.kind is Capacity.ONPREM or shape.shares_like(self.gpu_sharing)
        )


@dataclass
class Supply:
    """Free GPUs on nodes that are up or on their way, bucketed by size, market and GPU.

    ``idle`` lists the cloud nodes a policy is thinking of draining; they are offered to pending
    jobs last, those with the most unsaved work first, and one that receives a job is kept.
    """

    buckets: dict[Slot, int] = field(default_factory=dict)
    idle: list[tuple[CloudNode, Capacity, Pool | None]] = field(default_factory=list)
    kept: set[str] = field(default_factory=set)

    def add(
        self,
        free: int,
        kind: Capacity,
        count: int = 1,
        gpu_model: str | None = None,
        gpu_memory_gib: float | None = None,
        gpu_sharing: GpuSharing | None = None,
    ) -> None:
        if free > 0 and count > 0:
            key = Slot(kind, free, gpu_model, gpu_memory_gib, gpu_sharing)
            self.buckets[key] = self.buckets.get(key, 0) + count

    def free_gpus(self, kind: Capacity) -> int:
        return sum(slot.free * count for slot, count in self.buckets.items() if slot.kind is kind)


def leaving(view: FleetView) -> set[str]:
    """Instances the cloud has told us it is taking back: not supply, whatever their state says."""
    return {notice.instance_id for notice in view.notices}


def displaced(view: FleetView, checkpoint_interval_s: float | None) -> list[DemandGroup]:
    """The work on instances that are being taken back, as demand to replace now.

    The notice comes before the jobs are requeued: launching at once, away from the pool, gets
    the replacement booting while the old node still runs (AWS gives 120 s). Each job on the
    node is replaced at its own size (``CloudNode.job_gpus``), on a GPU of the node's own model,
    which every one of them accepts; where the scheduler does not say how the node's GPUs are
    split, the node counts as one job of all its allocated GPUs, which buys a shape that can
    hold whatever ran there. A node of a multi-node job is replaced alone: its gang members that
    were not interrupted are still there for the job when it is requeued. The work is counted
    under the team the node was bought for (``CloudNode.team``), so its replacement is bought
    for, and held to the limits of, the same team. On a node whose pool shares its GPUs, the
    one-GPU jobs (slices among them) are replaced as the GPUs they held (``_displaced_jobs``).
    """
    gone = leaving(view)
    pools = view.pool_by_name
    sizes: dict[tuple[int, str | None, str | None, SharingMode | None], int] = {}
    for node in view.instances:
        if node.instance_id not in gone or node.gpus_allocated <= 0:
            continue
        pool = pools.get(node.pool)
        model = pool.pool.gpu_model if pool is not None else None
        sharing = pool.pool.gpu_sharing if pool is not None else None
        for gpus, shared in _displaced_jobs(node, sharing):
            key = (gpus, model, node.team, shared)
            sizes[key] = sizes.get(key, 0) + 1
    return [
        DemandGroup.model_construct(
            gpus_per_job=gpus,
            jobs=count,
            checkpoint_interval_s=checkpoint_interval_s,
            high_priority=False,
            nodes=1,
            gpu_models=(model,) if model else (),
            min_gpu_memory_gib=None,
            oldest_submit_time=view.now,
            team=team,
            gpu_sharing=shared,
        )
        for (gpus, model, team, shared), count in sorted(
            sizes.items(),
            key=lambda kv: (-kv[0][0], kv[0][1] or "", kv[0][2] or "", kv[0][3] or ""),
        )
    ]


def _displaced_jobs(
    node: CloudNode, sharing: GpuSharing | None
) -> list[tuple[int, SharingMode | None]]:
    """The jobs of an interrupted node as (GPUs, how they must be shared). Where its pool
    shares its GPUs and the scheduler says each job's GPUs, a job of several GPUs is replaced
    whole, and the one-GPU jobs (a slice holder counts one: the GPU it sits on) as the GPUs
    they held, each a one-GPU job of the pool's sharing mode: slices could run on no other
    pool, and four quarter-GPU jobs on one GPU are one GPU to replace, not four."""
    if sharing is None or node.job_gpus is None:
        return [(gpus, None) for gpus in node.job_gpus or (node.gpus_allocated,)]
    several = [gpus for gpus in node.job_gpus if gpus > 1]
    singles = len(node.job_gpus) - len(several)
    room = node.gpus_allocated - sum(several)
    held = min(singles, room) if room > 0 else singles
    return [(gpus, None) for gpus in several] + [(1, sharing.mode)] * held


def supply(view: FleetView, idle: Iterable[CloudNode] = ()) -> Supply:
    idle_ids = {n.instance_id for n in idle}
    gone = leaving(view)
    result = Supply()
    for onprem in view.onprem:
        if onprem.schedulable:
            result.add(
                onprem.gpus_free,
                Capacity.ONPREM,
                gpu_model=onprem.gpu_model,
                gpu_memory_gib=onprem.gpu_memory_gib,
            )
    pools = view.pool_by_name
    for node in view.instances:
        if node.state not in HOLDING_STATES or node.instance_id in gone:
            continue
        pool = pools.get(node.pool)
        if pool is None:
            continue  # not configured any more: act collects it this tick
        kind = Capacity.SPOT if pool.pool.is_spot else Capacity.ON_DEMAND
        if node.instance_id in idle_ids:
            result.idle.append((node, kind, pool.pool))
            continue
        free = node.gpus - node.gpus_allocated if node.joined else node.gpus
        result.add(
            free,
            kind,
            gpu_model=pool.pool.gpu_model,
            gpu_memory_gib=pool.pool.gpu_memory_gib,
            gpu_sharing=pool.pool.gpu_sharing,
        )
    result.idle.sort(key=_most_at_risk_first)
    return result


def needs_from(
    groups: Sequence[DemandGroup], placement: Placement, by_class: bool = False
) -> list[Need]:
    """The groups merged into needs: one per shape, placement and team (and, ``by_class``,
    class order, highest first), largest first within that."""
    merged: dict[tuple[object, ...], Need] = {}
    for group in groups:
        tiers = placement.tiers(group.checkpoint_interval_s is not None, group.high_priority)
        order = group.class_order if by_class else 0
        key = (
            group.gpus_per_job,
            group.nodes,
            group.gpu_models,
            group.min_gpu_memory_gib,
            tiers,
            group.team,
            order,
            group.gpu_sharing,
        )
        interval = group.checkpoint_interval_s if Capacity.SPOT in tiers else None
        need = merged.get(key)
        if need is None:
            merged[key] = Need(
                group.gpus_per_job,
                group.jobs,
                tiers,
                interval,
                group.nodes,
                group.gpu_models,
                group.min_gpu_memory_gib,
                group.team,
                order,
                group.gpu_sharing,
            )
        else:
            need.jobs += group.jobs
            if interval is not None:
                need.checkpoint_interval_s = max(need.checkpoint_interval_s or 0.0, interval)
    # Largest nodes first (they have the fewest places to go), gangs before single nodes; then
    # the jobs with the fewest kinds of GPU and capacity open to them, for the same reason.
    return sorted(
        merged.values(),
        key=lambda n: (
            -n.class_order,
            -n.gpus_per_node,
            -n.nodes,
            len(n.tiers),
            -len(n.gpu_models) if n.gpu_models else -1_000,
        ),
    )


def can_ever_host(view: FleetView, need: Need) -> bool:
    """Whether any capacity the fleet has or may buy could ever run one of these jobs: enough
    on-prem nodes of a fitting GPU, or a configured pool of a market the jobs may use whose
    instances fit one node of the job. Jobs that fail this wait forever: policies leave them
    out of what they buy, and the controller reports them."""
    shape = need.shape
    if Capacity.ONPREM in need.tiers:
        fitting = sum(
            count
            for (gpus, model, memory), count in view.onprem_kinds.items()
            if shape.accepts(gpus, model, memory)
        )
        if fitting >= need.nodes:
            return True
    return any(need.allows(pool) for pool in view.pools)


def unmet(needs: list[Need], available: Supply) -> list[Need]:
    """Place needs into free room, tier by tier in the placement's order and best fit within a
    tier, and return what is left. Only room on GPUs a job accepts counts (a slice's, on a pool
    that shares its way: ``Slot.hosts``), and a job of several nodes takes room on that many
    distinct nodes or none. Idle nodes come last; any that takes a job is kept (recorded in
    ``available.kept``)."""
    left: list[Need] = []
    for need in needs:
        remaining = need.jobs
        size = need.gpus_per_node
        shape = need.shape
        for kind in need.tiers:
            if remaining == 0:
                break
            slots = sorted(
                (
                    slot
                    for slot, count in available.buckets.items()
                    if count > 0 and slot.kind is kind and slot.hosts(shape)
                ),
                key=lambda s: (s.free, s.gpu_model or "", s.gpu_memory_gib or 0.0),
            )
            if need.nodes > 1:
                remaining = _place_gangs(need, remaining, slots, available)
                continue
            for slot in slots:
                if remaining == 0:
                    break
                count = available.buckets.get(slot, 0)
                if count == 0:
                    continue
                per_node = slot.free // size
                nodes_used = min(count, math.ceil(remaining / per_node))
                hosted = min(remaining, nodes_used * per_node)
                remaining -= hosted
                available.buckets[slot] = count - nodes_used
                # All but the last node used are as full as this size can make them.
                available.add(
                    slot.free - per_node * size,
                    kind,
                    nodes_used - 1,
                    slot.gpu_model,
                    slot.gpu_memory_gib,
                    slot.gpu_sharing,
                )
                last_hosted = hosted - (nodes_used - 1) * per_node
                available.add(
                    slot.free - last_hosted * size,
                    kind,
                    1,
                    slot.gpu_model,
                    slot.gpu_memory_gib,
                    slot.gpu_sharing,
                )
        remaining = _place_on_idle(need, remaining, available)
        if remaining:
            left.append(need.with_jobs(remaining))
    return left


def _place_gangs(need: Need, remaining: int, slots: list[Slot], available: Supply) -> int:
    """Host whole multi-node jobs on distinct fitting nodes of one kind, tightest first."""
    size = need.gpus_per_node
    nodes_free = sum(available.buckets[slot] for slot in slots)
    jobs = min(remaining, nodes_free // need.nodes)
    take = jobs * need.nodes
    for slot in slots:
        if take == 0:
            break
        used = min(take, available.buckets[slot])
        available.buckets[slot] -= used
        available.add(
            slot.free - size,
            slot.kind,
            used,
            slot.gpu_model,
            slot.gpu_memory_gib,
            slot.gpu_sharing,
        )
        take -= used
    return remaining - jobs


def _place_on_idle(need: Need, remaining: int, available: Supply) -> int:
    """Idle nodes a policy would drain, taken for pending work before buying anew."""
    shape = need.shape
    fitting: list[tuple[CloudNode, int]] = []
    for node, kind, pool in available.idle:
        if kind not in need.tiers or node.instance_id in available.kept or pool is None:
            continue
        free = node.gpus - node.gpus_allocated if node.joined else node.gpus
        if shape.accepts(free, pool.gpu_model, pool.gpu_memory_gib) and shape.shares_like(
            pool.gpu_sharing
        ):
            fitting.append((node, free))
    if need.nodes > 1:
        jobs = min(remaining, len(fitting) // need.nodes)
        for node, _ in fitting[: jobs * need.nodes]:
            available.kept.add(node.instance_id)
        return remaining - jobs
    for node, free in fitting:
        if remaining == 0:
            break
        available.kept.add(node.instance_id)
        remaining -= min(remaining, free // need.gpus_per_node)
    return remaining


def _most_at_risk_first(item: tuple[CloudNode, Capacity, Pool | None]) -> float:
    """Idle nodes taken for pending work are those that would lose most if drained."""
    risk = item[0].work_at_risk_gpu_s
    return -(risk or 0.0)


@dataclass
class _Bins:
    offer: Offer
    need: Need
    count: int = 0
    partial: list[int] = field(default_factory=list)


def pack(
    needs: Sequence[Need],
    offers_for: Callable[[Need], Sequence[Offer]],
    fallbacks_for: Callable[[Need, Offer], Sequence[str]],
    pools: Mapping[str, PoolView] | None = None,
) -> list[LaunchRequest]:
    """Choose new instances for the needs: for each shape (largest first) fill room left in
    instances already chosen that the jobs accept, then buy the offer that hosts the rest for
    the least money, which is the least waste at that price. Only offers whose instances can
    host the jobs' nodes are considered, and only such fallbacks are named; a multi-node job
    gets a gang of one instance per node in one pool. Returns one launch request per pool and
    shape, carrying that shape so nothing downstream can substitute one that does not fit.
    Fallbacks are kept only when they host the shape: among the offers, or among ``pools``
    when given (a policy whose fallbacks reach beyond its offers). Instances are bought per
    team (the needs' ``team``): a team's jobs fill only room in its own team's instances, so
    each launch is one team's; without teams every need's team is None and nothing changes.
    New instances for needs of a higher ``class_order`` are launches of their own, listed
    first, so that the guard, which grants in plan order, trims the lower classes when limits
    bind (their jobs may still fill room left in a higher class's instances)."""
    bins: dict[tuple[str, NodeShape, int, str | None, int], _Bins] = {}
    fallbacks: dict[tuple[str, NodeShape, int, str | None, int], Sequence[str]] = {}
    verdicts: dict[tuple[str, NodeShape], bool] = {}

    def fits(need: Need, pool: PoolView) -> bool:
        # Needs of one shape (other intervals, tiers) ask the same of the same pools.
        found = verdicts.get((pool.pool.name, need.shape))
        if found is None:
            found = verdicts[(pool.pool.name, need.shape)] = need.fits(pool)
        return found

    for need in needs:
        offers = [o for o in offers_for(need) if fits(need, o.pool)]
        allowed = {o.name for o in offers}
        remaining = need.jobs
        per_job = need.nodes
        size = need.gpus_per_node
        if per_job == 1:
            for entry in sorted(bins.values(), key=lambda b: b.offer.cost_per_gpu_hour):
                if entry.offer.name not in allowed or entry.need.team != need.team:
                    continue
                still: list[int] = []
                for free in entry.partial:
                    fit = min(remaining, free // size)
                    remaining -= fit
                    rest = free - fit * size
                    if rest:
                        still.append(rest)
                entry.partial = still
        used: dict[str, int] = {}
        for (name, _, _, _, _), entry in bins.items():
            used[name] = used.get(name, 0) + entry.count
        room = {o.name: o.room - used.get(o.name, 0) for o in offers}
        while remaining > 0:
            best: tuple[float, int, int, int] | None = None
            chosen: Offer | None = None
            for rank, offer in enumerate(offers):
                if room[offer.name] < per_job or not math.isfinite(offer.cost_per_hour):
                    continue
                jobs_each = offer.gpus // size if per_job == 1 else 1
                k = _instances(remaining, jobs_each, per_job, room[offer.name])
                hosted = min(remaining, (k // per_job) * jobs_each)
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
            jobs_each = chosen.gpus // size if per_job == 1 else 1
            k = _instances(remaining, jobs_each, per_job, room[chosen.name])
            hosted = min(remaining, (k // per_job) * jobs_each)
            remaining -= hosted
            room[chosen.name] -= k
            key = (chosen.name, need.shape, per_job, need.team, need.class_order)
            entry = bins.setdefault(key, _Bins(chosen, need))
            entry.count += k
            if per_job == 1:
                last = hosted - (k - 1) * jobs_each
                rest = chosen.gpus - last * size
                if rest:
                    entry.partial.append(rest)
            else:
                entry.partial.extend([chosen.gpus - size] * k)
            if key not in fallbacks:
                fallbacks[key] = [
                    f
                    for f in fallbacks_for(need, chosen)
                    if f != chosen.name
                    and (
                        f in allowed or (pools is not None and f in pools and fits(need, pools[f]))
                    )
                ]
    return [
        LaunchRequest(
            pool=name,
            count=entry.count,
            fallbacks=tuple(fallbacks.get((name, shape, gang, team, order), ())),
            reason=f"host pending jobs of {shape.describe()}"
            + (f" on each of {gang} nodes" if gang > 1 else ""),
            shape=shape,
            gang_size=gang,
            team=team,
        )
        for (name, shape, gang, team, order), entry in sorted(
            bins.items(),
            key=lambda item: (
                -item[0][4],
                item[0][0],
                -item[0][1].gpus,
                item[0][2],
                item[0][3] or "",
            ),
        )
        if entry.count > 0
    ]


def _instances(remaining: int, jobs_each: int, per_job: int, room: int) -> int:
    """Instances to buy for ``remaining`` jobs: whole gangs of ``per_job`` for multi-node jobs,
    else enough instances holding ``jobs_each`` jobs each, within ``room``."""
    if per_job > 1:
        return min(remaining, room // per_job) * per_job
    return min(room, math.ceil(remaining / jobs_each))


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
    members: int = 1,
    reclaim_size: float = 1.0,
) -> float:
    """Spot price grossed up by the work interruptions waste: what an hour of *useful* work costs.

    With interruptions at rate λ per hour, each losing on average half a checkpoint interval
    plus the time to get a replacement booted and the job restarted, the useful share of a paid
    hour is ``1 - λ·(interval/2 + restart)``. A job of ``members`` nodes stops whole when any one
    of them is taken. If the pool's reclaims take one instance at a time, that happens
    ``members`` times as often; if each takes ``reclaim_size`` instances at once (a pool that
    runs dry takes all of them), the members tend to go together and the job's rate is
    ``members / min(members, reclaim_size)`` times λ: λ itself when a reclaim takes at least
    as many instances as the job has. A job that cannot checkpoint loses everything it did, so
    it never gets a finite price on spot. Below ``min_useful_fraction`` the pool is not worth
    buying at any price.
    """
    if pool.price is None:
        return math.inf
    price = pool.price.price_per_hour
    if not pool.pool.is_spot:
        return price
    if checkpoint_interval_s is None:
        return math.inf
    lost_hours = (checkpoint_interval_s / 2 + restart_overhead_s + pool.pool.boot_seconds) / HOUR
    together = min(float(members), max(1.0, reclaim_size))
    useful = 1.0 - members / together * interruption_rate_per_hour * lost_hours
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


def on_demand_nodes_to_replace(view: FleetView, min_age_s: float) -> list[CloudNode]:
    """Running on-demand nodes, busy, whose jobs all checkpoint and run on this node alone, that
    have run at least ``min_age_s`` (and twice their pool's boot time): the nodes a policy may
    replace by cheaper capacity. Run times are heavy-tailed, so work that has run long is
    likely to run long yet and pays for the restart a move costs; a node bought a moment ago,
    while spot was short, is left to finish its work."""
    pools = view.pool_by_name
    found = []
    for node in view.instances:
        if node.state is not InstanceState.RUNNING or node.gpus_allocated == 0:
            continue
        pool = pools.get(node.pool)
        if pool is None or pool.pool.is_spot or node.jobs_checkpoint is not True:
            continue
        if node.multi_node_jobs is not False:
            continue  # moving one member would requeue a whole gang for one node's saving
        if view.now - node.launched_at >= max(min_age_s, 2 * pool.pool.boot_seconds):
            found.append(node)
    return found


def on_demand_gangs_to_replace(view: FleetView, min_age_s: float) -> list[tuple[CloudNode, ...]]:
    """Multi-node jobs running whole on busy on-demand nodes that hold nothing else, each the
    tuple of its nodes, once they have run as long as ``on_demand_nodes_to_replace`` asks. A
    gang moves whole or not at all (one member taken requeues the job), so it is replaced as
    one: only when every node it spans is seen here."""
    pools = view.pool_by_name
    members: dict[tuple[str, int], list[CloudNode]] = {}
    for node in view.instances:
        if node.state is not InstanceState.RUNNING or not node.gang_jobs:
            continue
        pool = pools.get(node.pool)
        if pool is None or pool.pool.is_spot or node.jobs_checkpoint is not True:
            continue
        if len(node.gang_jobs) != 1 or len(node.job_gpus or ()) != 1:
            continue  # shared with other jobs: moving the gang would not free the node
        if view.now - node.launched_at < max(min_age_s, 2 * pool.pool.boot_seconds):
            continue
        members.setdefault(node.gang_jobs[0], []).append(node)
    return [
        tuple(sorted(nodes, key=lambda n: n.instance_id))
        for (_, spans), nodes in sorted(members.items())
        if len(nodes) == spans
    ]


def onprem_room(available: Supply) -> list[int]:
    """Free on-prem GPUs per node left in ``available`` (after pending work took its share)."""
    room: list[int] = []
    for slot, count in available.buckets.items():
        if slot.kind is Capacity.ONPREM:
            room.extend([slot.free] * count)
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
