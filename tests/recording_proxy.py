"""A recording reverse proxy: every request a client sends to a server, logged on its way.

Put between a process under test and a real server (moto), it proves what the process asked
for without touching the process or the SDK it uses: each request is forwarded unchanged and
recorded with its method, path and AWS operation (the ``Action`` of the query protocol, or the
``X-Amz-Target`` of the JSON protocol).
"""

from __future__ import annotations

import http.client
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from waits import bound

HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "transfer-encoding",
        "te",
        "trailer",
        "upgrade",
        "proxy-connection",
    }
)


@dataclass(frozen=True)
class Seen:
    method: str
    path: str
    operation: str


def operation_of(method: str, target: str, headers: Any, body: bytes) -> str:
    """The AWS operation a request names, or ``METHOD path`` when it names none."""
    amz_target = headers.get("X-Amz-Target")
    if amz_target:
        return str(amz_target).rsplit(".", 1)[-1]
    query = parse_qs(urlsplit(target).query)
    if "Action" in query:
        return query["Action"][-1]
    if body and "x-www-form-urlencoded" in headers.get("Content-Type", ""):
        form = parse_qs(body.decode(errors="replace"))
        if "Action" in form:
            return form["Action"][-1]
    return f"{method} {urlsplit(target).path}"


class RecordingProxy:
    def __init__(self, upstream: str) -> None:
        self.upstream_url = upstream
        parts = urlsplit(upstream)
        self.upstream_host = parts.hostname or "127.0.0.1"
        self.upstream_port = parts.port or 80
        self.lock = threading.Lock()
        self.seen: list[Seen] = []
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=bound(30))

    def operations(self) -> list[str]:
        with self.lock:
            return [s.operation for s in self.seen]

    def clear(self) -> None:
        with self.lock:
            self.seen.clear()

    def _forward(
        self, method: str, target: str, headers: Any, body: bytes
    ) -> tuple[int, list[tuple[str, str]], bytes]:
        with self.lock:
            self.seen.append(
                Seen(method, urlsplit(target).path, operation_of(method, target, headers, body))
            )
        connection = http.client.HTTPConnection(
            self.upstream_host, self.upstream_port, timeout=bound(60)
        )
        try:
            sent = {k: v for k, v in headers.items() if k.lower() not in HOP_BY_HOP}
            connection.request(method, target, body=body or None, headers=sent)
            response = connection.getresponse()
            data = response.read()
            kept = [(k, v) for k, v in response.getheaders() if k.lower() not in HOP_BY_HOP]
            return response.status, kept, data
        finally:
            connection.close()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                """Quiet: the record is ``proxy.seen``."""

            def _relay(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                status, headers, data = proxy._forward(self.command, self.path, self.headers, body)
                self.send_response(status)
                for key, value in headers:
                    if key.lower() != "content-length":
                        self.send_header(key, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if data and self.command != "HEAD":
                    self.wfile.write(data)

            do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = do_HEAD = _relay  # noqa: N815

        return Handler
