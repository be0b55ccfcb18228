"""The journal over a DB-API connection: one class, two dialects (SQLite, PostgreSQL)."""

from __future__ import annotations

import contextlib
import json
import logging
import sqlite3
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple, Protocol

from autoscaler.act import ActionRecord
from autoscaler.journal.schema import SCHEMA_VERSION, TABLES
from autoscaler.leader import LeadershipLost

log = logging.getLogger(__name__)

STARTED = "started"
UNKNOWN = "unknown"
LEADER_TABLE = "gpu_autoscaler_leader"
SCHEMA_LOCK_KEY = 0x6770756A6F75726E  # "gpujourn": the journal's own advisory lock, for its schema


class JournalError(RuntimeError):
    """The journal cannot be opened or written; the message names the database, never its
    credentials."""


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


class Billed(NamedTuple):
    """An instance the cloud bills for at this tick, at its pool's price now (a tuple: a tick
    makes one per instance)."""

    instance_id: str
    provider: str
    pool: str
    gpus: int
    price_per_hour: float
    launched_at: float


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


def month_of(at: float) -> str:
    return time.strftime("%Y-%m", time.gmtime(at))


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
    ) -> None:
        self._db = connection
        self._placeholder = placeholder
        self.where = where
        self._fenced_by = fenced_by
        self._transaction = transaction
        self._last_billed: dict[str, float] = {}
        self._month: str | None = None
        self._month_usd = 0.0
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

    # -- writing ---------------------------------------------------------------------------

    def close_unfinished(self, now: float) -> list[CloudCall]:
        """Calls a killed predecessor started and never finished: marked unknown, returned so
        the first listing can match them with what the cloud has under their request ids."""
        unfinished = [c for c in self.calls() if c.finished_at is None]
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
        with self._atomic():
            self._exec(
                "UPDATE cloud_calls SET finished_at = %s, outcome = %s, instance_ids = %s, "
                "detail = %s WHERE request_id = %s",
                (at, outcome, json.dumps(list(instance_ids)), detail, request_id),
            )

    def record_tick(
        self, entry: TickEntry, actions: Sequence[ActionRecord], billed: Sequence[Billed]
    ) -> dict[str, float]:
        """The tick, its actions and the cost accrued since the last tick, in one transaction;
        returns the dollars accrued per pool."""
        accrued: dict[str, float] = {}
        month = month_of(entry.at)
        with self._atomic():
            self._exec(
                "INSERT INTO ticks (incarnation, tick, token, at, duration_s, outcome, held, "
                "demand_known, pending_gpus, instances, cost_per_hour, plan, clamps) "
                "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
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
                    json.dumps(entry.plan, default=str),
                    json.dumps(entry.clamps, default=str),
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
            self._accrue(billed, entry.at, month, accrued)
        self._note_month_spend(month, sum(accrued.values()))
        return accrued

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
        self, billed: Sequence[Billed], now: float, month: str, accrued: dict[str, float]
    ) -> None:
        """One upsert per instance and month, sent as one batch: a fleet of ten thousand
        instances is one statement's worth of round trips per tick."""
        rows = []
        for node in billed:
            since = self._billed_since(node, now)
            hours = max(0.0, now - since) / 3600.0
            usd = node.price_per_hour * hours
            accrued[node.pool] = accrued.get(node.pool, 0.0) + usd
            rows.append(
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
                )
            )
            self._last_billed[node.instance_id] = now
        if rows:
            self._exec_many(
                "INSERT INTO instance_costs (instance_id, month, provider, pool, gpus, first_at, "
                "last_at, usd, gpu_hours) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s) "
                "ON CONFLICT (instance_id, month) DO UPDATE SET last_at = excluded.last_at, "
                "usd = instance_costs.usd + excluded.usd, "
                "gpu_hours = instance_costs.gpu_hours + excluded.gpu_hours",
                rows,
            )

    def forget(self, instance_ids: Sequence[str]) -> None:
        """Instances no longer billed: stop remembering when they were last billed."""
        for instance_id in instance_ids:
            self._last_billed.pop(instance_id, None)

    # -- reading ---------------------------------------------------------------------------

    def month_spend(self, at: float) -> float:
        """Dollars accrued in ``at``'s calendar month (UTC), all replicas included."""
        month = month_of(at)
        if self._month != month:
            row = self._exec(
                "SELECT COALESCE(SUM(usd), 0) FROM instance_costs WHERE month = %s", (month,)
            ).fetchone()
            self._month = month
            self._month_usd = float(row[0])
        return self._month_usd

    def reload(self) -> None:
        """Another replica may have written since we last read (after taking over leadership)."""
        self._month = None
        self._last_billed.clear()

    def calls(self) -> list[CloudCall]:
        rows = self._exec(
            "SELECT request_id, kind, provider, pool, count, token, incarnation, started_at, "
            "finished_at, outcome, instance_ids, detail FROM cloud_calls ORDER BY started_at"
        ).fetchall()
        return [
            CloudCall(
                request_id=r[0],
                kind=r[1],
                provider=r[2],
                pool=r[3],
                count=int(r[4]),
                token=int(r[5]),
                incarnation=r[6],
                started_at=float(r[7]),
                finished_at=None if r[8] is None else float(r[8]),
                outcome=r[9],
                instance_ids=tuple(json.loads(r[10])),
                detail=r[11],
            )
            for r in rows
        ]

    def spend(self, since: float | None = None, until: float | None = None) -> list[SpendRow]:
        rows = self._exec(
            "SELECT instance_id, month, provider, pool, gpus, first_at, last_at, usd, gpu_hours "
            "FROM instance_costs WHERE last_at >= %s AND first_at <= %s ORDER BY first_at",
            (since if since is not None else float("-inf"), until or float("inf")),
        ).fetchall()
        return [
            SpendRow(r[0], r[1], r[2], r[3], int(r[4]), float(r[5]), float(r[6]), float(r[7]),
                     float(r[8]))
            for r in rows
        ]  # fmt: skip

    def actions(self, since: float | None = None, until: float | None = None) -> list[ActionRow]:
        rows = self._exec(
            "SELECT tick, token, at, kind, pool, requested, done, outcome, detail, request_id, "
            "instance_ids, job_id, lost_gpu_s FROM actions WHERE at >= %s AND at <= %s "
            "ORDER BY id",
            (since if since is not None else float("-inf"), until or float("inf")),
        ).fetchall()
        return [
            ActionRow(
                tick=int(r[0]),
                token=int(r[1]),
                at=float(r[2]),
                kind=r[3],
                pool=r[4],
                requested=int(r[5]),
                done=int(r[6]),
                outcome=r[7],
                detail=r[8],
                request_id=r[9],
                instance_ids=tuple(json.loads(r[10])),
                job_id=r[11],
                lost_gpu_s=r[12],
            )
            for r in rows
        ]

    def ticks(self, since: float | None = None, until: float | None = None) -> list[TickEntry]:
        rows = self._exec(
            "SELECT incarnation, tick, token, at, duration_s, outcome, held, demand_known, "
            "pending_gpus, instances, cost_per_hour, plan, clamps FROM ticks "
            "WHERE at >= %s AND at <= %s ORDER BY id",
            (since if since is not None else float("-inf"), until or float("inf")),
        ).fetchall()
        return [
            TickEntry(
                incarnation=r[0],
                tick=int(r[1]),
                token=int(r[2]),
                at=float(r[3]),
                duration_s=float(r[4]),
                outcome=r[5],
                held=r[6],
                demand_known=bool(r[7]),
                pending_gpus=int(r[8]),
                instances=int(r[9]),
                cost_per_hour=float(r[10]),
                plan=json.loads(r[11]),
                clamps=json.loads(r[12]),
            )
            for r in rows
        ]

    def close(self) -> None:
        self._db.close()

    # -- plumbing --------------------------------------------------------------------------

    def _note_month_spend(self, month: str, usd: float) -> None:
        if self._month == month:
            self._month_usd += usd

    def _call_exists(self, request_id: str, token: int) -> bool:
        row = self._exec(
            "SELECT token FROM cloud_calls WHERE request_id = %s", (request_id,)
        ).fetchone()
        return row is not None and int(row[0]) == token

    def _last_billed_in_db(self, instance_id: str) -> float | None:
        row = self._exec(
            "SELECT MAX(last_at) FROM instance_costs WHERE instance_id = %s", (instance_id,)
        ).fetchone()
        return None if row is None or row[0] is None else float(row[0])

    def _exec(self, sql: str, params: Sequence[Any] = ()) -> Any:
        if self._placeholder != "%s":
            sql = sql.replace("%s", self._placeholder)
        try:
            return self._db.execute(sql, params)
        except LeadershipLost:
            raise
        except Exception as exc:
            raise JournalError(f"journal {self.where}: {type(exc).__name__}: {exc}") from exc

    def _exec_many(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        if self._placeholder != "%s":
            sql = sql.replace("%s", self._placeholder)
        try:
            many = getattr(self._db, "executemany", None)
            if many is not None:
                many(sql, rows)
                return
            with self._db.cursor() as cursor:  # type: ignore[attr-defined]
                cursor.executemany(sql, rows)
        except Exception as exc:
            raise JournalError(f"journal {self.where}: {type(exc).__name__}: {exc}") from exc

    @contextlib.contextmanager
    def _atomic(self) -> Iterator[None]:
        if self._transaction is not None:
            with self._transaction():
                yield
            return
        self._exec("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
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


def open_sqlite(path: Path) -> Journal:
    """One file in WAL mode: readers never block the writer, and a kill -9 at any instant
    leaves the last committed transaction whole."""
    where = str(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        connection = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False)
        connection.execute("PRAGMA journal_mode=WAL")
        connection.execute("PRAGMA synchronous=NORMAL")
        connection.execute("PRAGMA busy_timeout=5000")
    except (OSError, sqlite3.Error) as exc:
        raise JournalError(f"cannot open the journal {where}: {exc}") from exc
    return Journal(connection, placeholder="?", id_column="INTEGER PRIMARY KEY", where=where)


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
    return Journal(
        connection,
        placeholder="%s",
        id_column="BIGSERIAL PRIMARY KEY",
        where=where,
        fenced_by=fenced_by,
        transaction=connection.transaction,
        # Replicas starting together would race in CREATE TABLE IF NOT EXISTS (PostgreSQL then
        # fails one of them on its catalog's unique index): one creates, the others wait.
        serialize_schema=f"SELECT pg_advisory_xact_lock({SCHEMA_LOCK_KEY})",
    )


def open_journal(
    sqlite_path: Path | None = None, postgres_dsn: str | None = None, fenced_by: str | None = None
) -> Journal:
    if postgres_dsn:
        return open_postgres(postgres_dsn, fenced_by)
    if sqlite_path is None:
        raise JournalError("no journal configured")
    return open_sqlite(sqlite_path)
