"""Where the simulator's prices and interruptions come from: the shipped real data.

* Prices: CSVs with ``timestamp, cloud, region, zone, instance_type`` and ``price_per_hour`` (spot)
  and/or ``on_demand_price_per_hour``, in change-point form: a row holds until the next row of
  the same series. A pool reads the rows of its cloud, region and instance type (and zone, where
  the scenario names one); zonal rows without a chosen zone are combined as the median of the
  zones' latest prices at each change.
* Availability: the run-length-encoded spot availability traces. A 1-node trace says whether a
  spot instance could be had at all (capacity unlimited or none); a multi-node trace caps the
  pool at the number of instances available.
* Risk: AWS Spot Advisor buckets, turned into an hourly interruption rate.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from autoscaler.errors import InputError
from autoscaler.sim.csvfile import read_rows
from autoscaler.sim.series import StepSeries

PRICE_COLUMNS = ("timestamp", "cloud", "region", "instance_type")


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
        self._runs: dict[str, list[tuple[float, float, float, int]]] = {}
        for row in read_rows(
            path,
            ("trace_id", "nodes_tracked", "start_elapsed_s", "duration_s", "available_instances"),
        ):
            tracked = row.text("nodes_tracked").split("-", 1)[0]
            if not tracked.isdigit():
                raise row.error(
                    "nodes_tracked",
                    f"expected a count such as '1-node', got {row.text('nodes_tracked')!r}",
                )
            self._runs.setdefault(row.text("trace_id"), []).append(
                (
                    row.number("start_elapsed_s", minimum=0),
                    row.number("duration_s", minimum=0),
                    row.number("available_instances", minimum=0),
                    int(tracked),
                )
            )

    def trace(self, trace_id: str, offset_s: float, loop: bool) -> AvailabilityTrace:
        runs = sorted(self._runs.get(trace_id, []))
        if not runs:
            raise InputError(self.path, f"no availability runs for trace {trace_id!r}")
        times = [start - offset_s for start, _, _, _ in runs]
        values = [available for _, _, available, _ in runs]
        end = max(start + duration for start, duration, _, _ in runs) - offset_s
        series = StepSeries(times, values, period=(end - times[0]) if loop else None)
        return AvailabilityTrace(trace_id, runs[0][3], series)


# Spot Advisor buckets are ranges of monthly interruption frequency; we take each range's middle
# (and 25 % for the open ">20 %" bucket).
_BUCKET_MONTHLY = {0: 0.025, 1: 0.075, 2: 0.125, 3: 0.175, 4: 0.25}
_HOURS_PER_MONTH = 730.0


def bucket_rate_per_hour(bucket: int) -> float:
    monthly = _BUCKET_MONTHLY[bucket]
    return -math.log(1.0 - monthly) / _HOURS_PER_MONTH


class SpotAdvisor:
    def __init__(self, path: Path, snapshot: str | None) -> None:
        self.path = str(path)
        self._buckets: dict[tuple[str, str], int] = {}
        chosen: dict[tuple[str, str], tuple[str, int]] = {}
        for row in read_rows(
            path, ("snapshot_date", "region", "instance_type", "interruption_bucket")
        ):
            date = row.text("snapshot_date")
            if snapshot is not None and date != snapshot:
                continue
            bucket = row.integer("interruption_bucket", minimum=0)
            if bucket not in _BUCKET_MONTHLY:
                raise row.error("interruption_bucket", f"expected 0 to 4, got {bucket}")
            key = (row.text("region"), row.text("instance_type"))
            if key not in chosen or chosen[key][0] < date:
                chosen[key] = (date, bucket)
        self._buckets = {k: v[1] for k, v in chosen.items()}

    def rate_per_hour(self, region: str, instance_type: str) -> float | None:
        bucket = self._buckets.get((region, instance_type))
        return None if bucket is None else bucket_rate_per_hour(bucket)
