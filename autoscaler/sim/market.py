"""Where the simulator's prices and interruptions come from: the shipped real data.

* Prices: CSVs with ``timestamp, cloud, region, zone, instance_type`` and ``price_per_hour`` (spot)
  and/or ``on_demand_price_per_hour``, in change-point form: a row holds until the next row of
  the same series. A pool reads the rows of its cloud, region and instance type (and zone, where
  the scenario names one); zonal rows without a chosen zone are combined as the median of the
  zones' latest prices at each change.
* Availability: the run-length-encoded spot availability traces. A 1-node trace says whether a
  spot instance could be had at all (capacity unlimited or none); a multi-node trace caps the
  pool at the number of instances available. A trace's runs last at least ``MIN_RUN_S`` each
  and do not overlap (the shipped traces' shortest run is 150 s), so a replay meets at most one
  capacity change a minute, however the trace loops.
"""

from __future__ import annotations

import itertools
import math
import re
import statistics
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from autoscaler.model.csvfile import read_rows
from autoscaler.model.errors import InputError
from autoscaler.sim.series import StepSeries

PRICE_COLUMNS = ("timestamp", "cloud", "region", "instance_type")
MIN_RUN_S = 60.0
MAX_TRACKED = 100_000  # nodes an availability trace may say it tracked
_TRACKED = re.compile(r"^([0-9]{1,6})(?:-|$)")


@dataclass(frozen=True)
class PriceRow:
    time: float
    cloud: str
    region: str
    zone: str
    instance_type: str
    spot: float | None
    on_demand: float | None
    where: str


class PriceBook:
    """Every price row of the scenario's price files, indexed for per-pool lookup."""

    def __init__(self, files: Iterable[Path]) -> None:
        self.files = [str(f) for f in files]
        self._rows: dict[tuple[str, str, str], list[PriceRow]] = {}
        for path in files:
            for row in read_rows(path, PRICE_COLUMNS):
                has_spot = "price_per_hour" in row.values
                has_od = "on_demand_price_per_hour" in row.values
                if not (has_spot or has_od):
                    raise InputError(
                        f"{path}:1", "expected a price_per_hour or on_demand_price_per_hour column"
                    )
                record = PriceRow(
                    time=row.timestamp("timestamp"),
                    cloud=row.text("cloud"),
                    region=row.text("region"),
                    zone=row.text("zone"),
                    instance_type=row.text("instance_type"),
                    spot=row.optional_number("price_per_hour", minimum=0) if has_spot else None,
                    on_demand=row.optional_number("on_demand_price_per_hour", minimum=0)
                    if has_od
                    else None,
                    where=row.where,
                )
                key = (record.cloud, record.region, record.instance_type)
                self._rows.setdefault(key, []).append(record)

    def series(
        self,
        cloud: str,
        region: str,
        instance_type: str,
        *,
        spot: bool,
        zone: str | None,
        origin: float,
    ) -> StepSeries | None:
        """The pool's price over replay time (seconds after ``origin``), or None if not found."""
        rows = [
            r
            for r in self._rows.get((cloud, region, instance_type), [])
            if (r.spot if spot else r.on_demand) is not None
        ]
        if zone:
            rows = [r for r in rows if r.zone == zone]
        elif any(not r.zone for r in rows):
            rows = [r for r in rows if not r.zone]
        if not rows:
            return None
        rows.sort(key=lambda r: (r.time, r.zone))
        latest: dict[str, float] = {}
        times: list[float] = []
        values: list[float] = []
        for row in rows:
            value = row.spot if spot else row.on_demand
            assert value is not None
            latest[row.zone] = value
            combined = statistics.median(latest.values())
            t = row.time - origin
            if times and times[-1] == t:
                values[-1] = combined
            else:
                times.append(t)
                values.append(combined)
        return StepSeries(times, values)


@dataclass(frozen=True)
class AvailabilityTrace:
    trace_id: str
    nodes_tracked: int
    series: StepSeries

    def capacity(self, t: float) -> float:
        available = self.series.at(t)
        if self.nodes_tracked <= 1:
            return math.inf if available >= 1 else 0.0
        return available

    def next_change(self, t: float) -> float:
        return self.series.next_change(t)


class AvailabilityFile:
    """The availability runs file, read once; traces are cut from it by id."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)
        self._runs: dict[str, list[tuple[float, float, float, int, int]]] = {}
        for row in read_rows(
            path,
            ("trace_id", "nodes_tracked", "start_elapsed_s", "duration_s", "available_instances"),
        ):
            tracked = _TRACKED.match(row.text("nodes_tracked"))
            if tracked is None or not 0 < int(tracked.group(1)) <= MAX_TRACKED:
                raise row.error(
                    "nodes_tracked",
                    f"expected a count from 1 to {MAX_TRACKED:,} such as '1-node', got "
                    f"{row.text('nodes_tracked')[:40]!r}",
                )
            self._runs.setdefault(row.text("trace_id"), []).append(
                (
                    row.number("start_elapsed_s", minimum=0),
                    row.number("duration_s", minimum=MIN_RUN_S),
                    row.number("available_instances", minimum=0, maximum=MAX_TRACKED),
                    int(tracked.group(1)),
                    row.line,
                )
            )

    def trace(self, trace_id: str, offset_s: float, loop: bool) -> AvailabilityTrace:
        runs = sorted(self._runs.get(trace_id, []))
        if not runs:
            raise InputError(self.path, f"no availability runs for trace {trace_id!r}")
        for (start, duration, _, _, _), (next_start, _, _, _, line) in itertools.pairwise(runs):
            if next_start < start + duration:
                raise InputError(
                    f"{self.path}:{line}",
                    f"this run of trace {trace_id!r} starts at {next_start:g} s, before the "
                    f"run before it ends ({start + duration:g} s)",
                    field="start_elapsed_s",
                )
        times = [start - offset_s for start, _, _, _, _ in runs]
        values = [available for _, _, available, _, _ in runs]
        end = max(start + duration for start, duration, _, _, _ in runs) - offset_s
        series = StepSeries(times, values, period=(end - times[0]) if loop else None)
        return AvailabilityTrace(trace_id, runs[0][3], series)
