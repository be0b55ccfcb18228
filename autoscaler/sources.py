"""The interfaces observe reads from and act writes to, besides the clouds.

Queue sources report pending demand; a node source reports on-prem nodes and what runs on cloud
nodes (scheduler allocation plus measured utilisation); a workload scheduler adapter drains
nodes, requeues their jobs and applies a policy's placement rule. Slurm, Prometheus, Redis and SQS
implement them in later work; the simulator implements all three.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from autoscaler.model import DemandGroup, Job, OnPremNode, Placement


class QueueSource(Protocol):
    name: str

    def read(self, now: float) -> Sequence[DemandGroup]: ...


@dataclass(frozen=True)
class NodeUsage:
    """What the scheduler and telemetry say of one node (on-prem or a joined cloud instance)."""

    gpus_allocated: int
    gpu_util_pct: float | None = None
    idle_since: float | None = None
    empty_since: float | None = None


@dataclass(frozen=True)
class NodeReading:
    onprem: tuple[OnPremNode, ...] = ()
    cloud: Mapping[str, NodeUsage] = field(default_factory=dict)


class NodeSource(Protocol):
    name: str

    def read_nodes(self, now: float) -> NodeReading: ...


class WorkloadScheduler(Protocol):
    def apply_placement(self, placement: Placement) -> None: ...

    def drain(self, node: str, reason: str) -> int:
        """Stop new work landing on ``node``; returns how many jobs still run there."""
        ...

    def evict(self, node: str, reason: str) -> int:
        """Requeue every job on ``node`` now (it is going away); returns how many were requeued."""
        ...


GroupKey = tuple[int, float | None, bool, str | None]


def aggregate(jobs: Iterable[Job]) -> list[DemandGroup]:
    """Fold pending jobs into demand groups: same shape, same checkpoint interval, same class."""
    counts: dict[GroupKey, int] = {}
    oldest: dict[GroupKey, float] = {}
    for job in jobs:
        key = (job.gpus, job.checkpoint_interval_s, job.high_priority, job.gpu_model)
        submitted = job.submit_time
        if key in counts:
            counts[key] += 1
            oldest[key] = min(oldest[key], submitted)
        else:
            counts[key] = 1
            oldest[key] = submitted
    return [
        DemandGroup.model_construct(
            gpus_per_job=key[0],
            jobs=counts[key],
            checkpoint_interval_s=key[1],
            high_priority=key[2],
            gpu_model=key[3],
            oldest_submit_time=oldest[key],
        )
        for key in sorted(counts, key=_group_order)
    ]


def _group_order(key: GroupKey) -> tuple[int, float, bool, str]:
    return (key[0], key[1] if key[1] is not None else -1.0, key[2], key[3] or "")
