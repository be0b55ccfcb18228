"""``providers.gcp`` and a GCP pool's ``options`` in the controller config, checked with the
config.

Credentials are never settings: they come from Application Default Credentials (the file
``GOOGLE_APPLICATION_CREDENTIALS`` names, gcloud's, or the metadata server's), wherever the
endpoint points.
"""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from providers.placement import PlacementOption

RESOURCE_NAME = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")
# The metadata key a VM's guest environment runs at boot, and what one metadata value may hold.
STARTUP_SCRIPT = "startup-script"
METADATA_VALUE_MAX = 256 * 1024


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
