"""A damaged journal never becomes a traceback, a figure made of garbage or a silent loss.

``report --journal`` on text in a number's column, NaN spend, a tick time of 1e300, a schema
version of 'abc' or a file that is not a database ends in one line and exit 2, and writes
nothing. ``run`` refuses to start, with one line, on a journal that is damaged, cannot be
written or holds rows it could not have written; a journal deleted, replaced or overwritten
while it runs is noticed at the next transaction (the tick says so and no cloud call is made
without its write-ahead row). No figure that is not a finite number is ever written, to the
journal or to a report.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from fakes import job, pool, rig
from test_report_journal import DSN_VAR, report_of, start
from waits import bound

from autoscaler.cli import main
from autoscaler.model.errors import InputError
from autoscaler.ops.journal.base import (
    Billed,
    JournalError,
    TickEntry,
    month_of,
    open_postgres,
    open_sqlite,
)
from autoscaler.report.write import write_report

CLI = str(Path(sys.executable).parent / "gpu-autoscaler")


@pytest.fixture
def journal_file(tmp_path: Path) -> Path:
    """A journal the real controller wrote over six ticks (launch, interruption, drain)."""
    path = tmp_path / "j.db"
    journal = open_sqlite(path)
    try:
        start(journal)
    finally:
        journal.close()
    return path


def damage(path: Path, *statements: str) -> None:
    with sqlite3.connect(path) as db:
        for statement in statements:
            db.execute(statement)
    db.close()


def version(value: str) -> str:
    return f"UPDATE journal_meta SET value = '{value}' WHERE key = 'schema_version'"


def one_line_error(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert "Traceback" not in err and "this is a bug" not in err, err
    return err


# -- report --journal -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("statement", "said"),
    [
        ("UPDATE instance_costs SET usd = 'abc'", "instance_costs row instance_id"),
        ("UPDATE instance_costs SET usd = 'NaN'", "usd: Input should be a valid number"),
        ("UPDATE instance_costs SET usd = -4.5", "usd: Input should be greater than"),
        ("UPDATE instance_costs SET first_at = last_at + 10", "is after last_at"),
        ("UPDATE ticks SET at = 1e300", "ticks row id 1: at: Input should be less than"),
        ("UPDATE ticks SET pending_gpus = 'many'", "pending_gpus: Input should be a valid"),
        ("UPDATE ticks SET clamps = '" + "[" * 5000 + "]" * 5000 + "'", "recursion limit"),
        ("UPDATE actions SET done = 9223372036854775807", "done: Input should be less"),
        ("UPDATE actions SET lost_gpu_s = 'Infinity'", "lost_gpu_s: Input should be"),
        ("UPDATE instance_costs SET pool = x'00ff'", "pool: Input should be a valid string"),
        ("UPDATE instance_costs SET month = '2024-13'", "month: String should match"),
        ("UPDATE team_usage SET usd_micros = -1", "team_usage row team '(unknown)': usd_micros"),
        ("UPDATE team_usage SET gpu_ms = 'x'", "gpu_ms: Input should be a valid integer"),
        (version("abc"), "schema_version is 'abc', not a version number"),
        (version("99"), "newer than this version of gpu-autoscaler reads"),
        ("ALTER TABLE ticks DROP COLUMN clamps", "no such column: clamps"),
    ],
)
def test_garbage_in_the_journal_is_one_line_and_no_report(
    journal_file: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    statement: str,
    said: str,
) -> None:
    damage(journal_file, statement)
    out = tmp_path / "out"
    assert main(["report", "--journal", str(journal_file), "--out", str(out)]) == 2
    err = one_line_error(capsys)
    assert str(journal_file) in err and said in err, err
    assert not out.exists()


@pytest.mark.parametrize("cut", [0, 100, 5000])
def test_a_truncated_or_overwritten_file_is_one_line(
    journal_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], cut: int
) -> None:
    raw = journal_file.read_bytes()
    journal_file.write_bytes(raw[:cut] + os.urandom(3000) if cut else os.urandom(9000))
    assert main(["report", "--journal", str(journal_file), "--out", str(tmp_path / "o")]) == 2
    assert str(journal_file) in one_line_error(capsys)


def test_postgres_nan_spend_and_a_bad_schema_version_are_one_line(
    postgres_dsn: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """PostgreSQL keeps NaN in a DOUBLE PRECISION column: issue 15 saw it written as `$nan`."""
    journal = open_postgres(postgres_dsn)
    try:
        start(journal)
    finally:
        journal.close()
    monkeypatch.setenv(DSN_VAR, postgres_dsn)
    args = ["report", "--journal-postgres-env", DSN_VAR, "--out", str(tmp_path / "out")]
    with psycopg.connect(postgres_dsn, autocommit=True) as db:
        db.execute("UPDATE instance_costs SET usd = 'NaN'")
        assert main(args) == 2
        assert "usd: Input should be a finite number" in one_line_error(capsys)
        db.execute("UPDATE instance_costs SET usd = 1.0")
        db.execute("UPDATE journal_meta SET value = 'abc' WHERE key = 'schema_version'")
        assert main(args) == 2
        assert "schema_version is 'abc'" in one_line_error(capsys)
    assert not (tmp_path / "out").exists()


def test_a_report_with_a_figure_that_is_not_finite_is_never_written(
    journal_file: Path, tmp_path: Path
) -> None:
    assert main(["report", "--journal", str(journal_file), "--out", str(tmp_path / "ok")]) == 0
    report = report_of(tmp_path / "ok")
    real = report.policies[0].model_copy(update={"cost": math.nan})
    broken = report.model_copy(update={"policies": [real]})
    with pytest.raises(InputError, match=r"policies\[0\]\.cost is nan, not a finite number"):
        write_report(broken, tmp_path / "bad")
    assert not (tmp_path / "bad").exists()


# -- run: refusing to start -------------------------------------------------------------------


def run_config(tmp_path: Path, journal: Path) -> Path:
    config = tmp_path / "c.yaml"
    config.write_text(f"fleet_id: t\ntick_seconds: 0.2\njournal: {{sqlite_path: {journal}}}\n")
    return config


def run_cli(config: Path, ticks: int = 1) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [CLI, "run", "--config", str(config), "--ticks", str(ticks)],
        capture_output=True,
        text=True,
        timeout=bound(120),
        check=False,
    )


def this_month_row(path: Path, usd: str) -> None:
    """A cost row of the current (real) month, as the controller would read at start."""
    now = time.time()
    damage(
        path,
        "INSERT INTO instance_costs (instance_id, month, provider, pool, gpus, first_at, "
        f"last_at, usd, gpu_hours) VALUES ('i-1', '{month_of(now)}', 'aws', 'a', 1, {now - 60}, "
        f"{now}, {usd}, 1.0)",
    )


@pytest.mark.parametrize(
    ("make", "said"),
    [
        (lambda p: p.write_bytes(b"garbage" * 1000), "file is not a database"),
        (lambda p: p.write_bytes(p.read_bytes()[:3000]), "database disk image is malformed"),
        (
            lambda p: damage(
                p, "UPDATE journal_meta SET value = 'abc' WHERE key = 'schema_version'"
            ),
            "schema_version is 'abc'",
        ),
        (
            lambda p: damage(p, "UPDATE journal_meta SET value = '7' WHERE key = 'schema_version'"),
            "schema version 7 is newer",
        ),
        (lambda p: damage(p, "ALTER TABLE instance_costs DROP COLUMN gpu_hours"), "gpu_hours"),
        (lambda p: this_month_row(p, "'abc'"), "instance_costs row instance_id 'i-1': usd"),
        (lambda p: this_month_row(p, "1e999"), "instance_costs row instance_id 'i-1': usd"),
    ],
)
def test_run_refuses_a_damaged_journal_with_one_line(
    journal_file: Path, tmp_path: Path, make: object, said: str
) -> None:
    make(journal_file)  # type: ignore[operator]
    done = run_cli(run_config(tmp_path, journal_file))
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("error: ") and str(journal_file) in line and said in line, line


def test_a_page_damaged_inside_the_file_is_found_before_the_start(journal_file: Path) -> None:
    """Bytes overwritten inside a table's page: SQLite's quick check finds them at open."""
    raw = bytearray(journal_file.read_bytes())
    page = 4096
    tree_pages = [n for n in range(1, len(raw) // page) if raw[n * page] in (0x0D, 0x05)]
    assert tree_pages, "the journal has table pages"
    at = tree_pages[0] * page
    raw[at + 3 : at + 12] = b"\xff" * 9  # the page's cell count and content offsets
    journal_file.write_bytes(bytes(raw))
    with pytest.raises(JournalError, match=r"is damaged|malformed") as caught:
        open_sqlite(journal_file)
    assert "\n" not in str(caught.value)


@contextlib.contextmanager
def read_only(path: Path) -> Iterator[None]:
    """``path`` (a file or a folder) made read-only for this process: by its mode, or, for
    root, whom modes do not stop, with the immutable attribute."""
    if os.geteuid() != 0:
        mode = path.stat().st_mode
        path.chmod(0o555 if path.is_dir() else 0o444)
        try:
            yield
        finally:
            path.chmod(mode)
        return
    subprocess.run(["chattr", "+i", str(path)], check=True)
    try:
        yield
    finally:
        subprocess.run(["chattr", "-i", str(path)], check=True)


def test_run_refuses_a_read_only_journal_with_one_line(journal_file: Path, tmp_path: Path) -> None:
    config = run_config(tmp_path, journal_file)
    for stale in journal_file.parent.glob("j.db-*"):
        stale.unlink()
    with read_only(journal_file):
        done = run_cli(config)
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert str(journal_file) in line and "readonly" in line, line
    assert "must be able to write" in line


def test_run_refuses_a_journal_in_a_read_only_folder(tmp_path: Path) -> None:
    folder = tmp_path / "state"
    folder.mkdir()
    journal = folder / "j.db"
    with read_only(folder):
        done = run_cli(run_config(tmp_path, journal))
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert str(journal) in line and "must be able to write" in line, line


# -- run: damage while it runs --------------------------------------------------------------


def replace_with_another_journal(path: Path) -> None:
    other = path.with_name("other.db")
    open_sqlite(other).close()
    os.replace(other, path)


def overwrite_in_place(path: Path) -> None:
    other = path.with_name("other.db")
    open_sqlite(other).close()
    with path.open("r+b") as handle:
        handle.write(other.read_bytes())
        handle.truncate()


@pytest.mark.parametrize(
    "harm",
    [
        Path.unlink,
        replace_with_another_journal,
        overwrite_in_place,
        lambda p: p.open("r+b").truncate(0),
        lambda p: p.write_bytes(os.urandom(8192)),
    ],
    ids=["deleted", "replaced", "overwritten", "truncated", "garbage"],
)
def test_a_journal_damaged_mid_run_is_noticed_and_no_call_goes_unjournaled(
    tmp_path: Path, harm: object, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "j.db"
    journal = open_sqlite(path)
    t = rig([pool("a")], {"a": 2.0}, journal=journal)
    t.queue.jobs = [job("x")]
    assert not t.controller.tick().errors
    launched = set(t.cloud.instances)
    harm(path)  # type: ignore[operator]
    t.clock.advance(60)
    t.queue.jobs = [job("x"), job("y"), job("z")]
    report = t.controller.tick()
    assert any("while the controller ran" in e for e in report.errors), report.errors
    assert all("\n" not in e for e in report.errors)
    assert set(t.cloud.instances) == launched, "no launch without its write-ahead row"
    (launch,) = [a for a in report.actions if a.kind == "launch"]
    assert launch.outcome == "error" and "CallNotMade: launch in a not made" in launch.detail
    said = [r for r in caplog.records if "not made" in r.getMessage()]
    assert said and all(r.exc_info is None for r in said), "an expected failure, not a traceback"
    journal.close()


def test_a_journal_deleted_under_a_running_controller_is_said_in_its_log(tmp_path: Path) -> None:
    """The real ``run``: its journal deleted after the first tick; the next ticks log it."""
    path = tmp_path / "j.db"
    process = subprocess.Popen(
        [CLI, "run", "--config", str(run_config(tmp_path, path)), "--ticks", "400"],
        stderr=subprocess.PIPE,
        text=True,
    )
    assert process.stderr is not None
    try:
        for line in process.stderr:
            if '"tick": 1' in line:
                break
        path.unlink()
        said = ""
        for line in process.stderr:
            if "not journaled" in line:
                said = line
                break
    finally:
        process.kill()
        process.wait()
    event = json.loads(said)
    assert event["level"] == "error" and "was deleted, replaced or overwritten" in event["msg"]


def test_postgres_overwritten_mid_run_is_noticed(postgres_dsn: str) -> None:
    journal = open_postgres(postgres_dsn)
    t = rig([pool("a")], {"a": 2.0}, journal=journal)
    assert not t.controller.tick().errors
    with psycopg.connect(postgres_dsn, autocommit=True) as db:
        db.execute("UPDATE journal_meta SET value = 'another' WHERE key = 'journal_id'")
    t.clock.advance(60)
    report = t.controller.tick()
    assert any("was overwritten while the controller ran" in e for e in report.errors)
    journal.close()


# -- nothing that is not a finite number is written -----------------------------------------


def entry(at: float, cost_per_hour: float = 1.0, duration_s: float = 0.1) -> TickEntry:
    return TickEntry(
        incarnation="t",
        tick=1,
        token=1,
        at=at,
        duration_s=duration_s,
        outcome="ok",
        held=None,
        demand_known=True,
        pending_gpus=0,
        instances=1,
        cost_per_hour=cost_per_hour,
        plan={"reason": "x", "score": math.inf},
    )


@pytest.mark.parametrize(
    ("tick", "price"),
    [
        (entry(1000.0, cost_per_hour=math.nan), 1.0),
        (entry(1000.0, duration_s=math.inf), 1.0),
        (entry(math.nan), 1.0),
        (entry(1000.0), math.inf),
        (entry(1000.0), math.nan),
    ],
)
def test_a_figure_that_is_not_finite_is_never_journaled(
    tmp_path: Path, tick: TickEntry, price: float
) -> None:
    journal = open_sqlite(tmp_path / "j.db")
    billed = [Billed("i-1", "aws", "a", 1, price, 0.0)]
    with pytest.raises(JournalError, match="not a finite number; it is never journaled"):
        journal.record_tick(tick, [], billed)
    assert journal.ticks() == [] and journal.spend() == []
    assert journal.month_spend(1000.0) == 0.0
    journal.record_tick(entry(1000.0), [], [Billed("i-1", "aws", "a", 1, 2.0, 0.0)])
    (row,) = journal.ticks()
    assert row.plan["score"] is None, "JSON has no infinity: a plan's is written as null"
    assert journal.month_spend(1000.0) == pytest.approx(2.0 * 1000 / 3600)
    journal.close()
