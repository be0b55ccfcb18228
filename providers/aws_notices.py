"""The central interruption watcher: long-polls the SQS queue EventBridge feeds with EC2 and
Health events, and hands the controller one notice per instance and event kind.

A message is deleted only once the tick that read its notices has handled them (``acknowledge``),
so a crash mid-tick loses nothing; duplicates (EventBridge delivers at least once) and messages
that ask nothing of us are deleted at once; a malformed message is logged, counted and deleted,
and never stops the watcher.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any

from autoscaler.clock import Clock
from autoscaler.errors import describe
from autoscaler.model import InterruptionNotice, NoticeKind
from providers.aws_events import MalformedEventError, parse_event

log = logging.getLogger(__name__)

NoticeKey = tuple[str, NoticeKind]


class NoticeWatcher:
    def __init__(
        self,
        client: Any,
        queue_url: str,
        clock: Clock,
        pool_of: Callable[[str], str],
        wait_s: int = 20,
        dedup_window_s: float = 3600.0,
    ) -> None:
        self.client = client
        self.queue_url = queue_url
        self.clock = clock
        self.pool_of = pool_of
        self.wait_s = wait_s
        self.dedup_window_s = dedup_window_s
        self.malformed = 0
        self.duplicates = 0
        self.receive_errors = 0
        self._lock = threading.Lock()
        self._ready: list[InterruptionNotice] = []
        self._receipts: dict[InterruptionNotice, str] = {}
        self._open: dict[str, int] = {}
        self._seen: dict[NoticeKey, float] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._wakeup: Callable[[], None] | None = None

    def start(self, wakeup: Callable[[], None] | None = None) -> None:
        if wakeup is not None:
            self._wakeup = wakeup
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="aws-notices", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.wait_s + 5)
            self._thread = None

    def take(self) -> list[InterruptionNotice]:
        with self._lock:
            taken, self._ready = self._ready, []
        return taken

    def acknowledge(self, notices: Sequence[InterruptionNotice]) -> None:
        for notice in notices:
            with self._lock:
                receipt = self._receipts.pop(notice, None)
                if receipt is None:
                    continue
                self._open[receipt] -= 1
                done = self._open[receipt] == 0
                if done:
                    del self._open[receipt]
            if done:
                self._delete(receipt)

    def poll_once(self) -> int:
        """One receive call; returns how many messages it read."""
        response = self.client.receive_message(
            QueueUrl=self.queue_url,
            MaxNumberOfMessages=10,
            WaitTimeSeconds=self.wait_s,
        )
        messages = response.get("Messages", [])
        for message in messages:
            self._handle(message)
        return len(messages)

    def _run(self) -> None:
        pause = 1.0
        while not self._stop.is_set():
            try:
                self.poll_once()
                pause = 1.0
            except Exception as exc:
                self.receive_errors += 1
                log.warning("interruption queue: receive failed: %s", describe(exc))
                self._stop.wait(pause)
                pause = min(pause * 2, 30.0)

    def _handle(self, message: dict[str, Any]) -> None:
        receipt = message.get("ReceiptHandle", "")
        try:
            event = parse_event(message.get("Body", ""))
        except MalformedEventError as exc:
            self.malformed += 1
            log.warning(
                "interruption queue: dropped malformed message %s: %s",
                message.get("MessageId", "?"),
                exc,
            )
            self._delete(receipt)
            return
        if event is None:
            self._delete(receipt)
            return
        now = self.clock.now()
        fresh: list[InterruptionNotice] = []
        with self._lock:
            for key, seen_at in list(self._seen.items()):
                if now - seen_at > self.dedup_window_s:
                    del self._seen[key]
            for instance in event.instance_ids:
                key = (instance, event.kind)
                if key in self._seen:
                    self.duplicates += 1
                    continue
                self._seen[key] = now
                fresh.append(
                    InterruptionNotice(
                        instance_id=instance,
                        pool=self.pool_of(instance),
                        kind=event.kind,
                        received_at=now,
                        deadline=event.deadline,
                    )
                )
            if fresh:
                self._open[receipt] = self._open.get(receipt, 0) + len(fresh)
                for notice in fresh:
                    self._receipts[notice] = receipt
                self._ready.extend(fresh)
        if not fresh:
            self._delete(receipt)
        elif self._wakeup is not None:
            self._wakeup()

    def _delete(self, receipt: str) -> None:
        if not receipt:
            return
        try:
            self.client.delete_message(QueueUrl=self.queue_url, ReceiptHandle=receipt)
        except Exception as exc:
            log.warning("interruption queue: delete failed: %s", describe(exc))
