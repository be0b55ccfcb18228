"""Azure: spot and on-demand GPU VMs through azure-mgmt-compute (the ``azure`` extra), lazily.

* Launch: one VM per instance, each a ``PUT`` of a deterministic name (fleet, request id, index),
  sent in parallel. A repeated PUT of a name is an update, never a second VM, and the request id
  is looked up by tag before launching, so a retry or a restart never buys a second set. Spot
  pools get ``priority=Spot``, ``evictionPolicy=Delete`` and ``billingProfile.maxPrice`` (-1: pay
  up to the on-demand price); on-demand pools ``priority=Regular``. Every VM carries the fleet,
  pool, request and launch-time tags.
* The long-running creates are waited on for at most ``operation_timeout_s``: a create still
  running then counts as launched (ARM accepted it; the next listing shows how it went), a
  create that failed is deleted at once and reported as the launch's typed shortfall.
* List and terminate by the fleet tag only: a VM without it is invisible to us.
* Prices from the public Azure Retail Prices API (spot and on-demand Linux meters, cached for a
  TTL), or from a SkyPilot-format catalog CSV; Azure quotes no interruption rate.
* Errors: mapped onto the core's typed errors (``typed``); the SDK's own retries are off so that
  the controller's bounded retry policy is the only one.
* Interruptions: a Spot VM that this provider saw live and that Azure then deletes (eviction
  policy Delete) is reported once as a terminate notice. Node-side Scheduled Events are not here.
* Gangs: ``launch_gang`` creates a multi-node job's VMs in the pool's proximity placement group
  and deletes them all if any fails (``providers.azure_gang``).

Credentials come from ``DefaultAzureCredential`` (environment, workload or managed identity, Azure
CLI), never from the config file. Only when ``endpoint`` is set (the test emulator) does the
provider send a fixed test token instead, over plain HTTP.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import logging
import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from email.utils import parsedate_to_datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.error import HTTPError, URLError
from urllib.parse import quote
from urllib.request import urlopen

from pydantic import BaseModel, ConfigDict, Field, field_validator

from autoscaler.model import (
    Instance,
    InstanceState,
    InterruptionNotice,
    NoticeKind,
    Pool,
    PriceQuote,
)
from autoscaler.model.catalog import SkyPilotCatalog
from autoscaler.model.clock import Clock, SystemClock
from autoscaler.model.errors import (
    AuthError,
    CapacityError,
    InputError,
    InvalidRequest,
    ProviderError,
    QuotaError,
    QuotaScope,
    ThrottledError,
    TransientError,
)
from autoscaler.model.inputfile import validate_settings
from autoscaler.spi.provider import (
    FLEET_TAG,
    LAUNCHED_AT_TAG,
    POOL_TAG,
    REQUEST_TAG,
    LaunchResult,
)
from providers.placement import PlacementOption

if TYPE_CHECKING:
    from providers.azure_gang import AzureGangs

log = logging.getLogger(__name__)

RETAIL_PRICES_URL = "https://prices.azure.com/api/retail/prices"
# Azure tag names may not contain '/', so the core's tag names are stored with '.' instead.
TAG_KEYS = {
    tag: tag.replace("/", ".") for tag in (FLEET_TAG, POOL_TAG, REQUEST_TAG, LAUNCHED_AT_TAG)
}
CORE_TAGS = {key.lower(): tag for tag, key in TAG_KEYS.items()}
STATES = {
    "creating": InstanceState.PENDING,
    "updating": InstanceState.PENDING,
    "migrating": InstanceState.RUNNING,
    "succeeded": InstanceState.RUNNING,
    "deleting": InstanceState.TERMINATING,
}
FAILED_STATES = frozenset({"failed", "canceled"})
LIVE = frozenset({InstanceState.PENDING, InstanceState.RUNNING})
MAX_PARALLEL_CALLS = 8
MAX_PRICE_PAGES = 50
EMULATOR_TOKEN = "emulator-test-token"
IMAGE_URN = re.compile(r"^[^:\s]+:[^:\s]+:[^:\s]+:[^:\s]+$")
PPG_NAME = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9._-]{0,78}[A-Za-z0-9_])?$")

CAPACITY_CODES = frozenset(
    {
        "AllocationFailed",
        "ZonalAllocationFailed",
        "OverconstrainedAllocationRequest",
        "OverconstrainedZonalAllocationRequest",
        "SkuNotAvailable",
    }
)
QUOTA_CODES = frozenset({"QuotaExceeded"})
THROTTLE_CODES = frozenset(
    {
        "TooManyRequests",
        "SubscriptionRequestsThrottled",
        "ResourceRequestsThrottled",
        "TenantRequestsThrottled",
    }
)
TRANSIENT_CODES = frozenset(
    {
        "InternalServerError",
        "InternalExecutionError",
        "InternalOperationError",
        "ServiceUnavailable",
        "GatewayTimeout",
        "RetryableError",
    }
)
AUTH_CODES = frozenset(
    {
        "AuthenticationFailed",
        "InvalidAuthenticationToken",
        "InvalidAuthenticationTokenTenant",
        "ExpiredAuthenticationToken",
        "AuthorizationFailed",
        "LinkedAuthorizationFailed",
    }
)
KNOWN_CODES = CAPACITY_CODES | QUOTA_CODES | THROTTLE_CODES | TRANSIENT_CODES | AUTH_CODES

T = TypeVar("T")
R = TypeVar("R")


class _Strict(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


def _http_url(value: str | None) -> str | None:
    if value is not None and not value.startswith(("http://", "https://")):
        raise ValueError("expected an http:// or https:// URL")
    return value.rstrip("/") if value is not None else None


class AzureSettings(_Strict):
    """``providers.azure`` in the controller config."""

    subscription_id: str = Field(min_length=1)
    resource_group: str = Field(min_length=1, description="where the fleet's VMs live")
    endpoint: str | None = Field(
        None, description="an ARM emulator's base URL, for tests: a fixed test token is sent"
    )
    retail_prices_url: str | None = Field(
        RETAIL_PRICES_URL, description="the Retail Prices API; null to price from the catalog only"
    )
    price_ttl_s: float = Field(600.0, ge=0)
    price_catalog: str | None = Field(None, description="a SkyPilot-format price catalog CSV")
    polling_interval_s: float = Field(2.0, ge=0, description="between polls of an operation")
    operation_timeout_s: float = Field(15.0, ge=0, description="how long a launch waits on creates")
    connect_timeout_s: float = Field(5.0, gt=0)
    read_timeout_s: float = Field(30.0, gt=0)

    _urls = field_validator("endpoint", "retail_prices_url")(_http_url)


class AzurePoolOptions(_Strict):
    """``options`` of an Azure pool."""

    image: str = Field(
        description="an image URN Publisher:Offer:Sku:Version, or an image or gallery image id"
    )
    subnet_id: str
    admin_username: str = Field("azureuser", pattern=r"^[a-z_][a-z0-9_-]{0,31}$")
    ssh_public_key: str = Field(min_length=1)
    max_price: float = Field(-1.0, description="$/h cap for spot; -1 pays up to on-demand")
    os_disk_size_gb: int | None = Field(None, ge=1, le=4095)
    custom_data: str | None = Field(None, description="cloud-init for the node to join the fleet")
    proximity_placement_group: PlacementOption | None = Field(
        None,
        description="the proximity placement group (in the fleet's resource group) a gang is "
        "launched into: {name: X} (existing), {create: true} (made for the pool) or both",
    )

    @field_validator("proximity_placement_group")
    @classmethod
    def _group_name(cls, value: PlacementOption | None) -> PlacementOption | None:
        name = value.name if value is not None else None
        if name is not None and not PPG_NAME.match(name):
            raise ValueError(
                "name: expected 1 to 80 letters, digits, '.', '_' or '-', starting with a letter "
                "or digit and ending with a letter, digit or '_'"
            )
        return value

    @field_validator("image")
    @classmethod
    def _image(cls, value: str) -> str:
        if not (value.startswith("/") or IMAGE_URN.match(value)):
            raise ValueError("expected Publisher:Offer:Sku:Version or an image resource id")
        return value

    @field_validator("subnet_id")
    @classmethod
    def _subnet(cls, value: str) -> str:
        if not (value.lower().startswith("/subscriptions/") and "/subnets/" in value.lower()):
            raise ValueError("expected a subnet resource id (/subscriptions/.../subnets/NAME)")
        return value

    @field_validator("max_price")
    @classmethod
    def _max_price(cls, value: float) -> float:
        if value != -1 and value <= 0:
            raise ValueError("expected -1 (pay up to on-demand) or a price above 0")
        return value

    def image_reference(self) -> dict[str, str]:
        if self.image.startswith("/"):
            key = {
                "/communitygalleries/": "communityGalleryImageId",
                "/sharedgalleries/": "sharedGalleryImageId",
            }.get(self.image.lower()[: self.image.find("/", 1) + 1], "id")
            return {key: self.image}
        publisher, offer, sku, version = self.image.split(":")
        return {"publisher": publisher, "offer": offer, "sku": sku, "version": version}


def _text(value: Any) -> str:
    """An SDK string or string enum as its wire value (``str()`` of an enum is its class name)."""
    return str(getattr(value, "value", value) or "")


def _provisioning(vm: Any) -> str:
    return _text(vm.provisioning_state).lower()


def azure_tags(tags: Mapping[str, str]) -> dict[str, str]:
    """The core's tags as Azure can store them."""
    return {TAG_KEYS.get(key, key): value for key, value in tags.items()}


def core_tags(tags: Mapping[str, str] | None) -> dict[str, str]:
    """A VM's Azure tags under the core's tag names (Azure tag names are case-insensitive)."""
    return {CORE_TAGS.get(key.lower(), key): value for key, value in (tags or {}).items()}


def vm_name(fleet_id: str, request_id: str, index: int) -> str:
    """The VM name for one instance of a launch: the same for the same fleet, request and index,
    so that a repeated launch PUTs the same names (an update) and cannot buy twice. It stays
    within Linux VM and host name rules (letters, digits, hyphens; at most 64)."""
    fleet = re.sub(r"[^a-z0-9-]+", "-", fleet_id.lower()).strip("-")[:24].strip("-") or "gpu"
    digest = hashlib.sha256(f"{fleet_id}\0{request_id}".encode()).hexdigest()[:12]
    return f"{fleet}-{digest}-{index}"


def _free_names(fleet_id: str, request_id: str, count: int, taken: set[str]) -> list[str]:
    """The request's first ``count`` VM names that no VM of ours holds. Only a VM of an earlier
    attempt of the same request whose create failed (being deleted now) can hold one, since a
    live one makes the launch return early; ARM would refuse to PUT over a VM being deleted."""
    busy = {name.lower() for name in taken}
    names: list[str] = []
    index = 0
    while len(names) < count:
        name = vm_name(fleet_id, request_id, index)
        if name.lower() not in busy:
            names.append(name)
        index += 1
    return names


@dataclass
class _Created:
    """What a round of creates came to: the VMs launched, the typed failures, and the names
    whose create ARM accepted and then failed (such a VM exists, failed, until deleted)."""

    instances: list[Instance] = field(default_factory=list)
    failures: list[ProviderError] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class _Retail:
    fetched_at: float
    spot: float | None
    on_demand: float | None


class AzureProvider:
    name = "azure"
    read_only = False  # plan mode sets it: a listing then deletes nothing

    def __init__(
        self,
        settings: AzureSettings,
        pools: Sequence[Pool],
        fleet_id: str,
        clock: Clock | None = None,
    ) -> None:
        self.settings = settings
        self.fleet_id = fleet_id
        self.clock = clock or SystemClock()
        self.pools = {p.name: p for p in pools}
        self.options: dict[str, AzurePoolOptions] = {}
        for index, pool in enumerate(pools):
            options = validate_settings(
                AzurePoolOptions, pool.options, field=f"pools[{index}].options"
            )
            if not pool.is_spot and "max_price" in options.model_fields_set:
                raise InputError(
                    "config",
                    "max_price applies to spot pools only",
                    field=f"pools[{index}].options.max_price",
                )
            self.options[pool.name] = options
        self.catalog = (
            SkyPilotCatalog(Path(settings.price_catalog)) if settings.price_catalog else None
        )
        self._client: Any = None
        self._client_lock = threading.Lock()
        self._gangs: AzureGangs | None = None
        self._retail: dict[tuple[str, str], _Retail] = {}
        self._deleting: set[str] = set()
        self._seen: dict[str, tuple[str, InstanceState, bool]] = {}
        self._notices: dict[str, InterruptionNotice] = {}
        self._reported: set[str] = set()

    @classmethod
    def from_config(
        cls,
        settings: Mapping[str, Any],
        pools: Sequence[Pool],
        fleet_id: str,
        clock: Clock | None = None,
    ) -> AzureProvider:
        parsed = validate_settings(AzureSettings, dict(settings), field="providers.azure")
        return cls(parsed, pools, fleet_id, clock)

    # -- the client --------------------------------------------------------------------------

    def client(self) -> Any:
        """The ComputeManagementClient (made once, on first use)."""
        with self._client_lock:
            if self._client is None:
                from azure.mgmt.compute import ComputeManagementClient

                options: dict[str, Any] = {
                    "retry_total": 0,
                    "polling_interval": self.settings.polling_interval_s,
                    "connection_timeout": self.settings.connect_timeout_s,
                    "read_timeout": self.settings.read_timeout_s,
                    "user_agent": "hybrid-gpu-autoscaler",
                }
                if self.settings.endpoint is not None:
                    credential, test_options = _emulator_auth()
                    options.update(test_options, base_url=self.settings.endpoint)
                else:
                    from azure.identity import DefaultAzureCredential

                    credential = DefaultAzureCredential()
                self._client = ComputeManagementClient(
                    credential, self.settings.subscription_id, **options
                )
            return self._client

    def _vms(self) -> list[Any]:
        """Every VM in the resource group, following ``nextLink`` to the last page."""
        try:
            return list(self.client().virtual_machines.list(self.settings.resource_group))
        except Exception as exc:
            raise typed(exc) from None

    def _ours(self) -> list[tuple[Any, dict[str, str]]]:
        """Our VMs (the fleet tag, compared client-side: ARM cannot filter VMs by tag)."""
        found = []
        for vm in self._vms():
            tags = core_tags(vm.tags)
            if tags.get(FLEET_TAG) == self.fleet_id:
                found.append((vm, tags))
        return found

    # -- listing -----------------------------------------------------------------------------

    def list_instances(self, fleet_id: str) -> list[Instance]:
        """Our VMs and their states. A VM whose create failed holds nothing and is deleted here
        rather than listed; a Spot VM seen live and now deleted by Azure (not by us) is an
        eviction: a notice is queued, and this once the VM keeps its last state so that the
        controller, which ignores notices for instances listed as terminating, acts on it."""
        now = self.clock.now()
        found: list[Instance] = []
        seen: dict[str, tuple[str, InstanceState, bool]] = {}
        for vm, tags in self._ours():
            name = str(vm.name)
            provisioning = _provisioning(vm)
            if provisioning in FAILED_STATES and not self._running_anyway(name):
                if not self.read_only:
                    self._delete_quietly(name)
                continue
            state = STATES.get(provisioning, InstanceState.PENDING)
            if provisioning in FAILED_STATES:
                state = InstanceState.RUNNING
            instance = self._instance(vm, tags, state)
            spot = _text(vm.priority).lower() == "spot"
            before = self._seen.get(name)
            if (
                spot
                and state is InstanceState.TERMINATING
                and before is not None
                and name not in self._deleting
            ):
                self._notice(name, instance.pool, now)
                instance = instance.model_copy(update={"state": before[1]})
            if state in LIVE:
                seen[name] = (instance.pool, state, spot)
            found.append(instance)
        listed = {i.id for i in found}
        for name, (pool, _, spot) in self._seen.items():
            if spot and name not in listed and name not in self._deleting:
                self._notice(name, pool, now)
        self._seen = seen
        self._deleting &= listed
        self._reported &= listed | set(self._notices)
        return found

    def _running_anyway(self, name: str) -> bool:
        """A VM in provisioning state Failed may still be running (an update or extension
        failed after it was created): only its instance view says, so it is asked for the rare
        Failed VM only."""
        try:
            view = self.client().virtual_machines.instance_view(self.settings.resource_group, name)
        except Exception as exc:
            raise typed(exc) from None
        codes = [str(s.code or "") for s in (view.statuses or [])]
        return any(code in ("PowerState/running", "PowerState/starting") for code in codes)

    def _instance(self, vm: Any, tags: Mapping[str, str], state: InstanceState) -> Instance:
        pool_name = tags.get(POOL_TAG, "unknown")
        pool = self.pools.get(pool_name)
        size = str(getattr(vm.hardware_profile, "vm_size", "") or "")
        known = self.catalog.gpus(size) if self.catalog is not None else None
        gpus = pool.gpus_per_instance if pool else (known[0] if known and known[0] else 1)
        created = vm.time_created
        launched = created.timestamp() if created is not None else self.clock.now()
        with contextlib.suppress(ValueError):
            launched = float(tags.get(LAUNCHED_AT_TAG, ""))
        return Instance(
            id=str(vm.name),
            pool=pool_name,
            state=state,
            launched_at=launched,
            request_id=tags.get(REQUEST_TAG, ""),
            gpus=gpus,
        )

    # -- launching ---------------------------------------------------------------------------

    def launch(self, pool: Pool, count: int, request_id: str, fleet_id: str) -> LaunchResult:
        """Create ``count`` VMs, or return the request's VMs if an earlier attempt made any.

        The creates are waited on together for at most ``operation_timeout_s``. A create still
        running then, or whose status could not be read, counts as launched: ARM accepted it, so
        buying again would risk a second VM, and the next listing shows how it went (a later
        failure is deleted there and the controller replaces it). Creates that failed are
        deleted now and become the shortfall, or the raised error when nothing was launched."""
        ours = self._ours()
        existing = [
            self._instance(vm, tags, STATES.get(_provisioning(vm), InstanceState.PENDING))
            for vm, tags in ours
            if tags.get(REQUEST_TAG) == request_id
            and _provisioning(vm) not in (*FAILED_STATES, "deleting")
        ]
        if existing:
            return LaunchResult(tuple(existing), already_existed=True)
        now = self.clock.now()
        tags = self._tags(pool, request_id, now)
        names = _free_names(self.fleet_id, request_id, count, {str(vm.name) for vm, _ in ours})
        created = self._create_vms(
            pool, names, lambda name: self._body(pool, name, tags), request_id, now
        )
        for name in created.failed:
            self._delete_quietly(name)
        shortfall = _telling(created.failures)
        if shortfall is not None and not created.instances:
            raise shortfall
        return LaunchResult(tuple(created.instances), shortfall)

    def _tags(self, pool: Pool, request_id: str, now: float) -> dict[str, str]:
        """The four tags every launched VM carries."""
        return azure_tags(
            {
                FLEET_TAG: self.fleet_id,
                POOL_TAG: pool.name,
                REQUEST_TAG: request_id,
                LAUNCHED_AT_TAG: f"{now:.3f}",
            }
        )

    def _create_vms(
        self,
        pool: Pool,
        names: Sequence[str],
        body: Callable[[str], dict[str, Any]],
        request_id: str,
        now: float,
    ) -> _Created:
        """Start every VM's create at once and wait on them together for at most
        ``operation_timeout_s``. A create still running then, or whose status could not be
        read, counts as launched (pending): ARM accepted it. What to do about failures is the
        caller's: ``launch`` keeps the rest, a gang rolls back all."""
        vms = self.client().virtual_machines
        group = self.settings.resource_group
        started = _parallel(lambda name: vms.begin_create_or_update(group, name, body(name)), names)
        deadline = time.monotonic() + self.settings.operation_timeout_s
        created = _Created()
        for name, outcome in zip(names, started, strict=True):
            if isinstance(outcome, BaseException):
                created.failures.append(typed(outcome, pool.name))
                continue
            try:
                outcome.wait(max(0.0, deadline - time.monotonic()))
            except Exception as exc:
                if _operation_failed(exc):
                    created.failures.append(typed(exc, pool.name))
                    created.failed.append(name)
                    continue
                log.warning("%s: create of %s not confirmed: %s", pool.name, name, typed(exc))
            finished = outcome.done() and _text(outcome.status()).lower() == "succeeded"
            created.instances.append(
                Instance(
                    id=name,
                    pool=pool.name,
                    state=InstanceState.RUNNING if finished else InstanceState.PENDING,
                    launched_at=now,
                    request_id=request_id,
                    gpus=pool.gpus_per_instance,
                )
            )
        return created

    def launch_gang(self, pool: Pool, count: int, request_id: str, fleet_id: str) -> LaunchResult:
        """All ``count`` VMs in the pool's proximity placement group, or none (``AzureGangs``)."""
        with self._client_lock:
            if self._gangs is None:
                # imported here: providers.azure_gang builds on this module's helpers
                from providers.azure_gang import AzureGangs

                self._gangs = AzureGangs(self)
            gangs = self._gangs
        return gangs.launch(pool, count, request_id)

    def _body(self, pool: Pool, name: str, tags: Mapping[str, str]) -> dict[str, Any]:
        """The VM as ARM's JSON: the pool's size, image and subnet, a NIC and OS disk that are
        deleted with the VM, and the spot settings for a spot pool."""
        options = self.options[pool.name]
        os_disk: dict[str, Any] = {"createOption": "FromImage", "deleteOption": "Delete"}
        if options.os_disk_size_gb is not None:
            os_disk["diskSizeGB"] = options.os_disk_size_gb
        user = options.admin_username
        os_profile: dict[str, Any] = {
            "computerName": name,
            "adminUsername": user,
            "linuxConfiguration": {
                "disablePasswordAuthentication": True,
                "ssh": {
                    "publicKeys": [
                        {
                            "path": f"/home/{user}/.ssh/authorized_keys",
                            "keyData": options.ssh_public_key,
                        }
                    ]
                },
            },
        }
        if options.custom_data is not None:
            os_profile["customData"] = base64.b64encode(options.custom_data.encode()).decode()
        properties: dict[str, Any] = {
            "hardwareProfile": {"vmSize": pool.instance_type},
            "storageProfile": {"imageReference": options.image_reference(), "osDisk": os_disk},
            "osProfile": os_profile,
            "networkProfile": {
                "networkApiVersion": "2020-11-01",
                "networkInterfaceConfigurations": [
                    {
                        "name": f"{name}-nic",
                        "properties": {
                            "primary": True,
                            "deleteOption": "Delete",
                            "ipConfigurations": [
                                {
                                    "name": "primary",
                                    "properties": {
                                        "primary": True,
                                        "subnet": {"id": options.subnet_id},
                                    },
                                }
                            ],
                        },
                    }
                ],
            },
            "priority": "Spot" if pool.is_spot else "Regular",
        }
        if pool.is_spot:
            properties["evictionPolicy"] = "Delete"
            properties["billingProfile"] = {"maxPrice": options.max_price}
        body: dict[str, Any] = {
            "location": pool.region,
            "tags": dict(tags),
            "properties": properties,
        }
        if pool.zone:
            body["zones"] = [pool.zone.rsplit("-", 1)[-1]]
        return body

    # -- terminating -------------------------------------------------------------------------

    def terminate(self, instance_ids: Sequence[str], request_id: str) -> None:
        """Delete only VMs that carry our fleet tag, whatever names we are given. The delete is
        accepted by ARM and not waited on: the listing shows the VM deleting, then gone."""
        wanted = {i.lower() for i in instance_ids}
        if not wanted:
            return
        owned = [
            str(vm.name)
            for vm, _ in self._ours()
            if str(vm.name).lower() in wanted and _provisioning(vm) != "deleting"
        ]
        outcomes = _parallel(self._delete, owned)
        errors = [typed(o) for o in outcomes if isinstance(o, BaseException)]
        if errors:
            raise errors[0]

    def _delete(self, name: str) -> None:
        from azure.core.exceptions import ResourceNotFoundError

        with contextlib.suppress(ResourceNotFoundError):
            self.client().virtual_machines.begin_delete(
                self.settings.resource_group, name, polling=False
            )
        self._deleting.add(name)

    def _delete_quietly(self, name: str) -> None:
        """Delete a VM whose create failed. Failing here is only logged: the next listing finds
        the VM again and tries once more."""
        try:
            self._delete(name)
        except Exception as exc:
            log.warning("deleting %s, whose create failed, failed: %s", name, typed(exc))

    # -- prices ------------------------------------------------------------------------------

    def prices(self, pools: Sequence[Pool]) -> list[PriceQuote]:
        """Quotes for the pools that can be priced. A pool the price source failed for is left
        out (the controller keeps its last quote); the error is raised only when no pool could
        be priced at all."""
        now = self.clock.now()
        quotes = []
        errors: list[ProviderError] = []
        for pool in pools:
            try:
                spot, on_demand, source = self._price(pool, now)
            except ProviderError as exc:
                errors.append(exc)
                continue
            price = spot if pool.is_spot else on_demand
            if price is None:
                continue
            quotes.append(
                PriceQuote(
                    pool=pool.name,
                    price_per_hour=price,
                    on_demand_price_per_hour=on_demand,
                    interruption_rate_per_hour=None,
                    as_of=now,
                    source=source,
                )
            )
        if errors and not quotes:
            raise errors[0]
        for error in errors:
            log.warning("prices: %s", error)
        return quotes

    def _price(self, pool: Pool, now: float) -> tuple[float | None, float | None, str]:
        """(spot, on-demand, source) per hour of one VM: the catalog's row when it prices the
        pool's market, else the Retail Prices API."""
        if self.catalog is not None:
            row = self.catalog.price(pool.instance_type, pool.region, pool.zone)
            if row is not None and (row.spot if pool.is_spot else row.on_demand) is not None:
                return row.spot, row.on_demand, "catalog"
        if self.settings.retail_prices_url is None:
            return None, None, ""
        retail = self._retail_prices(pool.region, pool.instance_type, now)
        return retail.spot, retail.on_demand, "azure-retail-prices"

    def _retail_prices(self, region: str, size: str, now: float) -> _Retail:
        key = (region, size)
        cached = self._retail.get(key)
        if cached is not None and now - cached.fetched_at < self.settings.price_ttl_s:
            return cached
        expression = (
            "serviceName eq 'Virtual Machines' and priceType eq 'Consumption' "
            f"and armRegionName eq '{region}' and armSkuName eq '{size}'"
        )
        spot: list[float] = []
        on_demand: list[float] = []
        for item in self._price_items(expression):
            meter = f"{item.get('meterName', '')} {item.get('skuName', '')}"
            if (
                "Windows" in str(item.get("productName", ""))
                or "Low Priority" in meter
                or item.get("unitOfMeasure", "1 Hour") != "1 Hour"
            ):
                continue
            price = float(item.get("retailPrice", item.get("unitPrice", 0.0)))
            (spot if "Spot" in meter else on_demand).append(price)
        retail = _Retail(now, min(spot, default=None), min(on_demand, default=None))
        self._retail[key] = retail
        return retail

    def _price_items(self, expression: str) -> Iterable[Mapping[str, Any]]:
        """Every item the Retail Prices API returns for a filter, following ``NextPageLink``."""
        assert self.settings.retail_prices_url is not None
        url: str | None = f"{self.settings.retail_prices_url}?$filter={quote(expression)}"
        items: list[Mapping[str, Any]] = []
        pages = 0
        while url and pages < MAX_PRICE_PAGES:
            pages += 1
            page = _get_json(url, self.settings.read_timeout_s)
            items.extend(page.get("Items") or [])
            url = page.get("NextPageLink") or None
        return items

    # -- notices -----------------------------------------------------------------------------

    def _notice(self, name: str, pool: str, now: float) -> None:
        if name in self._reported:
            return
        self._reported.add(name)
        self._notices[name] = InterruptionNotice(
            instance_id=name, pool=pool, kind=NoticeKind.TERMINATE, received_at=now, deadline=now
        )

    def poll_notices(self) -> list[InterruptionNotice]:
        """Evictions the listings saw (each reported once), kept until acknowledged."""
        return list(self._notices.values())

    def acknowledge(self, notices: Sequence[InterruptionNotice]) -> None:
        for notice in notices:
            self._notices.pop(notice.instance_id, None)


# -- errors ------------------------------------------------------------------------------------


def error_code(
    code: str | None,
    status: int,
    message: str,
    pool: str | None,
    retry_after_s: float | None = None,
) -> ProviderError:
    """The typed error for one ARM error code and HTTP status."""
    text = f"{code}: {message}" if message else str(code or f"HTTP {status}")
    if status == 429 or code in THROTTLE_CODES:
        return ThrottledError(
            text, pool=pool, code=code or "TooManyRequests", retry_after_s=retry_after_s
        )
    if code in CAPACITY_CODES:
        return CapacityError(text, pool=pool, code=code)
    if code in QUOTA_CODES or (code == "OperationNotAllowed" and "quota" in message.lower()):
        return QuotaError(text, pool=pool, code=code, scope=QuotaScope.REGION)
    if code in TRANSIENT_CODES or status >= 500:
        return TransientError(text, pool=pool, code=code or "ServerError")
    if code in AUTH_CODES or status in (401, 403):
        return AuthError(text, pool=pool, code=code or "AuthenticationFailed")
    return InvalidRequest(text, pool=pool, code=code or "InvalidRequest")


def typed(exc: BaseException, pool: str | None = None) -> ProviderError:
    """Map anything the SDK raises, synchronously or from a failed long-running operation, onto
    a typed error. Credentials never appear: ARM's messages hold none, and a credential failure
    is reported by kind only."""
    from azure.core.exceptions import (
        ClientAuthenticationError,
        HttpResponseError,
        ServiceRequestError,
        ServiceResponseError,
    )

    if isinstance(exc, ProviderError):
        return exc
    if isinstance(exc, ClientAuthenticationError) and exc.response is None:
        return AuthError(
            f"no usable Azure credential ({type(exc).__name__}); see DefaultAzureCredential",
            pool=pool,
            code="NoCredentials",
        )
    if isinstance(exc, HttpResponseError):
        code, message = _error_details(exc)
        response = exc.response
        status = int(getattr(response, "status_code", 0) or 0)
        headers = getattr(response, "headers", None) or {}
        return error_code(code, status, message, pool, _retry_after(headers))
    if isinstance(exc, (ServiceRequestError, ServiceResponseError)):
        return TransientError(f"{type(exc).__name__}: {exc}", pool=pool, code="Connection")
    return TransientError(f"{type(exc).__name__}: {exc}", pool=pool, code=type(exc).__name__)


def _error_details(exc: Any) -> tuple[str | None, str]:
    """ARM's error code and message; a known code among the details wins over a generic one
    (a failed deployment wraps the allocation failure that caused it)."""
    error = getattr(exc, "error", None)
    code = getattr(error, "code", None)
    message = str(getattr(error, "message", "") or "")
    if code not in KNOWN_CODES:
        for detail in getattr(error, "details", None) or []:
            if getattr(detail, "code", None) in KNOWN_CODES:
                return str(detail.code), str(getattr(detail, "message", "") or message)
    if code is None:
        return None, str(getattr(exc, "message", "") or "")
    return str(code), message


def _retry_after(headers: Mapping[str, str]) -> float | None:
    """Seconds to wait from ``Retry-After`` (seconds or an HTTP date) or ``retry-after-ms``."""
    lowered = {k.lower(): v for k, v in headers.items()}
    for name, scale in (("retry-after-ms", 0.001), ("x-ms-retry-after-ms", 0.001)):
        if name in lowered:
            try:
                return max(0.0, float(lowered[name]) * scale)
            except ValueError:
                pass
    value = lowered.get("retry-after")
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        return max(0.0, parsedate_to_datetime(value).timestamp() - time.time())
    except (TypeError, ValueError):
        return None


def _operation_failed(exc: BaseException) -> bool:
    """Whether a poller's error is the operation's own failure (the VM was not created), rather
    than a failure to learn how it went (a status poll that errored: the outcome is unknown)."""
    from azure.core.polling.base_polling import OperationFailed

    inner = getattr(exc, "inner_exception", None)
    return isinstance(inner, OperationFailed) or isinstance(exc.__cause__, OperationFailed)


def _telling(errors: Sequence[ProviderError]) -> ProviderError | None:
    """The error that tells act the most: capacity or quota (the pool goes into the cache)."""
    for error in errors:
        if isinstance(error, (CapacityError, QuotaError)):
            return error
    return errors[0] if errors else None


def _parallel(call: Callable[[T], R], items: Sequence[T]) -> list[R | BaseException]:
    """``call`` over ``items`` on a few threads (ARM answers each PUT or DELETE in about a
    second); an item's exception is returned in its place."""

    def guarded(item: T) -> R | BaseException:
        try:
            return call(item)
        except Exception as exc:
            return exc

    if len(items) <= 1:
        return [guarded(item) for item in items]
    with ThreadPoolExecutor(max_workers=min(len(items), MAX_PARALLEL_CALLS)) as pool:
        return list(pool.map(guarded, items))


def _get_json(url: str, timeout: float) -> dict[str, Any]:
    """One GET of the public Retail Prices API (no credentials), errors typed."""
    try:
        with urlopen(url, timeout=timeout) as response:
            return dict(json.loads(response.read()))
    except HTTPError as exc:
        try:
            body = json.loads(exc.read() or b"{}")
        except ValueError:
            body = {}
        error = body.get("Error") or body.get("error") or {}
        code = error.get("Code") or error.get("code")
        message = str(error.get("Message") or error.get("message") or exc.reason)
        raise error_code(code, exc.code, message, None, _retry_after(dict(exc.headers))) from None
    except (URLError, TimeoutError, OSError, ValueError) as exc:
        raise TransientError(
            f"retail prices: {type(exc).__name__}: {exc}", code="PriceApi"
        ) from None


def _emulator_auth() -> tuple[Any, dict[str, Any]]:
    """TEST ONLY, used only when ``endpoint`` is set: a credential object (the client insists on
    one) and a policy that sends a fixed bearer token, which the SDK's own bearer policy
    refuses to do over plain HTTP. No real credential is involved."""
    from azure.core.credentials import AccessToken
    from azure.core.pipeline.policies import HeadersPolicy

    class EmulatorCredential:
        def get_token(self, *scopes: str, **kwargs: Any) -> AccessToken:
            return AccessToken(EMULATOR_TOKEN, int(time.time()) + 3600)

    policy = HeadersPolicy({"Authorization": f"Bearer {EMULATOR_TOKEN}"})
    return EmulatorCredential(), {"authentication_policy": policy}
