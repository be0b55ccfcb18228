"""A Kubernetes API server emulator: the REST shapes the official kubernetes client sends and
expects, for the Lease leader lock and the ``kubernetes`` source.

A small HTTP/1.1 server (stdlib, in a thread). What it serves:

* coordination.k8s.io/v1 Leases: GET/POST on ``…/namespaces/{ns}/leases``, GET/PUT on
  ``…/leases/{name}``, optimistic concurrency (a PUT with a stale resourceVersion is a 409
  ``Conflict``) and RFC 3339 micro times as the API server writes them.
* core/v1 pods and nodes, policy/v1 PodDisruptionBudgets, batch/v1 Jobs: list (namespaced and
  across namespaces) with ``labelSelector`` (``=``, ``==``, ``!=``, ``in``, ``notin``, exists,
  ``!key``) and ``fieldSelector`` (``=``, ``==``, ``!=`` on the fields the real server supports
  for each kind: ``status.phase`` and ``spec.nodeName`` for pods, ``spec.unschedulable`` for
  nodes), the list's ``metadata.resourceVersion``; watch (``?watch=1&resourceVersion=N``: JSON
  lines of ADDED/MODIFIED/DELETED, chunked, an object that stops or starts matching a selector
  seen as DELETED or ADDED, a resourceVersion older than the kept history answered with an
  ERROR event holding a 410 ``Expired`` Status, as the real watch cache does, and
  ``timeoutSeconds``); GET, POST, PATCH (strategic-merge and merge patch: maps merged, ``null``
  deletes, lists replaced, as for ``labels``, ``annotations``, ``spec.unschedulable`` and the
  atomic ``spec.taints``; JSON patch for add/replace/remove/test) and DELETE (with
  ``preconditions`` and, when asked, graceful deletion that leaves the pod terminating).
* the eviction subresource ``POST …/pods/{name}/eviction``: a pod covered by a
  PodDisruptionBudget whose disruptions are used up is answered 429 ``TooManyRequests`` with the
  budget named in the Status's causes, two budgets over one pod 500, as the real server does.

Every write bumps one resourceVersion counter shared by all kinds (etcd's revision). Errors are
``Status`` objects (404 ``NotFound`` with details, 409 ``AlreadyExists``/``Conflict``, 401, 400,
422 ``Invalid``).

Tests read the requests it served (``requests``), make it fail (``fail(503)``, optionally only
for paths matching a pattern), slow it (``stall``), slip a write in just before the next request
of a method (``before_next``), and change objects the way controllers and kubelets would
(``put``, ``mutate``, ``remove``, ``compact``); ``tests/k8s_cluster.py`` builds objects and plays
the scheduler, the kubelet and the Job controller on top.
"""

from __future__ import annotations

import copy
import itertools
import json
import math
import re
import secrets
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from waits import bound

GROUP = "coordination.k8s.io"
API_VERSION = f"{GROUP}/v1"
PATH = re.compile(
    rf"^/apis/{re.escape(API_VERSION)}/namespaces/(?P<ns>[^/]+)/leases(?:/(?P<name>[^/]+))?$"
)
CORE_PATH = re.compile(
    r"^/api/v1/(?:namespaces/(?P<ns>[^/]+)/)?(?P<resource>[a-z]+)"
    r"(?:/(?P<name>[^/]+)(?:/(?P<sub>[a-z]+))?)?$"
)
GROUP_PATH = re.compile(
    r"^/apis/(?P<group>[a-z0-9.]+)/(?P<version>v[0-9a-z]+)/(?:namespaces/(?P<ns>[^/]+)/)?"
    r"(?P<resource>[a-z]+)(?:/(?P<name>[^/]+)(?:/(?P<sub>[a-z]+))?)?$"
)
TIME_FIELDS = ("acquireTime", "renewTime")
REASONS = {
    400: "BadRequest",
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    405: "MethodNotAllowed",
    409: "Conflict",
    410: "Expired",
    415: "UnsupportedMediaType",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
}


@dataclass(frozen=True)
class Kind:
    """One kind of object the emulator keeps: where it lives in the API and what it is called."""

    resource: str
    kind: str
    group: str
    version: str
    namespaced: bool
    fields: tuple[str, ...] = ("metadata.name", "metadata.namespace")

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version


KINDS: dict[tuple[str, str], Kind] = {
    ("", "pods"): Kind(
        "pods",
        "Pod",
        "",
        "v1",
        True,
        (
            "metadata.name",
            "metadata.namespace",
            "spec.nodeName",
            "spec.restartPolicy",
            "spec.schedulerName",
            "spec.serviceAccountName",
            "spec.hostNetwork",
            "status.phase",
            "status.podIP",
            "status.nominatedNodeName",
        ),
    ),
    ("", "nodes"): Kind("nodes", "Node", "", "v1", False, ("metadata.name", "spec.unschedulable")),
    ("policy", "poddisruptionbudgets"): Kind(
        "poddisruptionbudgets", "PodDisruptionBudget", "policy", "v1", True
    ),
    ("batch", "jobs"): Kind("jobs", "Job", "batch", "v1", True),
}
BY_RESOURCE = {kind.resource: kind for kind in KINDS.values()}


class ApiError(Exception):
    """An answer in the shape of a Kubernetes ``Status``."""

    def __init__(
        self,
        code: int,
        message: str,
        reason: str | None = None,
        name: str = "",
        kind: str = "leases",
        group: str = GROUP,
        causes: list[dict[str, str]] | None = None,
    ) -> None:
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
        if name or causes:
            details: dict[str, Any] = {"name": name, "kind": kind}
            if group:
                details["group"] = group
            if causes:
                details["causes"] = causes
            self.body["details"] = details


@dataclass(frozen=True)
class Served:
    method: str
    path: str
    status: int


@dataclass(frozen=True)
class Event:
    """One change, as a watch sends it: the object after the change (before, for a MODIFIED one,
    is kept too, so a selector's watch can tell an object that stopped matching)."""

    version: int
    type: str
    resource: str
    obj: dict[str, Any]
    before: dict[str, Any] | None = None


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


def rfc3339(at: float | None = None) -> str:
    """A Time as the API server writes it: whole seconds, UTC, ``Z``."""
    moment = datetime.fromtimestamp(time.time() if at is None else at, UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


# -- selectors ----------------------------------------------------------------------------------

_REQUIREMENT = re.compile(
    r"^\s*(?P<not>!)?\s*(?P<key>[A-Za-z0-9_./-]+)\s*"
    r"(?:(?P<op>==|=|!=)\s*(?P<value>[A-Za-z0-9_.-]*)"
    r"|\s(?P<set>in|notin)\s*\((?P<values>[^)]*)\))?\s*$"
)


def _split_selector(text: str) -> list[str]:
    """Requirements separated by commas outside parentheses."""
    parts, depth, current = [], 0, ""
    for char in text:
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        if char == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += char
    parts.append(current)
    return [p for p in parts if p.strip()]


LabelTest = Callable[[Mapping[str, str]], bool]


def label_selector(text: str) -> LabelTest:
    """The test a ``labelSelector`` query parameter stands for; 400 for one it cannot parse."""
    tests: list[LabelTest] = []
    for part in _split_selector(text):
        match = _REQUIREMENT.match(part)
        if match is None or (match["not"] and (match["op"] or match["set"])):
            raise ApiError(400, f"unable to parse requirement: {part.strip()!r}")
        key, op, value = match["key"], match["op"], match["value"]
        if match["not"]:
            tests.append(lambda labels, k=key: k not in labels)
        elif op in ("=", "=="):
            tests.append(lambda labels, k=key, v=value: labels.get(k) == v)
        elif op == "!=":
            tests.append(lambda labels, k=key, v=value: labels.get(k) != v)
        elif match["set"]:
            values = frozenset(v.strip() for v in match["values"].split(",") if v.strip())
            if match["set"] == "in":
                tests.append(lambda labels, k=key, vs=values: labels.get(k) in vs)
            else:
                tests.append(lambda labels, k=key, vs=values: labels.get(k) not in vs)
        else:
            tests.append(lambda labels, k=key: k in labels)
    return lambda labels: all(test(labels) for test in tests)


def _field_value(obj: Mapping[str, Any], path: str) -> str:
    value: Any = obj
    for part in path.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    if value is None:
        return "false" if path in ("spec.unschedulable", "spec.hostNetwork") else ""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


FieldTest = Callable[[Mapping[str, Any]], bool]


def field_selector(text: str, kind: Kind) -> FieldTest:
    """The test a ``fieldSelector`` stands for: ``=``, ``==`` and ``!=`` on the fields the real
    server indexes for the kind; any other field is a 400 as there."""
    tests: list[FieldTest] = []
    for part in _split_selector(text):
        match = re.match(r"^\s*([A-Za-z.]+)\s*(==|!=|=)\s*([^,]*?)\s*$", part)
        if match is None:
            raise ApiError(400, f"invalid selector: {part.strip()!r}; can't understand it")
        path, op, value = match.groups()
        if path not in kind.fields:
            raise ApiError(400, f"field label not supported: {path}")
        if op == "!=":
            tests.append(lambda obj, p=path, v=value: _field_value(obj, p) != v)
        else:
            tests.append(lambda obj, p=path, v=value: _field_value(obj, p) == v)
    return lambda obj: all(test(obj) for test in tests)


def selector_matches(selector: Mapping[str, Any] | None, labels: Mapping[str, str]) -> bool:
    """Whether a LabelSelector object (``matchLabels``, ``matchExpressions``) selects
    ``labels``; an empty selector selects everything, as in a PodDisruptionBudget."""
    if not selector:
        return True
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expression in selector.get("matchExpressions") or []:
        key, op = expression["key"], expression["operator"]
        values = expression.get("values") or []
        if op == "In" and labels.get(key) not in values:
            return False
        if op == "NotIn" and labels.get(key) in values:
            return False
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
    return True


# -- patches ------------------------------------------------------------------------------------


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 merge patch: maps merged, ``null`` deletes, anything else replaces. Strategic
    merge patch is the same for the fields served here (maps, scalars, atomic lists)."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    if "$patch" in patch:
        raise ApiError(400, "$patch directives are not supported by this emulator")
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def _pointer(path: str) -> list[str]:
    if not path.startswith("/"):
        raise ApiError(400, f"json patch path {path!r} does not start with /")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def json_patch(target: dict[str, Any], operations: list[Any]) -> dict[str, Any]:
    """RFC 6902 ``add``, ``replace``, ``remove`` and ``test`` on object members."""
    result = copy.deepcopy(target)
    for op in operations:
        if not isinstance(op, dict) or "op" not in op or "path" not in op:
            raise ApiError(400, "json patch operation needs op and path")
        *parents, last = _pointer(op["path"])
        node: Any = result
        for part in parents:
            if not isinstance(node, dict) or part not in node:
                raise ApiError(422, f"json patch path {op['path']!r} does not exist")
            node = node[part]
        if not isinstance(node, dict):
            raise ApiError(422, f"json patch path {op['path']!r} is not an object member")
        if op["op"] in ("add", "replace"):
            if op["op"] == "replace" and last not in node:
                raise ApiError(422, f"json patch: replace of missing {op['path']!r}")
            node[last] = copy.deepcopy(op.get("value"))
        elif op["op"] == "remove":
            if last not in node:
                raise ApiError(422, f"json patch: remove of missing {op['path']!r}")
            del node[last]
        elif op["op"] == "test":
            if node.get(last) != op.get("value"):
                raise ApiError(422, f"json patch: test of {op['path']!r} failed")
        else:
            raise ApiError(400, f"json patch op {op['op']!r} is not supported")
    return result


# -- the server's state -------------------------------------------------------------------------


@dataclass(repr=False)
class K8sApi:
    """The emulator's state, and what a test steers it with."""

    token: str = field(default_factory=lambda: secrets.token_urlsafe(24))
    url: str = ""
    leases: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    objects: dict[str, dict[tuple[str, str], dict[str, Any]]] = field(
        default_factory=lambda: {kind.resource: {} for kind in KINDS.values()}
    )
    requests: list[Served] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    # what DELETE does to a pod: gone at once, or terminating until ``finish_terminating``
    graceful_deletion: bool = False
    # called (under the lock) with each pod a DELETE or an eviction removed: the Job controller
    on_pod_deleted: list[Callable[[dict[str, Any]], None]] = field(default_factory=list)
    history: int = 10_000
    revision: int = 0
    compacted: int = 0
    closed: bool = False
    _versions: Iterator[int] = field(default_factory=lambda: itertools.count(1))
    _failing: tuple[int, int | None, re.Pattern[str] | None] | None = None
    _stall_s: float = 0.0
    _hooks: dict[str, list[Callable[[], object]]] = field(default_factory=dict)
    _lock: threading.RLock = field(default_factory=threading.RLock)
    _changed: threading.Condition = field(init=False)

    def __post_init__(self) -> None:
        self._changed = threading.Condition(self._lock)

    # -- what a test steers ---------------------------------------------------------------------

    def fail(self, status: int = 503, times: int | None = None, path: str | None = None) -> None:
        """Answer every request (or the next ``times``; with ``path``, only those whose path and
        query match that pattern) with ``status``, changing nothing."""
        with self._lock:
            self._failing = (status, times, re.compile(path) if path else None)

    def heal(self) -> None:
        with self._lock:
            self._failing = None
            self._stall_s = 0.0

    def stall(self, seconds: float) -> None:
        """Wait this long before answering each request (a server too slow for the client)."""
        with self._lock:
            self._stall_s = seconds

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

    def get(self, resource: str, name: str, namespace: str = "") -> dict[str, Any] | None:
        """A copy of one object, or None."""
        with self._lock:
            stored = self.objects[resource].get((namespace, name))
            return copy.deepcopy(stored) if stored is not None else None

    def items(self, resource: str) -> list[dict[str, Any]]:
        """Copies of every object of a kind, in (namespace, name) order."""
        with self._lock:
            return [copy.deepcopy(o) for _, o in sorted(self.objects[resource].items())]

    def put(self, resource: str, obj: dict[str, Any]) -> dict[str, Any]:
        """Create or replace an object as a controller would (no validation): metadata filled
        in, the resourceVersion bumped, the change sent to watches. Returns a copy."""
        with self._lock:
            kind = BY_RESOURCE[resource]
            meta = obj.setdefault("metadata", {})
            namespace = meta.setdefault("namespace", "default") if kind.namespaced else ""
            if not kind.namespaced:
                meta.pop("namespace", None)
            key = (namespace, meta["name"])
            before = self.objects[resource].get(key)
            obj.setdefault("apiVersion", kind.api_version)
            obj.setdefault("kind", kind.kind)
            if before is not None:
                meta.setdefault("uid", before["metadata"]["uid"])
                meta.setdefault("creationTimestamp", before["metadata"]["creationTimestamp"])
            meta.setdefault("uid", str(uuid.uuid4()))
            meta.setdefault("creationTimestamp", rfc3339())
            meta["resourceVersion"] = str(self._next_rv())
            stored = copy.deepcopy(obj)
            self.objects[resource][key] = stored
            self._record("ADDED" if before is None else "MODIFIED", resource, stored, before)
            return copy.deepcopy(stored)

    def mutate(
        self,
        resource: str,
        name: str,
        change: Callable[[dict[str, Any]], object],
        namespace: str = "",
    ) -> dict[str, Any]:
        """Change an object in place through ``change`` (a controller's update)."""
        with self._lock:
            stored = self.objects[resource].get((namespace, name))
            if stored is None:
                raise KeyError(f"{resource} {namespace}/{name}")
            updated = copy.deepcopy(stored)
            change(updated)
            return self._replace_stored(resource, stored, updated)

    def remove(self, resource: str, name: str, namespace: str = "") -> dict[str, Any] | None:
        """Delete an object at once (a terminated pod's last step, a node leaving)."""
        with self._lock:
            stored = self.objects[resource].pop((namespace, name), None)
            if stored is not None:
                gone = copy.deepcopy(stored)
                gone["metadata"]["resourceVersion"] = str(self._next_rv())
                self._record("DELETED", resource, gone)
                if resource == "pods":
                    for hook in self.on_pod_deleted:
                        hook(gone)
            return stored

    def compact(self) -> int:
        """Forget the change history (etcd compaction): a watch from any resourceVersion up to
        now is answered 410 Expired. Returns the revision compacted to."""
        with self._lock:
            self.compacted = self.revision
            self.events.clear()
            return self.compacted

    def close(self) -> None:
        with self._lock:
            self.closed = True
            self._changed.notify_all()

    # -- serving ---------------------------------------------------------------------------------

    def handle(
        self,
        method: str,
        path: str,
        auth: str | None,
        body: bytes,
        content_type: str | None = None,
    ) -> tuple[int, Any]:
        with self._lock:
            hooks = self._hooks.pop(method, [])
            stall = self._stall_s
        for hook in hooks:  # outside the lock: a hook may itself call the server
            hook()
        if stall:
            time.sleep(stall)
        with self._lock:
            try:
                status, answer = self._answer(method, path, auth, body, content_type)
            except ApiError as exc:
                status, answer = exc.code, exc.body
            self.requests.append(Served(method, path, status))
            return status, answer

    def _answer(
        self, method: str, path: str, auth: str | None, body: bytes, content_type: str | None
    ) -> tuple[int, Any]:
        if self._failing is not None:
            status, times, pattern = self._failing
            if pattern is None or pattern.search(path):
                if times is not None:
                    self._failing = (status, times - 1, pattern) if times > 1 else None
                raise ApiError(status, f"the server is answering {status} (injected)")
        if auth != f"Bearer {self.token}":
            raise ApiError(401, "Unauthorized")
        parts = urlsplit(path)
        query = {k: v[-1] for k, v in parse_qs(parts.query, keep_blank_values=True).items()}
        match = PATH.match(parts.path)
        if match is not None:
            return self._lease_answer(method, path, match, body)
        match = CORE_PATH.match(parts.path)
        group = ""
        if match is None:
            match = GROUP_PATH.match(parts.path)
            group = match["group"] if match is not None else ""
        if match is None:
            raise ApiError(404, "the server could not find the requested resource")
        kind = KINDS.get((group, match["resource"]))
        if kind is None or (match["ns"] is not None and not kind.namespaced):
            raise ApiError(404, "the server could not find the requested resource")
        namespace, name, sub = match["ns"], match["name"], match["sub"]
        if name is None:
            if method == "GET" and query.get("watch") in ("1", "true", "True"):
                return 200, self._watch(kind, namespace, query)
            if method == "GET":
                return 200, self._list(kind, namespace, query)
            if method == "POST" and (namespace is not None or not kind.namespaced):
                return 201, self._create(kind, namespace or "", _json(body))
            raise ApiError(405, f"{method} is not supported on {parts.path}")
        key = (namespace or "", name)
        if sub == "eviction" and kind.resource == "pods" and method == "POST":
            return 201, self._evict(key, _json(body))
        if sub is not None:
            raise ApiError(404, "the server could not find the requested resource")
        if method == "GET":
            return 200, self._read(kind, key)
        if method == "PATCH":
            return 200, self._patch(kind, key, body, content_type or "")
        if method == "DELETE":
            return 200, self._delete(kind, key, _json(body) if body else {})
        raise ApiError(405, f"{method} is not supported on {parts.path}")

    # -- objects ---------------------------------------------------------------------------------

    def _next_rv(self) -> int:
        self.revision = next(self._versions)
        return self.revision

    def _record(
        self, type_: str, resource: str, obj: dict[str, Any], before: dict[str, Any] | None = None
    ) -> None:
        self.events.append(
            Event(int(obj["metadata"]["resourceVersion"]), type_, resource, obj, before)
        )
        if len(self.events) > self.history:
            dropped = self.events[: len(self.events) - self.history]
            del self.events[: len(dropped)]
            self.compacted = dropped[-1].version
        self._changed.notify_all()

    def _not_found(self, kind: Kind, name: str) -> ApiError:
        what = f"{kind.resource}.{kind.group}" if kind.group else kind.resource
        return ApiError(
            404, f'{what} "{name}" not found', name=name, kind=kind.resource, group=kind.group
        )

    def _stored(self, kind: Kind, key: tuple[str, str]) -> dict[str, Any]:
        stored = self.objects[kind.resource].get(key)
        if stored is None:
            raise self._not_found(kind, key[1])
        return stored

    def _read(self, kind: Kind, key: tuple[str, str]) -> dict[str, Any]:
        stored = self._stored(kind, key)
        return self._with_status(kind, stored)

    def _with_status(self, kind: Kind, obj: dict[str, Any]) -> dict[str, Any]:
        if kind.resource != "poddisruptionbudgets":
            return obj
        shown = copy.deepcopy(obj)
        expected, healthy, desired = self._budget(obj)
        shown["status"] = {
            "expectedPods": expected,
            "currentHealthy": healthy,
            "desiredHealthy": desired,
            "disruptionsAllowed": max(0, healthy - desired),
            "observedGeneration": 1,
        }
        return shown

    def _list(self, kind: Kind, namespace: str | None, query: Mapping[str, str]) -> dict[str, Any]:
        matches = self._matcher(kind, query)
        items = [
            self._with_status(kind, obj)
            for (ns, _), obj in sorted(self.objects[kind.resource].items())
            if (namespace is None or ns == namespace) and matches(obj)
        ]
        return {
            "kind": f"{kind.kind}List",
            "apiVersion": kind.api_version,
            "metadata": {"resourceVersion": str(self.revision)},
            "items": items,
        }

    def _matcher(self, kind: Kind, query: Mapping[str, str]) -> Callable[[dict[str, Any]], bool]:
        labels = label_selector(query.get("labelSelector", ""))
        fields = field_selector(query.get("fieldSelector", ""), kind)
        return lambda obj: labels(obj["metadata"].get("labels") or {}) and fields(obj)

    def _create(self, kind: Kind, namespace: str, obj: dict[str, Any]) -> dict[str, Any]:
        self._check_kind(kind, obj)
        meta = obj.get("metadata")
        if not isinstance(meta, dict):
            raise ApiError(422, "metadata: Required value")
        if kind.namespaced and meta.get("namespace", namespace) != namespace:
            raise ApiError(
                400, "the namespace of the object does not match the namespace on the URL"
            )
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + secrets.token_hex(3)[:5]
        name = meta.get("name")
        if not name:
            raise ApiError(422, "metadata.name: Required value")
        if (namespace, name) in self.objects[kind.resource]:
            raise ApiError(
                409,
                f'{kind.resource} "{name}" already exists',
                "AlreadyExists",
                name,
                kind.resource,
                kind.group,
            )
        _validate(kind, obj)
        for dropped in ("uid", "resourceVersion", "creationTimestamp", "deletionTimestamp"):
            meta.pop(dropped, None)
        if kind.namespaced:
            meta["namespace"] = namespace
        return self.put(kind.resource, obj)

    @staticmethod
    def _check_kind(kind: Kind, obj: dict[str, Any]) -> None:
        if (
            obj.get("kind", kind.kind) != kind.kind
            or obj.get("apiVersion", kind.api_version) != kind.api_version
        ):
            raise ApiError(400, f"the body is not a {kind.api_version} {kind.kind}")

    def _patch(
        self, kind: Kind, key: tuple[str, str], body: bytes, content_type: str
    ) -> dict[str, Any]:
        stored = self._stored(kind, key)
        media = content_type.split(";", maxsplit=1)[0].strip()
        try:
            patch = json.loads(body or b"null")
        except ValueError as exc:
            raise ApiError(400, f"the body is not JSON: {exc}") from exc
        if media == "application/json-patch+json":
            if not isinstance(patch, list):
                raise ApiError(400, "a json patch is a list of operations")
            updated = json_patch(stored, patch)
        elif media in ("application/merge-patch+json", "application/strategic-merge-patch+json"):
            if not isinstance(patch, dict):
                raise ApiError(400, "a merge patch is a JSON object")
            wanted = (patch.get("metadata") or {}).get("resourceVersion")
            if wanted is not None and wanted != stored["metadata"]["resourceVersion"]:
                raise self._conflict(kind, key[1])
            updated = merge_patch(stored, patch)
        else:
            raise ApiError(415, f"the media type {media!r} is not supported for PATCH")
        for kept in ("name", "namespace", "uid", "creationTimestamp"):
            if kept in stored["metadata"]:
                updated.setdefault("metadata", {})[kept] = stored["metadata"][kept]
        self._check_kind(kind, updated)
        _validate(kind, updated)
        if kind.resource == "pods":
            _check_pod_update(stored, updated)
        return self._replace_stored(kind.resource, stored, updated)

    def _replace_stored(
        self, resource: str, stored: dict[str, Any], updated: dict[str, Any]
    ) -> dict[str, Any]:
        meta = stored["metadata"]
        key = (meta.get("namespace", ""), meta["name"])
        updated["metadata"]["resourceVersion"] = str(self._next_rv())
        self.objects[resource][key] = updated
        self._record("MODIFIED", resource, updated, stored)
        return copy.deepcopy(updated)

    def _conflict(self, kind: Kind, name: str) -> ApiError:
        return ApiError(
            409,
            f'Operation cannot be fulfilled on {kind.resource} "{name}": the object has been '
            "modified; please apply your changes to the latest version and try again",
            "Conflict",
            name,
            kind.resource,
            kind.group,
        )

    def _delete(self, kind: Kind, key: tuple[str, str], options: dict[str, Any]) -> dict[str, Any]:
        stored = self._stored(kind, key)
        preconditions = options.get("preconditions") or {}
        uid = preconditions.get("uid")
        if uid is not None and uid != stored["metadata"]["uid"]:
            raise ApiError(
                409,
                f"Precondition failed: UID in precondition: {uid}, UID in object meta: "
                f"{stored['metadata']['uid']}",
                "Conflict",
                key[1],
                kind.resource,
                kind.group,
            )
        version = preconditions.get("resourceVersion")
        if version is not None and version != stored["metadata"]["resourceVersion"]:
            raise self._conflict(kind, key[1])
        grace = options.get("gracePeriodSeconds")
        if kind.resource == "pods" and self.graceful_deletion and grace != 0:
            if stored["metadata"].get("deletionTimestamp"):
                return copy.deepcopy(stored)
            seconds = (
                grace
                if isinstance(grace, int)
                else (stored.get("spec", {}).get("terminationGracePeriodSeconds", 30))
            )

            def terminating(pod: dict[str, Any]) -> None:
                pod["metadata"]["deletionTimestamp"] = rfc3339(time.time() + seconds)
                pod["metadata"]["deletionGracePeriodSeconds"] = seconds

            return self.mutate("pods", key[1], terminating, key[0])
        gone = self.remove(kind.resource, key[1], key[0])
        assert gone is not None
        return copy.deepcopy(gone)

    def finish_terminating(self) -> int:
        """The kubelet's last step for every terminating pod: gone. Returns how many."""
        with self._lock:
            terminating = [
                key
                for key, pod in self.objects["pods"].items()
                if pod["metadata"].get("deletionTimestamp")
            ]
            for namespace, name in terminating:
                self.remove("pods", name, namespace)
            return len(terminating)

    # -- eviction --------------------------------------------------------------------------------

    def _budget(self, pdb: dict[str, Any]) -> tuple[int, int, int]:
        """(expected pods, healthy pods, desired healthy) of a PodDisruptionBudget, computed now
        (the disruption controller's work, never behind)."""
        namespace = pdb["metadata"]["namespace"]
        spec = pdb.get("spec") or {}
        covered = [
            pod
            for (ns, _), pod in self.objects["pods"].items()
            if ns == namespace
            and selector_matches(spec.get("selector"), pod["metadata"].get("labels") or {})
            and (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
        ]
        expected = len(covered)
        healthy = sum(1 for pod in covered if _healthy(pod))
        if "minAvailable" in spec:
            desired = _scaled(spec["minAvailable"], expected)
        elif "maxUnavailable" in spec:
            desired = max(0, expected - _scaled(spec["maxUnavailable"], expected))
        else:
            desired = expected
        return expected, healthy, desired

    def _evict(self, key: tuple[str, str], eviction: dict[str, Any]) -> dict[str, Any]:
        pods = BY_RESOURCE["pods"]
        if eviction.get("kind", "Eviction") != "Eviction":
            raise ApiError(400, "the body is not an Eviction")
        if (eviction.get("metadata") or {}).get("name", key[1]) != key[1]:
            raise ApiError(400, "name in URL does not match name in Eviction object")
        pod = self._stored(pods, key)
        delete = eviction.get("deleteOptions") or {}
        if pod["metadata"].get("deletionTimestamp"):
            return _success()
        if (pod.get("status") or {}).get("phase") in ("Pending", "Succeeded", "Failed"):
            self._delete(pods, key, delete)
            return _success()
        labels = pod["metadata"].get("labels") or {}
        budgets = [
            pdb
            for (ns, _), pdb in sorted(self.objects["poddisruptionbudgets"].items())
            if ns == key[0] and selector_matches((pdb.get("spec") or {}).get("selector"), labels)
        ]
        if len(budgets) > 1:
            raise ApiError(
                500,
                "This pod has more than one PodDisruptionBudget, which the eviction subresource "
                "does not support.",
            )
        if budgets and _healthy(pod):
            budget = budgets[0]
            _, healthy, desired = self._budget(budget)
            if healthy - desired <= 0:
                name = budget["metadata"]["name"]
                raise ApiError(
                    429,
                    "Cannot evict pod as it would violate the pod's disruption budget.",
                    "TooManyRequests",
                    causes=[
                        {
                            "reason": "DisruptionBudget",
                            "message": f"The disruption budget {name} needs {desired} healthy "
                            f"pods and has {healthy} currently",
                        }
                    ],
                    kind="pods",
                    group="",
                    name=key[1],
                )
        self._delete(pods, key, delete)
        return _success()

    # -- watch -----------------------------------------------------------------------------------

    def _watch(
        self, kind: Kind, namespace: str | None, query: Mapping[str, str]
    ) -> Iterator[dict[str, Any]]:
        matches = self._matcher(kind, query)  # a bad selector fails before the stream starts
        timeout = query.get("timeoutSeconds")
        deadline = time.monotonic() + (float(timeout) if timeout else bound(60))
        start = query.get("resourceVersion", "")
        if start not in ("", "0") and not start.isdigit():
            raise ApiError(400, f"resourceVersion {start!r} is not a resource version")
        return self._stream(kind, namespace, matches, start, deadline)

    def _stream(
        self,
        kind: Kind,
        namespace: str | None,
        matches: Callable[[dict[str, Any]], bool],
        start: str,
        deadline: float,
    ) -> Iterator[dict[str, Any]]:
        """The events of a watch, as the handler writes them (run outside ``handle``'s lock)."""
        with self._lock:
            if start in ("", "0"):
                cursor = self.revision
                initial = [
                    obj
                    for (ns, _), obj in sorted(self.objects[kind.resource].items())
                    if (namespace is None or ns == namespace) and matches(obj)
                ]
                ready = [{"type": "ADDED", "object": copy.deepcopy(o)} for o in initial]
            else:
                cursor = int(start)
                if cursor < self.compacted:
                    ready = [_expired(cursor, self.compacted)]
                    deadline = 0.0
                else:
                    ready = []
        yield from ready
        while time.monotonic() < deadline:
            with self._lock:
                if self.closed:
                    return
                if cursor < self.compacted:
                    yield _expired(cursor, self.compacted)
                    return
                fresh = [e for e in self.events if e.version > cursor]
                if not fresh:
                    self._changed.wait(min(0.5, max(0.0, deadline - time.monotonic())))
                    continue
                cursor = fresh[-1].version
                out = []
                for event in fresh:
                    if event.resource != kind.resource:
                        continue
                    if (
                        namespace is not None
                        and event.obj["metadata"].get("namespace") != namespace
                    ):
                        continue
                    now = matches(event.obj)
                    was = event.before is not None and matches(event.before)
                    type_ = event.type
                    if type_ == "MODIFIED" and was and not now:
                        type_ = "DELETED"
                    elif type_ == "MODIFIED" and now and not was:
                        type_ = "ADDED"
                    elif not now:
                        continue
                    out.append({"type": type_, "object": copy.deepcopy(event.obj)})
            yield from out

    # -- leases (unchanged shapes) --------------------------------------------------------------

    def _lease_answer(
        self, method: str, path: str, match: re.Match[str], body: bytes
    ) -> tuple[int, Any]:
        namespace, name = match["ns"], match["name"]
        if method == "GET" and name is None:
            return 200, self._list_leases(namespace)
        if method == "GET" and name is not None:
            return 200, self._get_lease(namespace, name)
        if method == "POST" and name is None:
            return 201, self._create_lease(namespace, _json(body))
        if method == "PUT" and name is not None:
            return 200, self._replace_lease(namespace, name, _json(body))
        raise ApiError(405, f"{method} is not supported on {path}")

    def _list_leases(self, namespace: str) -> dict[str, Any]:
        items = [lease for (ns, _), lease in sorted(self.leases.items()) if ns == namespace]
        return {
            "kind": "LeaseList",
            "apiVersion": API_VERSION,
            "metadata": {"resourceVersion": str(self._last_version())},
            "items": items,
        }

    def _get_lease(self, namespace: str, name: str) -> dict[str, Any]:
        stored = self.leases.get((namespace, name))
        if stored is None:
            raise ApiError(404, f'leases.{GROUP} "{name}" not found', name=name)
        return stored

    def _create_lease(self, namespace: str, lease: dict[str, Any]) -> dict[str, Any]:
        meta = self._checked_lease(namespace, lease)
        name = meta.get("name")
        if not name:
            raise ApiError(422, "metadata.name: Required value")
        if (namespace, name) in self.leases:
            raise ApiError(409, f'leases.{GROUP} "{name}" already exists', "AlreadyExists", name)
        stored = self._stored_lease(namespace, lease)
        stored["metadata"].update(
            uid=str(uuid.uuid4()),
            creationTimestamp=datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        )
        self.leases[(namespace, name)] = stored
        return stored

    def _replace_lease(self, namespace: str, name: str, lease: dict[str, Any]) -> dict[str, Any]:
        meta = self._checked_lease(namespace, lease)
        if meta.get("name") != name:
            raise ApiError(400, "the name of the object does not match the name on the URL")
        current = self._get_lease(namespace, name)
        version = meta.get("resourceVersion")
        if version and version != current["metadata"]["resourceVersion"]:
            raise ApiError(
                409,
                f'Operation cannot be fulfilled on leases.{GROUP} "{name}": the object has been '
                "modified; please apply your changes to the latest version and try again",
                "Conflict",
                name,
            )
        stored = self._stored_lease(namespace, lease)
        for kept in ("uid", "creationTimestamp"):
            stored["metadata"][kept] = current["metadata"][kept]
        self.leases[(namespace, name)] = stored
        return stored

    @staticmethod
    def _checked_lease(namespace: str, lease: dict[str, Any]) -> dict[str, Any]:
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

    def _stored_lease(self, namespace: str, lease: dict[str, Any]) -> dict[str, Any]:
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
                "resourceVersion": str(self._next_rv()),
            },
            "spec": {k: v for k, v in spec.items() if v is not None},
        }

    def _last_version(self) -> int:
        versions = [int(lease["metadata"]["resourceVersion"]) for lease in self.leases.values()]
        return max(versions, default=0)


# -- validation as the API server does it, for what is written here ------------------------------

_LABEL_NAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9_.-]{0,61}[A-Za-z0-9])?$")
_LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([A-Za-z0-9_.-]{0,61}[A-Za-z0-9])?)?$")
_PREFIX = re.compile(r"^[a-z0-9]([a-z0-9-]*[a-z0-9])?(\.[a-z0-9]([a-z0-9-]*[a-z0-9])?)*$")
EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")


def _validate(kind: Kind, obj: dict[str, Any]) -> None:
    """422 ``Invalid`` for what the real server refuses among the fields our code writes: label
    keys and values, annotation values, ``spec.unschedulable`` and ``spec.taints``."""
    meta = obj.get("metadata") or {}
    problems: list[str] = []
    for key, value in (meta.get("labels") or {}).items():
        prefix, _, name = key.rpartition("/")
        if not _LABEL_NAME.match(name) or (prefix and not _PREFIX.match(prefix)):
            problems.append(f"metadata.labels: Invalid value: {key!r}: not a label key")
        if not isinstance(value, str) or not _LABEL_VALUE.match(value):
            problems.append(f"metadata.labels: Invalid value: {value!r}: not a label value")
    for key, value in (meta.get("annotations") or {}).items():
        if not isinstance(value, str):
            problems.append(f"metadata.annotations.{key}: Invalid value: must be a string")
    spec = obj.get("spec") or {}
    if kind.resource == "nodes":
        if not isinstance(spec.get("unschedulable", False), bool):
            problems.append("spec.unschedulable: Invalid value: must be a boolean")
        taints = spec.get("taints") or []
        if not isinstance(taints, list):
            problems.append("spec.taints: Invalid value: must be a list")
            taints = []
        seen: set[tuple[str, str]] = set()
        for index, taint in enumerate(taints):
            if not isinstance(taint, dict) or not taint.get("key"):
                problems.append(f"spec.taints[{index}].key: Required value")
                continue
            if taint.get("effect") not in EFFECTS:
                problems.append(f"spec.taints[{index}].effect: Unsupported value")
            pair = (taint["key"], str(taint.get("effect")))
            if pair in seen:
                problems.append(f"spec.taints[{index}]: Duplicate value: {pair!r}")
            seen.add(pair)
    if problems:
        name = meta.get("name", "")
        raise ApiError(
            422,
            f'{kind.kind} "{name}" is invalid: {problems[0]}',
            "Invalid",
            name,
            kind.resource,
            kind.group,
        )


def _check_pod_update(stored: dict[str, Any], updated: dict[str, Any]) -> None:
    """422 for a pod update that takes away or changes a toleration: the real server's pod
    update validation lets ``spec.tolerations`` take additions only (``tolerationSeconds``
    aside)."""

    def keyed(pod: Mapping[str, Any]) -> list[str]:
        found = (pod.get("spec") or {}).get("tolerations") or []
        return [
            json.dumps({k: v for k, v in t.items() if k != "tolerationSeconds"}, sort_keys=True)
            for t in found
            if isinstance(t, dict)
        ]

    after = keyed(updated)
    if any(t not in after for t in keyed(stored)):
        name = stored["metadata"]["name"]
        raise ApiError(
            422,
            f'Pod "{name}" is invalid: spec: Forbidden: pod updates may not change fields other '
            "than `spec.containers[*].image`, `spec.initContainers[*].image`, "
            "`spec.activeDeadlineSeconds`, `spec.tolerations` (only additions to existing "
            "tolerations) or `spec.terminationGracePeriodSeconds`",
            "Invalid",
            name,
            "pods",
            "",
        )


def _healthy(pod: Mapping[str, Any]) -> bool:
    status = pod.get("status") or {}
    if status.get("phase") != "Running" or pod["metadata"].get("deletionTimestamp"):
        return False
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in status.get("conditions") or []
    )


def _scaled(value: Any, total: int) -> int:
    if isinstance(value, str) and value.endswith("%"):
        return math.ceil(int(value[:-1]) * total / 100)
    return int(value)


def _success() -> dict[str, Any]:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}


def _expired(wanted: int, oldest: int) -> dict[str, Any]:
    return {
        "type": "ERROR",
        "object": {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": f"too old resource version: {wanted} ({oldest})",
            "reason": "Expired",
            "code": 410,
        },
    }


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
        protocol_version = "HTTP/1.1"  # chunked watch streams; the client keeps connections

        def _serve(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            status, answer = api.handle(
                self.command,
                self.path,
                self.headers.get("Authorization"),
                body,
                self.headers.get("Content-Type"),
            )
            if isinstance(answer, Iterator):
                self._stream(answer)
                return
            data = json.dumps(answer).encode()
            try:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
            except OSError:
                self.close_connection = True  # the client gave up waiting (a timeout test)

        def _stream(self, events: Iterator[dict[str, Any]]) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            try:
                for event in events:
                    line = json.dumps(event).encode() + b"\n"
                    self.wfile.write(f"{len(line):x}\r\n".encode() + line + b"\r\n")
                    self.wfile.flush()
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()
            except OSError:
                pass  # the client went away
            self.close_connection = True

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
        api.close()
        server.shutdown()
        server.server_close()
        thread.join(timeout=bound(30))
