"""Piecewise-constant functions of time: prices and spot availability in the simulator."""

from __future__ import annotations

import itertools
import math
from bisect import bisect_right
from collections.abc import Sequence


class StepSeries:
    """``values[i]`` holds from ``times[i]`` until ``times[i + 1]`` (the last one forever).

    With ``period`` set the series repeats: time ``t`` reads ``t mod period``. Before the first
    point the first value holds; loaders refuse series that would need that for a price.
    Times and the period are finite, the period positive and no value NaN (an infinite value is
    how the lower bound says "not on offer"); loaders check their files so that a series is
    never built otherwise: this raising is a bug.
    """

    __slots__ = ("_cumulative", "period", "times", "values")

    def __init__(
        self, times: Sequence[float], values: Sequence[float], period: float | None = None
    ) -> None:
        if not times or len(times) != len(values):
            raise ValueError("a series needs as many values as times, and at least one")
        if any(b < a for a, b in itertools.pairwise(times)):
            raise ValueError("series times must not go backwards")
        if not all(math.isfinite(t) for t in times) or any(math.isnan(v) for v in values):
            raise ValueError("series times must be finite, and values numbers")
        if period is not None and not (math.isfinite(period) and period > 0):
            raise ValueError(f"a series' period must be positive, got {period!r}")
        self.times = list(times)
        self.values = list(values)
        self.period = period
        cumulative = [0.0]
        for i in range(1, len(self.times)):
            cumulative.append(
                cumulative[-1] + self.values[i - 1] * (self.times[i] - self.times[i - 1])
            )
        self._cumulative = cumulative

    def at(self, t: float) -> float:
        if self.period is not None:
            t = self.times[0] + (t - self.times[0]) % self.period
        index = bisect_right(self.times, t) - 1
        return self.values[max(index, 0)]

    def _area_to(self, t: float) -> float:
        index = bisect_right(self.times, t) - 1
        if index < 0:
            return self.values[0] * (t - self.times[0])
        return self._cumulative[index] + self.values[index] * (t - self.times[index])

    def integral(self, start: float, end: float) -> float:
        """∫ value dt over [start, end] (value × seconds)."""
        if end <= start:
            return 0.0
        if self.period is None:
            return self._area_to(end) - self._area_to(start)
        origin = self.times[0]
        full_period = self._area_to(origin + self.period)

        period = self.period

        def area(t: float) -> float:
            cycles, rest = divmod(t - origin, period)
            return cycles * full_period + self._area_to(origin + rest)

        return area(end) - area(start)

    def next_change(self, t: float) -> float:
        """The first moment after ``t`` at which the value may change (``inf`` if never)."""
        if self.period is None:
            index = bisect_right(self.times, t)
            return self.times[index] if index < len(self.times) else math.inf
        origin = self.times[0]
        cycles, rest = divmod(t - origin, self.period)
        index = bisect_right(self.times, origin + rest)
        base = origin + cycles * self.period
        # rounding may land a step behind ``t``: walk on until past it, so callers that loop on
        # next_change always advance
        for _ in range(len(self.times) + 2):
            if index < len(self.times):
                change = base + (self.times[index] - origin)
                index += 1
            else:
                base += self.period
                change = base
                index = bisect_right(self.times, origin)
            if change > t:
                return change
        return math.nextafter(t, math.inf)

    def minimum(self, start: float, end: float) -> float:
        """The smallest value taken anywhere in [start, end)."""
        if self.period is not None and end - start >= self.period:
            return min(self.values)
        low = self.at(start)
        t = self.next_change(start)
        while t < end:
            low = min(low, self.at(t))
            t = self.next_change(t)
        return low
