"""What ARM's errors mean for the controller: error codes and HTTP statuses, from a call or from a
failed long-running operation, mapped onto the core's typed errors.

The SDK's exceptions themselves are read by ``providers.azure.sdk.fault``; this module gives the
codes a meaning. Credentials never appear: ARM's messages hold none, and a credential failure is
reported by kind only.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from email.utils import parsedate_to_datetime
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
from providers.azure.sdk import fault

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
    a typed error."""
    if isinstance(exc, ProviderError):
        return exc
    found = fault(exc)
    if found.kind == "no-credentials":
        return AuthError(
            f"no usable Azure credential ({found.message}); see DefaultAzureCredential",
            pool=pool,
            code="NoCredentials",
        )
    if found.kind == "answer":
        code, message = _error_details(found.error, found.message)
        return error_code(code, found.status, message, pool, retry_after(found.headers))
    if found.kind == "connection":
        return TransientError(found.message, pool=pool, code="Connection")
    return TransientError(found.message, pool=pool, code=found.code)


def _error_details(error: Any, fallback: str) -> tuple[str | None, str]:
    """ARM's error code and message; a known code among the details wins over a generic one
    (a failed deployment wraps the allocation failure that caused it)."""
    code = getattr(error, "code", None)
    message = str(getattr(error, "message", "") or "")
    if code not in KNOWN_CODES:
        for detail in getattr(error, "details", None) or []:
            if getattr(detail, "code", None) in KNOWN_CODES:
                return str(detail.code), str(getattr(detail, "message", "") or message)
    if code is None:
        return None, fallback
    return str(code), message


def retry_after(headers: Mapping[str, str]) -> float | None:
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


def telling(errors: Sequence[ProviderError]) -> ProviderError | None:
    """The error that tells act the most: capacity or quota (the pool goes into the cache)."""
    for error in errors:
        if isinstance(error, (CapacityError, QuotaError)):
            return error
    return errors[0] if errors else None
