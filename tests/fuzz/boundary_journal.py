"""Fuzz boundary: the journal, corrupted, read-only and damaged while the controller runs.

One journal is written by the real controller (``tests/fakes.rig`` with a journal: a launch,
boots, accrued cost, a budget clamp), at real time so that its rows are this month's. Each input
is a ``Damage`` done to a copy of it: a hostile value in a cell (text in a number, NaN, 1e300,
a blob, deep JSON, 70,000 characters), a hostile ``schema_version``, a table or column dropped,
hostile rows inserted, bytes truncated, flipped or overwritten, a page of garbage, or the file
or its folder made read-only. Three boundaries read it, each with its rule:

* ``report --journal``: exit 0 with a report whose figures are all finite and agree with an
  independent read of the same file (cost is the sum of ``usd``, ticks the count of rows, every
  value read a number of the right kind), or exit 2 with one line naming the file;
* ``run`` opening it: the open refuses with a one-line ``JournalError`` naming the file, or it
  succeeds and a tick journals cleanly, and a restart opens it again with that tick in it;
* damage while ``run`` runs: the next tick says the journal failed (one line naming it, and no
  launch without its write-ahead row), or it journals cleanly and a restart either refuses the
  file with one line or finds that tick and the launch's cloud call in it: never a tick silently
  lost.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import random
import shutil
import sqlite3
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from fakes import Rig, job, pool, rig
from harness import Outcome, mutate_text

from autoscaler.cli import main
from autoscaler.model.errors import InputError
from autoscaler.ops.journal.base import JournalError, open_journal, open_sqlite
from autoscaler.ops.journal.rows import LATEST_TIME
from autoscaler.report.journal import build_journal_report, read_journal
from autoscaler.report.render import summary_markdown
from autoscaler.report.write import publishable

PRICE = 2.0
# The columns of each table, and which hold numbers or JSON (what a hostile value is put in).
COLUMNS: dict[str, tuple[str, ...]] = {
    "ticks": (
        "incarnation", "tick", "token", "at", "duration_s", "outcome", "held", "demand_known",
        "pending_gpus", "instances", "cost_per_hour", "plan", "clamps",
    ),
    "actions": (
        "incarnation", "tick", "token", "at", "kind", "pool", "requested", "done", "outcome",
        "detail", "request_id", "instance_ids", "job_id", "lost_gpu_s",
    ),
    "cloud_calls": (
        "request_id", "kind", "provider", "pool", "count", "token", "incarnation", "started_at",
        "finished_at", "outcome", "instance_ids", "detail",
    ),
    "instance_costs": (
        "instance_id", "month", "provider", "pool", "gpus", "first_at", "last_at", "usd",
        "gpu_hours",
    ),
    "journal_meta": ("key", "value"),
}  # fmt: skip
JSON_COLUMNS = ("plan", "clamps", "instance_ids")
HOSTILE: tuple[Any, ...] = (
    "abc", "", "NaN", "nan", "Infinity", "-Infinity", "1e999", "-1e999", 1e300, -1e300, -1,
    -1e-9, 0, 2**63 - 1, -(2**63), 1e30, 4102444800.0, 4102444799.0, 1.5, "12", " 7", "٣",
    b"\x00\xff", b"", "x" * 70_000, "\x00", "\ud800".encode("utf-8", "surrogatepass"),
    "[" * 5000 + "]" * 5000, '{"a":' * 300 + "1" + "}" * 300, "[]", "{}", "null", "[1,2]",
    '[{"rule": 5}]', '[{"pool": "a"}]', '["' + "i" * 2000 + '"]', "true", None,
)  # fmt: skip
BYTE_DAMAGE = ("truncate", "flip", "page", "zero", "header", "append", "text", "garbage")
SCHEMA_VERSIONS = ("abc", "", "0", "-1", "2", "1e3", "٣", " 1", "1 ", "999999999999", "01", "1")


@dataclass(frozen=True)
class Damage:
    """One thing done to a good journal; its ``repr`` replays it."""

    kind: str  # cell, meta, schema, insert, bytes, readonly, none
    table: str = ""
    column: str = ""
    row: int | None = None  # rowid; None: every row
    value: Any = None
    sql: str = ""
    how: str = ""  # for bytes: truncate, flip, page, zero, header, append, text, garbage
    at: float = 0.0  # where in the file, as a fraction of its length
    count: int = 0
    seed: int = 0


def generate_damage(rng: random.Random, read_only_ok: bool) -> Damage:
    roll = rng.random()
    if roll < 0.35:
        table = rng.choice([t for t in COLUMNS if t != "journal_meta"])
        column = rng.choice(COLUMNS[table])
        value = rng.choice(HOSTILE)
        if column in JSON_COLUMNS and rng.random() < 0.5:
            value = mutate_text(
                json.dumps({"plan": [{"pool": "a", "count": 2}]} if column == "plan" else []),
                rng,
            )
        return Damage("cell", table, column, rng.choice([None, 1, 2, 3]), value)
    if roll < 0.45:
        return Damage("meta", value=rng.choice(SCHEMA_VERSIONS), how=rng.choice(["set", "drop"]))
    if roll < 0.55:
        table = rng.choice(list(COLUMNS))
        column = rng.choice(COLUMNS[table])
        sql = rng.choice(
            [
                f"DROP TABLE {table}",
                f"ALTER TABLE {table} DROP COLUMN {column}",
                f"ALTER TABLE {table} RENAME TO old_{table}",
                f"ALTER TABLE {table} ADD COLUMN extra TEXT",
                f"ALTER TABLE {table} RENAME COLUMN {column} TO {column}_old",
                f"DELETE FROM {table}",
                "DROP INDEX actions_at",
            ]
        )
        return Damage("schema", table, column, sql=sql)
    if roll < 0.65:
        first, last = rng.choice([(0.0, 10.0), (10.0, 0.0), (-5.0, 5.0), (1e300, 1e300)])
        usd = rng.choice([1.0, -1.0, "abc", 1e13, 0.0, "NaN"])
        month = rng.choice(["2024-06", "2024-13", "xx", "", "9999-12"])
        sql = (
            "INSERT INTO instance_costs (instance_id, month, provider, pool, gpus, first_at, "
            f"last_at, usd, gpu_hours) VALUES ('i-x{rng.randrange(10)}', {month!r}, 'p', 'a', "
            f"{rng.choice([1, -1, 0, 8])}, {first!r}, {last!r}, {usd!r}, 1.0)"
        )
        return Damage("insert", "instance_costs", sql=sql.replace("inf", "9e999"))
    if roll < 0.95:
        how = rng.choice(
            ["truncate", "flip", "page", "zero", "header", "append", "text", "garbage"]
        )
        return Damage(
            "bytes",
            how=how,
            at=rng.random(),
            count=rng.randrange(1, 64),
            seed=rng.randrange(1 << 30),
        )
    if roll < 0.98 and read_only_ok:
        return Damage("readonly", how=rng.choice(["file", "folder"]))
    return Damage("none")


# -- doing the damage -------------------------------------------------------------------------


def apply(damage: Damage, path: Path) -> None:
    """Do ``damage`` to the journal at ``path``; a statement SQLite refuses (a NOT NULL
    column given NULL) leaves the file as it was, which is an input too."""
    if damage.kind in ("cell", "meta", "schema", "insert"):
        db = sqlite3.connect(path)
        try:
            with contextlib.suppress(sqlite3.Error):
                _sql_damage(db, damage)
                db.commit()
        finally:
            db.close()
    elif damage.kind == "bytes":
        path.write_bytes(_byte_damage(path.read_bytes(), damage))


def _sql_damage(db: sqlite3.Connection, damage: Damage) -> None:
    if damage.kind == "cell":
        where = "" if damage.row is None else f" WHERE rowid = {damage.row}"
        db.execute(f"UPDATE {damage.table} SET {damage.column} = ?{where}", (damage.value,))
    elif damage.kind == "meta" and damage.how == "drop":
        db.execute("DELETE FROM journal_meta WHERE key = 'schema_version'")
    elif damage.kind == "meta":
        db.execute(
            "UPDATE journal_meta SET value = ? WHERE key = 'schema_version'", (damage.value,)
        )
    else:
        db.execute(damage.sql)


def _byte_damage(raw: bytes, damage: Damage) -> bytes:
    rng = random.Random(damage.seed)
    at = int(damage.at * len(raw))
    data = bytearray(raw)
    if damage.how == "truncate":
        return raw[:at]
    if damage.how == "flip":
        for _ in range(damage.count):
            data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
        return bytes(data)
    if damage.how in ("page", "zero"):
        page = 4096 * (at // 4096)
        fill = rng.randbytes(4096) if damage.how == "page" else bytes(4096)
        data[page : page + 4096] = fill[: len(data[page : page + 4096])]
        return bytes(data)
    if damage.how == "header":
        for _ in range(damage.count % 8 + 1):
            data[rng.randrange(100)] = rng.randrange(256)
        return bytes(data)
    if damage.how == "append":
        return raw + rng.randbytes(damage.count * 512)
    if damage.how == "text":
        return mutate_text(raw.decode("latin-1"), rng).encode("utf-8")
    return rng.randbytes(max(1, at))


@cache
def immutable_works() -> bool:
    """Whether this process can make a file read-only for itself: by its mode, or for root
    (whom modes do not stop) by the immutable attribute, where the filesystem has one."""
    if os.geteuid() != 0:
        return True
    with tempfile.NamedTemporaryFile() as probe:
        done = subprocess.run(["chattr", "+i", probe.name], capture_output=True, check=False)
        if done.returncode != 0:
            return False
        subprocess.run(["chattr", "-i", probe.name], check=True)
    return True


@contextlib.contextmanager
def read_only(path: Path) -> Iterator[None]:
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


# -- the journal every input starts from --------------------------------------------------------


def drive(journal_rig: Rig, ticks: int = 4) -> None:
    """Launch (one pool with room for one of the two asked, so a shortfall too), boot, accrue."""
    t = journal_rig
    t.queue.jobs = [job("x"), job("y")]
    for _ in range(ticks):
        t.controller.tick()
        t.cloud.boot_all()
        t.clock.advance(60)


def new_rig(journal: Any) -> Rig:
    t = rig([pool("a")], {"a": PRICE}, capacity={"a": 1}, limits={"max_cost_per_hour": PRICE},
            journal=journal)  # fmt: skip
    t.clock.advance(time.time() - t.clock.now() - 600)  # this month's rows, as a real run's
    return t


@cache
def base_journal() -> bytes:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "j.db"
        journal = open_sqlite(path)
        drive(new_rig(journal))
        journal.close()
        return path.read_bytes()


@contextlib.contextmanager
def damaged_copy(damage: Damage) -> Iterator[Path]:
    folder = Path(tempfile.mkdtemp(prefix="fuzz-journal-"))
    try:
        path = folder / "j.db"
        path.write_bytes(base_journal())
        apply(damage, path)
        if damage.kind == "readonly":
            with read_only(path if damage.how == "file" else folder):
                yield path
        else:
            yield path
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def one_line_naming(message: str, path: Path) -> str | None:
    """Why an error message breaks the rule (one line naming the file), or None."""
    if "\n" in message:
        return f"the error is {message.count(chr(10)) + 1} lines: {message[:200]!r}"
    if str(path) not in message:
        return f"the error names no journal: {message[:200]!r}"
    return None


# -- report --journal ---------------------------------------------------------------------------


@dataclass(frozen=True)
class ReportInput:
    damage: Damage
    full_cli: bool  # the whole command, rendering included (slow: one input in fifty)


class ReportJournalBoundary:
    name = "journal: report --journal on a damaged journal"

    def seeds(self) -> Sequence[object]:
        return [ReportInput(Damage("none"), full_cli=True), ReportInput(Damage("none"), False)]

    def generate(self, rng: random.Random) -> object:
        data = ReportInput(generate_damage(rng, read_only_ok=False), rng.random() < 0.02)
        if data.full_cli:
            _warm_renderer()
        return data

    def check(self, data: object) -> Outcome:
        assert isinstance(data, ReportInput)
        with damaged_copy(data.damage) as path:
            out = path.parent / "out"
            if data.full_cli:
                outcome, report = self._cli(path, out)
            else:
                outcome, report = self._in_process(path)
            if report is None:
                return outcome
            return _agrees_with_the_file(report, path) or outcome

    def _cli(self, path: Path, out: Path) -> tuple[Outcome, dict[str, Any] | None]:
        stdout, stderr = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            rc = main(["--debug", "report", "--journal", str(path), "--out", str(out)])
        if rc == 2:
            problem = one_line_naming(stderr.getvalue().strip(), path)
            if problem is None and out.exists():
                problem = "exit 2, yet the report folder was written"
            return (
                Outcome.wrong(problem) if problem else Outcome.rejected(stderr.getvalue())
            ), None
        if rc != 0:
            return Outcome.wrong(f"exit {rc}: {stderr.getvalue()[:200]}"), None
        text = (out / "report.json").read_text()
        return Outcome.accepted(), _strict_json(text)

    def close(self) -> None:
        """Every input cleans up after itself."""

    def _in_process(self, path: Path) -> tuple[Outcome, dict[str, Any] | None]:
        """The command's path without its rendering to HTML (a second per report)."""
        try:
            report = publishable(build_journal_report(read_journal(path, None, None, None)))
        except InputError as exc:
            problem = one_line_naming(str(exc), path)
            return (Outcome.wrong(problem) if problem else Outcome.rejected(str(exc))), None
        summary_markdown(report)
        return Outcome.accepted(), _strict_json(report.model_dump_json())


@cache
def _warm_renderer() -> None:
    """The first report a process renders loads matplotlib and its fonts: seconds that are no
    property of the journal, and on a busy machine enough to pass for a hang. Done once, here,
    where the harness does not time it."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "empty.db"
        open_sqlite(path).close()
        with contextlib.redirect_stdout(io.StringIO()):
            main(["report", "--journal", str(path), "--out", str(Path(tmp) / "out")])


def _strict_json(text: str) -> dict[str, Any]:
    def refuse(constant: str) -> float:
        raise ValueError(f"report.json holds {constant}")

    parsed: dict[str, Any] = json.loads(text, parse_constant=refuse)
    return parsed


def _agrees_with_the_file(report: dict[str, Any], path: Path) -> Outcome | None:
    """An accepted report against an independent read of the file: a silent wrong answer is
    ``Outcome.wrong``; None when it agrees."""
    try:
        with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as db:
            usd = [r[0] for r in db.execute("SELECT usd FROM instance_costs")]
            ats = [r[0] for r in db.execute("SELECT at FROM ticks")]
    except sqlite3.Error as exc:
        return Outcome.wrong(f"accepted a journal SQLite cannot read whole: {exc}")
    for value in usd:
        if not (type(value) in (int, float) and math.isfinite(value) and value >= 0):
            return Outcome.wrong(f"accepted a journal whose usd holds {value!r:.60}")
    for value in ats:
        if not (type(value) in (int, float) and 0 <= value < LATEST_TIME):
            return Outcome.wrong(f"accepted a journal whose tick time is {value!r:.60}")
    (real,) = report["policies"]
    if abs(real["cost"] - round(math.fsum(usd), 2)) > 0.011:
        return Outcome.wrong(f"cost {real['cost']} but the rows sum to {math.fsum(usd)}")
    if real["ticks"] != len(ats):
        return Outcome.wrong(f"{real['ticks']} ticks reported, {len(ats)} in the file")
    return None


# -- run: opening it -------------------------------------------------------------------------


class RunJournalBoundary:
    name = "journal: run on a corrupted or read-only journal"

    def seeds(self) -> Sequence[object]:
        return [Damage("none")]

    def generate(self, rng: random.Random) -> object:
        return generate_damage(rng, read_only_ok=immutable_works())

    def check(self, data: object) -> Outcome:
        assert isinstance(data, Damage)
        with damaged_copy(data) as path:
            try:
                journal = open_journal(sqlite_path=path)
            except JournalError as exc:
                problem = one_line_naming(str(exc), path)
                return Outcome.wrong(problem) if problem else Outcome.rejected(str(exc))
            if data.kind == "readonly":
                journal.close()
                return Outcome.wrong(f"opened a read-only journal ({data.how})")
            return _journals_cleanly(journal, path)

    def close(self) -> None:
        """Every input cleans up after itself."""


def _journals_cleanly(journal: Any, path: Path) -> Outcome:
    """An opened journal: a tick with a launch journals without error, and a restart opens
    the file again and finds it (rows counted by SQLite itself, independently)."""
    try:
        before = _count_ticks(path)
        t = new_rig(journal)
        t.queue.jobs = [job("z")]
        report = t.controller.tick()
    finally:
        journal.close()
    if report.errors:
        return Outcome.wrong(f"opened, then the tick failed: {report.errors[0][:200]}")
    try:
        open_sqlite(path).close()
    except JournalError as exc:
        return Outcome.wrong(f"opened and written, then refused at restart: {exc}")
    if _count_ticks(path) != before + 1:
        return Outcome.wrong("the tick written is not in the journal after a restart")
    return Outcome.accepted()


def _count_ticks(path: Path) -> int:
    with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as db:
        count: int = db.execute("SELECT COUNT(*) FROM ticks").fetchone()[0]
    return count


# -- damage while it runs ------------------------------------------------------------------------


def _replace(path: Path) -> None:
    other = path.with_name("other.db")
    open_sqlite(other).close()
    os.replace(other, path)


def _overwrite(path: Path) -> None:
    other = path.with_name("other.db")
    open_sqlite(other).close()
    with path.open("r+b") as handle:
        handle.write(other.read_bytes())
        handle.truncate()


def _in_place(damage: Damage) -> Callable[[Path], None]:
    def harm(path: Path) -> None:
        raw = path.read_bytes()
        with path.open("r+b") as handle:
            handle.write(_byte_damage(raw, damage))
            handle.truncate()

    return harm


MID_RUN: dict[str, Callable[[Path], None]] = {
    "delete": Path.unlink,
    "replace": _replace,
    "overwrite": _overwrite,
    "chmod": lambda p: p.chmod(0o444),
}


@dataclass(frozen=True)
class MidRun:
    harm: str  # a MID_RUN key, or "bytes"/"sql" with ``damage``
    damage: Damage | None = None


class MidRunJournalBoundary:
    name = "journal: damaged while run runs"

    def seeds(self) -> Sequence[object]:
        return [MidRun("none")]

    def generate(self, rng: random.Random) -> object:
        roll = rng.random()
        if roll < 0.3:
            return MidRun(rng.choice(list(MID_RUN)))
        damage = generate_damage(rng, read_only_ok=False)
        if damage.kind == "bytes":
            return MidRun("bytes", damage)
        if damage.kind in ("cell", "meta", "schema", "insert"):
            return MidRun("sql", damage)
        return MidRun("none")

    def check(self, data: object) -> Outcome:
        assert isinstance(data, MidRun)
        folder = Path(tempfile.mkdtemp(prefix="fuzz-journal-run-"))
        try:
            return self._run(data, folder / "j.db")
        finally:
            shutil.rmtree(folder, ignore_errors=True)

    def _run(self, data: MidRun, path: Path) -> Outcome:
        journal = open_sqlite(path)
        try:
            t = new_rig(journal)
            drive(t, ticks=2)
            launched = set(t.cloud.instances)
            self._harm(data, path)
            t.queue.jobs = [job(f"n{i}") for i in range(3)]
            t.cloud.capacity = {}
            report = t.controller.tick()
        finally:
            journal.close()
        grown = set(t.cloud.instances) - launched
        failed = [e for e in report.errors if "journal" in e]
        if failed:
            problem = one_line_naming(failed[0], path)
            if problem:
                return Outcome.wrong(problem)
            if grown and not self._calls_recorded(path, grown):
                return Outcome.wrong("a launch was made while the journal failed, unjournaled")
            return Outcome.rejected(failed[0])
        if data.harm in ("delete", "replace", "overwrite"):
            return Outcome.wrong(f"the journal was {data.harm}d and the tick said nothing")
        return self._restart_finds(path, report.tick, grown)

    def _harm(self, data: MidRun, path: Path) -> None:
        if data.harm in MID_RUN:
            MID_RUN[data.harm](path)
        elif data.harm == "bytes" and data.damage is not None:
            _in_place(data.damage)(path)
        elif data.harm == "sql" and data.damage is not None:
            apply(data.damage, path)

    def _calls_recorded(self, path: Path, grown: set[str]) -> bool:
        with contextlib.suppress(JournalError):
            reopened = open_sqlite(path)
            try:
                recorded = {i for c in reopened.calls() for i in c.instance_ids}
            finally:
                reopened.close()
            return grown <= recorded
        return False

    def _restart_finds(self, path: Path, tick: int, grown: set[str]) -> Outcome:
        """The tick said nothing: a restart refuses the file with one line (the damage is
        found then), or finds the tick and every launch's call in it."""
        try:
            reopened = open_sqlite(path)
        except JournalError as exc:
            problem = one_line_naming(str(exc), path)
            return Outcome.wrong(problem) if problem else Outcome.rejected(str(exc))
        try:
            ticks = {entry.tick for entry in reopened.ticks()}
            recorded = {i for c in reopened.calls() for i in c.instance_ids}
        except JournalError as exc:
            return Outcome.rejected(str(exc))
        finally:
            reopened.close()
        if tick not in ticks:
            return Outcome.wrong(f"tick {tick} said nothing and is not in the journal")
        if not grown <= recorded:
            return Outcome.wrong("a launch is missing from the journal's cloud calls")
        return Outcome.accepted()

    def close(self) -> None:
        """Every input cleans up after itself."""


BOUNDARIES = [ReportJournalBoundary(), RunJournalBoundary(), MidRunJournalBoundary()]
