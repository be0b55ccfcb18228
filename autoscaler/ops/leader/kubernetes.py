"""The leader lock of replicas running in a Kubernetes cluster: a coordination.k8s.io/v1 Lease.

The rules are client-go's leader election (``tools/leaderelection``), so the lease reads the
same to ``kubectl`` and to any other elector: ``holderIdentity``, ``leaseDurationSeconds``,
``acquireTime``, ``renewTime``, ``leaseTransitions``, written with the resourceVersion last read
so that of two replicas racing for a free lease exactly one write lands (the other gets 409).

Expiry is judged as client-go judges it: by this replica's monotonic clock since it last saw the
lease change, never by comparing the holder's ``renewTime`` with our wall clock, which may be
skewed. The holder stops acting (``check`` fails) once its last successful renewal is older than
the renew deadline, which is shorter than the lease: so it has stopped before any standby can
have seen the lease unchanged for a whole lease and taken it.

The fencing token is ``leaseTransitions``, which grows on every change of holder. Creating the
lease counts as the first transition (client-go writes 0 there), so the first leader holds 1.
"""

from __future__ import annotations

import logging
import math
import re
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from autoscaler.model.errors import InputError
from autoscaler.model.logs import register_secret
from autoscaler.model.records import LeadershipLost

if TYPE_CHECKING:
    from kubernetes.client import CoordinationV1Api, V1Lease, V1LeaseSpec

log = logging.getLogger(__name__)

SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")
WHERE = "leader lock (kubernetes)"
NOT_INSTALLED = (
    "the Kubernetes leader lock needs the kubernetes client "
    "(pip install 'hybrid-gpu-autoscaler[kubernetes]')"
)
# a Lease name is a DNS subdomain
NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
HTTP_CONFLICT = 409
HTTP_NOT_FOUND = 404


@dataclass(frozen=True)
class _Seen:
    """The lease as this replica last saw it, and when (by its own monotonic clock)."""

    lease: V1Lease
    resource_version: str
    holder: str
    duration_s: int
    transitions: int
    acquired: datetime | None
    at: float


class KubernetesLeaseLock:
    """A ``LeaderLock`` kept in a Lease object, through the official kubernetes client.

    In a pod, leave ``api_url`` out: the API server comes from ``KUBERNETES_SERVICE_HOST`` and
    ``_PORT``, the bearer token and CA from the service account (the token re-read as it
    rotates), the namespace from its ``namespace`` file. Elsewhere (tests, a controller outside
    the cluster) give ``api_url`` and ``token``.
    """

    def __init__(
        self,
        name: str,
        namespace: str | None = None,
        identity: str | None = None,
        lease_seconds: float = 15.0,
        renew_deadline_s: float | None = None,
        api_url: str | None = None,
        token: str | None = None,
        token_path: Path = SERVICE_ACCOUNT / "token",
        ca_path: Path = SERVICE_ACCOUNT / "ca.crt",
        request_timeout_s: float | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        if not NAME.fullmatch(name) or len(name) > 253:
            raise InputError(WHERE, f"{name!r} is not a valid Lease name", field="name")
        if not lease_seconds > 0:
            raise InputError(WHERE, "must be above 0", field="lease_seconds")
        deadline = lease_seconds * 2 / 3 if renew_deadline_s is None else renew_deadline_s
        if not 0 < deadline < lease_seconds:
            raise InputError(
                WHERE, "must be above 0 and below lease_seconds", field="renew_deadline_s"
            )
        self.name = name
        self.namespace = namespace or _namespace_of(token_path)
        self.identity = identity or f"{socket.gethostname()}_{uuid.uuid4().hex[:8]}"
        self.lease_seconds = lease_seconds
        self.renew_deadline_s = deadline
        # what the lease tells others: whole seconds, never shorter than our own lease
        self._duration_s = max(1, math.ceil(lease_seconds))
        self._timeout_s = request_timeout_s if request_timeout_s is not None else deadline / 2
        self._monotonic = monotonic
        self._state = threading.Lock()
        self._seen: _Seen | None = None
        self._token: int | None = None
        self._renewed_at = -math.inf
        self._api = _api(api_url, token, token_path, ca_path)

    def acquire(self) -> int | None:
        """Take the lease when free or expired, renew it when ours; the token while leader.

        A renewal is dated from before its request is sent and an observation from after its
        answer came: a standby can only have seen our write after we sent it, so our renew
        deadline runs out before its wait does.
        """
        from kubernetes.client.exceptions import ApiException

        started = self._monotonic()
        try:
            lease = self._api.read_namespaced_lease(
                self.name, self.namespace, _request_timeout=self._timeout_s
            )
        except ApiException as exc:
            if exc.status == HTTP_NOT_FOUND:
                return self._create(started)
            self._failed("read", exc)
            return None
        except _api_errors() as exc:
            self._failed("read", exc)
            return None
        now = self._monotonic()
        seen = self._observe(lease, now)
        if seen.holder and seen.holder != self.identity and now - seen.at < seen.duration_s:
            self._lose()
            return None
        ours = seen.holder == self.identity
        spec = self._spec(
            transitions=seen.transitions if ours else seen.transitions + 1,
            acquired=seen.acquired if ours else None,
        )
        try:
            written = self._api.replace_namespaced_lease(
                self.name,
                self.namespace,
                lease.model_copy(update={"spec": spec}),
                _request_timeout=self._timeout_s,
            )
        except _api_errors() as exc:
            self._failed("renew" if ours else "take over", exc)
            return None
        return self._won(written, started)

    def check(self, token: int) -> None:
        """Cheap and local: no request, so it can guard every action."""
        with self._state:
            held = self._token
            age = self._monotonic() - self._renewed_at
        if held is None:
            raise LeadershipLost(f"lease {self.namespace}/{self.name} is not held by us")
        if token != held:
            raise LeadershipLost(f"token {token} is stale: the lease is held under {held}")
        if age >= self.renew_deadline_s:
            raise LeadershipLost(
                f"lease {self.namespace}/{self.name} not renewed for {age:.1f}s "
                f"(renew deadline {self.renew_deadline_s:.1f}s)"
            )

    def release(self) -> None:
        """Clear the holder (client-go's ReleaseOnCancel) so a standby takes over at once."""
        from kubernetes.client import V1LeaseSpec

        with self._state:
            held, seen = self._token, self._seen
            self._token = None
            self._renewed_at = -math.inf
        if held is None or seen is None or seen.holder != self.identity:
            return
        now = datetime.now(UTC)
        spec = V1LeaseSpec(
            holder_identity="",
            lease_duration_seconds=1,
            lease_transitions=seen.transitions,
            acquire_time=now,
            renew_time=now,
        )
        try:
            # written over the lease as we last wrote it: a conflict means someone wrote after
            # us, and the lease is no longer ours to clear
            self._api.replace_namespaced_lease(
                self.name,
                self.namespace,
                seen.lease.model_copy(update={"spec": spec}),
                _request_timeout=self._timeout_s,
            )
        except _api_errors() as exc:
            self._failed("release", exc)
            return
        log.info("leader lock %s/%s: %s released", self.namespace, self.name, self.identity)

    def close(self) -> None:
        """Free the client's connections (the lock is not used after)."""
        self._api.api_client.close()

    def _create(self, started: float) -> int | None:
        """Create the lease, holding it.

        A lease deleted under running replicas would restart its transitions; starting above
        the highest this replica has seen keeps at least its own tokens growing.
        """
        from kubernetes.client import V1Lease, V1ObjectMeta

        with self._state:
            transitions = self._seen.transitions + 1 if self._seen else 1
        body = V1Lease(
            api_version="coordination.k8s.io/v1",
            kind="Lease",
            metadata=V1ObjectMeta(name=self.name, namespace=self.namespace),
            spec=self._spec(transitions=transitions, acquired=None),
        )
        try:
            lease = self._api.create_namespaced_lease(
                self.namespace, body, _request_timeout=self._timeout_s
            )
        except _api_errors() as exc:
            self._failed("create", exc)
            return None
        return self._won(lease, started)

    def _spec(self, transitions: int, acquired: datetime | None) -> V1LeaseSpec:
        from kubernetes.client import V1LeaseSpec

        now = datetime.now(UTC)
        return V1LeaseSpec(
            holder_identity=self.identity,
            lease_duration_seconds=self._duration_s,
            lease_transitions=transitions,
            acquire_time=acquired or now,
            renew_time=now,
        )

    def _observe(self, lease: V1Lease, now: float) -> _Seen:
        """Remember the lease, restarting the expiry wait whenever it changed since last seen.

        A change is any new resourceVersion: every write moves it (client-go compares the
        record itself; counting every write as a change only ever makes a standby wait longer).
        """
        spec, meta = lease.spec, lease.metadata
        version = (meta.resource_version if meta else None) or ""
        with self._state:
            before = self._seen
            unchanged = bool(version) and before is not None and before.resource_version == version
            seen = _Seen(
                lease=lease,
                resource_version=version,
                holder=(spec.holder_identity if spec else None) or "",
                duration_s=(spec.lease_duration_seconds if spec else None) or self._duration_s,
                transitions=(spec.lease_transitions if spec else None) or 0,
                acquired=spec.acquire_time if spec else None,
                at=before.at if before is not None and unchanged else now,
            )
            self._seen = seen
        return seen

    def _won(self, lease: V1Lease, started: float) -> int:
        seen = self._observe(lease, self._monotonic())
        with self._state:
            if self._token != seen.transitions:
                log.info(
                    "leader lock %s/%s: %s leads under token %d",
                    self.namespace,
                    self.name,
                    self.identity,
                    seen.transitions,
                )
            self._token = seen.transitions
            self._renewed_at = started
        return seen.transitions

    def _lose(self) -> None:
        with self._state:
            if self._token is not None:
                log.warning(
                    "leader lock %s/%s: %s lost the lease to %s",
                    self.namespace,
                    self.name,
                    self.identity,
                    self._seen.holder if self._seen and self._seen.holder else "another write",
                )
            self._token = None
            self._renewed_at = -math.inf

    def _failed(self, what: str, exc: Exception) -> None:
        """One line, from the status alone: an answer's body or headers never reach a log.

        A conflict is news (another replica wrote first: we are not the leader); anything else
        leaves the token standing until the renew deadline, so a blip does not end a leadership.
        """
        from kubernetes.client.exceptions import ApiException

        if isinstance(exc, ApiException) and exc.status == HTTP_CONFLICT:
            self._lose()
            log.info("leader lock %s/%s: %s lost a race (409)", self.namespace, self.name, what)
            return
        if isinstance(exc, ApiException) and exc.status:
            why = f"HTTP {exc.status} {exc.reason or ''}".rstrip()
        else:
            why = type(exc).__name__
        log.warning("leader lock %s/%s: %s failed: %s", self.namespace, self.name, what, why)


def _api_errors() -> tuple[type[Exception], ...]:
    """What a request to the API server may raise: an answer, or no answer at all."""
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import HTTPError

    return (ApiException, HTTPError, OSError)


def _namespace_of(token_path: Path) -> str:
    path = token_path.parent / "namespace"
    try:
        namespace = path.read_text().strip()
    except OSError:
        namespace = ""
    if not namespace:
        raise InputError(
            WHERE, f"no namespace given and none readable from {path}", field="namespace"
        )
    return namespace


def _api(
    api_url: str | None, token: str | None, token_path: Path, ca_path: Path
) -> CoordinationV1Api:
    """A CoordinationV1Api that fails fast: no retries, the caller's next tick is the retry."""
    try:
        from kubernetes.client import ApiClient, Configuration, CoordinationV1Api
        from kubernetes.config.config_exception import ConfigException
        from kubernetes.config.incluster_config import InClusterConfigLoader
    except ImportError as exc:
        raise InputError(WHERE, NOT_INSTALLED) from exc

    config = Configuration(retries=0)
    if api_url is None:
        try:
            loader = InClusterConfigLoader(str(token_path), str(ca_path))  # type: ignore[no-untyped-call]
            loader.load_and_set(config)  # type: ignore[no-untyped-call]
        except ConfigException as exc:
            raise InputError(
                WHERE, f"not in a cluster ({exc}); give api_url and token", field="api_url"
            ) from exc
        register_secret(config.api_key.get("BearerToken", "").removeprefix("bearer "))
    else:
        config.host = api_url.rstrip("/")
        if token is None and token_path.is_file():
            token = token_path.read_text().strip()
        if token:
            register_secret(token)
            config.api_key["BearerToken"] = f"Bearer {token}"
        if api_url.startswith("https:") and ca_path.is_file():
            config.ssl_ca_cert = str(ca_path)
    return CoordinationV1Api(ApiClient(config))
