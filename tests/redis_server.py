"""A real redis-server (Debian's) on a free loopback port, started per test session and worker.

It daemonizes with a pid file, keeps nothing on disk (``--save ''``, no AOF) and is stopped with
``SHUTDOWN NOSAVE``, then by its pid if it is still there.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis
from waits import bound

READY_WITHIN_S = 60.0


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclass
class RedisServer:
    port: int
    directory: Path
    password: str | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def pidfile(self) -> Path:
        return self.directory / "redis.pid"

    def client(self) -> redis.Redis:
        return redis.Redis(
            host="127.0.0.1", port=self.port, password=self.password, decode_responses=True
        )

    def start(self) -> None:
        command = [
            "redis-server",
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--daemonize", "yes",
            "--pidfile", str(self.pidfile),
            "--logfile", str(self.directory / "redis.log"),
            "--dir", str(self.directory),
            "--save", "",
            "--appendonly", "no",
        ]  # fmt: skip
        if self.password is not None:
            command += ["--requirepass", self.password]
        subprocess.run(command, check=True, capture_output=True, timeout=bound(60))
        deadline = time.monotonic() + bound(READY_WITHIN_S)
        while True:
            try:
                self.client().ping()
                return
            except redis.ConnectionError:
                if time.monotonic() > deadline:
                    log = (self.directory / "redis.log").read_text(errors="replace")
                    raise RuntimeError(
                        f"redis-server on {self.port} never answered:\n{log}"
                    ) from None
                time.sleep(0.02)

    def stop(self) -> None:
        env = dict(os.environ)
        if self.password is not None:
            env["REDISCLI_AUTH"] = self.password
        subprocess.run(
            ["redis-cli", "-p", str(self.port), "shutdown", "nosave"],
            env=env,
            capture_output=True,
            check=False,
            timeout=bound(30),
        )
        deadline = time.monotonic() + bound(10)
        while self.pidfile.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        if self.pidfile.exists():
            os.kill(int(self.pidfile.read_text().strip()), signal.SIGKILL)


def _started(directory: Path, password: str | None) -> RedisServer:
    for _attempt in range(3):
        server = RedisServer(free_port(), directory, password)
        try:
            server.start()
            return server
        except RuntimeError:
            server.stop()
    raise RuntimeError("redis-server did not start on any of three free ports")


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    server = _started(tmp_path_factory.mktemp("redis"), None)
    yield server
    server.stop()


@pytest.fixture(scope="session")
def redis_password_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    server = _started(tmp_path_factory.mktemp("redis-auth"), "s3cret-Redis-pw-9f1c")
    yield server
    server.stop()
