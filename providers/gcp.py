"""GCP: Spot and standard GPU VMs on Compute Engine through google-cloud-compute (the ``gcp``
extra), imported lazily.

* Launch: one ``instances.insert`` per VM, spread over the pool's zones, each with a name and a
  ``requestId`` derived from the controller's request id, so a retry can never buy a VM twice:
  Compute Engine answers a repeated ``requestId`` with the same operation and a repeated name with
  409. Before inserting, the provider lists the request's VMs by label and inserts only the ones
  missing. Operations are waited on through our own ``ZoneOperationsClient`` (the SDK's
  ``operation.result()`` would poll the public endpoint whatever endpoint we were given), bounded by
  ``operation_timeout_s``. A zone out of capacity hands its VMs to the pool's other zones. A VM
  that may exist (its operation unfinished at the deadline, or its insert answered by a server
  error while the VM is there) is counted, so the budget never forgets what is being paid for.
* List and terminate by the fleet label only: a VM without it is invisible to us.
* Prices: the shipped Compute Engine price history (latest per region and machine type) or a
  SkyPilot-format catalog; GCP publishes no interruption rates.
* Errors: HTTP errors and operations that end ``DONE`` with an ``error`` are both mapped onto the
  core's typed errors; the SDK's own retries are off, so the controller's policy is the only one.
* Preemptions: read centrally from the zones' ``compute.instances.preempted`` operations and from
  Spot VMs of ours listed as ``TERMINATED``, each reported once.
* Gangs: ``launch_gang`` makes a multi-node job's VMs with one ``instances.bulkInsert`` whose
  ``minCount`` is all of them, under the pool's compact placement policy (``providers.gcp_gang``).

Credentials come from Application Default Credentials (``google.auth.default()``), never from
the config file; a test endpoint is called anonymously.
"""

from __future__ import annotations

import hashlib
import logging
import re
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from email.utils import parsedate_to_datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from autoscaler.model import (
    Instance,
    InstanceState,
    InterruptionNotice,
    NoticeKind,
    Pool,
    PriceQuote,
)
from autoscaler.model.catalog import DATA, SKYPILOT_COLUMNS, CatalogPrice, SkyPilotCatalog
from autoscaler.model.clock import Clock, SystemClock
from autoscaler.model.csvfile import read_rows
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
    from providers.gcp_gang import GcpGangs

log = logging.getLogger(__name__)

PRICE_HISTORY = DATA / "prices" / "gcp_gpu_vm_price_history.csv"
SCOPE = "https://www.googleapis.com/auth/compute"
MAX_RESULTS = 500
PREEMPTED = "compute.instances.preempted"

# The core's tag names as GCP label keys ("/" is not allowed in a label key).
LABEL_KEYS = {
    FLEET_TAG: "gpu-autoscaler-fleet",
    POOL_TAG: "gpu-autoscaler-pool",
    REQUEST_TAG: "gpu-autoscaler-request",
    LAUNCHED_AT_TAG: "gpu-autoscaler-launched-at",
}
TAG_KEYS = {label: tag for tag, label in LABEL_KEYS.items()}
LABEL_MAX = 63

STATES = {
    "PENDING": InstanceState.PENDING,
    "PROVISIONING": InstanceState.PENDING,
    "STAGING": InstanceState.PENDING,
    "REPAIRING": InstanceState.PENDING,
    "RUNNING": InstanceState.RUNNING,
    "PENDING_STOP": InstanceState.TERMINATING,
    "STOPPING": InstanceState.TERMINATING,
    "STOPPED": InstanceState.TERMINATING,
    "SUSPENDING": InstanceState.TERMINATING,
    "SUSPENDED": InstanceState.TERMINATING,
    "TERMINATED": InstanceState.TERMINATING,
    "DEPROVISIONING": InstanceState.TERMINATING,
}

# Compute Engine's error codes (in operations) and reasons (in HTTP error bodies), after
# SkyPilot's GCP failover handling and the VM creation troubleshooting guide.
CAPACITY_CODES = frozenset(
    {
        "ZONE_RESOURCE_POOL_EXHAUSTED",
        "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS",
        "REGION_RESOURCE_POOL_EXHAUSTED",
        "RESOURCE_POOL_EXHAUSTED",
        "UNSUPPORTED_OPERATION",
        "insufficientCapacity",
        "resourcePoolExhausted",
    }
)
QUOTA_CODES = frozenset({"QUOTA_EXCEEDED", "quotaExceeded"})
THROTTLE_CODES = frozenset(
    {"rateLimitExceeded", "userRateLimitExceeded", "RATE_LIMIT_EXCEEDED", "tooManyRequests"}
)
TRANSIENT_CODES = frozenset(
    {"INTERNAL_ERROR", "backendError", "internalError", "SERVICE_UNAVAILABLE", "unavailable"}
)
AUTH_CODES = frozenset(
    {"required", "authError", "forbidden", "insufficientPermissions", "accessNotConfigured"}
)
GLOBAL_QUOTA_MARKERS = ("GPUS_ALL_REGIONS", "gpus_all_regions", "GPUS-ALL-REGIONS")
RESOURCE_NAME = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")


class _Strict(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class GcpSettings(_Strict):
    """``providers.gcp`` in the controller config."""

    project: str = Field(..., min_length=1, description="the project VMs are launched in")
    endpoint: str | None = Field(
        None, description="a Compute Engine endpoint override with its scheme (tests; anonymous)"
    )
    price_catalog: str | None = Field(
        None, description="a SkyPilot-format catalog CSV (default: the shipped price history)"
    )
    operation_timeout_s: float = Field(
        180.0, gt=0, description="how long a launch waits for its insert operations"
    )
    request_timeout_s: float = Field(30.0, gt=0, description="one HTTP request's timeout")
    preemption_lookback_s: float = Field(
        3600.0, gt=0, description="how far back preemption operations are read"
    )

    @field_validator("endpoint")
    @classmethod
    def _with_scheme(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith(("http://", "https://")):
            raise ValueError("give the scheme, e.g. http://127.0.0.1:8080")
        return value


class GcpPoolOptions(_Strict):
    """``options`` of a GCP pool."""

    zones: tuple[str, ...] = Field((), description="zones to spread over (default: pool.zone)")
    image: str = Field(..., min_length=1, description="the boot disk's source image")
    network: str | None = None
    subnetwork: str | None = None
    accelerator_type: str | None = Field(
        None, description="guest GPUs for N1-style machines, e.g. nvidia-tesla-t4"
    )
    accelerator_count: int | None = Field(None, ge=1)
    disk_size_gb: int = Field(100, ge=10)
    placement_policy: PlacementOption | None = Field(
        None,
        description="the compact placement policy a gang is launched under: {name: X} "
        "(existing, in the pool's region), {create: true} (made for the pool) or both",
    )

    @model_validator(mode="after")
    def _accelerators(self) -> GcpPoolOptions:
        if self.accelerator_count is not None and self.accelerator_type is None:
            raise ValueError("accelerator_count needs an accelerator_type")
        return self

    @field_validator("placement_policy")
    @classmethod
    def _policy_name(cls, value: PlacementOption | None) -> PlacementOption | None:
        name = value.name if value is not None else None
        if name is not None and not RESOURCE_NAME.match(name):
            raise ValueError(
                "name: expected a resource name (lowercase letters, digits and hyphens, "
                "starting with a letter, at most 63)"
            )
        return value


# -- labels ------------------------------------------------------------------------------------

_PLAIN = frozenset("abcdefghijklmnopqrstuvwxyz0123456789-")


def label_value(text: str) -> str:
    """A tag value as a GCP label value (lowercase letters, digits, ``-`` and ``_``, at most 63).

    Every other character, ``_`` included, becomes ``_`` and two hex digits per UTF-8 byte, so the
    mapping is reversible. A value still too long keeps a readable prefix and ends in ``__`` and
    a hash: no plain encoding contains ``__``, so such a value can never be mistaken for another.
    """
    encoded = "".join(
        char if char in _PLAIN else "".join(f"_{byte:02x}" for byte in char.encode())
        for char in text
    )
    if len(encoded) <= LABEL_MAX:
        return encoded
    digest = hashlib.sha256(text.encode()).hexdigest()[:15]
    prefix = encoded[: LABEL_MAX - len(digest) - 2]
    cut = prefix.rfind("_")
    if cut >= len(prefix) - 2 and cut != -1:
        prefix = prefix[:cut]
    return f"{prefix}__{digest}"


def tag_value(label: str) -> str:
    """The tag value a label value encodes; a hashed (too long) value is returned as it is."""
    if "__" in label or "_" not in label:
        return label
    raw = bytearray()
    index = 0
    while index < len(label):
        char = label[index]
        if char == "_" and re.fullmatch(r"[0-9a-f]{2}", label[index + 1 : index + 3]):
            raw.append(int(label[index + 1 : index + 3], 16))
            index += 3
        else:
            raw.extend(char.encode())
            index += 1
    return raw.decode(errors="replace")


def labels_for(tags: Mapping[str, str]) -> dict[str, str]:
    return {LABEL_KEYS.get(key, key): label_value(value) for key, value in tags.items()}


def tags_from_labels(labels: Mapping[str, str]) -> dict[str, str]:
    """A VM's labels with the core's tag names and values back (other labels as they are)."""
    return {
        TAG_KEYS.get(key, key): tag_value(value) if key in TAG_KEYS else value
        for key, value in labels.items()
    }


def instance_name(fleet_id: str, request_id: str, index: int) -> str:
    """A valid VM name that is the same every time for one fleet, request and position."""
    digest = hashlib.sha256(f"{fleet_id}\n{request_id}".encode()).hexdigest()[:16]
    return f"ga-{digest}-{index}"


_REQUESTS = uuid.UUID("5d0f3a52-2b8e-4c51-9a54-3f2e7b1c9d10")


def request_uuid(*parts: str) -> str:
    """Compute Engine's ``requestId`` must be a UUID; ours is derived, so a retry repeats it."""
    return str(uuid.uuid5(_REQUESTS, "\n".join(parts)))


# -- errors ------------------------------------------------------------------------------------


def error_for(
    codes: Sequence[str],
    status: int,
    message: str,
    pool: str | None,
    *,
    retry_after_s: float | None = None,
    global_quota: bool = False,
) -> ProviderError:
    """The typed error for Compute Engine's codes (or reasons) and HTTP status.

    The code decides before the status: a quota error arrives as 403 and a rate limit sometimes
    as 403 too, and neither is an authorisation failure."""
    known = [c for c in codes if c]
    groups = (CAPACITY_CODES, QUOTA_CODES, THROTTLE_CODES, TRANSIENT_CODES, AUTH_CODES)
    chosen = next((c for group in groups for c in known if c in group), known[0] if known else None)
    text = f"{chosen}: {message}" if chosen else message
    if chosen in CAPACITY_CODES:
        return CapacityError(text, pool=pool, code=chosen)
    if chosen in QUOTA_CODES:
        everywhere = global_quota or any(m in message for m in GLOBAL_QUOTA_MARKERS)
        scope = QuotaScope.PROVIDER if everywhere else QuotaScope.REGION
        return QuotaError(text, pool=pool, code=chosen, scope=scope)
    if chosen in THROTTLE_CODES or status == 429:
        return ThrottledError(
            text, pool=pool, code=chosen or "Throttled", retry_after_s=retry_after_s
        )
    if chosen in TRANSIENT_CODES or status >= 500:
        return TransientError(text, pool=pool, code=chosen or f"HTTP{status}")
    if chosen in AUTH_CODES or status in (401, 403):
        return AuthError(text, pool=pool, code=chosen or f"HTTP{status}")
    return InvalidRequest(text, pool=pool, code=chosen or f"HTTP{status}")


def retry_after(response: Any) -> float | None:
    """Seconds from a ``Retry-After`` header (a number or an HTTP date), if there is one."""
    headers = getattr(response, "headers", None)
    value = headers.get("Retry-After") if headers is not None else None
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


def typed(exc: BaseException, pool: str | None = None) -> ProviderError:
    """Map anything the SDK raises onto a typed error; credentials never appear in the message
    (the SDK's messages carry the method, the URL and Google's error text, not headers)."""
    if isinstance(exc, ProviderError):
        return exc
    from google.api_core import exceptions as core

    if isinstance(exc, core.GoogleAPICallError):
        codes = [str(e.get("reason", "")) for e in exc.errors if isinstance(e, Mapping)]
        if exc.reason:
            codes.append(str(exc.reason))
        return error_for(
            codes,
            int(exc.code or 0),
            str(exc.message),
            pool,
            retry_after_s=retry_after(exc.response),
        )
    from google.auth import exceptions as auth

    if isinstance(exc, (auth.RefreshError, auth.InvalidOperation)):
        # google-auth answers a 401 by refreshing the credentials and trying again once
        return AuthError(
            "the credentials were refused and could not be refreshed",
            pool=pool,
            code="CredentialsRefused",
        )
    if isinstance(exc, auth.DefaultCredentialsError):
        return AuthError(
            "no usable Application Default Credentials", pool=pool, code="NoCredentials"
        )
    return TransientError(f"{type(exc).__name__}: {exc}", pool=pool, code=type(exc).__name__)


def operation_error(operation: Any, pool: str | None = None) -> ProviderError | None:
    """The typed error of an operation that ended ``DONE`` with an ``error``, or None."""
    errors = list(operation.error.errors)
    status = int(operation.http_error_status_code or 0)
    if not errors and status < 400:
        return None
    message = "; ".join(str(e.message) for e in errors) or str(operation.http_error_message)
    details = " ".join(
        f"{d.quota_info.metric_name} {d.quota_info.limit_name}"
        for e in errors
        for d in e.error_details
    )
    return error_for(
        [str(e.code) for e in errors],
        status or 400,
        message,
        pool,
        global_quota=any(m in details for m in GLOBAL_QUOTA_MARKERS),
    )


def wait_done(
    wait: Callable[..., Any], request: Mapping[str, str], deadline: float, request_timeout_s: float
) -> Any:
    """The operation once ``DONE``, or None when the deadline passes or its fate cannot be
    read. ``wait`` is a zone or region operations client's ``wait`` and ``request`` names the
    operation in its scope (the caller binds the client, so the grants test sees which one).
    Waits are in real time whatever the controller's clock: the cloud works in real time.
    ``wait`` returns at once when done (or after up to two minutes on Compute Engine); between
    polls that return early we back off from 50 ms to 1 s."""
    from google.cloud import compute_v1

    pause = 0.05
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return None
        try:
            done = wait(
                request=dict(request),
                retry=None,
                timeout=min(remaining, max(request_timeout_s, 1.0)),
            )
            if done.status == compute_v1.Operation.Status.DONE:
                return done
        except Exception as exc:
            if not isinstance(typed(exc), TransientError):
                return None
        time.sleep(min(pause, max(0.0, deadline - time.monotonic())))
        pause = min(pause * 2, 1.0)


def _is_conflict(exc: BaseException) -> bool:
    from google.api_core import exceptions as core

    return isinstance(exc, core.Conflict)


def _is_not_found(exc: BaseException) -> bool:
    from google.api_core import exceptions as core

    return isinstance(exc, core.NotFound)


def _timestamp(text: str) -> float | None:
    if not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def _last(link: str) -> str:
    return link.rstrip("/").rsplit("/", 1)[-1]


# -- prices ------------------------------------------------------------------------------------


class PriceSource(Protocol):
    path: str

    def price(
        self, instance_type: str, region: str, zone: str | None = None
    ) -> CatalogPrice | None: ...


class GcpPriceHistory:
    """The latest spot and on-demand price per region (or zone) and machine type, from a
    change-point history (``timestamp, cloud, region, zone, instance_type, price_per_hour,
    on_demand_price_per_hour``; ``price_per_hour`` is the spot price). Each column keeps its own
    latest value, since spot prices begin later in the history than on-demand ones."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)
        latest: dict[tuple[str, str, str], dict[str, tuple[float, float]]] = {}
        columns = ("timestamp", "cloud", "region", "zone", "instance_type", "price_per_hour")
        for row in read_rows(path, (*columns, "on_demand_price_per_hour")):
            if row.text("cloud") != "gcp":
                continue
            when = row.timestamp("timestamp")
            key = (row.text("region"), row.text("zone"), row.text("instance_type"))
            kept = latest.setdefault(key, {})
            for column in ("price_per_hour", "on_demand_price_per_hour"):
                value = row.optional_number(column, minimum=0)
                if value is not None and (column not in kept or kept[column][0] <= when):
                    kept[column] = (when, value)
        self._prices = {
            key: CatalogPrice(
                on_demand=kept["on_demand_price_per_hour"][1]
                if "on_demand_price_per_hour" in kept
                else None,
                spot=kept["price_per_hour"][1] if "price_per_hour" in kept else None,
            )
            for key, kept in latest.items()
        }

    def price(
        self, instance_type: str, region: str, zone: str | None = None
    ) -> CatalogPrice | None:
        if zone and (region, zone, instance_type) in self._prices:
            return self._prices[(region, zone, instance_type)]
        return self._prices.get((region, "", instance_type))


class AcceleratorPrices:
    """Per-GPU prices of attachable GPUs from a SkyPilot-format catalog: its rows with an empty
    ``InstanceType`` and an ``AcceleratorName`` (N1 machines are priced without their GPUs)."""

    def __init__(self, path: Path) -> None:
        self._prices: dict[tuple[str, str, str], CatalogPrice] = {}
        for row in read_rows(path, SKYPILOT_COLUMNS):
            if row.text("InstanceType") or not row.text("AcceleratorName"):
                continue
            key = (
                _gpu(row.text("AcceleratorName")),
                row.text("Region"),
                row.text("AvailabilityZone"),
            )
            self._prices[key] = CatalogPrice(
                on_demand=row.optional_number("Price", minimum=0),
                spot=row.optional_number("SpotPrice", minimum=0),
            )

    def price(self, accelerator: str, region: str, zone: str) -> CatalogPrice | None:
        name = _gpu(accelerator)
        return self._prices.get((name, region, zone)) or self._prices.get((name, region, ""))


def _gpu(name: str) -> str:
    """``nvidia-tesla-t4`` and SkyPilot's ``T4`` name the same GPU."""
    lowered = name.strip().lower()
    for prefix in ("nvidia-tesla-", "nvidia-"):
        if lowered.startswith(prefix):
            return lowered[len(prefix) :]
    return lowered


# -- the provider ------------------------------------------------------------------------------


@dataclass
class _Seen:
    """What a listing or a launch told us of one of our VMs, for notices and terminate."""

    pool: str
    zone: str
    at: float


@dataclass
class _Launch:
    """One launch's progress over its insert rounds."""

    placed: list[tuple[str, str]] = field(default_factory=list)
    unsure: list[tuple[str, str]] = field(default_factory=list)
    full_zones: set[str] = field(default_factory=set)
    capacity: ProviderError | None = None
    stopped: ProviderError | None = None

    def refused(self, error: ProviderError, zone: str) -> bool:
        """Note a refusal; True when the VM may try another zone (only a full zone allows it:
        quota, throttling and the rest would refuse it there too, so they end the launch)."""
        if isinstance(error, CapacityError):
            self.full_zones.add(zone)
            self.capacity = error
            return True
        if self.stopped is None:
            self.stopped = error
        return False


class GcpProvider:
    name = "gcp"

    def __init__(
        self,
        settings: GcpSettings,
        pools: Sequence[Pool],
        fleet_id: str,
        clock: Clock | None = None,
    ) -> None:
        self.settings = settings
        self.fleet_id = fleet_id
        self.clock = clock or SystemClock()
        self.pools = {p.name: p for p in pools}
        self.options: dict[str, GcpPoolOptions] = {}
        self.zones: dict[str, tuple[str, ...]] = {}
        for index, pool in enumerate(pools):
            where = f"pools[{index}].options"
            self.options[pool.name] = validate_settings(GcpPoolOptions, pool.options, field=where)
            zones = self.options[pool.name].zones or ((pool.zone,) if pool.zone else ())
            if not zones:
                raise InputError("config", "give zones, or the pool's zone", field=f"{where}.zones")
            for zone in zones:
                if not zone.startswith(f"{pool.region}-"):
                    raise InputError(
                        "config",
                        f"zone {zone!r} is not in the pool's region {pool.region!r}",
                        field=f"{where}.zones",
                    )
            self.zones[pool.name] = zones
        self.price_source: PriceSource
        self.accelerators: AcceleratorPrices | None = None
        if settings.price_catalog:
            self.price_source = SkyPilotCatalog(Path(settings.price_catalog))
            self.accelerators = AcceleratorPrices(Path(settings.price_catalog))
            self.price_label = "skypilot-catalog"
        else:
            self.price_source = GcpPriceHistory(PRICE_HISTORY)
            self.price_label = "gcp-price-history"
        self._pool_by_label = {label_value(p.name): p.name for p in pools}
        self._lock = threading.Lock()
        self._clients: tuple[Any, Any] | None = None
        self._placement_clients: tuple[Any, Any] | None = None
        self._common: dict[str, Any] | None = None
        self._gangs: GcpGangs | None = None
        self._seen: dict[str, _Seen] = {}
        self._preempted: dict[str, str] = {}
        self._reported: dict[str, float] = {}

    @classmethod
    def from_config(
        cls,
        settings: Mapping[str, Any],
        pools: Sequence[Pool],
        fleet_id: str,
        clock: Clock | None = None,
    ) -> GcpProvider:
        parsed = validate_settings(GcpSettings, dict(settings), field="providers.gcp")
        return cls(parsed, pools, fleet_id, clock)

    # -- clients -----------------------------------------------------------------------------

    def clients(self) -> tuple[Any, Any]:
        """The instances and zone-operations clients (made once, with the same options)."""
        with self._lock:
            if self._clients is None:
                try:
                    self._clients = self._make_clients()
                except Exception as exc:
                    raise typed(exc) from None
            return self._clients

    def _make_clients(self) -> tuple[Any, Any]:
        from google.cloud import compute_v1

        common = self._client_settings()
        return compute_v1.InstancesClient(**common), compute_v1.ZoneOperationsClient(**common)

    def placement_clients(self) -> tuple[Any, Any]:
        """The resource-policies and region-operations clients, for gangs' compact placement
        policies (made on first use, with the same credentials and options as the others)."""
        with self._lock:
            if self._placement_clients is None:
                try:
                    self._placement_clients = self._make_placement_clients()
                except Exception as exc:
                    raise typed(exc) from None
            return self._placement_clients

    def _make_placement_clients(self) -> tuple[Any, Any]:
        from google.cloud import compute_v1

        common = self._client_settings()
        policies = compute_v1.ResourcePoliciesClient(**common)
        return policies, compute_v1.RegionOperationsClient(**common)

    def _client_settings(self) -> dict[str, Any]:
        """What every client is made with; the credentials are looked up once (callers hold
        the lock)."""
        if self._common is None:
            from google.api_core.client_options import ClientOptions

            credentials: Any
            if self.settings.endpoint:
                from google.auth.credentials import AnonymousCredentials

                credentials = AnonymousCredentials()  # type: ignore[no-untyped-call]
                options = ClientOptions(api_endpoint=self.settings.endpoint)
            else:
                import google.auth

                credentials, _ = google.auth.default(scopes=[SCOPE])
                options = None
            self._common = {
                "credentials": credentials,
                "transport": "rest",
                "client_options": options,
            }
        return self._common

    def _call(self, method: Any, request: Any) -> Any:
        """One SDK call with its retries off: the controller's retry policy is the only one."""
        return method(request=request, retry=None, timeout=self.settings.request_timeout_s)

    # -- listing -----------------------------------------------------------------------------

    def _filter(self, request_id: str | None = None) -> str:
        """A list filter on our fleet's label (and a request's), in Compute Engine's syntax."""
        terms = {FLEET_TAG: self.fleet_id}
        if request_id is not None:
            terms[REQUEST_TAG] = request_id
        return " ".join(
            f'(labels.{LABEL_KEYS[tag]} = "{label_value(value)}")' for tag, value in terms.items()
        )

    def _aggregated(self) -> list[tuple[str, Any]]:
        """Every VM carrying our fleet label, in every zone, all pages read before any is used
        (a listing that fails half-way must not look like a smaller fleet)."""
        instances, _ = self.clients()
        found: list[tuple[str, Any]] = []
        try:
            pages = self._call(
                instances.aggregated_list,
                {
                    "project": self.settings.project,
                    "filter": self._filter(),
                    "max_results": MAX_RESULTS,
                },
            )
            for scope, scoped in pages:
                found.extend((_last(scope), raw) for raw in scoped.instances)
        except Exception as exc:
            raise typed(exc) from None
        return found

    def _zone_list(self, zone: str, request_id: str, pool: str) -> list[Any]:
        instances, _ = self.clients()
        try:
            pages = self._call(
                instances.list,
                {
                    "project": self.settings.project,
                    "zone": zone,
                    "filter": self._filter(request_id),
                    "max_results": MAX_RESULTS,
                },
            )
            return list(pages)
        except Exception as exc:
            raise typed(exc, pool) from None

    def list_instances(self, fleet_id: str) -> list[Instance]:
        listed = self._aggregated()
        now = self.clock.now()
        preempted: dict[str, str] = {}
        found = []
        for zone, raw in listed:
            instance = self._instance(raw, zone, now)
            found.append(instance)
            if raw.status == "TERMINATED" and raw.scheduling.provisioning_model == "SPOT":
                preempted[instance.id] = instance.pool
        self._preempted = preempted
        return found

    def _instance(self, raw: Any, zone: str, now: float) -> Instance:
        labels = dict(raw.labels)
        tags = tags_from_labels(labels)
        pool_name = self._pool_by_label.get(
            labels.get(LABEL_KEYS[POOL_TAG], ""), tags.get(POOL_TAG, "unknown")
        )
        pool = self.pools.get(pool_name)
        launched = _launched_at(tags.get(LAUNCHED_AT_TAG, ""), str(raw.creation_timestamp))
        name = str(raw.name)
        self._seen[name] = _Seen(pool_name, zone, now)
        return Instance(
            id=name,
            pool=pool_name,
            state=STATES.get(str(raw.status), InstanceState.PENDING),
            launched_at=launched if launched is not None else now,
            request_id=tags.get(REQUEST_TAG, ""),
            gpus=pool.gpus_per_instance if pool else _gpus(raw),
        )

    # -- launching ---------------------------------------------------------------------------

    def launch(self, pool: Pool, count: int, request_id: str, fleet_id: str) -> LaunchResult:
        now = self.clock.now()
        existing = [
            self._instance(raw, zone, now)
            for zone in self.zones[pool.name]
            for raw in self._zone_list(zone, request_id, pool.name)
        ]
        if len(existing) >= count:
            return LaunchResult(tuple(existing), already_existed=True)
        have = {i.id for i in existing}
        wanted = [
            i for i in range(count) if instance_name(self.fleet_id, request_id, i) not in have
        ]
        wanted = wanted[: count - len(existing)]
        labels = self._labels(pool, request_id, now)
        progress = _Launch()
        deadline = time.monotonic() + self.settings.operation_timeout_s
        tried: dict[int, set[str]] = {index: set() for index in wanted}
        while wanted and progress.stopped is None:
            wanted = self._round(pool, request_id, labels, wanted, tried, progress, deadline)
        for name, zone in progress.unsure:
            if self._exists(zone, name) is not False:
                progress.placed.append((name, zone))
        launched = self._launched(pool, progress.placed, request_id, now)
        instances = (*existing, *launched)
        shortfall: ProviderError | None = None
        if len(instances) < count:
            missing = CapacityError(
                f"{pool.name}: {len(instances)} of {count} launched", pool=pool.name
            )
            shortfall = progress.stopped or progress.capacity or missing
            if not instances:
                raise shortfall
        return LaunchResult(instances, shortfall, already_existed=bool(existing))

    def launch_gang(self, pool: Pool, count: int, request_id: str, fleet_id: str) -> LaunchResult:
        """All ``count`` VMs under the pool's compact placement policy, or none (``GcpGangs``)."""
        with self._lock:
            if self._gangs is None:
                # imported here: providers.gcp_gang builds on this module's helpers
                from providers.gcp_gang import GcpGangs

                self._gangs = GcpGangs(self)
            gangs = self._gangs
        return gangs.launch(pool, count, request_id)

    def _round(
        self,
        pool: Pool,
        request_id: str,
        labels: dict[str, str],
        wanted: list[int],
        tried: dict[int, set[str]],
        progress: _Launch,
        deadline: float,
    ) -> list[int]:
        """Insert the wanted VMs, each in a zone it has not tried and that is not full, then
        wait for the operations; return the VMs to try again in another zone."""
        instances, _ = self.clients()
        accepted: list[tuple[int, str, str]] = []
        again: list[int] = []
        for index in wanted:
            zones = [
                z
                for z in self.zones[pool.name]
                if z not in progress.full_zones and z not in tried[index]
            ]
            if not zones or progress.stopped is not None:
                continue
            zone = zones[index % len(zones)]
            tried[index].add(zone)
            name = instance_name(self.fleet_id, request_id, index)
            request = {
                "project": self.settings.project,
                "zone": zone,
                "request_id": request_uuid(self.fleet_id, request_id, str(index), zone),
                "instance_resource": self._resource(pool, name, zone, labels),
            }
            try:
                operation = self._call(instances.insert_unary, request)
            except Exception as exc:
                if _is_conflict(exc):
                    progress.placed.append((name, zone))  # inserted by an earlier attempt
                    continue
                error = typed(exc, pool.name)
                if isinstance(error, TransientError) and not isinstance(error, ThrottledError):
                    progress.unsure.append((name, zone))  # a rate limit refuses up front
                if progress.refused(error, zone):
                    again.append(index)
                continue
            accepted.append((index, zone, str(operation.name)))
        for index, zone, operation_name in accepted:
            name = instance_name(self.fleet_id, request_id, index)
            done = self._wait(zone, operation_name, deadline)
            failed = operation_error(done, pool.name) if done is not None else None
            if failed is None:
                # done, or its fate unknown at the deadline: the VM exists or may, and counting
                # it keeps the guard's budget honest until a listing says otherwise
                if done is None:
                    log.warning("%s: insert of %s in %s not seen done", pool.name, name, zone)
                progress.placed.append((name, zone))
            elif progress.refused(failed, zone):
                again.append(index)
        return [
            index
            for index in again
            if any(
                z not in progress.full_zones and z not in tried[index]
                for z in self.zones[pool.name]
            )
        ]

    def _labels(self, pool: Pool, request_id: str, now: float) -> dict[str, str]:
        """The four labels every launched VM carries."""
        return labels_for(
            {
                FLEET_TAG: self.fleet_id,
                POOL_TAG: pool.name,
                REQUEST_TAG: request_id,
                LAUNCHED_AT_TAG: f"{now:.3f}",
            }
        )

    def _launched(
        self, pool: Pool, placed: Sequence[tuple[str, str]], request_id: str, now: float
    ) -> list[Instance]:
        """VMs a launch just made (name, zone), as pending, remembered with their zone for
        notices and terminate."""
        for name, zone in placed:
            self._seen[name] = _Seen(pool.name, zone, now)
        return [
            Instance(
                id=name,
                pool=pool.name,
                state=InstanceState.PENDING,
                launched_at=now,
                request_id=request_id,
                gpus=pool.gpus_per_instance,
            )
            for name, _ in placed
        ]

    def _exists(self, zone: str, name: str) -> bool | None:
        """Whether a VM exists, or None when the answer cannot be read.

        An insert that failed with a server error or a broken connection may have been done all
        the same (its answer lost on the way back). Such a VM is looked up by name; one that may
        exist is counted, so the guard's budget never forgets a VM that is being paid for, and
        the next listing drops it if it was never made."""
        instances, _ = self.clients()
        request = {"project": self.settings.project, "zone": zone, "instance": name}
        try:
            self._call(instances.get, request)
        except Exception as exc:
            return False if _is_not_found(exc) else None
        return True

    def _wait(self, zone: str, operation: str, deadline: float) -> Any:
        """A zone operation once ``DONE``, or None (see ``wait_done``)."""
        _, operations = self.clients()
        request = {"project": self.settings.project, "zone": zone, "operation": operation}
        return wait_done(operations.wait, request, deadline, self.settings.request_timeout_s)

    def _resource(self, pool: Pool, name: str, zone: str, labels: dict[str, str]) -> Any:
        from google.cloud import compute_v1

        options = self.options[pool.name]
        if pool.is_spot:
            scheduling = compute_v1.Scheduling(
                provisioning_model="SPOT",
                instance_termination_action="DELETE",
                on_host_maintenance="TERMINATE",
                automatic_restart=False,
            )
        else:
            # GPU VMs cannot live-migrate, on-demand ones included
            scheduling = compute_v1.Scheduling(
                provisioning_model="STANDARD",
                on_host_maintenance="TERMINATE",
                automatic_restart=True,
            )
        interface = compute_v1.NetworkInterface()
        if options.network or not options.subnetwork:
            interface.network = options.network or "global/networks/default"
        if options.subnetwork:
            interface.subnetwork = options.subnetwork
        resource = compute_v1.Instance(
            name=name,
            machine_type=f"zones/{zone}/machineTypes/{pool.instance_type}",
            labels=labels,
            scheduling=scheduling,
            disks=[
                compute_v1.AttachedDisk(
                    boot=True,
                    auto_delete=True,
                    initialize_params=compute_v1.AttachedDiskInitializeParams(
                        source_image=options.image, disk_size_gb=options.disk_size_gb
                    ),
                )
            ],
            network_interfaces=[interface],
        )
        if options.accelerator_type:
            resource.guest_accelerators = [
                compute_v1.AcceleratorConfig(
                    accelerator_type=f"zones/{zone}/acceleratorTypes/{options.accelerator_type}",
                    accelerator_count=options.accelerator_count or pool.gpus_per_instance,
                )
            ]
        return resource

    # -- terminating -------------------------------------------------------------------------

    def terminate(self, instance_ids: Sequence[str], request_id: str) -> None:
        """Delete only VMs that carry our fleet label, whatever names we are given: they are
        looked up again by label first. Every deletion is tried; the first error is raised."""
        wanted = set(instance_ids)
        if not wanted:
            return
        owned = [(zone, str(raw.name)) for zone, raw in self._aggregated() if raw.name in wanted]
        instances, _ = self.clients()
        failure: ProviderError | None = None
        for zone, name in owned:
            request = {
                "project": self.settings.project,
                "zone": zone,
                "instance": name,
                "request_id": request_uuid(self.fleet_id, request_id, "delete", zone, name),
            }
            try:
                self._call(instances.delete, request)
            except Exception as exc:
                if not _is_not_found(exc) and failure is None:
                    failure = typed(exc)
        if failure is not None:
            raise failure

    # -- prices ------------------------------------------------------------------------------

    def prices(self, pools: Sequence[Pool]) -> list[PriceQuote]:
        """A pool's price is the dearest of its zones: launches spread over all of them."""
        now = self.clock.now()
        quotes = []
        for pool in pools:
            price = self._price(pool)
            if price is None:
                continue
            value = price.spot if pool.is_spot else price.on_demand
            if value is None:
                continue
            quotes.append(
                PriceQuote(
                    pool=pool.name,
                    price_per_hour=value,
                    on_demand_price_per_hour=price.on_demand,
                    interruption_rate_per_hour=None,
                    as_of=now,
                    source=self.price_label,
                )
            )
        return quotes

    def _price(self, pool: Pool) -> CatalogPrice | None:
        options = self.options.get(pool.name)
        zones = self.zones.get(pool.name) or ((pool.zone,) if pool.zone else ("",))
        found: list[CatalogPrice] = []
        for zone in zones:
            price = self.price_source.price(pool.instance_type, pool.region, zone or None)
            if price is None:
                return None
            if options is not None and options.accelerator_type:
                gpu = (
                    self.accelerators.price(options.accelerator_type, pool.region, zone)
                    if self.accelerators is not None
                    else None
                )
                if gpu is None:
                    return None  # a machine without its GPUs' price would look far too cheap
                count = options.accelerator_count or pool.gpus_per_instance
                price = CatalogPrice(
                    on_demand=_plus(price.on_demand, gpu.on_demand, count),
                    spot=_plus(price.spot, gpu.spot, count),
                )
            found.append(price)
        return CatalogPrice(
            on_demand=_dearest([p.on_demand for p in found]),
            spot=_dearest([p.spot for p in found]),
        )

    # -- notices -----------------------------------------------------------------------------

    def poll_notices(self) -> list[InterruptionNotice]:
        """Preemptions of our VMs since the lookback: each zone's ``compute.instances.preempted``
        operations (the operation's time is the deadline: it has passed), then Spot VMs of ours
        that the last listing showed ``TERMINATED``. Each VM is reported once."""
        now = self.clock.now()
        since = now - self.settings.preemption_lookback_s
        for name, seen in list(self._seen.items()):
            if seen.at < since:
                del self._seen[name]
        for name, at in list(self._reported.items()):
            if at < since and name not in self._seen:
                del self._reported[name]
        # only a zone where we have had a VM lately can hold a preemption of ours
        zones = sorted({seen.zone for seen in self._seen.values()})
        notices: list[InterruptionNotice] = []
        for zone in zones:
            for operation in self._preemptions(zone):
                name = _last(str(operation.target_link))
                ours = self._seen.get(name)
                when = _timestamp(str(operation.end_time)) or _timestamp(str(operation.insert_time))
                if ours is None or name in self._reported or (when is not None and when < since):
                    continue
                # the preemption has happened: a time after now is not one (never a deadline
                # in year 9999 from a garbled record)
                notices.append(
                    self._notice(name, ours.pool, now, now if when is None else min(when, now))
                )
        for name, pool in self._preempted.items():
            if name not in self._reported:
                notices.append(self._notice(name, pool, now, now))
        return notices

    def _notice(self, name: str, pool: str, now: float, deadline: float) -> InterruptionNotice:
        self._reported[name] = now
        return InterruptionNotice(
            instance_id=name,
            pool=pool,
            kind=NoticeKind.TERMINATE,
            received_at=now,
            deadline=deadline,
        )

    def _preemptions(self, zone: str) -> list[Any]:
        _, operations = self.clients()
        try:
            pages = self._call(
                operations.list,
                {
                    "project": self.settings.project,
                    "zone": zone,
                    "filter": f'(operationType = "{PREEMPTED}")',
                    "max_results": MAX_RESULTS,
                },
            )
            return list(pages)
        except Exception as exc:
            raise typed(exc) from None

    def acknowledge(self, notices: Sequence[InterruptionNotice]) -> None:
        """Nothing to delete: preemptions are read from the cloud's own records, and a notice is
        never reported twice by this provider object."""


def _launched_at(label: str, created: str) -> float | None:
    try:
        return float(label)
    except ValueError:
        return _timestamp(created)


def _gpus(raw: Any) -> int:
    """GPUs of a VM from a pool we no longer know: its guest accelerators, or the count an
    A2/A3/G2 machine type ends with (``a2-highgpu-8g``)."""
    attached = sum(int(a.accelerator_count) for a in raw.guest_accelerators)
    if attached:
        return attached
    found = re.search(r"-(\d+)g$", _last(str(raw.machine_type)))
    return int(found.group(1)) if found and int(found.group(1)) > 0 else 1


def _plus(machine: float | None, gpu: float | None, count: int) -> float | None:
    return None if machine is None or gpu is None else machine + gpu * count


def _dearest(values: Sequence[float | None]) -> float | None:
    return None if any(v is None for v in values) else max(v for v in values if v is not None)
