"""What a GCP pool costs: the shipped Compute Engine price history (latest per region and machine
type) or a SkyPilot-format catalog, with attachable GPUs priced from the catalog's accelerator
rows. GCP publishes no interruption rates. A pool's price is the dearest of its zones: launches
spread over all of them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Protocol

from autoscaler.model import Pool, PriceQuote
from autoscaler.model.catalog import DATA, SKYPILOT_COLUMNS, CatalogPrice, SkyPilotCatalog
from autoscaler.model.clock import Clock
from autoscaler.model.csvfile import read_rows
from providers.gcp.settings import GcpPoolOptions

PRICE_HISTORY = DATA / "prices" / "gcp_gpu_vm_price_history.csv"


class PriceSource(Protocol):
    path: str

    def price(
        self, instance_type: str, region: str, zone: str | None = None
    ) -> CatalogPrice | None: ...


class GcpPriceHistory:
    """The latest spot and on-demand price per region (or zone) and machine type, from a
    change-point history (``timestamp, cloud, region, zone, instance_type, price_per_hour,
    on_demand_price_per_hour``; ``price_per_hour`` is the spot price). Each column keeps its own
    latest value, since spot prices begin later in the history than on-demand ones."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)
        latest: dict[tuple[str, str, str], dict[str, tuple[float, float]]] = {}
        columns = ("timestamp", "cloud", "region", "zone", "instance_type", "price_per_hour")
        for row in read_rows(path, (*columns, "on_demand_price_per_hour")):
            if row.text("cloud") != "gcp":
                continue
            when = row.timestamp("timestamp")
            key = (row.text("region"), row.text("zone"), row.text("instance_type"))
            kept = latest.setdefault(key, {})
            for column in ("price_per_hour", "on_demand_price_per_hour"):
                value = row.optional_number(column, minimum=0)
                if value is not None and (column not in kept or kept[column][0] <= when):
                    kept[column] = (when, value)
        self._prices = {
            key: CatalogPrice(
                on_demand=kept["on_demand_price_per_hour"][1]
                if "on_demand_price_per_hour" in kept
                else None,
                spot=kept["price_per_hour"][1] if "price_per_hour" in kept else None,
            )
            for key, kept in latest.items()
        }

    def price(
        self, instance_type: str, region: str, zone: str | None = None
    ) -> CatalogPrice | None:
        if zone and (region, zone, instance_type) in self._prices:
            return self._prices[(region, zone, instance_type)]
        return self._prices.get((region, "", instance_type))


class AcceleratorPrices:
    """Per-GPU prices of attachable GPUs from a SkyPilot-format catalog: its rows with an empty
    ``InstanceType`` and an ``AcceleratorName`` (N1 machines are priced without their GPUs)."""

    def __init__(self, path: Path) -> None:
        self._prices: dict[tuple[str, str, str], CatalogPrice] = {}
        for row in read_rows(path, SKYPILOT_COLUMNS):
            if row.text("InstanceType") or not row.text("AcceleratorName"):
                continue
            key = (
                _gpu(row.text("AcceleratorName")),
                row.text("Region"),
                row.text("AvailabilityZone"),
            )
            self._prices[key] = CatalogPrice(
                on_demand=row.optional_number("Price", minimum=0),
                spot=row.optional_number("SpotPrice", minimum=0),
            )

    def price(self, accelerator: str, region: str, zone: str) -> CatalogPrice | None:
        name = _gpu(accelerator)
        return self._prices.get((name, region, zone)) or self._prices.get((name, region, ""))


def _gpu(name: str) -> str:
    """``nvidia-tesla-t4`` and SkyPilot's ``T4`` name the same GPU."""
    lowered = name.strip().lower()
    for prefix in ("nvidia-tesla-", "nvidia-"):
        if lowered.startswith(prefix):
            return lowered[len(prefix) :]
    return lowered


class GcpPrices:
    def __init__(
        self,
        options: Mapping[str, GcpPoolOptions],
        zones: Mapping[str, tuple[str, ...]],
        clock: Clock,
        price_catalog: str | None,
    ) -> None:
        self.options = options
        self.zones = zones
        self.clock = clock
        self.source: PriceSource
        self.accelerators: AcceleratorPrices | None = None
        if price_catalog:
            self.source = SkyPilotCatalog(Path(price_catalog))
            self.accelerators = AcceleratorPrices(Path(price_catalog))
            self.label = "skypilot-catalog"
        else:
            self.source = GcpPriceHistory(PRICE_HISTORY)
            self.label = "gcp-price-history"

    def prices(self, pools: Sequence[Pool]) -> list[PriceQuote]:
        now = self.clock.now()
        quotes = []
        for pool in pools:
            price = self._price(pool)
            if price is None:
                continue
            value = price.spot if pool.is_spot else price.on_demand
            if value is None:
                continue
            quotes.append(
                PriceQuote(
                    pool=pool.name,
                    price_per_hour=value,
                    on_demand_price_per_hour=price.on_demand,
                    interruption_rate_per_hour=None,
                    as_of=now,
                    source=self.label,
                )
            )
        return quotes

    def _price(self, pool: Pool) -> CatalogPrice | None:
        options = self.options.get(pool.name)
        zones = self.zones.get(pool.name) or ((pool.zone,) if pool.zone else ("",))
        found: list[CatalogPrice] = []
        for zone in zones:
            price = self.source.price(pool.instance_type, pool.region, zone or None)
            if price is None:
                return None
            if options is not None and options.accelerator_type:
                gpu = (
                    self.accelerators.price(options.accelerator_type, pool.region, zone)
                    if self.accelerators is not None
                    else None
                )
                if gpu is None:
                    return None  # a machine without its GPUs' price would look far too cheap
                count = options.accelerator_count or pool.gpus_per_instance
                price = CatalogPrice(
                    on_demand=_plus(price.on_demand, gpu.on_demand, count),
                    spot=_plus(price.spot, gpu.spot, count),
                )
            found.append(price)
        return CatalogPrice(
            on_demand=_dearest([p.on_demand for p in found]),
            spot=_dearest([p.spot for p in found]),
        )


def _plus(machine: float | None, gpu: float | None, count: int) -> float | None:
    return None if machine is None or gpu is None else machine + gpu * count


def _dearest(values: Sequence[float | None]) -> float | None:
    return None if any(v is None for v in values) else max(v for v in values if v is not None)
