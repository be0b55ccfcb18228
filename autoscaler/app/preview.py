"""What a tick would do, as plan mode prints it: read from the guard's intents of the real tick.

Plan mode runs the controller's real tick with an executor that records instead of calling the
cloud, so what it shows is what the live controller would buy, give back and collect: the
grants the guard made along each launch's chain when every first choice is fulfilled (a
capacity failure cannot be known without asking the cloud to launch), with the fallbacks act
would turn to listed beside each launch. Costs are live instances times their pool's quoted
price: unknown, never zero, where a pool has no quote or its cloud could not be listed.
"""

from __future__ import annotations

from collections.abc import Collection

from pydantic import BaseModel, ConfigDict

from autoscaler.model import LIVE_STATES, FleetView, LaunchRequest, PoolView
from autoscaler.model.records import Clamp
from autoscaler.tick.intents import Intents, LaunchIntent, LaunchStep
from autoscaler.tick.rules import orphans


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


def preview(view: FleetView, intents: Intents, unlisted: Collection[str] = ()) -> Preview:
    """The tick's intents on ``view``. ``unlisted`` names providers whose listing failed: their
    pools' supply is unknown."""
    pools = view.pool_by_name
    launches = tuple(_launch(intent) for intent in intents.launches)
    pool_of = {n.instance_id: n.pool for n in view.instances}
    drains = tuple(
        DrainPreview(
            instance_id=d.instance_id,
            pool=pool_of[d.instance_id],
            reason=d.reason,
            move_jobs=d.move_jobs,
            price_per_hour=_price(pools.get(pool_of[d.instance_id])),
        )
        for d in intents.drains
    )
    states = {n.instance_id: n.state for n in view.instances}
    collected = tuple(
        OrphanPreview(instance_id=t.instance_id, pool=t.pool, state=str(states[t.instance_id]))
        for t in intents.terminations
        if t.reason == orphans.REASON and t.instance_id in states
    )
    costs = _pool_costs(view, launches, drains, set(unlisted))
    complete = all(c.cost_per_hour_now is not None for c in costs) and all(
        c.cost_per_hour_after is not None for c in costs
    )
    return Preview(
        launches=launches,
        drains=drains,
        orphans=collected,
        clamps=tuple(_clamp(c) for c in intents.clamps),
        pools=costs,
        cost_per_hour_now=round(sum(c.cost_per_hour_now or 0.0 for c in costs), 6),
        cost_per_hour_after=round(sum(c.cost_per_hour_after or 0.0 for c in costs), 6),
        cost_complete=complete,
    )


def _launch(intent: LaunchIntent) -> LaunchPreview:
    """The pools a launch asks, in order, with what each is granted when every first choice is
    fulfilled: the walk stops where the nodes are bought (a gang at the first pool that takes it
    whole)."""
    launch = intent.request
    if intent.skipped is not None:
        return _skipped(launch, intent.skipped)
    steps: list[LaunchStep] = []
    for gang in intent.gangs:
        for step in gang:
            steps.append(step)
            if step.granted:
                break
    steps.extend(s for s in intent.steps if s.wanted > 0)
    return LaunchPreview(
        pool=launch.pool,
        count=launch.count,
        reason=launch.reason,
        fallbacks=launch.fallbacks,
        attempts=tuple(
            LaunchAttempt(pool=s.pool, wanted=s.wanted, granted=s.granted) for s in steps
        ),
    )


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
