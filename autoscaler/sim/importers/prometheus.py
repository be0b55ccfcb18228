"""A Prometheus range query's answer (``/api/v1/query_range`` JSON) as pending or running GPUs
over time, and two of them as a demand series.

Export one answer for pending GPUs and one for running GPUs, e.g.::

    curl -G http://prometheus:9090/api/v1/query_range \\
      --data-urlencode 'query=sum(slurm_gpus_pending)' \\
      --data-urlencode start=2024-05-01T00:00:00Z --data-urlencode end=2024-05-08T00:00:00Z \\
      --data-urlencode step=60 > pending.json

An answer with several series (one per partition, say) is their sum. Inside a series' own span
a missing step keeps the series' last value (a failed scrape); before a series starts and after
it stops it counts 0 (a label that exists only while it has demand). The demand series runs over
the times both answers cover.
"""

from __future__ import annotations

import re
from bisect import bisect_right
from dataclasses import dataclass
from pathlib import Path

from autoscaler.model.csvfile import EARLIEST, LATEST
from autoscaler.model.errors import InputError
from autoscaler.sim.demand_series import MAX_SERIES_GPUS
from autoscaler.sim.importers.jsonfile import JsonDocument, Reader, decode, shown

WHAT = "a Prometheus /api/v1/query_range answer (JSON with data.resultType matrix)"
_VALUE = re.compile(r"^[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]{1,4})?$")
MAX_SERIES = 1_000


@dataclass(frozen=True)
class Series:
    """One series of an answer: its labels (for messages) and its (time, value) points."""

    labels: str
    times: list[float]
    values: list[float]


@dataclass(frozen=True)
class Answer:
    source: str
    series: list[Series]

    @property
    def first(self) -> float:
        return min(s.times[0] for s in self.series)

    @property
    def last(self) -> float:
        return max(s.times[-1] for s in self.series)

    def at(self, t: float) -> float:
        """The answer's value at ``t``: the sum of its series (see the module's docstring)."""
        total = 0.0
        for series in self.series:
            if series.times[0] <= t <= series.times[-1]:
                total += series.values[bisect_right(series.times, t) - 1]
        return total

    def gaps(self, times: list[float]) -> int:
        """Steps of ``times`` inside a series' span where it has no point of its own."""
        count = 0
        for series in self.series:
            own = set(series.times)
            count += sum(
                1 for t in times if series.times[0] <= t <= series.times[-1] and t not in own
            )
        return count


def read_answer(path: Path) -> Answer:
    document = decode(path, WHAT)
    root = Reader(document, document.data, ())
    if not isinstance(root.value, dict):
        raise document.error((), f"expected {WHAT}")
    status = root.optional("status")
    if status is not None and status.value != "success":
        error = root.optional("error")
        said = f": {shown(error.value)}" if error is not None else ""
        raise status.error(f"the query failed{said}; export an answer whose status is success")
    data = root.get("data")
    kind = data.get("resultType").text()
    if kind != "matrix":
        hint = " (an instant /api/v1/query answer; export /api/v1/query_range)" if kind else ""
        raise data.error(f"expected resultType matrix, got {shown(kind)}{hint}", "resultType")
    results = data.get("result").items()
    if not results:
        raise data.error("the answer holds no series (the query matched nothing)", "result")
    if len(results) > MAX_SERIES:
        raise data.error(f"{len(results):,} series; at most {MAX_SERIES:,} are summed", "result")
    return Answer(str(path), [_series(document, result) for result in results])


def _series(document: JsonDocument, result: Reader) -> Series:
    metric = result.optional("metric")
    labels = "{}"
    if metric is not None:
        if not isinstance(metric.value, dict):
            raise metric.error("expected the series' labels (an object)")
        labels = "{" + ",".join(f"{k}={v!r}" for k, v in sorted(metric.value.items())) + "}"
    if result.has("histograms"):
        raise result.error("native histograms are not GPU counts; query a gauge", "histograms")
    points = result.get("values").items()
    if not points:
        raise result.error("the series has no points", "values")
    times: list[float] = []
    values: list[float] = []
    for point in points:
        pair = point.items()
        if len(pair) != 2:
            raise point.error(f"expected [time, value], got {len(pair)} items")
        t = pair[0].number()
        if not EARLIEST <= t < LATEST:
            raise pair[0].error(f"expected a time between 1970 and 2100, got {shown(t)}")
        if times and t <= times[-1]:
            raise pair[0].error(f"expected a time after the previous point's {times[-1]:g}")
        raw = pair[1].text()
        if not _VALUE.match(raw):
            raise pair[1].error(
                f"expected a finite number of GPUs, got {shown(raw)} (a query that can be "
                "empty or NaN: wrap it, e.g. sum(...) or vector(0))"
            )
        value = float(raw)
        if not 0 <= value <= MAX_SERIES_GPUS:
            raise pair[1].error(f"expected GPUs from 0 to {MAX_SERIES_GPUS:,}, got {shown(raw)}")
        times.append(t)
        values.append(value)
    return Series(labels, times, values)


def demand_from_answers(
    pending: Answer, running: Answer
) -> tuple[list[tuple[float, float, float]], int]:
    """(time, pending GPUs, running GPUs) at every time either answer has a point where both
    cover, and how many series steps were filled with a series' last value."""
    start = max(pending.first, running.first)
    end = min(pending.last, running.last)
    if end <= start:
        raise InputError(
            running.source,
            f"the pending answer ({pending.source}) and this one share no time range: "
            "export both over the same start and end",
        )
    times = sorted(
        {
            t
            for answer in (pending, running)
            for series in answer.series
            for t in series.times
            if start <= t <= end
        }
    )
    samples = [(t, pending.at(t), running.at(t)) for t in times]
    return samples, pending.gaps(times) + running.gaps(times)
