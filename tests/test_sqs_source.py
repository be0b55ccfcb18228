"""SQS as a queue source against moto's server: visible plus in-flight messages, times the GPUs
each message asks for."""

from __future__ import annotations

import boto3
import pytest
from aws_support import REGION

from autoscaler.model.errors import InputError, ProviderError
from providers.aws.queue import SqsQueueSource


def source(url: str, queue_url: str, **settings: object) -> SqsQueueSource:
    return SqsQueueSource.from_config(
        {"queue_url": queue_url, "region": REGION, "endpoint_url": url, **settings}, "jobs"
    )


def test_waiting_and_in_flight_messages_are_demand(aws: str) -> None:
    sqs = boto3.client("sqs", region_name=REGION, endpoint_url=aws)
    queue = sqs.create_queue(QueueName="work")["QueueUrl"]
    assert source(aws, queue).read(100.0) == [], "an empty queue is real zero demand"
    for index in range(5):
        sqs.send_message(QueueUrl=queue, MessageBody=f"job {index}")
    taken = sqs.receive_message(QueueUrl=queue, MaxNumberOfMessages=2, VisibilityTimeout=300)
    assert len(taken["Messages"]) == 2

    (group,) = source(aws, queue, gpus_per_message=4, checkpoint_interval_s=900).read(100.0)
    assert (group.jobs, group.gpus_per_job, group.checkpoint_interval_s) == (5, 4, 900.0)
    assert group.oldest_submit_time == 100.0
    (waiting,) = source(aws, queue, include_in_flight=False).read(100.0)
    assert waiting.jobs == 3


def test_the_counted_messages_have_the_shape_the_settings_give(aws: str) -> None:
    """Messages are counted, never received: looking at one would hide it from the workers and
    count towards its dead-letter limit."""
    sqs = boto3.client("sqs", region_name=REGION, endpoint_url=aws)
    queue = sqs.create_queue(QueueName="gangs")["QueueUrl"]
    for index in range(3):
        sqs.send_message(QueueUrl=queue, MessageBody=f'{{"job": {index}}}')

    shaped = source(
        aws, queue, gpus_per_message=16, nodes=2, gpu_models=["h100"], min_gpu_memory_gib=80
    )
    (group,) = shaped.read(100.0)

    assert (group.jobs, group.gpus_per_job, group.nodes, group.gpus_per_node) == (3, 16, 2, 8)
    assert (group.gpu_models, group.min_gpu_memory_gib) == (("h100",), 80.0)
    attributes = sqs.get_queue_attributes(
        QueueUrl=queue,
        AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
    )["Attributes"]
    assert attributes["ApproximateNumberOfMessages"] == "3"
    assert attributes["ApproximateNumberOfMessagesNotVisible"] == "0"
    (plain,) = source(aws, queue).read(100.0)
    assert (plain.gpus_per_job, plain.nodes, plain.gpu_models, plain.min_gpu_memory_gib) == (
        1,
        1,
        (),
        None,
    )


def test_a_missing_queue_is_a_typed_error_not_zero(aws: str) -> None:
    missing = f"{aws}/123456789012/no-such-queue"
    with pytest.raises(ProviderError) as caught:
        source(aws, missing).read(0.0)
    assert "\n" not in str(caught.value)
    assert "testing-secret" not in str(caught.value)


URL = "https://sqs.us-east-1.amazonaws.com/123456789012/jobs"


def test_settings_errors_name_the_field() -> None:
    with pytest.raises(InputError, match=r"sources\.jobs\.queue_url: expected an SQS queue URL"):
        SqsQueueSource.from_config({"queue_url": "q", "region": REGION}, "jobs")
    with pytest.raises(InputError, match=r"sources\.jobs\.endpoint_url"):
        SqsQueueSource.from_config(
            {"queue_url": URL, "region": REGION, "endpoint_url": "ftp://x"}, "jobs"
        )
    with pytest.raises(InputError, match=r"sources\.jobs\.gpus_per_message"):
        SqsQueueSource.from_config(
            {"queue_url": URL, "region": REGION, "gpus_per_message": 0}, "jobs"
        )
    with pytest.raises(InputError, match=r"sources\.jobs\.region"):
        SqsQueueSource.from_config({"queue_url": URL}, "jobs")
    with pytest.raises(InputError, match=r"sources\.jobs: .*multiple of nodes \(4\)"):
        SqsQueueSource.from_config(
            {"queue_url": URL, "region": REGION, "gpus_per_message": 6, "nodes": 4}, "jobs"
        )
    with pytest.raises(InputError, match=r"sources\.jobs\.min_gpu_memory_gib"):
        SqsQueueSource.from_config(
            {"queue_url": URL, "region": REGION, "min_gpu_memory_gib": -1}, "jobs"
        )
