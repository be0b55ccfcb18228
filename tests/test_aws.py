"""The AWS provider against a real moto server: real boto3 over HTTP, faults as AWS sends them."""

from __future__ import annotations

import csv
import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import boto3
import pytest
from aws_support import REGION, Faults, inject
from botocore.awsrequest import AWSResponse
from waits import bound

from autoscaler.model import InstanceState, NoticeKind, Pool
from autoscaler.model.catalog import DATA, bucket_rate_per_hour
from autoscaler.model.clock import ManualClock
from autoscaler.model.errors import (
    AuthError,
    CapacityError,
    InputError,
    InvalidRequest,
    QuotaError,
    QuotaScope,
    ThrottledError,
    TransientError,
)
from autoscaler.spi.provider import FLEET_TAG, LAUNCHED_AT_TAG, POOL_TAG, REQUEST_TAG
from providers.aws import AwsProvider

FLEET = "fleet-a"


def fleet_pool(name: str = "g5-spot", market: str = "spot", **extra: Any) -> Pool:
    """A pool that launches through CreateFleet: two instance types over two zones."""
    return Pool(
        name=name,
        provider="aws",
        region=REGION,
        instance_type="g5.xlarge",
        gpus_per_instance=1,
        market=market,  # type: ignore[arg-type]
        options={
            "instance_types": ["g5.2xlarge"],
            "zones": ["us-east-1a", "us-east-1b"],
            "launch_template": {"name": "gpu"},
            **extra,
        },
    )


def single_pool(name: str = "p3-spot") -> Pool:
    """A pool of one type in one zone: RunInstances."""
    return Pool(
        name=name,
        provider="aws",
        region=REGION,
        zone="us-east-1a",
        instance_type="p3.2xlarge",
        gpus_per_instance=1,
        market="spot",  # type: ignore[arg-type]
        options={"image_id": "ami-12c6146b"},
    )


def provider(
    url: str, pools: list[Pool], clock: ManualClock | None = None, **settings: Any
) -> AwsProvider:
    return AwsProvider.from_config(
        {"endpoint_url": url, **settings}, pools, FLEET, clock or ManualClock(1_700_000_000.0)
    )


def ec2(url: str) -> Any:
    return boto3.client("ec2", region_name=REGION, endpoint_url=url)


def described(url: str) -> list[dict[str, Any]]:
    pages = ec2(url).describe_instances()["Reservations"]
    return [i for r in pages for i in r["Instances"] if i["State"]["Name"] != "terminated"]


def test_launch_tags_every_instance_and_lists_only_ours(aws: str) -> None:
    pool = fleet_pool()
    aws_provider = provider(aws, [pool])
    result = aws_provider.launch(pool, 3, "req-1", FLEET)
    assert len(result.instances) == 3 and result.shortfall is None
    stranger = ec2(aws).run_instances(
        ImageId="ami-12c6146b", MinCount=1, MaxCount=1, InstanceType="g5.xlarge"
    )["Instances"][0]["InstanceId"]
    listed = aws_provider.list_instances(FLEET)
    assert sorted(i.id for i in listed) == sorted(i.id for i in result.instances)
    assert {(i.pool, i.request_id, i.gpus) for i in listed} == {("g5-spot", "req-1", 1)}
    for raw in described(aws):
        if raw["InstanceId"] == stranger:
            continue
        tags = {t["Key"]: t["Value"] for t in raw["Tags"]}
        assert tags[FLEET_TAG] == FLEET and tags[POOL_TAG] == "g5-spot"
        assert tags[REQUEST_TAG] == "req-1" and float(tags[LAUNCHED_AT_TAG]) == 1_700_000_000.0
        assert raw.get("InstanceLifecycle") == "spot"
    aws_provider.terminate([*[i.id for i in listed], stranger], "term-1")
    alive = {i["InstanceId"] for i in described(aws)}
    assert alive == {stranger}, "only instances carrying our fleet tag are ever terminated"


def test_a_repeated_launch_never_buys_a_second_set(aws: str) -> None:
    pool = fleet_pool()
    first = provider(aws, [pool]).launch(pool, 2, "req-crash", FLEET)
    # the controller crashed after the call and before recording it: a new process retries
    again = provider(aws, [pool]).launch(pool, 2, "req-crash", FLEET)
    assert again.already_existed
    assert sorted(i.id for i in again.instances) == sorted(i.id for i in first.instances)
    assert len(described(aws)) == 2


def test_on_demand_through_create_fleet(aws: str) -> None:
    pool = fleet_pool("g5-od", market="on-demand")
    result = provider(aws, [pool]).launch(pool, 2, "req-od", FLEET)
    assert len(result.instances) == 2
    assert all(raw.get("InstanceLifecycle") is None for raw in described(aws))


def test_run_instances_partial_fulfilment_is_a_capacity_shortfall(aws: str) -> None:
    # RunInstances with MinCount=1 launches what it can; moto launches exactly MinCount, which
    # is what AWS does when capacity runs short.
    pool = single_pool()
    result = provider(aws, [pool]).launch(pool, 3, "req-run", FLEET)
    assert len(result.instances) == 1
    assert isinstance(result.shortfall, CapacityError)
    assert [raw["Placement"]["AvailabilityZone"] for raw in described(aws)] == ["us-east-1a"]


def test_create_fleet_errors_list_is_partial_fulfilment(aws: str) -> None:
    pool = fleet_pool()
    aws_provider = provider(aws, [pool])

    def with_errors(parsed: dict[str, Any], **_: Any) -> None:
        parsed["Errors"] = [
            {"ErrorCode": "InvalidFleetConfiguration", "ErrorMessage": "g5.2xlarge not here"},
            {"ErrorCode": "InsufficientInstanceCapacity", "ErrorMessage": "no g5 in us-east-1b"},
        ]

    aws_provider.client("ec2", REGION).meta.events.register(
        "after-call.ec2.CreateFleet", with_errors
    )
    result = aws_provider.launch(pool, 2, "req-partial", FLEET)
    assert len(result.instances) == 2
    assert isinstance(result.shortfall, CapacityError)
    assert result.shortfall.code == "InsufficientInstanceCapacity"


@pytest.mark.parametrize(
    ("fault", "expected", "code"),
    [
        ("capacity", CapacityError, "InsufficientInstanceCapacity"),
        ("throttle", ThrottledError, "RequestLimitExceeded"),
        ("quota", QuotaError, "VcpuLimitExceeded"),
        ("auth", AuthError, "AuthFailure"),
        ("server", TransientError, "InternalError"),
        ("bad", InvalidRequest, "InvalidParameterValue"),
        ("timeout", TransientError, "Connection"),
    ],
)
def test_errors_arrive_typed(aws: str, fault: str, expected: type, code: str) -> None:
    pool = fleet_pool()
    aws_provider = provider(aws, [pool])
    inject(aws_provider.client("ec2", REGION), "CreateFleet", Faults(planned=[fault]))
    with pytest.raises(expected) as caught:
        aws_provider.launch(pool, 1, "req-fault", FLEET)
    assert caught.value.code == code
    assert caught.value.pool == "g5-spot"
    if fault == "quota":
        assert caught.value.scope is QuotaScope.REGION
    assert "testing-secret" not in str(caught.value)
    assert described(aws) == []


def real_spot_prices(instance_type: str, region: str, names: bool = False) -> list[dict[str, Any]]:
    """The shipped 2022-05-31 price events, in describe-spot-price-history's shape. The data has
    AZ ids (use1-az2), which map to names differently in every account; ``names`` maps them in
    sorted order to us-east-1a, us-east-1b, ..."""
    path = DATA / "prices" / "aws_gpu_spot_price_events_2022-05-31.csv"
    with path.open() as handle:
        rows = [
            r
            for r in csv.DictReader(handle)
            if r["instance_type"] == instance_type and r["region"] == region
        ]
    ids = sorted({r["zone"] for r in rows})
    name_of = {z: region + "abcdefgh"[i] for i, z in enumerate(ids)} if names else {}
    return [
        {
            "AvailabilityZone": name_of.get(row["zone"], row["zone"]),
            "InstanceType": row["instance_type"],
            "ProductDescription": "Linux/UNIX",
            "SpotPrice": row["price_per_hour"],
            "Timestamp": datetime.fromisoformat(row["timestamp"].replace("Z", "+00:00")),
        }
        for row in rows
    ]


def test_spot_prices_come_from_the_api_and_are_cached(aws: str) -> None:
    pool = Pool(
        name="g5",
        provider="aws",
        region=REGION,
        instance_type="g5.xlarge",
        gpus_per_instance=1,
        market="spot",  # type: ignore[arg-type]
        options={"launch_template": {"name": "gpu"}},
    )
    clock = ManualClock(1_700_000_000.0)
    aws_provider = provider(aws, [pool], clock, price_ttl_s=300)
    calls: list[int] = []
    rows = real_spot_prices("g5.xlarge", REGION)
    assert rows, "the shipped data has g5.xlarge prices for us-east-1"

    def real_prices(params: dict[str, Any], **_: Any) -> tuple[AWSResponse, dict[str, Any]]:
        calls.append(1)
        answer = {"SpotPriceHistory": rows, "ResponseMetadata": {"HTTPStatusCode": 200}}
        return AWSResponse(aws, 200, {}, None), answer

    aws_provider.client("ec2", REGION).meta.events.register(
        "before-call.ec2.DescribeSpotPriceHistory", real_prices
    )
    (quote,) = aws_provider.prices([pool])
    latest: dict[str, tuple[datetime, float]] = {}
    for row in rows:
        if (
            row["AvailabilityZone"] not in latest
            or latest[row["AvailabilityZone"]][0] < row["Timestamp"]
        ):
            latest[row["AvailabilityZone"]] = (row["Timestamp"], float(row["SpotPrice"]))
    assert quote.price_per_hour == min(price for _, price in latest.values())
    assert quote.on_demand_price_per_hour == 1.006, "the shipped catalog's list price"
    assert quote.interruption_rate_per_hour == bucket_rate_per_hour(4)
    aws_provider.prices([pool])
    assert len(calls) == 1, "cached within the TTL"
    clock.advance(301)
    aws_provider.prices([pool])
    assert len(calls) == 2


def test_settings_and_pool_options_are_checked(aws: str) -> None:
    with pytest.raises(InputError, match=r"providers\.aws\.queue_wait_s"):
        AwsProvider.from_config({"queue_wait_s": 60}, [], FLEET)
    bad = Pool(
        name="x",
        provider="aws",
        region=REGION,
        instance_type="g5.xlarge",
        gpus_per_instance=1,
        market="spot",
        options={"zones": ["us-east-1a"]},
    )  # type: ignore[arg-type]
    with pytest.raises(InputError, match=r"pools\[0\]\.options.*launch_template or an image_id"):
        AwsProvider.from_config({}, [bad], FLEET)
    several = fleet_pool(launch_template=None, image_id="ami-1")
    with pytest.raises(InputError, match="needs a launch_template"):
        AwsProvider.from_config({}, [several], FLEET)


def event(detail_type: str, detail: dict[str, Any], at: str = "2023-11-14T22:13:20Z") -> str:
    """An EventBridge event stamped at the provider's ManualClock time (1_700_000_000)."""
    return json.dumps(
        {
            "version": "0",
            "id": "e",
            "detail-type": detail_type,
            "source": "aws.ec2",
            "account": "123456789012",
            "time": at,
            "region": REGION,
            "resources": [],
            "detail": detail,
        }
    )


def test_interruption_queue_notices_dedup_malformed_and_acknowledgement(aws: str) -> None:
    sqs = boto3.client("sqs", region_name=REGION, endpoint_url=aws)
    queue = sqs.create_queue(QueueName="interruptions")["QueueUrl"]
    pool = fleet_pool()
    aws_provider = provider(aws, [pool], interruption_queue_url=queue, queue_wait_s=0)
    (victim,) = aws_provider.launch(pool, 1, "req-n", FLEET).instances
    warning = event(
        "EC2 Spot Instance Interruption Warning",
        {"instance-id": victim.id, "instance-action": "terminate"},
    )
    for body in (
        warning,
        warning,
        event("EC2 Instance Rebalance Recommendation", {"instance-id": victim.id}),
        event(
            "EC2 Instance State-change Notification", {"instance-id": victim.id, "state": "running"}
        ),
        "{not json",
    ):
        sqs.send_message(QueueUrl=queue, MessageBody=body)
    assert aws_provider.watcher is not None
    while aws_provider.watcher.poll_once():
        pass
    notices = aws_provider.poll_notices()
    stamp = 1_700_000_000.0
    assert {(n.instance_id, n.kind, n.deadline, n.pool) for n in notices} == {
        (victim.id, NoticeKind.TERMINATE, stamp + 120, "g5-spot"),
        (victim.id, NoticeKind.REBALANCE, None, "g5-spot"),
    }
    assert aws_provider.watcher.malformed == 1 and aws_provider.watcher.duplicates == 1
    waiting = sqs.get_queue_attributes(QueueUrl=queue, AttributeNames=["All"])["Attributes"]
    # the two notices' messages are kept until handled; the malformed one is left for the
    # queue's redrive, never deleted unseen
    assert int(waiting["ApproximateNumberOfMessagesNotVisible"]) == 3
    aws_provider.acknowledge(notices)
    waiting = sqs.get_queue_attributes(QueueUrl=queue, AttributeNames=["All"])["Attributes"]
    assert int(waiting["ApproximateNumberOfMessagesNotVisible"]) == 1
    assert int(waiting["ApproximateNumberOfMessages"]) == 0
    aws_provider.close()


def test_health_scheduled_change_and_state_change_become_notices(aws: str) -> None:
    from providers.aws.events import parse_event

    health = parse_event(
        json.dumps(
            {
                "detail-type": "AWS Health Event",
                "source": "aws.health",
                "time": "2026-11-21T10:00:00Z",
                "detail": {
                    "eventTypeCategory": "scheduledChange",
                    "startTime": "2026-11-22T00:00:00Z",
                    "affectedEntities": [{"entityValue": "i-1"}, {"entityValue": "i-2"}],
                },
            }
        )
    )
    assert health is not None and health.instance_ids == ("i-1", "i-2")
    assert health.deadline == datetime(2026, 11, 22, tzinfo=UTC).timestamp()
    stopping = parse_event(
        event("EC2 Instance State-change Notification", {"instance-id": "i-3", "state": "stopping"})
    )
    assert stopping is not None and stopping.kind is NoticeKind.TERMINATE


def test_list_maps_cloud_states(aws: str) -> None:
    pool = fleet_pool()
    aws_provider = provider(aws, [pool])
    ids = [i.id for i in aws_provider.launch(pool, 2, "req-s", FLEET).instances]
    ec2(aws).stop_instances(InstanceIds=[ids[0]])
    states = {i.id: i.state for i in aws_provider.list_instances(FLEET)}
    assert states[ids[0]] is InstanceState.TERMINATING
    assert states[ids[1]] in (InstanceState.RUNNING, InstanceState.PENDING)


def test_the_core_and_other_providers_import_without_boto3_on_the_path(tmp_path: Path) -> None:
    import subprocess
    import sys

    code = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in ('boto3', 'botocore'):\n"
        "            raise ImportError(name)\n"
        "sys.meta_path.insert(0, Block())\n"
        "import providers.aws, providers.aws.queue, providers.aws.notices\n"
        "print('imported')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.returncode == 0 and "imported" in done.stdout, done.stderr


def test_the_queue_client_waits_longer_than_its_long_poll(aws: str) -> None:
    sqs = boto3.client("sqs", region_name=REGION, endpoint_url=aws)
    queue = sqs.create_queue(QueueName="slow")["QueueUrl"]
    aws_provider = provider(
        aws, [fleet_pool()], interruption_queue_url=queue, queue_wait_s=20, read_timeout_s=5
    )
    assert aws_provider.client("sqs", REGION).meta.config.read_timeout > 20
    assert aws_provider.client("ec2", REGION).meta.config.read_timeout == 5


def test_a_warning_wakes_the_run_loop_at_once(aws: str) -> None:
    import threading

    sqs = boto3.client("sqs", region_name=REGION, endpoint_url=aws)
    queue = sqs.create_queue(QueueName="wake")["QueueUrl"]
    pool = fleet_pool()
    aws_provider = provider(aws, [pool], interruption_queue_url=queue, queue_wait_s=1)
    (victim,) = aws_provider.launch(pool, 1, "req-w", FLEET).instances
    woken = threading.Event()
    aws_provider.start(woken.set)
    assert aws_provider.poll_notices() == [], "a tick that polls does not unhook the wake-up"
    sqs.send_message(
        QueueUrl=queue,
        MessageBody=event("EC2 Spot Instance Interruption Warning", {"instance-id": victim.id}),
    )
    try:
        assert woken.wait(timeout=bound(30))
        assert [n.instance_id for n in aws_provider.poll_notices()] == [victim.id]
    finally:
        aws_provider.close()


def test_prices_from_a_skypilot_catalog(aws: str, tmp_path: Path) -> None:
    catalog = tmp_path / "aws.csv"
    catalog.write_text(
        "InstanceType,AcceleratorName,AcceleratorCount,vCPUs,MemoryGiB,Price,SpotPrice,Region,"
        "AvailabilityZone\n"
        "g5.xlarge,A10G,1,4,16,1.006,0.41,us-east-1,us-east-1a\n"
        "g5.xlarge,A10G,1,4,16,1.006,0.37,us-east-1,us-east-1b\n"
    )
    spot = fleet_pool()
    zonal = Pool(
        name="g5-b",
        provider="aws",
        region=REGION,
        zone="us-east-1b",
        instance_type="g5.xlarge",
        gpus_per_instance=1,
        market="spot",  # type: ignore[arg-type]
        options={"image_id": "ami-1"},
    )
    on_demand = fleet_pool("g5-od", market="on-demand")
    aws_provider = provider(aws, [spot, zonal, on_demand], price_catalog=str(catalog))
    quotes = {q.pool: q for q in aws_provider.prices([spot, zonal, on_demand])}
    assert quotes["g5-spot"].price_per_hour == 0.37, "a region's price is its cheapest zone's"
    assert quotes["g5-b"].price_per_hour == 0.37
    assert quotes["g5-od"].price_per_hour == 1.006
    assert quotes["g5-spot"].source == str(catalog)
