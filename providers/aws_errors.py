"""What AWS's error codes mean for the controller: the mapping from botocore exceptions onto the
core's typed errors (after Karpenter's error classification for EC2).

botocore is imported inside the function, so importing this module needs no SDK.
"""

from __future__ import annotations

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


def typed(exc: Exception, pool: str | None = None) -> ProviderError:
    """Map anything boto3 raises onto a typed error; credentials never appear in the message."""
    from botocore.exceptions import (
        ClientError,
        ConnectionClosedError,
        ConnectTimeoutError,
        EndpointConnectionError,
        NoCredentialsError,
        PartialCredentialsError,
        ReadTimeoutError,
    )

    if isinstance(exc, ProviderError):
        return exc
    if isinstance(exc, ClientError):
        error = exc.response.get("Error", {})
        status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
        return error_code(error.get("Code"), status, str(error.get("Message", "")), pool)
    if isinstance(exc, (NoCredentialsError, PartialCredentialsError)):
        return AuthError(
            "no usable AWS credentials in the standard chain", pool=pool, code="NoCredentials"
        )
    if isinstance(
        exc, (EndpointConnectionError, ConnectTimeoutError, ReadTimeoutError, ConnectionClosedError)
    ):
        return TransientError(f"{type(exc).__name__}: {exc}", pool=pool, code="Connection")
    return TransientError(f"{type(exc).__name__}: {exc}", pool=pool, code=type(exc).__name__)
