"""GCP: preemption and host maintenance, read from the metadata server with hanging GETs.

A Spot VM has about 30 s between ``instance/preempted`` turning ``TRUE`` and the VM stopping, so
the watcher keeps a hanging GET open (``wait_for_change`` with the last ``ETag``, bounded by
``timeout_sec``) instead of polling, and reconnects at once when it returns. GPU VMs cannot live
migrate: ``instance/maintenance-event`` reading ``TERMINATE_ON_HOST_MAINTENANCE`` means the host
will stop the VM, which the controller hears as a rebalance (the node should be drained, but
there is no exact deadline).

Answers are read strictly: the instance name is bounded (``autoscaler.model.notices``), an ETag is
a short token (it goes back into the next URL), and a value other than the documented ones is
one error line, quoted short.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, ClassVar

from autoscaler.model import NoticeKind
from autoscaler.model.errors import SourceError
from node_agent.metadata import (
    AgentNotice,
    Answer,
    Deduplicator,
    NoticeHandler,
    NoticeMetrics,
    PollLoop,
    call,
    instance_name,
)

if TYPE_CHECKING:
    from node_agent.watchers import WatcherContext

SOURCE = "gcp-metadata"
PREFIX = "/computeMetadata/v1/"
HEADERS = {"Metadata-Flavor": "Google"}
PREEMPTION_WINDOW_S = 30.0
_ETAG = re.compile(r"^[A-Za-z0-9_-]{1,128}$")


class _Key:
    """One metadata key followed with hanging GETs: the first read answers at once (the value
    may already be set), later ones wait for a change from the last ETag."""

    def __init__(self, watcher: GcpWatcher, key: str, on_value: Callable[[str, str], None]):
        self.watcher = watcher
        self.key = key
        self.on_value = on_value
        self.etag: str | None = None
        self.loop = PollLoop(
            watcher.cloud, watcher.metrics, 0.0, watcher.max_backoff_s, watcher.retry_s
        )

    def step(self) -> None:
        query = ""
        wait_s = 0.0
        if self.etag is not None:
            wait_s = self.watcher.hang_s
            query = f"?wait_for_change=true&last_etag={self.etag}&timeout_sec={int(wait_s)}"
        answer = self.watcher.get(self.key + query, self.watcher.timeout_s + wait_s)
        value = answer.text()
        etag = answer.headers.get("ETag")
        if etag is not None and not _ETAG.match(etag):
            raise SourceError(f"gcp metadata: {self.key} answered an ETag that is not a token")
        self.etag = etag or self.etag
        self.on_value(value, self.etag or "")


class GcpWatcher:
    """Registered as ``gcp`` in ``gpu_autoscaler.metadata_watchers``."""

    cloud = "gcp"
    default_metadata_url: ClassVar[str] = "http://metadata.google.internal"

    @staticmethod
    def probe(base_url: str, timeout_s: float) -> bool:
        """The metadata server signs its answers with ``Metadata-Flavor: Google``."""
        url = base_url.rstrip("/") + PREFIX + "instance/name"
        try:
            answer = call("gcp metadata", "GET", url, HEADERS, timeout_s)
        except SourceError:
            return False
        return answer.status == 200 and answer.headers.get("Metadata-Flavor") == "Google"

    @classmethod
    def from_context(cls, context: WatcherContext) -> GcpWatcher:
        return cls(context.metadata_url, context.on_notice, context.metrics)

    def __init__(
        self,
        base_url: str,
        handle: NoticeHandler,
        metrics: NoticeMetrics,
        hang_s: float = 60.0,
        timeout_s: float = 2.0,
        retry_s: float = 1.0,
        max_backoff_s: float = 10.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.handle = handle
        self.metrics = metrics
        self.hang_s = max(1.0, float(int(hang_s)))
        self.timeout_s = timeout_s
        self.retry_s = retry_s
        self.max_backoff_s = max_backoff_s
        self.clock = clock
        self._seen = Deduplicator()
        self._name: str | None = None

    def instance_name(self) -> str:
        if self._name is None:
            answer = self.get("instance/name", self.timeout_s)
            self._name = instance_name("gcp metadata: instance/name", answer)
        return self._name

    def run(self, stop: threading.Event) -> None:
        """Both keys at once, each on its own thread, since a hanging GET holds its thread."""
        keys = [
            _Key(self, "instance/preempted", self.on_preempted),
            _Key(self, "instance/maintenance-event", self.on_maintenance),
        ]
        threads = [
            threading.Thread(
                target=key.loop.run, args=(key.step, stop), name=f"gcp-{key.key}", daemon=True
            )
            for key in keys
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()

    def on_preempted(self, value: str, etag: str) -> None:
        if value == "FALSE":
            return
        if value != "TRUE":
            raise SourceError(
                f"gcp metadata: instance/preempted is {value[:40]!r}, not TRUE or FALSE"
            )
        self._emit(NoticeKind.TERMINATE, self.clock() + PREEMPTION_WINDOW_S, "preempted")

    def on_maintenance(self, value: str, etag: str) -> None:
        if value in ("NONE", "MIGRATE_ON_HOST_MAINTENANCE"):
            return
        if value != "TERMINATE_ON_HOST_MAINTENANCE":
            raise SourceError(f"gcp metadata: instance/maintenance-event is {value[:40]!r}")
        self._emit(NoticeKind.REBALANCE, None, f"maintenance:{etag}")

    def _emit(self, kind: NoticeKind, deadline: float | None, key: str) -> None:
        instance_id = self.instance_name()
        if not self._seen.first_time(key):
            return
        self.metrics.notices.labels(cloud=self.cloud, kind=kind.value).inc()
        self.handle(
            AgentNotice(
                instance_id=instance_id, kind=kind, deadline=deadline, source=SOURCE, event_key=key
            )
        )

    def get(self, path: str, timeout_s: float) -> Answer:
        what = f"gcp metadata: {path.partition('?')[0]}"
        answer = call(what, "GET", self.base_url + PREFIX + path, HEADERS, timeout_s)
        if answer.status != 200:
            raise SourceError(f"{what} answered HTTP {answer.status}")
        if answer.headers.get("Metadata-Flavor") != "Google":
            raise SourceError(f"{what} answered without Metadata-Flavor: Google")
        return answer
