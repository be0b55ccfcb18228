"""``providers.aws`` and an AWS pool's ``options`` in the controller config, checked with the
config: a setting botocore or EC2 would refuse on the first tick is refused here instead, naming
its field.

Credentials are never settings: they come from the standard boto3 chain (environment, profile,
instance or pod role).
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from providers.placement import PlacementOption

PLACEMENT_GROUP_NAME = re.compile(r"^[\x21-\x7e]{1,255}$")  # up to 255 printable ASCII
# botocore's own checks, so that a setting it would refuse when a client is made (on the first
# tick, or on a region's first listing) is refused with the config instead
REGION = re.compile(r"^(?![0-9]+$)(?!-)[a-zA-Z0-9-]{1,63}(?<!-)$")
_HOST = re.compile(r"^((?!-)[A-Z\d-]{1,63}(?<!-)\.)*((?!-)[A-Z\d-]{1,63}(?<!-))\.?$", re.I)
_QUEUE_PATH = re.compile(r"^/[A-Za-z0-9_-]{1,64}/[A-Za-z0-9_-]{1,80}(\.fifo)?$")
# EC2 takes at most 16 KB of user data, counted before base64 (RunInstances and CreateFleet).
USER_DATA_MAX = 16 * 1024


class _Strict(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class AwsSettings(_Strict):
    """``providers.aws`` in the controller config."""

    endpoint_url: str | None = Field(None, description="an EC2/SQS endpoint override (tests)")
    regions: tuple[str, ...] = Field(
        (), description="regions to list besides the pools' (to collect instances of pools removed)"
    )
    interruption_queue_url: str | None = None
    queue_wait_s: int = Field(20, ge=0, le=20)
    price_ttl_s: float = Field(300.0, ge=0)
    connect_timeout_s: float = Field(5.0, gt=0)
    read_timeout_s: float = Field(20.0, gt=0)
    catalog: str | None = Field(None, description="instance type catalog CSV (default: shipped)")
    price_catalog: str | None = Field(
        None, description="a SkyPilot-format catalog CSV to price pools from instead of the API"
    )
    advisor: str | None = Field(None, description="Spot Advisor bucket CSV (default: shipped)")

    @field_validator("endpoint_url")
    @classmethod
    def _endpoint(cls, value: str | None) -> str | None:
        problem = None if value is None else endpoint_problem(value)
        if problem is not None:
            raise ValueError(f"expected an http(s) URL such as http://localhost:5000 ({problem})")
        return value

    @field_validator("interruption_queue_url")
    @classmethod
    def _queue_url(cls, value: str | None) -> str | None:
        problem = None if value is None else queue_url_problem(value)
        if problem is not None:
            raise ValueError(
                "expected an SQS queue URL such as "
                f"https://sqs.us-east-1.amazonaws.com/123456789012/notices ({problem})"
            )
        return value

    @field_validator("regions")
    @classmethod
    def _region_names(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for region in value:
            if not REGION.match(region):
                raise ValueError(
                    f"expected AWS region names such as us-east-1, got {region[:40]!r}"
                )
        return value


class LaunchTemplate(_Strict):
    name: str | None = None
    id: str | None = None
    version: str = "$Latest"

    @model_validator(mode="after")
    def _one_reference(self) -> LaunchTemplate:
        if (self.name is None) == (self.id is None):
            raise ValueError("give exactly one of name or id")
        return self

    def spec(self) -> dict[str, str]:
        key = ("LaunchTemplateName", self.name) if self.name else ("LaunchTemplateId", self.id)
        return {key[0]: str(key[1]), "Version": self.version}


class AwsPoolOptions(_Strict):
    """``options`` of an AWS pool."""

    instance_types: tuple[str, ...] = Field(
        (), description="more instance types besides the pool's, for CreateFleet to choose from"
    )
    subnets: tuple[str, ...] = ()
    zones: tuple[str, ...] = ()
    launch_template: LaunchTemplate | None = None
    image_id: str | None = None
    security_group_ids: tuple[str, ...] = ()
    max_spot_price: float | None = Field(None, gt=0)
    placement_group: PlacementOption | None = Field(
        None,
        description="the cluster placement group a gang is launched into: {name: X} (existing), "
        "{create: true} (made for the pool) or {name: X, create: true}",
    )

    @model_validator(mode="after")
    def _launchable(self) -> AwsPoolOptions:
        if self.launch_template is None and self.image_id is None:
            raise ValueError("give a launch_template or an image_id")
        if self.subnets and self.zones:
            raise ValueError("give subnets or zones, not both")
        return self

    @field_validator("placement_group")
    @classmethod
    def _group_name(cls, value: PlacementOption | None) -> PlacementOption | None:
        name = value.name if value is not None else None
        if name is not None and not PLACEMENT_GROUP_NAME.match(name):
            raise ValueError("name: expected up to 255 printable ASCII characters")
        return value


def endpoint_problem(url: str) -> str | None:
    """Why botocore would refuse ``url`` as an endpoint, or None (for every AWS setting that
    holds a URL: check it with the config rather than when the first client is made)."""
    if any(c.isspace() or ord(c) < 0x20 for c in url):
        return "it holds spaces or control characters"
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 (a bad port raises here)
    except ValueError as exc:
        return str(exc)
    if parts.scheme not in ("http", "https"):
        return "it does not start with http:// or https://"
    host = parts.hostname or ""
    if not host or len(host) > 255 or not (_HOST.match(host) or ":" in host):
        return "its host is not a valid name"
    return None


def queue_url_problem(url: str) -> str | None:
    """Why ``url`` is not an SQS queue URL (an endpoint, then ``/<account>/<queue name>``)."""
    problem = endpoint_problem(url)
    if problem is None and not _QUEUE_PATH.match(urlsplit(url).path):
        problem = "its path is not /<account>/<queue name>"
    return problem


def queue_region(url: str) -> str | None:
    """The region in an SQS queue URL such as https://sqs.us-east-1.amazonaws.com/123/q."""
    parts = (urlsplit(url).hostname or "").split(".")
    if len(parts) > 2 and parts[0] == "sqs" and REGION.match(parts[1]):
        return parts[1]
    return None


def user_data_problem(text: str) -> str | None:
    """Why EC2 would refuse ``text`` as an instance's user data at launch, or None: refused with
    the config, not on the first launch."""
    size = len(text.encode())
    if size > USER_DATA_MAX:
        return (
            f"{size:,} bytes of user data; EC2 takes at most 16 KB ({USER_DATA_MAX:,} bytes "
            "before base64): shorten it, or have it fetch the rest at boot"
        )
    return None
