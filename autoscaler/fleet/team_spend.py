"""Each team's cloud spend this calendar month, for the guard's per-team monthly budgets.

The spend is what the instances bought for the team (``InstanceRecord.team``) have billed this
calendar month (UTC), accrued in memory each tick at the tick's prices, as the journal accrues
the fleet's: an instance is charged from when it was last charged (from its launch the first
time, from the month's start across a month's turn) to now, while its state is billed.

Across a restart it is recovered from the journal, as the fleet's month spend is for
``max_cost_per_month``: the journal's billed rows are per instance and month
(``instance_costs``), and since schema version 4 each row keeps whom its instance was bought
for, so a team's month is the sum of its rows, instances that ended before the restart
included. A row without a team (written before version 4) falls back to the team the live
instance's own cloud tag names (``Instance.team``, kept by the instance table on adoption),
counted once the table knows it; an instance neither says counts for no team. A live instance
is charged in memory only from when the journal last billed it, so nothing is counted twice.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Protocol

from autoscaler.model import BILLED_STATES, FleetView

HOUR = 3600.0


class JournaledCost(Protocol):
    """One instance's journaled month (the journal's ``SpendRow``)."""

    @property
    def instance_id(self) -> str: ...

    @property
    def month(self) -> str: ...

    @property
    def last_at(self) -> float: ...

    @property
    def usd(self) -> float: ...

    @property
    def team(self) -> str | None: ...


def month_start(now: float) -> tuple[str, float]:
    """The calendar month (UTC) ``now`` falls in, and when it began."""
    at = datetime.fromtimestamp(now, UTC)
    start = datetime(at.year, at.month, 1, tzinfo=UTC)
    return f"{at.year:04d}-{at.month:02d}", start.timestamp()


class TeamSpend:
    """Dollars each team's instances have billed this calendar month, accrued tick by tick and
    recovered from the journal after a restart (``recover``)."""

    def __init__(self) -> None:
        self._month: str | None = None
        self._usd: dict[str, float] = {}
        self._since: dict[str, float] = {}
        # every instance charged in memory this month: its own charge covers its month
        self._charged: set[str] = set()
        # the month whose journal rows were read (None: not yet), whether the last read failed,
        # and the journaled (dollars, last billed) of rows without a team whose instance's tag
        # is not known yet
        self._recovered: str | None = None
        self._unread = False
        self._journaled: dict[str, tuple[float, float]] = {}
        self._journal_since: dict[str, float] = {}  # counted: charge in memory from here
        # the team a journal row names, for a live instance whose record lost it (no tag)
        self._row_team: dict[str, str] = {}

    def wants_journal(self, now: float) -> bool:
        """Whether ``now``'s month has not been read from the journal yet (a fresh start, a
        month's turn, or a read that failed)."""
        return self._recovered != month_start(now)[0]

    def recover(self, rows: Iterable[JournaledCost] | None, now: float) -> None:
        """Take the journal's rows of ``now``'s month (those of other months are ignored); None
        when the journal could not be read: the teams' months are unknown (``month`` is None,
        and the guard holds every team with a budget) until a read succeeds."""
        if rows is None:
            self._unread = True
            return
        month, _ = month_start(now)
        self._roll(month)
        self._journaled = {}
        for r in rows:
            if r.month != month or r.instance_id in self._charged:
                continue
            if r.team is None:  # written before schema 4: the live instance's tag may say
                self._journaled[r.instance_id] = (r.usd, r.last_at)
                continue
            self._usd[r.team] = self._usd.get(r.team, 0.0) + r.usd
            self._journal_since[r.instance_id] = r.last_at
            self._row_team[r.instance_id] = r.team
        self._recovered = month
        self._unread = False

    def accrue(self, view: FleetView, owners: Mapping[str, str | None]) -> None:
        """Charge each billed instance bought for a team from when it was last charged to
        ``view.now``; ``owners`` says whom each was bought for (``InstanceTable.teams()``)."""
        month, start = month_start(view.now)
        self._roll(month)
        self._count_journaled(owners)
        prices = {p.pool.name: p.price.price_per_hour for p in view.pools if p.price is not None}
        billed: dict[str, float] = {}
        for node in view.instances:
            team = owners.get(node.instance_id) or self._row_team.get(node.instance_id)
            price = prices.get(node.pool)
            if team is None or price is None or node.state not in BILLED_STATES:
                continue
            last = self._since.get(node.instance_id)
            if last is None:
                last = self._journal_since.pop(node.instance_id, None)
            since = max(last if last is not None else node.launched_at, start)
            hours = max(0.0, view.now - since) / HOUR
            self._usd[team] = self._usd.get(team, 0.0) + price * hours
            billed[node.instance_id] = max(since, view.now)
        self._since = billed
        self._charged.update(billed)
        if self._journal_since:
            self._journal_since = {
                i: at
                for i, at in self._journal_since.items()
                if owners.get(i) is not None or i in self._row_team
            }

    def month(self, now: float) -> dict[str, float] | None:
        """Each team's spend in ``now``'s calendar month so far (as of the last accrual); None
        while the journal holding it could not be read."""
        if self._unread:
            return None
        if month_start(now)[0] != self._month:
            return {}
        return dict(self._usd)

    def _roll(self, month: str) -> None:
        if month != self._month:
            # a row's team outlives its month for the instances still billed
            self._row_team = {i: t for i, t in self._row_team.items() if i in self._since}
            self._month = month
            self._usd = {}
            self._charged = set()
            self._journaled = {}
            self._journal_since = {}

    def _count_journaled(self, owners: Mapping[str, str | None]) -> None:
        """Count the journaled dollars of the instances whose team is now known; each is then
        charged in memory only from when the journal last billed it. An instance listed with
        no team is dropped; one not listed (yet: its cloud failed to list) waits."""
        if not self._journaled:
            return
        for instance_id in [i for i in self._journaled if i in owners]:
            usd, last_at = self._journaled.pop(instance_id)
            team = owners[instance_id]
            if team is not None:
                self._usd[team] = self._usd.get(team, 0.0) + usd
                self._journal_since[instance_id] = last_at
