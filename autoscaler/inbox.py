"""Where node agents deliver interruption notices they read on the node (AWS IMDS, GCP metadata,
Azure Scheduled Events): a small authenticated HTTP endpoint feeding the controller's next tick,
which the agent's post wakes at once.

``POST /v1/notices`` with ``Authorization: Bearer <token>`` and a JSON body
``{"instance_id": "...", "kind": "terminate" | "rebalance", "deadline": <epoch s or null>,
"source": "aws-imds"}``; 202 when accepted, 401 for a wrong token, 400 for a body that is not a
notice. The token is compared in constant time and never logged.

``POST /v1/checkpoints`` with the same token and ``{"job_id": "...", "duration_s": 12.5, "at":
<epoch s or omitted>, "node": "..."}`` is how a job reports a checkpoint it finished.
"""

from __future__ import annotations

import hmac
import json
import logging
import ssl
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from autoscaler.checkpoints import CheckpointBody, CheckpointLedger, CheckpointReport
from autoscaler.clock import Clock
from autoscaler.model import InterruptionNotice, NoticeKind

log = logging.getLogger(__name__)
MAX_BODY = 64 * 1024
REQUEST_TIMEOUT_S = 10.0


class NoticeBody(BaseModel):
    model_config = ConfigDict(extra="ignore")

    instance_id: str
    kind: NoticeKind = NoticeKind.TERMINATE
    deadline: float | None = None
    source: str = "agent"


class NoticeInbox:
    """Notices posted by agents, kept until a tick takes them."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.rejected = 0
        self._lock = threading.Lock()
        self._notices: list[InterruptionNotice] = []
        self._wakeup: Callable[[], None] | None = None

    def start(self, wakeup: Callable[[], None] | None = None) -> None:
        self._wakeup = wakeup

    def post(self, body: NoticeBody) -> InterruptionNotice:
        notice = InterruptionNotice(
            instance_id=body.instance_id,
            pool="unknown",
            kind=body.kind,
            received_at=self.clock.now(),
            deadline=body.deadline,
        )
        with self._lock:
            self._notices.append(notice)
        self.wake()
        return notice

    def wake(self) -> None:
        """Wake the run loop: a notice to act on, or a checkpoint a waiting evacuation needs."""
        if self._wakeup is not None:
            self._wakeup()

    def take(self) -> list[InterruptionNotice]:
        with self._lock:
            taken, self._notices = self._notices, []
        return taken


class _Server(ThreadingHTTPServer):
    """A zone-wide reclaim is hundreds of agents posting at once; the default backlog of five
    would reset most of them and make them retry."""

    request_queue_size = 1024
    daemon_threads = True


class InboxServer:
    """Serves the inbox over HTTP, or HTTPS with ``tls``. The TLS handshake runs in each
    connection's own thread (not in accept) and every request has a timeout, so a slow or stuck
    client never holds up an agent with a notice to deliver."""

    def __init__(
        self,
        inbox: NoticeInbox,
        token: str,
        host: str = "127.0.0.1",
        port: int = 0,
        tls: ssl.SSLContext | None = None,
        checkpoints: CheckpointLedger | None = None,
    ) -> None:
        if not token:
            raise ValueError("the notice inbox needs a non-empty token")
        self.inbox = inbox
        self.checkpoints = checkpoints if checkpoints is not None else CheckpointLedger()
        self._token = token.encode()
        self._server = _Server((host, port), self._handler())
        if tls is not None:
            self._server.socket = tls.wrap_socket(
                self._server.socket, server_side=True, do_handshake_on_connect=False
            )
        self.port = self._server.server_address[1]
        self._thread: threading.Thread | None = None

    def start(self, wakeup: Callable[[], None] | None = None) -> None:
        """Serve from a daemon thread; each accepted notice calls ``wakeup`` (the run loop's)."""
        self.inbox.start(wakeup)
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.1},
            name="notice-inbox",
            daemon=True,
        )
        self._thread.start()

    def close(self) -> None:
        if self._thread is not None:
            self._server.shutdown()
            self._thread = None
        self._server.server_close()

    def _authorised(self, header: str | None) -> bool:
        if not header or not header.startswith("Bearer "):
            return False
        return hmac.compare_digest(header[len("Bearer ") :].encode(), self._token)

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            timeout = REQUEST_TIMEOUT_S

            def log_message(self, format: str, *args: Any) -> None:
                """Requests are not logged: the notice is, once accepted."""

            def _reply(self, status: int, payload: dict[str, Any]) -> None:
                body = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_POST(self) -> None:
                if self.path not in ("/v1/notices", "/v1/checkpoints"):
                    self._reply(404, {"error": "not found"})
                    return
                if not server._authorised(self.headers.get("Authorization")):
                    server.inbox.rejected += 1
                    self._reply(401, {"error": "a valid bearer token is required"})
                    return
                length = int(self.headers.get("Content-Length") or 0)
                if length > MAX_BODY:
                    self._reply(413, {"error": "body too large"})
                    return
                body = self.rfile.read(length)
                try:
                    if self.path == "/v1/notices":
                        self._notice(NoticeBody.model_validate_json(body))
                    else:
                        self._checkpoint(CheckpointBody.model_validate_json(body))
                except ValidationError as exc:
                    server.inbox.rejected += 1
                    self._reply(400, {"error": exc.errors()[0]["msg"]})

            def _notice(self, body: NoticeBody) -> None:
                notice = server.inbox.post(body)
                log.info("notice from %s: %s %s", body.source, notice.kind, notice.instance_id)
                self._reply(202, {"accepted": notice.instance_id})

            def _checkpoint(self, body: CheckpointBody) -> None:
                at = body.at if body.at is not None else server.inbox.clock.now()
                server.checkpoints.record(
                    CheckpointReport(body.job_id, at, body.duration_s, body.node)
                )
                server.inbox.wake()
                log.debug("checkpoint of job %s (%.1f s)", body.job_id, body.duration_s)
                self._reply(202, {"accepted": body.job_id})

        return Handler
