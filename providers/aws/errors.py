"""What AWS's error codes mean for the controller: the mapping from what botocore raised onto the
core's typed errors (after Karpenter's error classification for EC2).

botocore itself is read by ``providers.aws.sdk.fault``; this module gives the codes a meaning.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from autoscaler.model.errors import (
    AuthError,
    CapacityError,
    InvalidRequest,
    ProviderError,
    QuotaError,
    QuotaScope,
    ThrottledError,
    TransientError,
)
from providers.aws.sdk import fault

CAPACITY_CODES = frozenset(
    {
        "InsufficientInstanceCapacity",
        "InsufficientCapacityOnHost",
        "InsufficientHostCapacity",
        "InsufficientReservedInstanceCapacity",
        "UnfulfillableCapacity",
        "SpotMaxPriceTooLow",
        "MaxSpotInstanceCountExceeded",
    }
)
QUOTA_CODES = frozenset(
    {
        "VcpuLimitExceeded",
        "InstanceLimitExceeded",
        "MaxSpotFleetRequestCountExceeded",
        "MaxFleetCountExceeded",
        "ResourceLimitExceeded",
        "VolumeLimitExceeded",
        "InsufficientFreeAddressesInSubnet",
    }
)
THROTTLE_CODES = frozenset(
    {
        "RequestLimitExceeded",
        "Throttling",
        "ThrottlingException",
        "TooManyRequestsException",
        "RequestThrottled",
        "RequestThrottledException",
        "SlowDown",
        "EC2ThrottledException",
    }
)
TRANSIENT_CODES = frozenset(
    {"InternalError", "InternalFailure", "ServiceUnavailable", "Unavailable", "RequestTimeout"}
)
AUTH_CODES = frozenset(
    {
        "AuthFailure",
        "UnauthorizedOperation",
        "InvalidClientTokenId",
        "SignatureDoesNotMatch",
        "ExpiredToken",
        "ExpiredTokenException",
        "AccessDenied",
        "AccessDeniedException",
        "OptInRequired",
        "Blocked",
    }
)


def error_code(code: str | None, status: int, message: str, pool: str | None) -> ProviderError:
    """The typed error for one AWS error code (also used for CreateFleet's per-override errors)."""
    text = f"{code}: {message}" if message else str(code)
    if code in CAPACITY_CODES:
        return CapacityError(text, pool=pool, code=code)
    if code in QUOTA_CODES:
        return QuotaError(text, pool=pool, code=code, scope=QuotaScope.REGION)
    if code in THROTTLE_CODES or status == 429:
        return ThrottledError(text, pool=pool, code=code or "Throttled")
    if code in TRANSIENT_CODES or status >= 500:
        return TransientError(text, pool=pool, code=code or "ServerError")
    if code in AUTH_CODES or status in (401, 403):
        return AuthError(text, pool=pool, code=code or "AuthFailure")
    return InvalidRequest(text, pool=pool, code=code or "InvalidRequest")


def typed(exc: BaseException, pool: str | None = None) -> ProviderError:
    """Map anything boto3 raises onto a typed error; credentials never appear in the message."""
    if isinstance(exc, ProviderError):
        return exc
    found = fault(exc)
    if found.kind == "answer":
        return error_code(found.code, found.status, found.message, pool)
    if found.kind == "credentials":
        return AuthError(
            "no usable AWS credentials in the standard chain", pool=pool, code="NoCredentials"
        )
    if found.kind == "connection":
        return TransientError(found.message, pool=pool, code="Connection")
    return TransientError(found.message, pool=pool, code=found.code)


def fleet_shortfall(errors: Sequence[Mapping[str, Any]], pool: str) -> ProviderError | None:
    """CreateFleet reports what it could not launch per override; a capacity code among them
    is the one that tells act what to do, so it wins."""
    if not errors:
        return None
    codes = [str(e.get("ErrorCode", "")) for e in errors]
    chosen = next((i for i, c in enumerate(codes) if c in CAPACITY_CODES), 0)
    return error_code(codes[chosen], 400, str(errors[chosen].get("ErrorMessage", "")), pool)
