"""What an AWS pool costs: live spot prices (the latest per zone and type, read once per region
and cached for a TTL), on-demand list prices and Spot Advisor interruption rates from the shipped
catalogs, or every price from a SkyPilot-format catalog when one is configured."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from autoscaler.model import Pool, PriceQuote
from autoscaler.model.catalog import InstanceCatalog, SkyPilotCatalog, SpotAdvisor
from autoscaler.model.clock import Clock
from providers.aws.errors import typed
from providers.aws.instances import shapes
from providers.aws.sdk import Clients
from providers.aws.settings import AwsPoolOptions

PRODUCT = "Linux/UNIX"


class AwsPrices:
    def __init__(
        self,
        clients: Clients,
        pools: Mapping[str, Pool],
        options: Mapping[str, AwsPoolOptions],
        clock: Clock,
        ttl_s: float,
        catalog: InstanceCatalog,
        advisor: SpotAdvisor,
        price_catalog: SkyPilotCatalog | None,
    ) -> None:
        self.clients = clients
        self.pools = pools
        self.options = options
        self.clock = clock
        self.ttl_s = ttl_s
        self.catalog = catalog
        self.advisor = advisor
        self.price_catalog = price_catalog
        self._spot: dict[str, tuple[float, dict[tuple[str, str], float]]] = {}

    def prices(self, pools: Sequence[Pool]) -> list[PriceQuote]:
        now = self.clock.now()
        if self.price_catalog is not None:
            return self._catalog_prices(pools, self.price_catalog, now)
        quotes = []
        for pool in pools:
            on_demand = self._on_demand(pool)
            if pool.is_spot:
                price = self._spot_price(pool, now)
                rate = self.advisor.rate_per_hour(pool.region, pool.instance_type)
                source = "describe-spot-price-history"
            else:
                price, rate, source = on_demand, None, "catalog"
            if price is None:
                continue
            quotes.append(
                PriceQuote(
                    pool=pool.name,
                    price_per_hour=price,
                    on_demand_price_per_hour=on_demand,
                    interruption_rate_per_hour=rate,
                    as_of=now,
                    source=source,
                )
            )
        return quotes

    def _catalog_prices(
        self, pools: Sequence[Pool], catalog: SkyPilotCatalog, now: float
    ) -> list[PriceQuote]:
        quotes = []
        for pool in pools:
            listed = catalog.price(pool.instance_type, pool.region, pool.zone)
            if listed is None:
                continue
            price = listed.spot if pool.is_spot else listed.on_demand
            if price is None:
                continue
            quotes.append(
                PriceQuote(
                    pool=pool.name,
                    price_per_hour=price,
                    on_demand_price_per_hour=listed.on_demand,
                    interruption_rate_per_hour=self.advisor.rate_per_hour(
                        pool.region, pool.instance_type
                    )
                    if pool.is_spot
                    else None,
                    as_of=now,
                    source=catalog.path,
                )
            )
        return quotes

    def _on_demand(self, pool: Pool) -> float | None:
        known = self.catalog.get(pool.instance_type)
        return known.on_demand_price_per_hour if known else None

    def _spot_price(self, pool: Pool, now: float) -> float | None:
        """The cheapest current spot price among the pool's shapes, scaled to the pool's GPUs."""
        table = self._spot_table(pool.region, now)
        zones = set(self.options[pool.name].zones) or ({pool.zone} if pool.zone else set())
        best: float | None = None
        for shape in shapes(pool, self.options[pool.name]):
            kind = shape["InstanceType"]
            known = self.catalog.get(kind)
            scale = pool.gpus_per_instance / known.gpus if known and known.gpus else 1.0
            for (zone, instance_type), price in table.items():
                if instance_type == kind and (not zones or zone in zones):
                    value = price * scale
                    best = value if best is None else min(best, value)
        return best

    def _spot_table(self, region: str, now: float) -> dict[tuple[str, str], float]:
        cached = self._spot.get(region)
        if cached is not None and now - cached[0] < self.ttl_s:
            return cached[1]
        types = sorted(
            {
                s["InstanceType"]
                for p in self.pools.values()
                if p.region == region and p.is_spot
                for s in shapes(p, self.options[p.name])
            }
        )
        table: dict[tuple[str, str], tuple[float, float]] = {}
        if types:
            try:
                pages = (
                    self.clients.client("ec2", region)
                    .get_paginator("describe_spot_price_history")
                    .paginate(InstanceTypes=types, ProductDescriptions=[PRODUCT])
                )
                for page in pages:
                    for item in page.get("SpotPriceHistory", []):
                        key = (item["AvailabilityZone"], item["InstanceType"])
                        stamp = item["Timestamp"].timestamp()
                        if key not in table or table[key][0] < stamp:
                            table[key] = (stamp, float(item["SpotPrice"]))
            except Exception as exc:
                raise typed(exc) from None
        latest = {key: value for key, (_, value) in table.items()}
        self._spot[region] = (now, latest)
        return latest
