"""What Compute Engine's errors mean for the controller: HTTP errors and operations that end
``DONE`` with an ``error`` are both mapped onto the core's typed errors (codes after SkyPilot's
GCP failover handling and the VM creation troubleshooting guide).

The SDK's exceptions themselves are read by ``providers.gcp.sdk.fault``; this module gives the
codes a meaning. Credentials never appear in a message: the SDK's messages carry the method, the
URL and Google's error text, not headers.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
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
from providers.gcp.sdk import fault

# Compute Engine's error codes (in operations) and reasons (in HTTP error bodies).
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
    """Map anything the SDK raises onto a typed error."""
    if isinstance(exc, ProviderError):
        return exc
    found = fault(exc)
    if found.kind == "answer":
        return error_for(
            found.codes,
            found.status,
            found.message,
            pool,
            retry_after_s=retry_after(found.response),
        )
    if found.kind == "refused":
        return AuthError(
            "the credentials were refused and could not be refreshed",
            pool=pool,
            code="CredentialsRefused",
        )
    if found.kind == "no-credentials":
        return AuthError(
            "no usable Application Default Credentials", pool=pool, code="NoCredentials"
        )
    return TransientError(found.message, pool=pool, code=found.codes[0])


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
