"""Azure: ``Preempt`` scheduled events for this VM, read from IMDS once a second.

Azure gives a Spot VM at least 30 s between the ``Preempt`` event and ``NotBefore``.
Acknowledging an event (``StartRequests``) tells Azure the VM is ready, so it may go before
``NotBefore``: the watcher acknowledges only once the notice was delivered to the controller and
the local hook returned (a hook that waits for a checkpoint thus holds the acknowledgement), or
never, when the ack policy is ``never``.

The document is read strictly and each event by itself: an event that is not a ``Preempt``
scheduled for this VM with a ``NotBefore`` a clock can reach never becomes a notice, and a
malformed event is counted and logged without hiding the good ones beside it.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from enum import StrEnum
from typing import TYPE_CHECKING, Annotated, Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError

from autoscaler.model import NoticeKind
from autoscaler.model.errors import SourceError
from autoscaler.model.notices import ID_MAX_CHARS, ID_PATTERN, TIME_MAX_CHARS, parse_time
from node_agent.metadata import (
    AgentNotice,
    Deduplicator,
    NoticeHandler,
    NoticeMetrics,
    PollLoop,
    call,
    instance_name,
    reachable,
)

if TYPE_CHECKING:
    from node_agent.watchers import WatcherContext

SOURCE = "azure-scheduled-events"
EVENTS_PATH = "/metadata/scheduledevents?api-version=2020-07-01"
NAME_PATH = "/metadata/instance/compute/name?api-version=2021-02-01&format=text"
HEADERS = {"Metadata": "true"}
WHAT = "azure scheduled events"
MAX_EVENTS = 1000

Bounded = Annotated[str, StringConstraints(max_length=ID_MAX_CHARS)]


class AzureAck(StrEnum):
    AFTER_HOOKS = "after-hooks"
    NEVER = "never"


class ScheduledEvent(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True, frozen=True)

    event_id: str = Field(alias="EventId", min_length=1, max_length=128, pattern=ID_PATTERN)
    event_type: str = Field(alias="EventType", max_length=64)
    resources: list[Bounded] = Field(alias="Resources", max_length=MAX_EVENTS)
    event_status: str = Field(alias="EventStatus", max_length=64)
    not_before: str = Field(default="", alias="NotBefore", max_length=TIME_MAX_CHARS)


class ScheduledEvents(BaseModel):
    """The document; its events are read one by one (``preempts``)."""

    model_config = ConfigDict(extra="ignore", strict=True, frozen=True)

    incarnation: int = Field(alias="DocumentIncarnation")
    events: list[Any] = Field(alias="Events", max_length=MAX_EVENTS)


def parse_not_before(event: ScheduledEvent) -> float | None:
    if not event.not_before:
        return None
    try:
        return parse_time(event.not_before)
    except ValueError:
        raise SourceError(
            f"{WHAT}: event {event.event_id} has NotBefore "
            f"{event.not_before!r}, not an RFC 1123 time"
        ) from None


def parse_document(body: bytes) -> ScheduledEvents:
    try:
        return ScheduledEvents.model_validate_json(body)
    except ValidationError as exc:
        raise SourceError(f"{WHAT}: {_first(exc, 'body')}") from None


def preempts(
    document: ScheduledEvents, name: str, now: float
) -> tuple[list[tuple[str, float]], list[str]]:
    """(event id, deadline) of each ``Preempt`` scheduled for ``name``, and one line for each
    event that could not be read. Other event types, other VMs' events and events already
    started are not notices."""
    found: list[tuple[str, float]] = []
    problems: list[str] = []
    for index, raw in enumerate(document.events):
        kind = raw.get("EventType") if isinstance(raw, dict) else None
        if kind != "Preempt":
            if not isinstance(kind, str):
                problems.append(f"{WHAT}: Events.{index} has no EventType")
            continue
        try:
            event = ScheduledEvent.model_validate(raw)
        except ValidationError as exc:
            problems.append(f"{WHAT}: Events.{index}.{_first(exc, 'event')}")
            continue
        if name not in event.resources or event.event_status != "Scheduled":
            continue
        try:
            deadline = parse_not_before(event)
            if deadline is None:
                raise SourceError(f"{WHAT}: event {event.event_id} is scheduled without NotBefore")
            found.append(
                (event.event_id, reachable(f"{WHAT}: event {event.event_id}", deadline, now))
            )
        except SourceError as exc:
            problems.append(str(exc))
    return found, problems


def _first(exc: ValidationError, default: str) -> str:
    first = exc.errors(include_url=False, include_input=False)[0]
    where = ".".join(str(part) for part in first["loc"]) or default
    return f"{where}: {first['msg']}"


class AzureWatcher:
    """Registered as ``azure`` in ``gpu_autoscaler.metadata_watchers``."""

    cloud = "azure"
    default_metadata_url: ClassVar[str] = "http://169.254.169.254"

    @staticmethod
    def probe(base_url: str, timeout_s: float) -> bool:
        """IMDS answers the compute name to a request carrying ``Metadata: true``."""
        url = base_url.rstrip("/") + NAME_PATH
        try:
            answer = call("azure metadata", "GET", url, HEADERS, timeout_s)
        except SourceError:
            return False
        return answer.status == 200 and bool(answer.text())

    @classmethod
    def from_context(cls, context: WatcherContext) -> AzureWatcher:
        options = context.options
        return cls(
            context.metadata_url,
            context.on_notice,
            context.metrics,
            ack=options.azure_ack,
            poll_s=options.azure_poll_s,
        )

    def __init__(
        self,
        base_url: str,
        handle: NoticeHandler,
        metrics: NoticeMetrics,
        ack: AzureAck = AzureAck.AFTER_HOOKS,
        poll_s: float = 1.0,
        timeout_s: float = 2.0,
        max_backoff_s: float = 10.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.clock = clock
        self.handle = handle
        self.metrics = metrics
        self.ack = ack
        self.timeout_s = timeout_s
        self.loop = PollLoop(self.cloud, metrics, poll_s, max_backoff_s)
        self._seen = Deduplicator()
        self._name: str | None = None

    def instance_name(self) -> str:
        if self._name is None:
            what = "azure metadata: compute name"
            answer = call(what, "GET", self.base_url + NAME_PATH, HEADERS, self.timeout_s)
            self._name = instance_name(what, answer)
        return self._name

    def run(self, stop: threading.Event) -> None:
        self.loop.run(self.poll, stop)

    def poll(self) -> None:
        """Each new Preempt for this VM goes to the handler (and is acknowledged once
        delivered); then the first unreadable event, if any, is raised for the loop to count."""
        name = self.instance_name()
        found, problems = preempts(self.read(), name, self.clock())
        for event_id, deadline in found:
            if not self._seen.first_time(event_id):
                continue
            self.metrics.notices.labels(cloud=self.cloud, kind=NoticeKind.TERMINATE.value).inc()
            delivered = self.handle(
                AgentNotice(
                    instance_id=name,
                    kind=NoticeKind.TERMINATE,
                    deadline=deadline,
                    source=SOURCE,
                    event_key=event_id,
                )
            )
            if delivered and self.ack is AzureAck.AFTER_HOOKS:
                self.acknowledge(event_id)
        if problems:
            more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
            raise SourceError(problems[0] + more)

    def read(self) -> ScheduledEvents:
        answer = call(WHAT, "GET", self.base_url + EVENTS_PATH, HEADERS, self.timeout_s)
        if answer.status != 200:
            raise SourceError(f"{WHAT}: answered HTTP {answer.status}")
        return parse_document(answer.body)

    def acknowledge(self, event_id: str) -> None:
        """A failed acknowledgement is only logged by the loop: Azure goes ahead at NotBefore."""
        body = json.dumps({"StartRequests": [{"EventId": event_id}]}).encode()
        headers = {**HEADERS, "Content-Type": "application/json"}
        what = "azure scheduled events: acknowledgement"
        answer = call(what, "POST", self.base_url + EVENTS_PATH, headers, self.timeout_s, body)
        if answer.status not in (200, 201, 202, 204):
            raise SourceError(f"{what} of {event_id} answered HTTP {answer.status}")
