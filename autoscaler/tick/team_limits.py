"""Each team's cloud burst limits and monthly budget, as the guard holds them over launches.

A launch names whom it is bought for (``LaunchRequest.team``) and the instance table remembers
it (``InstanceRecord.team``). A launch for a team is granted only while, for that team:

* the GPUs of the live instances bought for it, plus those granted this tick, stay within
  ``burst_gpus``;
* their $/hour at this tick's prices, plus those granted, stay within ``burst_usd_per_hour``
  (a team whose live instances include one of a pool with no price known is held, as the
  fleet's $/hour budget is);
* its month projected as the fleet's is (``autoscaler.tick.budget``): what the team spent this
  calendar month plus the run rate of the capacity it keeps to the month's end, plus each
  granted instance's cost to the month's end, stays within ``monthly_budget_usd``. While the
  team's spend is unknown, a team with a budget is held, never assumed within it.

A team the config does not list gets ``TeamsConfig.unassigned``'s terms as its own. A launch
for no team (None) is held by no team's limits, and instances bought for no team, or whose team
is unknown because the table was rebuilt from the clouds' listing after a restart, count
against no team (docs/teams.md says so).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from autoscaler.model import CAPACITY_STATES, LIVE_STATES, FleetView, PoolView
from autoscaler.model.teams import TeamsConfig, TeamSpec
from autoscaler.tick.budget import Projection, hours_to_month_end

_INF = math.inf

RULE_GPUS = "team_burst_gpus"
RULE_USD = "team_burst_usd_per_hour"
RULE_MONTH = "team_monthly_budget"

# A limit's rule, the instances of a pool it still admits, and why (worked out for a clamp only).
Room = tuple[str, float, Callable[[], str]]


@dataclass(frozen=True)
class TeamLedger:
    """What the guard needs to hold the teams' limits: the config's terms, whom each live
    instance was bought for (``InstanceTable.teams()``), and each team's spend this calendar
    month (``autoscaler.fleet.team_spend.TeamSpend.month``; None while it is not known)."""

    config: TeamsConfig
    owners: Mapping[str, str | None] = field(default_factory=dict)
    month_spend: Mapping[str, float] | None = field(default_factory=dict)


@dataclass
class _Use:
    """One team's cloud use at this tick, grown by what the guard grants it."""

    gpus: int = 0
    usd_per_hour: float = 0.0
    kept_usd_per_hour: float = 0.0
    unpriced: bool = False


class TeamRoom:
    """The room each team has left under its own limits, spent as the guard grants launches."""

    def __init__(self, ledger: TeamLedger, view: FleetView) -> None:
        self.config = ledger.config
        self.month_spend = ledger.month_spend
        self.hours_left = hours_to_month_end(view.now)
        self.use: dict[str, _Use] = {}
        pools = view.pool_by_name
        for node in view.instances:
            team = ledger.owners.get(node.instance_id)
            if team is None or node.state not in LIVE_STATES:
                continue
            use = self.use.setdefault(team, _Use())
            use.gpus += node.gpus
            pool_view = pools.get(node.pool)
            if pool_view is None or pool_view.price is None:
                use.unpriced = True
                continue
            use.usd_per_hour += pool_view.price.price_per_hour
            if node.state in CAPACITY_STATES:
                use.kept_usd_per_hour += pool_view.price.price_per_hour

    def copy(self) -> TeamRoom:
        twin = object.__new__(TeamRoom)
        twin.config = self.config
        twin.month_spend = self.month_spend
        twin.hours_left = self.hours_left
        twin.use = {team: _Use(**vars(use)) for team, use in self.use.items()}
        return twin

    def spec(self, team: str) -> TeamSpec:
        return self.config.spec(team)

    def rooms(self, team: str, pool_view: PoolView) -> list[Room]:
        """(rule, instances of this pool the team may still have, why) for each of the team's
        limits; the why is worked out only for a clamp."""
        spec = self.spec(team)
        use = self.use.get(team, _Use())
        pool = pool_view.pool
        price = pool_view.price.price_per_hour if pool_view.price is not None else None
        found: list[Room] = []
        if spec.burst_gpus is not None:
            limit = spec.burst_gpus
            found.append(
                (
                    RULE_GPUS,
                    max(0, limit - use.gpus) // pool.gpus_per_instance,
                    lambda: f"team {team}: burst_gpus {limit} ({use.gpus} GPU(s) held)",
                )
            )
        if spec.burst_usd_per_hour is not None:
            dollars = spec.burst_usd_per_hour
            if use.unpriced or price is None:
                found.append((RULE_USD, 0, lambda: f"team {team}: no price known; burst held"))
            else:
                found.append(
                    (
                        RULE_USD,
                        _fits(dollars - use.usd_per_hour, price),
                        lambda: (
                            f"team {team}: burst_usd_per_hour ${dollars:,.2f} "
                            f"(${use.usd_per_hour:,.2f}/h held)"
                        ),
                    )
                )
        if spec.monthly_budget_usd is not None:
            projection = self.projection(team)
            if projection is None:
                found.append(
                    (
                        RULE_MONTH,
                        0,
                        lambda: f"team {team}: this month's spend is unknown; burst held",
                    )
                )
            elif price is None:
                found.append((RULE_MONTH, 0, lambda: f"team {team}: no price known; burst held"))
            else:
                month = projection
                found.append(
                    (
                        RULE_MONTH,
                        _fits(month.room, price * self.hours_left),
                        lambda: f"team {team}: monthly_budget_usd reached: {month.describe()}",
                    )
                )
        return found

    def projection(self, team: str) -> Projection | None:
        """The team's month projected to its end, or None while its spend is unknown."""
        spec = self.spec(team)
        if spec.monthly_budget_usd is None or self.month_spend is None:
            return None
        use = self.use.get(team, _Use())
        return Projection(
            self.month_spend.get(team, 0.0),
            use.kept_usd_per_hour,
            self.hours_left,
            spec.monthly_budget_usd,
        )

    def debit(self, team: str, pool_view: PoolView, count: int) -> None:
        """``count`` more instances of the pool held for the team (fewer when negative)."""
        use = self.use.setdefault(team, _Use())
        use.gpus += count * pool_view.pool.gpus_per_instance
        if pool_view.price is not None:
            use.usd_per_hour += count * pool_view.price.price_per_hour
            use.kept_usd_per_hour += count * pool_view.price.price_per_hour


def _fits(room: float, cost: float) -> float:
    """Instances costing ``cost`` each that ``room`` holds (any number when they cost nothing)."""
    if cost <= 0:
        return _INF if room >= 0 else 0
    return max(0, math.floor(room / cost + 1e-9))
