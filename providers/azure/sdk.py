"""The one module of ``providers.azure`` that imports azure-mgmt-compute, azure-identity and
azure-core, and only inside its functions: the controller, the other providers and this
provider's other modules import without the ``azure`` extra installed. Building the provider
without it is one line naming the extra (``require_sdk``), not a failing call on every tick.

* ``ArmClient`` makes the ``ComputeManagementClient`` on first use, with the SDK's own retries
  off (the controller's bounded retry policy is the only one) and the timeouts and polling
  interval of the settings.
* Credentials come from ``DefaultAzureCredential`` (environment, workload or managed identity,
  Azure CLI), never from the config file, and the same way whatever ``endpoint`` is set: a test
  points the credential chain at its emulator's identity endpoint, as an operator of another cloud
  points it at theirs. Tokens go only over TLS (the SDK's bearer policy refuses plain HTTP).
* ``fault`` reads what the SDK raised as plain data, for ``providers.azure.errors`` to say what
  it means to the controller; ``is_not_found`` and ``operation_failed`` read the rest.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from autoscaler.model.optional import require_extra
from providers.azure.settings import AzureSettings

USER_AGENT = "hybrid-gpu-autoscaler"
SDK_MODULES = ("azure.mgmt.compute", "azure.identity", "azure.core")


def require_sdk() -> None:
    """The provider is being built: without the SDK every call would fail, so say so now."""
    require_extra("the azure provider", "azure", SDK_MODULES)


class ArmClient:
    def __init__(self, settings: AzureSettings) -> None:
        require_sdk()
        self.settings = settings
        self._client: Any = None
        self._lock = threading.Lock()

    def client(self) -> Any:
        """The ComputeManagementClient (made once, on first use)."""
        with self._lock:
            if self._client is None:
                from azure.identity import DefaultAzureCredential
                from azure.mgmt.compute import ComputeManagementClient

                options: dict[str, Any] = {
                    "retry_total": 0,
                    "polling_interval": self.settings.polling_interval_s,
                    "connection_timeout": self.settings.connect_timeout_s,
                    "read_timeout": self.settings.read_timeout_s,
                    "user_agent": USER_AGENT,
                }
                if self.settings.endpoint is not None:
                    options["base_url"] = self.settings.endpoint
                self._client = ComputeManagementClient(
                    DefaultAzureCredential(), self.settings.subscription_id, **options
                )
            return self._client


def is_not_found(exc: BaseException) -> bool:
    from azure.core.exceptions import ResourceNotFoundError

    return isinstance(exc, ResourceNotFoundError)


def operation_failed(exc: BaseException) -> bool:
    """Whether a poller's error is the operation's own failure (the VM was not created), rather
    than a failure to learn how it went (a status poll that errored: the outcome is unknown)."""
    from azure.core.polling.base_polling import OperationFailed

    inner = getattr(exc, "inner_exception", None)
    return isinstance(inner, OperationFailed) or isinstance(exc.__cause__, OperationFailed)


@dataclass(frozen=True)
class Fault:
    """What the SDK raised, without the SDK: no usable credential, an ARM error answer (its
    ``error`` object with code, message and details, the HTTP status and headers), a broken
    connection, or something else."""

    kind: Literal["no-credentials", "answer", "connection", "other"]
    message: str
    code: str | None = None
    status: int = 0
    error: Any = None
    headers: Mapping[str, str] = field(default_factory=dict)


def fault(exc: BaseException) -> Fault:
    from azure.core.exceptions import (
        ClientAuthenticationError,
        HttpResponseError,
        ServiceRequestError,
        ServiceResponseError,
    )

    if isinstance(exc, ClientAuthenticationError) and exc.response is None:
        return Fault("no-credentials", type(exc).__name__)
    if isinstance(exc, HttpResponseError):
        response = exc.response
        return Fault(
            "answer",
            str(getattr(exc, "message", "") or ""),
            status=int(getattr(response, "status_code", 0) or 0),
            error=getattr(exc, "error", None),
            headers=getattr(response, "headers", None) or {},
        )
    if isinstance(exc, (ServiceRequestError, ServiceResponseError)):
        return Fault("connection", f"{type(exc).__name__}: {exc}")
    return Fault("other", f"{type(exc).__name__}: {exc}", type(exc).__name__)
