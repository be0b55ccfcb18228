"""A Kubernetes API server emulator for the Lease leader lock: coordination.k8s.io/v1 Leases.

A small HTTP server (stdlib, in a thread) answering the REST shapes the official kubernetes
client sends and expects: GET/POST on ``/apis/coordination.k8s.io/v1/namespaces/{ns}/leases``,
GET/PUT on ``…/leases/{name}``, objects with ``metadata.resourceVersion`` bumped on every write,
optimistic concurrency (a PUT with a stale resourceVersion is a 409 ``Conflict``), 404
``NotFound``, 409 ``AlreadyExists`` and 401 ``Unauthorized`` as ``Status`` objects, and
RFC 3339 micro times as the API server writes them.

Tests read the requests it served (``requests``), make it fail (``fail(503)``) and slip a write
in just before the next request of a method (``before_next``), which is how two replicas
racing for the same resourceVersion are staged without touching the client.
"""

from __future__ import annotations

import itertools
import json
import re
import secrets
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from waits import bound

GROUP = "coordination.k8s.io"
API_VERSION = f"{GROUP}/v1"
PATH = re.compile(
    rf"^/apis/{re.escape(API_VERSION)}/namespaces/(?P<ns>[^/]+)/leases(?:/(?P<name>[^/]+))?$"
)
TIME_FIELDS = ("acquireTime", "renewTime")
REASONS = {
    400: "BadRequest",
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    405: "MethodNotAllowed",
    409: "Conflict",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
}


class ApiError(Exception):
    """An answer in the shape of a Kubernetes ``Status``."""

    def __init__(self, code: int, message: str, reason: str | None = None, name: str = "") -> None:
        super().__init__(message)
        self.code = code
        self.body: dict[str, Any] = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": message,
            "reason": reason or REASONS.get(code, "Unknown"),
            "code": code,
        }
        if name:
            self.body["details"] = {"name": name, "group": GROUP, "kind": "leases"}


@dataclass(frozen=True)
class Served:
    method: str
    path: str
    status: int


def micro_time(text: Any, field_name: str) -> str:
    """Normalise a MicroTime the way the API server stores it: UTC, microseconds, ``Z``."""
    if not isinstance(text, str):
        raise ApiError(400, f"spec.{field_name}: expected an RFC 3339 time string")
    try:
        parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError as exc:
        raise ApiError(400, f"spec.{field_name}: {text!r} is not RFC 3339") from exc
    if parsed.tzinfo is None:
        raise ApiError(400, f"spec.{field_name}: {text!r} has no time zone")
    return parsed.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass
class K8sApi:
    """The emulator's state, and what a test steers it with."""

    token: str = field(default_factory=lambda: secrets.token_urlsafe(24))
    url: str = ""
    leases: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    requests: list[Served] = field(default_factory=list)
    _versions: Iterator[int] = field(default_factory=lambda: itertools.count(1))
    _failing: tuple[int, int | None] | None = None
    _hooks: dict[str, list[Callable[[], object]]] = field(default_factory=dict)
    _lock: threading.RLock = field(default_factory=threading.RLock)

    def fail(self, status: int = 503, times: int | None = None) -> None:
        """Answer every request (or the next ``times``) with ``status``, changing nothing."""
        with self._lock:
            self._failing = (status, times)

    def heal(self) -> None:
        with self._lock:
            self._failing = None

    def before_next(self, method: str, hook: Callable[[], object]) -> None:
        """Run ``hook`` when the next ``method`` request arrives, before it is served."""
        with self._lock:
            self._hooks.setdefault(method, []).append(hook)

    def lease(self, namespace: str, name: str) -> dict[str, Any] | None:
        with self._lock:
            stored = self.leases.get((namespace, name))
            return json.loads(json.dumps(stored)) if stored is not None else None

    def served(self, method: str | None = None) -> list[Served]:
        with self._lock:
            return [r for r in self.requests if method is None or r.method == method]

    def handle(self, method: str, path: str, auth: str | None, body: bytes) -> tuple[int, Any]:
        with self._lock:
            hooks = self._hooks.pop(method, [])
        for hook in hooks:  # outside the lock: a hook may itself call the server
            hook()
        with self._lock:
            try:
                status, answer = self._answer(method, path, auth, body)
            except ApiError as exc:
                status, answer = exc.code, exc.body
            self.requests.append(Served(method, path, status))
            return status, answer

    def _answer(self, method: str, path: str, auth: str | None, body: bytes) -> tuple[int, Any]:
        if self._failing is not None:
            status, times = self._failing
            if times is not None:
                self._failing = (status, times - 1) if times > 1 else None
            raise ApiError(status, f"the server is answering {status} (injected)")
        if auth != f"Bearer {self.token}":
            raise ApiError(401, "Unauthorized")
        match = PATH.match(path.split("?", 1)[0])
        if match is None:
            raise ApiError(404, "the server could not find the requested resource")
        namespace, name = match["ns"], match["name"]
        if method == "GET" and name is None:
            return 200, self._list(namespace)
        if method == "GET" and name is not None:
            return 200, self._get(namespace, name)
        if method == "POST" and name is None:
            return 201, self._create(namespace, _json(body))
        if method == "PUT" and name is not None:
            return 200, self._replace(namespace, name, _json(body))
        raise ApiError(405, f"{method} is not supported on {path}")

    def _list(self, namespace: str) -> dict[str, Any]:
        items = [lease for (ns, _), lease in sorted(self.leases.items()) if ns == namespace]
        return {
            "kind": "LeaseList",
            "apiVersion": API_VERSION,
            "metadata": {"resourceVersion": str(self._last_version())},
            "items": items,
        }

    def _get(self, namespace: str, name: str) -> dict[str, Any]:
        stored = self.leases.get((namespace, name))
        if stored is None:
            raise ApiError(404, f'leases.{GROUP} "{name}" not found', name=name)
        return stored

    def _create(self, namespace: str, lease: dict[str, Any]) -> dict[str, Any]:
        meta = self._checked(namespace, lease)
        name = meta.get("name")
        if not name:
            raise ApiError(422, "metadata.name: Required value")
        if (namespace, name) in self.leases:
            raise ApiError(409, f'leases.{GROUP} "{name}" already exists', "AlreadyExists", name)
        stored = self._stored(namespace, lease)
        stored["metadata"].update(
            uid=str(uuid.uuid4()),
            creationTimestamp=datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        )
        self.leases[(namespace, name)] = stored
        return stored

    def _replace(self, namespace: str, name: str, lease: dict[str, Any]) -> dict[str, Any]:
        meta = self._checked(namespace, lease)
        if meta.get("name") != name:
            raise ApiError(400, "the name of the object does not match the name on the URL")
        current = self._get(namespace, name)
        version = meta.get("resourceVersion")
        if version and version != current["metadata"]["resourceVersion"]:
            raise ApiError(
                409,
                f'Operation cannot be fulfilled on leases.{GROUP} "{name}": the object has been '
                "modified; please apply your changes to the latest version and try again",
                "Conflict",
                name,
            )
        stored = self._stored(namespace, lease)
        for kept in ("uid", "creationTimestamp"):
            stored["metadata"][kept] = current["metadata"][kept]
        self.leases[(namespace, name)] = stored
        return stored

    @staticmethod
    def _checked(namespace: str, lease: dict[str, Any]) -> dict[str, Any]:
        if lease.get("kind", "Lease") != "Lease" or lease.get("apiVersion", API_VERSION) != (
            API_VERSION
        ):
            raise ApiError(400, "the body is not a coordination.k8s.io/v1 Lease")
        meta = lease.get("metadata")
        if not isinstance(meta, dict):
            raise ApiError(422, "metadata: Required value")
        if meta.get("namespace", namespace) != namespace:
            raise ApiError(
                400, "the namespace of the object does not match the namespace on the URL"
            )
        return meta

    def _stored(self, namespace: str, lease: dict[str, Any]) -> dict[str, Any]:
        spec = dict(lease.get("spec") or {})
        for name in TIME_FIELDS:
            if spec.get(name) is not None:
                spec[name] = micro_time(spec[name], name)
        for name in ("leaseDurationSeconds", "leaseTransitions"):
            value = spec.get(name)
            if value is not None and (not isinstance(value, int) or value < 0):
                raise ApiError(422, f"spec.{name}: must be a non-negative integer")
        meta = lease["metadata"]
        return {
            "apiVersion": API_VERSION,
            "kind": "Lease",
            "metadata": {
                **{k: v for k, v in meta.items() if k in ("name", "labels", "annotations")},
                "namespace": namespace,
                "resourceVersion": str(next(self._versions)),
            },
            "spec": {k: v for k, v in spec.items() if v is not None},
        }

    def _last_version(self) -> int:
        versions = [int(lease["metadata"]["resourceVersion"]) for lease in self.leases.values()]
        return max(versions, default=0)


def _json(body: bytes) -> dict[str, Any]:
    try:
        value = json.loads(body or b"null")
    except ValueError as exc:
        raise ApiError(400, f"the body is not JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise ApiError(400, "the body is not a JSON object")
    return value


def _handler(api: K8sApi) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def _serve(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            status, answer = api.handle(
                self.command, self.path, self.headers.get("Authorization"), body
            )
            data = json.dumps(answer).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = _serve  # noqa: N815

        def log_message(self, format: str, *args: Any) -> None:
            return None

    return Handler


@pytest.fixture
def k8s_api() -> Iterator[K8sApi]:
    """A fresh API server per test, on a port the OS picks (so xdist workers never collide)."""
    api = K8sApi()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(api))
    server.daemon_threads = True
    thread = threading.Thread(
        target=server.serve_forever, args=(0.05,), name="k8s-api", daemon=True
    )
    thread.start()
    api.url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        yield api
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=bound(30))
