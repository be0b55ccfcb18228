"""A Compute Engine emulator for the GCP tests, and the GCP world of the provider contract.

The emulator is a small HTTP server (stdlib, in a thread) that speaks the REST shapes
google-cloud-compute sends with ``transport="rest"``: camelCase JSON under
``/compute/v1/projects/{project}``, zone operations, list filters, pagination with a small page
size, ``requestId`` deduplication and Google's error bodies. The provider is tested through the
real SDK over HTTP, so what runs in production is what runs here; no SDK method is patched.

Gangs: ``instances.bulkInsert`` (``count``, ``minCount``, ``perInstanceProperties`` or
``namePattern``, ``instanceProperties`` with short machine type, accelerator and resource-policy
names) makes ``count`` VMs, or at least ``minCount``, or none with a capacity error; and regional
``resourcePolicies`` (insert, get) with their region operations. ``gang_fits(k)`` lets at most
``k`` VMs of a bulk insert fit; with ``leftovers`` the VMs that did are still there when the
operation fails, as when Compute Engine has not yet deleted what it made.

Authentication is Google's: every API request must carry a bearer token the emulator issued, and
the provider finds its credentials the standard way, Application Default Credentials. The
emulator also serves the metadata server a Compute Engine VM or a GKE pod with Workload Identity
gets its tokens from (``/computeMetadata/v1/...``, ``Metadata-Flavor: Google``), and the session's
``GCE_METADATA_HOST`` and ``GCE_METADATA_IP`` point google-auth at it, with no key file and no
gcloud configuration in the way. (An ``authorized_user`` file's ``token_uri`` is ignored by
google-auth, which always asks Google; with a service-account key google-cloud-compute signs its
own tokens, and google-auth then looks up the account's access boundary on
iamcredentials.googleapis.com. The emulator's account is not a ``gserviceaccount.com`` one, so
google-auth makes no such lookup.)

Faults are injected the way Compute Engine answers: an HTTP error with Google's error body (429
with ``Retry-After``, 500, 401, 403, quota as 403; a 401 also makes the metadata server refuse the
token google-auth then asks for, as when the account is disabled), an accepted insert whose
operation ends ``DONE`` with an ``error`` (capacity, quota), an operation that stays ``RUNNING``
for a few polls, an insert done whose answer is lost (500), a 500 in the middle of a paged
listing. Zones can be full, capacity can run out after a number of VMs, new VMs can be hidden from
reads for a while (eventual consistency), and Spot VMs can be preempted (``TERMINATED``, or
deleted, with a ``compute.instances.preempted`` operation).
"""

from __future__ import annotations

import itertools
import json
import random
import re
import secrets
import threading
import time
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar
from urllib.parse import parse_qs, urlsplit

import pytest
from contract_support import FAULT_KINDS, FLEET, Operation
from waits import bound

from autoscaler.model import Pool
from autoscaler.model.clock import Clock
from autoscaler.spi.provider import Provider
from providers.gcp import GcpProvider
from providers.gcp.instances import tags_from_labels

PROJECT = "gpu-autoscaler-test"
REGION = "us-central1"
ZONES = ("us-central1-a", "us-central1-b", "us-central1-c", "europe-west4-a")
PAGE_SIZE = 3
BASE = "https://www.googleapis.com/compute/v1"
IMAGE = "projects/debian-cloud/global/images/family/debian-12"
PREEMPTED = "compute.instances.preempted"
METADATA = "/computeMetadata/v1/"
ACCOUNT = "controller@compute-emulator.internal"  # not a Google service account: no RAB lookup
SCOPE = "https://www.googleapis.com/auth/compute"
REGIONS = tuple(sorted({zone.rsplit("-", 1)[0] for zone in ZONES}))
COLLOCATIONS = ("COLLOCATED", "UNSPECIFIED_COLLOCATION")

# the kinds of request a fault can be planned for
KINDS = ("insert", "list", "get", "delete", "operation", "operations", "page", "bulk", "policy")
# faults answered at the front door, before the request changes anything
HTTP_FAULTS = ("throttle", "server", "auth", "forbidden", "quota-http", "quota-http-global")
# faults of an accepted insert, reported in its operation
OPERATION_FAULTS = ("capacity", "quota", "quota-global", "slow", "lost")
NAME = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")
LABEL_KEY = re.compile(r"^[a-z][a-z0-9_-]{0,62}$")
LABEL_VALUE = re.compile(r"^[a-z0-9_-]{0,63}$")
EXPRESSION = re.compile(
    r"^\s*(?P<field>[A-Za-z][\w.-]*)\s*(?P<op>!=|=|eq\b|ne\b)\s*(?P<value>\"[^\"]*\"|[^\s()\"]+)\s*$"
)


class GoogleError(Exception):
    """An HTTP error answer in Google's shape."""

    def __init__(
        self,
        status: int,
        reason: str,
        message: str,
        grpc_status: str,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.headers = headers or {}
        self.body = {
            "error": {
                "code": status,
                "message": message,
                "errors": [{"message": message, "domain": "global", "reason": reason}],
                "status": grpc_status,
            }
        }


def refusal(fault: str, retry_after: str) -> GoogleError:
    """The HTTP answer Compute Engine gives for a front-door fault."""
    if fault == "throttle":
        return GoogleError(
            429,
            "rateLimitExceeded",
            "Rate Limit Exceeded",
            "RESOURCE_EXHAUSTED",
            {"Retry-After": retry_after},
        )
    if fault == "server":
        return GoogleError(500, "backendError", "Internal error. Please try again.", "INTERNAL")
    if fault == "auth":
        return GoogleError(
            401,
            "required",
            "Request is missing required authentication credential.",
            "UNAUTHENTICATED",
        )
    if fault == "forbidden":
        return GoogleError(
            403,
            "forbidden",
            "Required 'compute.instances.create' permission",
            "PERMISSION_DENIED",
        )
    if fault == "quota-http":
        return GoogleError(
            403,
            "quotaExceeded",
            f"Quota 'NVIDIA_A100_GPUS' exceeded.  Limit: 8.0 in region {REGION}.",
            "PERMISSION_DENIED",
        )
    if fault == "quota-http-global":
        return GoogleError(
            403,
            "quotaExceeded",
            "Quota 'GPUS_ALL_REGIONS' exceeded.  Limit: 8.0 globally.",
            "PERMISSION_DENIED",
        )
    raise ValueError(f"not an HTTP fault: {fault}")


def operation_error(fault: str, zone: str) -> dict[str, Any]:
    """The ``error`` and HTTP fields of an insert operation that ended DONE in failure."""
    if fault == "capacity":
        return {
            "error": {
                "errors": [
                    {
                        "code": "ZONE_RESOURCE_POOL_EXHAUSTED",
                        "message": f"The zone 'projects/{PROJECT}/zones/{zone}' does not have "
                        "enough resources available to fulfill the request.  Try a different zone, "
                        "or try again later.",
                    }
                ]
            },
            "httpErrorStatusCode": 503,
            "httpErrorMessage": "SERVICE UNAVAILABLE",
        }
    region = zone.rsplit("-", 1)[0]
    if fault == "quota":
        message = f"Quota 'NVIDIA_A100_GPUS' exceeded.  Limit: 8.0 in region {region}."
        info = {
            "metricName": "compute.googleapis.com/nvidia_a100_gpus",
            "limitName": "GPUS-PER-GPU-FAMILY-per-project-region",
            "dimensions": {"region": region, "gpu_family": "NVIDIA_A100"},
            "limit": 8,
        }
    else:
        message = "Quota 'GPUS_ALL_REGIONS' exceeded.  Limit: 8.0 globally."
        info = {
            "metricName": "compute.googleapis.com/gpus_all_regions",
            "limitName": "GPUS-ALL-REGIONS-per-project",
            "limit": 8,
        }
    return {
        "error": {
            "errors": [
                {
                    "code": "QUOTA_EXCEEDED",
                    "message": message,
                    "errorDetails": [{"quotaInfo": info}],
                }
            ]
        },
        "httpErrorStatusCode": 403,
        "httpErrorMessage": "FORBIDDEN",
    }


def parse_filter(text: str) -> list[tuple[str, str, str]]:
    """Compute Engine's list filter: one ``field op value`` expression, or several, each in
    parentheses (AND). Anything else is refused, as the real API refuses it."""
    text = text.strip()
    if not text:
        return []
    parts = re.findall(r"\(([^()]*)\)", text) if text.startswith("(") else [text]
    rest = re.sub(r"\([^()]*\)", "", text) if text.startswith("(") else ""
    if rest.replace("AND", "").strip():
        raise GoogleError(400, "invalid", f"Invalid value for field 'filter': '{text}'.", "INVALID")
    terms = []
    for part in parts:
        found = EXPRESSION.match(part)
        if found is None:
            raise GoogleError(
                400, "invalid", f"Invalid value for field 'filter': '{text}'.", "INVALID"
            )
        terms.append((found["field"], found["op"], found["value"].strip('"')))
    return terms


def field_value(resource: dict[str, Any], path: str) -> str | None:
    value: Any = resource
    for part in path.split("."):
        if not isinstance(value, dict) or part not in value:
            return None
        value = value[part]
    if isinstance(value, bool):
        return "true" if value else "false"
    return None if isinstance(value, (dict, list)) else str(value)


def matches(resource: dict[str, Any], terms: Sequence[tuple[str, str, str]]) -> bool:
    for name, op, wanted in terms:
        value = field_value(resource, name)
        if op in ("eq", "ne"):
            hit = value is not None and re.fullmatch(wanted, value) is not None
        else:
            hit = value == wanted
        if hit != (op in ("=", "eq")):
            return False
    return True


def stamp(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).isoformat(timespec="milliseconds")


class ComputeEmulator:
    """Compute Engine's instance and zone-operation API for one project, kept in memory."""

    def __init__(self, project: str = PROJECT, page_size: int = PAGE_SIZE) -> None:
        self.project = project
        self.page_size = page_size
        self.lock = threading.RLock()
        self._server: ThreadingHTTPServer | None = None
        self.url = ""
        self.issued: set[str] = set()  # access tokens the metadata server handed out
        self.token_requests = 0
        self.reset()

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> str:
        emulator = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True  # headers and body leave at once, not 40 ms apart

            def log_message(self, format: str, *args: Any) -> None:
                """Quiet: the tests read the emulator's state, not its access log."""

            def _answer(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                status, headers, payload = emulator.handle(
                    self.command, self.path, raw, self.headers
                )
                body = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json; charset=UTF-8")
                self.send_header("Content-Length", str(len(body)))
                for key, value in headers.items():
                    self.send_header(key, value)
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = do_DELETE = _answer  # noqa: N815 (http.server's names)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self._server.server_port}"
        return self.url

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    def environment(self, gcloud_config: Path) -> dict[str, str | None]:
        """What a process needs for Application Default Credentials to find this emulator's
        metadata server (None: unset): no key file, and an empty gcloud configuration, so that
        ADC goes on to the metadata server as it does on a VM or a GKE pod."""
        host = self.url.removeprefix("http://")
        return {
            "GOOGLE_APPLICATION_CREDENTIALS": None,
            "CLOUDSDK_CONFIG": str(gcloud_config),
            "GCE_METADATA_HOST": host,
            "GCE_METADATA_IP": host,
        }

    def reset(self) -> None:
        with self.lock:
            self.instances: dict[tuple[str, str], dict[str, Any]] = {}
            self.operations: dict[tuple[str, str], dict[str, Any]] = {}
            self.by_request_id: dict[str, tuple[str, str]] = {}
            self.polls_left: dict[tuple[str, str], int] = {}
            self.planned: dict[str, list[str]] = {kind: [] for kind in KINDS}
            self.chance = 0.0
            self.rng = random.Random(0)
            self.capacity: int | None = None
            self.full_zones: set[str] = set()
            self.hidden: set[str] = set()  # names reads do not show yet (eventual consistency)
            self.slow_polls = 3
            self.retry_after = "7"
            self.clock: Callable[[], float] = time.time
            self.requests: list[tuple[str, str]] = []
            self.injected: list[tuple[str, str]] = []
            self._ids = itertools.count(1_000_001)
            self.policies: dict[tuple[str, str], dict[str, Any]] = {}
            self.region_operations: dict[tuple[str, str], dict[str, Any]] = {}
            self.region_requests: dict[str, tuple[str, str]] = {}
            self.bulk_members: dict[tuple[str, str], list[str]] = {}
            self.gang_fit: int | None = None
            self.leftovers = False
            self.refuse_tokens = 0  # token requests to refuse (after an "auth" fault)

    # -- what a test may tell it -------------------------------------------------------------

    def fail_next(self, kind: str, fault: str, times: int = 1) -> None:
        """The next ``times`` requests of ``kind`` fail with ``fault`` (``ok`` lets one through);
        ``page`` is any listing request that carries a page token (a fault in the middle of a
        paged listing)."""
        assert kind in KINDS, kind
        assert fault in (*HTTP_FAULTS, "ok") or (
            kind in ("insert", "bulk") and fault in OPERATION_FAULTS
        )
        with self.lock:
            self.planned[kind].extend([fault] * times)

    def chaos(self, chance: float, seed: int) -> None:
        with self.lock:
            self.chance = chance
            self.rng = random.Random(seed)

    def gang_fits(self, count: int | None, *, leftovers: bool = False) -> None:
        """At most ``count`` VMs of a bulk insert fit; with ``leftovers``, a bulk insert that
        fails for it leaves the VMs that did fit behind (still being deleted)."""
        with self.lock:
            self.gang_fit = count
            self.leftovers = leftovers

    def add_policy(self, region: str, name: str, collocation: str = "COLLOCATED") -> None:
        """A resource policy made outside the provider (an operator's terraform, say)."""
        with self.lock:
            self._new_policy(region, name, {"groupPlacementPolicy": {"collocation": collocation}})

    def policies_of(self, name: str) -> list[str]:
        """The resource policies (short names) a VM was made under."""
        with self.lock:
            return [
                link.rsplit("/", 1)[-1] for link in self.find(name)[1].get("resourcePolicies", [])
            ]

    def add_instance(
        self,
        zone: str,
        name: str,
        labels: dict[str, str] | None = None,
        *,
        status: str = "RUNNING",
        spot: bool = False,
        machine_type: str = "a2-highgpu-1g",
    ) -> dict[str, Any]:
        """An instance created outside the provider (someone else's, or a fixture)."""
        body: dict[str, Any] = {
            "name": name,
            "machineType": f"zones/{zone}/machineTypes/{machine_type}",
            "labels": labels or {},
            "scheduling": {"provisioningModel": "SPOT" if spot else "STANDARD"},
        }
        with self.lock:
            return self._create(zone, body, status)

    def preempt(self, name: str, *, delete: bool = False) -> dict[str, Any]:
        """Take a Spot VM back: it goes TERMINATED (and is deleted, with ``delete``, as its
        termination action DELETE does) and the zone records a preemption operation."""
        with self.lock:
            zone, instance = self.find(name)
            instance["status"] = "TERMINATED"
            if delete:
                del self.instances[(zone, name)]
            operation = self._operation(zone, PREEMPTED, instance, "system")
            operation["status"] = "DONE"
            return operation

    def set_status(self, name: str, status: str) -> None:
        with self.lock:
            self.find(name)[1]["status"] = status

    def find(self, name: str) -> tuple[str, dict[str, Any]]:
        with self.lock:
            for (zone, other), instance in self.instances.items():
                if other == name:
                    return zone, instance
        raise KeyError(name)

    def live(self) -> dict[str, dict[str, Any]]:
        """Instances that hold or will hold capacity, by name."""
        with self.lock:
            return {
                name: instance
                for (_, name), instance in self.instances.items()
                if instance["status"] in ("PROVISIONING", "STAGING", "RUNNING")
            }

    # -- HTTP --------------------------------------------------------------------------------

    def handle(
        self, method: str, target: str, raw: bytes, headers: Mapping[str, str] | None = None
    ) -> tuple[int, dict[str, str], Any]:
        parts = urlsplit(target)
        query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
        headers = headers or {}
        with self.lock:
            if parts.path == "/" or parts.path.startswith(METADATA):
                return self._metadata(method, parts.path, headers)
            bearer = str(headers.get("Authorization", "")).removeprefix("Bearer ")
            if bearer not in self.issued:
                refused = refusal("auth", self.retry_after)
                return refused.status, refused.headers, refused.body
            self.requests.append((method, parts.path))
            try:
                body = json.loads(raw) if raw else {}
                return 200, {}, self._route(method, parts.path, query, body)
            except GoogleError as refused:
                if refused.status == 401:
                    self.refuse_tokens += 1  # the account itself is refused
                return refused.status, refused.headers, refused.body

    def _metadata(
        self, method: str, path: str, headers: Mapping[str, str]
    ) -> tuple[int, dict[str, str], Any]:
        """The metadata server's answers google-auth asks for: the ping, the project, the
        default service account and its access token."""
        flavor = {"Metadata-Flavor": "Google"}
        if method != "GET" or headers.get("Metadata-Flavor") != "Google":
            return 403, flavor, {"error": "Missing Metadata-Flavor:Google header."}
        # the default account is served under its alias and under its email, as on a VM
        accounts = [f"{METADATA}instance/service-accounts/{name}/" for name in ("default", ACCOUNT)]
        if path == "/":
            return 200, flavor, {}
        if path == f"{METADATA}project/project-id":
            return 200, flavor, self.project
        if path in accounts:
            return 200, flavor, {"aliases": ["default"], "email": ACCOUNT, "scopes": [SCOPE]}
        if path in (f"{account}token" for account in accounts):
            self.token_requests += 1
            if self.refuse_tokens:
                self.refuse_tokens -= 1
                return 403, flavor, {"error": "the service account is disabled"}
            token = f"ya29.emulator-{secrets.token_urlsafe(16)}"
            self.issued.add(token)
            return 200, flavor, {"access_token": token, "expires_in": 3599, "token_type": "Bearer"}
        return 404, flavor, {"error": f"{path} is not served here"}

    def _route(self, method: str, path: str, query: dict[str, str], body: Any) -> Any:
        prefix = f"/compute/v1/projects/{self.project}/"
        if not path.startswith(prefix):
            raise not_found(path)
        rest = path[len(prefix) :].split("/")
        if len(rest) >= 3 and rest[0] == "regions":
            return self._regional(method, rest, query, body)
        if (
            len(rest) == 4
            and rest[0] == "zones"
            and rest[2:] == ["instances", "bulkInsert"]
            and method == "POST"
        ):
            return self._bulk_insert(known("zones", rest[1], ZONES), query, body)
        if rest == ["aggregated", "instances"] and method == "GET":
            self._door("list", query)
            return self._aggregated(query)
        if len(rest) >= 3 and rest[0] == "zones" and rest[2] in ("instances", "operations"):
            zone = known("zones", rest[1], ZONES)
            if rest[2] == "instances":
                if len(rest) == 3 and method == "POST":
                    return self._insert(zone, query, body)
                if len(rest) == 3 and method == "GET":
                    self._door("list", query)
                    return self._list(zone, query)
                if len(rest) == 4 and method == "GET":
                    self._door("get", query)
                    return self._get(zone, rest[3])
                if len(rest) == 4 and method == "DELETE":
                    return self._delete(zone, rest[3], query)
            else:
                if len(rest) == 3 and method == "GET":
                    self._door("operations", query)
                    return self._operations(zone, query)
                if len(rest) == 4 and method == "GET":
                    self._door("operation", query)
                    return self._poll(zone, rest[3])
                if len(rest) == 5 and rest[4] == "wait" and method == "POST":
                    self._door("operation", query)
                    return self._poll(zone, rest[3])
        raise GoogleError(404, "notFound", f"{method} {path} is not served here", "NOT_FOUND")

    def _fault(self, kind: str, query: dict[str, str]) -> tuple[str, str] | None:
        """The planned or random fault for this request, if any, and what it was planned for."""
        kinds = ("page", kind) if query.get("pageToken") else (kind,)
        for each in kinds:
            if self.planned[each]:
                return each, self.planned[each].pop(0)
        if self.chance and self.rng.random() < self.chance:
            choices = HTTP_FAULTS[:3] + (OPERATION_FAULTS if kind == "insert" else ())
            return kind, self.rng.choice(choices)
        return None

    def _door(self, kind: str, query: dict[str, str]) -> str | None:
        """Answer a front-door fault now; hand an operation fault back to the caller."""
        found = self._fault(kind, query)
        if found is None or found[1] == "ok":
            return None
        self.injected.append(found)
        if found[1] in HTTP_FAULTS:
            raise refusal(found[1], self.retry_after)
        return found[1]

    # -- instances ---------------------------------------------------------------------------

    def _link(self, zone: str, kind: str = "", name: str = "") -> str:
        link = f"{BASE}/projects/{self.project}/zones/{zone}"
        return f"{link}/{kind}/{name}" if kind else link

    def _create(self, zone: str, body: dict[str, Any], status: str) -> dict[str, Any]:
        name = str(body.get("name", ""))
        if not NAME.match(name):
            raise GoogleError(
                400, "invalid", f"Invalid value for field 'resource.name': '{name}'.", "INVALID"
            )
        labels = body.get("labels") or {}
        for key, value in labels.items():
            if not LABEL_KEY.match(key) or not LABEL_VALUE.match(str(value)):
                raise GoogleError(
                    400,
                    "invalid",
                    f"Invalid value for field 'resource.labels': '{key}={value}'.",
                    "INVALID",
                )
        self._refuse_taken(zone, name)
        machine = str(body.get("machineType", "")).rsplit("/", 1)[-1]
        instance = {
            **body,
            "kind": "compute#instance",
            "id": str(next(self._ids)),
            "creationTimestamp": stamp(self.clock()),
            "zone": self._link(zone),
            "machineType": self._link(zone, "machineTypes", machine),
            "selfLink": self._link(zone, "instances", name),
            "status": status,
        }
        self.instances[(zone, name)] = instance
        return instance

    def _refuse_taken(self, zone: str, name: str) -> None:
        """Names are unique per zone: a second insert of one is refused with 409."""
        if (zone, name) in self.instances:
            raise GoogleError(
                409,
                "alreadyExists",
                f"The resource 'projects/{self.project}/zones/{zone}/instances/{name}' "
                "already exists",
                "ALREADY_EXISTS",
            )

    def _operation(
        self, zone: str, kind: str, instance: dict[str, Any], user: str = "tests"
    ) -> dict[str, Any]:
        now = stamp(self.clock())
        number = next(self._ids)
        name = f"operation-{number}-{kind.rsplit('.', 1)[-1]}"
        operation = {
            "kind": "compute#operation",
            "id": str(number),
            "name": name,
            "zone": self._link(zone),
            "operationType": kind,
            "targetLink": instance.get("selfLink")
            or self._link(zone, "instances", instance["name"]),
            "targetId": instance.get("id", "0"),
            "status": "RUNNING",
            "user": user,
            "progress": 0,
            "insertTime": now,
            "startTime": now,
            "selfLink": self._link(zone, "operations", name),
        }
        self.operations[(zone, name)] = operation
        return operation

    def _insert(self, zone: str, query: dict[str, str], body: dict[str, Any]) -> dict[str, Any]:
        fault = self._door("insert", query)
        request_id = query.get("requestId")
        if request_id and request_id in self.by_request_id:
            return self.operations[self.by_request_id[request_id]]
        name = str(body.get("name", ""))
        self._refuse_taken(zone, name)
        if not body.get("machineType") or not any(
            d.get("boot") and d.get("initializeParams", {}).get("sourceImage")
            for d in body.get("disks", [])
        ):
            raise GoogleError(
                400,
                "invalid",
                "Invalid value for field 'resource': a boot disk with a source image is required.",
                "INVALID",
            )
        if fault is None and zone in self.full_zones:
            fault = "capacity"
        if fault is None and self.capacity is not None:
            if self.capacity <= 0:
                fault = "capacity"
            else:
                self.capacity -= 1
        if fault in ("capacity", "quota", "quota-global"):
            operation = self._operation(zone, "insert", {"name": name})
            operation.update(status="DONE", progress=100, endTime=operation["insertTime"])
            operation.update(operation_error(fault, zone))
        else:
            slow = fault == "slow"
            instance = self._create(zone, body, "PROVISIONING" if slow else "RUNNING")
            operation = self._operation(zone, "insert", instance)
            if slow:
                self.polls_left[(zone, operation["name"])] = self.slow_polls
            else:
                operation.update(status="DONE", progress=100, endTime=operation["insertTime"])
        if request_id:
            self.by_request_id[request_id] = (zone, operation["name"])
        if fault == "lost":
            raise refusal("server", self.retry_after)  # done, but the answer never arrives
        return operation

    def _page(self, items: list[Any], query: dict[str, str]) -> tuple[list[Any], str | None]:
        token = query.get("pageToken") or "page-0"
        if not token.startswith("page-") or not token[5:].isdigit():
            raise GoogleError(
                400, "invalid", f"Invalid value for field 'pageToken': '{token}'.", "INVALID"
            )
        start = int(token[5:])
        size = min(int(query.get("maxResults") or 500), self.page_size)
        end = start + size
        return items[start:end], (f"page-{end}" if end < len(items) else None)

    def _selected(self, zones: Sequence[str], query: dict[str, str]) -> list[dict[str, Any]]:
        terms = parse_filter(query.get("filter", ""))
        return [
            instance
            for (zone, name), instance in sorted(self.instances.items())
            if zone in zones and name not in self.hidden and matches(instance, terms)
        ]

    def _list(self, zone: str, query: dict[str, str]) -> dict[str, Any]:
        page, token = self._page(self._selected([zone], query), query)
        answer: dict[str, Any] = {
            "kind": "compute#instanceList",
            "id": f"projects/{self.project}/zones/{zone}/instances",
            "items": page,
            "selfLink": self._link(zone, "instances"),
        }
        if token:
            answer["nextPageToken"] = token
        return answer

    def _aggregated(self, query: dict[str, str]) -> dict[str, Any]:
        page, token = self._page(self._selected(ZONES, query), query)
        items: dict[str, Any] = {}
        for zone in ZONES:
            here = [i for i in page if i["zone"].endswith(f"/zones/{zone}")]
            items[f"zones/{zone}"] = (
                {"instances": here}
                if here
                else {
                    "warning": {
                        "code": "NO_RESULTS_ON_PAGE",
                        "message": "There are no results for scope 'zones/{zone}' on this page.",
                        "data": [{"key": "scope", "value": f"zones/{zone}"}],
                    }
                }
            )
        answer: dict[str, Any] = {
            "kind": "compute#instanceAggregatedList",
            "id": f"projects/{self.project}/aggregated/instances",
            "items": items,
        }
        if token:
            answer["nextPageToken"] = token
        return answer

    def _get(self, zone: str, name: str) -> dict[str, Any]:
        return self._stored(zone, name, visible=True)

    def _stored(self, zone: str, name: str, visible: bool = False) -> dict[str, Any]:
        instance = self.instances.get((zone, name))
        if instance is None or (visible and name in self.hidden):
            raise not_found(f"projects/{self.project}/zones/{zone}/instances/{name}")
        return instance

    def _delete(self, zone: str, name: str, query: dict[str, str]) -> dict[str, Any]:
        self._door("delete", query)
        request_id = query.get("requestId")
        if request_id and request_id in self.by_request_id:
            return self.operations[self.by_request_id[request_id]]
        instance = self._stored(zone, name)
        del self.instances[(zone, name)]
        operation = self._operation(zone, "delete", instance)
        operation.update(status="DONE", progress=100, endTime=operation["insertTime"])
        if request_id:
            self.by_request_id[request_id] = (zone, operation["name"])
        return operation

    # -- operations --------------------------------------------------------------------------

    def _poll(self, zone: str, name: str) -> dict[str, Any]:
        operation = self.operations.get((zone, name))
        if operation is None:
            raise not_found(f"projects/{self.project}/zones/{zone}/operations/{name}")
        left = self.polls_left.get((zone, name), 0)
        if left > 1:
            self.polls_left[(zone, name)] = left - 1
        elif left == 1:
            del self.polls_left[(zone, name)]
            operation.update(status="DONE", progress=100, endTime=stamp(self.clock()))
            target = operation["targetLink"].rsplit("/", 1)[-1]
            for member in (target, *self.bulk_members.get((zone, name), [])):
                if (zone, member) in self.instances:
                    self.instances[(zone, member)]["status"] = "RUNNING"
        return operation

    def _operations(self, zone: str, query: dict[str, str]) -> dict[str, Any]:
        terms = parse_filter(query.get("filter", ""))
        chosen = [
            operation
            for (where, _), operation in sorted(self.operations.items())
            if where == zone and matches(operation, terms)
        ]
        page, token = self._page(chosen, query)
        answer: dict[str, Any] = {
            "kind": "compute#operationList",
            "id": f"projects/{self.project}/zones/{zone}/operations",
            "items": page,
        }
        if token:
            answer["nextPageToken"] = token
        return answer

    # -- gangs: bulk insert ------------------------------------------------------------------

    def _bulk_insert(
        self, zone: str, query: dict[str, str], body: dict[str, Any]
    ) -> dict[str, Any]:
        """``instances.bulkInsert``: ``count`` VMs, at least ``minCount`` of them, or none."""
        fault = self._door("bulk", query)
        request_id = query.get("requestId")
        if request_id and request_id in self.by_request_id:
            return self.operations[self.by_request_id[request_id]]
        count = int(body.get("count") or 0)
        min_count = int(body.get("minCount") or count)
        if count < 1 or not 1 <= min_count <= count:
            raise _invalid("resource.count", f"count {count}, minCount {min_count}")
        if body.get("sourceInstanceTemplate"):
            raise _invalid("resource.sourceInstanceTemplate", "not served by this emulator")
        names = self._bulk_names(zone, body, count)
        properties = dict(body.get("instanceProperties") or {})
        if not properties.get("machineType") or "/" in str(properties["machineType"]):
            raise _invalid(
                "resource.instanceProperties.machineType",
                str(properties.get("machineType", "")) + " (a machine type name is expected)",
            )
        if not any(
            d.get("boot") and d.get("initializeParams", {}).get("sourceImage")
            for d in properties.get("disks", [])
        ):
            raise _invalid("resource.instanceProperties.disks", "a boot disk with a source image")
        region = zone.rsplit("-", 1)[0]
        policies = []
        for policy in properties.get("resourcePolicies") or []:
            if "/" in str(policy):
                raise _invalid("resource.instanceProperties.resourcePolicies", str(policy))
            if (region, policy) not in self.policies:
                raise not_found(
                    f"projects/{self.project}/regions/{region}/resourcePolicies/{policy}"
                )
            policies.append(self.policies[(region, policy)]["selfLink"])
        fit = count
        if fault == "capacity" or zone in self.full_zones:
            fit = 0
        if self.capacity is not None:
            fit = min(fit, max(self.capacity, 0))
        if self.gang_fit is not None:
            fit = min(fit, self.gang_fit)
        made = min(count, fit) if fault not in ("quota", "quota-global") else 0
        succeeded = made >= min_count and fault not in ("quota", "quota-global")
        slow = fault == "slow" and succeeded
        operation = self._operation(
            zone, "bulkInsert", {"name": "bulkInsert", "selfLink": self._link(zone, "instances")}
        )
        operation["targetLink"] = self._link(zone, "instances", "bulkInsert")
        kept = names[:made] if succeeded else (names[:fit] if self.leftovers else [])
        for name in kept:
            vm = {
                **self._expanded(zone, properties, policies),
                "name": name,
            }
            status = "RUNNING" if succeeded and not slow else "STAGING"
            self._create(zone, vm, "PROVISIONING" if slow else status)
        if succeeded and self.capacity is not None:
            self.capacity -= made
        self.bulk_members[(zone, operation["name"])] = list(kept)
        location = {
            "targetVmCount": count,
            "createdVmCount": made if succeeded else 0,
            "failedToCreateVmCount": 0 if succeeded else count,
            "deletedVmCount": 0,
            "status": "DONE" if succeeded else ("ROLLING_BACK" if kept else "DONE"),
        }
        operation["instancesBulkInsertOperationMetadata"] = {
            "perLocationStatus": {f"zones/{zone}": location}
        }
        if slow:
            self.polls_left[(zone, operation["name"])] = self.slow_polls
        else:
            operation.update(status="DONE", progress=100, endTime=operation["insertTime"])
        if not succeeded:
            reason = fault if fault in ("quota", "quota-global") else "capacity"
            operation.update(operation_error(reason, zone))
        if request_id:
            self.by_request_id[request_id] = (zone, operation["name"])
        if fault == "lost":
            raise refusal("server", self.retry_after)
        return operation

    def _bulk_names(self, zone: str, body: dict[str, Any], count: int) -> list[str]:
        per_instance = body.get("perInstanceProperties") or {}
        pattern = body.get("namePattern")
        if per_instance:
            names = list(per_instance)
            if len(names) != count and not pattern:
                raise _invalid(
                    "resource.perInstanceProperties", f"{len(names)} names for count {count}"
                )
        elif pattern:
            hashes = re.search(r"#+", str(pattern))
            if hashes is None:
                raise _invalid("resource.namePattern", str(pattern))
            names, number = [], 1
            while len(names) < count:
                name = str(pattern).replace(
                    hashes.group(0), str(number).zfill(len(hashes.group(0)))
                )
                if (zone, name) not in self.instances:
                    names.append(name)
                number += 1
        else:
            raise _invalid("resource", "perInstanceProperties or namePattern is required")
        for name in names:
            if not NAME.match(name):
                raise _invalid("resource.perInstanceProperties", name)
            self._refuse_taken(zone, name)
        return names

    def _expanded(
        self, zone: str, properties: dict[str, Any], policies: list[str]
    ) -> dict[str, Any]:
        """An instance's body from bulk-insert instance properties (short names made links)."""
        vm = {k: v for k, v in properties.items() if k != "resourcePolicies"}
        vm["machineType"] = f"zones/{zone}/machineTypes/{properties['machineType']}"
        vm["guestAccelerators"] = [
            {**a, "acceleratorType": self._link(zone, "acceleratorTypes", a["acceleratorType"])}
            for a in properties.get("guestAccelerators", [])
        ]
        if policies:
            vm["resourcePolicies"] = policies
        return vm

    # -- gangs: resource policies ------------------------------------------------------------

    def _regional(
        self, method: str, rest: list[str], query: dict[str, str], body: dict[str, Any]
    ) -> dict[str, Any]:
        region = known("regions", rest[1], REGIONS)
        if rest[2] == "resourcePolicies":
            if len(rest) == 3 and method == "POST":
                return self._insert_policy(region, query, body)
            if len(rest) == 4 and method == "GET":
                self._door("policy", query)
                return self._policy(region, rest[3])
        if rest[2] == "operations" and (
            (len(rest) == 4 and method == "GET")
            or (len(rest) == 5 and rest[4] == "wait" and method == "POST")
        ):
            self._door("operation", query)
            operation = self.region_operations.get((region, rest[3]))
            if operation is None:
                raise not_found(f"projects/{self.project}/regions/{region}/operations/{rest[3]}")
            return operation
        path = "/".join(rest)
        raise GoogleError(404, "notFound", f"{method} {path} is not served here", "NOT_FOUND")

    def _policy_link(self, region: str, name: str = "") -> str:
        link = f"{BASE}/projects/{self.project}/regions/{region}/resourcePolicies"
        return f"{link}/{name}" if name else link

    def _policy(self, region: str, name: str) -> dict[str, Any]:
        policy = self.policies.get((region, name))
        if policy is None:
            raise not_found(f"projects/{self.project}/regions/{region}/resourcePolicies/{name}")
        return policy

    def _new_policy(self, region: str, name: str, body: dict[str, Any]) -> dict[str, Any]:
        if not NAME.match(name):
            raise _invalid("resource.name", name)
        if (region, name) in self.policies:
            raise GoogleError(
                409,
                "alreadyExists",
                f"The resource 'projects/{self.project}/regions/{region}/resourcePolicies/{name}' "
                "already exists",
                "ALREADY_EXISTS",
            )
        kinds = (
            "groupPlacementPolicy",
            "snapshotSchedulePolicy",
            "instanceSchedulePolicy",
            "diskConsistencyGroupPolicy",
            "workloadPolicy",
        )
        if sum(1 for k in kinds if k in body) != 1:
            raise _invalid("resource", "exactly one policy kind")
        placement = body.get("groupPlacementPolicy")
        if placement is not None and placement.get("collocation", "COLLOCATED") not in COLLOCATIONS:
            raise _invalid("resource.groupPlacementPolicy.collocation", placement["collocation"])
        policy = {
            **body,
            "kind": "compute#resourcePolicy",
            "id": str(next(self._ids)),
            "creationTimestamp": stamp(self.clock()),
            "name": name,
            "region": f"{BASE}/projects/{self.project}/regions/{region}",
            "selfLink": self._policy_link(region, name),
            "status": "READY",
        }
        self.policies[(region, name)] = policy
        return policy

    def _insert_policy(
        self, region: str, query: dict[str, str], body: dict[str, Any]
    ) -> dict[str, Any]:
        self._door("policy", query)
        request_id = query.get("requestId")
        if request_id and request_id in self.region_requests:
            return self.region_operations[self.region_requests[request_id]]
        policy = self._new_policy(region, str(body.get("name", "")), body)
        now = stamp(self.clock())
        number = next(self._ids)
        name = f"operation-{number}-insert"
        operation = {
            "kind": "compute#operation",
            "id": str(number),
            "name": name,
            "region": f"{BASE}/projects/{self.project}/regions/{region}",
            "operationType": "insert",
            "targetLink": policy["selfLink"],
            "targetId": policy["id"],
            "status": "DONE",
            "user": "tests",
            "progress": 100,
            "insertTime": now,
            "startTime": now,
            "endTime": now,
            "selfLink": f"{BASE}/projects/{self.project}/regions/{region}/operations/{name}",
        }
        self.region_operations[(region, name)] = operation
        if request_id:
            self.region_requests[request_id] = (region, name)
        return operation


def not_found(resource: str) -> GoogleError:
    return GoogleError(404, "notFound", f"The resource '{resource}' was not found", "NOT_FOUND")


def known(scope: str, name: str, names: Collection[str]) -> str:
    """``name`` if it is one of ``names``: a zone or region the emulator serves."""
    if name not in names:
        raise not_found(f"{scope}/{name}")
    return name


def _invalid(field: str, value: str) -> GoogleError:
    return GoogleError(400, "invalid", f"Invalid value for field '{field}': '{value}'.", "INVALID")


# -- the contract's GCP world -------------------------------------------------------------

GCP_OPERATIONS = {"launch": "insert", "list": "list", "terminate": "delete"}


class GcpWorld:
    """The GCP provider against the emulator: every fault kind, strangers, partial fulfilment,
    pagination (three instances a page) and chaos."""

    name = "gcp"
    capabilities: ClassVar[frozenset[str]] = frozenset(
        {"stranger", "partial", "pagination", "chaos", *FAULT_KINDS}
    )

    def __init__(self, emulator: ComputeEmulator) -> None:
        self.emulator = emulator
        self.page_size: int | None = emulator.page_size
        self._strangers = itertools.count(1)

    def pool(
        self, name: str, *, market: str = "spot", gpus: int = 1, max_instances: int | None = None
    ) -> Pool:
        return Pool(
            name=name,
            provider="gcp",
            region=REGION,
            zone=f"{REGION}-a",
            instance_type=f"a2-highgpu-{gpus}g",
            gpus_per_instance=gpus,
            market=market,  # type: ignore[arg-type]
            max_instances=max_instances,
            boot_seconds=0,
            options={"image": IMAGE},
        )

    def provider(self, pools: Sequence[Pool], clock: Clock) -> Provider:
        self.emulator.clock = clock.now
        settings = {
            "project": PROJECT,
            "endpoint": self.emulator.url,
            "operation_timeout_s": bound(30),
        }
        return GcpProvider.from_config(settings, pools, FLEET, clock)

    def live(self) -> dict[str, dict[str, str]]:
        return {
            name: tags_from_labels(instance.get("labels") or {})
            for name, instance in self.emulator.live().items()
        }

    def add_stranger(self) -> str:
        name = f"stranger-{next(self._strangers)}"
        self.emulator.add_instance(f"{REGION}-a", name, {"team": "someone-else"})
        return name

    def fail_next(self, operation: Operation, fault: str, times: int = 1) -> None:
        self.emulator.fail_next(GCP_OPERATIONS[operation], fault, times)

    def grant_at_most(self, count: int | None) -> None:
        with self.emulator.lock:
            self.emulator.capacity = count

    def chaos(self, chance: float, seed: int) -> None:
        self.emulator.chaos(chance, seed)

    def gang_pool(self, name: str) -> Pool:
        pool = self.pool(name)
        return pool.model_copy(
            update={"options": {**pool.options, "placement_policy": {"create": True}}}
        )

    def placement(self, instance_id: str) -> str | None:
        policies = self.emulator.policies_of(instance_id)
        return policies[0] if policies else None

    def placement_groups(self) -> int:
        with self.emulator.lock:
            return len(self.emulator.policies)

    def come_up(self, count: int | None) -> None:
        self.emulator.gang_fits(count, leftovers=True)


@pytest.fixture(scope="session")
def compute_emulator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ComputeEmulator]:
    """The emulator, and for the session (subprocesses included) the environment through which
    Application Default Credentials find its metadata server. google-auth reads
    ``GCE_METADATA_HOST`` when it first imports its metadata module, which no test does before
    a provider of this session asks for credentials."""
    emulator = ComputeEmulator()
    emulator.start()
    with pytest.MonkeyPatch.context() as patch:
        for name, value in emulator.environment(tmp_path_factory.mktemp("gcloud")).items():
            if value is None:
                patch.delenv(name, raising=False)
            else:
                patch.setenv(name, value)
        yield emulator
    emulator.stop()


@pytest.fixture
def gcp(compute_emulator: ComputeEmulator) -> ComputeEmulator:
    """The emulator, emptied and with no faults planned."""
    compute_emulator.reset()
    return compute_emulator


@pytest.fixture
def gcp_world(gcp: ComputeEmulator) -> GcpWorld:
    return GcpWorld(gcp)
