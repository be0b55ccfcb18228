"""What the controller remembers about pools between ticks: where capacity just failed and where
spot was just taken away.

Karpenter keeps an insufficient-capacity cache with a TTL so a pool that just said "no" is not
asked again every tick; we do the same, and add the mirror image for interruptions: a pool that
just interrupted us is marked risky for a while so replacements go elsewhere.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass


@dataclass(frozen=True)
class CacheEntry:
    until: float
    reason: str


class CapacityCache:
    """Pools that recently failed for capacity or quota, each until its TTL runs out."""

    def __init__(self, ttl_s: float) -> None:
        self.ttl_s = ttl_s
        self._entries: dict[str, CacheEntry] = {}

    def mark(self, pool: str, now: float, reason: str, ttl_s: float | None = None) -> None:
        until = now + (self.ttl_s if ttl_s is None else ttl_s)
        current = self._entries.get(pool)
        if current is None or current.until < until:
            self._entries[pool] = CacheEntry(until, reason)

    def unavailable_until(self, pool: str, now: float) -> float | None:
        entry = self._entries.get(pool)
        if entry is None:
            return None
        if entry.until <= now:
            del self._entries[pool]
            return None
        return entry.until

    def is_available(self, pool: str, now: float) -> bool:
        return self.unavailable_until(pool, now) is None

    def entries(self, now: float) -> dict[str, CacheEntry]:
        for pool in [p for p, e in self._entries.items() if e.until <= now]:
            del self._entries[pool]
        return dict(self._entries)


class InterruptionHistory:
    """Interruptions per pool and the instance-hours they happened in, over a sliding window,
    and which pools are risky right now.

    Counting exposure as well as events gives a rate per instance-hour: ten instances lost in
    one reclaim of a busy pool is not the same risk as ten reclaims of a single instance.
    """

    def __init__(
        self, risky_ttl_s: float, window_s: float = 3 * 86_400.0, bucket_s: float = 3600.0
    ) -> None:
        self.risky_ttl_s = risky_ttl_s
        self.window_s = window_s
        self.bucket_s = bucket_s
        self._events: dict[str, deque[float]] = {}
        self._exposure: dict[str, deque[list[float]]] = {}
        self._last_exposure_at: float | None = None

    def record(self, pool: str, when: float) -> None:
        self._events.setdefault(pool, deque()).append(when)

    def expose(self, running_by_pool: dict[str, int], now: float) -> None:
        """Add the instance-seconds since the last call, for the instances now running."""
        last = self._last_exposure_at
        self._last_exposure_at = now
        if last is None or now <= last:
            return
        bucket = now - now % self.bucket_s
        for pool, running in running_by_pool.items():
            if running <= 0:
                continue
            buckets = self._exposure.setdefault(pool, deque())
            if buckets and buckets[-1][0] == bucket:
                buckets[-1][1] += running * (now - last)
            else:
                buckets.append([bucket, running * (now - last)])

    def recent(self, pool: str, now: float) -> int:
        events = self._events.get(pool)
        if not events:
            return 0
        horizon = now - self.window_s
        while events and events[0] < horizon:
            events.popleft()
        return len(events)

    def reclaims(self, pool: str, now: float) -> int:
        """Distinct reclaims among the recent interruptions: those recorded at one moment (one
        tick) are one reclaim of several instances."""
        self.recent(pool, now)
        events = self._events.get(pool)
        if not events:
            return 0
        count = 0
        last: float | None = None
        for when in events:
            if when != last:
                count += 1
                last = when
        return count

    def exposure_hours(self, pool: str, now: float) -> float:
        buckets = self._exposure.get(pool)
        if not buckets:
            return 0.0
        horizon = now - self.window_s
        while buckets and buckets[0][0] < horizon:
            buckets.popleft()
        return sum(b[1] for b in buckets) / 3600.0

    def risky_until(self, pool: str, now: float) -> float | None:
        events = self._events.get(pool)
        if not events:
            return None
        until = events[-1] + self.risky_ttl_s
        return until if until > now else None
