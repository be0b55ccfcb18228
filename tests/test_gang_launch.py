"""Gangs: a multi-node job's instances launched all or none, close together, on each cloud.

AWS runs against moto behind ``aws_placement.PlacementProxy`` (moto has no placement groups),
GCP and Azure against their emulators; every call is the real SDK over HTTP. What is shared by
the three (whole gang, rollback of a partial one, idempotent retry) is also in the provider
contract (test_provider_contract.py); here are each cloud's own paths.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import boto3
import pytest
import requests
from aws_placement import PlacementProxy
from aws_support import REGION, Faults, inject, instance_tags
from azure_emulator import POOL_OPTIONS, ArmEmulator, AzureWorld
from azure_emulator import REGION as AZURE_REGION
from gcp_emulator import IMAGE, PROJECT, ComputeEmulator
from gcp_emulator import REGION as GCP_REGION
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from terraform_support import (
    TERRAFORM,
    aws_calls,
    azure_calls,
    blocks,
    gcp_calls,
    load_module,
    locals_of,
    policy_statements,
)
from waits import bound

from autoscaler.model import InstanceState, Pool
from autoscaler.model.clock import ManualClock
from autoscaler.model.errors import (
    CapacityError,
    InputError,
    InvalidRequest,
    ThrottledError,
    TransientError,
)
from autoscaler.spi.provider import FLEET_TAG, LAUNCHED_AT_TAG, POOL_TAG, REQUEST_TAG, GangLauncher
from providers.aws import AwsProvider
from providers.aws.settings import PLACEMENT_GROUP_NAME
from providers.azure import AzureProvider
from providers.azure.instances import core_tags
from providers.azure.settings import PPG_NAME
from providers.gcp import GcpProvider
from providers.gcp.instances import tags_from_labels
from providers.gcp.settings import RESOURCE_NAME
from providers.placement import derived_name

FLEET = "fleet-g"
NOW = 1_700_000_000.0
LIVE = (InstanceState.PENDING, InstanceState.RUNNING)


# -- AWS ------------------------------------------------------------------------------------------


def aws_pool(name: str = "p4d", *, fleet: bool = False, **placement: Any) -> Pool:
    """Eight A100s a node: RunInstances for one shape in one zone, CreateFleet for several."""
    options: dict[str, Any] = (
        {
            "instance_types": ["p4de.24xlarge"],
            "zones": ["us-east-1a", "us-east-1b"],
            "launch_template": {"name": "gpu"},
        }
        if fleet
        else {"image_id": "ami-12c6146b"}
    )
    if placement:
        options["placement_group"] = placement
    return Pool(
        name=name,
        provider="aws",
        region=REGION,
        zone=None if fleet else "us-east-1a",
        instance_type="p4d.24xlarge",
        gpus_per_instance=8,
        market="on-demand",  # type: ignore[arg-type]
        options=options,
    )


def aws_provider(proxy: PlacementProxy, pools: list[Pool]) -> AwsProvider:
    return AwsProvider.from_config({"endpoint_url": proxy.url}, pools, FLEET, ManualClock(NOW))


def moto_instances(url: str) -> list[dict[str, Any]]:
    ec2 = boto3.client("ec2", region_name=REGION, endpoint_url=url)
    return [i for r in ec2.describe_instances()["Reservations"] for i in r["Instances"]]


def moto_alive(url: str) -> list[dict[str, Any]]:
    return [i for i in moto_instances(url) if i["State"]["Name"] in ("pending", "running")]


def gang_of(provider: Any) -> GangLauncher:
    assert isinstance(provider, GangLauncher)
    return provider


@pytest.mark.parametrize("fleet", [False, True], ids=["run-instances", "create-fleet"])
def test_aws_gang_comes_up_whole_in_the_group_it_created(
    ec2_groups: PlacementProxy, fleet: bool
) -> None:
    pool = aws_pool(fleet=fleet, create=True)
    provider = aws_provider(ec2_groups, [pool])
    result = gang_of(provider).launch_gang(pool, 3, "gang-1", FLEET)
    assert len(result.instances) == 3 and result.shortfall is None and not result.already_existed
    group = derived_name(FLEET, "p4d")
    assert ec2_groups.created == [group]
    (made,) = ec2_groups.groups.values()
    assert made.strategy == "cluster"
    assert made.tags == {FLEET_TAG: FLEET, POOL_TAG: "p4d"}
    ids = sorted(i.id for i in result.instances)
    assert {i: ec2_groups.group_of(i) for i in ids} == dict.fromkeys(ids, group)
    for raw in moto_alive(ec2_groups.upstream_url):
        tags = instance_tags(raw)
        assert tags[FLEET_TAG] == FLEET and tags[POOL_TAG] == "p4d"
        assert tags[REQUEST_TAG] == "gang-1" and float(tags[LAUNCHED_AT_TAG]) == NOW
    assert sorted(i.id for i in provider.list_instances(FLEET)) == ids
    if fleet:
        assert (
            len(
                {
                    raw["Placement"]["AvailabilityZone"]
                    for raw in moto_alive(ec2_groups.upstream_url)
                }
            )
            == 1
        )


def test_aws_gang_goes_into_a_named_group_and_never_creates_one(
    ec2_groups: PlacementProxy,
) -> None:
    ec2_groups.add_group("hpc-rack-7")
    pool = aws_pool(name="hpc")
    pool = pool.model_copy(
        update={"options": {**pool.options, "placement_group": {"name": "hpc-rack-7"}}}
    )
    result = gang_of(aws_provider(ec2_groups, [pool])).launch_gang(pool, 2, "gang-n", FLEET)
    assert {ec2_groups.group_of(i.id) for i in result.instances} == {"hpc-rack-7"}
    assert ec2_groups.created == []


def test_aws_a_named_group_that_does_not_exist_is_a_config_mistake(
    ec2_groups: PlacementProxy,
) -> None:
    pool = aws_pool(name="hpc")
    pool = pool.model_copy(
        update={"options": {**pool.options, "placement_group": {"name": "nowhere"}}}
    )
    with pytest.raises(InvalidRequest, match="placement group 'nowhere' does not exist"):
        gang_of(aws_provider(ec2_groups, [pool])).launch_gang(pool, 2, "gang-x", FLEET)
    assert moto_instances(ec2_groups.upstream_url) == []
    assert "RunInstances" not in ec2_groups.operations()


def test_aws_group_is_reused_across_gangs_and_restarts(ec2_groups: PlacementProxy) -> None:
    pool = aws_pool(create=True)
    provider = aws_provider(ec2_groups, [pool])
    gang_of(provider).launch_gang(pool, 2, "gang-a", FLEET)
    gang_of(provider).launch_gang(pool, 2, "gang-b", FLEET)
    restarted = aws_provider(ec2_groups, [pool])
    gang_of(restarted).launch_gang(pool, 2, "gang-c", FLEET)
    operations = ec2_groups.operations()
    assert operations.count("CreatePlacementGroup") == 1
    assert operations.count("DescribePlacementGroups") == 2, "once per provider object"
    assert (
        len({ec2_groups.group_of(i["InstanceId"]) for i in moto_alive(ec2_groups.upstream_url)})
        == 1
    )


@pytest.mark.parametrize("fleet", [False, True], ids=["run-instances", "create-fleet"])
def test_aws_a_gang_that_comes_up_short_is_terminated_whole(
    ec2_groups: PlacementProxy, fleet: bool
) -> None:
    pool = aws_pool(fleet=fleet, create=True)
    provider = aws_provider(ec2_groups, [pool])
    ec2_groups.come_up(2)
    with pytest.raises(CapacityError) as caught:
        gang_of(provider).launch_gang(pool, 4, "gang-short", FLEET)
    assert caught.value.pool == "p4d"
    launched = moto_instances(ec2_groups.upstream_url)
    assert len(launched) == 2, "two came up..."
    assert moto_alive(ec2_groups.upstream_url) == [], "...and both were terminated"
    assert [i for i in provider.list_instances(FLEET) if i.state in LIVE] == []


@pytest.mark.parametrize("fleet", [False, True], ids=["run-instances", "create-fleet"])
def test_aws_all_or_nothing_refused_for_capacity_launches_nothing(
    ec2_groups: PlacementProxy, fleet: bool
) -> None:
    pool = aws_pool(fleet=fleet, create=True)
    ec2_groups.refuse_over(3)
    with pytest.raises(CapacityError) as caught:
        gang_of(aws_provider(ec2_groups, [pool])).launch_gang(pool, 4, "gang-big", FLEET)
    assert caught.value.code == "InsufficientInstanceCapacity"
    assert moto_instances(ec2_groups.upstream_url) == []
    smaller = gang_of(aws_provider(ec2_groups, [pool])).launch_gang(pool, 3, "gang-fits", FLEET)
    assert len(smaller.instances) == 3


def test_aws_members_the_answer_left_out_are_found_by_tag_and_terminated(
    ec2_groups: PlacementProxy,
) -> None:
    """EC2 launched the whole gang but the answer lists only one: the rest must not be left
    running unseen."""
    pool = aws_pool(create=True)
    provider = aws_provider(ec2_groups, [pool])

    def one_only(parsed: dict[str, Any], **_: Any) -> None:
        parsed["Instances"] = parsed["Instances"][:1]

    provider.client("ec2", REGION).meta.events.register("after-call.ec2.RunInstances", one_only)
    with pytest.raises(CapacityError):
        gang_of(provider).launch_gang(pool, 3, "gang-hidden", FLEET)
    assert len(moto_instances(ec2_groups.upstream_url)) == 3
    assert moto_alive(ec2_groups.upstream_url) == []


def test_aws_retry_returns_the_whole_gang_and_launches_nothing_more(
    ec2_groups: PlacementProxy,
) -> None:
    pool = aws_pool(create=True)
    first = gang_of(aws_provider(ec2_groups, [pool])).launch_gang(pool, 3, "gang-r", FLEET)
    again = gang_of(aws_provider(ec2_groups, [pool])).launch_gang(pool, 3, "gang-r", FLEET)
    assert again.already_existed
    assert sorted(i.id for i in again.instances) == sorted(i.id for i in first.instances)
    assert ec2_groups.operations().count("RunInstances") == 1
    assert len(moto_alive(ec2_groups.upstream_url)) == 3


def test_aws_retry_that_finds_part_of_a_gang_terminates_it_and_buys_nothing(
    ec2_groups: PlacementProxy,
) -> None:
    pool = aws_pool(create=True)
    launched = gang_of(aws_provider(ec2_groups, [pool])).launch_gang(pool, 3, "gang-p", FLEET)
    boto3.client(
        "ec2", region_name=REGION, endpoint_url=ec2_groups.upstream_url
    ).terminate_instances(InstanceIds=[launched.instances[0].id])
    with pytest.raises(CapacityError) as caught:
        gang_of(aws_provider(ec2_groups, [pool])).launch_gang(pool, 3, "gang-p", FLEET)
    assert caught.value.code == "GangIncomplete"
    assert moto_alive(ec2_groups.upstream_url) == []
    assert ec2_groups.operations().count("RunInstances") == 1


def test_aws_a_rollback_cut_short_is_finished_by_the_retry(ec2_groups: PlacementProxy) -> None:
    pool = aws_pool(create=True)
    provider = aws_provider(ec2_groups, [pool])
    ec2_groups.come_up(1)
    faults = Faults(planned=["throttle"])
    stop = inject(provider.client("ec2", REGION), "TerminateInstances", faults)
    with pytest.raises(ThrottledError):
        gang_of(provider).launch_gang(pool, 2, "gang-t", FLEET)
    assert len(moto_alive(ec2_groups.upstream_url)) == 1, "the rollback could not finish"
    stop()
    ec2_groups.come_up(None)
    with pytest.raises(CapacityError, match="found with 1 of 2"):
        gang_of(provider).launch_gang(pool, 2, "gang-t", FLEET)
    assert moto_alive(ec2_groups.upstream_url) == []


def test_aws_gang_without_a_placement_option_is_still_all_or_nothing(
    ec2_groups: PlacementProxy,
) -> None:
    pool = aws_pool()
    provider = aws_provider(ec2_groups, [pool])
    # moto launches exactly MinCount: two instances mean the gang asked for MinCount=2
    result = gang_of(provider).launch_gang(pool, 2, "gang-u", FLEET)
    assert len(result.instances) == 2
    assert {ec2_groups.group_of(i.id) for i in result.instances} == {None}
    assert "DescribePlacementGroups" not in ec2_groups.operations()


@pytest.mark.parametrize(
    ("placement", "message"),
    [
        ({}, "give the name of an existing group, or create: true"),
        ({"name": "has space"}, "expected up to 255 printable ASCII"),
        ({"create": True, "strategy": "spread"}, "unknown field"),
    ],
)
def test_aws_placement_option_is_checked(placement: dict[str, Any], message: str) -> None:
    pool = aws_pool()
    pool = pool.model_copy(update={"options": {**pool.options, "placement_group": placement}})
    with pytest.raises(InputError, match=r"pools\[0\]\.options\.placement_group") as caught:
        AwsProvider.from_config({}, [pool], FLEET)
    assert message in str(caught.value)


# -- GCP ------------------------------------------------------------------------------------------

GCP_A, GCP_B = f"{GCP_REGION}-a", f"{GCP_REGION}-b"


def gcp_pool(
    name: str = "a2-8g", *, zones: tuple[str, ...] = (GCP_A, GCP_B), **options: Any
) -> Pool:
    return Pool(
        name=name,
        provider="gcp",
        region=GCP_REGION,
        instance_type="a2-highgpu-8g",
        gpus_per_instance=8,
        market="spot",  # type: ignore[arg-type]
        options={"zones": list(zones), "image": IMAGE, **options},
    )


def gcp_provider(gcp: ComputeEmulator, pools: list[Pool], **settings: Any) -> GcpProvider:
    clock = ManualClock(NOW)
    gcp.clock = clock.now
    return GcpProvider.from_config(
        {"project": PROJECT, "endpoint": gcp.url, "operation_timeout_s": bound(30), **settings},
        pools,
        FLEET,
        clock,
    )


def calls(gcp: ComputeEmulator, method: str, suffix: str) -> int:
    return sum(1 for m, path in gcp.requests if m == method and path.endswith(suffix))


def test_gcp_gang_is_one_bulk_insert_under_the_policy_it_created(gcp: ComputeEmulator) -> None:
    pool = gcp_pool(placement_policy={"create": True})
    provider = gcp_provider(gcp, [pool])
    result = gang_of(provider).launch_gang(pool, 3, "gang-1", FLEET)
    assert len(result.instances) == 3 and result.shortfall is None and not result.already_existed
    name = derived_name(FLEET, "a2-8g")
    policy = gcp.policies[(GCP_REGION, name)]
    assert policy["groupPlacementPolicy"]["collocation"] == "COLLOCATED"
    assert FLEET in policy["description"] and "a2-8g" in policy["description"]
    assert calls(gcp, "POST", "/instances/bulkInsert") == 1
    assert calls(gcp, "POST", "/instances") == 0, "no VM is inserted on its own"
    ids = sorted(i.id for i in result.instances)
    assert sorted(gcp.live()) == ids
    for vm_name in ids:
        assert gcp.policies_of(vm_name) == [name]
        zone, vm = gcp.find(vm_name)
        assert zone == GCP_A
        assert vm["machineType"].endswith("/zones/us-central1-a/machineTypes/a2-highgpu-8g")
        tags = tags_from_labels(vm["labels"])
        assert tags[FLEET_TAG] == FLEET and tags[POOL_TAG] == "a2-8g"
        assert tags[REQUEST_TAG] == "gang-1" and float(tags[LAUNCHED_AT_TAG]) == NOW
        assert vm["scheduling"]["provisioningModel"] == "SPOT"
    assert sorted(i.id for i in provider.list_instances(FLEET)) == ids


def test_gcp_gang_under_a_named_policy_creates_none(gcp: ComputeEmulator) -> None:
    gcp.add_policy(GCP_REGION, "rack-a")
    pool = gcp_pool(placement_policy={"name": "rack-a"})
    result = gang_of(gcp_provider(gcp, [pool])).launch_gang(pool, 2, "gang-n", FLEET)
    assert {p for i in result.instances for p in gcp.policies_of(i.id)} == {"rack-a"}
    assert calls(gcp, "POST", "/resourcePolicies") == 0


def test_gcp_a_named_policy_that_does_not_exist_is_a_config_mistake(gcp: ComputeEmulator) -> None:
    pool = gcp_pool(placement_policy={"name": "nowhere"})
    with pytest.raises(InvalidRequest, match="resource policy 'nowhere' does not exist"):
        gang_of(gcp_provider(gcp, [pool])).launch_gang(pool, 2, "gang-x", FLEET)
    assert gcp.instances == {} and calls(gcp, "POST", "/instances/bulkInsert") == 0


def test_gcp_policy_is_reused_across_gangs_and_restarts(gcp: ComputeEmulator) -> None:
    pool = gcp_pool(placement_policy={"create": True})
    provider = gcp_provider(gcp, [pool])
    gang_of(provider).launch_gang(pool, 2, "gang-a", FLEET)
    gang_of(provider).launch_gang(pool, 2, "gang-b", FLEET)
    gang_of(gcp_provider(gcp, [pool])).launch_gang(pool, 2, "gang-c", FLEET)
    assert calls(gcp, "POST", "/resourcePolicies") == 1
    assert len(gcp.policies) == 1 and len(gcp.live()) == 6


def test_gcp_a_full_zone_hands_the_whole_gang_to_the_next(gcp: ComputeEmulator) -> None:
    pool = gcp_pool(placement_policy={"create": True})
    gcp.full_zones.add(GCP_A)
    result = gang_of(gcp_provider(gcp, [pool])).launch_gang(pool, 3, "gang-z", FLEET)
    assert {gcp.find(i.id)[0] for i in result.instances} == {GCP_B}


def test_gcp_all_or_nothing_refused_in_every_zone_makes_nothing(gcp: ComputeEmulator) -> None:
    pool = gcp_pool(placement_policy={"create": True})
    gcp.gang_fits(2)
    with pytest.raises(CapacityError) as caught:
        gang_of(gcp_provider(gcp, [pool])).launch_gang(pool, 3, "gang-big", FLEET)
    assert caught.value.code == "ZONE_RESOURCE_POOL_EXHAUSTED"
    assert calls(gcp, "POST", "/instances/bulkInsert") == 2, "one try per zone"
    assert gcp.instances == {}


def test_gcp_vms_a_failed_bulk_insert_left_behind_are_deleted(gcp: ComputeEmulator) -> None:
    pool = gcp_pool(zones=(GCP_A,), placement_policy={"create": True})
    provider = gcp_provider(gcp, [pool])
    gcp.gang_fits(2, leftovers=True)
    with pytest.raises(CapacityError):
        gang_of(provider).launch_gang(pool, 4, "gang-left", FLEET)
    assert calls(gcp, "DELETE", "") == 2, "the two that fitted were deleted"
    assert gcp.live() == {}
    assert [i for i in provider.list_instances(FLEET) if i.state in LIVE] == []


def test_gcp_retry_returns_the_whole_gang_and_buys_nothing_more(gcp: ComputeEmulator) -> None:
    pool = gcp_pool(placement_policy={"create": True})
    first = gang_of(gcp_provider(gcp, [pool])).launch_gang(pool, 3, "gang-r", FLEET)
    again = gang_of(gcp_provider(gcp, [pool])).launch_gang(pool, 3, "gang-r", FLEET)
    assert again.already_existed
    assert sorted(i.id for i in again.instances) == sorted(i.id for i in first.instances)
    assert calls(gcp, "POST", "/instances/bulkInsert") == 1 and len(gcp.live()) == 3


def test_gcp_an_answer_lost_on_the_way_back_is_found_by_the_retry(gcp: ComputeEmulator) -> None:
    pool = gcp_pool(placement_policy={"create": True})
    provider = gcp_provider(gcp, [pool])
    gcp.fail_next("bulk", "lost")
    with pytest.raises(TransientError):
        gang_of(provider).launch_gang(pool, 2, "gang-lost", FLEET)
    again = gang_of(provider).launch_gang(pool, 2, "gang-lost", FLEET)
    assert again.already_existed and len(again.instances) == 2 and len(gcp.live()) == 2


def test_gcp_retry_that_finds_part_of_a_gang_deletes_it(gcp: ComputeEmulator) -> None:
    pool = gcp_pool(placement_policy={"create": True})
    launched = gang_of(gcp_provider(gcp, [pool])).launch_gang(pool, 3, "gang-p", FLEET)
    gcp.preempt(launched.instances[0].id, delete=True)
    with pytest.raises(CapacityError) as caught:
        gang_of(gcp_provider(gcp, [pool])).launch_gang(pool, 3, "gang-p", FLEET)
    assert caught.value.code == "GangIncomplete"
    assert gcp.live() == {} and calls(gcp, "POST", "/instances/bulkInsert") == 1


def test_gcp_a_bulk_insert_not_done_in_time_counts_whole(gcp: ComputeEmulator) -> None:
    pool = gcp_pool(placement_policy={"create": True})
    provider = gcp_provider(gcp, [pool], operation_timeout_s=0.3)
    gcp.slow_polls = 10_000
    gcp.fail_next("bulk", "slow")
    result = gang_of(provider).launch_gang(pool, 2, "gang-slow", FLEET)
    assert len(result.instances) == 2
    assert {i.state for i in result.instances} == {InstanceState.PENDING}
    assert {vm["status"] for vm in gcp.live().values()} == {"PROVISIONING"}


def test_gcp_guest_gpus_are_named_as_a_bulk_insert_takes_them(gcp: ComputeEmulator) -> None:
    pool = Pool(
        name="t4",
        provider="gcp",
        region=GCP_REGION,
        zone=GCP_A,
        instance_type="n1-standard-8",
        gpus_per_instance=2,
        market="on-demand",  # type: ignore[arg-type]
        options={"image": IMAGE, "accelerator_type": "nvidia-tesla-t4"},
    )
    result = gang_of(gcp_provider(gcp, [pool])).launch_gang(pool, 2, "gang-t4", FLEET)
    for instance in result.instances:
        (accelerator,) = gcp.find(instance.id)[1]["guestAccelerators"]
        assert accelerator["acceleratorType"].endswith(
            "/zones/us-central1-a/acceleratorTypes/nvidia-tesla-t4"
        )
        assert int(accelerator["acceleratorCount"]) == 2
    assert calls(gcp, "POST", "/resourcePolicies") == 0, "no option, no policy"


@pytest.mark.parametrize(
    ("placement", "message"),
    [
        ({}, "give the name of an existing group, or create: true"),
        ({"name": "Rack_A"}, "expected a resource name"),
    ],
)
def test_gcp_placement_option_is_checked(placement: dict[str, Any], message: str) -> None:
    pool = gcp_pool(placement_policy=placement)
    with pytest.raises(InputError, match=r"pools\[0\]\.options\.placement_policy") as caught:
        GcpProvider.from_config({"project": PROJECT}, [pool], FLEET)
    assert message in str(caught.value)


# -- Azure ----------------------------------------------------------------------------------------

ND = "Standard_ND96asr_v4"


def azure_pool(name: str = "nd", *, zone: str | None = None, **placement: Any) -> Pool:
    options: dict[str, Any] = dict(POOL_OPTIONS)
    if placement:
        options["proximity_placement_group"] = placement
    return Pool(
        name=name,
        provider="azure",
        region=AZURE_REGION,
        zone=zone,
        instance_type=ND,
        gpus_per_instance=8,
        market="on-demand",  # type: ignore[arg-type]
        options=options,
    )


def azure_provider(world: AzureWorld, pools: list[Pool]) -> AzureProvider:
    return AzureProvider.from_config(world.settings(), pools, FLEET, ManualClock(NOW))


def test_azure_gang_comes_up_whole_in_the_group_it_created(azure_world: AzureWorld) -> None:
    arm = azure_world.emulator
    pool = azure_pool(zone="2", create=True)
    provider = azure_provider(azure_world, [pool])
    result = gang_of(provider).launch_gang(pool, 3, "gang-1", FLEET)
    assert len(result.instances) == 3 and result.shortfall is None and not result.already_existed
    name = derived_name(FLEET, "nd")
    group = arm.group(name)
    assert group is not None
    assert group["location"] == AZURE_REGION and group["zones"] == ["2"]
    assert group["properties"]["intent"] == {"vmSizes": [ND]}
    assert core_tags(group["tags"]) == {FLEET_TAG: FLEET, POOL_TAG: "nd"}
    ids = sorted(i.id for i in result.instances)
    assert sorted(m["id"].rsplit("/", 1)[-1] for m in group["properties"]["virtualMachines"]) == ids
    for vm in arm.live():
        tags = core_tags(vm.body["tags"])
        assert tags[FLEET_TAG] == FLEET and tags[POOL_TAG] == "nd"
        assert tags[REQUEST_TAG] == "gang-1" and float(tags[LAUNCHED_AT_TAG]) == NOW
        assert vm.body["zones"] == ["2"]
    assert sorted(i.id for i in provider.list_instances(FLEET)) == ids


def test_azure_gang_goes_into_a_named_group_and_creates_none(azure_world: AzureWorld) -> None:
    arm = azure_world.emulator
    arm.add_group("hpc-ppg")
    pool = azure_pool(name="hpc")
    pool = pool.model_copy(
        update={"options": {**pool.options, "proximity_placement_group": {"name": "hpc-ppg"}}}
    )
    result = gang_of(azure_provider(azure_world, [pool])).launch_gang(pool, 2, "gang-n", FLEET)
    assert {arm.group_of(i.id) for i in result.instances} == {"hpc-ppg"}
    assert arm.count("PUT", "/proximityPlacementGroups/") == 0


def test_azure_a_missing_or_faraway_group_is_a_config_mistake(azure_world: AzureWorld) -> None:
    arm = azure_world.emulator
    pool = azure_pool(name="hpc")
    missing = pool.model_copy(
        update={"options": {**pool.options, "proximity_placement_group": {"name": "nowhere"}}}
    )
    with pytest.raises(InvalidRequest, match="proximity placement group 'nowhere' does not exist"):
        gang_of(azure_provider(azure_world, [missing])).launch_gang(missing, 2, "gang-x", FLEET)
    arm.add_group("far", location="westeurope")
    far = pool.model_copy(
        update={"options": {**pool.options, "proximity_placement_group": {"name": "far"}}}
    )
    with pytest.raises(InvalidRequest, match="is in westeurope, the pool in eastus"):
        gang_of(azure_provider(azure_world, [far])).launch_gang(far, 2, "gang-y", FLEET)
    assert arm.all_vms() == []


def test_azure_group_is_reused_across_gangs_and_restarts(azure_world: AzureWorld) -> None:
    arm = azure_world.emulator
    pool = azure_pool(create=True)
    provider = azure_provider(azure_world, [pool])
    gang_of(provider).launch_gang(pool, 2, "gang-a", FLEET)
    gang_of(provider).launch_gang(pool, 2, "gang-b", FLEET)
    gang_of(azure_provider(azure_world, [pool])).launch_gang(pool, 2, "gang-c", FLEET)
    assert arm.count("PUT", "/proximityPlacementGroups/") == 1
    assert arm.count("GET", "/proximityPlacementGroups/") == 2, "once per provider object"
    assert {arm.group_of(vm.name) for vm in arm.live()} == {derived_name(FLEET, "nd")}


def test_azure_a_gang_some_of_whose_creates_fail_is_deleted_whole(
    azure_world: AzureWorld,
) -> None:
    arm = azure_world.emulator
    pool = azure_pool(create=True)
    provider = azure_provider(azure_world, [pool])
    arm.grant_at_most(2)
    with pytest.raises(CapacityError) as caught:
        gang_of(provider).launch_gang(pool, 4, "gang-short", FLEET)
    assert caught.value.code == "AllocationFailed"
    assert arm.count("PUT", "/virtualMachines/") == 4
    assert arm.all_vms() == [], "the two made and the two failed are all deleted"
    assert [i for i in provider.list_instances(FLEET) if i.state in LIVE] == []


def test_azure_a_create_refused_outright_rolls_back_the_rest(azure_world: AzureWorld) -> None:
    arm = azure_world.emulator
    pool = azure_pool(create=True)
    arm.fail_next("launch", "sku")
    with pytest.raises(CapacityError) as caught:
        gang_of(azure_provider(azure_world, [pool])).launch_gang(pool, 3, "gang-sku", FLEET)
    assert caught.value.code == "SkuNotAvailable"
    assert arm.all_vms() == []


def test_azure_retry_returns_the_whole_gang_and_buys_nothing_more(
    azure_world: AzureWorld,
) -> None:
    arm = azure_world.emulator
    pool = azure_pool(create=True)
    first = gang_of(azure_provider(azure_world, [pool])).launch_gang(pool, 3, "gang-r", FLEET)
    again = gang_of(azure_provider(azure_world, [pool])).launch_gang(pool, 3, "gang-r", FLEET)
    assert again.already_existed
    assert sorted(i.id for i in again.instances) == sorted(i.id for i in first.instances)
    assert arm.count("PUT", "/virtualMachines/") == 3 and len(arm.live()) == 3


def test_azure_retry_that_finds_part_of_a_gang_deletes_it(azure_world: AzureWorld) -> None:
    arm = azure_world.emulator
    pool = azure_pool(create=True)
    launched = gang_of(azure_provider(azure_world, [pool])).launch_gang(pool, 3, "gang-p", FLEET)
    arm.evict(launched.instances[0].id, linger=False)
    with pytest.raises(CapacityError) as caught:
        gang_of(azure_provider(azure_world, [pool])).launch_gang(pool, 3, "gang-p", FLEET)
    assert caught.value.code == "GangIncomplete"
    assert arm.live() == [] and arm.count("PUT", "/virtualMachines/") == 3


def test_azure_a_rollback_cut_short_is_finished_by_the_retry(azure_world: AzureWorld) -> None:
    arm = azure_world.emulator
    pool = azure_pool(create=True)
    provider = azure_provider(azure_world, [pool])
    arm.grant_at_most(1)
    arm.fail_next("terminate", "throttle")
    with pytest.raises(ThrottledError):
        gang_of(provider).launch_gang(pool, 2, "gang-t", FLEET)
    assert len(arm.all_vms()) == 1, "one delete was throttled"
    arm.grant_at_most(None)
    with pytest.raises(CapacityError, match="gang gang-t found"):
        gang_of(provider).launch_gang(pool, 2, "gang-t", FLEET)
    assert arm.all_vms() == []


@pytest.mark.parametrize(
    ("placement", "message"),
    [
        ({}, "give the name of an existing group, or create: true"),
        ({"name": "-bad"}, "expected 1 to 80 letters"),
    ],
)
def test_azure_placement_option_is_checked(placement: dict[str, Any], message: str) -> None:
    pool = azure_pool()
    pool = pool.model_copy(
        update={"options": {**pool.options, "proximity_placement_group": placement}}
    )
    with pytest.raises(
        InputError, match=r"pools\[0\]\.options\.proximity_placement_group"
    ) as caught:
        AzureProvider.from_config({"subscription_id": "s", "resource_group": "g"}, [pool], FLEET)
    assert message in str(caught.value)


# -- the grants -----------------------------------------------------------------------------------


def test_the_grant_check_reads_the_gang_modules() -> None:
    """test_terraform.py compares grants with the calls found here; the gang modules' calls
    must be among them, or a grant could go missing unseen."""
    aws = aws_calls().actions
    assert any(w.startswith("providers/aws/gang.py") for w in aws["ec2:CreatePlacementGroup"])
    assert any(w.startswith("providers/aws/gang.py") for w in aws["ec2:DescribePlacementGroups"])
    assert any(w.startswith("providers/aws/gang.py") for w in aws["ec2:TerminateInstances"])
    gcp = gcp_calls().actions
    assert any(w.startswith("providers/gcp/gang.py") for w in gcp["compute.instances.create"])
    assert {
        "compute.resourcePolicies.get",
        "compute.resourcePolicies.create",
        "compute.regionOperations.get",
    } <= set(gcp)
    azure = azure_calls().actions
    assert {
        "Microsoft.Compute/proximityPlacementGroups/read",
        "Microsoft.Compute/proximityPlacementGroups/write",
    } <= set(azure)


def test_aws_placement_groups_are_made_and_tagged_only_with_the_fleet_tag() -> None:
    aws = load_module(TERRAFORM / "aws")
    statements = policy_statements(blocks(aws, "data", "aws_iam_policy_document")["controller"])
    fleet = ("StringEquals", f"aws:RequestTag/{FLEET_TAG}", ("${var.fleet_id}",))
    by_sid = {s.sid: s for s in statements}
    create = by_sid["CreateOnlyFleetTaggedPlacementGroups"]
    assert create.actions == ("ec2:CreatePlacementGroup",)
    assert create.resources == "${local.placement_groups}" and create.conditions == (fleet,)
    tag = by_sid["TagPlacementGroupsOnlyAtCreation"]
    assert tag.actions == ("ec2:CreateTags",) and tag.resources == "${local.placement_groups}"
    assert set(tag.conditions) == {
        fleet,
        ("StringEquals", "ec2:CreateAction", ("CreatePlacementGroup",)),
    }
    creating = [s.sid for s in statements if "ec2:CreatePlacementGroup" in s.actions]
    assert creating == [create.sid], "no other statement lets the role make a placement group"
    assert "placement-group/*" in str(locals_of(aws)["placement_groups"])


# -- invariants -----------------------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(fleet=st.text(min_size=1, max_size=80), pool=st.text(min_size=1, max_size=80))
def test_a_derived_group_name_is_valid_on_every_cloud_and_stable(fleet: str, pool: str) -> None:
    name = derived_name(fleet, pool)
    assert name == derived_name(fleet, pool)
    assert RESOURCE_NAME.match(name), "a GCP resource name"
    assert PPG_NAME.match(name), "an Azure proximity placement group name"
    assert PLACEMENT_GROUP_NAME.match(name), "an EC2 placement group name"
    assert name != derived_name(fleet + "x", pool) and name != derived_name(fleet, pool + "x")


SHORT_GANGS = st.tuples(st.integers(1, 4), st.integers(0, 5))


@settings(
    max_examples=12,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(case=SHORT_GANGS)
def test_gcp_a_gang_is_whole_or_nothing_is_left(
    compute_emulator: ComputeEmulator, case: tuple[int, int]
) -> None:
    size, fits = case
    compute_emulator.reset()
    compute_emulator.gang_fits(fits, leftovers=True)
    pool = gcp_pool(placement_policy={"create": True})
    provider = gcp_provider(compute_emulator, [pool])
    _whole_or_nothing(provider, pool, size, fits, lambda: len(compute_emulator.live()))


@settings(
    max_examples=12,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(case=SHORT_GANGS)
def test_azure_a_gang_is_whole_or_nothing_is_left(
    azure_emulator: ArmEmulator, case: tuple[int, int]
) -> None:
    size, fits = case
    azure_emulator.reset()
    azure_emulator.grant_at_most(fits)
    pool = azure_pool(create=True)
    provider = azure_provider(AzureWorld(azure_emulator), [pool])
    _whole_or_nothing(provider, pool, size, fits, lambda: len(azure_emulator.live()))


@settings(
    max_examples=6,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(case=SHORT_GANGS)
def test_aws_a_gang_is_whole_or_nothing_is_left(
    ec2_groups: PlacementProxy, case: tuple[int, int]
) -> None:
    size, fits = case
    requests.post(f"{ec2_groups.upstream_url}/moto-api/reset", timeout=bound(30))
    ec2_groups.reset()
    ec2_groups.come_up(fits)
    pool = aws_pool(create=True)
    provider = aws_provider(ec2_groups, [pool])
    _whole_or_nothing(provider, pool, size, fits, lambda: len(moto_alive(ec2_groups.upstream_url)))


def _whole_or_nothing(
    provider: Any, pool: Pool, size: int, fits: int, alive: Callable[[], int]
) -> None:
    """Whatever fits, a gang comes up whole (and is then found whole again) or leaves nothing
    running."""
    try:
        result = gang_of(provider).launch_gang(pool, size, "gang-prop", FLEET)
    except CapacityError:
        assert fits < size
        assert alive() == 0
        assert [i for i in provider.list_instances(FLEET) if i.state in LIVE] == []
        return
    assert fits >= size and len(result.instances) == size and alive() == size
    again = gang_of(provider).launch_gang(pool, size, "gang-prop", FLEET)
    assert again.already_existed and alive() == size
