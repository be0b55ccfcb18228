"""A batch of interruption messages is never poisoned (issue 15): against moto's SQS, a receive of
ten messages of which nine are malformed, each in its own way, still hands the one genuine spot
warning to the tick that follows, which acts on it; the nine are counted, logged once each with
their message id, and left to the queue's redrive policy, which moves them to the dead-letter
queue for someone to read."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import boto3
import pytest
from aws_support import REGION
from botocore.awsrequest import AWSResponse
from fakes import FakeQueue, job
from test_aws import FLEET, real_spot_prices
from test_aws_controller import zone_pool
from waits import bound

from autoscaler.model.clock import ManualClock
from autoscaler.model.config import ControllerConfig, Limits
from autoscaler.tick.controller import Controller
from policies.cost_aware import CostAwareParams, CostAwarePolicy
from providers.aws import AwsProvider

NOW = 1_700_000_000.0


def wait_until(condition: Callable[[], bool], timeout_s: float = 60.0) -> bool:
    """Poll ``condition``; ``timeout_s`` is a ceiling scaled by the wait knob."""
    give_up = time.monotonic() + bound(timeout_s)
    while time.monotonic() < give_up:
        if condition():
            return True
        time.sleep(0.2)
    return condition()


def stamp(at: float) -> str:
    return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def warning(instance_id: Any, at: str = stamp(NOW - 5), **extra: Any) -> str:
    return json.dumps(
        {
            "version": "0",
            "id": "e",
            "detail-type": "EC2 Spot Instance Interruption Warning",
            "source": "aws.ec2",
            "time": at,
            "region": REGION,
            "resources": [],
            "detail": {"instance-id": instance_id, "instance-action": "terminate"},
            **extra,
        }
    )


def malformed(victim: str) -> dict[str, str]:
    """Nine ways an interruption message goes wrong, by what is wrong with it."""
    health = {
        "detail-type": "AWS Health Event",
        "source": "aws.health",
        "time": stamp(NOW - 5),
        "detail": {
            "eventTypeCategory": "scheduledChange",
            "startTime": "9999-12-31T23:59:59Z",
            "affectedEntities": [{"entityValue": victim}],
        },
    }
    return {
        "nested": '{"detail": ' + "[" * 50_000 + "]" * 50_000 + "}",
        "not-json": "{not json",
        "not-an-object": "[1, 2, 3]",
        "id-a-number": warning(12345),
        "year-9999": warning(victim, at="9999-12-31T23:59:59Z"),
        "before-1970": warning(victim, at="1969-07-20T20:17:40Z"),
        "health-start-9999": json.dumps(health),
        "id-40000-chars": warning("i-" + "a" * 40_000),
        "unknown-type": warning(victim).replace("Spot Instance Interruption Warning", "Surprise"),
    }


@pytest.fixture
def world(aws: str) -> Any:
    sqs = boto3.client("sqs", region_name=REGION, endpoint_url=aws)
    dead = sqs.create_queue(QueueName="interruptions-dlq")["QueueUrl"]
    dead_arn = sqs.get_queue_attributes(QueueUrl=dead, AttributeNames=["QueueArn"])["Attributes"][
        "QueueArn"
    ]
    redrive = json.dumps({"deadLetterTargetArn": dead_arn, "maxReceiveCount": "2"})
    queue = sqs.create_queue(
        QueueName="interruptions",
        Attributes={"VisibilityTimeout": "1", "RedrivePolicy": redrive},
    )["QueueUrl"]
    clock = ManualClock(NOW)
    pool = zone_pool("us-east-1a")
    provider = AwsProvider.from_config(
        {"endpoint_url": aws, "interruption_queue_url": queue, "queue_wait_s": 0},
        [pool],
        FLEET,
        clock,
    )
    rows = real_spot_prices("g5.xlarge", REGION, names=True)

    def real_prices(**_: Any) -> tuple[AWSResponse, dict[str, Any]]:
        answer = {"SpotPriceHistory": rows, "ResponseMetadata": {"HTTPStatusCode": 200}}
        return AWSResponse(aws, 200, {}, None), answer

    provider.client("ec2", REGION).meta.events.register(
        "before-call.ec2.DescribeSpotPriceHistory", real_prices
    )
    controller = Controller(
        ControllerConfig(fleet_id=FLEET, pools=(pool,), limits=Limits(max_instances=4)),
        CostAwarePolicy(CostAwareParams(idle_seconds=0, unobserved_nodes="surplus")),
        {"aws": provider},
        clock,
        [FakeQueue(jobs=[job("j")])],
    )
    yield sqs, queue, dead, clock, provider, controller
    provider.close()


def test_nine_malformed_messages_never_hide_the_good_warning_in_their_batch(
    world: Any, caplog: pytest.LogCaptureFixture
) -> None:
    sqs, queue, dead, clock, provider, controller = world
    first = controller.tick()
    [victim] = [i for a in first.actions if a.kind == "launch" for i in a.instance_ids]
    clock.advance(30)
    controller.tick()

    bad = malformed(victim)
    entries = [{"Id": name, "MessageBody": body} for name, body in bad.items()]
    entries.insert(4, {"Id": "good", "MessageBody": warning(victim)})
    watcher = provider.watcher
    assert watcher is not None
    # The first tick started the watcher's long-poll thread; stopped, its receives are the
    # test's own, so the batch cannot be split by a receive racing the send.
    watcher.stop()
    sent = sqs.send_message_batch(QueueUrl=queue, Entries=entries)
    assert len(sent["Successful"]) == 10
    bad_ids = {e["MessageId"] for e in sent["Successful"] if e["Id"] != "good"}

    with caplog.at_level(logging.WARNING, logger="providers.aws.notices"):
        assert watcher.poll_once() == 10, "the ten arrive in one receive"
        assert watcher.notices_ready() == 1
        report = controller.tick()

    assert [(n.instance_id, n.deadline) for n in report.view.notices] == [(victim, NOW - 5 + 120)]
    replacement = [a for a in report.actions if a.kind == "launch" and a.outcome == "ok"]
    assert replacement and replacement[0].done == 1, "acted on in the same tick: replaced"
    assert watcher.malformed == 9
    assert watcher.wakeups.tally.get("aws-queue", "malformed") == 9
    lines = [r.getMessage() for r in caplog.records if "malformed" in r.getMessage()]
    assert len(lines) == 9 and all("\n" not in line for line in lines)
    assert {line.split()[3] for line in lines} == bad_ids, "each logged with its message id"
    assert all(len(line) < 400 for line in lines), "the 40,000-character id is not echoed"

    # Redelivered after the visibility timeout, the nine are neither counted nor logged again,
    # and the redrive policy moves them to the dead-letter queue: nothing deleted unseen.
    def dead_letters() -> int:
        attributes = sqs.get_queue_attributes(
            QueueUrl=dead, AttributeNames=["ApproximateNumberOfMessages"]
        )["Attributes"]
        return int(attributes["ApproximateNumberOfMessages"])

    def redriven() -> bool:
        watcher.poll_once()
        return dead_letters() == 9

    with caplog.at_level(logging.WARNING, logger="providers.aws.notices"):
        assert wait_until(redriven)
    assert watcher.malformed == 9
    assert len([r for r in caplog.records if "malformed" in r.getMessage()]) == 9
    waiting = sqs.get_queue_attributes(QueueUrl=queue, AttributeNames=["All"])["Attributes"]
    assert int(waiting["ApproximateNumberOfMessages"]) == 0
    assert int(waiting["ApproximateNumberOfMessagesNotVisible"]) == 0, "the good one was deleted"
