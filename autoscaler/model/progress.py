"""Progress for work a person waits on (a replay, the lower bound, a suite): a tqdm bar when
the stream is a terminal, otherwise one plain line every ~10 s and one when the work is done, so
a CI log is never silent for minutes; nothing at all when disabled (``--no-progress``).

The lines come from a timer thread, not from the work's own updates: one long step (a linear
program solving for minutes) still shows that the job is alive and for how long it has run. On a
terminal the same thread redraws the bar, so its clock keeps moving through such a step.
``GPU_AUTOSCALER_PROGRESS_INTERVAL_S`` sets the interval between lines (tests shorten it).

tqdm is imported only for a terminal, and a missing tqdm falls back to lines: the module costs
nothing on a lean install (see ``autoscaler.model.extras``).
"""

from __future__ import annotations

import math
import os
import sys
import threading
import time
from types import TracebackType
from typing import TYPE_CHECKING, Any, TextIO

from autoscaler.model.errors import InputError

if TYPE_CHECKING:
    from tqdm import tqdm

INTERVAL_ENV = "GPU_AUTOSCALER_PROGRESS_INTERVAL_S"
DEFAULT_INTERVAL_S = 10.0
TERMINAL_REFRESH_S = 1.0
"""How often a terminal bar is redrawn while the work makes no update of its own."""

_WRITE = threading.Lock()


def interval_s() -> float:
    """Seconds between progress lines: the environment's knob, else 10."""
    raw = os.environ.get(INTERVAL_ENV, "").strip()
    if not raw:
        return DEFAULT_INTERVAL_S
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise InputError(INTERVAL_ENV, f"expected a number of seconds above 0, got {raw!r}")
    return value


def duration(seconds: float) -> str:
    """``0.4 s``, ``42 s``, ``3 min 05 s``, ``2 h 07 min``: a log's reader wants minutes, not
    185 s."""
    if seconds < 9.95:
        return f"{max(0.0, seconds):.1f} s"
    whole = round(seconds)
    if whole < 60:
        return f"{whole} s"
    if whole < 3600:
        return f"{whole // 60} min {whole % 60:02d} s"
    return f"{whole // 3600} h {whole % 3600 // 60:02d} min"


def is_terminal(stream: TextIO) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


class Progress:
    """One piece of work with an optional known size. Use as a context manager; report what is
    done with ``update_to`` / ``advance`` and what it is doing now with ``note``."""

    def __init__(
        self,
        desc: str,
        total: float | None = None,
        unit: str = "",
        *,
        enabled: bool = True,
        stream: TextIO | None = None,
        interval: float | None = None,
    ) -> None:
        self.desc = desc
        self.total = total
        self.unit = unit
        self.enabled = enabled
        self._done = 0.0
        self._note = ""
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._started = time.monotonic()
        self._stream: TextIO = stream if stream is not None else sys.stderr
        self._bar: tqdm[Any] | None = None
        self._thread: threading.Thread | None = None
        if not enabled:
            return
        every = interval if interval is not None else interval_s()
        if is_terminal(self._stream):
            self._bar = self._open_bar()
        period = min(every, TERMINAL_REFRESH_S) if self._bar is not None else every
        self._thread = threading.Thread(
            target=self._beat, args=(period,), name=f"progress: {desc}", daemon=True
        )
        self._thread.start()

    # ------------------------------------------------------------------ what the work tells

    def update_to(self, done: float) -> None:
        """The work has done ``done`` units so far."""
        with self._lock:
            self._done = done
            if self._bar is not None and int(done) != self._bar.n:
                self._bar.update(int(done) - self._bar.n)

    def advance(self, step: float = 1.0) -> None:
        self.update_to(self._done + step)

    def note(self, text: str) -> None:
        """What the work is doing now (shown after the figures until the next note)."""
        with self._lock:
            self._note = text
            if self._bar is not None:
                self._bar.set_postfix_str(text, refresh=True)

    # ------------------------------------------------------------------ what is shown

    def line(self, *, finished: bool = False) -> str:
        """The plain line for a log: where the work stands, how long it has run."""
        elapsed = time.monotonic() - self._started
        with self._lock:
            done, note = self._done, self._note
        unit = f" {self.unit}" if self.unit else ""
        if finished:
            if self.total is None and not done:
                return f"{self.desc}: done in {duration(elapsed)}"
            return f"{self.desc}: done, {_figure(done)}{unit} in {duration(elapsed)}"
        parts = [f"{self.desc}:"]
        if self.total:
            share = min(1.0, done / self.total)
            parts.append(f"{_figure(done)}/{_figure(self.total)}{unit} ({share * 100:.0f} %),")
        elif done:
            parts.append(f"{_figure(done)}{unit},")
        parts.append(f"{duration(elapsed)} elapsed")
        if self.total and 0 < done < self.total:
            parts[-1] += f", about {duration(elapsed * (self.total - done) / done)} left"
        if note:
            parts[-1] += f" ({note})"
        return " ".join(parts)

    def close(self, *, finished: bool = True) -> None:
        """Stop the timer; in a log, say the work is done (unless it failed: the error says it)."""
        if self._closed.is_set():
            return
        self._closed.set()
        if self._thread is not None:
            self._thread.join()
        if self._bar is not None:
            self._bar.close()
        elif self.enabled and finished:
            self._write(self.line(finished=True))

    def __enter__(self) -> Progress:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.close(finished=kind is None)

    # ------------------------------------------------------------------ machinery

    def _open_bar(self) -> tqdm[Any] | None:
        try:
            from tqdm import tqdm
        except ImportError:
            return None
        total = None if self.total is None else round(self.total)
        return tqdm(
            total=total,
            desc=self.desc,
            unit=self.unit or "it",
            file=self._stream,
            leave=False,
            # with no size known there is no rate or share to show, only the clock
            bar_format="{desc}: {elapsed}{postfix}" if total is None else None,
        )

    def _beat(self, period: float) -> None:
        while not self._closed.wait(period):
            if self._bar is not None:
                with self._lock:
                    self._bar.refresh()
            else:
                self._write(self.line())

    def _write(self, text: str) -> None:
        with _WRITE:
            try:
                self._stream.write(text + "\n")
                self._stream.flush()
            except (OSError, ValueError):  # a closed or broken stream: progress is not worth dying
                pass


def _figure(value: float) -> str:
    return f"{value:,.0f}" if abs(value) >= 10 or value == int(value) else f"{value:.1f}"
