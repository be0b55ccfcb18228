"""The central interruption watcher: long-polls the SQS queue EventBridge feeds with EC2 and
Health events, and hands the controller one notice per instance and event kind.

A message is deleted only once the tick that read its notices has handled them (``acknowledge``),
so a crash mid-tick loses nothing; duplicates (EventBridge delivers at least once) and messages
that ask nothing of us are deleted at once.

Each message of a batch is read and acted on by itself: a malformed one (or one whose handling
fails) is counted (``malformed``, and ``gpu_autoscaler_boundary_inputs_total{boundary=
"aws-queue", outcome="malformed"}``), logged once with its message id, and left in the queue,
so that its redrive policy moves it to the dead-letter queue for someone to look at; the good
messages of the same batch are handled in the same receive. A new notice for an instance the
controller owns wakes the run loop at once; others are rate-limited (``autoscaler.spi.wakeups``).
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

from autoscaler.model import InterruptionNotice, NoticeKind
from autoscaler.model.clock import Clock
from autoscaler.model.errors import describe
from autoscaler.spi.wakeups import Wakeups
from providers.aws.events import MalformedEventError, parse_event

log = logging.getLogger(__name__)

NoticeKey = tuple[str, NoticeKind]
BOUNDARY = "aws-queue"
# Malformed message ids remembered so that a redelivery is neither logged nor counted again.
REMEMBER_MALFORMED = 10_000
MAX_ID_CHARS = 128
# Notices remembered for deduplication, oldest first (a Health event names up to 1000 instances).
MAX_SEEN = 100_000


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
        self._seen: OrderedDict[NoticeKey, float] = OrderedDict()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.wakeups = Wakeups()
        self._bad_ids: OrderedDict[str, None] = OrderedDict()

    def start(self, wakeup: Callable[[], None] | None = None) -> None:
        if wakeup is not None:
            self.wakeups = Wakeups.of(wakeup)
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="aws-notices", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.wait_s + 5)
            self._thread = None

    def notices_ready(self) -> int:
        """How many notices wait for the next tick."""
        with self._lock:
            return len(self._ready)

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
        if not isinstance(messages, list):
            raise MalformedEventError("the receive answer's Messages is not a list")
        for message in messages:
            try:
                self._handle(message)
            except Exception as exc:  # one message's failure never takes the batch down
                self._malformed(message, f"could not be handled: {describe(exc)}")
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

    def _malformed(self, message: object, reason: str) -> None:
        """Count and log it once by id; leave it to the queue's redrive (never deleted unseen)."""
        raw = message.get("MessageId") if isinstance(message, dict) else None
        message_id = raw[:MAX_ID_CHARS] if isinstance(raw, str) and raw.isprintable() else "?"
        with self._lock:
            if message_id != "?" and message_id in self._bad_ids:
                self._bad_ids.move_to_end(message_id)
                return
            self._bad_ids[message_id] = None
            while len(self._bad_ids) > REMEMBER_MALFORMED:
                self._bad_ids.popitem(last=False)
            self.malformed += 1
        self.wakeups.tally.add(BOUNDARY, "malformed")
        log.warning(
            "interruption queue: message %s is malformed (%s); left for the queue's redrive",
            message_id,
            reason,
        )

    def _handle(self, message: dict[str, Any]) -> None:
        receipt = message.get("ReceiptHandle", "")
        body = message.get("Body", "")
        if not isinstance(receipt, str) or not isinstance(body, str):
            self._malformed(message, "no body or receipt handle")
            return
        now = self.clock.now()
        try:
            event = parse_event(body, now)
        except MalformedEventError as exc:
            self._malformed(message, str(exc))
            return
        if event is None:
            self._delete(receipt)
            return
        fresh: list[InterruptionNotice] = []
        with self._lock:
            while self._seen:
                key, seen_at = next(iter(self._seen.items()))
                if now - seen_at <= self.dedup_window_s and len(self._seen) < MAX_SEEN:
                    break
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
        self.wakeups.tally.add(BOUNDARY, "notice", len(fresh))
        if not fresh:
            self._delete(receipt)
        for notice in fresh:
            self.wakeups.notice(notice.instance_id, notice.kind)

    def _delete(self, receipt: str) -> None:
        if not receipt:
            return
        try:
            self.client.delete_message(QueueUrl=self.queue_url, ReceiptHandle=receipt)
        except Exception as exc:
            log.warning("interruption queue: delete failed: %s", describe(exc))
