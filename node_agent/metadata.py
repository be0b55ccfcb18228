"""What the three clouds' node watchers share: the notice they produce, one stdlib HTTP call with
a timeout that turns every failure into a one-line ``SourceError``, the agent's notice metrics,
the poll-with-backoff loop, and finding out which cloud this node runs in.

Metadata servers are link-local, so requests never go through a proxy from the environment.
Their answers are read like any other outside input (``autoscaler.model.notices``): at most
``MAX_ANSWER`` bytes, instance names bounded, deadlines a clock can reach; each endpoint and each
event is read by itself, so one bad answer never hides a good notice beside it.
"""

from __future__ import annotations

import http.client
import logging
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

from prometheus_client import CollectorRegistry, Counter
from pydantic import BaseModel, ConfigDict

from autoscaler.model import NoticeKind
from autoscaler.model.errors import SourceError, describe
from autoscaler.model.notices import deadline_problem, id_problem, parse_time

log = logging.getLogger(__name__)

CLOUDS = ("aws", "gcp", "azure")
# A metadata document is a few hundred bytes; anything this large is not one.
MAX_ANSWER = 64 * 1024


class AgentNotice(BaseModel):
    """A notice read on the node, in the shape the controller's inbox takes (plus ``event_key``,
    which names the cloud's event so each one is handled once)."""

    model_config = ConfigDict(frozen=True)

    instance_id: str
    kind: NoticeKind
    deadline: float | None
    source: str
    event_key: str

    def inbox_body(self) -> dict[str, object]:
        return {
            "instance_id": self.instance_id,
            "kind": self.kind.value,
            "deadline": self.deadline,
            "source": self.source,
        }


NoticeHandler = Callable[[AgentNotice], bool]
"""Called once per new notice; True when it was delivered (Azure acknowledges only then)."""


class Watcher(Protocol):
    cloud: str

    def instance_name(self) -> str: ...

    def run(self, stop: threading.Event) -> None: ...


class NoticeMetrics:
    """The watchers' own series on the agent's registry, so a broken metadata endpoint shows on
    a dashboard instead of only in a log nobody reads."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.metadata_errors = Counter(
            "gpu_autoscaler_agent_metadata_errors",
            "Metadata reads that failed (error status, malformed answer, timeout)",
            ["cloud"],
            registry=self.registry,
        )
        self.notices = Counter(
            "gpu_autoscaler_agent_notices",
            "Interruption notices read on this node",
            ["cloud", "kind"],
            registry=self.registry,
        )
        self.forward_failures = Counter(
            "gpu_autoscaler_agent_forward_failures",
            "Notices the controller did not accept",
            ["reason"],
            registry=self.registry,
        )


@dataclass(frozen=True)
class Answer:
    status: int
    headers: Mapping[str, str]
    body: bytes

    def text(self) -> str:
        return self.body.decode("utf-8", errors="replace").strip()


_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def call(
    what: str,
    method: str,
    url: str,
    headers: Mapping[str, str],
    timeout_s: float,
    body: bytes | None = None,
) -> Answer:
    """Any status comes back as an ``Answer`` (the watchers decide what 404 means); only a
    connection failure or timeout raises, as one line naming ``what`` was being read."""
    request = urllib.request.Request(url, data=body, method=method, headers=dict(headers))
    try:
        with _OPENER.open(request, timeout=timeout_s) as response:
            data = response.read(MAX_ANSWER + 1)
            status, answered = response.status, dict(response.headers.items())
    except urllib.error.HTTPError as exc:
        with exc:
            data = exc.read(MAX_ANSWER + 1)
            status, answered = exc.code, dict(exc.headers.items())
    except TimeoutError:
        raise SourceError(f"{what}: no answer within {timeout_s:g} s") from None
    except http.client.HTTPException as exc:
        raise SourceError(f"{what}: not an HTTP answer ({describe(exc)})") from None
    except (urllib.error.URLError, OSError) as exc:
        reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
        if isinstance(reason, TimeoutError):
            raise SourceError(f"{what}: no answer within {timeout_s:g} s") from None
        raise SourceError(f"{what}: cannot connect ({reason})") from None
    if len(data) > MAX_ANSWER:
        raise SourceError(f"{what}: the answer is over {MAX_ANSWER} bytes")
    return Answer(status, answered, data)


def parse_iso_time(what: str, value: object) -> float:
    try:
        return parse_time(value)
    except ValueError as exc:
        raise SourceError(f"{what}: time {exc}") from None


def reachable(what: str, deadline: float, now: float) -> float:
    """``deadline`` when a clock can reach it, else one line saying why not."""
    problem = deadline_problem(deadline, now)
    if problem is not None:
        raise SourceError(f"{what}: the time {problem}")
    return deadline


def instance_name(what: str, answer: Answer) -> str:
    """The node's name from a metadata answer, bounded and printable."""
    if answer.status != 200:
        raise SourceError(f"{what} answered HTTP {answer.status}, not an instance name")
    name = answer.text()
    problem = id_problem(name)
    if problem is not None:
        raise SourceError(f"{what}: the instance name {problem}")
    return name


class PollLoop:
    """Runs ``step`` until stopped, waiting ``interval_s`` between steps and, while it fails,
    backing off from ``retry_s`` (default ``interval_s``), doubling up to ``max_backoff_s``. A
    failure is logged when it starts or changes, and recovery once, so a metadata outage costs a
    few log lines, not one a second."""

    def __init__(
        self,
        cloud: str,
        metrics: NoticeMetrics,
        interval_s: float,
        max_backoff_s: float,
        retry_s: float | None = None,
    ) -> None:
        self.cloud = cloud
        self.metrics = metrics
        self.interval_s = interval_s
        self.retry_s = interval_s if retry_s is None else retry_s
        self.max_backoff_s = max(max_backoff_s, self.retry_s)
        self.failures = 0
        self._last_error: str | None = None

    def run(self, step: Callable[[], None], stop: threading.Event) -> None:
        while not stop.is_set():
            stop.wait(self.once(step, stop))

    def once(self, step: Callable[[], None], stop: threading.Event | None = None) -> float:
        """One step; returns how long to wait before the next. A read cut short by the agent
        stopping is not an error; anything else is counted and outlived, even a bug, since a
        watcher thread that died would leave the node deaf to notices."""
        try:
            step()
        except Exception as exc:
            if stop is not None and stop.is_set():
                return 0.0
            self.metrics.metadata_errors.labels(cloud=self.cloud).inc()
            self.failures += 1
            message = (
                str(exc)
                if isinstance(exc, SourceError)
                else (f"{self.cloud} metadata watcher: unexpected {describe(exc)}")
            )
            if message != self._last_error:
                log.warning("%s (will retry)", message)
                self._last_error = message
            return min(self.max_backoff_s, self.retry_s * 2.0 ** min(self.failures - 1, 16))
        if self._last_error is not None:
            log.info("%s metadata answers again after %d failure(s)", self.cloud, self.failures)
        self.failures = 0
        self._last_error = None
        return self.interval_s


class Deduplicator:
    """Remembers the cloud events already handed on, so a notice that stays up on the metadata
    server (AWS and Azure keep answering it until the instance goes) is handled once."""

    def __init__(self) -> None:
        self._seen: set[str] = set()
        self._lock = threading.Lock()

    def first_time(self, key: str) -> bool:
        with self._lock:
            if key in self._seen:
                return False
            self._seen.add(key)
            return True
