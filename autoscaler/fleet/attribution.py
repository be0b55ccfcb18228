"""Who pays for what: each pool's bill split between the teams whose jobs held its GPUs, by
GPU-seconds, with what no job held as its own line (``IDLE``).

Money is split in whole cents by the largest-remainder method (Hamilton's apportionment), so the
teams' lines and the idle line add up to each pool's bill, and the pools' to the fleet's, to
the cent: a report whose rows do not sum to its total is one nobody trusts. GPU-seconds a
team's jobs held are measured; a pool's paid GPU-seconds are its instances' GPUs times their
billed time, so ``paid - held`` is what sat idle (never below zero: rounding of a replay's
event times can make ``held`` exceed ``paid`` by a hair).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

IDLE = "(idle)"


def cents(dollars: float) -> int:
    return round(dollars * 100)


def apportion(total: int, weights: Mapping[str, float]) -> dict[str, int]:
    """``total`` whole units shared in proportion to ``weights`` (non-negative), every unit
    given: floors first, then one more each to the largest remainders (ties by name, so the
    split is the same on every run). No weight: nothing to share it by, all to ``IDLE``."""
    positive = {k: w for k, w in weights.items() if w > 0 and math.isfinite(w)}
    whole = sum(positive.values())
    if total == 0:
        return dict.fromkeys(weights, 0)
    if whole <= 0:
        return {**dict.fromkeys(weights, 0), IDLE: total}
    exact = {k: total * w / whole for k, w in positive.items()}
    shares = {k: math.floor(v) for k, v in exact.items()}
    left = total - sum(shares.values())
    for key in sorted(exact, key=lambda k: (-(exact[k] - shares[k]), k))[:left]:
        shares[key] += 1
    return {**dict.fromkeys(weights, 0), **shares}


@dataclass
class TeamBill:
    """What each team's jobs held and cost, per place (a pool's name, or on-prem)."""

    gpu_s: dict[str, dict[str, float]] = field(default_factory=dict)  # team -> place -> GPU-s
    cents: dict[str, dict[str, int]] = field(default_factory=dict)  # team -> pool -> cents

    def team_cents(self, team: str) -> int:
        return sum(self.cents.get(team, {}).values())

    def team_gpu_s(self, team: str, place: str | None = None) -> float:
        held = self.gpu_s.get(team, {})
        return held.get(place, 0.0) if place is not None else sum(held.values())

    @property
    def teams(self) -> list[str]:
        """The teams, idle last."""
        names = set(self.gpu_s) | set(self.cents)
        return sorted(names - {IDLE}) + ([IDLE] if IDLE in names else [])


def bill(
    pool_cost: Mapping[str, float],
    pool_paid_gpu_s: Mapping[str, float],
    held: Mapping[tuple[str, str], float],
) -> TeamBill:
    """Split each pool's cost (dollars) between the teams by the GPU-seconds ``held`` maps
    (team, place) to; places that are not a priced pool (on-prem) carry GPU-seconds only."""
    result = TeamBill()
    by_pool: dict[str, dict[str, float]] = {}
    for (team, place), gpu_s in held.items():
        places = result.gpu_s.setdefault(team, {})
        places[place] = places.get(place, 0.0) + gpu_s
        if place in pool_cost or place in pool_paid_gpu_s:
            by_pool.setdefault(place, {})
            by_pool[place][team] = by_pool[place].get(team, 0.0) + gpu_s
    for pool in sorted(set(pool_cost) | set(pool_paid_gpu_s)):
        used = by_pool.get(pool, {})
        idle = max(0.0, pool_paid_gpu_s.get(pool, 0.0) - sum(used.values()))
        if idle > 0:
            result.gpu_s.setdefault(IDLE, {})[pool] = idle
        split = apportion(cents(pool_cost.get(pool, 0.0)), {**used, IDLE: idle})
        for team, share in split.items():
            if share or team in used:
                result.cents.setdefault(team, {})[pool] = share
    return result
