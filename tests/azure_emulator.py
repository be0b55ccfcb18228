"""A small Azure Resource Manager emulator for the Azure tests, and the Azure contract world.

It speaks the wire shapes azure-mgmt-compute really sends and parses, over TLS on 127.0.0.1 (its
own test CA), so the provider under test runs the real SDK, its pipeline, its bearer-token policy
and its long-running operation pollers end to end:

* ``PUT  /subscriptions/{s}/resourceGroups/{rg}/providers/Microsoft.Compute/virtualMachines/{vm}``
  → 201 with the VM (``provisioningState: Creating``) and an ``Azure-AsyncOperation`` header;
  the operation reads ``InProgress`` for as many polls as the emulator is told, then
  ``Succeeded`` (the poller then GETs the VM) or ``Failed`` with ``error: {code, message}``.
  A PUT of an existing name is an update (200), never a second VM.
* ``GET`` and ``DELETE`` of one VM (``DELETE`` → 202 with ``Azure-AsyncOperation`` and
  ``Location``; 204 when there is nothing to delete), ``GET .../{vm}/instanceView``.
* ``GET .../virtualMachines`` in pages of ``page_size`` joined by ``nextLink``.
* ``GET /subscriptions/{s}/providers/Microsoft.Compute/locations/{l}/operations/{id}`` (the
  async-operation status; with ``monitor=true`` it answers as the ``Location`` URL does).
* ``GET /api/retail/prices?$filter=...`` (the public Azure Retail Prices API: ``Items`` and
  ``NextPageLink``), with ``eq``/``and`` filters applied as the real API applies them.
* ``PUT`` and ``GET .../proximityPlacementGroups/{name}`` (synchronous, 201 then 200; 404
  ``ResourceNotFound``), listing in ``properties.virtualMachines`` the VMs that reference the
  group. A VM PUT whose ``proximityPlacementGroup.id`` names a group that does not exist, or one
  in another location or zone, is refused as ARM refuses it.

Authentication is Azure's: ARM calls need a bearer token the emulator issued (401 without one),
and the provider gets it the standard way, ``DefaultAzureCredential``. The emulator serves the
managed identity endpoint App Service and Container Apps give a workload (``GET /msi/token``
with the ``X-IDENTITY-HEADER`` secret), and the session's ``IDENTITY_ENDPOINT`` and
``IDENTITY_HEADER`` point the credential chain at it, with ``REQUESTS_CA_BUNDLE`` trusting the
test CA. (A service principal's ``AZURE_AUTHORITY_HOST`` would not do: MSAL first asks
login.microsoftonline.com about any authority host it does not know, and only code, not the
environment, can turn that off.) The Retail Prices API, which needs no credentials, is served
over plain HTTP (``prices_url``).

Errors are ARM's: ``{"error": {"code", "message"}}`` with the real codes and statuses. Faults are
planned per operation (``fail_next``), per listing page (``fail_page``), or random (``chaos``);
capacity can be rationed per launch request (``grant_at_most``) and creates can be made slow.

Prices: on-demand Linux prices are the shipped Azure catalog's (eastus, as of 2026-06-18, from
``azure_gpu_vm_sizes.csv`` in the shared data, which has NO spot prices). The spot, low-priority
and Windows meters served here are CONSTRUCTED for the tests from those on-demand prices (spot at
a fixed fraction), so that meter selection can be tested; they are not Azure's prices.
"""

from __future__ import annotations

import ipaddress
import json
import random
import re
import secrets
import ssl
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import partial
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar
from urllib.parse import parse_qs, quote, urlsplit

import certifi
import pytest
from contract_support import FAULT_KINDS, FLEET, Operation
from waits import bound

from autoscaler.model import Pool
from autoscaler.model.clock import Clock
from autoscaler.spi.provider import REQUEST_TAG, Provider
from providers.azure import AzureProvider
from providers.azure.instances import TAG_KEYS, core_tags

SUBSCRIPTION = "8a5d3c1e-0000-4000-8000-00000000a2e0"
RESOURCE_GROUP = "gpu-fleet"
REGION = "eastus"
SUBNET = (
    f"/subscriptions/{SUBSCRIPTION}/resourceGroups/net/providers/Microsoft.Network/"
    "virtualNetworks/gpu/subnets/nodes"
)
POOL_OPTIONS: dict[str, Any] = {
    "image": "Canonical:0001-com-ubuntu-server-jammy:22_04-lts-gen2:latest",
    "subnet_id": SUBNET,
    "ssh_public_key": "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIEmulatorKey test@emulator",
}
# (size, family, vCPUs, GPUs, eastus on-demand Linux $/h) from azure_gpu_vm_sizes.csv
SIZES: tuple[tuple[str, str, int, int, float], ...] = (
    ("Standard_NC4as_T4_v3", "NCasT4_v3", 4, 1, 0.526),
    ("Standard_NC8as_T4_v3", "NCasT4_v3", 8, 1, 0.752),
    ("Standard_NC64as_T4_v3", "NCasT4_v3", 64, 4, 4.352),
    ("Standard_NC6s_v3", "NCSv3", 6, 1, 3.06),
    ("Standard_NC12s_v3", "NCSv3", 12, 2, 6.12),
    ("Standard_NC24ads_A100_v4", "NCADS_A100_v4", 24, 1, 3.673),
    ("Standard_ND96asr_v4", "NDASv4_A100", 96, 8, 27.197),
)
SIZE_FOR_GPUS = {1: "Standard_NC4as_T4_v3", 2: "Standard_NC12s_v3", 4: "Standard_NC64as_T4_v3"}
SPOT_FRACTION = 0.2  # constructed: the shipped data has no Azure spot prices
LOW_PRIORITY_FRACTION = 0.18  # a distractor meter the provider must ignore
WINDOWS_PER_VCPU = 0.046  # Windows meters cost more; another distractor

COMPUTE = r"/subscriptions/(?P<sub>[^/]+)/resourceGroups/(?P<rg>[^/]+)/providers/Microsoft\.Compute"
VM_PATH = re.compile(COMPUTE + r"/virtualMachines/(?P<name>[^/]+)$", re.I)
PPG_PATH = re.compile(COMPUTE + r"/proximityPlacementGroups/(?P<name>[^/]+)$", re.I)
PPG_NAME = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9._-]{0,78}[A-Za-z0-9_])?$")
VIEW_PATH = re.compile(COMPUTE + r"/virtualMachines/(?P<name>[^/]+)/instanceView$", re.I)
LIST_PATH = re.compile(COMPUTE + r"/virtualMachines/?$", re.I)
OPERATION_PATH = re.compile(
    r"/subscriptions/(?P<sub>[^/]+)/providers/Microsoft\.Compute/locations/(?P<loc>[^/]+)"
    r"/operations/(?P<op>[^/]+)$",
    re.I,
)
PRICES_PATH = "/api/retail/prices"
IDENTITY_PATH = "/msi/token"
FILTER_TERM = re.compile(r"^\s*(\w+)\s+eq\s+'([^']*)'\s*$", re.I)

# fault → (HTTP status, ARM code, message) as Azure answers a synchronous failure
SYNC_FAULTS: dict[str, tuple[int, str, str]] = {
    "sku": (
        409,
        "SkuNotAvailable",
        "The requested VM size for resource 'Following SKUs have failed for Capacity "
        "Restrictions: Standard_NC4as_T4_v3' is currently not available in location 'eastus'. "
        "Please try another size or deploy to a different location or different zone.",
    ),
    "quota": (
        409,
        "OperationNotAllowed",
        "Operation could not be completed as it results in exceeding approved LowPriorityCores "
        "quota. Additional details - Deployment Model: Resource Manager, Location: eastus, "
        "Current Limit: 8, Current Usage: 8, Additional Required: 4, (Minimum) New Limit "
        "Required: 12.",
    ),
    "throttle": (
        429,
        "TooManyRequests",
        "The request is being throttled as the limit has been reached for this operation type. "
        "For more information, see - https://aka.ms/throttling",
    ),
    "server": (500, "InternalExecutionError", "An internal execution error occurred."),
    "auth": (
        401,
        "ExpiredAuthenticationToken",
        "The access token expiry UTC time is earlier than current UTC time.",
    ),
    "forbidden": (
        403,
        "AuthorizationFailed",
        "The client does not have authorization to perform action "
        "'Microsoft.Compute/virtualMachines/write'.",
    ),
    "bad": (400, "InvalidParameter", "The value of parameter imageReference.sku is invalid."),
}
# fault → (ARM code, message) of a create that is accepted and then fails
ASYNC_FAULTS: dict[str, tuple[str, str]] = {
    "capacity": (
        "AllocationFailed",
        "Allocation failed. We do not have sufficient capacity for the requested VM size in "
        "this region. Read more about improving likelihood of allocation success at "
        "http://aka.ms/allocation-guidance",
    ),
    "zonal": (
        "ZonalAllocationFailed",
        "Allocation failed. We do not have sufficient capacity for the requested VM size in "
        "this zone.",
    ),
    "internal": ("InternalExecutionError", "An internal execution error occurred."),
}
RETRY_AFTER_S = 17
CHAOS_FAULTS: dict[str, tuple[str, ...]] = {
    "launch": ("capacity", "quota", "throttle", "server", "auth", "sku", "timeout"),
    "list": ("throttle", "server", "auth", "timeout"),
    "terminate": ("throttle", "server", "auth", "timeout"),
    "placement": ("throttle", "server"),
}


def _now_iso() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%f0+00:00")


@dataclass
class Vm:
    name: str
    resource_group: str
    body: dict[str, Any]
    state: str = "Creating"
    vm_id: str = field(default_factory=lambda: str(uuid.uuid4()))
    created: str = field(default_factory=_now_iso)
    error: tuple[str, str] | None = None

    def resource(self, subscription: str) -> dict[str, Any]:
        properties = dict(self.body.get("properties", {}))
        properties.update(
            {"vmId": self.vm_id, "provisioningState": self.state, "timeCreated": self.created}
        )
        resource: dict[str, Any] = {
            "id": f"/subscriptions/{subscription}/resourceGroups/{self.resource_group}"
            f"/providers/Microsoft.Compute/virtualMachines/{self.name}",
            "name": self.name,
            "type": "Microsoft.Compute/virtualMachines",
            "location": self.body.get("location", REGION),
            "tags": dict(self.body.get("tags") or {}),
            "properties": properties,
        }
        if self.body.get("zones"):
            resource["zones"] = list(self.body["zones"])
        identity = self.body.get("identity")
        if identity is not None:  # ARM fills in each identity's ids
            users = identity.get("userAssignedIdentities") or {}
            resource["identity"] = {
                "type": identity.get("type"),
                "userAssignedIdentities": {
                    key: {"principalId": str(uuid.uuid5(uuid.NAMESPACE_URL, key)), "clientId": key}
                    for key in users
                },
            }
        return resource

    def instance_view(self) -> dict[str, Any]:
        when = {"time": self.created}
        statuses: list[dict[str, Any]]
        if self.state == "Failed" and self.error is not None:
            statuses = [
                {
                    "code": f"ProvisioningState/failed/{self.error[0]}",
                    "level": "Error",
                    "displayStatus": "Provisioning failed",
                    "message": self.error[1],
                    **when,
                }
            ]
        else:
            statuses = [
                {
                    "code": f"ProvisioningState/{self.state.lower()}",
                    "level": "Info",
                    "displayStatus": f"Provisioning {self.state.lower()}",
                    **when,
                }
            ]
        if self.state in ("Succeeded", "Updating", "Failed") and self.error is None:
            statuses.append(
                {"code": "PowerState/running", "level": "Info", "displayStatus": "VM running"}
            )
        return {"computerName": self.name, "statuses": statuses}


@dataclass
class AsyncOperation:
    id: str
    kind: str  # "create" or "delete"
    key: tuple[str, str]
    polls_left: int
    error: tuple[str, str] | None = None
    done: bool = False
    started: str = field(default_factory=_now_iso)


class ArmEmulator:
    """ARM state and its HTTP front. Every public method is safe to call from a test while the
    provider's poller threads are talking to the server."""

    def __init__(
        self, page_size: int = 3, price_page_size: int = 4, directory: Path | None = None
    ) -> None:
        self.page_size = page_size
        self.price_page_size = price_page_size
        self.lock = threading.RLock()
        self.directory = directory or Path(tempfile.mkdtemp(prefix="arm-emulator-"))
        self.ca_bundle, context = _tls(self.directory)
        self.server = _TlsServer(("127.0.0.1", 0), _handler(self), context)
        self.server.daemon_threads = True
        self.url = f"https://127.0.0.1:{self.server.server_address[1]}"
        self.prices_server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self.prices_server.daemon_threads = True
        self.prices_url = f"http://127.0.0.1:{self.prices_server.server_address[1]}{PRICES_PATH}"
        self.threads = [
            threading.Thread(target=server.serve_forever, daemon=True)
            for server in (self.server, self.prices_server)
        ]
        self.identity_secret = secrets.token_urlsafe(16)
        self.issued: set[str] = set()  # access tokens the identity endpoint handed out
        self.identity_requests = 0
        self.reset()

    def start(self) -> None:
        for thread in self.threads:
            thread.start()

    def stop(self) -> None:
        for server in (self.server, self.prices_server):
            server.shutdown()
            server.server_close()

    def environment(self) -> dict[str, str | None]:
        """What a process needs for ``DefaultAzureCredential`` to get its token from this
        emulator's managed identity endpoint (None: unset, so that no service principal in the
        environment comes first), and to trust the emulator's certificate."""
        return {
            "IDENTITY_ENDPOINT": f"{self.url}{IDENTITY_PATH}",
            "IDENTITY_HEADER": self.identity_secret,
            "REQUESTS_CA_BUNDLE": str(self.ca_bundle),
            **dict.fromkeys(
                (
                    "AZURE_CLIENT_ID",
                    "AZURE_CLIENT_SECRET",
                    "AZURE_TENANT_ID",
                    "AZURE_CLIENT_CERTIFICATE_PATH",
                    "AZURE_USERNAME",
                    "AZURE_FEDERATED_TOKEN_FILE",
                    "AZURE_TOKEN_CREDENTIALS",
                    "IDENTITY_SERVER_THUMBPRINT",
                    "IMDS_ENDPOINT",
                    "MSI_ENDPOINT",
                )
            ),
        }

    def identity(self, query: dict[str, str], secret: str) -> Reply:
        """The managed identity endpoint (App Service's protocol): a token for ``resource``."""
        with self.lock:
            self.identity_requests += 1
            if secret != self.identity_secret or query.get("api-version") != "2019-08-01":
                return Reply(400, {"statusCode": 400, "message": "Unable to load the identity."})
            token = f"eyJ0eXAiOiJKV1QiLCJ{secrets.token_urlsafe(24)}"
            self.issued.add(token)
        return Reply(
            200,
            {
                "access_token": token,
                "expires_on": str(int(time.time()) + 3600),
                "resource": query.get("resource", ""),
                "token_type": "Bearer",
            },
        )

    def reset(self) -> None:
        with self.lock:
            self.vms: dict[tuple[str, str], Vm] = {}
            self.operations: dict[str, AsyncOperation] = {}
            self.planned: dict[str, list[str]] = {
                "launch": [],
                "list": [],
                "terminate": [],
                "placement": [],
            }
            self.groups: dict[tuple[str, str], dict[str, Any]] = {}
            self.page_faults: dict[int, str] = {}
            self.granted: int | None = None
            self.granted_by_request: dict[str, int] = {}
            self.create_polls = 0
            self.hold_deletes = False
            self.chance = 0.0
            self.rng = random.Random(0)
            self.price_faults: list[str] = []
            self.requests: list[tuple[str, str]] = []
            self.injected: list[tuple[str, str]] = []
            self.hidden: set[str] = set()  # names listings do not show yet (ARM's read lag)
            self.tokens: set[str] = set()
            self.prices = price_items()

    # -- steering, for tests ----------------------------------------------------------------

    def fail_next(self, operation: str, fault: str, times: int = 1) -> None:
        with self.lock:
            self.planned[operation].extend([fault] * times)

    def fail_page(self, page: int, fault: str) -> None:
        """The next listing fails when it asks for page ``page`` (0 is the first)."""
        with self.lock:
            self.page_faults[page] = fault

    def grant_at_most(self, count: int | None) -> None:
        with self.lock:
            self.granted = count

    def slow_creates(self, polls: int) -> None:
        """New creates read InProgress for this many status polls before they finish."""
        with self.lock:
            self.create_polls = polls

    def chaos(self, chance: float, seed: int) -> None:
        with self.lock:
            self.chance = chance
            self.rng = random.Random(seed)

    def add_vm(
        self,
        name: str,
        tags: dict[str, str] | None = None,
        state: str = "Succeeded",
        priority: str = "Regular",
    ) -> None:
        """A VM put there by someone else (or by a test), already provisioned."""
        body = {
            "location": REGION,
            "tags": tags or {},
            "properties": {
                "hardwareProfile": {"vmSize": "Standard_NC4as_T4_v3"},
                "priority": priority,
            },
        }
        with self.lock:
            self.vms[(RESOURCE_GROUP.lower(), name.lower())] = Vm(name, RESOURCE_GROUP, body, state)

    def evict(self, name: str, linger: bool = True) -> None:
        """Azure takes a Spot VM back (eviction policy Delete): it reads Deleting for a while
        (``linger``) or is gone at once."""
        with self.lock:
            key = (RESOURCE_GROUP.lower(), name.lower())
            if linger:
                self.vms[key].state = "Deleting"
            else:
                del self.vms[key]

    def finish_deletes(self) -> None:
        with self.lock:
            for key in [k for k, vm in self.vms.items() if vm.state == "Deleting"]:
                del self.vms[key]

    def vm(self, name: str) -> Vm | None:
        with self.lock:
            return self.vms.get((RESOURCE_GROUP.lower(), name.lower()))

    def all_vms(self) -> list[Vm]:
        with self.lock:
            return list(self.vms.values())

    def live(self) -> list[Vm]:
        """VMs that hold or will hold capacity (not failed, not being deleted)."""
        with self.lock:
            return [
                vm for vm in self.vms.values() if vm.state in ("Creating", "Updating", "Succeeded")
            ]

    def add_group(self, name: str, location: str = REGION) -> None:
        """A proximity placement group made outside the controller."""
        with self.lock:
            self._put_group(SUBSCRIPTION, RESOURCE_GROUP, name, {"location": location})

    def group_of(self, vm_name: str) -> str | None:
        """The name of the proximity placement group a VM was created in, if any."""
        vm = self.vm(vm_name)
        if vm is None:
            return None
        reference = (vm.body.get("properties") or {}).get("proximityPlacementGroup") or {}
        return str(reference["id"]).rsplit("/", 1)[-1] if reference.get("id") else None

    def count(self, method: str, pattern: str) -> int:
        with self.lock:
            return sum(1 for m, path in self.requests if m == method and re.search(pattern, path))

    # -- faults -----------------------------------------------------------------------------

    def _fault(self, operation: str) -> str | None:
        with self.lock:
            fault = None
            if self.planned[operation]:
                fault = self.planned[operation].pop(0)
            elif self.chance and self.rng.random() < self.chance:
                fault = self.rng.choice(CHAOS_FAULTS[operation])
            if fault is not None:
                self.injected.append((operation, fault))
            return fault

    # -- ARM --------------------------------------------------------------------------------

    def put_vm(self, sub: str, rg: str, name: str, body: dict[str, Any]) -> Reply:
        fault = self._fault("launch")
        if fault in SYNC_FAULTS:
            return error_reply(*SYNC_FAULTS[fault])
        problem = _invalid_vm(body)
        if problem:
            return error_reply(400, "InvalidParameter", problem)
        with self.lock:
            refused = self._placement_problem(body)
            if refused is not None:
                return refused
            key = (rg.lower(), name.lower())
            existing = self.vms.get(key)
            if existing is not None and existing.state == "Deleting":
                return error_reply(
                    409,
                    "OperationNotAllowed",
                    f"Operation 'write' is not allowed on VM '{name}' since it is marked for "
                    "deletion.",
                )
            error = ASYNC_FAULTS.get(fault or "")
            request = str((body.get("tags") or {}).get(TAG_KEYS[REQUEST_TAG], ""))
            if error is None and existing is None and self.granted is not None:
                used = self.granted_by_request.get(request, 0)
                if used >= self.granted:
                    error = ASYNC_FAULTS["capacity"]
                else:
                    self.granted_by_request[request] = used + 1
            if existing is None:
                vm = Vm(name, rg, body)
                self.vms[key] = vm
                status = 201
            else:
                vm = existing
                vm.body, vm.state, vm.error = body, "Updating", None
                status = 200
            operation = self._operation("create", key, self.create_polls, error)
            reply = Reply(status, vm.resource(sub), self._async_headers(sub, operation))
            if operation.polls_left == 0:
                self._finish(operation)
            if fault == "timeout":
                reply.drop = True
            return reply

    # -- proximity placement groups -----------------------------------------------------------

    def put_group(self, sub: str, rg: str, name: str, body: dict[str, Any]) -> Reply:
        fault = self._fault("placement")
        if fault in SYNC_FAULTS:
            return error_reply(*SYNC_FAULTS[fault])
        if not PPG_NAME.match(name):
            return error_reply(
                400, "InvalidParameter", f"The name '{name}' of the resource is not valid."
            )
        if not body.get("location"):
            return error_reply(400, "InvalidParameter", "The 'location' property is required.")
        kind = (body.get("properties") or {}).get("proximityPlacementGroupType", "Standard")
        if kind not in ("Standard", "Ultra"):
            return error_reply(
                400, "InvalidParameter", f"proximityPlacementGroupType '{kind}' is not valid."
            )
        intent = (body.get("properties") or {}).get("intent")
        if intent and not body.get("zones"):
            return error_reply(
                400, "InvalidParameter", "An intent needs the proximity placement group's zone."
            )
        with self.lock:
            created = (rg.lower(), name.lower()) not in self.groups
            self._put_group(sub, rg, name, body)
            return Reply(201 if created else 200, self._group_resource(sub, rg, name))

    def _put_group(self, sub: str, rg: str, name: str, body: dict[str, Any]) -> None:
        properties = dict(body.get("properties") or {})
        properties.setdefault("proximityPlacementGroupType", "Standard")
        self.groups[(rg.lower(), name.lower())] = {
            "id": f"/subscriptions/{sub}/resourceGroups/{rg}/providers/Microsoft.Compute/"
            f"proximityPlacementGroups/{name}",
            "name": name,
            "type": "Microsoft.Compute/proximityPlacementGroups",
            "location": body["location"],
            "tags": dict(body.get("tags") or {}),
            "properties": properties,
            **({"zones": list(body["zones"])} if body.get("zones") else {}),
        }

    def get_group(self, sub: str, rg: str, name: str) -> Reply:
        with self.lock:
            if (rg.lower(), name.lower()) not in self.groups:
                return error_reply(
                    404,
                    "ResourceNotFound",
                    f"The Resource 'Microsoft.Compute/proximityPlacementGroups/{name}' under "
                    f"resource group '{rg}' was not found.",
                )
            return Reply(200, self._group_resource(sub, rg, name))

    def group(self, name: str) -> dict[str, Any] | None:
        with self.lock:
            found = self.groups.get((RESOURCE_GROUP.lower(), name.lower()))
            return (
                None if found is None else self._group_resource(SUBSCRIPTION, RESOURCE_GROUP, name)
            )

    def _group_resource(self, sub: str, rg: str, name: str) -> dict[str, Any]:
        group = json.loads(json.dumps(self.groups[(rg.lower(), name.lower())]))
        members = [
            {"id": vm.resource(sub)["id"]}
            for vm in self.vms.values()
            if self._reference(vm.body) == (rg.lower(), name.lower())
        ]
        group["properties"]["virtualMachines"] = members
        return dict(group)

    def _reference(self, body: dict[str, Any]) -> tuple[str, str] | None:
        reference = (body.get("properties") or {}).get("proximityPlacementGroup") or {}
        found = re.match(
            r"/subscriptions/[^/]+/resourceGroups/(?P<rg>[^/]+)/providers/Microsoft\.Compute/"
            r"proximityPlacementGroups/(?P<name>[^/]+)$",
            str(reference.get("id", "")),
            re.I,
        )
        return None if found is None else (found["rg"].lower(), found["name"].lower())

    def _placement_problem(self, body: dict[str, Any]) -> Reply | None:
        """ARM's refusal of a VM whose proximity placement group it cannot use, or None."""
        reference = (body.get("properties") or {}).get("proximityPlacementGroup")
        if not reference:
            return None
        key = self._reference(body)
        group = self.groups.get(key) if key is not None else None
        if group is None:
            return error_reply(
                404,
                "NotFound",
                f"The proximity placement group '{reference.get('id')}' was not found.",
            )
        if str(group["location"]).lower() != str(body.get("location", "")).lower():
            return error_reply(
                400,
                "InvalidParameter",
                f"The proximity placement group is in '{group['location']}', the VM in "
                f"'{body.get('location')}'.",
            )
        if group.get("zones") and body.get("zones") and group["zones"] != body["zones"]:
            return error_reply(
                400, "InvalidParameter", "The VM's zone is not the proximity placement group's."
            )
        return None

    def get_vm(self, sub: str, rg: str, name: str) -> Reply:
        with self.lock:
            vm = self.vms.get((rg.lower(), name.lower()))
            if vm is None:
                return _not_found(rg, name)
            return Reply(200, vm.resource(sub))

    def instance_view(self, rg: str, name: str) -> Reply:
        with self.lock:
            vm = self.vms.get((rg.lower(), name.lower()))
            if vm is None:
                return _not_found(rg, name)
            return Reply(200, vm.instance_view())

    def delete_vm(self, sub: str, rg: str, name: str) -> Reply:
        fault = self._fault("terminate")
        if fault in SYNC_FAULTS:
            return error_reply(*SYNC_FAULTS[fault])
        with self.lock:
            key = (rg.lower(), name.lower())
            vm = self.vms.get(key)
            if vm is None:
                return Reply(204, None)
            vm.state = "Deleting"
            operation = self._operation("delete", key, 0)
            headers = self._async_headers(sub, operation)
            headers["Location"] = headers["Azure-AsyncOperation"].replace(
                "?api-version", "?monitor=true&api-version"
            )
            if not self.hold_deletes:
                self._finish(operation)
            reply = Reply(202, None, headers)
            reply.drop = fault == "timeout"
            return reply

    def list_vms(self, sub: str, rg: str, query: dict[str, str]) -> Reply:
        skip = int(query.get("$skiptoken", "0") or 0)
        page = skip // self.page_size
        with self.lock:
            fault = self.page_faults.pop(page, None)
        if fault is None:
            fault = self._fault("list")
        if fault in SYNC_FAULTS:
            return error_reply(*SYNC_FAULTS[fault])
        with self.lock:
            vms = [
                vm
                for (group, name), vm in self.vms.items()
                if group == rg.lower() and name not in self.hidden
            ]
            chunk = vms[skip : skip + self.page_size]
            body: dict[str, Any] = {"value": [vm.resource(sub) for vm in chunk]}
            if skip + self.page_size < len(vms):
                body["nextLink"] = (
                    f"{self.url}/subscriptions/{sub}/resourceGroups/{rg}/providers/"
                    f"Microsoft.Compute/virtualMachines?api-version={query['api-version']}"
                    f"&$skiptoken={skip + self.page_size}"
                )
        reply = Reply(200, body)
        reply.drop = fault == "timeout"
        return reply

    def operation_status(self, op_id: str, monitor: bool) -> Reply:
        with self.lock:
            operation = self.operations.get(op_id)
            if operation is None:
                return error_reply(404, "NotFound", f"The operation '{op_id}' was not found.")
            if not operation.done and operation.polls_left > 0:
                operation.polls_left -= 1
            elif not operation.done and not (operation.kind == "delete" and self.hold_deletes):
                self._finish(operation)
            if monitor:
                return Reply(200 if operation.done else 202, None)
            status: dict[str, Any] = {"name": op_id, "startTime": operation.started}
            if not operation.done:
                status["status"] = "InProgress"
            elif operation.error is not None:
                status.update(
                    status="Failed",
                    endTime=_now_iso(),
                    error={"code": operation.error[0], "message": operation.error[1]},
                )
            else:
                status.update(status="Succeeded", endTime=_now_iso())
            return Reply(200, status)

    def _operation(
        self, kind: str, key: tuple[str, str], polls: int, error: tuple[str, str] | None = None
    ) -> AsyncOperation:
        operation = AsyncOperation(str(uuid.uuid4()), kind, key, polls, error)
        self.operations[operation.id] = operation
        return operation

    def _finish(self, operation: AsyncOperation) -> None:
        operation.done = True
        vm = self.vms.get(operation.key)
        if vm is None:
            return
        if operation.kind == "delete":
            del self.vms[operation.key]
        elif operation.error is not None:
            vm.state, vm.error = "Failed", operation.error
        else:
            vm.state = "Succeeded"

    def _async_headers(self, sub: str, operation: AsyncOperation) -> dict[str, str]:
        return {
            "Azure-AsyncOperation": f"{self.url}/subscriptions/{sub}/providers/Microsoft.Compute/"
            f"locations/{REGION}/operations/{operation.id}?api-version=2026-04-01",
        }

    # -- Retail Prices API --------------------------------------------------------------------

    def retail_prices(self, query: dict[str, str]) -> Reply:
        with self.lock:
            fault = self.price_faults.pop(0) if self.price_faults else None
        if fault in SYNC_FAULTS:
            status, code, message = SYNC_FAULTS[fault]
            return Reply(
                status,
                {"Error": {"Code": code, "Message": message}},
                {"Retry-After": str(RETRY_AFTER_S)} if status == 429 else {},
            )
        expression = query.get("$filter", "")
        terms: list[tuple[str, str]] = []
        for part in re.split(r"\s+and\s+", expression, flags=re.I) if expression else []:
            matched = FILTER_TERM.match(part)
            if matched is None:
                return Reply(
                    400,
                    {"Error": {"Code": "BadRequest", "Message": f"Invalid OData filter: {part}"}},
                )
            terms.append((matched.group(1).lower(), matched.group(2).lower()))
        chosen = [
            item
            for item in self.prices
            if all(str(_field(item, name)).lower() == value for name, value in terms)
        ]
        skip = int(query.get("$skip", "0") or 0)
        body: dict[str, Any] = {
            "BillingCurrency": "USD",
            "CustomerEntityId": "Default",
            "CustomerEntityType": "Retail",
            "Items": chosen[skip : skip + self.price_page_size],
            "NextPageLink": None,
            "Count": len(chosen[skip : skip + self.price_page_size]),
        }
        if skip + self.price_page_size < len(chosen):
            body["NextPageLink"] = (
                f"{self.prices_url}?$filter={quote(expression)}&$skip={skip + self.price_page_size}"
            )
        return Reply(200, body)


FILTER_ALIASES = {"pricetype": "type"}  # the API filters on priceType; items call it type


def _field(item: dict[str, Any], name: str) -> Any:
    name = FILTER_ALIASES.get(name, name)
    for key, value in item.items():
        if key.lower() == name:
            return value
    return None


def _invalid_vm(body: dict[str, Any]) -> str | None:
    """The parts of a VM body ARM insists on (a wrong shape fails here as it would there)."""
    properties = body.get("properties") or {}
    if not body.get("location"):
        return "The 'location' property is required."
    if not (properties.get("hardwareProfile") or {}).get("vmSize"):
        return "Required parameter 'hardwareProfile.vmSize' is missing (null)."
    storage = properties.get("storageProfile") or {}
    if not storage.get("imageReference"):
        return "Required parameter 'storageProfile.imageReference' is missing (null)."
    os_profile = properties.get("osProfile") or {}
    if not os_profile.get("adminUsername"):
        return "Required parameter 'osProfile.adminUsername' is missing (null)."
    if not (properties.get("networkProfile") or {}).get("networkInterfaceConfigurations"):
        return "Required parameter 'networkProfile.networkInterfaceConfigurations' is missing."
    priority = properties.get("priority", "Regular")
    if priority == "Spot" and properties.get("evictionPolicy") not in ("Delete", "Deallocate"):
        return "Spot VMs need an evictionPolicy of Delete or Deallocate."
    if priority != "Spot" and properties.get("billingProfile"):
        return "billingProfile.maxPrice is only allowed for Spot VMs."
    identity = body.get("identity")
    if identity is not None:
        kind = identity.get("type")
        users = identity.get("userAssignedIdentities") or {}
        if kind not in ("SystemAssigned", "UserAssigned", "SystemAssigned, UserAssigned", "None"):
            return f"The identity type '{kind}' is not valid."
        if ("UserAssigned" in str(kind)) != bool(users):
            return "userAssignedIdentities must be given exactly when the type is UserAssigned."
        for key in users:
            if "/providers/microsoft.managedidentity/userassignedidentities/" not in key.lower():
                return f"The identity '{key}' is not a user-assigned identity's resource id."
    return None


def _not_found(rg: str, name: str) -> Reply:
    return error_reply(
        404,
        "ResourceNotFound",
        f"The Resource 'Microsoft.Compute/virtualMachines/{name}' under resource group '{rg}' "
        "was not found.",
    )


def price_items() -> list[dict[str, Any]]:
    """Retail Prices API items for the sizes above: the real on-demand Linux meter, plus
    constructed spot, low-priority and Windows meters and a reservation row."""
    items: list[dict[str, Any]] = []
    for size, series, vcpus, _, on_demand in SIZES:
        short = size.removeprefix("Standard_").replace("_", " ")
        product = f"Virtual Machines {series} Series"
        windows = on_demand + WINDOWS_PER_VCPU * vcpus
        for meter, product_name, price, kind in (
            (short, product, on_demand, "Consumption"),
            (f"{short} Spot", product, on_demand * SPOT_FRACTION, "Consumption"),
            (f"{short} Low Priority", product, on_demand * LOW_PRIORITY_FRACTION, "Consumption"),
            (short, f"{product} Windows", windows, "Consumption"),
            (f"{short} Spot", f"{product} Windows", windows * SPOT_FRACTION, "Consumption"),
            (short, product, on_demand * 0.62, "Reservation"),
        ):
            item = {
                "currencyCode": "USD",
                "tierMinimumUnits": 0.0,
                "retailPrice": round(price, 6),
                "unitPrice": round(price, 6),
                "armRegionName": REGION,
                "location": "US East",
                "effectiveStartDate": "2026-06-01T00:00:00Z",
                "meterId": str(uuid.uuid5(uuid.NAMESPACE_URL, f"{meter}/{product_name}/{kind}")),
                "meterName": meter,
                "productId": "DZH318Z0BQ4L",
                "skuId": "DZH318Z0BQ4L/00G1",
                "productName": product_name,
                "skuName": meter,
                "serviceName": "Virtual Machines",
                "serviceId": "DZH313Z7MMC8",
                "serviceFamily": "Compute",
                "unitOfMeasure": "1 Hour",
                "type": kind,
                "isPrimaryMeterRegion": True,
                "armSkuName": size,
            }
            if kind == "Reservation":
                item["reservationTerm"] = "1 Year"
            items.append(item)
    return items


def spot_price(size: str) -> float:
    """The constructed spot price the emulator serves for a size."""
    return round(next(s[4] for s in SIZES if s[0] == size) * SPOT_FRACTION, 6)


def on_demand_price(size: str) -> float:
    return next(s[4] for s in SIZES if s[0] == size)


# -- HTTP ------------------------------------------------------------------------------------


@dataclass
class Reply:
    status: int
    body: Any
    headers: dict[str, str] = field(default_factory=dict)
    drop: bool = False


def error_reply(status: int, code: str, message: str) -> Reply:
    headers = {"Retry-After": str(RETRY_AFTER_S)} if status == 429 else {}
    headers["x-ms-failure-cause"] = "gateway" if status == 429 else "service"
    return Reply(status, {"error": {"code": code, "message": message}}, headers)


def put_json(raw: bytes, put: Callable[[dict[str, Any]], Reply]) -> Reply:
    """A PUT's JSON body handed to ``put``; a body that is not JSON is ARM's 400."""
    try:
        body = json.loads(raw or b"{}")
    except ValueError:
        return error_reply(400, "InvalidRequestContent", "Bad JSON.")
    return put(body)


def _handler(emulator: ArmEmulator) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        disable_nagle_algorithm = True  # headers and body go out in two writes

        def log_message(self, format: str, *args: Any) -> None:
            """Quiet: the tests read what matters from the emulator's state."""

        def do_GET(self) -> None:
            self._serve("GET")

        def do_PUT(self) -> None:
            self._serve("PUT")

        def do_DELETE(self) -> None:
            self._serve("DELETE")

        def _serve(self, method: str) -> None:
            parts = urlsplit(self.path)
            query = {k: v[-1] for k, v in parse_qs(parts.query, keep_blank_values=True).items()}
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            if parts.path == IDENTITY_PATH and method == "GET":
                reply = emulator.identity(query, self.headers.get("X-IDENTITY-HEADER", ""))
            else:
                with emulator.lock:
                    emulator.requests.append((method, parts.path))
                reply = self._route(method, parts.path, query, raw)
            if reply.drop:
                self.close_connection = True
                return
            data = b"" if reply.body is None else json.dumps(reply.body).encode()
            self.send_response(reply.status)
            for name, value in reply.headers.items():
                self.send_header(name, value)
            if data:
                self.send_header("Content-Type", "application/json; charset=utf-8")
            self.send_header("Content-Length", str(len(data)))
            self.send_header("x-ms-request-id", str(uuid.uuid4()))
            self.end_headers()
            if data:
                self.wfile.write(data)

        def _route(self, method: str, path: str, query: dict[str, str], raw: bytes) -> Reply:
            if path == PRICES_PATH and method == "GET":
                return emulator.retail_prices(query)
            auth = self.headers.get("Authorization", "")
            if not auth.startswith("Bearer ") or len(auth) <= len("Bearer "):
                return error_reply(
                    401,
                    "AuthenticationFailed",
                    "Authentication failed. The 'Authorization' header is missing.",
                )
            token = auth.removeprefix("Bearer ")
            with emulator.lock:
                if token not in emulator.issued:
                    return error_reply(
                        401, "InvalidAuthenticationToken", "The access token is invalid."
                    )
                emulator.tokens.add(token)
            if "api-version" not in query:
                return error_reply(
                    400,
                    "MissingApiVersionParameter",
                    "The api-version query parameter (?api-version=) is required for all requests.",
                )
            if matched := OPERATION_PATH.match(path):
                if method == "GET":
                    return emulator.operation_status(matched["op"], query.get("monitor") == "true")
            elif matched := VIEW_PATH.match(path):
                if method == "GET":
                    return emulator.instance_view(matched["rg"], matched["name"])
            elif matched := PPG_PATH.match(path):
                sub, rg, name = matched["sub"], matched["rg"], matched["name"]
                if method == "PUT":
                    return put_json(raw, partial(emulator.put_group, sub, rg, name))
                if method == "GET":
                    return emulator.get_group(sub, rg, name)
            elif matched := VM_PATH.match(path):
                sub, rg, name = matched["sub"], matched["rg"], matched["name"]
                if method == "PUT":
                    return put_json(raw, partial(emulator.put_vm, sub, rg, name))
                if method == "GET":
                    return emulator.get_vm(sub, rg, name)
                if method == "DELETE":
                    return emulator.delete_vm(sub, rg, name)
            elif (matched := LIST_PATH.match(path)) and method == "GET":
                return emulator.list_vms(matched["sub"], matched["rg"], query)
            return error_reply(
                404, "InvalidResourceType", f"No route for {method} {path} in this emulator."
            )

    return Handler


# -- the contract world ------------------------------------------------------------------------


class AzureWorld:
    """Azure as the shared contract tests see it: a fresh AzureProvider per call, pointed at the
    emulator, and the emulator's steering behind the World protocol."""

    name = "azure"
    capabilities: ClassVar[frozenset[str]] = frozenset(
        {"stranger", "partial", "pagination", "chaos", *FAULT_KINDS}
    )

    def __init__(self, emulator: ArmEmulator) -> None:
        self.emulator = emulator
        self.page_size: int | None = emulator.page_size
        self._strangers = 0

    def settings(self, **extra: Any) -> dict[str, Any]:
        return {
            "subscription_id": SUBSCRIPTION,
            "resource_group": RESOURCE_GROUP,
            "endpoint": self.emulator.url,
            "retail_prices_url": self.emulator.prices_url,
            "polling_interval_s": 0.01,
            "operation_timeout_s": bound(30),
            **extra,
        }

    def pool(
        self, name: str, *, market: str = "spot", gpus: int = 1, max_instances: int | None = None
    ) -> Pool:
        return Pool(
            name=name,
            provider="azure",
            region=REGION,
            instance_type=SIZE_FOR_GPUS[gpus],
            gpus_per_instance=gpus,
            market=market,  # type: ignore[arg-type]
            max_instances=max_instances,
            boot_seconds=0,
            options=dict(POOL_OPTIONS),
        )

    def provider(self, pools: Sequence[Pool], clock: Clock) -> Provider:
        return AzureProvider.from_config(self.settings(), pools, FLEET, clock)

    def live(self) -> dict[str, dict[str, str]]:
        return {vm.name: core_tags(vm.body.get("tags")) for vm in self.emulator.live()}

    def add_stranger(self) -> str:
        self._strangers += 1
        name = f"someone-elses-vm-{self._strangers}"
        self.emulator.add_vm(name, {"team": "research"})
        return name

    def fail_next(self, operation: Operation, fault: str, times: int = 1) -> None:
        self.emulator.fail_next(operation, fault, times)

    def grant_at_most(self, count: int | None) -> None:
        self.emulator.grant_at_most(count)

    def chaos(self, chance: float, seed: int) -> None:
        self.emulator.chaos(chance, seed)

    def gang_pool(self, name: str) -> Pool:
        pool = self.pool(name)
        return pool.model_copy(
            update={"options": {**pool.options, "proximity_placement_group": {"create": True}}}
        )

    def placement(self, instance_id: str) -> str | None:
        return self.emulator.group_of(instance_id)

    def placement_groups(self) -> int:
        with self.emulator.lock:
            return len(self.emulator.groups)

    def come_up(self, count: int | None) -> None:
        self.emulator.grant_at_most(count)


@pytest.fixture(scope="session")
def azure_emulator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ArmEmulator]:
    """The emulator, and for the session (subprocesses included) the environment through which
    ``DefaultAzureCredential`` gets its tokens from it."""
    emulator = ArmEmulator(directory=tmp_path_factory.mktemp("arm"))
    emulator.start()
    with pytest.MonkeyPatch.context() as patch:
        for name, value in emulator.environment().items():
            if value is None:
                patch.delenv(name, raising=False)
            else:
                patch.setenv(name, value)
        yield emulator
    emulator.stop()


class _TlsServer(ThreadingHTTPServer):
    """A threading HTTP server that speaks TLS, each handshake in its request's own thread (a
    slow client never holds up the accept loop)."""

    def __init__(
        self,
        address: tuple[str, int],
        handler: type[BaseHTTPRequestHandler],
        context: ssl.SSLContext,
    ) -> None:
        super().__init__(address, handler)
        self.context = context

    def finish_request(self, request: Any, client_address: Any) -> None:
        try:
            tls = self.context.wrap_socket(request, server_side=True)
        except (ssl.SSLError, OSError):
            return
        try:
            self.RequestHandlerClass(tls, client_address, self)
        finally:
            tls.close()


def _tls(directory: Path) -> tuple[Path, ssl.SSLContext]:
    """A test CA, a certificate for 127.0.0.1 it signs, the server's TLS context, and a CA
    bundle that trusts the test CA besides the usual ones (so nothing else loses trust)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.now(UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "ARM emulator test CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(hours=1))
        .not_valid_after(now + timedelta(days=2))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), False)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    certificate = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(hours=1))
        .not_valid_after(now + timedelta(days=2))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), False
        )
        .sign(ca_key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM
    chain = directory / "server.pem"
    chain.write_bytes(
        certificate.public_bytes(pem)
        + key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    bundle = directory / "ca-bundle.pem"
    bundle.write_bytes(Path(certifi.where()).read_bytes() + b"\n" + ca.public_bytes(pem))
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(chain)
    return bundle, context


@pytest.fixture
def azure_world(azure_emulator: ArmEmulator) -> AzureWorld:
    azure_emulator.reset()
    return AzureWorld(azure_emulator)
