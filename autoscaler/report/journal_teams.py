"""Who paid for what, from the journal: the teams' lines of ``team_usage`` over the report's
period, in the report's Teams table.

The controller split every billed instance's and on-prem node's ticks between the teams whose
jobs held its GPUs (``autoscaler.fleet.team_usage``), in whole micro-dollars and GPU-milliseconds
whose lines add up to the fleet's. Here each pool's dollars in the report (its share of the
fleet's, in whole cents by the largest remainder, so the pools add up to the report's cost) are
split between the teams by those micro-dollars; what the journal accrued but no line covers
(spend from before schema version 3, or a period cut inside a day) is the ``(unknown)`` line.
So the teams' cents add up to the report's cost to the cent.

Quota use is the on-prem GPUs a team held on average over the period, beside what the
controller's config guarantees it when the config is given (``--config``): the journal does not
hold the config.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from autoscaler.fleet.attribution import IDLE, apportion, cents
from autoscaler.fleet.team_usage import MICROS_PER_USD, MS_PER_S, ONPREM, UNKNOWN, teams_of
from autoscaler.model.teams import TeamsConfig
from autoscaler.ops.journal.base import TeamSpan

HOUR = 3600.0
MAX_TEAM_LINES = 50


@dataclass
class TeamTotals:
    """Per team and place (a pool, or on-prem): GPU-seconds and cents."""

    gpu_s: dict[str, dict[str, float]] = field(default_factory=dict)
    cents: dict[str, dict[str, int]] = field(default_factory=dict)

    @property
    def teams(self) -> list[str]:
        keys = [(t, p) for t, places in self.gpu_s.items() for p in places]
        keys += [(t, p) for t, places in self.cents.items() for p in places]
        return teams_of(keys)

    def team_cents(self, team: str) -> int:
        return sum(self.cents.get(team, {}).values())

    def gpu_hours(self, team: str, onprem: bool) -> float:
        places = self.gpu_s.get(team, {})
        return sum(s for p, s in places.items() if (p == ONPREM) == onprem) / HOUR


def _share(span: TeamSpan, since: float | None, until: float | None) -> float:
    """The part of a team-day row inside the period, in proportion to time."""
    low = span.first_at if since is None else max(span.first_at, since)
    high = span.last_at if until is None else min(span.last_at, until)
    width = span.last_at - span.first_at
    if width <= 0:
        return 1.0 if low <= high else 0.0
    return max(0.0, min(1.0, (high - low) / width))


def team_totals(
    spans: Sequence[TeamSpan],
    pool_usd: Mapping[str, float],
    since: float | None = None,
    until: float | None = None,
) -> TeamTotals:
    """The teams' GPU-seconds, and ``pool_usd`` (the report's dollars per pool) split between
    them in cents that add up to ``cents(sum(pool_usd))`` exactly."""
    result = TeamTotals()
    micros: dict[str, dict[str, float]] = {}
    for span in spans:
        share = _share(span, since, until)
        if share <= 0:
            continue
        places = result.gpu_s.setdefault(span.team, {})
        places[span.pool] = places.get(span.pool, 0.0) + span.gpu_ms / MS_PER_S * share
        if span.usd_micros:
            by_team = micros.setdefault(span.pool, {})
            by_team[span.team] = by_team.get(span.team, 0.0) + span.usd_micros * share
    fleet = cents(math.fsum(pool_usd.values()))
    per_pool = apportion(fleet, {p: max(0.0, usd) for p, usd in pool_usd.items()})
    for pool in sorted(set(per_pool) | set(micros)):
        weights = dict(micros.get(pool, {}))
        covered = math.fsum(weights.values())
        missing = pool_usd.get(pool, 0.0) * MICROS_PER_USD - covered
        if missing > 0.5 * MICROS_PER_USD / 100:  # more than half a cent no line covers
            weights[UNKNOWN] = weights.get(UNKNOWN, 0.0) + missing
        if not weights:
            weights = {UNKNOWN: 1.0}
        for team, share_cents in apportion(per_pool.get(pool, 0), weights).items():
            if share_cents or team in micros.get(pool, {}):
                result.cents.setdefault(team, {})[pool] = share_cents
    return result


def held_on_average(totals: TeamTotals, team: str, seconds: float) -> float | None:
    """The on-prem GPUs the team's jobs held on average over ``seconds``."""
    if seconds <= 0:
        return None
    return totals.gpu_s.get(team, {}).get(ONPREM, 0.0) / seconds


def team_lines(totals: TeamTotals, seconds: float, teams: TeamsConfig | None) -> list[str]:
    """One line per team: dollars and GPU-hours per pool, on-prem GPU-hours, and its quota
    use (mean on-prem GPUs held) against its guarantee."""
    lines: list[str] = []
    names = totals.teams
    for team in names[:MAX_TEAM_LINES]:
        parts = []
        for place in sorted(set(totals.gpu_s.get(team, {})) | set(totals.cents.get(team, {}))):
            hours = totals.gpu_s.get(team, {}).get(place, 0.0) / HOUR
            if place == ONPREM:
                parts.append(f"on-prem {hours:,.2f} GPU-h")
            else:
                usd = totals.cents.get(team, {}).get(place, 0) / 100
                parts.append(f"{place} ${usd:,.2f} ({hours:,.2f} GPU-h)")
        special = team in (IDLE, UNKNOWN)
        line = ("" if special else "Team ") + f"{team}: " + ("; ".join(parts) or "nothing")
        mean = held_on_average(totals, team, seconds)
        spec = teams.teams.get(team) if teams is not None else None
        if mean is not None and totals.gpu_s.get(team, {}).get(ONPREM):
            line += f"; {'' if special else 'held '}{mean:,.2f} on-prem GPUs on average"
            if spec is not None and spec.guaranteed_gpus:
                used = mean / spec.guaranteed_gpus
                line += f" against a guarantee of {spec.guaranteed_gpus} ({used:.0%})"
        elif spec is not None and spec.guaranteed_gpus:
            line += f"; held no on-prem GPU against a guarantee of {spec.guaranteed_gpus}"
        lines.append(line + ".")
    if len(names) > MAX_TEAM_LINES:
        lines.append(f"... and {len(names) - MAX_TEAM_LINES} more team(s) in the Teams table.")
    if teams is None and lines:
        lines.append(
            "Guarantees are not shown: the journal does not hold the config (give the "
            "controller's config with --config to compare quota use with them)."
        )
    return lines
