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

from autoscaler.model import InstanceState
from autoscaler.ops.journal.base import Billed, TickEntry, month_of, open_postgres, open_sqlite

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
        thread.join(30)
    assert failures == []
    journal = open_postgres(postgres_dsn)
    journal.call_started("r-1", "launch", "aws", "a", 1, 1, "x", 1.0)
    assert [c.request_id for c in journal.calls()] == ["r-1"]
