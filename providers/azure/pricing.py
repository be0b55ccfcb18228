"""What an Azure pool costs: the public Azure Retail Prices API (spot and on-demand Linux meters,
cached for a TTL; no credentials), or a SkyPilot-format catalog CSV where it prices the pool's
market. Azure quotes no interruption rate."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.error import HTTPError, URLError
from urllib.parse import quote
from urllib.request import urlopen

from autoscaler.model import Pool, PriceQuote
from autoscaler.model.catalog import SkyPilotCatalog
from autoscaler.model.clock import Clock
from autoscaler.model.errors import ProviderError, TransientError
from providers.azure.errors import error_code, retry_after
from providers.azure.settings import AzureSettings

log = logging.getLogger(__name__)

MAX_PRICE_PAGES = 50


@dataclass(frozen=True)
class _Retail:
    fetched_at: float
    spot: float | None
    on_demand: float | None


class AzurePrices:
    def __init__(
        self, settings: AzureSettings, clock: Clock, catalog: SkyPilotCatalog | None
    ) -> None:
        self.settings = settings
        self.clock = clock
        self.catalog = catalog
        self._retail: dict[tuple[str, str], _Retail] = {}

    def prices(self, pools: Sequence[Pool]) -> list[PriceQuote]:
        """Quotes for the pools that can be priced. A pool the price source failed for is left
        out (the controller keeps its last quote); the error is raised only when no pool could
        be priced at all."""
        now = self.clock.now()
        quotes = []
        errors: list[ProviderError] = []
        for pool in pools:
            try:
                spot, on_demand, source = self._price(pool, now)
            except ProviderError as exc:
                errors.append(exc)
                continue
            price = spot if pool.is_spot else on_demand
            if price is None:
                continue
            quotes.append(
                PriceQuote(
                    pool=pool.name,
                    price_per_hour=price,
                    on_demand_price_per_hour=on_demand,
                    interruption_rate_per_hour=None,
                    as_of=now,
                    source=source,
                )
            )
        if errors and not quotes:
            raise errors[0]
        for error in errors:
            log.warning("prices: %s", error)
        return quotes

    def _price(self, pool: Pool, now: float) -> tuple[float | None, float | None, str]:
        """(spot, on-demand, source) per hour of one VM: the catalog's row when it prices the
        pool's market, else the Retail Prices API."""
        if self.catalog is not None:
            row = self.catalog.price(pool.instance_type, pool.region, pool.zone)
            if row is not None and (row.spot if pool.is_spot else row.on_demand) is not None:
                return row.spot, row.on_demand, "catalog"
        if self.settings.retail_prices_url is None:
            return None, None, ""
        retail = self._retail_prices(pool.region, pool.instance_type, now)
        return retail.spot, retail.on_demand, "azure-retail-prices"

    def _retail_prices(self, region: str, size: str, now: float) -> _Retail:
        key = (region, size)
        cached = self._retail.get(key)
        if cached is not None and now - cached.fetched_at < self.settings.price_ttl_s:
            return cached
        expression = (
            "serviceName eq 'Virtual Machines' and priceType eq 'Consumption' "
            f"and armRegionName eq '{region}' and armSkuName eq '{size}'"
        )
        spot: list[float] = []
        on_demand: list[float] = []
        for item in self._price_items(expression):
            meter = f"{item.get('meterName', '')} {item.get('skuName', '')}"
            if (
                "Windows" in str(item.get("productName", ""))
                or "Low Priority" in meter
                or item.get("unitOfMeasure", "1 Hour") != "1 Hour"
            ):
                continue
            price = float(item.get("retailPrice", item.get("unitPrice", 0.0)))
            (spot if "Spot" in meter else on_demand).append(price)
        retail = _Retail(now, min(spot, default=None), min(on_demand, default=None))
        self._retail[key] = retail
        return retail

    def _price_items(self, expression: str) -> Iterable[Mapping[str, Any]]:
        """Every item the Retail Prices API returns for a filter, following ``NextPageLink``."""
        assert self.settings.retail_prices_url is not None
        url: str | None = f"{self.settings.retail_prices_url}?$filter={quote(expression)}"
        items: list[Mapping[str, Any]] = []
        pages = 0
        while url and pages < MAX_PRICE_PAGES:
            pages += 1
            page = _get_json(url, self.settings.read_timeout_s)
            items.extend(page.get("Items") or [])
            url = page.get("NextPageLink") or None
        return items


def _get_json(url: str, timeout: float) -> dict[str, Any]:
    """One GET of the public Retail Prices API (no credentials), errors typed."""
    try:
        with urlopen(url, timeout=timeout) as response:
            return dict(json.loads(response.read()))
    except HTTPError as exc:
        try:
            body = json.loads(exc.read() or b"{}")
        except ValueError:
            body = {}
        error = body.get("Error") or body.get("error") or {}
        code = error.get("Code") or error.get("code")
        message = str(error.get("Message") or error.get("message") or exc.reason)
        raise error_code(code, exc.code, message, None, retry_after(dict(exc.headers))) from None
    except (URLError, TimeoutError, OSError, ValueError) as exc:
        raise TransientError(
            f"retail prices: {type(exc).__name__}: {exc}", code="PriceApi"
        ) from None
