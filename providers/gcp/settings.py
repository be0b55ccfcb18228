"""``providers.gcp`` and a GCP pool's ``options`` in the controller config, checked with the
config: what Compute Engine would refuse on the first launch (a metadata key it does not take, a
value or a VM's metadata past its size limits, a scope that is no OAuth scope) is refused here,
naming its field.

Credentials are never settings: they come from Application Default Credentials (the file
``GOOGLE_APPLICATION_CREDENTIALS`` names, gcloud's, or the metadata server's), wherever the
endpoint points.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from autoscaler.model.errors import InputError
from providers.placement import PlacementOption

RESOURCE_NAME = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")
# The metadata key a VM's guest environment runs at boot, and what one metadata value may hold.
STARTUP_SCRIPT = "startup-script"
STARTUP_SCRIPT_URL = "startup-script-url"
METADATA_VALUE_MAX = 256 * 1024
# Compute Engine's limits on a VM's own metadata: its keys, and all keys and values together.
METADATA_KEY = re.compile(r"^[a-zA-Z0-9_-]{1,128}$")
METADATA_TOTAL_MAX = 512 * 1024
# OAuth scopes as Compute Engine takes them, and gcloud's aliases for the common ones.
SCOPE_PREFIX = "https://www.googleapis.com/auth/"
SCOPE = re.compile(r"^https://www\.googleapis\.com/auth/[a-z0-9][a-z0-9._-]{0,127}$")
SCOPE_ALIASES = {
    "bigquery": "bigquery",
    "cloud-platform": "cloud-platform",
    "cloud-source-repos": "source.full_control",
    "cloud-source-repos-ro": "source.read_only",
    "compute-ro": "compute.readonly",
    "compute-rw": "compute",
    "datastore": "datastore",
    "logging-write": "logging.write",
    "monitoring": "monitoring",
    "monitoring-read": "monitoring.read",
    "monitoring-write": "monitoring.write",
    "pubsub": "pubsub",
    "service-control": "servicecontrol",
    "service-management": "service.management.readonly",
    "sql-admin": "sqlservice.admin",
    "storage-full": "devstorage.full_control",
    "storage-ro": "devstorage.read_only",
    "storage-rw": "devstorage.read_write",
    "taskqueue": "taskqueue",
    "trace": "trace.append",
    "userinfo-email": "userinfo.email",
}
SERVICE_ACCOUNT_EMAIL = re.compile(r"^[a-zA-Z0-9._%+-]{1,128}@[a-zA-Z0-9.-]{1,253}\.[a-z]{2,63}$")


class _Strict(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class GcpSettings(_Strict):
    """``providers.gcp`` in the controller config."""

    project: str = Field(..., min_length=1, description="the project VMs are launched in")
    endpoint: str | None = Field(
        None,
        description="a Compute Engine endpoint override with its scheme (an emulator, a private "
        "endpoint); credentials still come from Application Default Credentials",
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


class ServiceAccount(_Strict):
    """The service account a pool's VMs run as, and the OAuth scopes its tokens get there."""

    email: str = Field(
        ...,
        description="the service account's email (name@project.iam.gserviceaccount.com), or "
        "'default' for the project's Compute Engine default service account",
    )
    scopes: tuple[str, ...] = Field(
        (SCOPE_PREFIX + "cloud-platform",),
        description="OAuth scopes: full URLs (https://www.googleapis.com/auth/...) or gcloud's "
        "aliases (cloud-platform, storage-ro, logging-write, ...); default cloud-platform, "
        "access then being what the account's IAM roles grant",
    )

    @field_validator("email")
    @classmethod
    def _email(cls, value: str) -> str:
        if value != "default" and not SERVICE_ACCOUNT_EMAIL.match(value):
            raise ValueError(
                f"expected a service account's email (name@project.iam.gserviceaccount.com) or "
                f"'default', got {value[:80]!r}"
            )
        return value

    @field_validator("scopes")
    @classmethod
    def _full_scopes(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        """Aliases become the URLs Compute Engine takes; anything else must be one."""
        scopes: list[str] = []
        for scope in value:
            full = SCOPE_PREFIX + SCOPE_ALIASES[scope] if scope in SCOPE_ALIASES else scope
            if not SCOPE.match(full):
                raise ValueError(
                    f"{scope[:80]!r} is not an OAuth scope: give a URL such as "
                    f"{SCOPE_PREFIX}cloud-platform or one of gcloud's aliases: "
                    + ", ".join(sorted(SCOPE_ALIASES))
                )
            if full not in scopes:
                scopes.append(full)
        return tuple(scopes)


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
    startup_script: str | None = Field(
        None,
        description="the script the VMs run at every boot (their startup-script metadata); the "
        "pool's user_data, which every cloud shares, says the same: give one of the two (with "
        "Slurm's join_user_data, user_data is the join script)",
    )
    metadata: dict[str, str] = Field(
        default_factory=dict,
        description="more metadata items of the VMs (enable-oslogin, startup-script-url, ...), "
        "key: value; the boot script goes in startup_script or user_data",
    )
    service_account: ServiceAccount | None = Field(
        None,
        description="the service account the VMs run as, with its scopes (default: none, the "
        "VMs get no Google credentials)",
    )

    @model_validator(mode="after")
    def _accelerators(self) -> GcpPoolOptions:
        if self.accelerator_count is not None and self.accelerator_type is None:
            raise ValueError("accelerator_count needs an accelerator_type")
        return self

    @field_validator("startup_script")
    @classmethod
    def _script_fits(cls, value: str | None) -> str | None:
        problem = None if value is None else user_data_problem(value)
        if problem is not None:
            raise ValueError(problem.replace("of user data", "of startup script"))
        return value

    @field_validator("metadata", mode="before")
    @classmethod
    def _text_values(cls, value: Any) -> Any:
        """Every value is text on the VM; YAML reads ``TRUE`` or ``1`` as something else, so
        say to quote it rather than guess how Compute Engine would spell it."""
        if isinstance(value, Mapping):
            for key, item in value.items():
                if not isinstance(item, str):
                    raise ValueError(
                        f"the value of {str(key)[:80]!r} must be text: quote it "
                        f"({key}: '{item}'), as YAML read it as {type(item).__name__}"
                    )
        return value

    @field_validator("metadata")
    @classmethod
    def _metadata_items(cls, value: dict[str, str]) -> dict[str, str]:
        for key, item in value.items():
            if key == STARTUP_SCRIPT:
                raise ValueError(
                    "the startup-script is the pool's boot script: give it as the option "
                    "startup_script or as the pool's user_data, not in metadata"
                )
            if not METADATA_KEY.match(key):
                raise ValueError(
                    f"metadata key {key[:80]!r}: expected up to 128 letters, digits, - and _"
                )
            size = len(item.encode())
            if size > METADATA_VALUE_MAX:
                raise ValueError(
                    f"the value of {key!r} is {size:,} bytes; a GCP metadata value holds at "
                    f"most 256 KB ({METADATA_VALUE_MAX:,} bytes)"
                )
        return value

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


def user_data_problem(text: str) -> str | None:
    """Why Compute Engine would refuse ``text`` as a VM's ``startup-script`` metadata value, or
    None: refused with the config, not on the first launch."""
    size = len(text.encode())
    if size > METADATA_VALUE_MAX:
        return (
            f"{size:,} bytes of user data; a GCP metadata value (the startup-script) holds at "
            f"most 256 KB ({METADATA_VALUE_MAX:,} bytes): shorten it, or have it fetch the rest "
            "at boot"
        )
    return None


def boot_metadata(
    user_data: str | None, options: GcpPoolOptions, index: int
) -> list[dict[str, str]]:
    """A pool's VM metadata items: its boot script (the pool's ``user_data``, its own or the
    scheduler's join script, or the ``startup_script`` option: one of the two) as the
    ``startup-script``, then the ``metadata`` option's items in their order. Compute Engine's
    limit on a VM's metadata as a whole is checked here, with the boot script in it. Raises
    ``InputError`` naming the pool's field."""
    where = f"pools[{index}].options"
    if user_data and options.startup_script is not None:
        raise InputError(
            "config",
            "startup_script and the pool's user_data (its own, or the scheduler's join script) "
            "both give the VM's startup-script: keep one (set user_data to keep yours over the "
            "join script, or joins_scheduler: false for a pool that never joins)",
            field=f"{where}.startup_script",
        )
    script = user_data or options.startup_script
    items = [{"key": STARTUP_SCRIPT, "value": script}] if script else []
    if script and STARTUP_SCRIPT_URL in options.metadata:
        raise InputError(
            "config",
            "a startup-script-url in metadata and the pool's boot script (startup_script, or "
            "user_data: its own or the scheduler's join script) would both run at boot: keep one",
            field=f"{where}.metadata.{STARTUP_SCRIPT_URL}",
        )
    items += [{"key": key, "value": value} for key, value in options.metadata.items()]
    total = sum(len(item["key"].encode()) + len(item["value"].encode()) for item in items)
    if total > METADATA_TOTAL_MAX:
        raise InputError(
            "config",
            f"the VM's metadata (boot script and metadata items) comes to {total:,} bytes; "
            f"Compute Engine takes at most 512 KB ({METADATA_TOTAL_MAX:,} bytes) for one VM",
            field=f"{where}.metadata",
        )
    return items
