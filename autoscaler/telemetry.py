"""From GPU readings to what a policy needs: each node's measured utilisation and since when all
its GPUs have been idle.

The tracker keeps, per GPU, the last time it was seen busy and its recent readings; a node is
idle since the latest of its GPUs' last-busy times once every GPU reads below the threshold. A
node whose readings are missing or older than ``max_age_s`` is unknown, never idle: a broken
exporter must not look like an idle fleet.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from autoscaler.sources import GpuSample, NodeUsage


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

    def observe(self, samples: Iterable[GpuSample]) -> None:
        for sample in samples:
            gpu = self._gpus.get((sample.host, sample.gpu))
            if gpu is None:
                gpu = _Gpu(first_seen=sample.at)
                self._gpus[(sample.host, sample.gpu)] = gpu
            if gpu.latest is not None and sample.at <= gpu.latest.at:
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
        result: dict[str, NodeTelemetry] = {}
        for host, gpus in hosts.items():
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
