"""Typed errors. Providers map their SDK's errors onto these; the core acts on the type.

The split follows what the controller should do next, not where the error came from:
capacity → remember the pool as unavailable for a while and try the next one; quota → the same,
for the scope the quota covers; throttled/transient → retry with backoff within the tick;
auth/invalid → stop and say so loudly, retrying cannot help.
"""

from __future__ import annotations

from enum import StrEnum


class ProviderError(Exception):
    """Base of every error a provider raises or reports."""

    code: str = "ProviderError"

    def __init__(self, message: str, *, pool: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.pool = pool
        if code is not None:
            self.code = code


class CapacityError(ProviderError):
    code = "InsufficientCapacity"


class QuotaScope(StrEnum):
    POOL = "pool"
    REGION = "region"
    PROVIDER = "provider"


class QuotaError(ProviderError):
    code = "QuotaExceeded"

    def __init__(
        self,
        message: str,
        *,
        pool: str | None = None,
        code: str | None = None,
        scope: QuotaScope = QuotaScope.POOL,
    ) -> None:
        super().__init__(message, pool=pool, code=code)
        self.scope = scope


class TransientError(ProviderError):
    code = "Transient"


class ThrottledError(TransientError):
    code = "Throttled"

    def __init__(
        self,
        message: str,
        *,
        pool: str | None = None,
        code: str | None = None,
        retry_after_s: float | None = None,
    ) -> None:
        super().__init__(message, pool=pool, code=code)
        self.retry_after_s = retry_after_s


class AuthError(ProviderError):
    code = "AuthFailure"


class InvalidRequest(ProviderError):  # noqa: N818 (the name ARCHITECTURE.md gives it)
    code = "InvalidRequest"


class CallNotMade(Exception):  # noqa: N818 (says what happened, as the cloud errors do)
    """A mutating cloud call the controller did not make because it could not first write it
    ahead to the journal: an expected failure of a damaged journal, told in one line."""


class SourceError(Exception):
    """A source answered with something we cannot use: a failed command, malformed output, an
    error status, a NaN, a stale sample. The message says which source and what was wrong in one
    line; observe marks the signal failed for the tick (demand unknown, never zero)."""


class InputError(Exception):
    """Bad user input: a config, scenario, trace or price file. Printed as one line, no traceback.

    ``where`` is ``file:line`` or ``file`` and ``field`` a dotted path, so a user can find the
    offending spot without reading our code.
    """

    def __init__(self, where: str, message: str, field: str | None = None) -> None:
        self.where = where
        self.field = field
        self.message = message
        super().__init__(str(self))

    def __str__(self) -> str:
        located = f"{self.where}: {self.field}: " if self.field else f"{self.where}: "
        return located + self.message


class PolicyError(Exception):
    """A policy raised or returned a plan the controller cannot carry out."""


def describe(exc: BaseException | None) -> str:
    """One line naming an error, for reports and logs (never a traceback)."""
    if exc is None:
        return ""
    text = str(exc).strip()
    first = text.splitlines()[0] if text else ""
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__
