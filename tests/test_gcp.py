"""The GCP provider against the Compute Engine emulator: the real google-cloud-compute SDK over
HTTP, faults as Compute Engine sends them (HTTP errors, and operations that end in an error)."""

from __future__ import annotations

import csv
import time
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.error import HTTPError
from urllib.request import urlopen

import pytest
from gcp_emulator import IMAGE, LABEL_VALUE, PROJECT, REGION, ComputeEmulator
from waits import bound

from autoscaler.model import InstanceState, NoticeKind, Pool
from autoscaler.model.catalog import DATA, SKYPILOT_COLUMNS
from autoscaler.model.clock import ManualClock
from autoscaler.model.errors import (
    AuthError,
    CapacityError,
    InputError,
    InvalidRequest,
    ProviderError,
    QuotaError,
    QuotaScope,
    ThrottledError,
    TransientError,
)
from autoscaler.spi.provider import FLEET_TAG, LAUNCHED_AT_TAG, POOL_TAG, REQUEST_TAG
from autoscaler.tick.retry import RetryPolicy
from providers.gcp import GcpProvider
from providers.gcp.instances import instance_name, label_value, tag_value, tags_from_labels

FLEET = "fleet-a"
START = 1_700_000_000.0
ZONE_A, ZONE_B = f"{REGION}-a", f"{REGION}-b"


def gcp_pool(
    name: str = "a2-spot",
    market: str = "spot",
    zones: tuple[str, ...] = (ZONE_A, ZONE_B),
    instance_type: str = "a2-highgpu-1g",
    gpus: int = 1,
    **options: Any,
) -> Pool:
    return Pool(
        name=name,
        provider="gcp",
        region=REGION,
        instance_type=instance_type,
        gpus_per_instance=gpus,
        market=market,  # type: ignore[arg-type]
        options={"zones": list(zones), "image": IMAGE, **options},
    )


def provider(
    gcp: ComputeEmulator,
    pools: list[Pool],
    clock: ManualClock | None = None,
    **settings: Any,
) -> GcpProvider:
    clock = clock or ManualClock(START)
    gcp.clock = clock.now
    return GcpProvider.from_config(
        {"project": PROJECT, "endpoint": gcp.url, "operation_timeout_s": bound(30), **settings},
        pools,
        FLEET,
        clock,
    )


def stored(gcp: ComputeEmulator, name: str) -> dict[str, Any]:
    """The VM as the SDK sent it and the emulator keeps it (camelCase JSON)."""
    return gcp.find(name)[1]


def inserts(gcp: ComputeEmulator) -> int:
    return sum(
        1 for method, path in gcp.requests if method == "POST" and path.endswith("/instances")
    )


def test_launch_labels_spot_vms_spreads_zones_and_touches_only_ours(gcp: ComputeEmulator) -> None:
    pool = gcp_pool()
    gcp_provider = provider(gcp, [pool])
    result = gcp_provider.launch(pool, 3, "req-1", FLEET)
    assert len(result.instances) == 3 and result.shortfall is None and not result.already_existed
    names = [i.id for i in result.instances]
    assert names == [instance_name(FLEET, "req-1", i) for i in range(3)]
    assert {gcp.find(n)[0] for n in names} == {ZONE_A, ZONE_B}, "spread over the pool's zones"
    for name in names:
        vm = stored(gcp, name)
        assert vm["labels"] == {
            "gpu-autoscaler-fleet": "fleet-a",
            "gpu-autoscaler-pool": "a2-spot",
            "gpu-autoscaler-request": "req-1",
            "gpu-autoscaler-launched-at": "1700000000_2e000",
        }
        assert vm["scheduling"] == {
            "provisioningModel": "SPOT",
            "instanceTerminationAction": "DELETE",
            "onHostMaintenance": "TERMINATE",
            "automaticRestart": False,
        }
        assert vm["machineType"].endswith("/machineTypes/a2-highgpu-1g")
        assert vm["disks"][0]["initializeParams"]["sourceImage"] == IMAGE
        assert vm["disks"][0]["boot"] and vm["disks"][0]["autoDelete"]
        assert vm["networkInterfaces"] == [{"network": "global/networks/default"}]
    gcp.add_instance(ZONE_A, "stranger-1", {"team": "someone-else"})
    gcp.add_instance(ZONE_A, "other-fleet-1", {"gpu-autoscaler-fleet": "fleet-b"})
    listed = gcp_provider.list_instances(FLEET)
    assert sorted(i.id for i in listed) == sorted(names)
    assert {(i.pool, i.request_id, i.gpus, i.launched_at) for i in listed} == {
        ("a2-spot", "req-1", 1, START)
    }
    gcp_provider.terminate([*names, "stranger-1", "other-fleet-1", "no-such-vm"], "term-1")
    assert set(gcp.live()) == {"stranger-1", "other-fleet-1"}, "only our fleet's VMs are deleted"


def test_on_demand_vms_with_guest_gpus_network_and_disk(gcp: ComputeEmulator) -> None:
    pool = gcp_pool(
        "n1-t4",
        market="on-demand",
        zones=(ZONE_A,),
        instance_type="n1-standard-8",
        gpus=2,
        accelerator_type="nvidia-tesla-t4",
        network="global/networks/gpu",
        subnetwork=f"regions/{REGION}/subnetworks/gpu",
        disk_size_gb=500,
    )
    (instance,) = provider(gcp, [pool]).launch(pool, 1, "req-od", FLEET).instances
    vm = stored(gcp, instance.id)
    assert vm["scheduling"] == {
        "provisioningModel": "STANDARD",
        "onHostMaintenance": "TERMINATE",
        "automaticRestart": True,
    }
    assert vm["guestAccelerators"] == [
        {
            "acceleratorType": f"zones/{ZONE_A}/acceleratorTypes/nvidia-tesla-t4",
            "acceleratorCount": 2,
        }
    ]
    assert vm["networkInterfaces"] == [
        {"network": "global/networks/gpu", "subnetwork": f"regions/{REGION}/subnetworks/gpu"}
    ]
    assert int(vm["disks"][0]["initializeParams"]["diskSizeGb"]) == 500
    assert instance.gpus == 2


def test_a_repeated_launch_never_buys_a_second_set(gcp: ComputeEmulator) -> None:
    pool = gcp_pool()
    first = provider(gcp, [pool]).launch(pool, 2, "req-crash", FLEET)
    same = provider(gcp, [pool])
    again = same.launch(pool, 2, "req-crash", FLEET)
    # the controller crashed after the call and before recording it: a new process retries
    after_restart = provider(gcp, [pool]).launch(pool, 2, "req-crash", FLEET)
    for result in (again, after_restart):
        assert result.already_existed
        assert sorted(i.id for i in result.instances) == sorted(i.id for i in first.instances)
    assert len(gcp.live()) == 2 and inserts(gcp) == 2


def test_a_fault_half_way_is_a_shortfall_and_the_retry_completes_the_set(
    gcp: ComputeEmulator,
) -> None:
    pool = gcp_pool(zones=(ZONE_A,))
    gcp_provider = provider(gcp, [pool])
    gcp.fail_next("insert", "ok")
    gcp.fail_next("insert", "throttle")
    half = gcp_provider.launch(pool, 3, "req-half", FLEET)
    assert len(half.instances) == 1, "a bought VM is reported, never hidden behind an exception"
    assert isinstance(half.shortfall, ThrottledError)
    again = gcp_provider.launch(pool, 3, "req-half", FLEET)
    assert again.already_existed and again.shortfall is None
    assert sorted(i.id for i in again.instances) == [
        instance_name(FLEET, "req-half", i) for i in range(3)
    ]
    assert len(gcp.live()) == 3


def test_an_insert_whose_answer_was_lost_is_found_not_bought_again(gcp: ComputeEmulator) -> None:
    pool = gcp_pool(zones=(ZONE_A,))
    gcp_provider = provider(gcp, [pool])
    gcp.fail_next("insert", "lost")
    found = gcp_provider.launch(pool, 1, "req-lost", FLEET)
    assert [i.id for i in found.instances] == [instance_name(FLEET, "req-lost", 0)]
    assert found.shortfall is None, "looked up by name after the error, and found"

    # when even the look-up fails, a VM that may exist is counted: the next listing drops it
    gcp.fail_next("insert", "server")
    gcp.fail_next("get", "server")
    (maybe,) = gcp_provider.launch(pool, 1, "req-maybe", FLEET).instances
    assert maybe.id not in {i.id for i in gcp_provider.list_instances(FLEET)}

    # the same, while reads do not show the new VM yet: the launch fails, and its retry
    # repeats the requestId, which Compute Engine answers with the first insert's operation
    name = instance_name(FLEET, "req-unlisted", 0)
    gcp.hidden.add(name)
    gcp.fail_next("insert", "lost")
    with pytest.raises(TransientError):
        gcp_provider.launch(pool, 1, "req-unlisted", FLEET)
    operations = len(gcp.operations)
    retried = gcp_provider.launch(pool, 1, "req-unlisted", FLEET)
    assert [i.id for i in retried.instances] == [name]
    assert len(gcp.operations) == operations, "the repeated requestId got the same operation"

    # once the requestId is forgotten, the name still protects us: 409 means already launched
    gcp.by_request_id.clear()
    late = gcp_provider.launch(pool, 1, "req-unlisted", FLEET)
    assert [i.id for i in late.instances] == [name]
    assert len(gcp.live()) == 2


@pytest.mark.parametrize(
    ("fault", "expected", "code"),
    [
        ("capacity", CapacityError, "ZONE_RESOURCE_POOL_EXHAUSTED"),
        ("throttle", ThrottledError, "rateLimitExceeded"),
        ("server", TransientError, "backendError"),
        # google-auth answers a 401 by refreshing the credentials, which anonymous ones cannot
        ("auth", AuthError, "CredentialsRefused"),
        ("forbidden", AuthError, "forbidden"),
    ],
)
def test_launch_errors_arrive_typed(
    gcp: ComputeEmulator, fault: str, expected: type[ProviderError], code: str
) -> None:
    pool = gcp_pool(zones=(ZONE_A,))
    gcp.fail_next("insert", fault)
    with pytest.raises(expected) as caught:
        provider(gcp, [pool]).launch(pool, 1, "req-fault", FLEET)
    assert caught.value.code == code and caught.value.pool == "a2-spot"
    assert gcp.live() == {}


def test_a_request_cloud_cannot_serve_is_invalid(gcp: ComputeEmulator) -> None:
    pool = gcp_pool(zones=(f"{REGION}-z",))
    with pytest.raises(InvalidRequest, match="not found"):
        provider(gcp, [pool]).launch(pool, 1, "req-nowhere", FLEET)


@pytest.mark.parametrize(
    ("fault", "scope", "code"),
    [
        ("quota", QuotaScope.REGION, "QUOTA_EXCEEDED"),
        ("quota-global", QuotaScope.PROVIDER, "QUOTA_EXCEEDED"),
        ("quota-http", QuotaScope.REGION, "quotaExceeded"),
        ("quota-http-global", QuotaScope.PROVIDER, "quotaExceeded"),
    ],
)
def test_quota_scopes(gcp: ComputeEmulator, fault: str, scope: QuotaScope, code: str) -> None:
    """A regional GPU quota blocks the region; GPUS_ALL_REGIONS blocks the whole cloud. Both
    arrive in an operation's error (403) or as an HTTP 403 with reason quotaExceeded."""
    pool = gcp_pool()
    gcp.fail_next("insert", fault)
    with pytest.raises(QuotaError) as caught:
        provider(gcp, [pool]).launch(pool, 1, "req-quota", FLEET)
    assert caught.value.scope is scope and caught.value.code == code
    assert caught.value.pool == "a2-spot"


def test_a_quota_refusal_ends_the_launch(gcp: ComputeEmulator) -> None:
    """Other zones share the region's quota: the VMs not yet inserted are not tried there."""
    pool = gcp_pool()
    gcp.fail_next("insert", "ok")
    gcp.fail_next("insert", "quota-http")
    result = provider(gcp, [pool]).launch(pool, 4, "req-quota", FLEET)
    assert len(result.instances) == 1 and isinstance(result.shortfall, QuotaError)
    assert inserts(gcp) == 2


def test_throttling_carries_retry_after_to_the_retry_policy(gcp: ComputeEmulator) -> None:
    pool = gcp_pool()
    gcp_provider = provider(gcp, [pool])
    gcp.retry_after = "3"
    gcp.fail_next("list", "throttle")
    with pytest.raises(ThrottledError) as caught:
        gcp_provider.list_instances(FLEET)
    assert caught.value.retry_after_s == 3.0
    sleeps: list[float] = []
    gcp.fail_next("insert", "throttle")
    result = RetryPolicy(attempts=3, sleep=sleeps.append).call(
        lambda: gcp_provider.launch(pool, 1, "req-retry", FLEET)
    )
    assert len(result.instances) == 1 and sleeps == [3.0]


def test_a_zone_out_of_capacity_hands_its_vms_to_the_others(gcp: ComputeEmulator) -> None:
    pool = gcp_pool()
    gcp_provider = provider(gcp, [pool])
    gcp.full_zones = {ZONE_A}
    moved = gcp_provider.launch(pool, 3, "req-moved", FLEET)
    assert len(moved.instances) == 3 and moved.shortfall is None
    assert {gcp.find(i.id)[0] for i in moved.instances} == {ZONE_B}
    gcp.full_zones = set()
    gcp.capacity = 1
    partial = gcp_provider.launch(pool, 3, "req-partial", FLEET)
    assert len(partial.instances) == 1
    assert isinstance(partial.shortfall, CapacityError)
    assert partial.shortfall.code == "ZONE_RESOURCE_POOL_EXHAUSTED"
    gcp.full_zones = {ZONE_A, ZONE_B}
    with pytest.raises(CapacityError):
        gcp_provider.launch(pool, 1, "req-none", FLEET)
    assert len(gcp.live()) == 4


def test_a_slow_operation_is_waited_for_within_the_timeout(gcp: ComputeEmulator) -> None:
    pool = gcp_pool(zones=(ZONE_A,))
    gcp.slow_polls = 3
    gcp.fail_next("insert", "slow")
    (instance,) = provider(gcp, [pool]).launch(pool, 1, "req-slow", FLEET).instances
    assert stored(gcp, instance.id)["status"] == "RUNNING", "returned once the operation was DONE"
    waits = [path for method, path in gcp.requests if path.endswith("/wait")]
    assert len(waits) == 3 and all(f"/zones/{ZONE_A}/operations/" in path for path in waits)

    gcp.slow_polls = 10**6
    gcp.fail_next("insert", "slow")
    impatient = provider(gcp, [pool], operation_timeout_s=0.3)
    started = time.monotonic()
    (late,) = impatient.launch(pool, 1, "req-slower", FLEET).instances
    assert time.monotonic() - started < 3.0
    assert late.state is InstanceState.PENDING, "a VM still being made is counted, as pending"
    states = {i.id: i.state for i in impatient.list_instances(FLEET)}
    assert states[late.id] is InstanceState.PENDING


def test_a_server_error_in_the_middle_of_a_paged_listing(gcp: ComputeEmulator) -> None:
    pool = gcp_pool()
    gcp_provider = provider(gcp, [pool])
    launched = gcp_provider.launch(pool, 7, "req-many", FLEET).instances
    assert len(launched) == 7
    assert len(gcp_provider.list_instances(FLEET)) == 7
    gcp.fail_next("page", "server")
    with pytest.raises(TransientError):
        gcp_provider.list_instances(FLEET)
    assert gcp.injected == [("page", "server")]
    listings = [p for m, p in gcp.requests if p.endswith("/aggregated/instances")]
    assert len(listings) == 3 + 2, "three pages, then the first page and the failed second"
    assert len(gcp_provider.list_instances(FLEET)) == 7


def test_listing_maps_compute_engine_states(gcp: ComputeEmulator) -> None:
    pool = gcp_pool()
    gcp_provider = provider(gcp, [pool])
    names = [i.id for i in gcp_provider.launch(pool, 4, "req-s", FLEET).instances]
    for name, status in zip(names, ("STAGING", "RUNNING", "STOPPING", "SUSPENDED"), strict=True):
        gcp.set_status(name, status)
    states = {i.id: i.state for i in gcp_provider.list_instances(FLEET)}
    assert [states[n] for n in names] == [
        InstanceState.PENDING,
        InstanceState.RUNNING,
        InstanceState.TERMINATING,
        InstanceState.TERMINATING,
    ]


def test_preemption_is_a_notice_exactly_once(gcp: ComputeEmulator) -> None:
    pool = gcp_pool()
    clock = ManualClock(START)
    gcp_provider = provider(gcp, [pool], clock)
    victim, kept, other = (i.id for i in gcp_provider.launch(pool, 3, "req-n", FLEET).instances)
    gcp.add_instance(ZONE_A, "stranger-spot", {}, spot=True)
    gcp_provider.list_instances(FLEET)
    clock.advance(60)
    gcp.preempt(victim, delete=True)  # the termination action DELETE: gone from listings
    gcp.preempt(kept)
    gcp.preempt("stranger-spot")
    clock.advance(5)
    states = {i.id: i.state for i in gcp_provider.list_instances(FLEET)}
    assert victim not in states and states[kept] is InstanceState.TERMINATING
    notices = gcp_provider.poll_notices()
    assert sorted((n.instance_id, n.pool, n.kind, n.deadline, n.received_at) for n in notices) == [
        (name, "a2-spot", NoticeKind.TERMINATE, START + 60, START + 65)
        for name in sorted((victim, kept))
    ]
    gcp_provider.acknowledge(notices)
    clock.advance(30)
    gcp_provider.list_instances(FLEET)
    assert gcp_provider.poll_notices() == [], "reported once, though still listed TERMINATED"

    # a Spot VM of ours seen TERMINATED with no preemption operation (stopped, or the
    # operation not recorded yet) is a notice too, due now
    gcp.set_status(other, "TERMINATED")
    gcp_provider.list_instances(FLEET)
    (notice,) = gcp_provider.poll_notices()
    assert (notice.instance_id, notice.deadline) == (other, START + 95)
    assert gcp_provider.poll_notices() == []


def latest_history_prices(region: str, instance_type: str) -> tuple[float, float]:
    """The shipped history's latest spot and on-demand prices, read independently."""
    path = DATA / "prices" / "gcp_gpu_vm_price_history.csv"
    with path.open() as handle:
        rows = [
            r
            for r in csv.DictReader(handle)
            if r["cloud"] == "gcp" and r["region"] == region and r["instance_type"] == instance_type
        ]
    rows.sort(key=lambda r: datetime.fromisoformat(r["timestamp"].replace("Z", "+00:00")))
    spot = [float(r["price_per_hour"]) for r in rows if r["price_per_hour"]]
    on_demand = [
        float(r["on_demand_price_per_hour"]) for r in rows if r["on_demand_price_per_hour"]
    ]
    return spot[-1], on_demand[-1]


def test_prices_from_the_shipped_history_need_no_api_call(gcp: ComputeEmulator) -> None:
    spot_pool = gcp_pool()
    big = gcp_pool("a2-8-od", market="on-demand", instance_type="a2-highgpu-8g", gpus=8)
    unknown = gcp_pool("n2", instance_type="n2-standard-8")  # in neither history nor catalog
    quotes = {
        q.pool: q
        for q in provider(gcp, [spot_pool, big, unknown]).prices([spot_pool, big, unknown])
    }
    assert set(quotes) == {"a2-spot", "a2-8-od"}, "no quote rather than a guessed one"
    spot, on_demand = latest_history_prices(REGION, "a2-highgpu-1g")
    assert quotes["a2-spot"].price_per_hour == spot < on_demand
    assert quotes["a2-spot"].on_demand_price_per_hour == on_demand
    assert quotes["a2-spot"].interruption_rate_per_hour is None, "GCP publishes no rates"
    assert quotes["a2-spot"].source == "gcp-price-history" and quotes["a2-spot"].as_of == START
    assert quotes["a2-8-od"].price_per_hour == latest_history_prices(REGION, "a2-highgpu-8g")[1]
    assert gcp.requests == []


def test_prices_from_a_skypilot_catalog(gcp: ComputeEmulator, tmp_path: Path) -> None:
    path = tmp_path / "vms.csv"
    rows = [
        ["a2-highgpu-1g", "A100", "1", "12", "85", "3.67", "1.10", REGION, ZONE_A],
        ["a2-highgpu-1g", "A100", "1", "12", "85", "3.67", "1.25", REGION, ZONE_B],
        ["n1-standard-8", "", "", "8", "30", "0.38", "0.08", REGION, ZONE_A],
        ["", "T4", "1", "", "", "0.35", "0.11", REGION, ZONE_A],
    ]
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(SKYPILOT_COLUMNS)
        writer.writerows(rows)
    a2 = gcp_pool()
    t4: dict[str, Any] = {"accelerator_type": "nvidia-tesla-t4", "accelerator_count": 2}
    n1_spot = gcp_pool("n1-spot", zones=(ZONE_A,), instance_type="n1-standard-8", gpus=2, **t4)
    n1_od = gcp_pool("n1-od", "on-demand", (ZONE_A,), "n1-standard-8", 2, **t4)
    n1_b = gcp_pool("n1-b", zones=(ZONE_B,), instance_type="n1-standard-8", gpus=2, **t4)
    pools = [a2, n1_spot, n1_od, n1_b]
    quotes = {q.pool: q for q in provider(gcp, pools, price_catalog=str(path)).prices(pools)}
    assert quotes["a2-spot"].price_per_hour == 1.25, "the dearest of the zones it spreads over"
    assert quotes["a2-spot"].source == "skypilot-catalog"
    assert quotes["n1-spot"].price_per_hour == pytest.approx(0.08 + 2 * 0.11)
    assert quotes["n1-od"].price_per_hour == pytest.approx(0.38 + 2 * 0.35)
    assert "n1-b" not in quotes, "a machine priced without its GPUs would look far too cheap"


def test_settings_and_pool_options_errors_name_the_field(tmp_path: Path) -> None:
    cases: list[tuple[dict[str, Any], str]] = [
        ({}, r"providers\.gcp\.project"),
        ({"project": "p", "endpoint": "127.0.0.1:8080"}, r"providers\.gcp\.endpoint: .*scheme"),
        ({"project": "p", "operation_timeout_s": 0}, r"providers\.gcp\.operation_timeout_s"),
        ({"project": "p", "credentials": "{}"}, r"providers\.gcp\.credentials"),
    ]
    for settings, message in cases:
        with pytest.raises(InputError, match=message):
            GcpProvider.from_config(settings, [], FLEET)
    with pytest.raises(InputError, match="no such file"):
        GcpProvider.from_config(
            {"project": "p", "price_catalog": str(tmp_path / "x.csv")}, [], FLEET
        )
    bad_pools: list[tuple[Pool, str]] = [
        (gcp_pool(image=None), r"pools\[0\]\.options\.image"),
        (
            gcp_pool(zones=("europe-west4-a",)),
            r"pools\[0\]\.options\.zones: .*not in .*us-central1",
        ),
        (gcp_pool(zones=()), r"pools\[0\]\.options\.zones: give zones"),
        (gcp_pool(accelerator_count=2), r"pools\[0\]\.options: .*needs an accelerator_type"),
        (gcp_pool(disk_size_gb=1), r"pools\[0\]\.options\.disk_size_gb"),
    ]
    for pool, message in bad_pools:
        with pytest.raises(InputError, match=message):
            GcpProvider.from_config({"project": "p"}, [pool], FLEET)


def test_labels_are_valid_reversible_and_unambiguous(gcp: ComputeEmulator) -> None:
    assert label_value("Prod.Pool_A:1") == "_50rod_2e_50ool_5f_41_3a1"
    for text in ("fleet-a", "Prod.Pool_A:1", "a_5f", "über-pool", "1700000000.125"):
        label = label_value(text)
        assert LABEL_VALUE.match(label) and tag_value(label) == text
    long_a, long_b = "P" * 120 + "a", "P" * 120 + "b"
    assert LABEL_VALUE.match(label_value(long_a)) and label_value(long_a) != label_value(long_b)
    assert tag_value(label_value(long_a)) == label_value(long_a), "hashed, never misread"
    pool = gcp_pool("GPU.Pool_A" + "x" * 70)
    gcp_provider = provider(gcp, [pool])
    (instance,) = gcp_provider.launch(pool, 1, "Req.1", FLEET).instances
    (listed,) = gcp_provider.list_instances(FLEET)
    assert (listed.pool, listed.request_id) == (pool.name, "Req.1")
    tags = tags_from_labels(stored(gcp, instance.id)["labels"])
    assert tags[FLEET_TAG] == FLEET and tags[REQUEST_TAG] == "Req.1"
    assert float(tags[LAUNCHED_AT_TAG]) == START and tags[POOL_TAG] != pool.name


def test_missing_application_default_credentials_is_an_auth_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "absent.json"))
    gcp_provider = GcpProvider.from_config({"project": PROJECT}, [gcp_pool()], FLEET)
    with pytest.raises(AuthError) as caught:
        gcp_provider.list_instances(FLEET)
    assert caught.value.code == "NoCredentials"


def test_an_endpoint_changes_where_compute_engine_is_never_how_we_authenticate(
    gcp: ComputeEmulator,
) -> None:
    """No test-only credential: the emulator refuses a request without a token it issued, and
    the provider gets its token through Application Default Credentials, from the emulator's
    metadata server, as on a VM or a GKE pod."""
    import google.auth
    from google.auth import compute_engine

    credentials, project = google.auth.default()
    assert isinstance(credentials, compute_engine.Credentials) and project == PROJECT
    with pytest.raises(HTTPError) as refused:
        urlopen(f"{gcp.url}/compute/v1/projects/{PROJECT}/aggregated/instances", timeout=bound(30))
    assert refused.value.code == 401
    asked = gcp.token_requests
    pool = gcp_pool(zones=(ZONE_A,))
    made = provider(gcp, [pool])
    made.launch(pool, 1, "req-auth", FLEET)
    assert [i.request_id for i in made.list_instances(FLEET)] == ["req-auth"]
    assert gcp.token_requests > asked, "the token came from the metadata server"


def test_the_core_and_this_provider_import_without_google_cloud_compute() -> None:
    """Importing needs no SDK; building the provider without it is one line naming the extra."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] == 'google':\n"
        "            raise ImportError(name)\n"
        "sys.meta_path.insert(0, Block())\n"
        "import autoscaler.tick.controller, providers.gcp\n"
        "from autoscaler.model import Pool\n"
        "pool = Pool(name='p', provider='gcp', region='us-central1', zone='us-central1-a',\n"
        "            instance_type='a2-highgpu-1g', gpus_per_instance=1, market='spot',\n"
        "            options={'image': 'debian'})\n"
        "from autoscaler.model.errors import InputError\n"
        "print('imported')\n"
        "try:\n"
        "    providers.gcp.GcpProvider.from_config({'project': 'p'}, [pool], 'f')\n"
        "except InputError as exc:\n"
        "    print(exc)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.returncode == 0 and "imported" in done.stdout, done.stderr
    assert "pip install 'hybrid-gpu-autoscaler[gcp]'" in done.stdout
