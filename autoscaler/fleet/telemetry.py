"""From GPU readings to what a policy needs: each node's measured utilisation and since when all
its GPUs have been idle.

The tracker keeps, per GPU, the last time it was seen busy and its recent readings; a node is
idle since the latest of its GPUs' last-busy times once every GPU reads below the threshold. A
node whose readings are missing or older than ``max_age_s`` is unknown, never idle: a broken
exporter must not look like an idle fleet.

A reading is taken at face value only within a plausible window: one stamped more than
``FUTURE_SKEW_S`` after now would otherwise stand as the GPU's latest for good (every real
reading after it looks older and is ignored, so a busy GPU would stay idle and never go stale).
Such a node is unknown for the tick and its readings are forgotten, so the next real reading
starts it afresh. A reading that is not a finite percentage at a finite time makes its node
unknown for the tick too. The sources refuse both already; the tracker does not rely on it.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from autoscaler.spi.sources import GpuSample, NodeUsage

# How far ahead of the controller's clock a reading's time may be (clocks that NTP keeps agree to
# milliseconds; this allows for a host that drifted, not for a reading from another day).
FUTURE_SKEW_S = 60.0


@dataclass(frozen=True)
class NodeTelemetry:
    util_pct: float
    idle_since: float | None


@dataclass
class _Gpu:
    last_busy: float | None = None
    first_seen: float = 0.0
    latest: GpuSample | None = None
    recent: deque[tuple[float, float]] = field(default_factory=deque)


class IdleTracker:
    def __init__(
        self, idle_util_pct: float = 5.0, window_s: float = 600.0, max_age_s: float = 180.0
    ) -> None:
        self.idle_util_pct = idle_util_pct
        self.window_s = window_s
        self.max_age_s = max_age_s
        self._gpus: dict[tuple[str, str], _Gpu] = {}
        self._unreadable: set[str] = set()

    def observe(self, samples: Iterable[GpuSample]) -> None:
        for sample in samples:
            if not (math.isfinite(sample.at) and 0.0 <= sample.util_pct <= 100.0):
                self._unreadable.add(sample.host)
                continue
            gpu = self._gpus.get((sample.host, sample.gpu))
            if gpu is None:
                gpu = _Gpu(first_seen=sample.at)
                self._gpus[(sample.host, sample.gpu)] = gpu
            if gpu.latest is not None and sample.at <= gpu.latest.at:
                # Not newer than what we hold (the same scrape seen twice, or readings out of
                # order): it does not move the GPU back in time, but a busy one still says the
                # GPU was busy then, so idle never dates from before it.
                if sample.util_pct >= self.idle_util_pct and (
                    gpu.last_busy is None or sample.at > gpu.last_busy
                ):
                    gpu.last_busy = sample.at
                continue
            gpu.latest = sample
            gpu.recent.append((sample.at, sample.util_pct))
            if sample.util_pct >= self.idle_util_pct:
                gpu.last_busy = sample.at
            while gpu.recent and gpu.recent[0][0] < sample.at - self.window_s:
                gpu.recent.popleft()

    def nodes(self, now: float) -> dict[str, NodeTelemetry]:
        """Per host with fresh readings for every GPU it reported: mean utilisation over the
        window, and since when it has been idle (None while any GPU is busy)."""
        hosts: dict[str, list[_Gpu]] = {}
        for (host, _), gpu in self._gpus.items():
            hosts.setdefault(host, []).append(gpu)
        unreadable, self._unreadable = self._unreadable, set()
        ahead = {
            host
            for host, gpus in hosts.items()
            if any(g.latest is not None and g.latest.at > now + FUTURE_SKEW_S for g in gpus)
        }
        self.forget(ahead)
        result: dict[str, NodeTelemetry] = {}
        for host, gpus in hosts.items():
            if host in unreadable or host in ahead:
                continue
            if any(g.latest is None or now - g.latest.at > self.max_age_s for g in gpus):
                continue
            readings = [util for g in gpus for _, util in g.recent]
            mean = sum(readings) / len(readings) if readings else 0.0
            busy_now = any(
                g.latest is not None and g.latest.util_pct >= self.idle_util_pct for g in gpus
            )
            idle_since = None
            if not busy_now:
                idle_since = max(
                    g.last_busy if g.last_busy is not None else g.first_seen for g in gpus
                )
            result[host] = NodeTelemetry(mean, idle_since)
        return result

    def forget(self, hosts: Iterable[str]) -> None:
        gone = set(hosts)
        for key in [k for k in self._gpus if k[0] in gone]:
            del self._gpus[key]


def apply(
    usage: Mapping[str, NodeUsage], measured: Mapping[str, NodeTelemetry]
) -> dict[str, NodeUsage]:
    """Scheduler allocation joined with measured utilisation; nodes without readings keep what
    the scheduler knew (utilisation unknown)."""
    joined = {}
    for name, seen in usage.items():
        reading = measured.get(name)
        joined[name] = (
            seen
            if reading is None
            else NodeUsage(
                seen.gpus_allocated, reading.util_pct, reading.idle_since, seen.empty_since
            )
        )
    return joined
