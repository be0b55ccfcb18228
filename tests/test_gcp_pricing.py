"""What a GCP pool costs where the shipped price history has no price: the shipped machine-type
catalog's list price for the pool's region, marked as such in the quote's source, and otherwise
no quote and one warning per pool (a pool without a price is never launched, which was silent).

The catalog and the history are read independently here (csv module) to check the figures."""

from __future__ import annotations

import csv
import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from gcp_emulator import IMAGE, PROJECT, REGION, ComputeEmulator
from hypothesis import given, settings
from hypothesis import strategies as st
from waits import bound

from autoscaler.model import Pool
from autoscaler.model.catalog import DATA, GCP_CATALOG, SKYPILOT_COLUMNS
from autoscaler.model.clock import ManualClock
from providers.gcp.pricing import LIST_PRICE_LABEL, GcpListPrices, GcpPriceHistory, GcpPrices
from providers.gcp.settings import GcpPoolOptions

START = 1_700_000_000.0
LOGGER = "providers.gcp.pricing"
HISTORY = DATA / "prices" / "gcp_gpu_vm_price_history.csv"


def catalog_rows() -> dict[str, dict[str, str]]:
    with GCP_CATALOG.open() as handle:
        return {row["instance_type"]: row for row in csv.DictReader(handle)}


def history_types() -> set[tuple[str, str]]:
    with HISTORY.open() as handle:
        return {(row["region"], row["instance_type"]) for row in csv.DictReader(handle)}


def pool(
    name: str,
    instance_type: str,
    market: str = "spot",
    region: str = REGION,
    zones: tuple[str, ...] = (f"{REGION}-a", f"{REGION}-b"),
    **options: Any,
) -> Pool:
    return Pool(
        name=name,
        provider="gcp",
        region=region,
        instance_type=instance_type,
        gpus_per_instance=1,
        market=market,
        options={"zones": list(zones), "image": IMAGE, **options},
    )


def pricing(pools: list[Pool], price_catalog: str | None = None) -> GcpPrices:
    options = {p.name: GcpPoolOptions.model_validate(p.options) for p in pools}
    zones = {p.name: tuple(options[p.name].zones) for p in pools}
    return GcpPrices(options, zones, ManualClock(START), price_catalog)


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER]


def test_a_type_the_history_lacks_gets_the_catalogs_list_price() -> None:
    rows = catalog_rows()
    l4 = rows["g2-standard-4"]
    assert ("us-central1", "g2-standard-4") not in history_types(), "the case this is about"
    spot = pool("l4-spot", "g2-standard-4")
    on_demand = pool("l4-od", "g2-standard-4", market="on-demand")
    a100 = pool("a100-spot", "a2-highgpu-1g")
    quotes = {q.pool: q for q in pricing([spot, on_demand, a100]).prices([spot, on_demand, a100])}

    assert quotes["l4-spot"].price_per_hour == float(l4["spot_price_per_hour_us_central1"])
    assert quotes["l4-od"].price_per_hour == float(l4["on_demand_price_per_hour_us_central1"])
    for name in ("l4-spot", "l4-od"):
        assert quotes[name].on_demand_price_per_hour == float(
            l4["on_demand_price_per_hour_us_central1"]
        )
        assert quotes[name].interruption_rate_per_hour is None
        assert quotes[name].as_of == START
        # a list price, not a history: its source says which, where and of when
        assert quotes[name].source == f"{LIST_PRICE_LABEL} (us-central1, 2026-07-30)"
    assert quotes["l4-spot"].price_per_hour < quotes["l4-od"].price_per_hour
    # a type the history has keeps the history's price
    assert quotes["a100-spot"].source == "gcp-price-history"


def test_a_region_the_catalog_has_no_column_for_gets_no_quote_and_one_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The catalog's cheapest-region columns are the price of no region: a pool elsewhere stays
    unpriced rather than look cheaper than it is."""
    caplog.set_level(logging.WARNING, logger=LOGGER)
    europe = pool("l4-eu", "g2-standard-4", region="europe-west4", zones=("europe-west4-a",))
    prices = pricing([europe])
    for _ in range(3):
        assert prices.prices([europe]) == []
    (warning,) = warnings_of(caplog)
    assert warning.startswith("gcp pool l4-eu has no price: ")
    for said in (
        "g2-standard-4 in europe-west4",
        "spot price",
        "the shipped price history",
        "list prices (us-central1 only)",
        "never launched",
        "providers.gcp.price_catalog",
    ):
        assert said in warning, warning


def test_each_unpriced_pool_is_warned_about_once_and_a_priced_one_never(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger=LOGGER)
    unknown = pool("n2", "n2-standard-8")
    unknown_od = pool("n2-od", "n2-standard-8", market="on-demand")
    # no Mega spot price in the catalog's us-central1 columns
    mega = pool("mega", "a3-megagpu-8g")
    priced = pool("l4", "g2-standard-4")
    pools = [unknown, unknown_od, mega, priced]
    prices = pricing(pools)
    for _ in range(5):
        assert [q.pool for q in prices.prices(pools)] == ["l4"]
    warned = warnings_of(caplog)
    assert [w.split()[2] for w in warned] == ["n2", "n2-od", "mega"]
    assert "on-demand price for n2-standard-8" in warned[1]


def test_attached_gpus_are_priced_only_from_a_configured_catalog(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """An N1 machine with attached GPUs is not in the list; a configured catalog without the
    type falls back to the list price like the history does."""
    caplog.set_level(logging.WARNING, logger=LOGGER)
    path = tmp_path / "vms.csv"
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(SKYPILOT_COLUMNS)
        writer.writerow(["a2-highgpu-1g", "A100", "1", "12", "85", "3.50", "1.00", REGION, ""])
        writer.writerow(["n1-standard-8", "", "", "8", "30", "0.38", "0.08", REGION, ""])
    n1 = pool("n1-t4", "n1-standard-8", accelerator_type="nvidia-tesla-t4", accelerator_count=1)
    n1_history = pool(
        "n1-t4-history", "n1-standard-8", accelerator_type="nvidia-tesla-t4", accelerator_count=1
    )
    a100 = pool("a100", "a2-highgpu-1g")
    l4 = pool("l4", "g2-standard-4")
    quotes = {q.pool: q for q in pricing([n1, a100, l4], str(path)).prices([n1, a100, l4])}
    assert set(quotes) == {"a100", "l4"}
    assert quotes["a100"].price_per_hour == 1.00 and quotes["a100"].source == "skypilot-catalog"
    assert quotes["l4"].source.startswith(LIST_PRICE_LABEL)
    assert pricing([n1_history]).prices([n1_history]) == []
    first, second = warnings_of(caplog)
    assert f"providers.gcp.price_catalog ({path})" in first and "nvidia-tesla-t4" in first
    assert "attached GPUs are priced only from a price_catalog's GPU rows" in second


def test_the_list_reads_every_regions_columns_and_never_the_cheapest_regions(
    tmp_path: Path,
) -> None:
    path = tmp_path / "types.csv"
    path.write_text(
        "cloud,instance_type,on_demand_price_per_hour_us_central1,spot_price_per_hour_us_central1,"
        "on_demand_price_per_hour_europe_west4,spot_price_per_hour_europe_west4,"
        "min_on_demand_price_per_hour,min_spot_price_per_hour,price_as_of\n"
        "gcp,g2-standard-4,0.70,0.40,0.80,,0.10,0.05,2026-07-30T06:13:17Z\n"
        "gcp,x-unpriced,,,,,0.10,0.05,2026-07-30T06:13:17Z\n"
    )
    listed = GcpListPrices(path)
    assert listed.regions == ("europe-west4", "us-central1")
    central = listed.price("g2-standard-4", "us-central1")
    europe = listed.price("g2-standard-4", "europe-west4", "europe-west4-a")
    assert central is not None and (central.on_demand, central.spot) == (0.70, 0.40)
    assert europe is not None and (europe.on_demand, europe.spot) == (0.80, None)
    assert listed.price("g2-standard-4", "asia-east1") is None
    assert listed.price("x-unpriced", "us-central1") is None
    assert listed.as_of("g2-standard-4") == "2026-07-30"

    spot_eu = pool("eu", "g2-standard-4", region="europe-west4", zones=("europe-west4-a",))
    od_eu = pool("eu-od", "g2-standard-4", "on-demand", "europe-west4", ("europe-west4-a",))
    options = {p.name: GcpPoolOptions.model_validate(p.options) for p in (spot_eu, od_eu)}
    zones = {name: tuple(o.zones) for name, o in options.items()}
    prices = GcpPrices(options, zones, ManualClock(START), None, list_prices=listed)
    quotes = prices.prices([spot_eu, od_eu])
    assert [(q.pool, q.price_per_hour) for q in quotes] == [("eu-od", 0.80)]


SHIPPED_REGIONS = ("us-central1", "europe-west4", "asia-east1")


@settings(max_examples=60, deadline=None)
@given(
    instance_type=st.sampled_from(sorted(catalog_rows())),
    region=st.sampled_from(SHIPPED_REGIONS),
    market=st.sampled_from(("spot", "on-demand")),
)
def test_a_quote_is_the_history_else_the_list_else_none(
    instance_type: str, region: str, market: str
) -> None:
    """For every machine type of the catalog in regions with and without its columns: the
    history's price where it has the pool's market, else the list's, else no quote."""
    subject = pool("p", instance_type, market, region, (f"{region}-a",))
    history = GcpPriceHistory(HISTORY).price(instance_type, region)
    listed = GcpListPrices().price(instance_type, region)
    column = "spot" if market == "spot" else "on_demand"
    from_history = getattr(history, column) if history else None
    from_list = getattr(listed, column) if listed else None
    quotes = pricing([subject]).prices([subject])
    if from_history is not None:
        assert [(q.price_per_hour, q.source) for q in quotes] == [
            (from_history, "gcp-price-history")
        ]
    elif from_list is not None:
        assert [q.price_per_hour for q in quotes] == [from_list]
        assert quotes[0].source.startswith(f"{LIST_PRICE_LABEL} ({region}, ")
        row = catalog_rows()[instance_type]
        assert from_list == float(row[f"{column}_price_per_hour_{region.replace('-', '_')}"])
    else:
        assert quotes == []


def test_run_warns_once_about_a_pool_it_cannot_price_and_launches_the_priced_one(
    gcp: ComputeEmulator, tmp_path: Path
) -> None:
    """The controller on the Compute Engine emulator for a few ticks: the L4 pool, priced from
    the list, is launched; the pool nothing prices is said once in the log, not every tick."""
    jobs = {"count": 2, "gpus": 1, "checkpoint_interval_s": 600}
    config = {
        "fleet_id": "pricing",
        "tick_seconds": 1,
        "journal": {"sqlite_path": str(tmp_path / "journal.db")},
        "providers": {"gcp": {"project": PROJECT, "endpoint": gcp.url}},
        "sources": [{"kind": "static", "name": "work", "settings": {"jobs": [jobs]}}],
        "pools": [
            {
                "name": name,
                "provider": "gcp",
                "region": REGION,
                "instance_type": instance_type,
                "gpus_per_instance": 1,
                "market": "spot",
                "max_instances": 1,
                "boot_seconds": 0,
                "joins_scheduler": False,
                "options": {"zones": [f"{REGION}-a"], "image": IMAGE},
            }
            for name, instance_type in (("l4", "g2-standard-4"), ("n2", "n2-standard-8"))
        ],
    }
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    done = subprocess.run(
        [sys.executable, "-m", "autoscaler.cli", "run", "--config", str(path), "--ticks", "4"],
        capture_output=True,
        text=True,
        timeout=bound(300),
        check=False,
        env=dict(os.environ),
    )
    log = done.stdout + done.stderr
    assert done.returncode == 0, log[-3000:]
    warned = [line for line in log.splitlines() if "has no price" in line]
    assert len(warned) == 1, warned
    assert "gcp pool n2 has no price" in warned[0] and "n2-standard-8" in warned[0]
    machine_types = [vm["machineType"].rsplit("/", 1)[-1] for vm in gcp.instances.values()]
    assert machine_types == ["g2-standard-4"], machine_types
