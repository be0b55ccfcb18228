"""The journal over a DB-API connection: one class, two dialects (SQLite, PostgreSQL).

The journal is the write-ahead log of every cloud call, so a journal that cannot be trusted
stops the start with one line rather than being written on: a file SQLite finds damaged
(``PRAGMA quick_check``), one that cannot be written, tables without the journal's columns, or
a schema version that is not a number this code reads. While the controller runs, every
transaction first checks that the journal is still the one it opened: an SQLite file deleted
or replaced on disk, or a database that no longer carries the journal's identity (overwritten
by another), fails that transaction with a ``JournalError`` (the tick is degraded and said so;
cloud calls, which must be written ahead, are not made) instead of writing into a file nobody
will read again. Rows read back are parsed (``rows``), and no figure that is not a finite
number is ever written.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import secrets
import sqlite3
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple, Protocol

from autoscaler.fleet.team_usage import (
    ONPREM,
    Splitter,
    TickHolders,
    Usage,
    gpu_ms,
    micros,
)
from autoscaler.model.records import ActionRecord, LeadershipLost
from autoscaler.ops.journal import rows
from autoscaler.ops.journal.rows import (
    ActionsRow,
    CallsRow,
    CostsRow,
    CostUnitsRow,
    IdleRow,
    MonthCost,
    RowError,
    Serial1,
    TeamCostsRow,
    TeamUsageRow,
    TicksRow,
    Time1,
    parse_rows,
)
from autoscaler.ops.journal.schema import MIGRATIONS, SCHEMA_VERSION, TABLES
from autoscaler.ops.onprem_idle import IdleNode, idle_gpu_seconds

log = logging.getLogger(__name__)

STARTED = "started"
UNKNOWN = "unknown"
LEADER_TABLE = "gpu_autoscaler_leader"
SCHEMA_LOCK_KEY = 0x6770756A6F75726E  # "gpujourn": the journal's own advisory lock, for its schema


class JournalError(RuntimeError):
    """The journal cannot be opened or written; the message is one line and names the
    database, never its credentials."""


# The tables and columns the code writes and reads: a database that lacks one is not a journal
# this version can use.
COLUMNS = {
    "journal_meta": "key, value",
    "ticks": rows.columns(TicksRow),
    "actions": "incarnation, " + rows.columns(ActionsRow),
    "cloud_calls": rows.columns(CallsRow),
    "instance_costs": rows.columns(CostsRow) + ", usd_micros, gpu_ms, team",
    "onprem_idle": rows.columns(IdleRow),
    "team_usage": rows.columns(TeamUsageRow),
}
IDENTITY_KEY = "journal_id"
SQLITE_MAGIC = b"SQLite format 3\x00"


class _Connection(Protocol):
    def execute(self, sql: str, params: Sequence[Any] = ...) -> Any: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class CloudCall:
    request_id: str
    kind: str
    provider: str
    pool: str | None
    count: int
    token: int
    incarnation: str
    started_at: float
    finished_at: float | None
    outcome: str
    instance_ids: tuple[str, ...]
    detail: str


@dataclass(frozen=True)
class SpendRow:
    instance_id: str
    month: str
    provider: str
    pool: str
    gpus: int
    first_at: float
    last_at: float
    usd: float
    gpu_hours: float
    # whom the instance was bought for (None: no team, or a row written before schema 4)
    team: str | None = None


class Billed(NamedTuple):
    """An instance the cloud bills for at this tick, at its pool's price now (a tuple: a tick
    makes one per instance), and whom it was bought for (``InstanceRecord.team``; None: no
    team), which its cost row keeps."""

    instance_id: str
    provider: str
    pool: str
    gpus: int
    price_per_hour: float
    launched_at: float
    team: str | None = None


@dataclass(frozen=True)
class TickEntry:
    incarnation: str
    tick: int
    token: int
    at: float
    duration_s: float
    outcome: str
    held: str | None
    demand_known: bool
    pending_gpus: int
    instances: int
    cost_per_hour: float
    plan: dict[str, Any]
    clamps: list[dict[str, Any]] = field(default_factory=list)
    # On-prem nodes with GPUs allocated while every GPU on them reads idle, as this tick saw
    # them (``autoscaler.ops.onprem_idle.onprem_idle``; None: the tick could not know). The
    # journal counts them into GPU-seconds since the previous tick it recorded; the nodes are
    # not read back (they are summed per node and day in ``onprem_idle``).
    onprem_idle: tuple[IdleNode, ...] | None = None
    # What the journal counted for the tick, as ``ticks()`` reads it back (None: not known).
    # Not read when writing: the journal counts it from ``onprem_idle``.
    onprem_idle_gpu_s: float | None = None


@dataclass(frozen=True)
class TeamSpan:
    """A team's GPU-milliseconds and micro-dollars at a place (a pool, or on-prem) on one day
    (UTC), over the ticks from ``first_at`` to ``last_at``."""

    team: str
    pool: str
    day: str
    first_at: float
    last_at: float
    gpu_ms: int
    usd_micros: int


@dataclass(frozen=True)
class IdleSpan:
    """A node's on-prem allocated-idle GPU-seconds on one day (UTC), counted by the ticks from
    ``first_at`` to ``last_at``."""

    node: str
    day: str
    first_at: float
    last_at: float
    gpu_s: float


def month_of(at: float) -> str:
    return time.strftime("%Y-%m", time.gmtime(at))


def day_of(at: float) -> str:
    return time.strftime("%Y-%m-%d", time.gmtime(at))


class Journal:
    """Writes from the controller's loop thread; reads from anywhere that opens its own."""

    def __init__(
        self,
        connection: _Connection,
        *,
        placeholder: str,
        id_column: str,
        where: str,
        fenced_by: str | None = None,
        transaction: Callable[..., contextlib.AbstractContextManager[Any]] | None = None,
        serialize_schema: str | None = None,
        file: Path | None = None,
    ) -> None:
        self._db = connection
        self._placeholder = placeholder
        self.where = where
        self._fenced_by = fenced_by
        self._transaction = transaction
        self._last_billed: dict[str, float] = {}
        # When the last tick this process recorded was: the start of the next tick's interval
        # for on-prem idle GPU-seconds (None: no interval yet, so nothing is counted).
        self._last_tick_at: float | None = None
        # The last tick's shares per (team, place): what the metrics count (GPU-ms, micro-$).
        self.last_team_usage: dict[tuple[str, str], Usage] = {}
        self._month: str | None = None
        self._month_usd = 0.0
        self._file = file
        self._file_id = _file_id(file) if file is not None else None
        # This opening's mark in the SQLite file's header (``user_version``): a file overwritten
        # in place shows another. Checked once a checkpoint has put it in the main file.
        self._nonce = secrets.randbelow(2**31 - 1) + 1
        self._nonce_in_file = False
        self._identity: str | None = None
        with self._atomic():
            if serialize_schema is not None:
                self._exec(serialize_schema)
            for statement in TABLES:
                self._exec(statement.format(id=id_column))
            self._exec(
                "INSERT INTO journal_meta (key, value) VALUES (%s, %s) "
                "ON CONFLICT (key) DO NOTHING",
                ("schema_version", str(SCHEMA_VERSION)),
            )
            self._exec(
                "INSERT INTO journal_meta (key, value) VALUES (%s, %s) "
                "ON CONFLICT (key) DO NOTHING",
                (IDENTITY_KEY, uuid.uuid4().hex),
            )
            self._migrate()
            self._check_schema()
            self._identity = self._read_identity()
            if file is not None:
                self._exec(f"PRAGMA user_version = {self._nonce}")
        if file is not None:
            self._exec("PRAGMA wal_checkpoint(TRUNCATE)")
            self._check_still_ours()
        # What the controller reads first, read now: a damaged row stops the start here.
        self._calls("WHERE finished_at IS NULL")
        self.month_spend(time.time())

    def _check_schema(self) -> None:
        """Every table has the columns this code uses, and the schema version is one it
        reads: otherwise this is not a journal to write on."""
        for table, names in COLUMNS.items():
            self._exec(f"SELECT {names} FROM {table} WHERE 1 = 0")
        found = self._fetch("SELECT value FROM journal_meta WHERE key = %s", ("schema_version",))
        try:
            rows.schema_version(found[0][0] if found else str(SCHEMA_VERSION))
        except RowError as exc:
            raise JournalError(f"journal {self.where}: {exc}") from None

    def _migrate(self) -> None:
        """Bring a journal an earlier version wrote up to ``SCHEMA_VERSION``: the columns each
        later version added, where missing, then the new version number, in the transaction
        that opens it (the journal's schema lock held on PostgreSQL). A version that is not a
        number is left for ``_check_schema`` to refuse."""
        found = self._fetch("SELECT value FROM journal_meta WHERE key = %s", ("schema_version",))
        try:
            version = rows.schema_version(found[0][0]) if found else SCHEMA_VERSION
        except RowError:
            return
        if version >= SCHEMA_VERSION:
            return
        for step in range(version + 1, SCHEMA_VERSION + 1):
            for add in MIGRATIONS.get(step, ()):
                if not self._has_column(add.table, add.column):
                    self._exec(f"ALTER TABLE {add.table} ADD COLUMN {add.column} {add.sql_type}")
        self._exec(
            "UPDATE journal_meta SET value = %s WHERE key = %s",
            (str(SCHEMA_VERSION), "schema_version"),
        )
        log.info(
            "journal %s: schema version %d brought up to %d", self.where, version, SCHEMA_VERSION
        )

    def _has_column(self, table: str, column: str) -> bool:
        if self._placeholder == "?":  # SQLite
            sql = "SELECT COUNT(*) FROM pragma_table_info(%s) WHERE name = %s"
            params: tuple[str, ...] = (table, column)
        else:
            sql = (
                "SELECT COUNT(*) FROM information_schema.columns WHERE table_schema = "
                "current_schema() AND table_name = %s AND column_name = %s"
            )
            params = (table, column)
        found = self._fetch(sql, params)
        return bool(found and found[0][0])

    def _read_identity(self) -> str | None:
        found = self._fetch("SELECT value FROM journal_meta WHERE key = %s", (IDENTITY_KEY,))
        return str(found[0][0]) if found else None

    def _check_still_ours(self) -> None:
        """The journal is still the one opened: the SQLite file was not deleted or replaced on
        disk, and the database still carries the identity it had (not overwritten by another
        journal or emptied)."""
        if self._file is not None and not self._same_file(self._file):
            raise JournalError(
                f"the journal {self.where} was deleted, replaced or overwritten while the "
                "controller ran; "
                "nothing more is written to it (cloud calls wait for it): restart the "
                "controller to open the journal at that path again"
            )
        if self._identity is not None and self._read_identity() != self._identity:
            raise JournalError(
                f"the journal {self.where} was overwritten while the controller ran (it is no "
                "longer the journal this controller opened); nothing more is written to it "
                "(cloud calls wait for it): restart the controller to open it again"
            )

    def _finite(self, *figures: tuple[str, float]) -> None:
        """A figure that is not a finite number is never written: NaN or infinity in a price
        would poison the month's sum, and the budget cap with it, for good."""
        for name, value in figures:
            if not math.isfinite(value):
                raise JournalError(
                    f"journal {self.where}: {name} is {value!r}, not a finite number; it is "
                    "never journaled"
                )

    def _same_file(self, path: Path) -> bool:
        """The file at ``path`` is the one opened: same inode, still an SQLite file, and, once
        this opening's mark has reached its header, still carrying that mark."""
        if _file_id(path) != self._file_id:
            return False
        try:
            with path.open("rb") as handle:
                header = handle.read(100)
        except OSError:
            return False
        if len(header) < 100 or not header.startswith(SQLITE_MAGIC):
            return False
        mark = int.from_bytes(header[60:64], "big")
        if mark == self._nonce:
            self._nonce_in_file = True
        return mark == self._nonce or not self._nonce_in_file

    # -- writing ---------------------------------------------------------------------------

    def close_unfinished(self, now: float) -> list[CloudCall]:
        """Calls a killed predecessor started and never finished: marked unknown, returned so
        the first listing can match them with what the cloud has under their request ids."""
        self._finite(("now", now))
        unfinished = self._calls("WHERE finished_at IS NULL")
        with self._atomic():
            for call in unfinished:
                self._exec(
                    "UPDATE cloud_calls SET finished_at = %s, outcome = %s, detail = %s "
                    "WHERE request_id = %s",
                    (
                        now,
                        UNKNOWN,
                        "the controller stopped during the call; what it made is adopted "
                        "from the cloud's listing by its request id",
                        call.request_id,
                    ),
                )
        if unfinished:
            log.warning(
                "%d cloud call(s) were cut short by the last stop: %s",
                len(unfinished),
                ", ".join(c.request_id for c in unfinished),
            )
        return unfinished

    def call_started(
        self,
        request_id: str,
        kind: str,
        provider: str,
        pool: str | None,
        count: int,
        token: int,
        incarnation: str,
        at: float,
    ) -> None:
        """Written before the cloud call; under a fenced journal only while ``token`` is the
        leader's current one, so a deposed leader cannot even start a call."""
        self._finite(("started_at", at))
        values = (
            request_id,
            kind,
            provider,
            pool,
            count,
            token,
            incarnation,
            at,
            STARTED,
            "[]",
            "",
        )
        columns = (
            "request_id, kind, provider, pool, count, token, incarnation, started_at, outcome, "
            "instance_ids, detail"
        )
        marks = ", ".join(["%s"] * len(values))
        with self._atomic():
            if self._fenced_by is None:
                self._exec(
                    f"INSERT INTO cloud_calls ({columns}) VALUES ({marks}) "
                    "ON CONFLICT (request_id) DO NOTHING",
                    values,
                )
                return
            cursor = self._exec(
                f"INSERT INTO cloud_calls ({columns}) SELECT {marks} WHERE EXISTS ("
                f"SELECT 1 FROM {LEADER_TABLE} WHERE name = %s AND token = %s) "
                "ON CONFLICT (request_id) DO NOTHING",
                (*values, self._fenced_by, token),
            )
            if cursor.rowcount == 0 and not self._call_exists(request_id, token):
                raise LeadershipLost(f"fencing token {token} is no longer the leader's")

    def call_finished(
        self,
        request_id: str,
        outcome: str,
        instance_ids: Sequence[str],
        detail: str,
        at: float,
    ) -> None:
        self._finite(("finished_at", at))
        with self._atomic():
            self._exec(
                "UPDATE cloud_calls SET finished_at = %s, outcome = %s, instance_ids = %s, "
                "detail = %s WHERE request_id = %s",
                (at, outcome, json.dumps(list(instance_ids)), detail, request_id),
            )

    def record_tick(
        self,
        entry: TickEntry,
        actions: Sequence[ActionRecord],
        billed: Sequence[Billed],
        held: TickHolders | None = None,
    ) -> dict[str, float]:
        """The tick, its actions and the cost accrued since the last tick, in one transaction;
        returns the dollars accrued per pool. A figure that is not a finite number fails the
        whole tick's record (a NaN or infinite price would poison the month's sum for good).
        ``held`` says whose jobs held each node's GPUs: the accrued cost and GPU-time, and the
        on-prem nodes' GPU-time since the last tick, are split between the teams by it
        (``team_usage``); without it (None) the cloud's goes to the unknown line."""
        self.last_team_usage = {}  # a tick not recorded counts nothing
        self._finite(*_tick_figures(entry, actions, billed))
        splitter = Splitter()
        idle = self._idle_seconds(entry)
        idle_total = None if idle is None else math.fsum(gpu_s for _, gpu_s in idle)
        accrued: dict[str, float] = {}
        month = month_of(entry.at)
        with self._atomic():
            self._exec(
                "INSERT INTO ticks (incarnation, tick, token, at, duration_s, outcome, held, "
                "demand_known, pending_gpus, instances, cost_per_hour, plan, clamps, "
                "onprem_idle_gpu_s) "
                "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
                (
                    entry.incarnation,
                    entry.tick,
                    entry.token,
                    entry.at,
                    entry.duration_s,
                    entry.outcome,
                    entry.held,
                    entry.demand_known,
                    entry.pending_gpus,
                    entry.instances,
                    entry.cost_per_hour,
                    _json(entry.plan),
                    _json(entry.clamps),
                    idle_total,
                ),
            )
            for action in actions:
                self._exec(
                    "INSERT INTO actions (incarnation, tick, token, at, kind, pool, requested, "
                    "done, outcome, detail, request_id, instance_ids, job_id, lost_gpu_s) "
                    "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
                    (
                        entry.incarnation,
                        entry.tick,
                        entry.token,
                        entry.at,
                        action.kind,
                        action.pool,
                        action.requested,
                        action.done,
                        action.outcome,
                        action.detail,
                        action.request_id,
                        json.dumps(list(action.instance_ids)),
                        action.job_id,
                        action.lost_gpu_s,
                    ),
                )
            firsts = self._accrue(billed, entry.at, month, accrued, held, splitter)
            self._attribute_onprem(held, entry.at, splitter)
            usage = splitter.result()
            self._accrue_teams(usage, firsts, entry.at)
            self._accrue_idle(idle or [], entry.at)
        self._note_month_spend(month, sum(accrued.values()))
        self._last_tick_at = entry.at
        self.last_team_usage = usage
        return accrued

    def _attribute_onprem(self, held: TickHolders | None, now: float, splitter: Splitter) -> None:
        """Each on-prem node's GPUs times the time since the previous tick this process
        recorded (none on its first), split between the teams that held them."""
        if held is None or self._last_tick_at is None:
            return
        seconds = max(0.0, now - self._last_tick_at)
        for node in held.onprem:
            splitter.add(ONPREM, Usage(gpu_ms(node.gpus, seconds), 0), node.gpus, node.holders)

    def _accrue_teams(
        self, usage: dict[tuple[str, str], Usage], firsts: dict[str, float], now: float
    ) -> None:
        """One upsert per team, place and day, as one batch."""
        day = day_of(now)
        previous = self._last_tick_at if self._last_tick_at is not None else now
        pending = [
            (team, place, day, min(now, firsts.get(place, previous)), now, u.gpu_ms, u.usd_micros)
            for (team, place), u in sorted(usage.items())
            if u.gpu_ms or u.usd_micros
        ]
        if pending:
            self._exec_many(
                "INSERT INTO team_usage (team, pool, day, first_at, last_at, gpu_ms, usd_micros) "
                "VALUES (%s, %s, %s, %s, %s, %s, %s) "
                "ON CONFLICT (team, pool, day) DO UPDATE SET "
                "first_at = CASE WHEN excluded.first_at < team_usage.first_at "
                "THEN excluded.first_at ELSE team_usage.first_at END, "
                "last_at = CASE WHEN excluded.last_at > team_usage.last_at "
                "THEN excluded.last_at ELSE team_usage.last_at END, "
                "gpu_ms = team_usage.gpu_ms + excluded.gpu_ms, "
                "usd_micros = team_usage.usd_micros + excluded.usd_micros",
                pending,
            )

    def _idle_seconds(self, entry: TickEntry) -> list[tuple[IdleNode, float]] | None:
        """Each idle node's GPU-seconds since the previous tick this process recorded (None:
        the tick could not know)."""
        if entry.onprem_idle is None:
            return None
        return [
            (node, idle_gpu_seconds(node, entry.at, self._last_tick_at))
            for node in entry.onprem_idle
        ]

    def _accrue_idle(self, idle: Sequence[tuple[IdleNode, float]], now: float) -> None:
        """One upsert per node and day with idle GPU-seconds this tick, as one batch."""
        day = day_of(now)
        previous = self._last_tick_at if self._last_tick_at is not None else now
        pending = [
            (node.node, day, min(now, max(node.idle_since, previous)), now, gpu_s)
            for node, gpu_s in idle
            if gpu_s > 0
        ]
        if pending:
            self._exec_many(
                "INSERT INTO onprem_idle (node, day, first_at, last_at, gpu_s) "
                "VALUES (%s, %s, %s, %s, %s) "
                "ON CONFLICT (node, day) DO UPDATE SET "
                "first_at = CASE WHEN excluded.first_at < onprem_idle.first_at "
                "THEN excluded.first_at ELSE onprem_idle.first_at END, "
                "last_at = CASE WHEN excluded.last_at > onprem_idle.last_at "
                "THEN excluded.last_at ELSE onprem_idle.last_at END, "
                "gpu_s = onprem_idle.gpu_s + excluded.gpu_s",
                pending,
            )

    def unbilled(self, billed: Sequence[Billed], now: float) -> float:
        """Dollars these instances have run up since they were last recorded: what the month's
        spend will include once this tick is journaled."""
        return sum(
            node.price_per_hour * max(0.0, now - self._billed_since(node, now)) / 3600.0
            for node in billed
        )

    def _billed_since(self, node: Billed, now: float) -> float:
        since = self._last_billed.get(node.instance_id)
        if since is None:
            since = self._last_billed_in_db(node.instance_id)
            if since is None:
                since = min(node.launched_at, now)
            self._last_billed[node.instance_id] = since
        return since

    def _accrue(
        self,
        billed: Sequence[Billed],
        now: float,
        month: str,
        accrued: dict[str, float],
        held: TickHolders | None,
        splitter: Splitter,
    ) -> dict[str, float]:
        """One upsert per instance and month, sent as one batch: a fleet of ten thousand
        instances is one statement's worth of round trips per tick. Each instance's accrual
        is also counted in whole units and split between the teams by ``splitter``; returns
        the earliest time billed from, per pool."""
        pending = []
        firsts: dict[str, float] = {}
        for node in billed:
            since = self._billed_since(node, now)
            seconds = max(0.0, now - since)
            hours = seconds / 3600.0
            usd = node.price_per_hour * hours
            self._finite((f"the accrued cost of {node.instance_id}", usd))
            amount = Usage(gpu_ms(node.gpus, seconds), micros(usd))
            holders = held.of_instance(node.instance_id) if held is not None else None
            splitter.add(node.pool, amount, node.gpus, holders)
            firsts[node.pool] = min(firsts.get(node.pool, since), since)
            pending.append(
                (
                    node.instance_id,
                    month,
                    node.provider,
                    node.pool,
                    node.gpus,
                    since,
                    now,
                    usd,
                    node.gpus * hours,
                    amount.usd_micros,
                    amount.gpu_ms,
                    node.team,
                )
            )
        if pending:
            self._exec_many(
                "INSERT INTO instance_costs (instance_id, month, provider, pool, gpus, first_at, "
                "last_at, usd, gpu_hours, usd_micros, gpu_ms, team) "
                "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s) "
                "ON CONFLICT (instance_id, month) DO UPDATE SET last_at = excluded.last_at, "
                "usd = instance_costs.usd + excluded.usd, "
                "gpu_hours = instance_costs.gpu_hours + excluded.gpu_hours, "
                "usd_micros = COALESCE(instance_costs.usd_micros, 0) + excluded.usd_micros, "
                "gpu_ms = COALESCE(instance_costs.gpu_ms, 0) + excluded.gpu_ms, "
                # the first team a row is written with stays: whom the instance was bought for
                # does not change, and a restart that lost it (no tag) does not erase it
                "team = COALESCE(instance_costs.team, excluded.team)",
                pending,
            )
        for row in pending:
            accrued[row[3]] = accrued.get(row[3], 0.0) + row[7]
            self._last_billed[row[0]] = now
        return firsts

    def forget(self, instance_ids: Sequence[str]) -> None:
        """Instances no longer billed: stop remembering when they were last billed."""
        for instance_id in instance_ids:
            self._last_billed.pop(instance_id, None)

    # -- reading ---------------------------------------------------------------------------

    def month_spend(self, at: float) -> float:
        """Dollars accrued in ``at``'s calendar month (UTC), all replicas included. Each row
        is parsed: a sum over garbage would be a budget figure made up."""
        month = month_of(at)
        if self._month != month:
            found = self._select(
                MonthCost,
                "instance_costs",
                f"SELECT {rows.columns(MonthCost)} FROM instance_costs WHERE month = %s",
                (month,),
            )
            total = math.fsum(row.usd for row in found)
            self._finite((f"the spend of {month}", total))
            self._month = month
            self._month_usd = total
        return self._month_usd

    def reload(self) -> None:
        """Another replica may have written since we last read (after taking over leadership)."""
        self._month = None
        self._last_billed.clear()
        self._last_tick_at = None

    def calls(self) -> list[CloudCall]:
        return self._calls("")

    def _calls(self, where: str) -> list[CloudCall]:
        found = self._select(
            CallsRow,
            "cloud_calls",
            f"SELECT {rows.columns(CallsRow)} FROM cloud_calls {where} ORDER BY started_at",
        )
        return [
            CloudCall(
                request_id=r.request_id,
                kind=r.kind,
                provider=r.provider,
                pool=r.pool,
                count=r.n,
                token=r.token,
                incarnation=r.incarnation,
                started_at=r.started_at,
                finished_at=r.finished_at,
                outcome=r.outcome,
                instance_ids=tuple(r.instance_ids),
                detail=r.detail,
            )
            for r in found
        ]

    def spend(self, since: float | None = None, until: float | None = None) -> list[SpendRow]:
        """Each instance-month's cost row overlapping the period, with whom the instance was
        bought for (None: no team, or a row written before schema version 4)."""
        found = self._select(
            TeamCostsRow,
            "instance_costs",
            f"SELECT {rows.columns(TeamCostsRow)} FROM instance_costs "
            f"WHERE (last_at >= %s AND first_at <= %s) OR {rows.insane_time('first_at')} "
            f"OR {rows.insane_time('last_at')} ORDER BY first_at",
            _period(since, until),
        )
        return [SpendRow(*r) for r in found]

    def actions(self, since: float | None = None, until: float | None = None) -> list[ActionRow]:
        found = self._select(
            ActionsRow,
            "actions",
            f"SELECT {rows.columns(ActionsRow)} FROM actions "
            f"WHERE (at >= %s AND at <= %s) OR {rows.insane_time('at')} ORDER BY id",
            _period(since, until),
        )
        return [
            ActionRow(
                tick=r.tick,
                token=r.token,
                at=r.at,
                kind=r.kind,
                pool=r.pool,
                requested=r.requested,
                done=r.done,
                outcome=r.outcome,
                detail=r.detail,
                request_id=r.request_id,
                instance_ids=tuple(r.instance_ids),
                job_id=r.job_id,
                lost_gpu_s=r.lost_gpu_s,
            )
            for r in found
        ]

    def ticks(self, since: float | None = None, until: float | None = None) -> list[TickEntry]:
        found = self._select(
            TicksRow,
            "ticks",
            f"SELECT {rows.columns(TicksRow)} FROM ticks "
            f"WHERE (at >= %s AND at <= %s) OR {rows.insane_time('at')} ORDER BY id",
            _period(since, until),
        )
        return [
            TickEntry(
                incarnation=r.incarnation,
                tick=r.tick,
                token=r.token,
                at=r.at,
                duration_s=r.duration_s,
                outcome=r.outcome,
                held=r.held,
                demand_known=r.demand_known,
                pending_gpus=r.pending_gpus,
                instances=r.instances,
                cost_per_hour=r.cost_per_hour,
                plan=r.plan,
                clamps=[dict(c) for c in r.clamps],
                onprem_idle_gpu_s=r.onprem_idle_gpu_s,
            )
            for r in found
        ]

    def onprem_idle(self, since: float | None = None, until: float | None = None) -> list[IdleSpan]:
        """The per node and day sums of on-prem allocated-idle GPU-seconds that overlap the
        period."""
        found = self._select(
            IdleRow,
            "onprem_idle",
            f"SELECT {rows.columns(IdleRow)} FROM onprem_idle "
            f"WHERE (last_at >= %s AND first_at <= %s) OR {rows.insane_time('first_at')} "
            f"OR {rows.insane_time('last_at')} ORDER BY first_at, node",
            _period(since, until),
        )
        return [IdleSpan(*r) for r in found]

    def team_usage(self, since: float | None = None, until: float | None = None) -> list[TeamSpan]:
        """The per team, place and day sums that overlap the period."""
        found = self._select(
            TeamUsageRow,
            "team_usage",
            f"SELECT {rows.columns(TeamUsageRow)} FROM team_usage "
            f"WHERE (last_at >= %s AND first_at <= %s) OR {rows.insane_time('first_at')} "
            f"OR {rows.insane_time('last_at')} ORDER BY first_at, team, pool",
            _period(since, until),
        )
        return [TeamSpan(*r) for r in found]

    def cost_units(self) -> Usage:
        """Every instance's accrued GPU-milliseconds and micro-dollars since schema version 3:
        the fleet total the teams' cloud lines add up to."""
        found = self._select(
            CostUnitsRow,
            "instance_costs",
            f"SELECT {rows.columns(CostUnitsRow)} FROM instance_costs",
        )
        return Usage(sum(r.gpu_ms or 0 for r in found), sum(r.usd_micros or 0 for r in found))

    def close(self) -> None:
        self._db.close()

    # -- plumbing --------------------------------------------------------------------------

    def _note_month_spend(self, month: str, usd: float) -> None:
        if self._month == month:
            self._month_usd += usd

    def _call_exists(self, request_id: str, token: int) -> bool:
        found = self._select(
            Serial1,
            "cloud_calls",
            "SELECT token FROM cloud_calls WHERE request_id = %s",
            (request_id,),
        )
        return bool(found) and found[0].value == token

    def _last_billed_in_db(self, instance_id: str) -> float | None:
        found = self._select(
            Time1,
            "instance_costs",
            "SELECT MAX(last_at) FROM instance_costs WHERE instance_id = %s",
            (instance_id,),
        )
        return found[0].at if found else None

    def _select(
        self, row: type[rows.R], table: str, sql: str, params: Sequence[Any] = ()
    ) -> list[rows.R]:
        """The rows of a query, parsed: a row the controller could not have written is a
        ``JournalError`` naming it."""
        try:
            return parse_rows(row, table, self._fetch(sql, params))
        except RowError as exc:
            raise JournalError(f"journal {self.where}: {exc}") from None

    def _fetch(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        """The rows of a query; a failure while fetching them (text SQLite cannot decode) is
        the journal's error like one while executing."""
        cursor = self._exec(sql, params)
        try:
            found: list[Any] = cursor.fetchall()
        except Exception as exc:
            raise JournalError(f"journal {self.where}: {_reason(exc)}") from exc
        return found

    def _exec(self, sql: str, params: Sequence[Any] = ()) -> Any:
        if self._placeholder != "%s":
            sql = sql.replace("%s", self._placeholder)
        try:
            return self._db.execute(sql, params)
        except LeadershipLost:
            raise
        except Exception as exc:
            raise JournalError(f"journal {self.where}: {_reason(exc)}") from exc

    def _exec_many(self, sql: str, many_rows: Sequence[Sequence[Any]]) -> None:
        if self._placeholder != "%s":
            sql = sql.replace("%s", self._placeholder)
        try:
            many = getattr(self._db, "executemany", None)
            if many is not None:
                many(sql, many_rows)
                return
            with self._db.cursor() as cursor:  # type: ignore[attr-defined]
                cursor.executemany(sql, many_rows)
        except Exception as exc:
            raise JournalError(f"journal {self.where}: {_reason(exc)}") from exc

    @contextlib.contextmanager
    def _atomic(self) -> Iterator[None]:
        if self._transaction is not None:
            with self._transaction():
                self._check_still_ours()
                yield
            return
        self._exec("BEGIN IMMEDIATE")
        try:
            self._check_still_ours()
            yield
        except BaseException:
            with contextlib.suppress(JournalError):  # a damaged file may refuse even this
                self._exec("ROLLBACK")
            raise
        self._exec("COMMIT")


@dataclass(frozen=True)
class ActionRow:
    tick: int
    token: int
    at: float
    kind: str
    pool: str | None
    requested: int
    done: int
    outcome: str
    detail: str
    request_id: str | None
    instance_ids: tuple[str, ...]
    job_id: str | None
    lost_gpu_s: float | None


def _period(since: float | None, until: float | None) -> tuple[float, float]:
    return (
        since if since is not None else float("-inf"),
        until if until is not None else float("inf"),
    )


def _reason(exc: BaseException) -> str:
    """The database's reason on one line (PostgreSQL adds DETAIL and HINT lines)."""
    if isinstance(exc, UnicodeDecodeError):  # SQLite's message quotes bytes of a damaged file
        return "the file is damaged (SQLite's answer about it is not even text)"
    text = str(exc).strip()
    first = text.splitlines()[0] if text else ""
    reason = f"{type(exc).__name__}: {first}" if first else type(exc).__name__
    if "readonly" in first or "unable to open" in first or isinstance(exc, PermissionError):
        reason += " (the controller must be able to write the journal's file and its folder)"
    return reason


def _tick_figures(
    entry: TickEntry, actions: Sequence[ActionRecord], billed: Sequence[Billed]
) -> Iterator[tuple[str, float]]:
    """Every figure a tick writes, named, to be checked before anything is written."""
    yield f"tick {entry.tick}: at", entry.at
    yield f"tick {entry.tick}: duration_s", entry.duration_s
    yield f"tick {entry.tick}: cost_per_hour", entry.cost_per_hour
    for action in actions:
        if action.lost_gpu_s is not None:
            yield f"tick {entry.tick}: {action.kind} lost_gpu_s", action.lost_gpu_s
    for node in billed:
        yield f"tick {entry.tick}: the price of {node.pool}", node.price_per_hour
        yield f"tick {entry.tick}: launched_at of {node.instance_id}", node.launched_at
    for idle in entry.onprem_idle or ():
        yield f"tick {entry.tick}: idle_since of on-prem node {idle.node}", idle.idle_since


def _json(value: Any) -> str:
    """Plans and clamps as JSON; a non-finite number in them becomes null (JSON has none)."""
    try:
        return json.dumps(value, default=str, allow_nan=False)
    except ValueError:
        return json.dumps(_finite_only(value), default=str, allow_nan=False)


def _finite_only(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite_only(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite_only(v) for v in value]
    return value


def _file_id(path: Path) -> tuple[int, int] | None:
    """The file's device and inode: what tells a file deleted or replaced under us."""
    try:
        found = os.stat(path)
    except OSError:
        return None
    return found.st_dev, found.st_ino


def open_sqlite(path: Path) -> Journal:
    """One file in WAL mode: readers never block the writer, and a kill -9 at any instant
    leaves the last committed transaction whole. A file SQLite finds damaged, or one that
    cannot be written, stops here with one line."""
    where = str(path)
    connection: sqlite3.Connection | None = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        connection = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False)
        connection.execute("PRAGMA busy_timeout=5000")
        connection.execute("PRAGMA journal_mode=WAL")
        connection.execute("PRAGMA synchronous=NORMAL")
        damage = [
            " ".join(str(r[0]).split())
            for r in connection.execute("PRAGMA quick_check(3)").fetchall()
        ]
    except (OSError, sqlite3.Error, UnicodeDecodeError) as exc:
        if connection is not None:
            connection.close()
        raise JournalError(f"cannot open the journal {where}: {_reason(exc)}") from exc
    if damage != ["ok"]:
        connection.close()
        raise JournalError(
            f"the journal {where} is damaged ({'; '.join(damage)[:300]}): move it aside and "
            "restore it from a backup (or start without it: a new journal begins the month's "
            "spend at zero)"
        )
    try:
        return Journal(
            connection,
            placeholder="?",
            id_column="INTEGER PRIMARY KEY",
            where=where,
            file=None if where == ":memory:" else path,  # an in-memory one has no file to watch
        )
    except JournalError:
        connection.close()
        raise


def open_postgres(dsn: str, fenced_by: str | None = None) -> Journal:
    """PostgreSQL: shared by replicas; with ``fenced_by`` (the leader lock's name) a cloud call
    is journaled only under the lock's current fencing token."""
    import psycopg
    from psycopg.conninfo import conninfo_to_dict

    try:
        parts = conninfo_to_dict(dsn)
    except psycopg.Error as exc:
        raise JournalError("the PostgreSQL journal's DSN is not valid") from exc
    where = f"postgresql://{parts.get('host', 'localhost')}:{parts.get('port', 5432)}/" + str(
        parts.get("dbname", "")
    )
    try:
        connection = psycopg.connect(dsn, autocommit=True, connect_timeout=10)
    except psycopg.Error as exc:
        raise JournalError(f"cannot open the journal {where}: {type(exc).__name__}") from exc
    try:
        return Journal(
            connection,
            placeholder="%s",
            id_column="BIGSERIAL PRIMARY KEY",
            where=where,
            fenced_by=fenced_by,
            transaction=connection.transaction,
            # Replicas starting together would race in CREATE TABLE IF NOT EXISTS (PostgreSQL
            # then fails one of them on its catalog's unique index): one creates, the others
            # wait.
            serialize_schema=f"SELECT pg_advisory_xact_lock({SCHEMA_LOCK_KEY})",
        )
    except JournalError:
        connection.close()
        raise


def open_journal(
    sqlite_path: Path | None = None, postgres_dsn: str | None = None, fenced_by: str | None = None
) -> Journal:
    if postgres_dsn:
        return open_postgres(postgres_dsn, fenced_by)
    if sqlite_path is None:
        raise JournalError("no journal configured")
    return open_sqlite(sqlite_path)
