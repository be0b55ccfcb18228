"""Every call the ``kubernetes`` source makes to the API server, in this one module, so the RBAC
rules it needs can be read off it (``tests/kubernetes_calls.py`` scans for them):

| method | verb | resource |
|---|---|---|
| ``list_pod_for_all_namespaces`` | list | pods |
| ``list_pod_for_all_namespaces(watch=True)`` | watch | pods |
| ``read_namespaced_pod`` | get | pods |
| ``patch_namespaced_pod`` | patch | pods |
| ``delete_namespaced_pod`` | delete | pods |
| ``create_namespaced_pod_eviction`` | create | pods/eviction |
| ``list_node`` | list | nodes |
| ``list_node(watch=True)`` | watch | nodes |
| ``patch_node`` | patch | nodes |

Objects are read as the JSON the server sent (``_preload_content=False``), not as the client's
models: a cluster's pods are tens of thousands of objects a tick, which the models would take
seconds to build, and the readers want a few fields of each. Anything that goes wrong is one
``SourceError`` line naming the call and the answer's status and message (never its body
otherwise, nor a header): a failed read is demand unknown, never zero.

The client is built on first use, so ``gpu-autoscaler validate`` contacts nothing and needs no
cluster; it retries nothing (the next tick is the retry).
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import msgspec

from autoscaler.model.errors import SourceError
from autoscaler.model.logs import register_secret
from autoscaler.model.secrets import read_secret_env
from autoscaler.sources.kubernetes.settings import KubernetesSettings

if TYPE_CHECKING:
    from kubernetes.client import ApiClient, CoreV1Api

log = logging.getLogger(__name__)

Obj = dict[str, Any]
HTTP_NOT_FOUND = 404
HTTP_CONFLICT = 409
HTTP_TOO_MANY = 429
HTTP_GONE = 410
# How long the server keeps one watch open (client-go picks 5 to 10 minutes); a new one follows.
WATCH_TIMEOUT_S = 300
STREAM_CHUNK = 64 * 1024
SHOWN = 200
# What a list of every pod leaves out: finished pods hold no node and are no demand.
NOT_FINISHED = "status.phase!=Succeeded,status.phase!=Failed"


@dataclass(frozen=True)
class Listing:
    """The items of a list call and the resourceVersion it was read at."""

    items: list[Obj]
    resource_version: str


@dataclass(frozen=True)
class Refused:
    """An eviction the server refused: 429 (a PodDisruptionBudget) or another answer."""

    status: int
    message: str


class KubeApi:
    """The source's API calls, each with the source's request timeout, as plain JSON."""

    def __init__(self, settings: KubernetesSettings, where: str) -> None:
        self.settings = settings
        self.where = where
        self._core: CoreV1Api | None = None
        self._client: ApiClient | None = None
        self._lock = threading.Lock()

    # -- reads -----------------------------------------------------------------------------------

    def list_pods(self, field_selector: str = NOT_FINISHED) -> Listing:
        """Every pod (every namespace) that has not finished."""
        response = self._call(
            "list pods",
            lambda core: core.list_pod_for_all_namespaces(
                field_selector=field_selector,
                _preload_content=False,
                _request_timeout=self.settings.request_timeout_s,
            ),
        )
        return self._listing("list pods", response)

    def list_pods_on(self, node: str) -> list[Obj]:
        """The pods bound to ``node`` that have not finished."""
        return self.list_pods(f"spec.nodeName={node},{NOT_FINISHED}").items

    def list_nodes(
        self, label_selector: str | None = None, field_selector: str | None = None
    ) -> Listing:
        response = self._call(
            "list nodes",
            lambda core: core.list_node(
                label_selector=label_selector,
                field_selector=field_selector,
                _preload_content=False,
                _request_timeout=self.settings.request_timeout_s,
            ),
        )
        return self._listing("list nodes", response)

    def watch_pods(self, resource_version: str) -> Watch:
        """The changes to unfinished pods since ``resource_version`` (a pod that finishes is
        seen as DELETED: it leaves the field selector)."""
        return self._watch(
            "watch pods",
            lambda core, **options: core.list_pod_for_all_namespaces(
                watch=True, field_selector=NOT_FINISHED, **options
            ),
            resource_version,
        )

    def watch_nodes(self, resource_version: str) -> Watch:
        """The changes to nodes since ``resource_version``."""
        return self._watch(
            "watch nodes",
            lambda core, **options: core.list_node(watch=True, **options),
            resource_version,
        )

    def read_pod(self, namespace: str, name: str) -> Obj | None:
        """One pod, or None when it is gone."""
        try:
            response = self._call(
                f"get pod {namespace}/{name}",
                lambda core: core.read_namespaced_pod(
                    name,
                    namespace,
                    _preload_content=False,
                    _request_timeout=self.settings.request_timeout_s,
                ),
                missing_ok=True,
            )
        except _MissingError:
            return None
        return self._object(f"get pod {namespace}/{name}", response)

    # -- writes ----------------------------------------------------------------------------------

    def change_pod(self, namespace: str, name: str, patch: Mapping[str, Any]) -> bool:
        """A strategic-merge patch of a pod; False when the pod is gone."""
        try:
            _finish(
                self._call(
                    f"patch pod {namespace}/{name}",
                    lambda core: core.patch_namespaced_pod(
                        name,
                        namespace,
                        dict(patch),
                        _preload_content=False,
                        _request_timeout=self.settings.request_timeout_s,
                    ),
                    missing_ok=True,
                )
            )
        except _MissingError:
            return False
        return True

    def change_node(self, name: str, patch: Mapping[str, Any]) -> None:
        """A strategic-merge patch of a node (``spec.unschedulable``, labels, the taints)."""
        _finish(
            self._call(
                f"patch node {name}",
                lambda core: core.patch_node(
                    name,
                    dict(patch),
                    _preload_content=False,
                    _request_timeout=self.settings.request_timeout_s,
                ),
            )
        )

    def delete_pod(self, namespace: str, name: str, uid: str | None) -> bool:
        """Delete a pod (only the one of ``uid``, when given: not a namesake made since); False
        when it is gone already."""
        from kubernetes.client import V1DeleteOptions, V1Preconditions

        options = V1DeleteOptions(
            grace_period_seconds=self.settings.delete_grace_period_s,
            preconditions=V1Preconditions(uid=uid) if uid else None,
        )
        try:
            _finish(
                self._call(
                    f"delete pod {namespace}/{name}",
                    lambda core: core.delete_namespaced_pod(
                        name,
                        namespace,
                        body=options,
                        _preload_content=False,
                        _request_timeout=self.settings.request_timeout_s,
                    ),
                    missing_ok=True,
                )
            )
        except _MissingError:
            return False
        return True

    def evict_pod(self, namespace: str, name: str) -> Refused | None:
        """Ask the Eviction API to evict a pod; None when it was evicted (or is gone already),
        else what refused it: a PodDisruptionBudget (429), or a budget the server cannot apply
        (500 for two budgets over one pod). Other failures raise as every call does."""
        from kubernetes.client import V1DeleteOptions, V1Eviction, V1ObjectMeta
        from kubernetes.client.exceptions import ApiException

        body = V1Eviction(
            api_version="policy/v1",
            kind="Eviction",
            metadata=V1ObjectMeta(name=name, namespace=namespace),
            delete_options=V1DeleteOptions(
                grace_period_seconds=self.settings.delete_grace_period_s
            ),
        )
        core = self._api()
        try:
            response: Any = core.create_namespaced_pod_eviction(
                name,
                namespace,
                body,
                _preload_content=False,
                _request_timeout=self.settings.request_timeout_s,
            )
        except ApiException as exc:
            if exc.status == HTTP_NOT_FOUND:
                return None
            if exc.status in (HTTP_TOO_MANY, 500):
                return Refused(int(exc.status), _status_message(exc, detailed=True))
            raise self._failure(f"evict pod {namespace}/{name}", exc) from None
        except _errors() as exc:
            raise self._failure(f"evict pod {namespace}/{name}", exc) from None
        _finish(response)
        return None

    def close(self) -> None:
        with self._lock:
            if self._client is not None:
                self._client.close()  # type: ignore[no-untyped-call]
            self._client = self._core = None

    # -- the plumbing ----------------------------------------------------------------------------

    def _call(self, what: str, call: Any, missing_ok: bool = False) -> Any:
        from kubernetes.client.exceptions import ApiException

        core = self._api()
        try:
            return call(core)
        except ApiException as exc:
            if missing_ok and exc.status == HTTP_NOT_FOUND:
                raise _MissingError from None
            raise self._failure(what, exc) from None
        except _errors() as exc:
            raise self._failure(what, exc) from None

    def _watch(self, what: str, call: Any, resource_version: str) -> Watch:
        """Open a watch from ``resource_version``: the server ends it after WATCH_TIMEOUT_S
        (the cache opens another), and a read that waits longer than that and the request
        timeout is a broken watch, not a quiet one."""
        from kubernetes.client.exceptions import ApiException

        core = self._api()
        timeout = self.settings.request_timeout_s
        try:
            response = call(
                core,
                resource_version=resource_version,
                allow_watch_bookmarks=True,
                timeout_seconds=WATCH_TIMEOUT_S,
                _preload_content=False,
                _request_timeout=(timeout, WATCH_TIMEOUT_S + timeout),
            )
        except ApiException as exc:
            if exc.status == HTTP_GONE:
                raise ExpiredError(f"{self.where}: {what}: HTTP 410 Gone") from None
            raise self._failure(what, exc) from None
        except _errors() as exc:
            raise self._failure(what, exc) from None
        return Watch(self, what, response)

    def _failure(self, what: str, exc: BaseException) -> SourceError:
        from kubernetes.client.exceptions import ApiException

        if isinstance(exc, ApiException) and exc.status:
            reason = f"HTTP {exc.status} {exc.reason or ''}".rstrip()
            said = _status_message(exc)
            kind = ConflictError if exc.status == HTTP_CONFLICT else SourceError
            return kind(f"{self.where}: {what}: {reason}{': ' + said if said else ''}")
        cause = getattr(exc, "reason", None)  # urllib3's MaxRetryError wraps what happened
        if isinstance(cause, BaseException):
            exc = cause
        name = type(exc).__name__
        if "Timeout" in name or isinstance(exc, TimeoutError):
            return SourceError(
                f"{self.where}: {what}: no answer within {self.settings.request_timeout_s:g}s"
            )
        return SourceError(f"{self.where}: {what}: cannot reach the API server ({name})")

    def _listing(self, what: str, response: Any) -> Listing:
        document = self._object(what, response)
        items = document.get("items")
        meta = document.get("metadata")
        if not isinstance(items, list) or not isinstance(meta, dict):
            raise SourceError(f"{self.where}: {what}: the answer is not a list")
        return Listing(items, str(meta.get("resourceVersion") or ""))

    def _object(self, what: str, response: Any) -> Obj:
        try:
            data = response.data
            document = msgspec.json.decode(data)
        except (msgspec.DecodeError, ValueError, RecursionError) as exc:
            raise SourceError(
                f"{self.where}: {what}: the answer is not JSON ({type(exc).__name__})"
            ) from None
        except _errors() as exc:
            raise self._failure(what, exc) from None
        finally:
            response.release_conn()
        if not isinstance(document, dict):
            raise SourceError(f"{self.where}: {what}: the answer is not a JSON object")
        return document

    def _api(self) -> CoreV1Api:
        with self._lock:
            if self._core is None:
                from kubernetes.client import CoreV1Api

                self._client = _client(self.settings, self.where)
                self._core = CoreV1Api(self._client)
            return self._core


class ConflictError(SourceError):
    """A write the server refused with 409 Conflict: the object changed since it was read (a
    ``resourceVersion`` precondition), so the writer reads it again and retries."""


class ExpiredError(SourceError):
    """A watch's resourceVersion is older than the server keeps (410 Gone, reason Expired):
    the watcher lists afresh."""


class Watch:
    """One open watch: its events as ``(type, object)`` pairs, in order. BOOKMARK events
    carry only a resourceVersion; an ERROR event raises (``ExpiredError`` for a 410), as does
    a stream that breaks; a stream the server ends (its timeout) simply ends."""

    def __init__(self, api: KubeApi, what: str, response: Any) -> None:
        self.api = api
        self.what = what
        self._response = response

    def __iter__(self) -> Iterator[tuple[str, Obj]]:
        pending = b""
        try:
            for chunk in self._response.stream(STREAM_CHUNK, decode_content=True):
                pending += chunk
                *lines, pending = pending.split(b"\n")
                for line in lines:
                    if line.strip():
                        yield self._event(line)
            if pending.strip():
                yield self._event(pending)
        except _errors() as exc:
            raise self.api._failure(self.what, exc) from None
        except ValueError as exc:  # a closed stream read from (``close`` while reading)
            raise SourceError(f"{self.api.where}: {self.what}: the stream was closed") from exc
        finally:
            self._response.release_conn()

    def _event(self, line: bytes) -> tuple[str, Obj]:
        where = f"{self.api.where}: {self.what}"
        try:
            event = msgspec.json.decode(line)
        except (msgspec.DecodeError, RecursionError) as exc:
            raise SourceError(f"{where}: an event is not JSON ({type(exc).__name__})") from None
        kind = event.get("type") if isinstance(event, dict) else None
        obj = event.get("object") if isinstance(event, dict) else None
        if not isinstance(kind, str) or not isinstance(obj, dict):
            raise SourceError(f"{where}: an event without a type and an object")
        if kind == "ERROR":
            code = obj.get("code")
            message = " ".join(str(obj.get("message") or "").split())[:SHOWN]
            if code == HTTP_GONE:
                raise ExpiredError(f"{where}: HTTP 410 {obj.get('reason') or 'Gone'}: {message}")
            raise SourceError(f"{where}: HTTP {code} {obj.get('reason') or ''}: {message}")
        return kind, obj

    def close(self) -> None:
        """End the watch from another thread: a read blocked on it returns at once."""
        with contextlib.suppress(AttributeError, OSError):
            self._response.shutdown()


def _finish(response: Any) -> None:
    """Read the rest of an answer we do not use and give the connection back: a connection
    handed back with its answer unread would serve that answer to the next request."""
    try:
        response.read()
    finally:
        response.release_conn()


class _MissingError(Exception):
    """The object is gone (404): an answer the caller expects."""


def _errors() -> tuple[type[BaseException], ...]:
    """What a request may raise besides an answer: no answer at all."""
    from urllib3.exceptions import HTTPError

    return (HTTPError, OSError)


def _status_message(exc: Any, detailed: bool = False) -> str:
    """The message of the ``Status`` the server answered with, as one short line; with
    ``detailed``, its causes' messages too (what a PodDisruptionBudget says)."""
    body = getattr(exc, "body", None)
    try:
        status = json.loads(body) if body else None
    except (ValueError, TypeError, RecursionError):
        return ""
    if not isinstance(status, dict):
        return ""
    parts = [status.get("message")]
    if detailed:
        details = status.get("details")
        causes = details.get("causes") if isinstance(details, dict) else None
        for cause in causes if isinstance(causes, list) else []:
            if isinstance(cause, dict):
                parts.append(cause.get("message"))
    text = "; ".join(p for p in parts if isinstance(p, str) and p)
    flat = " ".join(text.split())
    return flat if len(flat) <= SHOWN else flat[: SHOWN - 3] + "..."


def _client(settings: KubernetesSettings, where: str) -> ApiClient:
    """An ApiClient from the settings' way in: api_url and a token, a kubeconfig, or the pod's
    service account. Failing to build one is a read that fails, said in one line."""
    from kubernetes.client import ApiClient, Configuration
    from kubernetes.config.config_exception import ConfigException

    config = Configuration()
    config.retries = 0
    try:
        if settings.api_url is not None:
            config.host = settings.api_url.rstrip("/")
            if settings.token_env:
                token = read_secret_env(settings.token_env, where, "token_env")
                if not token:
                    raise SourceError(
                        f"{where}: environment variable {settings.token_env} (token_env) is not set"
                    )
                config.api_key["BearerToken"] = f"Bearer {token}"
            if settings.ca_file:
                config.ssl_ca_cert = settings.ca_file
        elif settings.kubeconfig is not None:
            from kubernetes.config.kube_config import load_kube_config

            load_kube_config(  # type: ignore[no-untyped-call]
                config_file=settings.kubeconfig,
                context=settings.context,
                client_configuration=config,
                persist_config=False,
            )
        else:
            from kubernetes.config.incluster_config import InClusterConfigLoader

            loader = InClusterConfigLoader(  # type: ignore[no-untyped-call]
                "/var/run/secrets/kubernetes.io/serviceaccount/token",
                "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt",
            )
            loader.load_and_set(config)  # type: ignore[no-untyped-call]
    except ConfigException as exc:
        raise SourceError(
            f"{where}: no way into the cluster: {' '.join(str(exc).split())[:SHOWN]}"
        ) from None
    except OSError as exc:
        raise SourceError(f"{where}: kubeconfig {settings.kubeconfig}: {exc.strerror}") from None
    for value in config.api_key.values():
        register_secret(str(value).removeprefix("Bearer ").removeprefix("bearer "))
    return ApiClient(config)
