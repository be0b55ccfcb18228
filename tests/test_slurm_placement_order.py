"""The order placement writes a judged job's partitions in, with on-demand twins
(``on_demand_partitions``): property tests over generated queues and placements, the examples
docs/slurm.md gives, and the settings' checks. tests/test_slurm_placement.py shows on a real
Slurm that it tries a job's partitions in that order; tests/test_slurm_placement_rules.py holds
the rules without on-demand twins, which are unchanged."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from slurm_queue_strategies import applied, placements, planned, queued_jobs
from slurm_queue_strategies import queues as queues_of

from autoscaler.model import Capacity, OnPremUse, Placement
from autoscaler.model.errors import InputError
from autoscaler.sources.slurm import SlurmAdapter
from autoscaler.sources.slurm_json import QueuedJob
from autoscaler.sources.slurm_placement import (
    partition_plan,
    requeued_order,
    wanted_partitions,
)

SPOT = {"gpu": "gpu-spot", "big": "big-spot"}
ON_DEMAND = {"gpu": "gpu-od", "big": "big-od"}
KIND = {
    **{b: Capacity.ONPREM for b in SPOT},
    **{t: Capacity.SPOT for t in SPOT.values()},
    **{t: Capacity.ON_DEMAND for t in ON_DEMAND.values()},
}
BASE_OF = {**{b: b for b in SPOT}, **{t: b for b, t in SPOT.items()}}
BASE_OF.update({t: b for b, t in ON_DEMAND.items()})

jobs = queued_jobs(["gpu", "gpu-spot", "gpu-od", "big", "big-spot", "big-od", "onprem", "debug"], 5)
queues = queues_of(jobs)


def _plan(queue: list[QueuedJob], placement: Placement, most: int) -> dict[str, tuple[str, ...]]:
    return planned(queue, placement, SPOT, most, ON_DEMAND)


def _applied(queue: list[QueuedJob], placement: Placement, most: int) -> list[QueuedJob]:
    return applied(queue, placement, SPOT, most, ON_DEMAND)


@settings(max_examples=300, deadline=None)
@given(queues, placements)
def test_judged_jobs_are_written_in_their_tier_order_and_a_second_tick_changes_nothing(
    queue: list[QueuedJob], placement: Placement
) -> None:
    after = _applied(queue, placement, most=10_000)
    for before, job in zip(queue, after, strict=True):
        bases = [p for p in before.partitions if p in SPOT]
        if not (before.pending and before.asks_gpus and bases):
            assert job.partitions == before.partitions, "placement leaves other jobs alone"
            continue
        allowed = placement.allows_spot(before.checkpointable, before.high_priority)
        if not allowed:
            assert not set(job.partitions) & set(SPOT.values()), "kept off every spot twin"
            if job.partitions == before.partitions:
                # never updated for the order alone: Slurm may reset a priority on an update
                continue
        ours = [p for p in job.partitions if BASE_OF.get(p) in bases]
        wanted_kinds = placement.tiers(before.checkpointable, before.high_priority)
        kinds = [KIND[p] for p in ours]
        # the job's partitions of its bases: every kind of its tiers, in the tiers' order,
        # and its bases last where on-prem is not one of its tiers
        shown = [k for k in dict.fromkeys(kinds)]
        expected = list(wanted_kinds)
        if Capacity.ONPREM not in expected:
            expected.append(Capacity.ONPREM)
        assert shown == expected, (before, job, placement)
        assert kinds == sorted(kinds, key=expected.index), "one kind of capacity at a time"
        assert set(bases) <= set(job.partitions), "a base stays: it makes the job ours"
        others = [p for p in before.partitions if BASE_OF.get(p) not in bases]
        if not allowed:
            others = [p for p in others if p not in SPOT.values()]
        assert [p for p in job.partitions if BASE_OF.get(p) not in bases] == others
    assert _plan(after, placement, 10_000) == {}, "a second tick changes nothing"


@settings(max_examples=200, deadline=None)
@given(queues, placements, st.integers(1, 12))
def test_a_tick_changes_at_most_its_bound_each_job_once_jobs_leaving_spot_first(
    queue: list[QueuedJob], placement: Placement, most: int
) -> None:
    plan = partition_plan(queue, placement, SPOT, most, on_demand=ON_DEMAND)
    ids = [job_id for update in plan.updates for job_id in update.job_ids]
    assert len(ids) == len(set(ids)) == plan.jobs <= most
    changed = {
        j.id
        for j in queue
        if (wanted := wanted_partitions(j, placement, SPOT, ON_DEMAND)) is not None
        and wanted != j.partitions
    }
    assert set(ids) <= changed and len(ids) + plan.deferred == len(changed)
    leaving = {
        j.id
        for j in queue
        if j.id in changed
        and not placement.allows_spot(j.checkpointable, j.high_priority)
        and set(j.partitions) & set(SPOT.values())
    }
    if len(leaving) >= most:
        assert set(ids) <= leaving, "jobs leaving spot go before the others"
    else:
        assert set(ids) >= leaving, "every job leaving spot leaves it this tick"
    for _ in range(len(changed) // most + 1):
        queue = _applied(queue, placement, most)
    assert _plan(queue, placement, most) == {}, "deferred jobs follow"


@settings(max_examples=300, deadline=None)
@given(jobs, placements, st.data())
def test_a_requeued_job_is_put_back_where_the_next_tick_would_put_it(
    job: QueuedJob, placement: Placement, data: st.DataObject
) -> None:
    """Slurm puts the partition a requeued job ran in first in its list; the adapter's requeue
    writes the order back at once, the order the next tick would write."""
    job = QueuedJob(job.id, True, job.partitions, True, job.checkpointable, job.high_priority)
    judged = wanted_partitions(job, placement, SPOT, ON_DEMAND)
    if judged is None:
        assert requeued_order(job.partitions, placement, SPOT, ON_DEMAND) is None
        return
    ran_in = data.draw(st.sampled_from(judged))
    requeued = (ran_in, *(p for p in judged if p != ran_in))
    again = QueuedJob(job.id, True, requeued, True, job.checkpointable, job.high_priority)
    restored = requeued_order(requeued, placement, SPOT, ON_DEMAND)
    assert set(restored or requeued) == set(requeued), "only the order changes"
    if placement.allows_spot(job.checkpointable, job.high_priority):
        next_tick = wanted_partitions(again, placement, SPOT, ON_DEMAND)
        assert (restored or requeued) == next_tick
    # a job kept off spot gets its order back in the requeue's own update (ticks leave the
    # order of such a job alone): either way the next tick changes nothing
    after = QueuedJob(
        job.id, True, restored or requeued, True, job.checkpointable, job.high_priority
    )
    assert wanted_partitions(after, placement, SPOT, ON_DEMAND) == after.partitions


FIRST = Placement(protect_uncheckpointable=True, protect_high_priority=True)
AFTER_CLOUD = Placement(
    protect_uncheckpointable=True,
    protect_high_priority=True,
    spot_safe_onprem=OnPremUse.AFTER_CLOUD,
)


@pytest.mark.parametrize(
    ("partitions", "checkpointable", "placement", "written"),
    [
        (("gpu",), True, FIRST, ("gpu", "gpu-spot", "gpu-od")),
        (("gpu", "gpu-od"), True, FIRST, ("gpu", "gpu-spot", "gpu-od")),
        (("gpu", "gpu-od"), True, AFTER_CLOUD, ("gpu-spot", "gpu-od", "gpu")),
        (("gpu", "gpu-spot"), False, FIRST, ("gpu", "gpu-od")),
        (("gpu", "gpu-od"), False, AFTER_CLOUD, ("gpu", "gpu-od")),
        (("gpu-od", "gpu"), False, FIRST, ("gpu-od", "gpu")),
        (("gpu", "debug"), True, FIRST, ("gpu", "gpu-spot", "gpu-od", "debug")),
        (("debug", "gpu"), False, FIRST, ("debug", "gpu", "gpu-od")),
        (("gpu", "big"), True, FIRST, ("gpu", "big", "gpu-spot", "big-spot", "gpu-od", "big-od")),
        (("gpu-od",), False, FIRST, None),
        (("gpu-spot",), False, FIRST, None),
        (("onprem",), False, FIRST, None),
    ],
)
def test_the_orders_docs_slurm_md_shows(
    partitions: tuple[str, ...],
    checkpointable: bool,
    placement: Placement,
    written: tuple[str, ...] | None,
) -> None:
    job = QueuedJob("1", True, partitions, True, checkpointable, False)
    assert wanted_partitions(job, placement, SPOT, ON_DEMAND) == written


def test_a_job_spot_ran_is_put_back_on_prem_first() -> None:
    assert requeued_order(("gpu-spot", "gpu", "gpu-od"), FIRST, SPOT, ON_DEMAND) == (
        "gpu",
        "gpu-spot",
        "gpu-od",
    )
    assert requeued_order(("gpu-od", "gpu"), FIRST, SPOT, ON_DEMAND) == ("gpu", "gpu-od")
    assert requeued_order(("gpu", "gpu-spot", "gpu-od"), FIRST, SPOT, ON_DEMAND) is None
    assert requeued_order(("gpu-spot", "gpu"), FIRST, SPOT, {}) is None, "not without twins"


def _settings(**settings: object) -> SlurmAdapter:
    return SlurmAdapter.from_config(settings, "hpc")


def test_on_demand_twins_are_checked_against_the_spot_twins() -> None:
    adapter = _settings(spot_partitions={"gpu": "gpu-spot"}, on_demand_partitions={"gpu": "gpu-od"})
    assert adapter.settings.on_demand_partitions == {"gpu": "gpu-od"}
    cases = [
        ({"gpu": "gpu-spot"}, {"big": "big-od"}, "'big' is not a base partition"),
        ({}, {"gpu": "gpu-od"}, "'gpu' is not a base partition of spot_partitions \\(none\\)"),
        (
            {"gpu": "gpu-spot", "big": "big-spot"},
            {"gpu": "gpu-od"},
            "base partition 'big' has no on-demand twin",
        ),
        ({"gpu": "gpu-spot"}, {"gpu": "gpu-spot"}, "already a base partition or a spot twin"),
        ({"gpu": "gpu-spot"}, {"gpu": "gpu"}, "already a base partition or a spot twin"),
        ({"gpu": "gpu-spot"}, {"gpu": "gpu od"}, "'gpu od' is not a partition name"),
    ]
    for spot, on_demand, message in cases:
        with pytest.raises(InputError, match=message) as raised:
            _settings(spot_partitions=spot, on_demand_partitions=on_demand)
        assert "sources.hpc" in str(raised.value)
        assert "\n" not in str(raised.value)
