"""How notices and checkpoint reports wake the run loop, and the counts of what the notice
boundaries took and refused.

A genuine new notice for an instance the controller owns wakes a tick at once: the cloud may
take the node within 30 s. Everything else that asks for a tick is rate-limited, so no sender
can drive ticks by posting:

* a notice for an instance the controller does not own, or one it has already been woken for
  (the same instance and kind within ``REPEAT_WINDOW_S``): at most one extra tick per
  ``NOTICE_WAKE_S``;
* a checkpoint report (an evacuation may be waiting for it): at most one extra tick per
  ``CHECKPOINT_WAKE_S``.

A rate-limited request is not dropped: if the loop has not ticked since, it is woken when the
interval ends, so a notice or report waits at most one interval for its tick.
"""

from __future__ import annotations

import math
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterator
from typing import Literal

from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from autoscaler.model import NoticeKind

NOTICE_WAKE_S = 5.0
CHECKPOINT_WAKE_S = 1.0
REPEAT_WINDOW_S = 3600.0
# Owned (instance, kind) pairs remembered for repeat detection; a fleet of thousands is far below.
MAX_REMEMBERED = 100_000


class Tally:
    """Thread-safe counts of what a boundary did with its inputs, by (boundary, outcome)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: Counter[tuple[str, str]] = Counter()

    def add(self, boundary: str, outcome: str, count: int = 1) -> None:
        with self._lock:
            self._counts[(boundary, outcome)] += count

    def get(self, boundary: str, outcome: str) -> int:
        with self._lock:
            return self._counts[(boundary, outcome)]

    def total(self, boundary: str) -> int:
        with self._lock:
            return sum(n for (b, _), n in self._counts.items() if b == boundary)

    def snapshot(self) -> dict[tuple[str, str], int]:
        with self._lock:
            return dict(self._counts)


class TallyCollector(Collector):
    """``gpu_autoscaler_boundary_inputs_total{boundary, outcome}`` from a ``Tally``: the inbox's
    answers by status, the interruption queue's malformed messages, the notice wake-ups."""

    def __init__(self, tally: Tally) -> None:
        self.tally = tally

    def collect(self) -> Iterator[CounterMetricFamily]:
        family = CounterMetricFamily(
            "gpu_autoscaler_boundary_inputs",
            "Inputs at the notice boundaries by what became of them",
            labels=["boundary", "outcome"],
        )
        for (boundary, outcome), count in sorted(self.tally.snapshot().items()):
            family.add_metric([boundary, outcome], count)
        yield family


class _Limiter:
    """At most one wake per ``every_s``; a request inside the interval arms one wake for the
    interval's end, unless a tick serves it first."""

    def __init__(self, every_s: float) -> None:
        self.every_s = every_s
        self.last = -math.inf
        self.pending = False
        self.armed = False

    def request(self, now: float) -> Literal["now", "arm", "wait"]:
        if now - self.last >= self.every_s:
            self.last = now
            self.pending = False
            return "now"
        self.pending = True
        if self.armed:
            return "wait"
        self.armed = True
        return "arm"

    def fire(self, now: float) -> bool:
        """The armed wake is due: True when a request still waits for it."""
        self.armed = False
        if not self.pending:
            return False
        self.pending = False
        self.last = now
        return True

    def due(self) -> float | None:
        return self.last + self.every_s if self.pending else None

    def served(self, now: float) -> None:
        if self.pending:
            self.pending = False
            self.last = max(self.last, now)


Schedule = Callable[[float, Callable[[], None]], None]


def _timer(delay_s: float, action: Callable[[], None]) -> None:
    timer = threading.Timer(delay_s, action)
    timer.daemon = True
    timer.start()


class Wakeups:
    """The run loop's wake-up, as the notice boundaries call it. Calling it plainly wakes at once
    (what other background services use); ``notice`` and ``checkpoint`` apply the limits."""

    def __init__(
        self,
        wake: Callable[[], None] | None = None,
        owns: Callable[[str], bool] | None = None,
        leads: Callable[[], bool] | None = None,
        notice_every_s: float = NOTICE_WAKE_S,
        checkpoint_every_s: float = CHECKPOINT_WAKE_S,
        monotonic: Callable[[], float] = time.monotonic,
        schedule: Schedule = _timer,
    ) -> None:
        self._wake = wake
        self._owns = owns
        self._leads = leads
        self._monotonic = monotonic
        self._schedule = schedule
        self._lock = threading.Lock()
        self._notices = _Limiter(notice_every_s)
        self._checkpoints = _Limiter(checkpoint_every_s)
        self._woken_for: OrderedDict[tuple[str, NoticeKind], float] = OrderedDict()
        self.tally = Tally()

    @classmethod
    def of(cls, wakeup: Callable[[], None] | None) -> Wakeups:
        """``wakeup`` itself when the run loop handed one over, else one around the plain callable
        (tests, benches): every instance counts as owned there, and since no loop serves
        deferred wakes, checkpoint reports wake at once."""
        return wakeup if isinstance(wakeup, Wakeups) else cls(wakeup, checkpoint_every_s=0.0)

    def __call__(self) -> None:
        if self._wake is not None:
            self._wake()

    def leading(self) -> bool:
        """Whether this replica acts on what arrives now. A standby's inbox refuses notices and
        checkpoint reports with 503 so the agent's retry reaches the leader (behind a Service
        that sends to every replica) instead of leaving them where no tick reads them."""
        return self._leads is None or self._leads()

    def notice(self, instance_id: str, kind: NoticeKind) -> bool:
        """A notice arrived; True when it woke the loop now."""
        now = self._monotonic()
        owned = self._owns is None or self._owns(instance_id)
        with self._lock:
            self._forget(now)
            key = (instance_id, kind)
            if owned and key not in self._woken_for:
                self._woken_for[key] = now
                outcome = "at-once"
            else:
                outcome = self._limited(self._notices, now)
        self.tally.add("notice-wake", outcome)
        if outcome in ("at-once", "limited"):
            self()
            return True
        return False

    def checkpoint(self) -> bool:
        """A checkpoint report arrived; True when it woke the loop now."""
        now = self._monotonic()
        with self._lock:
            outcome = self._limited(self._checkpoints, now)
        self.tally.add("checkpoint-wake", outcome)
        if outcome == "limited":
            self()
            return True
        return False

    def _limited(self, limiter: _Limiter, now: float) -> str:
        """Under the lock: "limited" (wake now) or "deferred" (to the interval's end)."""
        decision = limiter.request(now)
        if decision == "arm":
            delay = max(0.0, limiter.last + limiter.every_s - now)
            self._schedule(delay, lambda: self._fire(limiter))
        return "limited" if decision == "now" else "deferred"

    def _fire(self, limiter: _Limiter) -> None:
        with self._lock:
            wake = limiter.fire(self._monotonic())
        if wake:
            self()

    def due_in(self) -> float | None:
        """Seconds until a deferred wake is due (0 when it is), or None when none waits."""
        with self._lock:
            dues = [d for d in (self._notices.due(), self._checkpoints.due()) if d is not None]
        return max(0.0, min(dues) - self._monotonic()) if dues else None

    def ticking(self) -> None:
        """The loop starts a tick: it serves every deferred request made so far."""
        now = self._monotonic()
        with self._lock:
            self._notices.served(now)
            self._checkpoints.served(now)

    def _forget(self, now: float) -> None:
        while self._woken_for:
            key, at = next(iter(self._woken_for.items()))
            if now - at <= REPEAT_WINDOW_S and len(self._woken_for) < MAX_REMEMBERED:
                break
            del self._woken_for[key]
