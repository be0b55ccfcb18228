"""What act would do with a guarded plan, worked out without doing any of it.

Plan mode must show what the live controller would buy, give back and collect this tick, so it
asks the guard's ``Allowance`` exactly as act does: launches in the plan's order, each walking
its pools while the allowance grants less than was asked, fleet-wide limits ending the walk.
The walk assumes every granted launch succeeds (a capacity failure cannot be known without
asking the cloud to launch), so the preview is the plan act starts from, with the fallbacks it
would turn to listed beside each launch. Costs are live instances times their pool's quoted
price: unknown, never zero, where a pool has no quote or its cloud could not be listed.
"""

from __future__ import annotations

import math
from collections.abc import Collection

from pydantic import BaseModel, ConfigDict

from autoscaler.model import LIVE_STATES, FleetView, LaunchRequest, PoolView
from autoscaler.model.records import Clamp
from autoscaler.tick.guard import GuardedPlan, launch_shape, node_slots


class Value(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class LaunchAttempt(Value):
    """One pool a launch turns to: how many instances it would ask for and the guard grant."""

    pool: str
    wanted: int
    granted: int


class LaunchPreview(Value):
    pool: str
    count: int
    reason: str
    fallbacks: tuple[str, ...]
    attempts: tuple[LaunchAttempt, ...]
    skipped: str | None = None

    @property
    def granted(self) -> int:
        return sum(a.granted for a in self.attempts)


class DrainPreview(Value):
    instance_id: str
    pool: str
    reason: str
    move_jobs: bool
    price_per_hour: float | None


class OrphanPreview(Value):
    """An instance tagged ours whose pool is no longer configured: act terminates it."""

    instance_id: str
    pool: str
    state: str


class ClampPreview(Value):
    rule: str
    pool: str | None
    requested: int
    allowed: int
    detail: str


class PoolCost(Value):
    """A pool now and after the plan; ``None`` counts and costs are unknown, not zero."""

    pool: str
    provider: str
    market: str
    price_per_hour: float | None
    instances_now: int | None
    launches: int
    drains: int
    instances_after: int | None
    cost_per_hour_now: float | None
    cost_per_hour_after: float | None


class Preview(Value):
    launches: tuple[LaunchPreview, ...]
    drains: tuple[DrainPreview, ...]
    orphans: tuple[OrphanPreview, ...]
    clamps: tuple[ClampPreview, ...]
    pools: tuple[PoolCost, ...]
    cost_per_hour_now: float
    cost_per_hour_after: float
    cost_complete: bool


def preview(view: FleetView, guarded: GuardedPlan, unlisted: Collection[str] = ()) -> Preview:
    """The actions act would take for ``guarded`` on ``view``, in act's order and with its
    limits. ``unlisted`` names providers whose listing failed: their pools' supply is unknown.
    The allowance inside ``guarded`` is spent by this call, as act would spend it."""
    pools = view.pool_by_name
    launches = _launches(view, guarded)
    pool_of = {n.instance_id: n.pool for n in view.instances}
    drains = tuple(
        DrainPreview(
            instance_id=d.instance_id,
            pool=pool_of[d.instance_id],
            reason=d.reason,
            move_jobs=d.move_jobs,
            price_per_hour=_price(pools.get(pool_of[d.instance_id])),
        )
        for d in guarded.drains
    )
    drained = {d.instance_id for d in drains}
    orphans = tuple(
        OrphanPreview(instance_id=n.instance_id, pool=n.pool, state=str(n.state))
        for n in view.instances
        if n.state in LIVE_STATES and n.pool not in pools and n.instance_id not in drained
    )
    costs = _pool_costs(view, launches, drains, set(unlisted))
    complete = all(c.cost_per_hour_now is not None for c in costs) and all(
        c.cost_per_hour_after is not None for c in costs
    )
    return Preview(
        launches=launches,
        drains=drains,
        orphans=orphans,
        clamps=tuple(_clamp(c) for c in guarded.clamps),
        pools=costs,
        cost_per_hour_now=round(sum(c.cost_per_hour_now or 0.0 for c in costs), 6),
        cost_per_hour_after=round(sum(c.cost_per_hour_after or 0.0 for c in costs), 6),
        cost_complete=complete,
    )


def _launches(view: FleetView, guarded: GuardedPlan) -> tuple[LaunchPreview, ...]:
    """Act's launch loop (``Actuator.act`` and ``_launch``) with every granted launch taken as
    fulfilled, and the capacity cache empty, as it is in a controller that has just started."""
    allowance = guarded.allowance
    planned = guarded.launches
    found: list[LaunchPreview] = []
    for index, launch in enumerate(planned):
        if allowance.fleet_full():
            before = len(allowance.clamps)
            allowance.note_skipped(planned[index:])
            rule = allowance.clamps[before].detail if len(allowance.clamps) > before else ""
            found.extend(_skipped(rest, rule) for rest in planned[index:])
            break
        shape = launch_shape(launch, view)
        first = view.pool_by_name[launch.pool].pool
        attempts: list[LaunchAttempt] = []
        if launch.gang_size > 1:
            # Every gang comes up whole in the first pool that admits it whole.
            for _ in range(launch.count // launch.gang_size):
                for name in (launch.pool, *launch.fallbacks):
                    pool_view = view.pool_by_name[name]
                    granted = allowance.admit_launch(pool_view, launch.gang_size)
                    if granted < launch.gang_size:
                        allowance.refund(pool_view, granted)
                        granted = 0
                    attempts.append(
                        LaunchAttempt(pool=name, wanted=launch.gang_size, granted=granted)
                    )
                    if granted:
                        break
        slots_wanted = 0 if launch.gang_size > 1 else launch.count * node_slots(first, shape)
        for name in (launch.pool, *launch.fallbacks):
            if slots_wanted <= 0:
                break
            pool_view = view.pool_by_name[name]
            per = node_slots(pool_view.pool, shape)
            want = math.ceil(slots_wanted / per)
            granted = allowance.admit_launch(pool_view, want)
            attempts.append(LaunchAttempt(pool=name, wanted=want, granted=granted))
            slots_wanted -= granted * per
        found.append(
            LaunchPreview(
                pool=launch.pool,
                count=launch.count,
                reason=launch.reason,
                fallbacks=launch.fallbacks,
                attempts=tuple(attempts),
            )
        )
    return tuple(found)


def _skipped(launch: LaunchRequest, why: str) -> LaunchPreview:
    return LaunchPreview(
        pool=launch.pool,
        count=launch.count,
        reason=launch.reason,
        fallbacks=launch.fallbacks,
        attempts=(),
        skipped=why,
    )


def _pool_costs(
    view: FleetView,
    launches: tuple[LaunchPreview, ...],
    drains: tuple[DrainPreview, ...],
    unlisted: set[str],
) -> tuple[PoolCost, ...]:
    live: dict[str, int] = {}
    for node in view.instances:
        if node.state in LIVE_STATES:
            live[node.pool] = live.get(node.pool, 0) + 1
    bought: dict[str, int] = {}
    for launch in launches:
        for attempt in launch.attempts:
            bought[attempt.pool] = bought.get(attempt.pool, 0) + attempt.granted
    given_back: dict[str, int] = {}
    for drain in drains:
        given_back[drain.pool] = given_back.get(drain.pool, 0) + 1
    costs = []
    for pool_view in view.pools:
        pool = pool_view.pool
        price = _price(pool_view)
        now = None if pool.provider in unlisted else live.get(pool.name, 0)
        after = (
            None if now is None else now + bought.get(pool.name, 0) - given_back.get(pool.name, 0)
        )
        costs.append(
            PoolCost(
                pool=pool.name,
                provider=pool.provider,
                market=str(pool.market),
                price_per_hour=price,
                instances_now=now,
                launches=bought.get(pool.name, 0),
                drains=given_back.get(pool.name, 0),
                instances_after=after,
                cost_per_hour_now=_times(now, price),
                cost_per_hour_after=_times(after, price),
            )
        )
    return tuple(costs)


def _times(count: int | None, price: float | None) -> float | None:
    if count is None:
        return None
    if count == 0:
        return 0.0
    return None if price is None else round(count * price, 6)


def _price(pool_view: PoolView | None) -> float | None:
    if pool_view is None or pool_view.price is None:
        return None
    return pool_view.price.price_per_hour


def _clamp(clamp: Clamp) -> ClampPreview:
    return ClampPreview(
        rule=clamp.rule,
        pool=clamp.pool,
        requested=clamp.requested,
        allowed=clamp.allowed,
        detail=clamp.detail,
    )
