"""SQS as a queue source: every message waiting or being worked on is a job of
``gpus_per_message`` GPUs (KEDA's SQS scaler counts the same way), of the shape the settings
give (``nodes``, ``gpu_models``, ``min_gpu_memory_gib``).

Messages are counted, never read: receiving one to look at its shape would hide it from the
workers for the visibility timeout and count towards its ``maxReceiveCount``, sending work to
the dead-letter queue that nobody failed. Work of different shapes goes in different queues,
one source each; so does the work of different teams (``team``), since a message attribute
naming one could be read only by receiving the message."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import Field, PositiveInt, field_validator

from autoscaler.model import DemandGroup, Name
from autoscaler.model.clock import Clock, SystemClock
from autoscaler.model.inputfile import validate_settings
from autoscaler.spi.job_shape import ShapeSettings
from providers.aws.errors import typed
from providers.aws.sdk import client
from providers.aws.settings import REGION, endpoint_problem, queue_url_problem


class SqsSourceSettings(ShapeSettings):
    gpus_field = "gpus_per_message"

    queue_url: str
    region: str
    endpoint_url: str | None = None
    gpus_per_message: PositiveInt = 1
    include_in_flight: bool = Field(
        True, description="count messages being worked on too (they hold their GPUs)"
    )
    checkpoint_interval_s: float | None = Field(
        None, gt=0, description="how often the work behind a message checkpoints; unset: never"
    )
    high_priority: bool = False
    team: Name | None = Field(
        None,
        description="the team this queue's work is counted under (the config's teams): a queue "
        "is one team's, since messages are counted, never read (a message attribute could "
        "name a team only by receiving the message); unset: no team",
    )

    @field_validator("queue_url")
    @classmethod
    def _a_queue_url(cls, url: str) -> str:
        problem = queue_url_problem(url)
        if problem is not None:
            raise ValueError(f"expected an SQS queue URL: {problem}")
        return url

    @field_validator("endpoint_url")
    @classmethod
    def _an_endpoint(cls, url: str | None) -> str | None:
        problem = endpoint_problem(url) if url is not None else None
        if problem is not None:
            raise ValueError(f"expected an http(s) endpoint URL: {problem}")
        return url

    @field_validator("region")
    @classmethod
    def _a_region(cls, region: str) -> str:
        if not REGION.match(region):
            raise ValueError("expected an AWS region name such as us-east-1")
        return region


class SqsQueueSource:
    Settings = SqsSourceSettings  # what its ``settings`` hold (``gpu-autoscaler schema``)

    def __init__(
        self, settings: SqsSourceSettings, name: str, clock: Clock | None = None, client: Any = None
    ) -> None:
        self.settings = settings
        self.name = name
        self.clock = clock or SystemClock()
        self._client = client

    @classmethod
    def from_config(cls, settings: Mapping[str, Any], name: str) -> SqsQueueSource:
        parsed = validate_settings(SqsSourceSettings, dict(settings), field=f"sources.{name}")
        return cls(parsed, name)

    @property
    def client(self) -> Any:
        if self._client is None:
            self._client = client(
                "sqs",
                self.settings.region,
                endpoint_url=self.settings.endpoint_url,
                connect_timeout_s=5,
                read_timeout_s=10,
                attempts=2,
            )
        return self._client

    def read(self, now: float) -> Sequence[DemandGroup]:
        names = ["ApproximateNumberOfMessages"]
        if self.settings.include_in_flight:
            names.append("ApproximateNumberOfMessagesNotVisible")
        try:
            attributes = self.client.get_queue_attributes(
                QueueUrl=self.settings.queue_url, AttributeNames=names
            )["Attributes"]
        except Exception as exc:
            raise typed(exc) from None
        jobs = sum(int(attributes.get(name, 0)) for name in names)
        if jobs == 0:
            return []
        shape = self.settings.job_shape()
        return [
            DemandGroup(
                gpus_per_job=shape.gpus,
                jobs=jobs,
                checkpoint_interval_s=self.settings.checkpoint_interval_s,
                high_priority=self.settings.high_priority,
                nodes=shape.nodes,
                gpu_models=shape.gpu_models,
                min_gpu_memory_gib=shape.min_gpu_memory_gib,
                oldest_submit_time=now,
                team=self.settings.team,
            )
        ]
