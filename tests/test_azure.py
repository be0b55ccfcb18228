"""The Azure provider against the ARM emulator (tests/azure_emulator.py): the real
azure-mgmt-compute client, its pipeline and its pollers over HTTP, faults as ARM sends them. No SDK
method is patched.

The spot prices served are constructed for these tests from the shipped on-demand prices (the
shared data has no Azure spot prices); see the emulator's docstring."""

from __future__ import annotations

import base64
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from azure_emulator import (
    POOL_OPTIONS,
    REGION,
    RETRY_AFTER_S,
    SUBSCRIPTION,
    ArmEmulator,
    AzureWorld,
    on_demand_price,
    spot_price,
)
from waits import bound

from autoscaler.model import InstanceState, NoticeKind, Pool
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
from providers.azure import AzureProvider
from providers.azure.errors import typed
from providers.azure.instances import azure_tags, core_tags, vm_name

FLEET = "fleet-a"
T4 = "Standard_NC4as_T4_v3"
START = 1_700_000_000.0


IDENTITY = (
    "/subscriptions/s/resourceGroups/ids/providers/Microsoft.ManagedIdentity/"
    "userAssignedIdentities/join"
)


def pool(
    name: str = "t4-spot",
    market: str = "spot",
    size: str = T4,
    gpus: int = 1,
    zone: str | None = None,
    **options: Any,
) -> Pool:
    return Pool(
        name=name,
        provider="azure",
        region=REGION,
        zone=zone,
        instance_type=size,
        gpus_per_instance=gpus,
        market=market,  # type: ignore[arg-type]
        options={**POOL_OPTIONS, **options},
    )


def provider(
    world: AzureWorld, pools: list[Pool], clock: ManualClock | None = None, **settings: Any
) -> AzureProvider:
    return AzureProvider.from_config(
        world.settings(**settings), pools, FLEET, clock or ManualClock(START)
    )


@pytest.fixture
def emulator(azure_world: AzureWorld) -> ArmEmulator:
    return azure_world.emulator


def wait_for(condition: Any, timeout: float = 30.0) -> None:
    """Until a poller thread of the SDK has done its work (it runs on its own); ``timeout`` is
    a ceiling scaled by the wait knob."""
    deadline = time.monotonic() + bound(timeout)
    while not condition():
        assert time.monotonic() < deadline, "timed out waiting on the emulator"
        time.sleep(0.01)


# -- launching -----------------------------------------------------------------------------


def test_spot_vms_carry_spot_settings_and_our_tags_and_only_ours_are_seen_and_deleted(
    azure_world: AzureWorld, emulator: ArmEmulator
) -> None:
    spot = pool()
    azure = provider(azure_world, [spot])
    result = azure.launch(spot, 3, "req-1", FLEET)
    assert len(result.instances) == 3 and result.shortfall is None
    assert sorted(i.id for i in result.instances) == sorted(
        vm_name(FLEET, "req-1", index) for index in range(3)
    )
    assert {i.state for i in result.instances} == {InstanceState.RUNNING}, "creates finished"
    emulator.add_vm("stranger", {"team": "research"})
    for instance in result.instances:
        vm = emulator.vm(instance.id)
        assert vm is not None and vm.state == "Succeeded"
        properties = vm.body["properties"]
        assert properties["priority"] == "Spot"
        assert properties["evictionPolicy"] == "Delete"
        assert properties["billingProfile"] == {"maxPrice": -1}
        assert properties["hardwareProfile"] == {"vmSize": T4}
        assert properties["storageProfile"]["imageReference"] == {
            "publisher": "Canonical",
            "offer": "0001-com-ubuntu-server-jammy",
            "sku": "22_04-lts-gen2",
            "version": "latest",
        }
        assert properties["storageProfile"]["osDisk"]["deleteOption"] == "Delete"
        nic = properties["networkProfile"]["networkInterfaceConfigurations"][0]["properties"]
        assert nic["deleteOption"] == "Delete"
        assert nic["ipConfigurations"][0]["properties"]["subnet"] == {
            "id": POOL_OPTIONS["subnet_id"]
        }
        linux = properties["osProfile"]["linuxConfiguration"]
        assert linux["disablePasswordAuthentication"] is True
        assert linux["ssh"]["publicKeys"][0]["keyData"] == POOL_OPTIONS["ssh_public_key"]
        assert vm.body["location"] == REGION and "zones" not in vm.body
        assert all("/" not in key for key in vm.body["tags"]), "Azure tag names forbid '/'"
        tags = core_tags(vm.body["tags"])
        assert tags[FLEET_TAG] == FLEET and tags[POOL_TAG] == "t4-spot"
        assert tags[REQUEST_TAG] == "req-1" and float(tags[LAUNCHED_AT_TAG]) == START
    listed = azure.list_instances(FLEET)
    assert sorted(i.id for i in listed) == sorted(i.id for i in result.instances)
    assert {(i.pool, i.request_id, i.gpus, i.launched_at) for i in listed} == {
        ("t4-spot", "req-1", 1, START)
    }
    azure.terminate([*[i.id for i in listed], "stranger"], "term-1")
    assert [vm.name for vm in emulator.all_vms()] == ["stranger"]
    assert emulator.tokens and emulator.tokens <= emulator.issued, "identity tokens, over TLS"


def test_on_demand_vms_are_regular_and_pool_options_reach_the_vm(
    azure_world: AzureWorld, emulator: ArmEmulator
) -> None:
    regular = pool("t4-od", market="on-demand", zone="eastus-2", os_disk_size_gb=128)
    capped = pool(
        "t4-capped",
        zone="1",
        max_price=0.25,
        custom_data="#cloud-config\nruncmd: [join-fleet]\n",
        admin_username="gpu",
        image="/subscriptions/s/resourceGroups/img/providers/Microsoft.Compute/images/node",
        identities=[IDENTITY],
    )
    azure = provider(azure_world, [regular, capped])
    (od,) = azure.launch(regular, 1, "req-od", FLEET).instances
    (cap,) = azure.launch(capped, 1, "req-cap", FLEET).instances
    od_vm, cap_vm = emulator.vm(od.id), emulator.vm(cap.id)
    assert od_vm is not None and cap_vm is not None
    od_properties = od_vm.body["properties"]
    assert od_properties["priority"] == "Regular"
    assert "evictionPolicy" not in od_properties and "billingProfile" not in od_properties
    assert od_properties["storageProfile"]["osDisk"]["diskSizeGB"] == 128
    assert od_vm.body["zones"] == ["2"]
    assert "identity" not in od_vm.body
    assert cap_vm.body["identity"] == {
        "type": "UserAssigned",
        "userAssignedIdentities": {IDENTITY: {}},
    }, "the identity a boot script reads Key Vault with"
    properties = cap_vm.body["properties"]
    assert properties["billingProfile"] == {"maxPrice": 0.25}
    assert cap_vm.body["zones"] == ["1"]
    assert properties["storageProfile"]["imageReference"] == {"id": capped.options["image"]}
    assert properties["osProfile"]["adminUsername"] == "gpu"
    assert properties["osProfile"]["linuxConfiguration"]["ssh"]["publicKeys"][0]["path"] == (
        "/home/gpu/.ssh/authorized_keys"
    )
    custom = base64.b64decode(properties["osProfile"]["customData"]).decode()
    assert custom.startswith("#cloud-config")


def test_a_repeated_launch_never_buys_a_second_set(
    azure_world: AzureWorld, emulator: ArmEmulator
) -> None:
    spot = pool()
    first = provider(azure_world, [spot]).launch(spot, 2, "req-crash", FLEET)
    puts = emulator.count("PUT", "/virtualMachines/")
    # the controller crashed after the call and before recording it: a new process retries
    again = provider(azure_world, [spot]).launch(spot, 2, "req-crash", FLEET)
    assert again.already_existed
    assert sorted(i.id for i in again.instances) == sorted(i.id for i in first.instances)
    assert emulator.count("PUT", "/virtualMachines/") == puts, "looked up, not created again"
    assert len(emulator.live()) == 2


def test_a_lost_answer_is_retried_into_the_vm_it_created(
    azure_world: AzureWorld, emulator: ArmEmulator
) -> None:
    spot = pool()
    azure = provider(azure_world, [spot])
    emulator.fail_next("launch", "timeout")  # ARM creates the VM, the answer never arrives
    with pytest.raises(TransientError) as caught:
        azure.launch(spot, 1, "req-lost", FLEET)
    assert caught.value.code == "Connection"
    assert len(emulator.live()) == 1
    retried = azure.launch(spot, 1, "req-lost", FLEET)
    assert retried.already_existed
    assert [i.id for i in retried.instances] == [vm_name(FLEET, "req-lost", 0)]
    assert len(emulator.live()) == 1


def test_a_lost_answer_and_a_listing_that_lags_still_give_one_vm(
    azure_world: AzureWorld, emulator: ArmEmulator
) -> None:
    spot = pool()
    azure = provider(azure_world, [spot])
    name = vm_name(FLEET, "req-lag", 0)
    emulator.hidden.add(name)  # the listing does not show the new VM yet
    emulator.fail_next("launch", "timeout")
    with pytest.raises(TransientError):
        azure.launch(spot, 1, "req-lag", FLEET)
    created = emulator.vm(name)
    assert created is not None
    (instance,) = azure.launch(spot, 1, "req-lag", FLEET).instances
    assert instance.id == name, "the same name again: ARM's PUT is an update"
    assert emulator.count("PUT", "/virtualMachines/") == 2
    assert [(vm.name, vm.vm_id) for vm in emulator.live()] == [(name, created.vm_id)]


def test_a_create_sku_not_available_is_a_capacity_error(
    azure_world: AzureWorld, emulator: ArmEmulator
) -> None:
    spot = pool()
    emulator.fail_next("launch", "sku")
    with pytest.raises(CapacityError) as caught:
        provider(azure_world, [spot]).launch(spot, 1, "req-sku", FLEET)
    assert caught.value.code == "SkuNotAvailable" and caught.value.pool == "t4-spot"
    assert emulator.all_vms() == []


def test_an_allocation_failure_of_the_operation_is_a_capacity_error_and_leaves_nothing(
    azure_world: AzureWorld, emulator: ArmEmulator
) -> None:
    spot = pool()
    emulator.fail_next("launch", "capacity")
    with pytest.raises(CapacityError) as caught:
        provider(azure_world, [spot]).launch(spot, 1, "req-alloc", FLEET)
    assert caught.value.code == "AllocationFailed" and caught.value.pool == "t4-spot"
    assert emulator.count("PUT", "/virtualMachines/") == 1, "ARM accepted the create"
    assert emulator.all_vms() == [], "the failed VM is deleted, not left behind"


def test_a_retry_after_a_failed_create_does_not_put_over_the_vm_being_deleted(
    azure_world: AzureWorld, emulator: ArmEmulator
) -> None:
    spot = pool()
    azure = provider(azure_world, [spot])
    emulator.hold_deletes = True
    emulator.fail_next("launch", "capacity")
    with pytest.raises(CapacityError):
        azure.launch(spot, 1, "req-retry", FLEET)
    first = vm_name(FLEET, "req-retry", 0)
    assert getattr(emulator.vm(first), "state", None) == "Deleting"
    (instance,) = azure.launch(spot, 1, "req-retry", FLEET).instances
    assert instance.id == vm_name(FLEET, "req-retry", 1)
    assert [vm.name for vm in emulator.live()] == [instance.id]


def test_a_short_capacity_is_a_partial_launch_with_a_capacity_shortfall(
    azure_world: AzureWorld, emulator: ArmEmulator
) -> None:
    spot = pool()
    emulator.grant_at_most(2)
    result = provider(azure_world, [spot]).launch(spot, 4, "req-partial", FLEET)
    assert len(result.instances) == 2
    assert isinstance(result.shortfall, CapacityError)
    assert result.shortfall.code == "AllocationFailed"
    assert sorted(vm.name for vm in emulator.all_vms()) == sorted(i.id for i in result.instances)


@pytest.mark.parametrize(
    ("fault", "expected", "code"),
    [
        ("quota", QuotaError, "OperationNotAllowed"),
        ("throttle", ThrottledError, "TooManyRequests"),
        ("server", TransientError, "InternalExecutionError"),
        ("auth", AuthError, "ExpiredAuthenticationToken"),
        ("forbidden", AuthError, "AuthorizationFailed"),
        ("bad", InvalidRequest, "InvalidParameter"),
        ("zonal", CapacityError, "ZonalAllocationFailed"),
        ("internal", TransientError, "InternalExecutionError"),
    ],
)
def test_launch_errors_arrive_typed(
    azure_world: AzureWorld,
    emulator: ArmEmulator,
    fault: str,
    expected: type[ProviderError],
    code: str,
) -> None:
    spot = pool()
    emulator.fail_next("launch", fault)
    with pytest.raises(expected) as caught:
        provider(azure_world, [spot]).launch(spot, 1, "req-fault", FLEET)
    error = caught.value
    assert error.code == code and error.pool == "t4-spot"
    if isinstance(error, QuotaError):
        assert error.scope is QuotaScope.REGION
        assert "LowPriorityCores" in str(error)
    if isinstance(error, ThrottledError):
        assert error.retry_after_s == RETRY_AFTER_S
    assert not any(token in str(error) for token in emulator.issued)
    assert emulator.live() == []


def test_a_slow_create_within_the_timeout_is_waited_for(
    azure_world: AzureWorld, emulator: ArmEmulator
) -> None:
    spot = pool()
    emulator.slow_creates(4)
    (instance,) = provider(azure_world, [spot]).launch(spot, 1, "req-slow", FLEET).instances
    assert instance.state is InstanceState.RUNNING
    assert emulator.count("GET", "/operations/") == 5, "InProgress four times, then Succeeded"


def test_a_create_still_running_at_the_timeout_counts_as_launched(
    azure_world: AzureWorld, emulator: ArmEmulator
) -> None:
    spot = pool()
    azure = provider(azure_world, [spot], operation_timeout_s=0.2, polling_interval_s=0.05)
    emulator.slow_creates(10_000)
    (instance,) = azure.launch(spot, 1, "req-late", FLEET).instances
    # the create would answer InProgress 10,000 times; the launch gave up after a handful of
    # polls (counted, not timed, so a busy machine cannot fail it)
    assert emulator.count("GET", "/operations/") < 100, "the tick is not held for the create"
    assert instance.state is InstanceState.PENDING
    (listed,) = azure.list_instances(FLEET)
    assert (listed.id, listed.state) == (instance.id, InstanceState.PENDING)


def test_a_create_that_fails_after_the_timeout_is_cleaned_up_by_the_listing(
    azure_world: AzureWorld, emulator: ArmEmulator
) -> None:
    spot = pool()
    azure = provider(azure_world, [spot], operation_timeout_s=0.05, polling_interval_s=0.05)
    emulator.slow_creates(3)
    emulator.grant_at_most(0)
    (instance,) = azure.launch(spot, 1, "req-fails-late", FLEET).instances
    assert instance.state is InstanceState.PENDING
    wait_for(lambda: getattr(emulator.vm(instance.id), "state", None) == "Failed")
    assert azure.list_instances(FLEET) == [], "a VM whose create failed holds nothing"
    assert emulator.all_vms() == [], "and it is deleted"


def test_a_failed_vm_that_still_runs_is_listed_and_kept(
    azure_world: AzureWorld, emulator: ArmEmulator
) -> None:
    spot = pool()
    emulator.add_vm(
        "failed-update", azure_tags({FLEET_TAG: FLEET, POOL_TAG: "t4-spot"}), state="Failed"
    )
    (listed,) = provider(azure_world, [spot]).list_instances(FLEET)
    assert (listed.id, listed.state) == ("failed-update", InstanceState.RUNNING)
    assert emulator.count("GET", "/instanceView") == 1
    assert emulator.vm("failed-update") is not None


# -- listing --------------------------------------------------------------------------------


def test_listing_follows_next_link_and_a_500_mid_listing_is_transient(
    azure_world: AzureWorld, emulator: ArmEmulator
) -> None:
    spot = pool()
    azure = provider(azure_world, [spot])
    assert len(azure.launch(spot, 7, "req-many", FLEET).instances) == 7
    for index in range(3):
        emulator.add_vm(f"stranger-{index}")
    before = emulator.count("GET", r"/virtualMachines$")
    assert len(azure.list_instances(FLEET)) == 7
    assert emulator.count("GET", r"/virtualMachines$") - before == 4, "10 VMs in pages of 3"
    emulator.fail_page(2, "server")
    with pytest.raises(TransientError) as caught:
        azure.list_instances(FLEET)
    assert caught.value.code == "InternalExecutionError"
    emulator.fail_page(1, "throttle")
    with pytest.raises(ThrottledError) as throttled:
        azure.list_instances(FLEET)
    assert throttled.value.retry_after_s == RETRY_AFTER_S


def test_listing_maps_provisioning_states(azure_world: AzureWorld, emulator: ArmEmulator) -> None:
    spot = pool()
    azure = provider(azure_world, [spot], operation_timeout_s=0.05, polling_interval_s=0.05)
    ready = azure.launch(spot, 2, "req-ready", FLEET).instances
    emulator.slow_creates(10_000)
    (creating,) = azure.launch(spot, 1, "req-creating", FLEET).instances
    emulator.hold_deletes = True
    azure.terminate([ready[0].id], "term-1")
    states = {i.id: i.state for i in azure.list_instances(FLEET)}
    assert states == {
        ready[0].id: InstanceState.TERMINATING,
        ready[1].id: InstanceState.RUNNING,
        creating.id: InstanceState.PENDING,
    }
    assert azure.poll_notices() == [], "our own deletes are no evictions"


# -- evictions ------------------------------------------------------------------------------


def test_an_eviction_is_one_terminate_notice_while_the_vm_still_shows(
    azure_world: AzureWorld, emulator: ArmEmulator
) -> None:
    spot, regular = pool(), pool("t4-od", market="on-demand")
    clock = ManualClock(START)
    azure = provider(azure_world, [spot, regular], clock)
    evicted, vanished = (i.id for i in azure.launch(spot, 2, "req-spot", FLEET).instances)
    (od,) = azure.launch(regular, 1, "req-od", FLEET).instances
    azure.list_instances(FLEET)
    assert azure.poll_notices() == []
    emulator.evict(evicted)  # eviction policy Delete: the VM reads Deleting for a while
    emulator.evict(vanished, linger=False)  # or is gone before we look
    emulator.evict(od.id, linger=False)  # someone deleted an on-demand VM: no eviction
    clock.advance(30)
    states = {i.id: i.state for i in azure.list_instances(FLEET)}
    assert states == {evicted: InstanceState.RUNNING}, "kept live this once, for the notice"
    notices = azure.poll_notices()
    assert {(n.instance_id, n.kind, n.pool, n.deadline) for n in notices} == {
        (evicted, NoticeKind.TERMINATE, "t4-spot", START + 30),
        (vanished, NoticeKind.TERMINATE, "t4-spot", START + 30),
    }
    assert azure.poll_notices() == notices, "kept until the tick acknowledges them"
    azure.acknowledge(notices)
    assert azure.poll_notices() == []
    assert {i.id: i.state for i in azure.list_instances(FLEET)} == {
        evicted: InstanceState.TERMINATING
    }
    emulator.finish_deletes()
    assert azure.list_instances(FLEET) == []
    assert azure.poll_notices() == [], "each eviction is reported once"


# -- prices ---------------------------------------------------------------------------------


def test_prices_come_from_the_retail_prices_api_paged_and_cached(
    azure_world: AzureWorld, emulator: ArmEmulator
) -> None:
    spot = pool()
    regular = pool("t4x4-od", market="on-demand", size="Standard_NC64as_T4_v3", gpus=4)
    clock = ManualClock(START)
    azure = provider(azure_world, [spot, regular], clock, price_ttl_s=600)
    quotes = {q.pool: q for q in azure.prices([spot, regular])}
    assert quotes["t4-spot"].price_per_hour == spot_price(T4), "the Linux spot meter"
    assert quotes["t4-spot"].on_demand_price_per_hour == on_demand_price(T4)
    assert quotes["t4-spot"].interruption_rate_per_hour is None
    assert quotes["t4-spot"].source == "azure-retail-prices"
    assert quotes["t4x4-od"].price_per_hour == on_demand_price("Standard_NC64as_T4_v3")
    assert quotes["t4x4-od"].as_of == START
    fetched = emulator.count("GET", "/api/retail/prices")
    assert fetched == 4, "five Consumption meters per size, in pages of four: two pages each"
    azure.prices([spot, regular])
    assert emulator.count("GET", "/api/retail/prices") == fetched, "cached within the TTL"
    clock.advance(601)
    azure.prices([spot, regular])
    assert emulator.count("GET", "/api/retail/prices") == 2 * fetched


def test_a_failing_price_api_is_typed_and_keeps_pools_it_could_price(
    azure_world: AzureWorld, emulator: ArmEmulator
) -> None:
    spot = pool()
    other = pool("v100", size="Standard_NC6s_v3")
    azure = provider(azure_world, [spot, other])
    emulator.price_faults = ["throttle"]
    quotes = azure.prices([spot, other])
    assert [q.pool for q in quotes] == ["v100"], "one pool failed, the other is priced"
    emulator.price_faults = ["server", "server"]
    with pytest.raises(TransientError):
        provider(azure_world, [spot, other]).prices([spot, other])
    emulator.price_faults = ["throttle"]
    with pytest.raises(ThrottledError) as caught:
        provider(azure_world, [spot]).prices([spot])
    assert caught.value.retry_after_s == RETRY_AFTER_S


def test_prices_from_a_skypilot_catalog(
    azure_world: AzureWorld, emulator: ArmEmulator, tmp_path: Path
) -> None:
    catalog = tmp_path / "azure.csv"
    catalog.write_text(
        "InstanceType,AcceleratorName,AcceleratorCount,vCPUs,MemoryGiB,Price,SpotPrice,"
        "Region,AvailabilityZone\n"
        f"{T4},T4,1,4,28,0.526,0.0917,{REGION},\n"
        f"{T4},T4,1,4,28,0.526,0.0801,westus2,\n"
    )
    spot = pool()
    missing = pool("v100", size="Standard_NC6s_v3")
    offline = provider(
        azure_world, [spot, missing], price_catalog=str(catalog), retail_prices_url=None
    )
    (quote,) = offline.prices([spot, missing])
    assert (quote.pool, quote.price_per_hour, quote.on_demand_price_per_hour) == (
        "t4-spot",
        0.0917,
        0.526,
    )
    assert quote.source == "catalog"
    assert emulator.count("GET", "/api/retail/prices") == 0
    online = provider(azure_world, [spot, missing], price_catalog=str(catalog))
    quotes = {q.pool: q for q in online.prices([spot, missing])}
    assert quotes["t4-spot"].source == "catalog"
    assert quotes["v100"].source == "azure-retail-prices", "what the catalog lacks"
    assert quotes["v100"].price_per_hour == spot_price("Standard_NC6s_v3")


# -- settings, names, errors, imports -------------------------------------------------------


def test_settings_and_pool_options_are_checked(azure_world: AzureWorld) -> None:
    with pytest.raises(InputError, match=r"providers\.azure\.subscription_id"):
        AzureProvider.from_config({"resource_group": "rg"}, [], FLEET)
    with pytest.raises(InputError, match=r"providers\.azure\.endpoint"):
        AzureProvider.from_config(azure_world.settings(endpoint="127.0.0.1:1"), [], FLEET)
    with pytest.raises(InputError, match=r"providers\.azure\.operation_timeout_s"):
        AzureProvider.from_config(azure_world.settings(operation_timeout_s=-1), [], FLEET)
    with pytest.raises(InputError, match=r"providers\.azure\.polling_intervall"):
        AzureProvider.from_config(azure_world.settings(polling_intervall=1), [], FLEET)
    no_image = pool()
    no_image.options.pop("image")
    with pytest.raises(InputError, match=r"pools\[0\]\.options\.image"):
        AzureProvider.from_config(azure_world.settings(), [no_image], FLEET)
    with pytest.raises(InputError, match=r"pools\[1\]\.options\.subnet_id: .*subnet resource id"):
        AzureProvider.from_config(
            azure_world.settings(), [pool(), pool("b", subnet_id="nodes")], FLEET
        )
    with pytest.raises(InputError, match=r"pools\[0\]\.options\.image: .*Publisher:Offer"):
        AzureProvider.from_config(azure_world.settings(), [pool(image="ubuntu")], FLEET)
    with pytest.raises(InputError, match=r"pools\[0\]\.options\.max_price"):
        AzureProvider.from_config(azure_world.settings(), [pool(max_price=0)], FLEET)
    with pytest.raises(InputError, match=r"pools\[0\]\.options\.max_price: .*spot pools only"):
        AzureProvider.from_config(
            azure_world.settings(), [pool(market="on-demand", max_price=0.3)], FLEET
        )
    with pytest.raises(InputError, match=r"pools\[0\]\.options\.zones"):
        AzureProvider.from_config(azure_world.settings(), [pool(zones=["1"])], FLEET)
    with pytest.raises(InputError, match=r"pools\[0\]\.options\.identities: .*user-assigned"):
        AzureProvider.from_config(azure_world.settings(), [pool(identities=["join"])], FLEET)
    with pytest.raises(InputError, match=r"pools\[0\]\.options\.identities: .*named twice"):
        twice = [IDENTITY, IDENTITY.upper()]
        AzureProvider.from_config(azure_world.settings(), [pool(identities=twice)], FLEET)


def test_vm_names_are_deterministic_valid_and_distinct() -> None:
    names = {
        vm_name(fleet, request, index)
        for fleet in ("fleet-a", "Fleet_B.prod", "x" * 128)
        for request in ("r1", "r2", "abc123def456-17-0-1")
        for index in range(3)
    }
    assert len(names) == 27
    assert vm_name("fleet-a", "r1", 0) == vm_name("fleet-a", "r1", 0)
    for name in names:
        assert re.fullmatch(r"[a-z0-9][a-z0-9-]{0,62}[a-z0-9]", name), name


def test_tags_round_trip_under_names_azure_allows() -> None:
    tags = {FLEET_TAG: "f", POOL_TAG: "p", REQUEST_TAG: "r", LAUNCHED_AT_TAG: "1.0", "team": "x"}
    stored = azure_tags(tags)
    assert all(not set(key) & set("<>%&\\?/") for key in stored)
    assert core_tags(stored) == tags
    assert core_tags({k.upper(): v for k, v in stored.items()})[FLEET_TAG] == "f"


def test_credential_failures_are_auth_errors_that_say_nothing_secret() -> None:
    from azure.core.exceptions import ClientAuthenticationError
    from azure.identity import CredentialUnavailableError

    for error in (
        CredentialUnavailableError("EnvironmentCredential: AZURE_CLIENT_SECRET=hunter2 rejected"),
        ClientAuthenticationError("token request failed: client_secret=hunter2"),
    ):
        mapped = typed(error, "t4-spot")
        assert isinstance(mapped, AuthError) and mapped.code == "NoCredentials"
        assert "hunter2" not in str(mapped)


def test_the_core_and_other_providers_import_without_azure_on_the_path() -> None:
    """Importing needs no SDK; building the provider without it is one line naming the extra."""
    code = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] == 'azure':\n"
        "            raise ImportError(name)\n"
        "sys.meta_path.insert(0, Block())\n"
        "import autoscaler.tick.controller, autoscaler.app.assembly\n"
        "import providers.aws, providers.azure\n"
        "from providers.azure import AzureProvider\n"
        "from autoscaler.model.errors import InputError\n"
        "print('imported')\n"
        "try:\n"
        "    AzureProvider.from_config({'subscription_id': 's', 'resource_group': 'rg'}, [], 'f')\n"
        "except InputError as exc:\n"
        "    print(exc)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=bound(120),
        check=False,
    )
    assert done.returncode == 0 and "imported" in done.stdout, done.stderr
    assert "pip install 'hybrid-gpu-autoscaler[azure]'" in done.stdout


def test_an_endpoint_changes_where_arm_is_never_how_we_authenticate(
    azure_world: AzureWorld, emulator: ArmEmulator
) -> None:
    """No test-only credential: with an endpoint the provider authenticates as without one, and
    the emulator is reached through DefaultAzureCredential's own managed identity step."""
    from azure.identity import DefaultAzureCredential

    emulated = provider(azure_world, [pool()])
    real = AzureProvider.from_config(
        {"subscription_id": SUBSCRIPTION, "resource_group": "rg"}, [], FLEET
    )
    for made in (emulated, real):
        assert isinstance(made.client()._config.credential, DefaultAzureCredential)
    assert real.client()._config.base_url.rstrip("/") == "https://management.azure.com"
    assert emulated.client()._config.base_url.rstrip("/") == emulator.url

    asked = emulator.identity_requests
    assert emulated.list_instances(FLEET) == []
    assert emulator.identity_requests > asked, "the token came from the identity endpoint"
    with pytest.raises(InputError, match=r"providers\.azure\.endpoint: .*https://"):
        AzureProvider.from_config(azure_world.settings(endpoint="http://127.0.0.1:1"), [], FLEET)
