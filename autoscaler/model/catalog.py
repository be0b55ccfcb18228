"""Facts about instance types that no API call gives cheaply: on-demand prices and GPU counts
(shipped catalog) and interruption risk (AWS Spot Advisor buckets).

Both the live providers and the simulator read them, from the project's own data folder unless
told otherwise.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from pathlib import Path

from autoscaler.model.csvfile import read_rows
from autoscaler.model.gpus import memory_gib

DATA = Path(__file__).resolve().parent.parent / "data"
AWS_CATALOG = DATA / "catalog" / "aws_gpu_instance_types.csv"
GCP_CATALOG = DATA / "catalog" / "gcp_gpu_machine_types.csv"
AZURE_CATALOG = DATA / "catalog" / "azure_gpu_vm_sizes.csv"
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


SKYPILOT_COLUMNS = (
    "InstanceType",
    "AcceleratorName",
    "AcceleratorCount",
    "vCPUs",
    "MemoryGiB",
    "Price",
    "SpotPrice",
    "Region",
    "AvailabilityZone",
)


@dataclass(frozen=True)
class CatalogPrice:
    on_demand: float | None
    spot: float | None


class SkyPilotCatalog:
    """A SkyPilot-format catalog CSV (``InstanceType, AcceleratorName, AcceleratorCount, vCPUs,
    MemoryGiB, Price, SpotPrice, Region, AvailabilityZone``), so users can bring the catalogs they
    already keep, for any cloud. A zone's row wins over the region's; a region's price is its
    cheapest zone's when only zonal rows exist."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)
        self._rows: dict[tuple[str, str], list[tuple[str, CatalogPrice]]] = {}
        self._gpus: dict[str, tuple[int, str | None]] = {}
        for row in read_rows(path, SKYPILOT_COLUMNS):
            name = row.text("InstanceType")
            price = CatalogPrice(
                on_demand=row.optional_number("Price", minimum=0),
                spot=row.optional_number("SpotPrice", minimum=0),
            )
            key = (name, row.text("Region"))
            self._rows.setdefault(key, []).append((row.text("AvailabilityZone"), price))
            count = row.optional_number("AcceleratorCount", minimum=0)
            if count is not None:
                self._gpus[name] = (int(count), row.text("AcceleratorName") or None)

    def price(
        self, instance_type: str, region: str, zone: str | None = None
    ) -> CatalogPrice | None:
        rows = self._rows.get((instance_type, region))
        if not rows:
            return None
        if zone:
            for row_zone, price in rows:
                if row_zone == zone:
                    return price
        regional = [price for row_zone, price in rows if not row_zone]
        if regional:
            return regional[0]
        spots = [p.spot for _, p in rows if p.spot is not None]
        demands = [p.on_demand for _, p in rows if p.on_demand is not None]
        return CatalogPrice(min(demands) if demands else None, min(spots) if spots else None)

    def gpus(self, instance_type: str) -> tuple[int, str | None] | None:
        return self._gpus.get(instance_type)


@dataclass(frozen=True)
class GpuFacts:
    """What a cloud's catalog says of one instance type's GPUs."""

    catalog: str
    gpus: int
    gpu_model: str | None
    gpu_memory_gib: float | None


_SHIPPED = {"aws": AWS_CATALOG, "gcp": GCP_CATALOG, "azure": AZURE_CATALOG}
_MEMORY_COLUMNS = (
    ("accelerator_memory_mib_per_device", 1 / 1024),
    ("accelerator_memory_gib_per_device", 1.0),
)


@functools.cache
def _shipped_gpu_facts(provider: str) -> dict[str, GpuFacts]:
    path = _SHIPPED.get(provider)
    if path is None:
        return {}
    facts: dict[str, GpuFacts] = {}
    for row in read_rows(path, ("instance_type", "accelerator_count")):
        model = row.text("accelerator_name") if "accelerator_name" in row.values else ""
        memory = None
        for column, scale in _MEMORY_COLUMNS:
            if column in row.values and row.text(column):
                memory = row.number(column, minimum=0) * scale
        if memory is None:
            memory = memory_gib(model)
        facts[row.text("instance_type")] = GpuFacts(
            path.name, row.integer("accelerator_count", minimum=0), model or None, memory or None
        )
    return facts


def gpu_facts(provider: str, instance_type: str) -> GpuFacts | None:
    """The shipped catalog's GPUs for a provider's instance type; None when it has no entry."""
    return _shipped_gpu_facts(provider).get(instance_type)
