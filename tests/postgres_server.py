"""A real PostgreSQL (Debian's) on a free loopback port, one cluster per test session and worker.

initdb and postgres refuse to run as root, so when the tests run as root the cluster lives in a
temporary directory owned by the ``postgres`` user and every server command runs through
``runuser -u postgres``. The directory is made with ``mkdtemp`` under /tmp rather than pytest's
tmp_path, whose root-only parent the postgres user cannot enter.

Tests connect over TCP as a password-authenticated login role that is not a superuser, the way a
controller would; the fixture itself administers the cluster as ``postgres`` over a private Unix
socket (``trust``, reachable only through the socket directory). Durability is off (fsync,
synchronous_commit, full_page_writes) because nothing here needs to survive a crash.
The server is stopped with ``pg_ctl stop -m immediate``, then by its pid, and its directory removed.
"""

from __future__ import annotations

import itertools
import math
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psycopg
import pytest
from psycopg import sql
from waits import bound

READY_WITHIN_S = 60
ROLE = "autoscaler"
DATABASE = "autoscaler"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def server_binaries() -> Path:
    """The newest installed PostgreSQL's bin directory (Debian keeps them off PATH)."""
    found = sorted(
        Path("/usr/lib/postgresql").glob("*/bin/initdb"),
        key=lambda path: int(path.parent.parent.name) if path.parent.parent.name.isdigit() else 0,
    )
    if found:
        return found[-1].parent
    on_path = shutil.which("initdb")
    if on_path is None:
        raise RuntimeError("PostgreSQL server binaries not found (apt-get install postgresql)")
    return Path(on_path).parent


def _as_postgres(command: list[str]) -> list[str]:
    return ["runuser", "-u", "postgres", "--", *command] if os.geteuid() == 0 else command


def _give_to_postgres(path: Path) -> None:
    if os.geteuid() == 0:
        shutil.chown(path, "postgres", "postgres")


@dataclass
class PostgresServer:
    root: Path
    password: str = field(default_factory=lambda: secrets.token_urlsafe(18))
    port: int = 0
    postmaster_pid: int | None = None
    _names: Iterator[int] = field(default_factory=itertools.count)

    @property
    def data(self) -> Path:
        return self.root / "data"

    @property
    def sockets(self) -> Path:
        return self.root / "sock"

    @property
    def logfile(self) -> Path:
        return self.root / "postgres.log"

    @property
    def dsn(self) -> str:
        """The shared database of the session, as the unprivileged login role."""
        return self.dsn_for(DATABASE)

    def dsn_for(self, database: str) -> str:
        return f"postgresql://{ROLE}:{self.password}@127.0.0.1:{self.port}/{database}"

    def admin(self) -> psycopg.Connection[tuple[object, ...]]:
        """A superuser connection over the private socket, for setting the cluster up."""
        return psycopg.connect(
            host=str(self.sockets), port=self.port, user="postgres", dbname="postgres",
            autocommit=True, connect_timeout=math.ceil(bound(30)),
        )  # fmt: skip

    def fresh_database(self, name: str) -> str:
        """A new empty database owned by the login role; ``name`` is made unique and safe."""
        stem = re.sub(r"[^a-z0-9_]", "_", name.lower())[:40].strip("_") or "db"
        database = f"{stem}_{next(self._names)}"
        with self.admin() as connection:
            connection.execute(
                sql.SQL("CREATE DATABASE {} OWNER {}").format(
                    sql.Identifier(database), sql.Identifier(ROLE)
                )
            )
        return self.dsn_for(database)

    def initdb(self) -> None:
        for path in (self.root, self.sockets):
            path.mkdir(mode=0o700, exist_ok=True)
            _give_to_postgres(path)
        subprocess.run(
            _as_postgres([
                str(server_binaries() / "initdb"), "-D", str(self.data), "-U", "postgres",
                "--auth-local=trust", "--auth-host=scram-sha-256", "--no-sync",
                "--encoding=UTF8", "--locale=C",
            ]),
            check=True, capture_output=True, timeout=bound(120),
        )  # fmt: skip
        settings = (
            "\nlisten_addresses = '127.0.0.1'\n"
            f"unix_socket_directories = '{self.sockets}'\n"
            "fsync = off\nsynchronous_commit = off\nfull_page_writes = off\n"
            "max_connections = 200\nshared_buffers = 32MB\n"
        )
        with (self.data / "postgresql.conf").open("a") as conf:
            conf.write(settings)

    def start(self) -> None:
        self.port = free_port()
        ready_s = math.ceil(bound(READY_WITHIN_S))
        done = subprocess.run(
            _as_postgres([
                str(server_binaries() / "pg_ctl"), "-D", str(self.data), "-l", str(self.logfile),
                "-o", f"-p {self.port}", "-w", "-t", str(ready_s), "start",
            ]),
            capture_output=True, text=True, timeout=ready_s + 10, check=False,
        )  # fmt: skip
        pidfile = self.data / "postmaster.pid"
        if pidfile.exists():
            self.postmaster_pid = int(pidfile.read_text().split("\n", 1)[0])
        if done.returncode != 0:
            log = self.logfile.read_text(errors="replace") if self.logfile.exists() else ""
            raise RuntimeError(f"postgres on {self.port} did not start:\n{done.stderr}\n{log}")

    def create_login_role(self) -> None:
        with self.admin() as connection:
            connection.execute(
                sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(
                    sql.Identifier(ROLE), sql.Literal(self.password)
                )
            )
            connection.execute(
                sql.SQL("CREATE DATABASE {} OWNER {}").format(
                    sql.Identifier(DATABASE), sql.Identifier(ROLE)
                )
            )

    def stop(self) -> None:
        subprocess.run(
            _as_postgres([str(server_binaries() / "pg_ctl"), "-D", str(self.data),
                          "-m", "immediate", "-w", "-t", str(math.ceil(bound(10))), "stop"]),
            capture_output=True, timeout=bound(30), check=False,
        )  # fmt: skip
        if self.postmaster_pid is not None and _alive(self.postmaster_pid):
            os.kill(self.postmaster_pid, signal.SIGKILL)
            deadline = time.monotonic() + bound(10)
            while _alive(self.postmaster_pid) and time.monotonic() < deadline:
                time.sleep(0.02)
        self.postmaster_pid = None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie child of ours would still answer; the postmaster is pg_ctl's, not ours.
    return True


def _started() -> PostgresServer:
    server = PostgresServer(Path(tempfile.mkdtemp(prefix="pg-")))
    try:
        server.initdb()
        for _attempt in range(3):
            try:
                server.start()
                break
            except RuntimeError:
                server.stop()
        else:
            raise RuntimeError("postgres did not start on any of three free ports")
        server.create_login_role()
    except BaseException:
        server.stop()
        shutil.rmtree(server.root, ignore_errors=True)
        raise
    return server


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    server = _started()
    yield server
    server.stop()
    shutil.rmtree(server.root, ignore_errors=True)


@pytest.fixture
def postgres_dsn(postgres: PostgresServer, request: pytest.FixtureRequest) -> str:
    """A new empty database for this test alone, as the unprivileged login role."""
    return postgres.fresh_database(request.node.name)
