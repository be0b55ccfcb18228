"""The long-running controller: a tick every ``tick_seconds``, or sooner when a provider or the
node agents' inbox wakes it with an interruption notice; SIGTERM or SIGINT end the loop after the
tick in flight."""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from types import FrameType
from typing import Protocol

from autoscaler.controller import Controller, TickReport
from autoscaler.errors import describe
from autoscaler.provider import Provider

log = logging.getLogger(__name__)


class Background(Protocol):
    """Runs beside the loop (the notice inbox, the metrics endpoint) and may wake it."""

    def start(self, wakeup: Callable[[], None]) -> None: ...

    def close(self) -> None: ...


class Runner:
    def __init__(
        self,
        controller: Controller,
        providers: Mapping[str, Provider],
        background: Sequence[Background] = (),
    ) -> None:
        self.controller = controller
        self.providers = providers
        self.background = background
        self.stopping = threading.Event()
        self._wake = threading.Event()

    def stop(self, signum: int | None = None, frame: FrameType | None = None) -> None:
        """Finish the tick in flight, then leave the loop (also the SIGTERM/SIGINT handler)."""
        self.stopping.set()
        self._wake.set()

    def run(self, max_ticks: int | None = None) -> int:
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self.stop)
            signal.signal(signal.SIGINT, self.stop)
        period = self.controller.config.tick_seconds
        done = 0
        started_background: list[Background] = []
        try:
            for provider in self.providers.values():
                start = getattr(provider, "start", None)
                if callable(start):
                    start(self._wake.set)
            for service in self.background:
                service.start(self._wake.set)
                started_background.append(service)
            while not self.stopping.is_set() and (max_ticks is None or done < max_ticks):
                started = time.monotonic()
                self._wake.clear()
                self._tick()
                done += 1
                if max_ticks is not None and done >= max_ticks:
                    break
                wait = period - (time.monotonic() - started)
                due = self.controller.next_due()
                if due is not None:
                    wait = min(wait, due - self.controller.clock.now())
                self._wake.wait(max(0.0, wait))
        finally:
            for service in started_background:
                service.close()
            for provider in self.providers.values():
                close = getattr(provider, "close", None)
                if callable(close):
                    close()
        log.info("controller stopped after %d tick(s)", done)
        return 0

    def _tick(self) -> None:
        try:
            report = self.controller.tick()
        except Exception as exc:
            log.exception("tick failed, the controller goes on: %s", describe(exc))
            return
        log.info("%s", summary(report))


def summary(report: TickReport) -> str:
    launched = sum(a.done for a in report.actions if a.kind == "launch")
    terminated = sum(a.done for a in report.actions if a.kind == "terminate")
    demand = report.view.demand
    parts = [
        f"tick={report.tick}",
        f"pending_gpus={demand.gpus if demand.known else 'unknown'}",
        f"instances={len(report.view.instances)}",
        f"launched={launched}",
        f"terminated={terminated}",
        f"notices={len(report.view.notices)}",
        f"ms={report.duration_s * 1000:.0f}",
    ]
    if report.held:
        parts.append(f"held={report.held!r}")
    if report.clamps:
        parts.append("clamps=" + ",".join(sorted({c.rule for c in report.clamps})))
    if report.errors:
        parts.append(f"errors={len(report.errors)}")
    return " ".join(parts)
