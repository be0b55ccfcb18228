"""Listing from tags and states (DescribeTags + DescribeInstanceStatus) against a real moto server:
the controller must see exactly what the DescribeInstances listing showed it, only ours."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from typing import Any
from urllib.parse import parse_qs

import pytest
from aws_support import REGION, Faults, inject
from botocore.awsrequest import AWSResponse
from test_aws import FLEET, ec2, fleet_pool, provider

from autoscaler.model import Instance, InstanceState
from autoscaler.model.clock import ManualClock
from autoscaler.model.errors import ThrottledError, TransientError
from autoscaler.spi.provider import FLEET_TAG, LAUNCHED_AT_TAG, POOL_TAG, REQUEST_TAG, TEAM_TAG
from providers.aws import AwsProvider
from providers.aws.instances import LISTED_STATES, UNSEEN_GRACE_S

NOW = 1_700_000_000.0


def reference(aws_provider: AwsProvider) -> list[Instance]:
    """What the DescribeInstances listing (the one this replaced) makes of the same instances."""
    filters = [{"Name": "instance-state-name", "Values": list(LISTED_STATES)}]
    instances = aws_provider.instances
    return sorted(
        (instances.instance(raw, REGION) for raw in instances.describe(REGION, filters)),
        key=lambda i: i.id,
    )


def listed(aws_provider: AwsProvider) -> list[Instance]:
    return sorted(aws_provider.list_instances(FLEET), key=lambda i: i.id)


def run(
    url: str, tags: dict[str, str], instance_type: str = "g5.xlarge", count: int = 1
) -> list[str]:
    """Instances launched outside the provider, tagged at launch as given."""
    answer = ec2(url).run_instances(
        ImageId="ami-12c6146b",
        MinCount=count,
        MaxCount=count,
        InstanceType=instance_type,
        TagSpecifications=[
            {"ResourceType": "instance", "Tags": [{"Key": k, "Value": v} for k, v in tags.items()]}
        ]
        if tags
        else [],
    )
    return [str(i["InstanceId"]) for i in answer["Instances"]]


def test_only_our_fleet_is_listed_exactly_as_describe_instances_showed_it(aws: str) -> None:
    pools = [fleet_pool("g5-a"), fleet_pool("g5-b")]
    aws_provider = provider(aws, pools)
    ours = [
        *aws_provider.launch(pools[0], 3, "req-a", FLEET).instances,
        *aws_provider.launch(pools[1], 2, "req-b", FLEET).instances,
    ]
    other_fleet = run(aws, {FLEET_TAG: "fleet-b", POOL_TAG: "g5-a", REQUEST_TAG: "r"})
    run(aws, {POOL_TAG: "g5-a", REQUEST_TAG: "req-a", LAUNCHED_AT_TAG: "1"})
    run(aws, {})
    ids = [i.id for i in ours]
    client = ec2(aws)
    client.stop_instances(InstanceIds=[ids[0]])
    client.terminate_instances(InstanceIds=[ids[1], other_fleet[0]])
    result = listed(aws_provider)
    assert result == reference(aws_provider)
    assert {i.id for i in result} == set(ids) - {ids[1]}, "terminated and foreign ones are not"
    by_id = {i.id: i for i in result}
    assert by_id[ids[0]].state is InstanceState.TERMINATING
    assert {by_id[i].state for i in ids[2:]} <= {InstanceState.RUNNING, InstanceState.PENDING}
    assert {(i.pool, i.request_id, i.launched_at, i.gpus) for i in result} == {
        ("g5-a", "req-a", NOW, 1),
        ("g5-b", "req-b", NOW, 1),
    }


def test_what_tags_cannot_describe_comes_from_describe_instances(aws: str) -> None:
    # No launch-time tag (launched by an older controller), an unreadable one, and a pool no
    # longer configured (its GPUs come from the instance type): all exactly as before.
    aws_provider = provider(aws, [fleet_pool()])
    untimed = run(aws, {FLEET_TAG: FLEET, POOL_TAG: "g5-spot", REQUEST_TAG: "old"})
    garbled = run(aws, {FLEET_TAG: FLEET, POOL_TAG: "g5-spot", LAUNCHED_AT_TAG: "soon"})
    removed = run(
        aws,
        {FLEET_TAG: FLEET, POOL_TAG: "gone", REQUEST_TAG: "r", LAUNCHED_AT_TAG: "5.0"},
        instance_type="g5.12xlarge",
    )
    result = listed(aws_provider)
    assert result == reference(aws_provider)
    by_id = {i.id: i for i in result}
    launch_times = {
        i["InstanceId"]: i["LaunchTime"].timestamp()
        for r in ec2(aws).describe_instances()["Reservations"]
        for i in r["Instances"]
    }
    assert by_id[untimed[0]].launched_at == launch_times[untimed[0]]
    assert by_id[garbled[0]].launched_at == launch_times[garbled[0]]
    assert (by_id[removed[0]].pool, by_id[removed[0]].gpus) == ("gone", 4)
    assert by_id[removed[0]].launched_at == 5.0


def test_an_instance_tagged_but_not_yet_described_is_pending_for_a_grace_period(aws: str) -> None:
    # Just after a launch, EC2's describe calls may not show an instance whose tags they do; a
    # listing that left it out would make the controller take it for gone and buy again.
    clock = ManualClock(NOW)
    aws_provider = provider(aws, [fleet_pool()], clock)
    unseen = "i-0123456789abcdef0"
    ec2(aws).create_tags(
        Resources=[unseen],
        Tags=[
            {"Key": FLEET_TAG, "Value": FLEET},
            {"Key": POOL_TAG, "Value": "g5-spot"},
            {"Key": REQUEST_TAG, "Value": "req-new"},
            {"Key": LAUNCHED_AT_TAG, "Value": f"{NOW - 5:.3f}"},
        ],
    )
    assert listed(aws_provider) == [
        Instance(
            id=unseen,
            pool="g5-spot",
            state=InstanceState.PENDING,
            launched_at=NOW - 5,
            request_id="req-new",
            gpus=1,
        )
    ]
    clock.advance(UNSEEN_GRACE_S)
    assert listed(aws_provider) == [], "never described after the grace period: not there"


def test_more_than_a_thousand_tags(aws: str) -> None:
    pool = fleet_pool()
    aws_provider = provider(aws, [pool])
    launched = aws_provider.launch(pool, 260, "req-many", FLEET).instances
    run(aws, {FLEET_TAG: "fleet-b", POOL_TAG: "g5-spot"}, count=20)
    assert len(launched) == 260
    result = listed(aws_provider)
    assert result == reference(aws_provider)
    assert {i.id for i in result} == {i.id for i in launched}


def paged(body: bytes, size: int) -> list[bytes]:
    """moto's one DescribeTags answer cut into pages of ``size`` tags with a nextToken each, the
    way EC2 answers (moto ignores MaxResults)."""
    root = ET.fromstring(body)
    namespace = root.tag[: root.tag.index("}") + 1]
    ET.register_namespace("", namespace.strip("{}"))
    (tag_set,) = [child for child in root if child.tag.endswith("tagSet")]
    items = list(tag_set)
    pages = []
    for start in range(0, len(items), size):
        for item in list(tag_set):
            tag_set.remove(item)
        tag_set.extend(items[start : start + size])
        for token in root.findall(f"{namespace}nextToken"):
            root.remove(token)
        if start + size < len(items):
            ET.SubElement(root, f"{namespace}nextToken").text = str(start + size)
        pages.append(ET.tostring(root))
    return pages


class _Body:
    def __init__(self, body: bytes) -> None:
        self.body = body

    def stream(self, **_: Any) -> Any:
        yield self.body


def form_of(request: Any) -> dict[str, list[str]]:
    return parse_qs(request.body.decode() if isinstance(request.body, bytes) else request.body)


def test_tags_of_one_instance_spread_over_pages_are_joined(aws: str) -> None:
    pool = fleet_pool()
    launched = provider(aws, [pool]).launch(pool, 3, "req-pages", FLEET).instances
    recorder = provider(aws, [pool])
    client = recorder.client("ec2", REGION)
    asked: list[str] = []
    answers: dict[str, bytes] = {}

    def ask(request: Any, **_: Any) -> None:
        asked.append(json.dumps(form_of(request), sort_keys=True))

    def keep(http_response: Any, **_: Any) -> None:
        answers[asked[-1]] = http_response.content

    client.meta.events.register("before-send.ec2.DescribeTags", ask)
    client.meta.events.register("after-call.ec2.DescribeTags", keep)
    expected = listed(recorder)
    assert {i.id for i in expected} == {i.id for i in launched}
    # A fresh provider sees the same answers in EC2's pages of two tags: one instance's tags
    # arrive on two pages.
    pages = {key: paged(body, 2) for key, body in answers.items()}
    tokens: list[str | None] = []

    def answer(request: Any, **_: Any) -> AWSResponse:
        form = form_of(request)
        token = form.pop("NextToken", [None])[0]
        tokens.append(token)
        page = pages[json.dumps(form, sort_keys=True)][int(token or 0) // 2]
        return AWSResponse(request.url, 200, {}, _Body(page))

    paging = provider(aws, [pool])
    paging.client("ec2", REGION).meta.events.register("before-send.ec2.DescribeTags", answer)
    assert listed(paging) == expected
    assert tokens == [None, "2", None, "2", "4", "6", "8"]


def test_a_steady_listing_reads_only_the_fleet_tag(aws: str) -> None:
    pool = fleet_pool()
    aws_provider = provider(aws, [pool])
    first = aws_provider.launch(pool, 2, "req-1", FLEET).instances
    keys: list[list[str]] = []

    def note(request: Any, **_: Any) -> None:
        form = form_of(request)
        keys.append(sorted(v[0] for k, v in form.items() if k.startswith("Filter.2.Value.")))

    aws_provider.client("ec2", REGION).meta.events.register("before-send.ec2.DescribeTags", note)
    assert {i.id for i in listed(aws_provider)} == {i.id for i in first}
    assert keys == [[FLEET_TAG], sorted([POOL_TAG, REQUEST_TAG, LAUNCHED_AT_TAG, TEAM_TAG])]
    keys.clear()
    assert listed(aws_provider) == reference(aws_provider)
    assert keys == [[FLEET_TAG]]
    second = aws_provider.launch(pool, 1, "req-2", FLEET).instances
    ec2(aws).delete_tags(Resources=[first[0].id], Tags=[{"Key": FLEET_TAG}])
    keys.clear()
    result = listed(aws_provider)
    assert result == reference(aws_provider)
    assert {i.id for i in result} == {first[1].id, second[0].id}, "no fleet tag: not ours"
    assert keys == [[FLEET_TAG], sorted([POOL_TAG, REQUEST_TAG, LAUNCHED_AT_TAG, TEAM_TAG])]


@pytest.mark.parametrize("operation", ["DescribeTags", "DescribeInstanceStatus"])
@pytest.mark.parametrize(
    ("fault", "expected"), [("throttle", ThrottledError), ("server", TransientError)]
)
def test_a_failed_listing_call_arrives_typed(
    aws: str, operation: str, fault: str, expected: type
) -> None:
    pool = fleet_pool()
    aws_provider = provider(aws, [pool])
    aws_provider.launch(pool, 1, "req-f", FLEET)
    inject(aws_provider.client("ec2", REGION), operation, Faults(planned=[fault]))
    with pytest.raises(expected):
        aws_provider.list_instances(FLEET)
    assert len(aws_provider.list_instances(FLEET)) == 1
