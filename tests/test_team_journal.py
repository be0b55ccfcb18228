"""A team's month spend is the journal's own sum (schema version 4): each cost row keeps whom its
instance was bought for, so an instance that ended before a restart still counts for its team,
and one whose cloud tag is missing still counts for the team its rows name; rows written before
version 4 read as no team and fall back to the live instance's tag (SQLite and PostgreSQL)."""

from __future__ import annotations

import math
import sqlite3
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from fakes import FakeCloud, FakeNodes, FakeQueue
from hypothesis import given, settings
from hypothesis import strategies as st
from test_peers import mk, pv, view
from test_team_tags import HOUR, PRICE, T0, bought, controller

from autoscaler.fleet.team_spend import TeamSpend, month_start
from autoscaler.model import InstanceState, PoolView
from autoscaler.model.clock import ManualClock
from autoscaler.ops.journal.base import Billed, Journal, TickEntry, open_postgres, open_sqlite
from autoscaler.ops.journal.schema import SCHEMA_VERSION

World = tuple[FakeCloud, ManualClock, FakeQueue, FakeNodes]


@pytest.fixture(params=["sqlite", "postgres"])
def journal_opener(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[[], Journal]:
    """Opens the same journal again, as a restarted controller does."""
    if request.param == "sqlite":
        path = tmp_path / "journal.db"
        return lambda: open_sqlite(path)
    dsn = request.getfixturevalue("postgres_dsn")
    return lambda: open_postgres(dsn)


@pytest.fixture
def world() -> Iterator[World]:
    clock = ManualClock(T0)
    cloud = FakeCloud("fake", price_table={"a": PRICE, "b": PRICE}, now=clock.now)
    yield cloud, clock, FakeQueue(), FakeNodes()


def the_instance_of(cloud: FakeCloud, team: str) -> str:
    (found,) = [i.id for i in cloud.instances.values() if i.team == team]
    return found


def test_an_instance_that_ended_before_a_restart_still_counts_for_its_team(
    world: World, journal_opener: Callable[[], Journal]
) -> None:
    cloud, clock, queue, nodes = world
    journal = journal_opener()
    first = bought(world, journal)  # ml and web: three hours each
    ended = the_instance_of(cloud, "ml")
    cloud.instances[ended] = cloud.instances[ended].model_copy(
        update={"state": InstanceState.TERMINATED}
    )
    clock.advance(60)
    report = first.tick()
    assert not report.errors, report.errors
    assert ended not in first.fleet.table.teams(), "the instance ended"
    before = first.fleet.team_spend.month(clock.now())
    assert before is not None and before["ml"] == pytest.approx(PRICE * 3, rel=0.02)
    journal.close()

    del cloud.instances[ended]  # gone from the cloud's listing too
    again = journal_opener()
    second = controller(cloud, clock, again, queue, nodes, "two")
    report = second.tick()
    assert not report.errors, report.errors
    assert ended not in second.fleet.table.teams(), "not listed: the tag cannot say"
    after = second.fleet.team_spend.month(clock.now())
    assert after is not None
    assert after["ml"] == pytest.approx(before["ml"]), "the ended instance's rows name ml"
    assert after == pytest.approx(before)
    rows = again.spend(since=month_start(clock.now())[1])
    assert {r.instance_id: r.team for r in rows} == {
        i: t for i, t in first.fleet.table.teams().items()
    } | {ended: "ml"}
    assert math.fsum(after.values()) == pytest.approx(math.fsum(r.usd for r in rows))
    again.close()


def test_an_instance_whose_tag_is_lost_counts_for_the_team_its_rows_name(
    world: World, journal_opener: Callable[[], Journal]
) -> None:
    """An instance launched before team tags existed (or whose tag was removed): the restarted
    controller's table does not know its team, its journal rows do, and it is charged on for
    that team from where the journal left off."""
    cloud, clock, queue, nodes = world
    journal = journal_opener()
    first = bought(world, journal)
    before = first.fleet.team_spend.month(clock.now())
    assert before is not None
    untagged = the_instance_of(cloud, "web")
    cloud.instances[untagged] = cloud.instances[untagged].model_copy(update={"team": None})
    journal.close()

    again = journal_opener()
    second = controller(cloud, clock, again, queue, nodes, "two")
    second.tick()
    assert second.fleet.table.teams()[untagged] is None, "the listing does not say"
    assert second.fleet.team_spend.month(clock.now()) == pytest.approx(before)
    clock.advance(HOUR)
    second.tick()
    assert second.fleet.team_spend.month(clock.now()) == pytest.approx(
        {t: usd + PRICE for t, usd in before.items()}
    ), "charged on for web, never twice"
    rows = {r.instance_id: r.team for r in again.spend(since=month_start(clock.now())[1])}
    assert rows[untagged] == "web", "a write with no team keeps the row's first team"
    again.close()


# -- a journal of schema version 3 ------------------------------------------------------------


def entry(tick: int, at: float) -> TickEntry:
    return TickEntry(
        incarnation="x",
        tick=tick,
        token=1,
        at=at,
        duration_s=0.1,
        outcome="ok",
        held=None,
        demand_known=True,
        pending_gpus=0,
        instances=1,
        cost_per_hour=PRICE,
        plan={},
        clamps=[],
    )


def as_version_3(execute: Callable[[str], object]) -> None:
    """What a journal written by schema version 3 looks like: no team column."""
    execute("ALTER TABLE instance_costs DROP COLUMN team")
    execute("UPDATE journal_meta SET value = '3' WHERE key = 'schema_version'")


def check_version_3_rows_read_as_no_team(opener: Callable[[], Journal]) -> None:
    journal = opener()
    assert {r.instance_id: r.team for r in journal.spend()} == {"i-ml": None, "i-none": None}
    spend = TeamSpend()
    spend.recover(journal.spend(), T0 + HOUR)
    now = view([pv_a()]).model_copy(update={"now": T0 + HOUR})
    spend.accrue(now, {})
    assert spend.month(T0 + HOUR) == {}, "no team named, no tag listed: no team's"
    tagged = TeamSpend()
    tagged.recover(journal.spend(), T0 + HOUR)
    tagged.accrue(now, {"i-ml": "ml"})
    assert tagged.month(T0 + HOUR) == pytest.approx({"ml": PRICE}), "the tag still counts"
    # written on from now: the old row takes the team of its next write, and keeps it
    journal.record_tick(entry(2, T0 + 2 * HOUR), [], [billed("i-ml", "ml")])
    journal.record_tick(entry(3, T0 + 3 * HOUR), [], [billed("i-ml", None)])
    assert {r.instance_id: r.team for r in journal.spend()} == {"i-ml": "ml", "i-none": None}
    journal.close()
    reopened = opener()
    assert [r.usd for r in reopened.spend() if r.instance_id == "i-ml"] == [
        pytest.approx(3 * PRICE)
    ]
    reopened.close()


def pv_a() -> PoolView:
    return pv(mk("a"), PRICE)


def billed(instance_id: str, team: str | None) -> Billed:
    return Billed(instance_id, "fake", "a", 1, PRICE, T0, team)


def write_version_3(journal: Journal) -> None:
    journal.record_tick(entry(1, T0 + HOUR), [], [billed("i-ml", None), billed("i-none", None)])
    journal.close()


def test_a_version_3_sqlite_journal_migrates_and_its_rows_read_as_no_team(
    tmp_path: Path,
) -> None:
    path = tmp_path / "j.db"
    write_version_3(open_sqlite(path))
    with sqlite3.connect(path) as db:
        as_version_3(db.execute)
    db.close()
    check_version_3_rows_read_as_no_team(lambda: open_sqlite(path))
    with sqlite3.connect(path) as db:
        (version,) = db.execute(
            "SELECT value FROM journal_meta WHERE key = 'schema_version'"
        ).fetchone()
    db.close()
    assert version == str(SCHEMA_VERSION) == "4"


def test_a_version_3_postgres_journal_migrates_and_its_rows_read_as_no_team(
    postgres_dsn: str,
) -> None:
    import psycopg

    write_version_3(open_postgres(postgres_dsn))
    with psycopg.connect(postgres_dsn, autocommit=True) as db:
        as_version_3(db.execute)
    check_version_3_rows_read_as_no_team(lambda: open_postgres(postgres_dsn))
    with psycopg.connect(postgres_dsn, autocommit=True) as db:
        found = db.execute("SELECT value FROM journal_meta WHERE key = 'schema_version'")
        assert found.fetchone() == (str(SCHEMA_VERSION),)


# -- the teams' months add up to the fleet's --------------------------------------------------

TEAMS = st.sampled_from([None, "ml", "web", "research"])
# each tick: which of four instances are billed, and the team each write names
TICKS = st.lists(
    st.dictionaries(st.sampled_from(["i-0", "i-1", "i-2", "i-3"]), TEAMS, max_size=4),
    min_size=1,
    max_size=12,
)


@settings(max_examples=40, deadline=None)
@given(TICKS)
def test_the_teams_months_and_no_teams_add_up_to_the_fleets_month(
    ticks: list[dict[str, str | None]],
) -> None:
    """Whatever teams the writes name, each row keeps the first one named; a restart's teams'
    months are the sums of their rows, and with the rows of no team they make the fleet's
    month, which the budget guard reads."""
    with tempfile.TemporaryDirectory() as tmp:
        journal = open_sqlite(Path(tmp) / "j.db")
        first_team: dict[str, str | None] = {}
        at = T0
        for n, billed_now in enumerate(ticks):
            at += 600.0
            journal.record_tick(
                entry(n, at), [], [billed(i, t) for i, t in sorted(billed_now.items())]
            )
            for i, t in billed_now.items():
                if first_team.get(i) is None:
                    first_team[i] = t
        rows = journal.spend(since=month_start(at)[1])
        assert {r.instance_id: r.team for r in rows} == first_team
        spend = TeamSpend()
        spend.recover(rows, at)
        spend.accrue(view([pv_a()]).model_copy(update={"now": at}), {})
        month = spend.month(at)
        assert month is not None
        no_team = math.fsum(r.usd for r in rows if r.team is None)
        for team, usd in month.items():
            assert usd == pytest.approx(math.fsum(r.usd for r in rows if r.team == team))
        assert math.fsum(month.values()) + no_team == pytest.approx(
            journal.month_spend(at), abs=1e-9
        )
        journal.close()
