"""The guard: hard limits no policy can lift, and the wall that contains a misbehaving policy.

It is the only code that knows a limit. A plan that names pools or instances the view does not
hold is rejected whole (the tick then holds the fleet as it is). The plan and the controller's own
rule requests are then turned into granted ``Intents``:

* drains (the plan's and the rebalance rule's) pass the drain rate and the hold on scale-down
  while demand is unknown; the plan's also the scale-down cool-down (a rebalance drain answers a
  risk, not a surplus, so a recent scale-up does not hold it);
* moves of running jobs off on-prem nodes (the on-prem rebalance rule) pass the job-move rate
  and the hold while demand is unknown (a move answers demand, so it waits to know it);
* every launch is granted pool by pool along its fallback chain before anything is bought: the
  walk act takes when every call succeeds (in the plan's order, fleet-wide limits ending it).
  What the limits leave stays with the guard's ``Allowance``, handed to act as
  ``Intents.fallbacks``: a capacity or quota failure gives its unbought room back there and only
  moves those nodes to the next pool of the same chain, admitted there by the same limits. So
  per-pool and total instance/GPU limits, the $/hour budget, the monthly budget and the launch
  rate hold whatever act ends up buying, and act never decides how much it may buy.
* a launch bought for a team is held to that team's burst GPUs, burst $/hour and monthly budget
  (``team_limits``), act's fallbacks too; and when several teams ask and the fleet-wide limits
  cannot grant them all, those limits are split between the teams by weight (``team_share``)
  rather than taken in plan order. Without teams nothing of this applies.

The monthly cap is a projected ceiling (``autoscaler.tick.budget``): the journal's spend this
calendar month plus the kept fleet's run rate to the month's end; over it, the guard sheds
capacity in the documented order. While the spend is unknown (the journal cannot be read)
scale-up is held, never assumed affordable.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Mapping, Sequence

from autoscaler.fleet.memory import Cooldowns
from autoscaler.model import (
    LIVE_STATES,
    CloudNode,
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
from autoscaler.tick.budget import Projection, hours_to_month_end, run_rate, shed
from autoscaler.tick.intents import (
    ContinueDrain,
    FallbackRoom,
    Intents,
    LaunchIntent,
    LaunchStep,
    MoveJobs,
    Requests,
)
from autoscaler.tick.rules import registration
from autoscaler.tick.team_limits import Room, TeamLedger, TeamRoom
from autoscaler.tick.team_share import GPUS, INSTANCES, USD, Share, Unit, split

_INF = math.inf


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
    """The room a tick has left under every limit, spent as the guard grants launches."""

    def __init__(
        self,
        limits: Limits,
        view: FleetView,
        cooldowns: Cooldowns,
        month_spend: float | None = None,
        teams: TeamLedger | None = None,
    ) -> None:
        self.limits = limits
        self.month_spend = month_spend
        self.now = view.now
        self.clamps: list[Clamp] = []
        # Each team's own limits (``team_limits``), and while fleet-wide limits bind, each
        # team's share of them by weight (``team_share``); None without teams.
        self.teams = TeamRoom(teams, view) if teams is not None else None
        self.shares: dict[str | None, Share] | None = None
        self._fleet_limits = True
        self._pools = view.pool_by_name
        self._cooling = {
            pool
            for pool, last in cooldowns.last_scale_up.items()
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
        self.projection: Projection | None = None
        if limits.max_cost_per_month is not None:
            if month_spend is None:
                self.month_left = 0.0
            else:
                self.projection = Projection(
                    month_spend,
                    run_rate(view),
                    hours_to_month_end(view.now),
                    limits.max_cost_per_month,
                )
                self.month_left = max(0.0, self.projection.room)

    def admit_launch(self, pool_view: PoolView, count: int, team: str | None = None) -> int:
        """How many of ``count`` instances may be launched in this pool for ``team``; debits
        what it grants."""
        pool = pool_view.pool
        allowed: float = count
        allowed = self._cap(
            allowed, "scale_up_cooldown", pool.name, count, self._cooldown_room(pool.name)
        )
        pool_room = _room(pool.max_instances, self.live_by_pool.get(pool.name, 0))
        allowed = self._cap(allowed, "pool_max_instances", pool.name, count, pool_room)
        if self.teams is not None and team is not None:
            for rule, room, why in self.teams.rooms(team, pool_view):
                allowed = self._cap(allowed, rule, pool.name, count, room, why)
        if not self._fleet_limits:
            granted = int(allowed)
            self._debit(pool_view, granted, team)
            return granted
        allowed = self._cap(allowed, "max_instances", pool.name, count, self.instances_left)
        gpu_room = (
            self.gpus_left
            if math.isinf(self.gpus_left)
            else self.gpus_left // pool.gpus_per_instance
        )
        allowed = self._cap(allowed, "max_gpus", pool.name, count, gpu_room)
        allowed = self._cap(allowed, "launch_rate", pool.name, count, self.launches_left)
        allowed = self._cap(allowed, "budget", pool.name, count, self._budget_room(pool_view))
        allowed = self._cap(
            allowed, "monthly_budget", pool.name, count, self._month_room(pool_view)
        )
        if self.shares is not None and team in self.shares:
            for rule, room, why in self._share_rooms(team, pool_view):
                allowed = self._cap(allowed, rule, pool.name, count, room, why)
        granted = int(allowed)
        self._debit(pool_view, granted, team)
        return granted

    def without_fleet_limits(self) -> Allowance:
        """A copy that holds every limit but the fleet-wide ones, granting into room of its
        own: what each team would get if the fleet-wide limits did not bind."""
        twin = copy.copy(self)
        twin.clamps = []
        twin.live_by_pool = dict(self.live_by_pool)
        twin.teams = self.teams.copy() if self.teams is not None else None
        twin.shares = None
        twin._fleet_limits = False
        twin.instances_left = twin.gpus_left = twin.launches_left = _INF
        twin.budget_left = twin.month_left = _INF
        return twin

    def fleet_room(self) -> dict[str, float]:
        """What the fleet-wide limits leave, in instances, GPUs and $/hour (the monthly cap's
        room spread over the hours to the month's end)."""
        usd = self.budget_left if self.limits.max_cost_per_hour is not None else _INF
        if self.limits.max_cost_per_month is not None:
            hours = self.projection.hours_left if self.projection is not None else 0.0
            usd = min(usd, self.month_left / hours if hours > 0 else 0.0)
        return {
            INSTANCES: min(self.instances_left, self.launches_left),
            GPUS: self.gpus_left,
            USD: max(0.0, usd),
        }

    def _share_rooms(self, team: str | None, pool_view: PoolView) -> list[Room]:
        """Instances of this pool the team's share of each binding fleet-wide limit holds."""
        assert self.shares is not None
        share = self.shares[team]
        pool = pool_view.pool
        who = f"team {team}" if team is not None else "work of no team"
        found: list[Room] = []
        if INSTANCES in share:
            found.append(
                (
                    "max_instances",
                    math.floor(share[INSTANCES] + 1e-9),
                    lambda: f"{who}'s share by weight of the fleet's instance limits",
                )
            )
        if GPUS in share:
            found.append(
                (
                    "max_gpus",
                    math.floor(share[GPUS] / pool.gpus_per_instance + 1e-9),
                    lambda: f"{who}'s share by weight of limits.max_gpus",
                )
            )
        if USD in share:
            price = pool_view.price.price_per_hour if pool_view.price is not None else None
            room: float = 0
            if price is not None:
                room = _INF if price <= 0 else math.floor(share[USD] / price + 1e-9)
            found.append(("budget", room, lambda: f"{who}'s share by weight of the fleet's budget"))
        return found

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

    def refund(self, pool_view: PoolView, count: int, team: str | None = None) -> None:
        """Give back room for instances that were admitted but were not (or will not be)
        launched: a failed first choice's room, for the next pool of its chain."""
        if count > 0:
            self._debit(pool_view, -count, team)

    def _debit(self, pool_view: PoolView, count: int, team: str | None = None) -> None:
        pool = pool_view.pool
        if self.teams is not None and team is not None:
            self.teams.debit(team, pool_view, count)
        if self.shares is not None and team in self.shares:
            share = self.shares[team]
            if INSTANCES in share:
                share[INSTANCES] -= count
            if GPUS in share:
                share[GPUS] -= count * pool.gpus_per_instance
            if USD in share and pool_view.price is not None:
                share[USD] -= count * pool_view.price.price_per_hour
        self.live_by_pool[pool.name] = self.live_by_pool.get(pool.name, 0) + count
        self.instances_left -= count
        self.gpus_left -= count * pool.gpus_per_instance
        self.launches_left -= count
        if pool_view.price is not None and self.budget_left != _INF:
            self.budget_left -= count * pool_view.price.price_per_hour
            self.cost_per_hour += count * pool_view.price.price_per_hour
        if pool_view.price is not None and self.projection is not None:
            self.month_left -= count * pool_view.price.price_per_hour * self.projection.hours_left

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

    def _month_room(self, pool_view: PoolView) -> float:
        if self.month_left <= 0:
            return 0
        if self.projection is None:
            return _INF
        price = pool_view.price.price_per_hour if pool_view.price is not None else None
        if price is None:
            return 0
        cost = price * self.projection.hours_left
        return _INF if cost <= 0 else math.floor(self.month_left / cost + 1e-9)

    def _cap(
        self,
        allowed: float,
        rule: str,
        pool: str,
        requested: int,
        room: float,
        why: Callable[[], str] | None = None,
    ) -> float:
        room = max(0.0, room)
        if room < allowed:
            detail = why() if why is not None else _why(rule, self)
            self.clamps.append(Clamp(rule, pool, requested, int(room), detail))
            return room
        return allowed


class _TeamFallbacks:
    """The guard's room as act's fallbacks for one team's launch: a capacity failure that
    moves its nodes down the chain moves them within that team's limits and share too."""

    def __init__(self, room: Allowance, team: str) -> None:
        self.room = room
        self.team = team

    def admit_launch(self, pool_view: PoolView, count: int) -> int:
        return self.room.admit_launch(pool_view, count, self.team)

    def refund(self, pool_view: PoolView, count: int) -> None:
        self.room.refund(pool_view, count, self.team)


def fallbacks_for(room: FallbackRoom, team: str | None) -> FallbackRoom:
    """The room act spends on a launch's fallbacks: bound to the launch's team, where it has
    one."""
    if team is None or not isinstance(room, Allowance):
        return room
    return _TeamFallbacks(room, team)


def _why(rule: str, allowance: Allowance) -> str:
    if rule == "budget" and allowance.unpriced:
        return "no price known for pool(s) " + ", ".join(allowance.unpriced) + "; scale-up held"
    if rule == "monthly_budget" and allowance.month_spend is None:
        return "this month's spend is unknown (journal unreadable); scale-up held"
    if rule == "monthly_budget" and allowance.projection is not None:
        return f"limits.max_cost_per_month reached: {allowance.projection.describe()}"
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
    requests: Requests,
    view: FleetView,
    limits: Limits,
    cooldowns: Cooldowns,
    month_spend: float | None = None,
    drain_timeout_s: float = 3600.0,
    teams: TeamLedger | None = None,
) -> Intents:
    """Grant a validated plan and the rules' requests. ``month_spend`` is this calendar month's
    spend so far, for ``limits.max_cost_per_month``; ``teams`` what the teams' own limits need
    (None: no team limits, as without teams in the config)."""
    allowance = Allowance(limits, view, cooldowns, month_spend, teams)
    clamps = allowance.clamps
    nodes = {node.instance_id: node for node in view.instances}
    interrupted = {i.instance_id for i in requests.interrupts}
    drained = 0
    at_risk: list[str] = []
    for drain in requests.drains:
        node = nodes.get(drain.instance_id)
        if node is None or drain.instance_id in interrupted:
            continue
        held = _drain_held(node.pool, view, limits, drained, demand=True)
        if held is not None:
            clamps.append(held)
            continue
        drained += 1
        at_risk.append(drain.instance_id)
    terminations = []
    for end in requests.terminations:
        if end.rule == registration.RULE:
            held = _drain_held(end.pool, view, limits, drained)
            if held is not None:
                clamps.append(held)
                continue
            drained += 1
        terminations.append(end)
    admitted: list[DrainRequest] = []
    for drain in plan.drains:
        node = nodes[drain.instance_id]
        if (
            node.state
            not in (
                InstanceState.PENDING,
                InstanceState.RUNNING,
                InstanceState.REQUESTED,
            )
            or drain.instance_id in interrupted
            or drain.instance_id in at_risk
        ):
            continue
        held = _drain_held(node.pool, view, limits, drained, demand=True, cooldowns=cooldowns)
        if held is not None:
            clamps.append(held)
            continue
        drained += 1
        admitted.append(drain)
    ended = {t.instance_id for t in terminations}
    if allowance.projection is not None and allowance.projection.room < 0:
        leaving = {d.instance_id for d in admitted} | set(at_risk) | interrupted | ended
        admitted.extend(shed(view, allowance.projection, leaving))
        allowance.month_left = 0.0  # no launch in a tick that sheds for the budget
    replacements = [r.launch for r in requests.replacements if r.instance_id in ended]
    launches = fitting_launches((*replacements, *plan.launches), view, clamps)
    return Intents(
        plan=plan,
        notices=tuple(requests.notices),
        drains=tuple(admitted),
        at_risk=tuple(at_risk),
        continuing=_continuing(view, nodes, requests, admitted, at_risk, drain_timeout_s <= 0),
        terminations=tuple(terminations),
        launches=grant_launches(launches, view, allowance),
        moves=_moves(requests.moves, view, limits, clamps),
        clamps=clamps,
        fallbacks=allowance,
    )


def _moves(
    requested: Sequence[MoveJobs], view: FleetView, limits: Limits, clamps: list[Clamp]
) -> tuple[MoveJobs, ...]:
    """The rule's moves, in its order, as far as the job-move rate admits whole moves. The moves
    freeing a multi-node job's nodes (a shared ``for_job`` with ``together``) are granted all or
    none: a part of a gang's room starts nothing and would only be taken back."""
    if requested and not view.demand.known:
        clamps.append(
            Clamp("demand_unknown", None, len(requested), 0, "a queue source failed; moves held")
        )
        return ()
    gangs: dict[str, list[MoveJobs]] = {}
    for move in requested:
        if move.together:
            gangs.setdefault(move.for_job, []).append(move)
    decided: dict[str, bool] = {}
    granted: list[MoveJobs] = []
    jobs = 0
    for move in requested:
        gang = gangs.get(move.for_job) if move.together else None
        if gang is not None and move.for_job in decided:
            if decided[move.for_job]:
                granted.append(move)
            continue
        count = sum(len(m.jobs) for m in gang) if gang is not None else len(move.jobs)
        fits = jobs + count <= limits.max_job_moves_per_tick
        if gang is not None:
            decided[move.for_job] = fits
        if not fits:
            clamps.append(_move_rate_clamp(move, count, gang))
            continue
        jobs += count
        granted.append(move)
    return tuple(granted)


def _move_rate_clamp(move: MoveJobs, jobs: int, gang: Sequence[MoveJobs] | None) -> Clamp:
    """The clamp for a move (or a multi-node job's moves, together) the job-move rate refuses."""
    detail = "limits.max_job_moves_per_tick reached"
    if gang is not None:
        detail += (
            f": job {move.for_job}'s {len(gang)} nodes are freed together or not at all "
            f"({jobs} jobs to move)"
        )
    return Clamp("job_move_rate", None, jobs, 0, detail)


def _drain_held(
    pool: str,
    view: FleetView,
    limits: Limits,
    drained: int,
    *,
    demand: bool = False,
    cooldowns: Cooldowns | None = None,
) -> Clamp | None:
    """Why a drain in ``pool`` is held this tick, if it is: unknown demand (for drains that give
    capacity back), the pool's scale-down cool-down (for the plan's), the drain rate (for all)."""
    if demand and not view.demand.known:
        return Clamp("demand_unknown", pool, 1, 0, "a queue source failed; scale-down held")
    last_up = cooldowns.last_scale_up.get(pool) if cooldowns is not None else None
    if last_up is not None and view.now - last_up < limits.scale_down_cooldown_s:
        return Clamp("scale_down_cooldown", pool, 1, 0, "pool scaled up recently")
    if drained >= limits.max_drains_per_tick:
        return Clamp("drain_rate", pool, 1, 0, "limits.max_drains_per_tick reached")
    return None


def _continuing(
    view: FleetView,
    nodes: Mapping[str, CloudNode],
    requests: Requests,
    admitted: Sequence[DrainRequest],
    at_risk: Sequence[str],
    timed_out: bool,
) -> tuple[ContinueDrain, ...]:
    """Every drain act carries on this tick, the ones just granted included, in fleet order."""
    found = {c.instance_id: c for c in requests.continuing}
    for instance_id, move_jobs in (
        *((d.instance_id, d.move_jobs) for d in admitted),
        *((i, False) for i in at_risk),
    ):
        pool = nodes[instance_id].pool
        pool_view = view.pool_by_name.get(pool)
        provider = pool_view.pool.provider if pool_view is not None else ""
        found[instance_id] = ContinueDrain(instance_id, provider, pool, timed_out, move_jobs)
    if len(found) < 2:
        return tuple(found.values())
    order = {n.instance_id: i for i, n in enumerate(view.instances) if n.instance_id in found}
    return tuple(sorted(found.values(), key=lambda c: order.get(c.instance_id, len(order))))


def grant_launches(
    launches: Sequence[LaunchRequest], view: FleetView, allowance: Allowance
) -> tuple[LaunchIntent, ...]:
    """Each launch's grants, pool by pool: the walk act takes when every call succeeds (launches
    in order, each walking its pools while the limits grant less than it wants). Where several
    teams ask and the fleet-wide limits cannot grant them all, each team is first given its
    share of those limits by weight (``team_share``), which then caps it in the walk."""
    if allowance.teams is not None and len({launch.team for launch in launches}) > 1:
        asks = _walk(launches, view, allowance.without_fleet_limits())
        allowance.shares = split(_units(asks, view), allowance.fleet_room(), allowance.teams.config)
    return _walk(launches, view, allowance)


def _units(intents: Sequence[LaunchIntent], view: FleetView) -> list[Unit]:
    """What the intents grant, as the instances a weighted split hands out one at a time (a
    gang whole), in the plan's order."""
    units: list[Unit] = []
    for intent in intents:
        team = intent.request.team
        for step in intent.steps:
            pool_view = view.pool_by_name[step.pool]
            units.extend(Unit.of(team, pool_view, 1) for _ in range(step.granted))
        for gang in intent.gangs:
            for step in gang:
                if step.granted:
                    units.append(Unit.of(team, view.pool_by_name[step.pool], step.granted))
    return units


def _walk(
    launches: Sequence[LaunchRequest], view: FleetView, allowance: Allowance
) -> tuple[LaunchIntent, ...]:
    intents: list[LaunchIntent] = []
    usable = {
        name
        for name, p in view.pool_by_name.items()
        if p.unavailable_until is None or p.unavailable_until <= view.now
    }
    for index, launch in enumerate(launches):
        if allowance.fleet_full():
            before = len(allowance.clamps)
            allowance.note_skipped(launches[index:])
            rule = allowance.clamps[before].detail if len(allowance.clamps) > before else ""
            intents.extend(
                LaunchIntent(rest, index + k, skipped=rule)
                for k, rest in enumerate(launches[index:])
            )
            break
        chain = [(k, n) for k, n in enumerate((launch.pool, *launch.fallbacks)) if n in usable]
        if launch.gang_size > 1:
            gangs = tuple(
                _gang_primary(launch, chain, view, allowance)
                for _ in range(launch.count // launch.gang_size)
            )
            intents.append(LaunchIntent(launch, index, gangs=gangs))
        else:
            intents.append(
                LaunchIntent(launch, index, steps=_primary(launch, chain, view, allowance))
            )
    return tuple(intents)


def _primary(
    launch: LaunchRequest,
    chain: Sequence[tuple[int, str]],
    view: FleetView,
    allowance: Allowance,
) -> tuple[LaunchStep, ...]:
    """What is wanted is counted in nodes of the launch's shape, so a fallback of another size
    is asked for as many instances as hold the same nodes."""
    shape = launch_shape(launch, view)
    first = view.pool_by_name[launch.pool].pool
    slots_wanted = launch.count * node_slots(first, shape)
    steps = []
    for position, name in chain:
        pool_view = view.pool_by_name[name]
        if slots_wanted <= 0:
            steps.append(LaunchStep(name, 0, 0, position=position))
            continue
        per = node_slots(pool_view.pool, shape)
        want = math.ceil(slots_wanted / per)
        granted = allowance.admit_launch(pool_view, want, launch.team)
        steps.append(LaunchStep(name, want, granted, position=position))
        slots_wanted -= granted * per
    return tuple(steps)


def _gang_primary(
    launch: LaunchRequest,
    chain: Sequence[tuple[int, str]],
    view: FleetView,
    allowance: Allowance,
) -> tuple[LaunchStep, ...]:
    """One multi-node job: its nodes come up whole in the first pool that admits them whole."""
    size = launch.gang_size
    steps = []
    placed = False
    for position, name in chain:
        pool_view = view.pool_by_name[name]
        granted = 0
        if not placed:
            granted = allowance.admit_launch(pool_view, size, launch.team)
            if granted < size:
                allowance.refund(pool_view, granted, launch.team)
                granted = 0
            placed = granted > 0
        steps.append(LaunchStep(name, size, granted, position=position))
    return tuple(steps)
