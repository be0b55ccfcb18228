"""Each team's cloud spend this calendar month, for the guard's per-team monthly budgets.

The spend is what the instances bought for the team (``InstanceRecord.team``) have billed this
calendar month (UTC), accrued in memory each tick at the tick's prices, as the journal accrues
the fleet's: an instance is charged from when it was last charged (from its launch the first
time, from the month's start across a month's turn) to now, while its state is billed.

It is kept in memory, not read back from the journal: the journal's billed rows are per
instance and do not say whom an instance was bought for. So a controller restart starts every
team's month at zero, and the instances it finds then are of no team (the clouds' listings do
not say either): the team budgets are held from a restart on, not across it (docs/teams.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime

from autoscaler.model import BILLED_STATES, FleetView

HOUR = 3600.0


def month_start(now: float) -> tuple[str, float]:
    """The calendar month (UTC) ``now`` falls in, and when it began."""
    at = datetime.fromtimestamp(now, UTC)
    start = datetime(at.year, at.month, 1, tzinfo=UTC)
    return f"{at.year:04d}-{at.month:02d}", start.timestamp()


class TeamSpend:
    """Dollars each team's instances have billed this calendar month, accrued tick by tick."""

    def __init__(self) -> None:
        self._month: str | None = None
        self._usd: dict[str, float] = {}
        self._since: dict[str, float] = {}

    def accrue(self, view: FleetView, owners: Mapping[str, str | None]) -> None:
        """Charge each billed instance bought for a team from when it was last charged to
        ``view.now``; ``owners`` says whom each was bought for (``InstanceTable.teams()``)."""
        month, start = month_start(view.now)
        if month != self._month:
            self._month = month
            self._usd = {}
        prices = {p.pool.name: p.price.price_per_hour for p in view.pools if p.price is not None}
        billed: dict[str, float] = {}
        for node in view.instances:
            team = owners.get(node.instance_id)
            price = prices.get(node.pool)
            if team is None or price is None or node.state not in BILLED_STATES:
                continue
            since = max(self._since.get(node.instance_id, node.launched_at), start)
            hours = max(0.0, view.now - since) / HOUR
            self._usd[team] = self._usd.get(team, 0.0) + price * hours
            billed[node.instance_id] = max(since, view.now)
        self._since = billed

    def month(self, now: float) -> dict[str, float]:
        """Each team's spend in ``now``'s calendar month so far (as of the last accrual)."""
        if month_start(now)[0] != self._month:
            return {}
        return dict(self._usd)
