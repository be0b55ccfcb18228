"""Fake cloud metadata servers for the node agent, speaking each cloud's real shapes over real
HTTP on 127.0.0.1 (ThreadingHTTPServer on a free port), and the controller's notice inbox.

- AWS IMDSv2: ``PUT /latest/api/token`` with a TTL header, every read needs the token header
  (401 without or with a revoked one); instance-id, ``spot/instance-action`` and the rebalance
  recommendation (404 until a test sets them).
- GCP: ``Metadata-Flavor: Google`` required (403 without); hanging GETs with
  ``wait_for_change``, ``last_etag`` and ``timeout_sec``; every answer carries an ``ETag``.
- Azure: ``Metadata: true`` required (400 without); Scheduled Events with
  ``DocumentIncarnation``; a ``StartRequests`` POST is recorded and moves the event to
  ``Started``; the compute name.
- Acme, an imaginary cloud whose watcher is a third-party plugin (``tests/plugins/``): the
  instance name signed with ``Acme-Metadata: 1``, and an interruption document (404 until set).

Each fake's ``fault`` makes its notice endpoint answer a malformed body, a 500, something that
is not HTTP at all, or hang past the client's timeout, until it is set back to ``None``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from email.utils import formatdate
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Literal
from urllib.parse import parse_qs, urlsplit

import pytest
from waits import bound

from autoscaler.model import InterruptionNotice
from autoscaler.model.clock import SystemClock
from autoscaler.ops.inbox import InboxServer, NoticeInbox

Fault = Literal["malformed", "error", "hang", "garbage"] | None


class _FakeServer:
    """A loopback HTTP server whose handler calls ``self.handle(handler, method)``."""

    def __init__(self) -> None:
        self.fault: Fault = None
        self.hang_s = 3.0
        self.requests: list[tuple[str, str]] = []
        self.closing = threading.Event()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                """Quiet: the tests assert on what the agent logs."""

            def do_GET(self) -> None:
                fake._dispatch(self, "GET")

            def do_PUT(self) -> None:
                fake._dispatch(self, "PUT")

            def do_POST(self) -> None:
                fake._dispatch(self, "POST")

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()

    def close(self) -> None:
        self.closing.set()
        self._server.shutdown()
        self._server.server_close()

    def _dispatch(self, handler: BaseHTTPRequestHandler, method: str) -> None:
        self.requests.append((method, handler.path))
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            self.handle(handler, method)

    def handle(self, handler: BaseHTTPRequestHandler, method: str) -> None:
        raise NotImplementedError

    def faulty_answer(
        self,
        handler: BaseHTTPRequestHandler,
        malformed: bytes,
        headers: dict[str, str] | None = None,
    ) -> bool:
        """Answers as the fault says and returns True, or returns False when there is none."""
        if self.fault == "hang":
            self.closing.wait(self.hang_s)
            reply(handler, 500, b"too late", headers)
            return True
        if self.fault == "error":
            reply(handler, 500, b"internal error", headers)
            return True
        if self.fault == "malformed":
            reply(handler, 200, malformed, headers)
            return True
        if self.fault == "garbage":
            handler.wfile.write(b"SSH-2.0-not-http\r\n\r\n")
            handler.close_connection = True
            return True
        return False


def reply(
    handler: BaseHTTPRequestHandler,
    status: int,
    body: bytes,
    headers: dict[str, str] | None = None,
    content_type: str = "text/plain",
) -> None:
    handler.send_response(status)
    handler.send_header("Content-Type", content_type)
    handler.send_header("Content-Length", str(len(body)))
    for name, value in (headers or {}).items():
        handler.send_header(name, value)
    handler.end_headers()
    handler.wfile.write(body)


class FakeImds(_FakeServer):
    def __init__(self, instance_id: str = "i-0123456789abcdef0") -> None:
        self.instance_id = instance_id
        self.instance_action: dict[str, str] | None = None
        self.rebalance: dict[str, str] | None = None
        self.token_puts = 0
        self._tokens: dict[str, float] = {}
        super().__init__()

    def set_instance_action(self, action: str, deadline: float) -> None:
        when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(deadline))
        self.instance_action = {"action": action, "time": when}

    def revoke_tokens(self) -> None:
        self._tokens.clear()

    def handle(self, handler: BaseHTTPRequestHandler, method: str) -> None:
        path = urlsplit(handler.path).path
        if method == "PUT" and path == "/latest/api/token":
            ttl = handler.headers.get("X-aws-ec2-metadata-token-ttl-seconds", "")
            if not ttl.isdigit() or not 1 <= int(ttl) <= 21600:
                reply(handler, 400, b"")
                return
            token = uuid.uuid4().hex
            self._tokens[token] = time.monotonic() + int(ttl)
            self.token_puts += 1
            reply(handler, 200, token.encode(), {"X-aws-ec2-metadata-token-ttl-seconds": ttl})
            return
        token = handler.headers.get("X-aws-ec2-metadata-token", "")
        if method != "GET" or self._tokens.get(token, 0.0) < time.monotonic():
            reply(handler, 401, b"")
            return
        documents = {
            "/latest/meta-data/spot/instance-action": self.instance_action,
            "/latest/meta-data/events/recommendations/rebalance": self.rebalance,
        }
        if path == "/latest/meta-data/instance-id":
            reply(handler, 200, self.instance_id.encode())
        elif path in documents:
            if self.faulty_answer(handler, b"<html>not json"):
                return
            document = documents[path]
            if document is None:
                reply(handler, 404, b"Not Found")
            else:
                reply(handler, 200, json.dumps(document).encode(), content_type="text/plain")
        else:
            reply(handler, 404, b"Not Found")


class FakeGcpMetadata(_FakeServer):
    def __init__(self, name: str = "gpu-spot-7") -> None:
        self._changed = threading.Condition()
        self._values = {
            "instance/name": name,
            "instance/preempted": "FALSE",
            "instance/maintenance-event": "NONE",
        }
        self._versions = dict.fromkeys(self._values, 0)
        self.max_wait_s = 60.0
        super().__init__()

    def set(self, key: str, value: str) -> None:
        with self._changed:
            self._values[key] = value
            self._versions[key] += 1
            self._changed.notify_all()

    def close(self) -> None:
        with self._changed:
            self.closing.set()
            self._changed.notify_all()
        super().close()

    def _etag(self, key: str) -> str:
        seed = f"{key}:{self._versions[key]}:{self._values[key]}".encode()
        return hashlib.sha1(seed).hexdigest()[:16]

    def handle(self, handler: BaseHTTPRequestHandler, method: str) -> None:
        if handler.headers.get("Metadata-Flavor") != "Google":
            reply(handler, 403, b"Missing Metadata-Flavor:Google header.")
            return
        parts = urlsplit(handler.path)
        key = parts.path.removeprefix("/computeMetadata/v1/")
        if method != "GET" or key not in self._values:
            reply(handler, 404, b"not found", {"Metadata-Flavor": "Google"})
            return
        query = {name: values[0] for name, values in parse_qs(parts.query).items()}
        if query.get("wait_for_change") == "true":
            wait_s = min(float(query.get("timeout_sec", self.max_wait_s)), self.max_wait_s)
            with self._changed:
                last = query.get("last_etag") or self._etag(key)
                self._changed.wait_for(
                    lambda: self.closing.is_set() or self._etag(key) != last, timeout=wait_s
                )
        with self._changed:
            value, etag = self._values[key], self._etag(key)
        signed = {"Metadata-Flavor": "Google", "ETag": etag}
        if key == "instance/preempted" and self.faulty_answer(handler, b"MAYBE", signed):
            return
        reply(handler, 200, value.encode(), signed)


@dataclass
class AzureEvent:
    event_id: str
    event_type: str
    resources: list[str]
    not_before: float
    status: str = "Scheduled"

    def document(self) -> dict[str, Any]:
        return {
            "EventId": self.event_id,
            "EventType": self.event_type,
            "ResourceType": "VirtualMachine",
            "Resources": self.resources,
            "EventStatus": self.status,
            "NotBefore": formatdate(self.not_before, usegmt=True)
            if self.status == "Scheduled"
            else "",
            "Description": "",
            "EventSource": "Platform",
            "DurationInSeconds": -1,
        }


@dataclass
class Acknowledgement:
    event_id: str
    at: float


class FakeAzureImds(_FakeServer):
    def __init__(self, name: str = "vm-gpu-3") -> None:
        self.name = name
        self.incarnation = 1
        self.events: list[AzureEvent] = []
        # Event objects served as they are, after the well-formed ones (malformed on purpose).
        self.raw_events: list[Any] = []
        self.acknowledged: list[Acknowledgement] = []
        self._lock = threading.Lock()
        super().__init__()

    def add_event(
        self,
        event_type: str = "Preempt",
        resources: list[str] | None = None,
        not_before: float | None = None,
    ) -> AzureEvent:
        event = AzureEvent(
            event_id=str(uuid.uuid4()).upper(),
            event_type=event_type,
            resources=[self.name] if resources is None else resources,
            not_before=time.time() + 30 if not_before is None else not_before,
        )
        with self._lock:
            self.events.append(event)
            self.incarnation += 1
        return event

    def handle(self, handler: BaseHTTPRequestHandler, method: str) -> None:
        if handler.headers.get("Metadata") != "true":
            reply(handler, 400, b'{"error": "Bad request. Required metadata header not specified"}')
            return
        parts = urlsplit(handler.path)
        if parts.path == "/metadata/instance/compute/name" and method == "GET":
            reply(handler, 200, self.name.encode())
        elif parts.path == "/metadata/scheduledevents" and method == "GET":
            if self.faulty_answer(handler, b'{"DocumentIncarnation": "x", "Events": 3'):
                return
            with self._lock:
                body = {
                    "DocumentIncarnation": self.incarnation,
                    "Events": [event.document() for event in self.events] + self.raw_events,
                }
            reply(handler, 200, json.dumps(body).encode(), content_type="application/json")
        elif parts.path == "/metadata/scheduledevents" and method == "POST":
            length = int(handler.headers.get("Content-Length") or 0)
            try:
                wanted = {
                    request["EventId"]
                    for request in json.loads(handler.rfile.read(length))["StartRequests"]
                }
            except (ValueError, KeyError, TypeError):
                reply(handler, 400, b'{"error": "bad StartRequests"}')
                return
            with self._lock:
                for event in self.events:
                    if event.event_id in wanted and event.status == "Scheduled":
                        event.status = "Started"
                        self.acknowledged.append(Acknowledgement(event.event_id, time.time()))
                        self.incarnation += 1
            reply(handler, 200, b"")
        else:
            reply(handler, 404, b"not found")


class FakeAcmeMetadata(_FakeServer):
    """The metadata server of a cloud we do not ship, for ``tests/plugins/acme_watcher.py``."""

    def __init__(self, name: str = "acme-node-7") -> None:
        self.name = name
        self.interruption: dict[str, object] | None = None
        super().__init__()

    def interrupt(self, event_id: str, deadline: float) -> None:
        self.interruption = {"id": event_id, "deadline": deadline}

    def handle(self, handler: BaseHTTPRequestHandler, method: str) -> None:
        path = urlsplit(handler.path).path
        if path == "/acme/v1/instance" and method == "GET":
            reply(handler, 200, self.name.encode(), {"Acme-Metadata": "1"})
        elif path == "/acme/v1/interruption" and method == "GET" and self.interruption:
            body = json.dumps(self.interruption).encode()
            reply(handler, 200, body, {"Acme-Metadata": "1"}, content_type="application/json")
        else:
            reply(handler, 404, b"not found")


@dataclass
class ControllerInbox:
    """The controller's side, as the controller runs it: a real ``InboxServer``; ``arrivals``
    holds the monotonic time of each accepted notice (the run loop's wakeup)."""

    token: str
    inbox: NoticeInbox
    server: InboxServer
    arrivals: list[float] = field(default_factory=list)
    received: list[InterruptionNotice] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.port}"

    def wait_for(self, count: int = 1, timeout_s: float = 60.0) -> list[InterruptionNotice]:
        """Notices taken so far, waiting until there are ``count`` or the timeout passes; the
        timeout is scaled by the wait knob (a short one, to show that no more arrive, too)."""
        give_up = time.monotonic() + bound(timeout_s)
        while len(self.received) < count and time.monotonic() < give_up:
            self.received.extend(self.inbox.take())
            time.sleep(0.01)
        self.received.extend(self.inbox.take())
        return list(self.received)


@pytest.fixture
def aws_imds() -> Iterator[FakeImds]:
    fake = FakeImds()
    yield fake
    fake.close()


@pytest.fixture
def gcp_metadata() -> Iterator[FakeGcpMetadata]:
    fake = FakeGcpMetadata()
    yield fake
    fake.close()


@pytest.fixture
def azure_metadata() -> Iterator[FakeAzureImds]:
    fake = FakeAzureImds()
    yield fake
    fake.close()


@pytest.fixture
def acme_metadata() -> Iterator[FakeAcmeMetadata]:
    fake = FakeAcmeMetadata()
    yield fake
    fake.close()


@pytest.fixture
def controller_inbox() -> Iterator[ControllerInbox]:
    token = "s3cret-" + uuid.uuid4().hex
    inbox = NoticeInbox(SystemClock())
    server = InboxServer(inbox, token)
    controller = ControllerInbox(token, inbox, server)
    server.start(lambda: controller.arrivals.append(time.monotonic()))
    yield controller
    server.close()
