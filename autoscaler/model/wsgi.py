"""A small threaded WSGI server for the endpoints the controller and the agent serve beside their
work (``/metrics``, ``/healthz``, ``/readyz``): stdlib only, quiet request logs, IPv6 when asked."""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Callable, Iterable
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

log = logging.getLogger(__name__)

POLL_INTERVAL_S = 0.2
App = Callable[..., Iterable[bytes]]


class _ThreadingServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _ThreadingServer6(_ThreadingServer):
    address_family = socket.AF_INET6


class _QuietHandler(WSGIRequestHandler):
    """Requests go to the debug log, not stderr: Prometheus scrapes every few seconds."""

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s %s", self.address_string(), format % args)


def bind(host: str, port: int, app: App) -> WSGIServer:
    """Bind now (``port=0`` takes a free one), so the caller knows the port before serving;
    raises ``OSError`` when the address is taken or not ours."""
    server_class = _ThreadingServer6 if ":" in host else _ThreadingServer
    return make_server(host, port, app, server_class=server_class, handler_class=_QuietHandler)


class Serving:
    """A bound server served from a daemon thread until ``close``."""

    def __init__(self, server: WSGIServer, name: str) -> None:
        self.server = server
        self.port: int = int(server.server_address[1])
        self._name = name
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._thread is not None:
            return
        self._thread = threading.Thread(
            target=self.server.serve_forever,
            kwargs={"poll_interval": POLL_INTERVAL_S},
            name=self._name,
            daemon=True,
        )
        self._thread.start()

    def close(self) -> None:
        if self._thread is not None:
            self.server.shutdown()
            self._thread.join()
            self._thread = None
        self.server.server_close()


def text(start_response: Any, status: str, body: str, kind: str = "text/plain") -> list[bytes]:
    start_response(status, [("Content-Type", f"{kind}; charset=utf-8")])
    return [body.encode()]
