"""AWS: the spot instance-action and the rebalance recommendation, read from IMDSv2 on the node.

AWS gives two minutes between the instance-action appearing and the instance going, and
suggests polling every 5 s. Reads carry an IMDSv2 session token, refreshed a minute before it
expires and at once when IMDS answers 401 (the token was revoked or the clock jumped).

The two documents are read each by itself: a broken rebalance answer never hides an
instance-action beside it (the failure is still counted and logged by the poll loop).
"""

from __future__ import annotations

import json
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
    parse_iso_time,
    reachable,
)

if TYPE_CHECKING:
    from node_agent.watchers import WatcherContext

SOURCE = "aws-imds"
TOKEN_PATH = "/latest/api/token"
INSTANCE_ID_PATH = "/latest/meta-data/instance-id"
INSTANCE_ACTION_PATH = "/latest/meta-data/spot/instance-action"
REBALANCE_PATH = "/latest/meta-data/events/recommendations/rebalance"
TOKEN_REFRESH_MARGIN_S = 60.0
ACTIONS = ("terminate", "stop", "hibernate")


def parse_document(path: str, body: bytes) -> dict[str, object]:
    """An IMDS JSON document (the parser bounds its nesting); one line when it is not one."""
    try:
        document = json.loads(body)
    except (ValueError, RecursionError):
        raise SourceError(f"aws metadata: {path} answered something that is not JSON") from None
    if not isinstance(document, dict):
        raise SourceError(f"aws metadata: {path} answered JSON that is not an object")
    return document


def instance_action(document: dict[str, object], instance_id: str, now: float) -> AgentNotice:
    """``{"action": "terminate", "time": "2026-11-21T10:02:00Z"}``: the instance goes then."""
    what = f"aws metadata: {INSTANCE_ACTION_PATH}"
    name, at = document.get("action"), document.get("time")
    if not isinstance(name, str) or name not in ACTIONS:
        shown = repr(name)[:40]
        raise SourceError(f"{what} has action {shown}, expected terminate, stop or hibernate")
    deadline = reachable(what, parse_iso_time(what, at), now)
    return AgentNotice(
        instance_id=instance_id,
        kind=NoticeKind.TERMINATE,
        deadline=deadline,
        source=SOURCE,
        event_key=f"instance-action:{name}:{at}",
    )


def rebalance(document: dict[str, object], instance_id: str, now: float) -> AgentNotice:
    """``{"noticeTime": "..."}``: elevated risk, no deadline; the time names the event."""
    what = f"aws metadata: {REBALANCE_PATH}"
    noticed = document.get("noticeTime")
    reachable(what, parse_iso_time(what, noticed), now)
    return AgentNotice(
        instance_id=instance_id,
        kind=NoticeKind.REBALANCE,
        deadline=None,
        source=SOURCE,
        event_key=f"rebalance:{noticed}",
    )


class AwsWatcher:
    """Registered as ``aws`` in ``gpu_autoscaler.metadata_watchers``."""

    cloud = "aws"
    default_metadata_url: ClassVar[str] = "http://169.254.169.254"

    @staticmethod
    def probe(base_url: str, timeout_s: float) -> bool:
        """IMDSv2 answers a token PUT; nothing else at that address does."""
        try:
            answer = call(
                "aws metadata",
                "PUT",
                base_url.rstrip("/") + TOKEN_PATH,
                {"X-aws-ec2-metadata-token-ttl-seconds": "60"},
                timeout_s,
            )
        except SourceError:
            return False
        return answer.status == 200 and bool(answer.text())

    @classmethod
    def from_context(cls, context: WatcherContext) -> AwsWatcher:
        options = context.options
        return cls(
            context.metadata_url, context.on_notice, context.metrics, poll_s=options.aws_poll_s
        )

    def __init__(
        self,
        base_url: str,
        handle: NoticeHandler,
        metrics: NoticeMetrics,
        poll_s: float = 5.0,
        timeout_s: float = 2.0,
        max_backoff_s: float = 30.0,
        token_ttl_s: int = 21600,
        monotonic: Callable[[], float] = time.monotonic,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.handle = handle
        self.metrics = metrics
        self.timeout_s = timeout_s
        self.token_ttl_s = token_ttl_s
        self.loop = PollLoop(self.cloud, metrics, poll_s, max_backoff_s)
        self._monotonic = monotonic
        self.clock = clock
        self._token: str | None = None
        self._token_expires = 0.0
        self._seen = Deduplicator()
        self._instance_id: str | None = None

    def instance_name(self) -> str:
        if self._instance_id is None:
            what = f"aws metadata: {INSTANCE_ID_PATH}"
            self._instance_id = instance_name(what, self._get(INSTANCE_ID_PATH))
        return self._instance_id

    def run(self, stop: threading.Event) -> None:
        self.loop.run(self.poll, stop)

    def poll(self) -> None:
        """One read of both endpoints; each new notice goes to the handler, then the first
        failure (if any) is raised for the loop to count."""
        notices, failures = self._read_each()
        for notice in notices:
            if self._seen.first_time(notice.event_key):
                self.metrics.notices.labels(cloud=self.cloud, kind=notice.kind.value).inc()
                self.handle(notice)
        if failures:
            raise failures[0]

    def read(self) -> list[AgentNotice]:
        notices, failures = self._read_each()
        if failures:
            raise failures[0]
        return notices

    def _read_each(self) -> tuple[list[AgentNotice], list[SourceError]]:
        notices: list[AgentNotice] = []
        failures: list[SourceError] = []
        for path, read in ((INSTANCE_ACTION_PATH, instance_action), (REBALANCE_PATH, rebalance)):
            try:
                document = self._read_json(path)
                if document is not None:
                    notices.append(read(document, self.instance_name(), self.clock()))
            except SourceError as exc:
                failures.append(exc)
        return notices, failures

    def _read_json(self, path: str) -> dict[str, object] | None:
        """The document at ``path``, or None where IMDS says there is none (404)."""
        answer = self._get(path)
        if answer.status == 404:
            return None
        if answer.status != 200:
            raise SourceError(f"aws metadata: {path} answered HTTP {answer.status}")
        return parse_document(path, answer.body)

    def _get(self, path: str) -> Answer:
        answer = self._get_with_token(path, self._session_token())
        if answer.status == 401:
            self._token = None
            answer = self._get_with_token(path, self._session_token())
        return answer

    def _get_with_token(self, path: str, token: str) -> Answer:
        return call(
            f"aws metadata: {path}",
            "GET",
            self.base_url + path,
            {"X-aws-ec2-metadata-token": token},
            self.timeout_s,
        )

    def _session_token(self) -> str:
        if self._token is not None and self._monotonic() < self._token_expires:
            return self._token
        started = self._monotonic()
        answer = call(
            "aws metadata: token",
            "PUT",
            self.base_url + TOKEN_PATH,
            {"X-aws-ec2-metadata-token-ttl-seconds": str(self.token_ttl_s)},
            self.timeout_s,
        )
        if answer.status != 200 or not answer.text():
            raise SourceError(f"aws metadata: the token PUT answered HTTP {answer.status}")
        self._token = answer.text()
        self._token_expires = started + max(self.token_ttl_s - TOKEN_REFRESH_MARGIN_S, 1.0)
        return self._token
