"""The journal as the controller writes it: every cloud call written ahead and completed, every
tick's decision and actions, the dollars each instance accrues; a kill -9 at any instant leaves
an SQLite journal whole, and a call cut short is closed by the next start."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from fakes import job, pool, rig
from hypothesis import given, settings
from hypothesis import strategies as st
from waits import bound

from autoscaler.model import InstanceState
from autoscaler.ops.journal.base import (
    Billed,
    Journal,
    TickEntry,
    month_of,
    open_postgres,
    open_sqlite,
)
from autoscaler.ops.journal.schema import SCHEMA_VERSION
from autoscaler.ops.onprem_idle import IdleNode
from autoscaler.report.journal import read_journal

HOUR = 3600.0


def test_every_launch_is_journaled_before_the_call_and_completed_after(tmp_path: Path) -> None:
    journal = open_sqlite(tmp_path / "j.db")
    t = rig([pool("a")], {"a": 2.0}, journal=journal)
    seen_before_call: list[str] = []
    launch = t.cloud.launch

    def looking(*args: object, **kwargs: object):  # type: ignore[no-untyped-def]
        request_id = str(args[2])
        seen_before_call.extend(c.outcome for c in journal.calls() if c.request_id == request_id)
        return launch(*args, **kwargs)  # type: ignore[arg-type]

    t.cloud.launch = looking  # type: ignore[method-assign]
    t.queue.jobs = [job("x"), job("y")]
    t.controller.tick()

    assert seen_before_call == ["started"], "the row exists, marked started, during the call"
    (call,) = journal.calls()
    assert (call.kind, call.pool, call.count, call.outcome) == ("launch", "a", 2, "ok")
    assert call.finished_at is not None
    assert sorted(call.instance_ids) == sorted(t.cloud.instances)
    assert call.token == 1 and call.incarnation == "t"
    (tick,) = journal.ticks()
    assert (tick.pending_gpus, tick.outcome, tick.token) == (2, "ok", 1)
    launches = [a for a in journal.actions() if a.kind == "launch"]
    assert [(a.pool, a.requested, a.done, a.request_id) for a in launches] == [
        ("a", 2, 2, call.request_id)
    ]


def test_cost_accrues_per_instance_at_its_pools_price(tmp_path: Path) -> None:
    journal = open_sqlite(tmp_path / "j.db")
    t = rig([pool("a", gpus=4)], {"a": 3.0}, journal=journal)
    t.queue.jobs = [job("x", gpus=4)]
    t.controller.tick()
    t.cloud.boot_all()
    (instance,) = t.cloud.instances
    for _ in range(4):
        t.clock.advance(HOUR / 2)
        t.controller.tick()
    (row,) = journal.spend()
    assert row.instance_id == instance
    assert row.usd == pytest.approx(3.0 * 2.0)
    assert row.gpu_hours == pytest.approx(4 * 2.0)
    assert journal.month_spend(t.clock.now()) == pytest.approx(6.0)
    reopened = open_sqlite(tmp_path / "j.db")
    assert reopened.month_spend(t.clock.now()) == pytest.approx(6.0)


def test_a_call_cut_short_is_closed_by_the_next_start(tmp_path: Path) -> None:
    journal = open_sqlite(tmp_path / "j.db")
    journal.call_started("r-1", "launch", "fake", "a", 2, 1, "old", 10.0)
    journal.close()

    reopened = open_sqlite(tmp_path / "j.db")
    (cut,) = reopened.close_unfinished(20.0)
    assert cut.request_id == "r-1"
    (call,) = reopened.calls()
    assert call.outcome == "unknown" and call.finished_at == 20.0
    assert "adopted" in call.detail
    assert reopened.close_unfinished(30.0) == []


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(st.floats(1.0, 4 * HOUR), st.floats(0.0, 10.0), st.booleans()),
        min_size=1,
        max_size=30,
    )
)
def test_accrued_dollars_are_the_integral_of_price_over_billed_time(
    steps: list[tuple[float, float, bool]],
) -> None:
    """Whatever the tick spacing and price changes, an instance's dollars are the sum of each
    interval's length times the price seen at its end, from its launch on; a tick it was not
    billed on (no price known) is caught up at the next one, since it ran all along."""
    journal = open_sqlite(Path(":memory:"))
    now = 1_700_000_000.0
    expected = {"i-1": 0.0, "i-2": 0.0}
    last = {"i-1": now, "i-2": now}
    for number, (gap, price, second_billed) in enumerate(steps):
        now += gap
        billed = [Billed("i-1", "fake", "a", 1, price, 1_700_000_000.0)]
        if second_billed:
            billed.append(Billed("i-2", "fake", "a", 1, price, 1_700_000_000.0))
        for node in billed:
            expected[node.instance_id] += price * (now - last[node.instance_id]) / HOUR
            last[node.instance_id] = now
        journal.record_tick(_entry(number, now), [], billed)
        journal.forget([i for i in ("i-1", "i-2") if i not in {b.instance_id for b in billed}])
    by_instance: dict[str, float] = {}
    for row in journal.spend():
        by_instance[row.instance_id] = by_instance.get(row.instance_id, 0.0) + row.usd
    for instance_id, usd in by_instance.items():
        assert usd == pytest.approx(expected[instance_id], rel=1e-9, abs=1e-9)
    months = {month_of(1_700_000_000.0), month_of(now)}
    if len(months) == 1:
        assert journal.month_spend(now) == pytest.approx(sum(by_instance.values()), abs=1e-9)


def _entry(number: int, at: float) -> TickEntry:
    return TickEntry("inc", number, 1, at, 0.01, "ok", None, True, 0, 0, 0.0, {})


WRITER = """
import sys, time
from autoscaler.ops.journal.base import Billed, TickEntry, open_sqlite
from pathlib import Path
journal = open_sqlite(Path(sys.argv[1]))
n = 0
print("ready", flush=True)
while True:
    n += 1
    journal.call_started(f"{sys.argv[2]}-{n}", "launch", "fake", "a", 1, 1, "w", float(n))
    journal.record_tick(
        TickEntry("w", n, 1, float(n), 0.0, "ok", None, True, 1, 1, 1.0, {"n": n}),
        [],
        [Billed("i-1", "fake", "a", 1, 1.0, 0.0)],
    )
    journal.call_finished(f"{sys.argv[2]}-{n}", "ok", ["i-1"], "", float(n))
"""


def test_sqlite_survives_kill_9_at_any_instant(tmp_path: Path) -> None:
    """Killed mid-write over and over, the file stays whole: integrity holds, every tick row
    committed is there with its accruals, and at most the one call in flight is unfinished."""
    path = tmp_path / "j.db"
    for round_number in range(8):
        writer = subprocess.Popen(
            [sys.executable, "-c", WRITER, str(path), f"round{round_number}"],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert writer.stdout is not None and writer.stdout.readline().strip() == "ready"
        time.sleep(0.05 + 0.03 * round_number)
        writer.kill()
        writer.wait()
        with sqlite3.connect(path) as db:
            assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        journal = open_sqlite(path)
        unfinished = [c for c in journal.calls() if c.finished_at is None]
        assert len(unfinished) <= 1
        journal.close_unfinished(0.0)
        journal.close()
    with sqlite3.connect(path) as db:
        ticks = db.execute("SELECT COUNT(*) FROM ticks").fetchone()[0]
        calls = db.execute("SELECT COUNT(*) FROM cloud_calls").fetchone()[0]
        assert ticks > 0 and calls >= ticks


def test_an_unwritable_journal_stops_the_launch_not_the_controller(tmp_path: Path) -> None:
    """No cloud call goes out that the journal did not record first."""
    journal = open_sqlite(tmp_path / "j.db")
    t = rig([pool("a")], {"a": 1.0}, journal=journal)
    journal.close()
    t.queue.jobs = [job("x")]
    report = t.controller.tick()
    assert t.cloud.launch_calls == []
    launches = [a for a in report.actions if a.kind == "launch"]
    assert [a.outcome for a in launches] == ["error"]
    assert "journal" in launches[0].detail
    assert any("journal" in e for e in report.errors)
    assert all(r.state is not InstanceState.RUNNING for r in t.controller.table)


def test_replicas_opening_a_fresh_postgres_journal_at_once_all_succeed(postgres_dsn: str) -> None:
    """Two replicas start together on an empty database: one creates the tables, the other
    waits for it, and neither fails on PostgreSQL's catalog."""
    barrier = threading.Barrier(6)
    failures: list[BaseException] = []

    def open_one() -> None:
        barrier.wait()
        try:
            open_postgres(postgres_dsn).close()
        except BaseException as exc:
            failures.append(exc)

    threads = [threading.Thread(target=open_one) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(bound(60))
    assert failures == []
    journal = open_postgres(postgres_dsn)
    journal.call_started("r-1", "launch", "aws", "a", 1, 1, "x", 1.0)
    assert [c.request_id for c in journal.calls()] == ["r-1"]


# -- on-prem GPUs allocated on nodes that read idle ------------------------------------------

DAY0 = 1_717_200_000.0  # 2024-06-01T00:00:00Z


def _idle_entry(number: int, at: float, idle: tuple[IdleNode, ...] | None) -> TickEntry:
    return TickEntry("inc", number, 1, at, 0.01, "ok", None, True, 0, 0, 0.0, {}, [], idle)


def test_onprem_idle_gpu_seconds_are_counted_since_the_previous_tick_per_node(
    tmp_path: Path,
) -> None:
    journal = open_sqlite(tmp_path / "j.db")
    t = DAY0 + 3600
    journal.record_tick(_idle_entry(0, t, (IdleNode("n1", 4, t - 500),)), [], [])
    # n1 idle for long, n2 for the last 20 s of the 60 s since the previous tick
    journal.record_tick(
        _idle_entry(1, t + 60, (IdleNode("n1", 4, t - 500), IdleNode("n2", 8, t + 40))), [], []
    )
    journal.record_tick(_idle_entry(2, t + 120, None), [], [])  # the node source failed
    journal.record_tick(_idle_entry(3, t + 180, ()), [], [])  # measured, nothing idle
    ticks = journal.ticks()
    assert [x.onprem_idle_gpu_s for x in ticks] == [0.0, 4 * 60 + 8 * 20, None, 0.0], (
        "the first tick has no interval behind it; a tick that could not know is unknown"
    )
    spans = {s.node: s for s in journal.onprem_idle()}
    assert spans["n1"].gpu_s == 240 and spans["n2"].gpu_s == 160
    assert (spans["n2"].first_at, spans["n2"].last_at) == (t + 40, t + 60)
    assert spans["n1"].day == "2024-06-01"
    assert journal.onprem_idle(since=t + 61) == [], "a period after the spans holds none"
    journal.close()


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.floats(1.0, 4 * HOUR),
            st.one_of(
                st.none(),
                st.dictionaries(
                    st.sampled_from(["n1", "n2", "n3"]),
                    st.tuples(st.integers(1, 8), st.floats(0.0, 8 * HOUR)),
                ),
            ),
        ),
        min_size=1,
        max_size=30,
    )
)
def test_onprem_idle_per_tick_and_per_node_sum_to_the_same_gpu_seconds(
    steps: list[tuple[float, dict[str, tuple[int, float]] | None]],
) -> None:
    """Whatever the tick spacing, each tick counts each idle node's GPUs over the part of the
    interval since the previous tick it has read idle; the per-node sums add up to the ticks'."""
    journal = open_sqlite(Path(":memory:"))
    now, previous = DAY0, None
    expected: list[float | None] = []
    for number, (gap, idle) in enumerate(steps):
        now += gap
        nodes = (
            None
            if idle is None
            else tuple(IdleNode(n, gpus, now - ago) for n, (gpus, ago) in sorted(idle.items()))
        )
        if nodes is None:
            expected.append(None)
        else:
            expected.append(
                sum(
                    0.0 if previous is None else n.gpus * (now - max(n.idle_since, previous))
                    for n in nodes
                )
            )
        journal.record_tick(_idle_entry(number, now, nodes), [], [])
        previous = now
    got = [x.onprem_idle_gpu_s for x in journal.ticks()]
    assert [g is None for g in got] == [e is None for e in expected], "unknown stays unknown"
    for counted, wanted in zip(got, expected, strict=True):
        if wanted is not None:
            assert counted == pytest.approx(wanted, rel=1e-9, abs=1e-6)
    by_ticks = sum(x or 0.0 for x in got)
    by_nodes = sum(s.gpu_s for s in journal.onprem_idle())
    assert by_nodes == pytest.approx(by_ticks, rel=1e-9, abs=1e-6)
    assert all(s.first_at <= s.last_at for s in journal.onprem_idle())


# What version 1 of gpu-autoscaler created, and a tick and a cost as it wrote them: the journal
# an upgraded controller finds on disk.
SCHEMA_V1 = (
    "CREATE TABLE journal_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    "CREATE TABLE ticks (id {id}, incarnation TEXT NOT NULL, tick BIGINT NOT NULL, "
    "token BIGINT NOT NULL, at DOUBLE PRECISION NOT NULL, duration_s DOUBLE PRECISION NOT NULL, "
    "outcome TEXT NOT NULL, held TEXT, demand_known BOOLEAN NOT NULL, "
    "pending_gpus BIGINT NOT NULL, instances BIGINT NOT NULL, "
    "cost_per_hour DOUBLE PRECISION NOT NULL, plan TEXT NOT NULL, clamps TEXT NOT NULL)",
    "CREATE TABLE actions (id {id}, incarnation TEXT NOT NULL, tick BIGINT NOT NULL, "
    "token BIGINT NOT NULL, at DOUBLE PRECISION NOT NULL, kind TEXT NOT NULL, pool TEXT, "
    "requested BIGINT NOT NULL, done BIGINT NOT NULL, outcome TEXT NOT NULL, "
    "detail TEXT NOT NULL, request_id TEXT, instance_ids TEXT NOT NULL, job_id TEXT, "
    "lost_gpu_s DOUBLE PRECISION)",
    "CREATE INDEX actions_at ON actions (at)",
    "CREATE TABLE cloud_calls (request_id TEXT PRIMARY KEY, kind TEXT NOT NULL, "
    "provider TEXT NOT NULL, pool TEXT, count BIGINT NOT NULL, token BIGINT NOT NULL, "
    "incarnation TEXT NOT NULL, started_at DOUBLE PRECISION NOT NULL, "
    "finished_at DOUBLE PRECISION, outcome TEXT NOT NULL, instance_ids TEXT NOT NULL, "
    "detail TEXT NOT NULL)",
    "CREATE TABLE instance_costs (instance_id TEXT NOT NULL, month TEXT NOT NULL, "
    "provider TEXT NOT NULL, pool TEXT NOT NULL, gpus BIGINT NOT NULL, "
    "first_at DOUBLE PRECISION NOT NULL, last_at DOUBLE PRECISION NOT NULL, "
    "usd DOUBLE PRECISION NOT NULL, gpu_hours DOUBLE PRECISION NOT NULL, "
    "PRIMARY KEY (instance_id, month))",
    "CREATE INDEX instance_costs_month ON instance_costs (month)",
    "INSERT INTO journal_meta (key, value) VALUES ('schema_version', '1')",
    "INSERT INTO journal_meta (key, value) VALUES ('journal_id', 'v1-journal')",
    "INSERT INTO ticks (incarnation, tick, token, at, duration_s, outcome, held, demand_known, "
    f"pending_gpus, instances, cost_per_hour, plan, clamps) VALUES ('old', 0, 1, {DAY0}, 0.1, "
    "'ok', NULL, TRUE, 2, 1, 3.0, '{}', '[]')",
    "INSERT INTO instance_costs (instance_id, month, provider, pool, gpus, first_at, last_at, "
    f"usd, gpu_hours) VALUES ('i-1', '2024-06', 'aws', 'a', 1, {DAY0 - 3600}, {DAY0}, 3.0, 1.0)",
)


def _v1_sqlite(path: Path) -> None:
    with sqlite3.connect(path) as db:
        for statement in SCHEMA_V1:
            db.execute(statement.replace("{id}", "INTEGER PRIMARY KEY"))
    db.close()


def _check_upgraded(journal: Journal) -> None:
    """The old rows read as they were (the old tick did not know the on-prem figure), and the
    upgraded journal records it from now on."""
    (old,) = journal.ticks()
    assert (old.incarnation, old.pending_gpus, old.onprem_idle_gpu_s) == ("old", 2, None)
    assert [r.usd for r in journal.spend()] == [3.0]
    assert [r.team for r in journal.spend()] == [None], "written before teams: no team"
    journal.record_tick(_idle_entry(1, DAY0 + 60, (IdleNode("n1", 2, DAY0),)), [], [])
    journal.record_tick(_idle_entry(2, DAY0 + 120, (IdleNode("n1", 2, DAY0),)), [], [])
    assert [x.onprem_idle_gpu_s for x in journal.ticks()] == [None, 0.0, 120.0]
    assert [(s.node, s.gpu_s) for s in journal.onprem_idle()] == [("n1", 120.0)]


def test_a_journal_written_by_schema_version_1_opens_and_is_brought_up_to_date(
    tmp_path: Path,
) -> None:
    path = tmp_path / "j.db"
    _v1_sqlite(path)
    report = read_journal(path, None, None, None)  # read-only: read as it is, not migrated
    assert report.ticks[0].onprem_idle_gpu_s is None and report.onprem_idle == []
    journal = open_sqlite(path)
    with sqlite3.connect(path) as db:
        (version,) = db.execute(
            "SELECT value FROM journal_meta WHERE key = 'schema_version'"
        ).fetchone()
    db.close()
    assert version == str(SCHEMA_VERSION) == "4"
    _check_upgraded(journal)
    journal.close()
    again = open_sqlite(path)  # a second opening has nothing left to do
    assert len(again.ticks()) == 3
    again.close()
    records = read_journal(path, None, None, None)
    assert [t.onprem_idle_gpu_s for t in records.ticks] == [None, 0.0, 120.0]


def test_a_version_1_postgres_journal_is_brought_up_to_date(postgres_dsn: str) -> None:
    import psycopg

    with psycopg.connect(postgres_dsn, autocommit=True) as db:
        for statement in SCHEMA_V1:
            db.execute(statement.replace("{id}", "BIGSERIAL PRIMARY KEY"))
    journal = open_postgres(postgres_dsn)
    _check_upgraded(journal)
    journal.close()
    open_postgres(postgres_dsn).close()
