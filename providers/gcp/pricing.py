"""What a GCP pool costs: the shipped Compute Engine price history (latest per region and machine
type) or a SkyPilot-format catalog, with attachable GPUs priced from the catalog's accelerator
rows; where neither prices a pool, the shipped machine-type catalog's list price for its region.
GCP publishes no interruption rates. A pool's price is the dearest of its zones: launches spread
over all of them. A pool nothing prices gets no quote (a guessed price would mislead the policy
and the budget), and one warning says so and what to do."""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Protocol

from autoscaler.model import Pool, PriceQuote
from autoscaler.model.catalog import (
    DATA,
    GCP_CATALOG,
    SKYPILOT_COLUMNS,
    CatalogPrice,
    SkyPilotCatalog,
)
from autoscaler.model.clock import Clock
from autoscaler.model.csvfile import read_rows
from providers.gcp.settings import GcpPoolOptions

log = logging.getLogger(__name__)

PRICE_HISTORY = DATA / "prices" / "gcp_gpu_vm_price_history.csv"
LIST_PRICE_LABEL = "gcp-catalog-list-price"


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


# a region's list-price columns: on_demand_price_per_hour_us_central1 -> us-central1
_LIST_COLUMN = re.compile(r"^(on_demand|spot)_price_per_hour_([a-z0-9_]+)$")


class GcpListPrices:
    """One snapshot of list prices per GPU machine type, from the shipped machine-type catalog
    (``instance_type``, ``on_demand_price_per_hour_<region>``, ``spot_price_per_hour_<region>``
    and ``price_as_of``; us-central1 is its only region today). Used only where the price
    history, or the configured catalog, has no price for a pool: it is not a history, and it
    says so in the quote's source. Its cheapest-region columns (``min_*``) are the price of no
    region in particular and are never used, so a pool outside the catalog's regions stays
    unpriced rather than looking cheaper than it is."""

    def __init__(self, path: Path = GCP_CATALOG) -> None:
        self.path = str(path)
        self._prices: dict[tuple[str, str], CatalogPrice] = {}
        self._as_of: dict[str, str] = {}
        regions: set[str] = set()
        for row in read_rows(path, ("instance_type", "price_as_of")):
            columns: dict[str, dict[str, float | None]] = {}
            for column in row.values:
                found = _LIST_COLUMN.match(column)
                if found:
                    market, region = found.group(1), found.group(2).replace("_", "-")
                    value = row.optional_number(column, minimum=0)
                    columns.setdefault(region, {})[market] = value
            name = row.text("instance_type")
            for region, markets in columns.items():
                regions.add(region)
                if markets.get("on_demand") is None and markets.get("spot") is None:
                    continue
                self._prices[(region, name)] = CatalogPrice(
                    on_demand=markets.get("on_demand"), spot=markets.get("spot")
                )
            self._as_of[name] = row.text("price_as_of")
        self.regions = tuple(sorted(regions))

    def price(
        self, instance_type: str, region: str, zone: str | None = None
    ) -> CatalogPrice | None:
        return self._prices.get((region, instance_type))

    def as_of(self, instance_type: str) -> str:
        """The date of the machine type's list price (``2026-07-30``), for the quote's source."""
        return self._as_of.get(instance_type, "")[:10]


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
        list_prices: GcpListPrices | None = None,
    ) -> None:
        self.options = options
        self.zones = zones
        self.clock = clock
        self.source: PriceSource
        self.accelerators: AcceleratorPrices | None = None
        self.price_catalog = price_catalog
        if price_catalog:
            self.source = SkyPilotCatalog(Path(price_catalog))
            self.accelerators = AcceleratorPrices(Path(price_catalog))
            self.label = "skypilot-catalog"
        else:
            self.source = GcpPriceHistory(PRICE_HISTORY)
            self.label = "gcp-price-history"
        self.list_prices = list_prices if list_prices is not None else GcpListPrices()
        # pools already warned about: the warning is said once, not on every tick
        self._warned: set[str] = set()

    def prices(self, pools: Sequence[Pool]) -> list[PriceQuote]:
        now = self.clock.now()
        quotes = []
        for pool in pools:
            found = self._price(pool)
            if found is None:
                self._warn_unpriced(pool)
                continue
            value, on_demand, source = found
            quotes.append(
                PriceQuote(
                    pool=pool.name,
                    price_per_hour=value,
                    on_demand_price_per_hour=on_demand,
                    interruption_rate_per_hour=None,
                    as_of=now,
                    source=source,
                )
            )
        return quotes

    def _price(self, pool: Pool) -> tuple[float, float | None, str] | None:
        """(the pool's price, the on-demand price, where they came from): the history (or the
        configured catalog), else the shipped list price; None when neither prices the pool's
        market."""
        options = self.options.get(pool.name)
        price = self._zones_price(pool, options, self.source, self.accelerators)
        value = _market(price, pool)
        if price is not None and value is not None:
            return value, price.on_demand, self.label
        if options is not None and options.accelerator_type:
            return None  # the list prices machine types with their own GPUs, not attached ones
        listed = self._zones_price(pool, options, self.list_prices, None)
        value = _market(listed, pool)
        if listed is not None and value is not None:
            as_of = self.list_prices.as_of(pool.instance_type)
            return value, listed.on_demand, f"{LIST_PRICE_LABEL} ({pool.region}, {as_of})"
        return None

    def _zones_price(
        self,
        pool: Pool,
        options: GcpPoolOptions | None,
        source: PriceSource,
        accelerators: AcceleratorPrices | None,
    ) -> CatalogPrice | None:
        zones = self.zones.get(pool.name) or ((pool.zone,) if pool.zone else ("",))
        found: list[CatalogPrice] = []
        for zone in zones:
            price = source.price(pool.instance_type, pool.region, zone or None)
            if price is None:
                return None
            if options is not None and options.accelerator_type:
                gpu = (
                    accelerators.price(options.accelerator_type, pool.region, zone)
                    if accelerators is not None
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

    def _warn_unpriced(self, pool: Pool) -> None:
        """Once per pool: a pool without a price is never launched (the policy skips it, and
        plan shows its price as unknown), which is silent otherwise."""
        if pool.name in self._warned:
            return
        self._warned.add(pool.name)
        options = self.options.get(pool.name)
        market = "spot" if pool.is_spot else "on-demand"
        primary = (
            f"providers.gcp.price_catalog ({self.price_catalog})"
            if self.price_catalog
            else "the shipped price history"
        )
        if options is not None and options.accelerator_type:
            why = (
                f"{primary} has no {market} price for {pool.instance_type} with "
                f"{options.accelerator_type} GPUs in {pool.region} (attached GPUs are priced "
                "only from a price_catalog's GPU rows)"
            )
        else:
            regions = ", ".join(self.list_prices.regions) or "no region"
            why = (
                f"neither {primary} nor the shipped catalog's list prices ({regions} only) "
                f"have a {market} price for {pool.instance_type} in {pool.region}"
            )
        log.warning(
            "gcp pool %s has no price: %s; a pool without a price is never launched. Give "
            "providers.gcp.price_catalog, a SkyPilot-format CSV that prices it (docs/gcp.md, "
            "Prices)",
            pool.name,
            why,
        )


def _market(price: CatalogPrice | None, pool: Pool) -> float | None:
    if price is None:
        return None
    return price.spot if pool.is_spot else price.on_demand


def _plus(machine: float | None, gpu: float | None, count: int) -> float | None:
    return None if machine is None or gpu is None else machine + gpu * count


def _dearest(values: Sequence[float | None]) -> float | None:
    return None if any(v is None for v in values) else max(v for v in values if v is not None)
