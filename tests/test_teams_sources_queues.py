"""The counting queue sources name the team of their demand (issue 19): a Redis key and an SQS
queue are one team's by config (``team``), a Prometheus answer by a label of its series
(``team_label``) or by config; against a real Redis, moto's SQS and a real Prometheus."""

from __future__ import annotations

import logging
import time
import uuid
from typing import Any

import boto3
import pytest
from aws_support import REGION
from prometheus_server import PrometheusWorld
from redis_server import RedisServer

from autoscaler.model.errors import InputError
from autoscaler.sources.prometheus import PrometheusQueueSource
from autoscaler.sources.redis_queue import RedisQueueSource
from autoscaler.sources.team_names import MAX_TEAM_CHARS
from providers.aws.queue import SqsQueueSource


def _teams(groups: Any) -> dict[str | None, int]:
    found: dict[str | None, int] = {}
    for group in groups:
        found[group.team] = found.get(group.team, 0) + group.gpus
    return found


def test_each_redis_key_is_the_team_its_settings_name(redis_server: RedisServer) -> None:
    client = redis_server.client()
    vision, speech = f"q-{uuid.uuid4().hex}", f"q-{uuid.uuid4().hex}"
    client.rpush(vision, *[f"job-{i}" for i in range(3)])
    client.rpush(speech, '{"gpus": 4}', "plain")

    def read(key: str, **extra: Any) -> Any:
        return RedisQueueSource.from_config({"url": redis_server.url, "key": key, **extra}, "q")

    assert _teams(read(vision, team="vision", gpus_per_item=2).read(1.0)) == {"vision": 6}
    shaped = read(speech, team="speech", item_shapes=True).read(1.0)
    assert _teams(shaped) == {"speech": 4 + 1}, "every shape of the key is the key's team"
    assert _teams(read(speech).read(1.0)) == {None: 2}, "unset: no team"
    with pytest.raises(InputError, match=r"sources\.q\.team"):
        read(speech, team="has spaces")


def test_each_sqs_queue_is_the_team_its_settings_name(aws: str) -> None:
    sqs = boto3.client("sqs", region_name=REGION, endpoint_url=aws)
    queues = {team: sqs.create_queue(QueueName=team)["QueueUrl"] for team in ("vision", "speech")}
    for team, count in (("vision", 2), ("speech", 3)):
        for index in range(count):
            sqs.send_message(QueueUrl=queues[team], MessageBody=f"job {index}")

    def source(queue: str, **extra: Any) -> SqsQueueSource:
        settings = {"queue_url": queues[queue], "region": REGION, "endpoint_url": aws, **extra}
        return SqsQueueSource.from_config(settings, "jobs")

    groups = [
        *source("vision", team="vision").read(1.0),
        *source("speech", team="speech").read(1.0),
    ]
    assert _teams(groups) == {"vision": 2, "speech": 3}
    assert _teams(source("vision").read(1.0)) == {None: 2}
    with pytest.raises(InputError, match=r"sources\.jobs\.team"):
        source("vision", team="x" * 200)


def _prometheus(url: str, query: str, **extra: Any) -> PrometheusQueueSource:
    return PrometheusQueueSource.from_config({"url": url, "query": query, **extra}, "work")


def test_a_prometheus_answer_is_split_by_its_team_label(
    prometheus_world: PrometheusWorld,
) -> None:
    by_queue = 'sum by (queue) (queue_depth{queue=~"train|infer"})'
    labelled = _prometheus(prometheus_world.url, by_queue, team_label="queue", gpus_per_unit=2)
    assert _teams(labelled.read(time.time())) == {"infer": 6, "train": 6}

    total = 'sum(queue_depth{queue=~"train|infer"})'
    static = _prometheus(prometheus_world.url, total, team="research")
    assert _teams(static.read(time.time())) == {"research": 6}
    without_label = _prometheus(prometheus_world.url, total, team_label="queue", team="research")
    assert _teams(without_label.read(time.time())) == {"research": 6}, (
        "a series without the label counts under the static team"
    )


def test_a_prometheus_label_that_cannot_be_a_team_counts_under_no_team(
    prometheus_world: PrometheusWorld, caplog: pytest.LogCaptureFixture
) -> None:
    long = "t" * (MAX_TEAM_CHARS + 1)
    query = (
        f'label_replace(vector(2), "team", "{long}", "", "")'
        ' or label_replace(vector(3), "team", "bad\\nname", "", "")'
        ' or label_replace(vector(5), "team", "vision", "", "")'
    )
    source = _prometheus(prometheus_world.url, query, team_label="team")
    with caplog.at_level(logging.WARNING):
        first = source.read(time.time())
        again = source.read(time.time())
    assert _teams(first) == _teams(again) == {None: 5, "vision": 5}
    said = [r.getMessage() for r in caplog.records if "no team" in r.getMessage()]
    assert len(said) == 2, "each bad value once, not on every read"
    assert all("\n" not in line for line in said)
