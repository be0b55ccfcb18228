"""The one module of ``providers.aws`` that imports boto3 and botocore, and only inside its
functions: the controller, the other providers and this provider's other modules import
without the ``aws`` extra installed. Building the provider without it is one line naming the
extra (``require_sdk``), not ``No module named 'boto3'`` at the first call.

* ``client`` makes one boto3 client, with botocore's own retries bounded by the caller (the
  provider turns them off, so the controller's retry policy is the only one);
* ``Clients`` holds a provider's clients, made once per service and region; the SQS client's
  read timeout stays above its long poll;
* ``fault`` reads what botocore raised as plain data, for ``providers.aws.errors`` to say what it
  means to the controller.

Credentials come from the standard boto3 chain (environment, profile, instance or pod role).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Literal

from autoscaler.model.optional import require_extra
from providers.aws.settings import AwsSettings

USER_AGENT = "hybrid-gpu-autoscaler"
SDK_MODULES = ("boto3", "botocore")


def require_sdk() -> None:
    """The provider is being built: without boto3 every call would fail, so say so now."""
    require_extra("the aws provider", "aws", SDK_MODULES)


def client(
    service: str,
    region: str,
    *,
    endpoint_url: str | None,
    connect_timeout_s: float,
    read_timeout_s: float,
    attempts: int,
    session: Any = None,
    user_agent: str | None = None,
) -> Any:
    """A boto3 client (from ``session``, or a new default session)."""
    import boto3
    from botocore.config import Config

    made = session if session is not None else boto3.session.Session()
    return made.client(
        service,
        region_name=region,
        endpoint_url=endpoint_url,
        config=Config(
            retries={"total_max_attempts": attempts, "mode": "standard"},
            connect_timeout=connect_timeout_s,
            read_timeout=read_timeout_s,
            user_agent_extra=user_agent,
        ),
    )


class Clients:
    """A provider's boto3 clients, one per service and region, made on first use from one
    session (``session``: a test's, else the default chain's)."""

    def __init__(self, settings: AwsSettings, session: Any = None) -> None:
        require_sdk()
        self.settings = settings
        self._session = session
        self._clients: dict[tuple[str, str], Any] = {}
        self._lock = threading.Lock()

    def client(self, service: str, region: str) -> Any:
        with self._lock:
            key = (service, region)
            if key not in self._clients:
                if self._session is None:
                    import boto3

                    self._session = boto3.session.Session()
                read_timeout = self.settings.read_timeout_s
                if service == "sqs":
                    # a long poll holds the request open for queue_wait_s by design
                    read_timeout = max(read_timeout, self.settings.queue_wait_s + 10.0)
                self._clients[key] = client(
                    service,
                    region,
                    endpoint_url=self.settings.endpoint_url,
                    connect_timeout_s=self.settings.connect_timeout_s,
                    read_timeout_s=read_timeout,
                    attempts=1,
                    session=self._session,
                    user_agent=USER_AGENT,
                )
            return self._clients[key]


@dataclass(frozen=True)
class Fault:
    """What botocore raised, without botocore: an error answer of the service (its code and
    HTTP status), no credentials, a broken connection, or something else."""

    kind: Literal["answer", "credentials", "connection", "other"]
    message: str
    code: str | None = None
    status: int = 0


def fault(exc: BaseException) -> Fault:
    from botocore.exceptions import (
        ClientError,
        ConnectionClosedError,
        ConnectTimeoutError,
        EndpointConnectionError,
        NoCredentialsError,
        PartialCredentialsError,
        ReadTimeoutError,
    )

    if isinstance(exc, ClientError):
        error = exc.response.get("Error", {})
        status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
        return Fault("answer", str(error.get("Message", "")), error.get("Code"), status)
    if isinstance(exc, (NoCredentialsError, PartialCredentialsError)):
        return Fault("credentials", type(exc).__name__)
    if isinstance(
        exc, (EndpointConnectionError, ConnectTimeoutError, ReadTimeoutError, ConnectionClosedError)
    ):
        return Fault("connection", f"{type(exc).__name__}: {exc}")
    return Fault("other", f"{type(exc).__name__}: {exc}", type(exc).__name__)
