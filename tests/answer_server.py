"""A real HTTP server that answers each request with the bytes a test set for it, so hostile
exporter texts and Prometheus API answers cross a real socket (any bytes, any status).

A route is a path, or a path and the ``query`` parameter of a Prometheus instant query
(``/api/v1/query`` with ``query=timestamp(x)``), so one server can stand in for several
exporters and for a Prometheus answering each of a source's queries differently.
"""

from __future__ import annotations

import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class AnswerServer:
    def __init__(self) -> None:
        self.routes: dict[tuple[str, str | None], tuple[int, bytes]] = {}
        routes = self.routes

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                """Quiet: the tests read what matters from the sources."""

            def do_GET(self) -> None:
                path, _, query = self.path.partition("?")
                asked = urllib.parse.parse_qs(query).get("query", [None])[0]
                status, body = routes.get(
                    (path, asked), routes.get((path, None), (404, b"not found\n"))
                )
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "text/plain; version=0.0.4")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                except OSError:
                    return

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.port = int(self._server.server_address[1])
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def answer(self, path: str, body: bytes, status: int = 200, query: str | None = None) -> None:
        self.routes[(path, query)] = (status, body)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
