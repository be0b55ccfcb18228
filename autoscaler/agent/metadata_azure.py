"""Azure: ``Preempt`` scheduled events for this VM, read from IMDS once a second.

Azure gives a Spot VM at least 30 s between the ``Preempt`` event and ``NotBefore``.
Acknowledging an event (``StartRequests``) tells Azure the VM is ready, so it may go before
``NotBefore``: the watcher acknowledges only once the notice was delivered to the controller and
the local hook returned (a hook that waits for a checkpoint thus holds the acknowledgement), or
never, when the ack policy is ``never``.
"""

from __future__ import annotations

import json
import threading
from email.utils import parsedate_to_datetime
from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from autoscaler.agent.metadata import (
    AgentNotice,
    Deduplicator,
    NoticeHandler,
    NoticeMetrics,
    PollLoop,
    call,
)
from autoscaler.model import NoticeKind
from autoscaler.sources import SourceError

SOURCE = "azure-scheduled-events"
EVENTS_PATH = "/metadata/scheduledevents?api-version=2020-07-01"
NAME_PATH = "/metadata/instance/compute/name?api-version=2021-02-01&format=text"
HEADERS = {"Metadata": "true"}


class AzureAck(StrEnum):
    AFTER_HOOKS = "after-hooks"
    NEVER = "never"


class ScheduledEvent(BaseModel):
    model_config = ConfigDict(extra="ignore")

    event_id: str = Field(alias="EventId", min_length=1)
    event_type: str = Field(alias="EventType")
    resources: list[str] = Field(alias="Resources")
    event_status: str = Field(alias="EventStatus")
    not_before: str = Field(default="", alias="NotBefore")


class ScheduledEvents(BaseModel):
    model_config = ConfigDict(extra="ignore")

    incarnation: int = Field(alias="DocumentIncarnation")
    events: list[ScheduledEvent] = Field(alias="Events")


def probe(base_url: str, timeout_s: float) -> bool:
    try:
        answer = call("azure metadata", "GET", base_url + NAME_PATH, HEADERS, timeout_s)
    except SourceError:
        return False
    return answer.status == 200 and bool(answer.text())


def parse_not_before(event: ScheduledEvent) -> float | None:
    if not event.not_before:
        return None
    try:
        return parsedate_to_datetime(event.not_before).timestamp()
    except (TypeError, ValueError):
        raise SourceError(
            f"azure scheduled events: event {event.event_id} has NotBefore "
            f"{event.not_before!r}, not an RFC 1123 time"
        ) from None


class AzureWatcher:
    cloud = "azure"

    def __init__(
        self,
        base_url: str,
        handle: NoticeHandler,
        metrics: NoticeMetrics,
        ack: AzureAck = AzureAck.AFTER_HOOKS,
        poll_s: float = 1.0,
        timeout_s: float = 2.0,
        max_backoff_s: float = 10.0,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.handle = handle
        self.metrics = metrics
        self.ack = ack
        self.timeout_s = timeout_s
        self.loop = PollLoop(self.cloud, metrics, poll_s, max_backoff_s)
        self._seen = Deduplicator()
        self._name: str | None = None

    def instance_name(self) -> str:
        if self._name is None:
            answer = call(
                "azure metadata: compute name",
                "GET",
                self.base_url + NAME_PATH,
                HEADERS,
                self.timeout_s,
            )
            if answer.status != 200 or not answer.text():
                raise SourceError(f"azure metadata: compute name answered HTTP {answer.status}")
            self._name = answer.text()
        return self._name

    def run(self, stop: threading.Event) -> None:
        self.loop.run(self.poll, stop)

    def poll(self) -> None:
        name = self.instance_name()
        for event in self.read().events:
            if event.event_type != "Preempt" or name not in event.resources:
                continue
            if event.event_status != "Scheduled":
                continue
            deadline = parse_not_before(event)
            if not self._seen.first_time(event.event_id):
                continue
            self.metrics.notices.labels(cloud=self.cloud, kind=NoticeKind.TERMINATE.value).inc()
            delivered = self.handle(
                AgentNotice(
                    instance_id=name,
                    kind=NoticeKind.TERMINATE,
                    deadline=deadline,
                    source=SOURCE,
                    event_key=event.event_id,
                )
            )
            if delivered and self.ack is AzureAck.AFTER_HOOKS:
                self.acknowledge(event.event_id)

    def read(self) -> ScheduledEvents:
        what = "azure scheduled events"
        answer = call(what, "GET", self.base_url + EVENTS_PATH, HEADERS, self.timeout_s)
        if answer.status != 200:
            raise SourceError(f"{what}: answered HTTP {answer.status}")
        try:
            return ScheduledEvents.model_validate_json(answer.body)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(part) for part in first["loc"]) or "body"
            raise SourceError(f"{what}: {where}: {first['msg']}") from None

    def acknowledge(self, event_id: str) -> None:
        """A failed acknowledgement is only logged by the loop: Azure goes ahead at NotBefore."""
        body = json.dumps({"StartRequests": [{"EventId": event_id}]}).encode()
        headers = {**HEADERS, "Content-Type": "application/json"}
        what = "azure scheduled events: acknowledgement"
        answer = call(what, "POST", self.base_url + EVENTS_PATH, headers, self.timeout_s, body)
        if answer.status not in (200, 201, 202, 204):
            raise SourceError(f"{what} of {event_id} answered HTTP {answer.status}")
