"""Generated Slurm queues and placements for the placement property tests, and the queue as
Slurm holds it after a tick's partition updates (it keeps the order each update gives)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from hypothesis import strategies as st

from autoscaler.model import OnPremUse, Placement
from autoscaler.sources.slurm_json import QueuedJob
from autoscaler.sources.slurm_placement import partition_plan

placements = st.builds(
    Placement,
    protect_uncheckpointable=st.booleans(),
    protect_high_priority=st.booleans(),
    spot_safe_onprem=st.sampled_from(list(OnPremUse)),
)


def queued_jobs(partitions: Sequence[str], most_partitions: int) -> st.SearchStrategy[QueuedJob]:
    """Jobs listing one to ``most_partitions`` of ``partitions``, in any state."""
    partition_lists = st.lists(
        st.sampled_from(list(partitions)), min_size=1, max_size=most_partitions, unique=True
    ).map(tuple)
    return st.builds(
        QueuedJob,
        id=st.integers(1, 10**6).map(str),
        pending=st.booleans(),
        partitions=partition_lists,
        asks_gpus=st.booleans(),
        checkpointable=st.booleans(),
        high_priority=st.booleans(),
    )


def queues(jobs: st.SearchStrategy[QueuedJob]) -> st.SearchStrategy[list[QueuedJob]]:
    """Queues of up to 40 such jobs with distinct ids."""
    return st.lists(jobs, max_size=40, unique_by=lambda j: j.id)


def planned(
    queue: list[QueuedJob],
    placement: Placement,
    twins: Mapping[str, str],
    most: int,
    on_demand: Mapping[str, str] | None = None,
) -> dict[str, tuple[str, ...]]:
    """Each updated job's new partitions, in the order the tick writes them."""
    plan = partition_plan(queue, placement, twins, most, on_demand=on_demand)
    return {
        job_id: tuple(update.partitions.split(","))
        for update in plan.updates
        for job_id in update.job_ids
    }


def applied(
    queue: list[QueuedJob],
    placement: Placement,
    twins: Mapping[str, str],
    most: int,
    on_demand: Mapping[str, str] | None = None,
) -> list[QueuedJob]:
    """The queue after the tick's updates, as Slurm would hold it."""
    new = planned(queue, placement, twins, most, on_demand)
    return [
        QueuedJob(
            j.id,
            j.pending,
            new.get(j.id, j.partitions),
            j.asks_gpus,
            j.checkpointable,
            j.high_priority,
        )
        for j in queue
    ]
