"""A real HTTP server standing in for many node agents or dcgm-exporters: each path answers with
the text, status and delay a test sets, so scrapes cross a real socket."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest


@dataclass
class Answer:
    body: str
    status: int = 200
    delay_s: float = 0.0


class ExporterServer:
    def __init__(self) -> None:
        self.answers: dict[str, Answer] = {}
        self.hits: dict[str, int] = {}
        answers, hits = self.answers, self.hits

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                """Quiet: tests read what matters from the scraper."""

            def do_GET(self) -> None:
                hits[self.path] = hits.get(self.path, 0) + 1
                answer = answers.get(self.path, Answer("not found\n", 404))
                if answer.delay_s:
                    time.sleep(answer.delay_s)
                body = answer.body.encode()
                try:
                    self.send_response(answer.status)
                    self.send_header("Content-Type", "text/plain; version=0.0.4")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                except OSError:
                    return

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


@pytest.fixture
def exporters() -> Iterator[ExporterServer]:
    server = ExporterServer()
    yield server
    server.close()
