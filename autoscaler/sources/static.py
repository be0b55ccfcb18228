"""A queue source whose pending jobs are written in its settings: the same demand every tick.

For demos, drills and the container image's smoke run, where a controller must see work without
a real queue; with the ``sim`` provider it makes a whole controller that needs nothing outside
its own process. Each entry's jobs count as submitted ``age_s`` before the first read, so their
wait grows as a real queue's would.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    NonNegativeFloat,
    PositiveFloat,
    PositiveInt,
    model_validator,
)

from autoscaler.model import DemandGroup
from autoscaler.model.inputfile import validate_settings
from autoscaler.spi.job_shape import MAX_GPUS_PER_NODE, MAX_JOB_NODES, ModelName
from autoscaler.spi.sources import GroupKey, groups_from_counts

# Bounds every reading keeps: more jobs than any queue holds, or a wait of more than ten years,
# is a typo, not a drill.
MAX_STATIC_JOBS = 100_000_000
MAX_AGE_S = 10 * 365 * 86_400.0


class StaticJobs(BaseModel):
    """Identical pending jobs: ``count`` of them, ``gpus`` each."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    count: PositiveInt = Field(1, le=MAX_STATIC_JOBS)
    gpus: PositiveInt = Field(1, le=MAX_JOB_NODES * MAX_GPUS_PER_NODE)
    nodes: PositiveInt = Field(
        1, le=MAX_JOB_NODES, description="nodes each job needs at once (gpus is the total)"
    )
    checkpoint_interval_s: float | None = Field(
        None, gt=0, allow_inf_nan=False, description="how often the jobs checkpoint; unset: never"
    )
    high_priority: bool = False
    gpu_models: tuple[ModelName, ...] = Field(
        (), description="GPU models the jobs accept (any when empty)"
    )
    min_gpu_memory_gib: PositiveFloat | None = Field(None, allow_inf_nan=False)
    partition: str | None = Field(None, max_length=256)
    age_s: NonNegativeFloat = Field(
        0.0, le=MAX_AGE_S, description="how long they have waited at the first read"
    )

    @model_validator(mode="after")
    def _whole_nodes(self) -> StaticJobs:
        if self.gpus % self.nodes:
            raise ValueError(
                f"gpus ({self.gpus}) is each job's total and must be a multiple of nodes "
                f"({self.nodes})"
            )
        if self.gpus // self.nodes > MAX_GPUS_PER_NODE:
            raise ValueError(
                f"gpus ({self.gpus}) over {self.nodes} node(s) is more than "
                f"{MAX_GPUS_PER_NODE} GPUs per node"
            )
        return self


class StaticQueueSettings(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    jobs: tuple[StaticJobs, ...] = Field(min_length=1)


class StaticQueueSource:
    Settings = StaticQueueSettings  # what its ``settings`` hold (``gpu-autoscaler schema``)

    def __init__(self, settings: StaticQueueSettings, name: str) -> None:
        self.settings = settings
        self.name = name
        self._first_read: float | None = None

    @classmethod
    def from_config(cls, settings: Mapping[str, Any], name: str) -> StaticQueueSource:
        parsed = validate_settings(StaticQueueSettings, dict(settings), field=f"sources.{name}")
        return cls(parsed, name)

    def read(self, now: float) -> Sequence[DemandGroup]:
        if self._first_read is None:
            self._first_read = now
        counts: dict[GroupKey, int] = {}
        oldest: dict[GroupKey, float] = {}
        for entry in self.settings.jobs:
            key = GroupKey(
                entry.gpus,
                entry.checkpoint_interval_s,
                entry.high_priority,
                entry.gpu_models,
                entry.partition,
                entry.nodes,
                entry.min_gpu_memory_gib,
            )
            submitted = min(self._first_read - entry.age_s, now)
            counts[key] = counts.get(key, 0) + entry.count
            oldest[key] = min(oldest.get(key, submitted), submitted)
        return groups_from_counts(counts, oldest)
