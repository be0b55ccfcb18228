"""Sharing the fleet-wide limits between teams by weight, when they cannot grant every team.

Without teams the guard grants launches in the plan's order until a fleet-wide limit
(``max_instances``, ``max_launches_per_tick``, ``max_gpus``, ``max_cost_per_hour``,
``max_cost_per_month``) is spent. With several teams asking, plan order would let whichever team
the policy happened to list first take the room. So the guard first asks what each team would
get with the fleet-wide limits lifted (its own burst limits and budget, the pools' limits and
the cool-downs still held), and when those asks add up to more than a fleet-wide limit leaves,
it splits the room by weighted water-filling: each team gets min(its ask, level x its weight),
the level as high as the limit allows, so no team gets more than it asked and what one does
not ask goes to the others by weight. Instances are whole (a multi-node job's gang whole): each
team takes whole instances, in its own plan order, within its share, and what that leaves goes
to the team furthest below its share (largest remainder), then to any that can still use it;
so with one binding limit every team is within one instance of its share. With several binding
limits each is filled on its own and a team takes instances within all of its shares. Each
team's share is then a cap the guard's walk in plan order holds it to.

Work of no team is one more party to the split, with the ``unassigned`` terms' weight.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

from autoscaler.model import PoolView
from autoscaler.model.teams import TeamsConfig

T = TypeVar("T")

INSTANCES = "instances"
GPUS = "gpus"
USD = "usd_per_hour"
RESOURCES = (INSTANCES, GPUS, USD)


@dataclass(frozen=True)
class Unit:
    """Instances a team's launch would get with the fleet-wide limits lifted, taken whole: one
    instance, or a multi-node job's whole gang."""

    team: str | None
    instances: int
    gpus: int
    usd_per_hour: float

    @staticmethod
    def of(team: str | None, pool_view: PoolView, count: int) -> Unit:
        price = pool_view.price.price_per_hour if pool_view.price is not None else 0.0
        return Unit(team, count, count * pool_view.pool.gpus_per_instance, count * price)

    def amount(self, resource: str) -> float:
        if resource == INSTANCES:
            return self.instances
        if resource == GPUS:
            return self.gpus
        return self.usd_per_hour


Share = dict[str, float]


def split(
    units: Sequence[Unit], room: Mapping[str, float], config: TeamsConfig
) -> dict[str | None, Share] | None:
    """Each party's share of the binding fleet-wide limits (resource -> amount), or None when
    the room covers every ask (nothing binds: plan order loses no one anything)."""
    asked: dict[str | None, Share] = {}
    for unit in units:
        share = asked.setdefault(unit.team, dict.fromkeys(RESOURCES, 0.0))
        for resource in RESOURCES:
            share[resource] += unit.amount(resource)
    binding = [
        r
        for r in RESOURCES
        if math.isfinite(room[r]) and sum(a[r] for a in asked.values()) > room[r] + 1e-9
    ]
    if not binding or len(asked) < 2:
        return None
    weight = {team: config.spec(team).weight for team in asked}
    fair = {r: water_fill({t: a[r] for t, a in asked.items()}, weight, room[r]) for r in binding}
    queues: dict[str | None, list[Unit]] = {team: [] for team in asked}
    for unit in units:
        queues[unit.team].append(unit)
    left = {r: room[r] for r in binding}
    got: dict[str | None, Share] = {team: dict.fromkeys(RESOURCES, 0.0) for team in asked}
    cursor = dict.fromkeys(asked, 0)

    def take(team: str | None, unit: Unit) -> None:
        cursor[team] += 1
        for r in binding:
            left[r] -= unit.amount(r)
        for r in RESOURCES:
            got[team][r] += unit.amount(r)

    # Each party's whole units within its fair share of every binding limit, in its own order.
    for team, queue in queues.items():
        while cursor[team] < len(queue):
            unit = queue[cursor[team]]
            if any(got[team][r] + unit.amount(r) > fair[r][team] + 1e-9 for r in binding):
                break
            take(team, unit)
    # What whole units leave goes to the party furthest below its share (largest remainder),
    # then on to any that can still use it; a unit the room cannot hold is passed over.
    order = {team: k for k, team in enumerate(asked)}

    def behind(team: str | None) -> tuple[float, int]:
        gap = max((fair[r][team] - got[team][r]) / room[r] if room[r] > 0 else 0.0 for r in binding)
        return (-gap, order[team])

    # The least any unit takes of each binding limit: once the room left is below it for any
    # limit, no unit can be granted any more.
    least = {r: min((u.amount(r) for u in units if u.amount(r) > 0), default=0.0) for r in binding}
    while not any(least[r] > 0 and left[r] < least[r] - 1e-9 for r in binding):
        waiting = [t for t in asked if cursor[t] < len(queues[t])]
        if not waiting:
            break
        team = min(waiting, key=behind)
        unit = queues[team][cursor[team]]
        if all(unit.amount(r) <= left[r] + 1e-9 for r in binding):
            take(team, unit)
        else:
            cursor[team] += 1
    return {team: {r: got[team][r] for r in binding} for team in asked}


def water_fill(asked: Mapping[T, float], weight: Mapping[T, float], room: float) -> dict[T, float]:
    """Weighted water-filling: each party gets min(its ask, level x its weight), the level as
    high as ``room`` allows; what one does not ask goes to the others by weight."""
    fair = dict.fromkeys(asked, 0.0)
    open_ = {t for t, a in asked.items() if a > 0}
    left = max(0.0, room)
    while open_ and left > 1e-12:
        total = sum(weight[t] for t in open_)
        level = left / total
        full = {t for t in open_ if asked[t] - fair[t] <= level * weight[t] + 1e-12}
        if not full:
            for t in open_:
                fair[t] += level * weight[t]
            break
        for t in full:
            left -= asked[t] - fair[t]
            fair[t] = asked[t]
        open_ -= full
    return fair
