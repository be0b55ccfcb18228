"""The simulated cloud on a live controller's clock, and the static queue source: built from a
config as the controller builds them, then the whole controller run as a process on both."""

from __future__ import annotations

import math
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
import yaml
from waits import bound

from autoscaler.app.assembly import build_providers, build_signals
from autoscaler.model import InstanceState, Pool
from autoscaler.model.clock import ManualClock
from autoscaler.model.config import ControllerConfig
from autoscaler.model.errors import CapacityError, InputError, InvalidRequest
from autoscaler.sources.static import StaticQueueSource
from autoscaler.spi.sources import QueueSource
from providers.sim import LiveSimProvider, SimProvider

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "container" / "config.yaml"


def sim_pool(name: str, market: str = "spot", **extra: Any) -> Pool:
    fields: dict[str, Any] = {
        "name": name,
        "provider": "sim",
        "region": "us-east-1",
        "instance_type": "g5.xlarge",
        "gpus_per_instance": 1,
        "market": market,
        "boot_seconds": 30,
        **extra,
    }
    return Pool.model_validate(fields)


def live(
    pools: list[Pool], clock: ManualClock | None = None, **settings: Any
) -> tuple[LiveSimProvider, ManualClock]:
    clock = clock or ManualClock(1_000.0)
    return SimProvider.from_config(settings, pools, "fleet", clock), clock


# -- prices -------------------------------------------------------------------------------------


def test_a_pool_is_priced_from_its_options_then_the_settings_then_the_catalog() -> None:
    pools = [
        sim_pool("own", options={"price_per_hour": 0.5, "on_demand_price_per_hour": 2.0}),
        sim_pool("set"),
        sim_pool("listed"),
        sim_pool("listed-od", market="on-demand"),
    ]
    provider, clock = live(pools, prices={"set": 0.7}, spot_discount=0.5)
    quotes = {q.pool: q for q in provider.prices(pools)}
    assert quotes["own"].price_per_hour == 0.5
    assert quotes["own"].on_demand_price_per_hour == 2.0
    assert quotes["set"].price_per_hour == 0.7
    on_demand = quotes["listed-od"].price_per_hour
    assert on_demand > 0, "the shipped AWS catalog lists g5.xlarge"
    assert quotes["listed-od"].on_demand_price_per_hour == on_demand
    assert quotes["listed"].price_per_hour == pytest.approx(on_demand * 0.5)
    assert {q.as_of for q in quotes.values()} == {clock.now()}
    assert quotes["listed"].source == "sim"


def test_a_pool_with_no_price_anywhere_is_refused_naming_it() -> None:
    pools = [sim_pool("known"), sim_pool("mystery", instance_type="x9.made-up")]
    with pytest.raises(InputError) as caught:
        live(pools)
    assert caught.value.field == "pools[1].options"
    assert "'mystery'" in caught.value.message


def test_settings_naming_a_pool_that_does_not_exist_are_refused() -> None:
    with pytest.raises(InputError) as caught:
        live([sim_pool("a")], capacity={"b": 1})
    assert caught.value.field == "providers.sim.capacity"
    with pytest.raises(InputError) as caught:
        live([sim_pool("a", options={"bid": 1})])
    assert caught.value.field == "pools[0].options.bid"
    with pytest.raises(InputError) as caught:
        live([sim_pool("a")], spot_discount=0)
    assert caught.value.field == "providers.sim.spot_discount"


# -- the instance lifecycle on the clock --------------------------------------------------------


def test_instances_boot_after_the_pools_delay_and_launches_are_idempotent() -> None:
    pool = sim_pool("a")
    provider, clock = live([pool])
    first = provider.launch(pool, 2, "req-1", "fleet")
    assert [i.state for i in first.instances] == [InstanceState.PENDING] * 2
    again = provider.launch(pool, 2, "req-1", "fleet")
    assert again.already_existed
    assert [i.id for i in again.instances] == [i.id for i in first.instances]
    clock.advance(29.0)
    assert {i.state for i in provider.list_instances("fleet")} == {InstanceState.PENDING}
    clock.advance(1.0)
    listed = provider.list_instances("fleet")
    assert {i.state for i in listed} == {InstanceState.RUNNING}
    assert all(i.launched_at == 1_000.0 and i.request_id == "req-1" for i in listed)
    provider.terminate([listed[0].id], "req-2")
    assert [i.id for i in provider.list_instances("fleet")] == [listed[1].id]


def test_the_settings_boot_delay_overrides_every_pools() -> None:
    pool = sim_pool("a")
    provider, clock = live([pool], boot_seconds=2)
    provider.launch(pool, 1, "req", "fleet")
    clock.advance(2.0)
    assert [i.state for i in provider.list_instances("fleet")] == [InstanceState.RUNNING]


def test_a_pools_capacity_caps_what_a_launch_gets() -> None:
    pool = sim_pool("a")
    provider, _ = live([pool], capacity={"a": 1})
    result = provider.launch(pool, 3, "req", "fleet")
    assert len(result.instances) == 1
    assert isinstance(result.shortfall, CapacityError)
    assert result.shortfall.pool == "a"


def test_a_pool_of_another_cloud_cannot_be_launched() -> None:
    provider, _ = live([sim_pool("a")])
    with pytest.raises(InvalidRequest):
        provider.launch(sim_pool("elsewhere"), 1, "req", "fleet")


def test_an_interruption_gives_its_notice_wakes_the_loop_and_reclaims_at_the_deadline() -> None:
    pool = sim_pool("a")
    provider, clock = live([pool], notice_lead_s=120)
    (instance,) = provider.launch(pool, 1, "req", "fleet").instances
    woken = threading.Event()
    provider.start(woken.set)
    try:
        provider.interrupt(instance.id)
        assert woken.is_set()
        (notice,) = provider.poll_notices()
        assert notice.instance_id == instance.id
        assert notice.deadline == clock.now() + 120
        assert provider.poll_notices() == []
        clock.advance(119.0)
        assert [i.id for i in provider.list_instances("fleet")] == [instance.id]
        clock.advance(1.0)
        assert provider.list_instances("fleet") == []
    finally:
        provider.close()


def test_spot_instances_are_interrupted_at_the_configured_rate() -> None:
    pool = sim_pool("a")
    od = sim_pool("b", market="on-demand")
    provider, clock = live([pool, od], interruption_rate_per_hour=3600.0, seed=7)
    provider.launch(pool, 20, "spot", "fleet")
    provider.launch(od, 5, "od", "fleet")
    clock.advance(10.0)  # at one per second each, nearly every spot instance is hit by now
    notices = provider.poll_notices()
    assert len(notices) >= 15
    assert {n.pool for n in notices} == {"a"}
    assert math.isclose(notices[0].deadline - notices[0].received_at, 120.0)


# -- the static queue source --------------------------------------------------------------------


def test_static_jobs_are_demand_whose_wait_grows_from_the_first_read() -> None:
    source = StaticQueueSource.from_config(
        {
            "jobs": [
                {"count": 2, "gpus": 1, "checkpoint_interval_s": 600, "age_s": 30},
                {"count": 1, "gpus": 1, "checkpoint_interval_s": 600},
                {"count": 1, "gpus": 4, "high_priority": True, "partition": "train"},
            ]
        },
        "demo",
    )
    assert isinstance(source, QueueSource)
    first = source.read(5_000.0)
    assert [(g.gpus_per_job, g.jobs, g.high_priority) for g in first] == [
        (1, 3, False),
        (4, 1, True),
    ]
    assert first[0].oldest_submit_time == 4_970.0
    assert first[0].spot_safe and not first[1].spot_safe
    assert first[1].partition == "train"
    later = source.read(5_100.0)
    assert [g.oldest_submit_time for g in later] == [4_970.0, 5_000.0]


def test_static_settings_are_checked_naming_the_field() -> None:
    with pytest.raises(InputError) as caught:
        StaticQueueSource.from_config({"jobs": []}, "demo")
    assert caught.value.field == "sources.demo.jobs"
    with pytest.raises(InputError) as caught:
        StaticQueueSource.from_config({"jobs": [{"gpus": 0}]}, "demo")
    assert caught.value.field == "sources.demo.jobs[0].gpus"


def test_the_example_config_wires_the_sim_cloud_and_the_static_queue() -> None:
    config = ControllerConfig.model_validate(yaml.safe_load(EXAMPLE.read_text()))
    providers = build_providers(config)
    assert set(providers) == {"sim"}
    assert isinstance(providers["sim"], LiveSimProvider)
    wiring = build_signals(config)
    (queue,) = wiring.signals.queues
    assert isinstance(queue, StaticQueueSource)
    assert sum(g.gpus for g in queue.read(0.0)) == 3


# -- the controller as a process ----------------------------------------------------------------


def test_the_controller_runs_on_the_sim_cloud_and_launches_for_the_static_demand(
    tmp_path: Path,
) -> None:
    config = yaml.safe_load(EXAMPLE.read_text())
    config["tick_seconds"] = 0.5
    config["metrics"]["listen"] = {"host": "127.0.0.1", "port": 0}
    config["inbox"]["listen"] = {"host": "127.0.0.1", "port": 0}
    token = tmp_path / "token"
    token.write_text("t0ken\n")
    config["inbox"]["token_file"] = str(token)
    config["journal"]["sqlite_path"] = str(tmp_path / "journal.db")
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    done = subprocess.run(
        [sys.executable, "-m", "autoscaler.cli", "run", "--config", str(path), "--ticks", "3"],
        capture_output=True,
        text=True,
        timeout=bound(60),
        check=False,
    )
    logs = done.stdout + done.stderr
    assert done.returncode == 0, logs
    assert "launched=3" in logs
    assert "instances=3" in logs
    assert "controller stopped after 3 tick(s)" in logs
    assert "t0ken" not in logs
    assert (tmp_path / "journal.db").stat().st_size > 0
