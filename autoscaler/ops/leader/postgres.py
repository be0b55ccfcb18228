"""The leader lock for replicas whose journal lives in PostgreSQL.

Mutual exclusion comes from a session-level advisory lock: PostgreSQL grants it to one session at
a time and frees it the moment that session ends, so a replica killed with SIGKILL (its socket
closes) hands over at once. The fencing token and the lease live in one row of
``gpu_autoscaler_leader``, written only by the session that holds the advisory lock: the token
grows by one with every change of leader, ``renewed_at`` is the database's clock at the last
renewal, ``backend_pid`` the holder's session.

A session that is alive but no longer renewing (a paused or hung replica, or one cut off by the
network) keeps its advisory lock forever, so a standby that finds the lease older than
``lease_seconds`` by the database's clock (replicas' clocks never matter) terminates that session
with ``pg_terminate_backend``; PostgreSQL then frees the lock and the standby takes it with the
next token. The old leader, when it runs again, finds its connection gone and its token stale:
``check`` raises ``LeadershipLost`` because it asks the database whether this very session still
holds the advisory lock and the row under that token, within the lease.

Replicas must log in as the same role (or one that is a member of ``pg_signal_backend``): only
then may one terminate another's session and read its activity.
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
import socket
import threading
from typing import TYPE_CHECKING, Any

from autoscaler.model.errors import InputError, describe
from autoscaler.model.records import LeadershipLost

if TYPE_CHECKING:
    import psycopg

log = logging.getLogger(__name__)

TABLE = "gpu_autoscaler_leader"

_CREATE_TABLE = f"""
CREATE TABLE IF NOT EXISTS {TABLE} (
    name text PRIMARY KEY,
    token bigint NOT NULL,
    holder text NOT NULL,
    renewed_at timestamptz NOT NULL,
    backend_pid int NOT NULL
)"""

# The advisory lock as pg_locks shows it: a bigint key is split into classid (high 32 bits) and
# objid (low 32 bits) with objsubid 1, per database.
_ADVISORY = """
    locks.locktype = 'advisory'
    AND locks.database = (SELECT oid FROM pg_database WHERE datname = current_database())
    AND locks.classid::bigint = %(classid)s AND locks.objid::bigint = %(objid)s
    AND locks.objsubid = 1 AND locks.granted"""

_WE_HOLD = (
    f"EXISTS (SELECT 1 FROM pg_locks AS locks WHERE {_ADVISORY}\n AND locks.pid = pg_backend_pid())"
)

_RENEW = f"""
UPDATE {TABLE} SET renewed_at = now()
WHERE name = %(name)s AND token = %(token)s AND backend_pid = pg_backend_pid() AND {_WE_HOLD}"""

_TAKE = f"""
INSERT INTO {TABLE} AS leader (name, token, holder, renewed_at, backend_pid)
VALUES (%(name)s, 1, %(holder)s, now(), pg_backend_pid())
ON CONFLICT (name) DO UPDATE SET token = leader.token + 1, holder = EXCLUDED.holder,
    renewed_at = now(), backend_pid = EXCLUDED.backend_pid
RETURNING token"""

_CHECK = f"""
SELECT EXISTS (
    SELECT 1 FROM {TABLE}
    WHERE name = %(name)s AND token = %(token)s AND backend_pid = pg_backend_pid()
      AND renewed_at > now() - make_interval(secs => %(lease)s)
) AND {_WE_HOLD}"""

_LEASE_ROW = f"""
SELECT backend_pid, holder, renewed_at < now() - make_interval(secs => %(lease)s)
FROM {TABLE} WHERE name = %(name)s FOR UPDATE"""

_LOCK_HOLDER = f"""
SELECT locks.pid, activity.state_change < now() - make_interval(secs => %(lease)s)
FROM pg_locks AS locks LEFT JOIN pg_stat_activity AS activity ON activity.pid = locks.pid
WHERE {_ADVISORY}"""


def advisory_key(name: str) -> int:
    """A stable non-negative 63-bit key, namespaced so other applications' keys do not collide."""
    digest = hashlib.blake2b(f"gpu-autoscaler-leader:{name}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> 1


class PostgresLeaderLock:
    """A ``LeaderLock`` on a PostgreSQL advisory lock, fenced by a token row (see module doc)."""

    def __init__(
        self,
        dsn: str,
        name: str = "gpu-autoscaler",
        identity: str | None = None,
        lease_seconds: float = 15.0,
    ) -> None:
        if not name:
            raise InputError("leader lock", "must not be empty", field="name")
        if not (math.isfinite(lease_seconds) and lease_seconds > 0):
            raise InputError(
                "leader lock", "must be a positive number of seconds", field="lease_seconds"
            )
        self._dsn = dsn
        self._target, self._password = _describe_target(dsn)
        self.name = name
        self.identity = identity or f"{socket.gethostname()}-{os.getpid()}"
        self.lease_seconds = float(lease_seconds)
        key = advisory_key(name)
        self._key = key
        self._lock_params = {"classid": key >> 32, "objid": key & 0xFFFFFFFF}
        # One operation may take this long; a takeover waits this long for the old session to end.
        self._operation_s = min(max(self.lease_seconds / 2, 0.5), 5.0)
        self._mutex = threading.Lock()
        self._connection: psycopg.Connection[tuple[Any, ...]] | None = None
        self._token: int | None = None

    def __repr__(self) -> str:
        return f"PostgresLeaderLock({self.name!r} at {self._target}, identity={self.identity!r})"

    def acquire(self) -> int | None:
        import psycopg

        with self._mutex:
            for _attempt in range(2):
                connection, opened_now = self._connect()
                if connection is None:
                    return None
                try:
                    return self._acquire_on(connection)
                except psycopg.Error as exc:
                    self._drop_connection(exc)
                    if opened_now:
                        return None
            return None

    def check(self, token: int) -> None:
        import psycopg

        with self._mutex:
            lost = LeadershipLost(
                f"leader lock {self.name!r}: token {token} is not held by {self.identity}"
            )
            connection = self._connection
            if self._token is None or token != self._token or connection is None:
                raise lost
            try:
                row = connection.execute(_CHECK, self._params(token=token)).fetchone()
            except psycopg.Error as exc:
                self._drop_connection(exc)
                raise lost from None
            if row is None or row[0] is not True:
                raise lost

    def release(self) -> None:
        import psycopg

        with self._mutex:
            connection, self._connection = self._connection, None
            held, self._token = self._token, None
            if connection is None:
                return
            try:
                if held is not None:
                    connection.execute("SELECT pg_advisory_unlock_all()")
                    log.info(
                        "leader lock %r released by %s (token %d)", self.name, self.identity, held
                    )
            except psycopg.Error:
                pass  # closing the session below frees the lock all the same
            finally:
                connection.close()

    def _acquire_on(self, connection: psycopg.Connection[tuple[Any, ...]]) -> int | None:
        if self._token is not None:
            renewed = connection.execute(_RENEW, self._params(token=self._token))
            if renewed.rowcount == 1:
                return self._token
            log.warning(
                "leader lock %r: %s lost leadership (token %d was taken over)",
                self.name, self.identity, self._token,
            )  # fmt: skip
            self._token = None
            connection.execute("SELECT pg_advisory_unlock_all()")
            return None
        token = self._take(connection)
        if token is None and self._end_stale_holder(connection):
            token = self._take(connection)
        return token

    def _take(self, connection: psycopg.Connection[tuple[Any, ...]]) -> int | None:
        granted = connection.execute("SELECT pg_try_advisory_lock(%s)", [self._key]).fetchone()
        if granted is None or granted[0] is not True:
            return None
        row = connection.execute(_TAKE, self._params(holder=self.identity)).fetchone()
        if row is None:  # pragma: no cover - INSERT ... RETURNING always returns the row
            raise LeadershipLost(f"leader lock {self.name!r}: no token row came back")
        self._token = int(row[0])
        log.info("leader lock %r taken by %s with token %d", self.name, self.identity, self._token)
        return self._token

    def _end_stale_holder(self, connection: psycopg.Connection[tuple[Any, ...]]) -> bool:
        """Terminate the holder's session when its lease has run out; True when it ended.

        The lease row is locked first, so a renewal racing with us either commits before (and we
        see a fresh lease and leave it be) or waits until we are done. The session terminated is
        the one PostgreSQL says holds the advisory lock, never merely the pid in the row, which
        may be long gone (and reused). A holder that took the lock but never wrote its row (hung
        between the two) is judged by how long its session has been idle.
        """
        from psycopg import errors

        with connection.transaction():
            lease = connection.execute(_LEASE_ROW, self._params()).fetchone()
            holder = connection.execute(_LOCK_HOLDER, self._params()).fetchone()
            if holder is None:
                return True  # freed meanwhile: try again at once
            holder_pid, idle_too_long = int(holder[0]), holder[1] is True
            if lease is not None and int(lease[0]) == holder_pid:
                stale, described = lease[2] is True, f"{lease[1]} (session {holder_pid})"
            else:
                stale, described = idle_too_long, f"session {holder_pid} (no lease written)"
            if not stale:
                return False
            log.warning(
                "leader lock %r: lease of %s ran out; %s ends that session and takes over",
                self.name, described, self.identity,
            )  # fmt: skip
            try:
                with connection.transaction():
                    ended = connection.execute(
                        "SELECT pg_terminate_backend(%s, %s)",
                        [holder_pid, int(self._operation_s * 1000)],
                    ).fetchone()
            except errors.InsufficientPrivilege:
                log.error(
                    "leader lock %r: %s may not end the session of another role; log every "
                    "replica in as the same role or grant it pg_signal_backend",
                    self.name, self.identity,
                )  # fmt: skip
                return False
        return ended is not None and ended[0] is True

    def _connect(self) -> tuple[psycopg.Connection[tuple[Any, ...]] | None, bool]:
        """The lock's own autocommit session, opened (and the table made) when there is none."""
        import psycopg

        if self._connection is not None and not self._connection.closed:
            return self._connection, False
        self._connection = None
        self._token = None  # a new session holds nothing: leadership only comes through _take
        try:
            connection = psycopg.connect(
                self._dsn,
                autocommit=True,
                connect_timeout=max(2, math.ceil(self._operation_s * 2)),
                application_name=f"gpu-autoscaler leader {self.identity}"[:63],
                keepalives=1,
                keepalives_idle=max(1, int(self.lease_seconds / 3)),
                keepalives_interval=1,
                keepalives_count=3,
                tcp_user_timeout=int(self._operation_s * 2000),
            )
        except psycopg.Error as exc:
            log.warning(
                "leader lock %r: cannot reach PostgreSQL at %s: %s",
                self.name, self._target, self._redact(describe(exc)),
            )  # fmt: skip
            return None, True
        try:
            timeout_ms = int(self._operation_s * 2000)
            connection.execute(f"SET statement_timeout = {timeout_ms}")
            self._ensure_table(connection)
        except psycopg.Error as exc:
            log.warning(
                "leader lock %r: cannot prepare %s at %s: %s",
                self.name, TABLE, self._target, self._redact(describe(exc)),
            )  # fmt: skip
            connection.close()
            return None, True
        self._connection = connection
        return connection, True

    def _ensure_table(self, connection: psycopg.Connection[tuple[Any, ...]]) -> None:
        """Create the lease table once, even when several replicas start at the same moment.

        Concurrent ``CREATE TABLE IF NOT EXISTS`` can still fail on the catalog's unique index, so
        creation is serialised by a transaction-scoped advisory lock; the existence test comes
        first so a role without CREATE on the schema works once the table is there.
        """
        exists = connection.execute("SELECT to_regclass(%s) IS NOT NULL", [TABLE]).fetchone()
        if exists is not None and exists[0] is True:
            return
        with connection.transaction():
            connection.execute(
                "SELECT pg_advisory_xact_lock(%s)", [advisory_key("\x00create-table")]
            )
            connection.execute(_CREATE_TABLE)

    def _drop_connection(self, exc: BaseException) -> None:
        if self._token is not None:
            log.warning(
                "leader lock %r: %s lost leadership (token %d) with its session: %s",
                self.name, self.identity, self._token, self._redact(describe(exc)),
            )  # fmt: skip
        self._token = None
        connection, self._connection = self._connection, None
        if connection is not None:
            connection.close()

    def _params(self, **extra: object) -> dict[str, object]:
        return {"name": self.name, "lease": self.lease_seconds, **self._lock_params, **extra}

    def _redact(self, text: str) -> str:
        return text.replace(self._password, "***") if self._password else text


def _describe_target(dsn: str) -> tuple[str, str | None]:
    """``host:port/dbname`` for logs, and the password, kept only to scrub it from messages."""
    try:
        from psycopg.conninfo import conninfo_to_dict
    except ImportError:
        raise InputError(
            "leader lock",
            "the PostgreSQL lock needs psycopg: pip install 'hybrid-gpu-autoscaler[postgres]'",
            field="dsn",
        ) from None
    try:
        parts = conninfo_to_dict(dsn)
    except Exception:
        # libpq's message quotes the string it could not parse, password and all.
        raise InputError(
            "leader lock", "is not a PostgreSQL connection string or URL", field="dsn"
        ) from None
    host = str(parts.get("host") or parts.get("hostaddr") or "localhost")
    port = str(parts.get("port") or "5432")
    dbname = str(parts.get("dbname") or parts.get("user") or "")
    password = parts.get("password")
    return f"{host}:{port}/{dbname}", str(password) if password else None
