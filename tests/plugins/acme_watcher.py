"""A metadata watcher for a cloud we do not ship ("Acme", an imaginary neocloud), written as a
package outside this repository would write one: it imports only ``node_agent`` and
``autoscaler.model``, and ``acme_watcher-0.1.dist-info/entry_points.txt`` beside it registers it
in ``gpu_autoscaler.metadata_watchers``. Putting this folder on ``sys.path`` (``PYTHONPATH``)
installs it as far as ``importlib.metadata`` is concerned; the agent finds it from there.

Acme's metadata server (``tests/metadata_servers.py``, ``FakeAcmeMetadata``): ``GET
/acme/v1/instance`` answers the instance name with ``Acme-Metadata: 1``; ``GET
/acme/v1/interruption`` is 404 until the instance is to go, then ``{"id": ..., "deadline":
<epoch seconds>}``.
"""

from __future__ import annotations

import json
import threading
from typing import ClassVar

from autoscaler.model import NoticeKind
from autoscaler.model.errors import SourceError
from node_agent.metadata import AgentNotice, Deduplicator, PollLoop, call, instance_name
from node_agent.watchers import WatcherContext

INSTANCE_PATH = "/acme/v1/instance"
INTERRUPTION_PATH = "/acme/v1/interruption"
POLL_S = 0.1
TIMEOUT_S = 2.0


class AcmeWatcher:
    default_metadata_url: ClassVar[str] = "http://169.254.169.254"

    def __init__(self, context: WatcherContext) -> None:
        self.context = context
        self.cloud = context.cloud
        self.base_url = context.metadata_url.rstrip("/")
        self.loop = PollLoop(self.cloud, context.metrics, POLL_S, max_backoff_s=1.0)
        self._seen = Deduplicator()

    @staticmethod
    def probe(base_url: str, timeout_s: float) -> bool:
        try:
            answer = call(
                "acme metadata", "GET", base_url.rstrip("/") + INSTANCE_PATH, {}, timeout_s
            )
        except SourceError:
            return False
        return answer.status == 200 and answer.headers.get("Acme-Metadata") == "1"

    @classmethod
    def from_context(cls, context: WatcherContext) -> AcmeWatcher:
        return cls(context)

    def instance_name(self) -> str:
        what = f"acme metadata: {INSTANCE_PATH}"
        return instance_name(what, call(what, "GET", self.base_url + INSTANCE_PATH, {}, TIMEOUT_S))

    def run(self, stop: threading.Event) -> None:
        self.loop.run(self.poll, stop)

    def poll(self) -> None:
        what = f"acme metadata: {INTERRUPTION_PATH}"
        answer = call(what, "GET", self.base_url + INTERRUPTION_PATH, {}, TIMEOUT_S)
        if answer.status == 404:
            return
        if answer.status != 200:
            raise SourceError(f"{what} answered HTTP {answer.status}")
        try:
            document = json.loads(answer.body)
            event_id, deadline = str(document["id"]), float(document["deadline"])
        except (ValueError, KeyError, TypeError):
            raise SourceError(f"{what} answered something that is not an interruption") from None
        if not self._seen.first_time(event_id):
            return
        self.context.metrics.notices.labels(cloud=self.cloud, kind="terminate").inc()
        self.context.on_notice(
            AgentNotice(
                instance_id=self.instance_name(),
                kind=NoticeKind.TERMINATE,
                deadline=deadline,
                source="acme-metadata",
                event_key=event_id,
            )
        )


NOT_A_WATCHER = "registered under the group by mistake"
"""Registered as ``acme-odd``: the agent must say it is not a watcher, not crash."""
