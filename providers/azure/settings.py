"""``providers.azure`` and an Azure pool's ``options`` in the controller config, checked with
the config.

Credentials are never settings: they come from ``DefaultAzureCredential`` (environment, workload
or managed identity, Azure CLI), wherever the endpoint points.
"""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict, Field, field_validator

from providers.placement import PlacementOption

RETAIL_PRICES_URL = "https://prices.azure.com/api/retail/prices"
IMAGE_URN = re.compile(r"^[^:\s]+:[^:\s]+:[^:\s]+:[^:\s]+$")
PPG_NAME = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9._-]{0,78}[A-Za-z0-9_])?$")
# ARM takes custom data of at most 65,535 bytes once decoded (87,380 characters of base64).
CUSTOM_DATA_MAX = 65_535


class _Strict(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


def _http_url(value: str | None) -> str | None:
    if value is not None and not value.startswith(("http://", "https://")):
        raise ValueError("expected an http:// or https:// URL")
    return value.rstrip("/") if value is not None else None


def _https_url(value: str | None) -> str | None:
    if value is not None and not value.startswith("https://"):
        raise ValueError("expected an https:// URL (ARM's bearer tokens are sent only over TLS)")
    return value.rstrip("/") if value is not None else None


class AzureSettings(_Strict):
    """``providers.azure`` in the controller config."""

    subscription_id: str = Field(min_length=1)
    resource_group: str = Field(min_length=1, description="where the fleet's VMs live")
    endpoint: str | None = Field(
        None,
        description="an ARM endpoint override (another cloud, an emulator); credentials still "
        "come from DefaultAzureCredential",
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

    _endpoint = field_validator("endpoint")(_https_url)
    _prices_url = field_validator("retail_prices_url")(_http_url)


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
    custom_data: str | None = Field(
        None,
        description="cloud-init or a script the VM boots with; the pool's user_data, which "
        "every cloud shares, says the same (give one of the two)",
    )
    identities: list[str] = Field(
        default_factory=list,
        max_length=16,
        description="user-assigned managed identities (resource ids) the VMs carry: what a "
        "boot script reads a secret store with (the Kubernetes join's azure-key-vault store "
        "needs one with read access to the secret; with several, give the join's client_id)",
    )
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

    @field_validator("identities")
    @classmethod
    def _identities(cls, value: list[str]) -> list[str]:
        for text in value:
            lowered = text.lower()
            if not (
                lowered.startswith("/subscriptions/")
                and "/providers/microsoft.managedidentity/userassignedidentities/" in lowered
                and not lowered.endswith("/")
            ):
                raise ValueError(
                    f"{text[:200]!r}: expected a user-assigned identity's resource id "
                    "(/subscriptions/.../providers/Microsoft.ManagedIdentity/"
                    "userAssignedIdentities/NAME)"
                )
        if len({t.lower() for t in value}) != len(value):
            raise ValueError("an identity is named twice")
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


def custom_data_problem(text: str) -> str | None:
    """Why ARM would refuse ``text`` as a VM's custom data at launch, or None: refused with the
    config, not on the first launch."""
    size = len(text.encode())
    if size > CUSTOM_DATA_MAX:
        return (
            f"{size:,} bytes of user data; Azure custom data holds at most 64 KB "
            f"({CUSTOM_DATA_MAX:,} bytes, 87,380 characters of base64): shorten it, or have it "
            "fetch the rest at boot"
        )
    return None
