"""The guard: hard limits no policy can lift, and the wall that contains a misbehaving policy.

A plan that names pools or instances the view does not hold is rejected whole (the tick then
holds the fleet as it is). A sane plan is clamped: drains here, launches through an ``Allowance``
that act consults for every launch, fallbacks included, so per-pool and total instance/GPU limits,
the $/hour budget, the monthly budget and the launch rate hold whatever act ends up buying.

The monthly cap is read against the journal's spend this calendar month; while that spend is
unknown (the journal cannot be read) scale-up is held, never assumed affordable.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from autoscaler.model import (
    LIVE_STATES,
    DrainRequest,
    FleetView,
    InstanceState,
    LaunchRequest,
    NodeShape,
    Plan,
    Pool,
    PoolView,
)
from autoscaler.model.config import Limits
from autoscaler.model.errors import PolicyError
from autoscaler.model.records import Clamp

_INF = math.inf


@dataclass
class GuardMemory:
    """What the guard must remember between ticks to apply cool-downs."""

    last_scale_up: dict[str, float] = field(default_factory=dict)
    last_scale_down: dict[str, float] = field(default_factory=dict)


def validate_plan(plan: object, view: FleetView) -> Plan:
    """Refuse a plan the controller cannot even interpret; a reason goes into the tick's report."""
    if not isinstance(plan, Plan):
        raise PolicyError(f"decide() returned {type(plan).__name__}, not a Plan")
    pools = view.pool_by_name
    for launch in plan.launches:
        for name in (launch.pool, *launch.fallbacks):
            if name not in pools:
                raise PolicyError(f"plan launches in pool {name!r}, which is not configured")
    known = {node.instance_id for node in view.instances}
    seen: set[str] = set()
    for drain in plan.drains:
        if drain.instance_id not in known:
            raise PolicyError(f"plan drains {drain.instance_id!r}, which is not an instance we own")
        if drain.instance_id in seen:
            raise PolicyError(f"plan drains {drain.instance_id!r} twice")
        seen.add(drain.instance_id)
    return plan


class Allowance:
    """The room a tick has left under every limit; act asks it before each launch."""

    def __init__(
        self,
        limits: Limits,
        view: FleetView,
        memory: GuardMemory,
        month_spend: float | None = None,
    ) -> None:
        self.limits = limits
        self.month_spend = month_spend
        self.now = view.now
        self.memory = memory
        self.clamps: list[Clamp] = []
        self._pools = view.pool_by_name
        self._cooling = {
            pool
            for pool, last in memory.last_scale_up.items()
            if view.now - last < limits.scale_up_cooldown_s
        }
        live_by_pool: dict[str, int] = {}
        live_gpus = 0
        cost = 0.0
        unpriced: set[str] = set()
        for node in view.instances:
            if node.state not in LIVE_STATES:
                continue
            live_by_pool[node.pool] = live_by_pool.get(node.pool, 0) + 1
            live_gpus += node.gpus
            pool_view = self._pools.get(node.pool)
            if pool_view is None or pool_view.price is None:
                unpriced.add(node.pool)
            else:
                cost += pool_view.price.price_per_hour
        self.live_by_pool = live_by_pool
        live_total = sum(live_by_pool.values())
        self.instances_left = _room(limits.max_instances, live_total)
        self.gpus_left = _room(limits.max_gpus, live_gpus)
        self.launches_left: float = limits.max_launches_per_tick
        self.cost_per_hour = cost
        self.budget_left: float = _INF
        self.unpriced = tuple(sorted(unpriced))
        if limits.max_cost_per_hour is not None:
            self.budget_left = 0.0 if unpriced else max(0.0, limits.max_cost_per_hour - cost)
        self.month_left: float = _INF
        if limits.max_cost_per_month is not None:
            spent = month_spend if month_spend is not None else _INF
            self.month_left = max(0.0, limits.max_cost_per_month - spent)

    def admit_launch(self, pool_view: PoolView, count: int) -> int:
        """How many of ``count`` instances may be launched in this pool; debits what it grants."""
        pool = pool_view.pool
        allowed: float = count
        allowed = self._cap(
            allowed, "scale_up_cooldown", pool.name, count, self._cooldown_room(pool.name)
        )
        pool_room = _room(pool.max_instances, self.live_by_pool.get(pool.name, 0))
        allowed = self._cap(allowed, "pool_max_instances", pool.name, count, pool_room)
        allowed = self._cap(allowed, "max_instances", pool.name, count, self.instances_left)
        gpu_room = (
            self.gpus_left
            if math.isinf(self.gpus_left)
            else self.gpus_left // pool.gpus_per_instance
        )
        allowed = self._cap(allowed, "max_gpus", pool.name, count, gpu_room)
        allowed = self._cap(allowed, "launch_rate", pool.name, count, self.launches_left)
        allowed = self._cap(allowed, "budget", pool.name, count, self._budget_room(pool_view))
        allowed = self._cap(allowed, "monthly_budget", pool.name, count, self._month_room())
        granted = int(allowed)
        self._debit(pool_view, granted)
        return granted

    def fleet_full(self) -> bool:
        """No launch anywhere can be admitted any more this tick (a fleet-wide limit is spent)."""
        return (
            self.launches_left <= 0
            or self.instances_left <= 0
            or self.gpus_left <= 0
            or self.budget_left <= 0
            or self.month_left <= 0
        )

    def note_skipped(self, launches: Sequence[LaunchRequest]) -> None:
        """Record launches never tried because a fleet-wide limit was already spent: one clamp
        each, rather than one per pool they would have walked."""
        rule = next(
            name
            for name, room in (
                ("launch_rate", self.launches_left),
                ("max_instances", self.instances_left),
                ("max_gpus", self.gpus_left),
                ("budget", self.budget_left),
                ("monthly_budget", self.month_left),
            )
            if room <= 0
        )
        for launch in launches:
            self.clamps.append(Clamp(rule, launch.pool, launch.count, 0, _why(rule, self)))

    def refund(self, pool_view: PoolView, count: int) -> None:
        """Give back room for instances that were admitted but not launched."""
        if count > 0:
            self._debit(pool_view, -count)

    def _debit(self, pool_view: PoolView, count: int) -> None:
        pool = pool_view.pool
        self.live_by_pool[pool.name] = self.live_by_pool.get(pool.name, 0) + count
        self.instances_left -= count
        self.gpus_left -= count * pool.gpus_per_instance
        self.launches_left -= count
        if pool_view.price is not None and self.budget_left != _INF:
            self.budget_left -= count * pool_view.price.price_per_hour
            self.cost_per_hour += count * pool_view.price.price_per_hour

    def _cooldown_room(self, pool: str) -> float:
        return 0 if pool in self._cooling else _INF

    def _budget_room(self, pool_view: PoolView) -> float:
        if self.limits.max_cost_per_hour is None:
            return _INF
        if self.unpriced:
            return 0
        if pool_view.price is None:
            return 0
        price = pool_view.price.price_per_hour
        if price <= 0:
            return _INF
        return math.floor(self.budget_left / price + 1e-9)

    def _month_room(self) -> float:
        return 0 if self.month_left <= 0 else _INF

    def _cap(self, allowed: float, rule: str, pool: str, requested: int, room: float) -> float:
        room = max(0.0, room)
        if room < allowed:
            self.clamps.append(Clamp(rule, pool, requested, int(room), _why(rule, self)))
            return room
        return allowed


def _why(rule: str, allowance: Allowance) -> str:
    if rule == "budget" and allowance.unpriced:
        return "no price known for pool(s) " + ", ".join(allowance.unpriced) + "; scale-up held"
    if rule == "monthly_budget" and allowance.month_spend is None:
        return "this month's spend is unknown (journal unreadable); scale-up held"
    if rule == "monthly_budget":
        return (
            f"limits.max_cost_per_month reached: ${allowance.month_spend:,.2f} spent of "
            f"${allowance.limits.max_cost_per_month:,.2f}"
        )
    return {
        "scale_up_cooldown": "pool scaled up recently",
        "pool_max_instances": "pool is at its max_instances",
        "max_instances": "fleet is at limits.max_instances",
        "max_gpus": "fleet is at limits.max_gpus",
        "launch_rate": "limits.max_launches_per_tick reached",
        "budget": "limits.max_cost_per_hour reached",
    }.get(rule, rule)


def _room(limit: int | None, used: int) -> float:
    return _INF if limit is None else max(0, limit - used)


@dataclass
class GuardedPlan:
    """A plan as the guard lets it through: the drains admitted, the launches reduced to pools
    that can host what they are for, and the allowance act spends launch by launch."""

    plan: Plan
    drains: tuple[DrainRequest, ...]
    allowance: Allowance
    launches: tuple[LaunchRequest, ...] = ()

    @property
    def clamps(self) -> list[Clamp]:
        return self.allowance.clamps


def launch_shape(launch: LaunchRequest, view: FleetView) -> NodeShape:
    """What each instance of a launch must host: its declared shape, else a whole instance of
    its first pool (a plugin that states no shape is taken at its word for that much)."""
    if launch.shape is not None:
        return launch.shape
    first = view.pool_by_name[launch.pool].pool
    return NodeShape.model_construct(
        gpus=first.gpus_per_instance, gpu_models=(), min_gpu_memory_gib=None
    )


def fitting_launches(
    launches: Sequence[LaunchRequest], view: FleetView, clamps: list[Clamp]
) -> tuple[LaunchRequest, ...]:
    """Every launch reduced to the pools, first choice and fallbacks, whose instances can host
    its shape: an instance that cannot run the job it was bought for is never bought. A launch
    left with no such pool is dropped; each removal is a ``shape`` clamp."""
    pools = view.pool_by_name
    kept: list[LaunchRequest] = []
    # A plan names the same few shapes against the same pools many times over: which pools can
    # host a shape is worked out once per shape.
    hosting: dict[NodeShape, set[str]] = {}
    for launch in launches:
        shape = launch_shape(launch, view)
        able = hosting.get(shape)
        if able is None:
            able = hosting[shape] = {n for n, p in pools.items() if p.pool.can_host(shape)}
        if launch.pool in able and able.issuperset(launch.fallbacks):
            kept.append(launch)
            continue
        names = [n for n in (launch.pool, *launch.fallbacks) if n in able]
        refused = [n for n in (launch.pool, *launch.fallbacks) if n not in able]
        for name in refused:
            clamps.append(
                Clamp(
                    "shape",
                    name,
                    launch.count,
                    0,
                    f"an instance of {name} cannot host {shape.describe()}",
                )
            )
        if not names:
            continue
        if names[0] == launch.pool and not refused:
            kept.append(launch)
            continue
        first = pools[launch.pool].pool
        slots = launch.count * _slots(first.gpus_per_instance, shape, launch.gang_size)
        head = pools[names[0]].pool
        count = _instances_for(slots, head.gpus_per_instance, shape, launch.gang_size)
        kept.append(
            launch.model_copy(
                update={"pool": names[0], "fallbacks": tuple(names[1:]), "count": count}
            )
        )
    return tuple(kept)


def node_slots(pool: Pool, shape: NodeShape) -> int:
    """Nodes of ``shape`` one instance of ``pool`` holds (at least one: the guard has checked
    that it fits)."""
    return max(1, pool.gpus_per_instance // shape.gpus)


def _slots(gpus_per_instance: int, shape: NodeShape, gang_size: int) -> int:
    """Nodes of ``shape`` one instance holds: one per instance for a gang's members."""
    return 1 if gang_size > 1 else max(1, gpus_per_instance // shape.gpus)


def _instances_for(slots: int, gpus_per_instance: int, shape: NodeShape, gang_size: int) -> int:
    """Instances of a pool that hold ``slots`` nodes of ``shape`` (whole gangs for a gang)."""
    if gang_size > 1:
        return slots
    return math.ceil(slots / max(1, gpus_per_instance // shape.gpus))


def guard(
    plan: Plan,
    view: FleetView,
    limits: Limits,
    memory: GuardMemory,
    month_spend: float | None = None,
) -> GuardedPlan:
    """Clamp a validated plan. Drains are settled here; launches are admitted one by one in act.
    ``month_spend`` is this calendar month's spend so far, for ``limits.max_cost_per_month``."""
    allowance = Allowance(limits, view, memory, month_spend)
    nodes = {node.instance_id: node for node in view.instances}
    admitted: list[DrainRequest] = []
    for drain in plan.drains:
        node = nodes[drain.instance_id]
        if node.state not in (
            InstanceState.PENDING,
            InstanceState.RUNNING,
            InstanceState.REQUESTED,
        ):
            continue
        if not view.demand.known:
            allowance.clamps.append(
                Clamp("demand_unknown", node.pool, 1, 0, "a queue source failed; scale-down held")
            )
            continue
        last_up = memory.last_scale_up.get(node.pool)
        if last_up is not None and view.now - last_up < limits.scale_down_cooldown_s:
            allowance.clamps.append(
                Clamp("scale_down_cooldown", node.pool, 1, 0, "pool scaled up recently")
            )
            continue
        if len(admitted) >= limits.max_drains_per_tick:
            allowance.clamps.append(
                Clamp("drain_rate", node.pool, 1, 0, "limits.max_drains_per_tick reached")
            )
            continue
        admitted.append(drain)
    launches = fitting_launches(plan.launches, view, allowance.clamps)
    return GuardedPlan(plan, tuple(admitted), allowance, launches)
