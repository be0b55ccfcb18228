"""The controller's own endpoints on the metrics port: ``/metrics``, ``/healthz`` (the process
serves) and ``/readyz`` (the loop is doing its job: a tick finished recently, every source
answered on it, and this replica holds the leader lock). A standby replica is alive but not ready,
which keeps it out of a Service's endpoints and tells an operator at a glance which one leads."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from prometheus_client import CollectorRegistry, make_wsgi_app

from autoscaler.model.errors import InputError
from autoscaler.model.wsgi import Serving, bind, text

STALE_AFTER_TICKS = 3.0
STALE_SLACK_S = 10.0


class Readiness:
    """Fed by the run loop after each tick; read by ``/readyz`` from the server's threads."""

    def __init__(self, tick_seconds: float, monotonic: Callable[[], float] = time.monotonic):
        self.max_tick_age_s = STALE_AFTER_TICKS * tick_seconds + STALE_SLACK_S
        self._monotonic = monotonic
        self._lock = threading.Lock()
        self._last_tick: float | None = None
        self._failing_sources: tuple[str, ...] = ()
        self._leader = False

    def tick_finished(self, failing_sources: Sequence[str]) -> None:
        with self._lock:
            self._last_tick = self._monotonic()
            self._failing_sources = tuple(sorted(failing_sources))

    def leadership(self, held: bool) -> None:
        with self._lock:
            self._leader = held

    def status(self) -> tuple[bool, dict[str, Any]]:
        with self._lock:
            last, failing, leader = self._last_tick, self._failing_sources, self._leader
        reasons = []
        age = None if last is None else self._monotonic() - last
        if age is None:
            reasons.append("no tick has finished yet")
        elif age > self.max_tick_age_s:
            reasons.append(
                f"last tick finished {age:.0f}s ago (more than {self.max_tick_age_s:.0f}s)"
            )
        if failing:
            reasons.append("sources failing: " + ", ".join(failing))
        if not leader:
            reasons.append("not the leader (standby)")
        detail = {
            "ready": not reasons,
            "leader": leader,
            "last_tick_age_s": None if age is None else round(age, 3),
            "failing_sources": list(failing),
            "reasons": reasons,
        }
        return not reasons, detail


class StatusServer:
    """Serves the three endpoints from a daemon thread for as long as the run loop runs.

    ``run`` checks at start that the port is free (``check_listen``); one taken between that
    check and ``start`` is still the setting's one line (exit 2), not a traceback."""

    def __init__(
        self,
        registry: CollectorRegistry,
        readiness: Readiness,
        host: str,
        port: int,
        setting: str = "metrics.listen",
    ) -> None:
        self.host = host
        self.setting = setting
        self.requested_port = port
        self.port = port
        self.readiness = readiness
        self._metrics = make_wsgi_app(registry)
        self._serving: Serving | None = None

    def start(self, wakeup: Callable[[], None] | None = None) -> None:
        try:
            server = bind(self.host, self.requested_port, self._route)
        except OSError as exc:
            raise InputError(
                self.setting,
                f"cannot listen on {self.host}:{self.requested_port}: {exc.strerror or exc}; "
                "stop what listens there or choose another port",
            ) from None
        self._serving = Serving(server, "status")
        self.port = self._serving.port
        self._serving.start()

    def close(self) -> None:
        if self._serving is not None:
            self._serving.close()
            self._serving = None

    def _route(self, environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "/")
        if path == "/metrics":
            body: Iterable[bytes] = self._metrics(environ, start_response)
            return body
        if path == "/healthz":
            return text(start_response, "200 OK", "ok\n")
        if path == "/readyz":
            ready, detail = self.readiness.status()
            status = "200 OK" if ready else "503 Service Unavailable"
            return text(start_response, status, json.dumps(detail) + "\n", "application/json")
        return text(
            start_response, "404 Not Found", "not found: serving /metrics, /healthz and /readyz\n"
        )
