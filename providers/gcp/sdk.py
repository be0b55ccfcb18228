"""The one module of ``providers.gcp`` that imports google-cloud-compute, google-api-core and
google-auth, and only inside its functions: the controller, the other providers and this
provider's other modules import without the ``gcp`` extra installed. Building the provider
without it is one line naming the extra (``require_sdk``), not a failing call on every tick.

* ``ComputeClients`` makes the Compute Engine clients a provider uses, on first use, all with the
  same credentials and options: REST transport, the endpoint override when one is set. Every call
  goes through ``call``, with the SDK's own retries off: the controller's policy is the only one.
* Credentials come from Application Default Credentials (``google.auth.default()``: the file
  ``GOOGLE_APPLICATION_CREDENTIALS`` names, gcloud's, or the metadata server's), never from the
  config file, and the same way whatever endpoint is set: a test points ADC at its emulator's
  token endpoint, as an operator points it at theirs.
* ``fault`` reads what the SDK raised as plain data, for ``providers.gcp.errors`` to say what it
  means to the controller; ``is_done``, ``is_conflict`` and ``is_not_found`` read the rest.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from autoscaler.model.optional import require_extra
from providers.gcp.settings import GcpSettings

SCOPE = "https://www.googleapis.com/auth/compute"
SDK_MODULES = ("google.cloud.compute_v1", "google.auth", "google.api_core")


def require_sdk() -> None:
    """The provider is being built: without the SDK every call would fail, so say so now."""
    require_extra("the gcp provider", "gcp", SDK_MODULES)


class ComputeClients:
    def __init__(self, settings: GcpSettings) -> None:
        require_sdk()
        self.settings = settings
        self._lock = threading.Lock()
        self._clients: tuple[Any, Any] | None = None
        self._placement_clients: tuple[Any, Any] | None = None
        self._common: dict[str, Any] | None = None

    def clients(self) -> tuple[Any, Any]:
        """The instances and zone-operations clients (made once, with the same options). Not
        being able to make them (no credentials) is raised as a typed error, as a call's is."""
        with self._lock:
            if self._clients is None:
                self._clients = _typed_failure(self._make_clients)
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
                self._placement_clients = _typed_failure(self._make_placement_clients)
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
            import google.auth
            from google.api_core.client_options import ClientOptions

            credentials, _ = google.auth.default(scopes=[SCOPE])
            endpoint = self.settings.endpoint
            self._common = {
                "credentials": credentials,
                "transport": "rest",
                "client_options": ClientOptions(api_endpoint=endpoint) if endpoint else None,
            }
        return self._common

    def call(self, method: Any, request: Any) -> Any:
        """One SDK call with its retries off: the controller's retry policy is the only one."""
        return method(request=request, retry=None, timeout=self.settings.request_timeout_s)


def _typed_failure(make: Callable[[], tuple[Any, Any]]) -> tuple[Any, Any]:
    try:
        return make()
    except Exception as exc:
        # imported here: providers.gcp.errors reads the SDK's exceptions through this module
        from providers.gcp.errors import typed

        raise typed(exc) from None


def is_done(operation: Any) -> bool:
    from google.cloud import compute_v1

    return bool(operation.status == compute_v1.Operation.Status.DONE)


def is_conflict(exc: BaseException) -> bool:
    from google.api_core import exceptions as core

    return isinstance(exc, core.Conflict)


def is_not_found(exc: BaseException) -> bool:
    from google.api_core import exceptions as core

    return isinstance(exc, core.NotFound)


@dataclass(frozen=True)
class Fault:
    """What the SDK raised, without the SDK: an HTTP error answer (Google's reasons, the status,
    the response for its headers), credentials refused on refresh, no credentials at all, or
    something else."""

    kind: Literal["answer", "refused", "no-credentials", "other"]
    message: str
    codes: tuple[str, ...] = ()
    status: int = 0
    response: Any = None


def fault(exc: BaseException) -> Fault:
    from google.api_core import exceptions as core
    from google.auth import exceptions as auth

    if isinstance(exc, core.GoogleAPICallError):
        codes = [str(e.get("reason", "")) for e in exc.errors if isinstance(e, Mapping)]
        if exc.reason:
            codes.append(str(exc.reason))
        return Fault("answer", str(exc.message), tuple(codes), int(exc.code or 0), exc.response)
    if isinstance(exc, (auth.RefreshError, auth.InvalidOperation)):
        # google-auth answers a 401 by refreshing the credentials and trying again once
        return Fault("refused", type(exc).__name__)
    if isinstance(exc, auth.DefaultCredentialsError):
        return Fault("no-credentials", type(exc).__name__)
    return Fault("other", f"{type(exc).__name__}: {exc}", (type(exc).__name__,))
