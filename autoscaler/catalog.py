"""Facts about instance types that no API call gives cheaply: on-demand prices and GPU counts
(shipped catalog) and interruption risk (AWS Spot Advisor buckets).

Both the live providers and the simulator read them, from the project's own data folder unless
told otherwise.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from autoscaler.csvfile import read_rows

DATA = Path(__file__).resolve().parent / "data"
AWS_CATALOG = DATA / "catalog" / "aws_gpu_instance_types.csv"
AWS_ADVISOR = DATA / "interruptions" / "aws_spot_advisor_gpu_interruption_buckets.csv"

# Spot Advisor buckets are ranges of monthly interruption frequency; we take each range's middle
# (and 25 % for the open ">20 %" bucket).
_BUCKET_MONTHLY = {0: 0.025, 1: 0.075, 2: 0.125, 3: 0.175, 4: 0.25}
_HOURS_PER_MONTH = 730.0


def bucket_rate_per_hour(bucket: int) -> float:
    monthly = _BUCKET_MONTHLY[bucket]
    return -math.log(1.0 - monthly) / _HOURS_PER_MONTH


class SpotAdvisor:
    """Interruption rate per instance-hour by region and instance type, from a bucket file."""

    def __init__(self, path: Path, snapshot: str | None = None) -> None:
        self.path = str(path)
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


@dataclass(frozen=True)
class InstanceType:
    name: str
    gpus: int
    gpu_model: str | None
    on_demand_price_per_hour: float | None
    price_region: str | None


class InstanceCatalog:
    """GPU instance types of one cloud: GPUs, model and a list on-demand price."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)
        self._types: dict[str, InstanceType] = {}
        for row in read_rows(path, ("instance_type", "accelerator_count")):
            name = row.text("instance_type")
            self._types[name] = InstanceType(
                name=name,
                gpus=row.integer("accelerator_count", minimum=0),
                gpu_model=row.text("accelerator_name") or None,
                on_demand_price_per_hour=row.optional_number("on_demand_price_per_hour", minimum=0),
                price_region=row.text("on_demand_price_region") or None,
            )

    def get(self, name: str) -> InstanceType | None:
        return self._types.get(name)
