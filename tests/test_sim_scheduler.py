"""The simulator's scheduler: never over-commits a node, conserves GPU-seconds, starts jobs in
FIFO order with backfill, obeys the placement rule, and keeps checkpointed work on interruption."""

from __future__ import annotations

import heapq
import itertools
import math
from typing import cast

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autoscaler.model import Capacity, OnPremUse, Placement
from autoscaler.model.clock import ManualClock
from autoscaler.model.errors import SourceError
from autoscaler.sim.scheduler import UNJUDGED_TIERS, SimJob, SimScheduler
from autoscaler.sim.trace import TraceJob


def trace_job(
    job_id: str,
    gpus: int = 1,
    duration: float = 100.0,
    submit: float = 0.0,
    interval: float | None = None,
    cost: float = 0.0,
    high: bool = False,
) -> TraceJob:
    return TraceJob(job_id, submit, duration, gpus, 1.0, interval, cost, high)


class World:
    """Drives a scheduler through time the way the engine does: events in order, then a pass.
    ``tick`` applies a placement as the controller's tick does; the world notes whether each
    job had been judged by one when it last started."""

    def __init__(self) -> None:
        self.clock = ManualClock(0.0)
        self.events: list[tuple[float, int, SimJob, int]] = []
        self.order = itertools.count()
        self.scheduler = SimScheduler(self.clock, 5.0, self._started)
        self.judged: int | None = None  # jobs submitted before the last tick; None: no tick yet
        self.judged_at_start: dict[int, bool] = {}

    def tick(self, placement: Placement) -> None:
        self.scheduler.apply_placement(placement)
        self.judged = len(self.scheduler.jobs)

    def _started(self, job: SimJob, end: float) -> None:
        self.judged_at_start[job.seq] = self.judged is None or job.seq < self.judged
        heapq.heappush(self.events, (end, next(self.order), job, job.run_id))

    def run_until(self, t: float) -> None:
        while self.events and self.events[0][0] <= t:
            when, _, job, run_id = heapq.heappop(self.events)
            self.clock.set(when)
            self.scheduler.finish(job, run_id, when)
            self.scheduler.schedule(when)
            self.check()
        self.clock.set(max(self.clock.now(), t))

    def check(self) -> None:
        placement = self.scheduler.placement
        for node in self.scheduler.nodes.values():
            used = sum(j.gpus for j in node.jobs.values())
            assert 0 <= node.free == node.gpus - used, node.name
            for job in node.jobs.values():
                allowed = placement.tiers(
                    job.trace.checkpoint_interval_s is not None, job.trace.high_priority
                )
                if not self.judged_at_start[job.seq] and placement.waits_for_judgement():
                    allowed = UNJUDGED_TIERS
                assert node.kind in allowed, (job.trace.id, node.kind)


def test_fifo_with_backfill() -> None:
    world = World()
    s = world.scheduler
    s.add_node("n", 4, Capacity.ONPREM, None, 0.0)
    first = s.submit(trace_job("first", gpus=3, duration=100), 0.0)
    big = s.submit(trace_job("big", gpus=4, duration=100), 0.0)
    small = s.submit(trace_job("small", gpus=1, duration=50), 0.0)
    s.schedule(0.0)
    assert first.run_start == 0.0
    assert big.run_start is None, "does not fit while 'first' runs"
    assert small.run_start == 0.0, "backfills into the GPU 'big' cannot use"
    world.run_until(100.0)
    assert big.run_start == 100.0


def test_placement_keeps_protected_jobs_off_spot_and_orders_tiers() -> None:
    world = World()
    s = world.scheduler
    s.add_node("spot", 1, Capacity.SPOT, "p", 0.0)
    s.add_node("onprem", 1, Capacity.ONPREM, None, 0.0)
    protected = s.submit(trace_job("protected"), 0.0)
    safe = s.submit(trace_job("safe", interval=600.0), 0.0)
    s.apply_placement(
        Placement(protect_uncheckpointable=True, spot_safe_onprem=OnPremUse.AFTER_CLOUD)
    )
    s.schedule(0.0)
    assert protected.node is not None and protected.node.name == "onprem"
    assert safe.node is not None and safe.node.name == "spot"
    late = s.submit(trace_job("late-protected"), 1.0)
    s.schedule(1.0)
    assert late.node is None, "the only free room left would be spot"


def test_a_job_submitted_since_the_last_placement_uses_the_cloud_only_from_the_next_tick() -> None:
    """Live, with on-demand twins (docs/slurm.md), a new job is in its base partition only
    (on-prem nodes) until the controller's next tick judges it and writes its twins in the
    placement's order: the parity test (tests/test_parity.py) found the simulator starting such
    a job on spot room at once, and, once on-demand nodes left the base partition, on
    on-demand room at once, while Slurm kept it waiting for the tick."""
    world = World()
    s = world.scheduler
    placement = Placement(protect_uncheckpointable=True)
    s.add_node("onprem", 1, Capacity.ONPREM, None, 0.0)
    s.add_node("spot", 2, Capacity.SPOT, "p", 0.0)
    world.tick(placement)
    filler = s.submit(trace_job("filler", duration=1000.0), 0.0)
    waits = s.submit(trace_job("waits", interval=600.0), 0.0)
    s.schedule(0.0)
    assert filler.node is not None and filler.node.name == "onprem"
    assert waits.node is None, "spot room only: it waits for the tick"
    assert [g.jobs for g in s.read(0.0)] == [1], "and is demand meanwhile"
    world.tick(placement)
    s.schedule(0.0)
    assert waits.node is not None and waits.node.name == "spot"
    s.add_node("od", 2, Capacity.ON_DEMAND, "q", 10.0)
    late = s.submit(trace_job("late", interval=600.0), 20.0)
    protected = s.submit(trace_job("protected"), 20.0)
    s.schedule(20.0)
    assert late.node is None, "spot and on-demand room, neither before its judgement"
    assert protected.node is None, "on-demand room is not the base partition's either"
    world.tick(placement)
    s.schedule(20.0)
    assert late.node is not None and late.node.name == "spot", "judged: spot before on-demand"
    assert protected.node is not None and protected.node.name == "od"
    world.check()


def test_a_new_job_takes_on_prem_room_at_once() -> None:
    """The base partition holds the on-prem nodes: a job submitted between ticks starts there
    without waiting for its judgement, spot-safe or not."""
    world = World()
    s = world.scheduler
    s.add_node("onprem", 2, Capacity.ONPREM, None, 0.0)
    s.add_node("spot", 1, Capacity.SPOT, "p", 0.0)
    world.tick(Placement(protect_uncheckpointable=True))
    jobs = [
        s.submit(trace_job(name, interval=interval), 0.0)
        for name, interval in (("safe", 600.0), ("protected", None))
    ]
    s.schedule(0.0)
    assert [j.node.name if j.node else None for j in jobs] == ["onprem", "onprem"]
    world.check()


@pytest.mark.parametrize(
    "placement",
    [
        Placement(protect_uncheckpointable=True, judged_each_tick=False),  # a peer's users
        Placement(),  # nothing is kept off spot: nothing to judge
    ],
)
def test_a_job_whose_place_needs_no_judgement_uses_spot_on_arrival(placement: Placement) -> None:
    world = World()
    s = world.scheduler
    s.add_node("spot", 1, Capacity.SPOT, "p", 0.0)
    world.tick(placement)
    job = s.submit(trace_job("new", interval=600.0), 0.0)
    s.schedule(0.0)
    assert job.node is not None and job.node.name == "spot"
    world.check()


def test_interrupted_job_keeps_work_up_to_its_last_checkpoint_and_requeues() -> None:
    world = World()
    s = world.scheduler
    s.add_node("n", 1, Capacity.SPOT, "p", 0.0)
    job = s.submit(trace_job("j", duration=1000.0, interval=300.0, cost=20.0), 0.0)
    s.schedule(0.0)
    assert job.run_wall == 1000.0 + 3 * 20.0
    world.run_until(700.0)
    s.remove_node("n", 700.0)
    # two checkpoints finished (at 320 and 640 s); the 60 s since the last one are lost
    assert job.progress == 600.0
    assert math.isclose(job.lost_gpu_s, 60.0)
    assert job.node is None and s.pending == 1
    s.add_node("m", 1, Capacity.SPOT, "p", 800.0)
    s.schedule(800.0)
    assert job.run_wall == 400.0 + 1 * 20.0
    assert math.isclose(job.waited, 100.0)


def test_uncheckpointed_job_loses_everything_it_did() -> None:
    world = World()
    s = world.scheduler
    s.add_node("n", 2, Capacity.SPOT, "p", 0.0)
    job = s.submit(trace_job("j", gpus=2, duration=1000.0), 0.0)
    s.schedule(0.0)
    world.run_until(400.0)
    s.remove_node("n", 400.0)
    assert job.progress == 0.0
    assert math.isclose(s.accounting.lost_gpu_s, 800.0)


def test_a_moved_job_keeps_its_checkpoint_and_stays_off_until_the_job_it_made_room_for_starts() -> (
    None
):
    world = World()
    s = world.scheduler
    placement = Placement(protect_uncheckpointable=True, rebalance_onprem=True)
    s.add_node("onprem", 1, Capacity.ONPREM, None, 0.0)
    mobile = s.submit(trace_job("mobile", duration=5000.0, interval=600.0, cost=10.0), 0.0)
    s.apply_placement(placement)
    s.schedule(0.0)
    assert mobile.node is not None and mobile.node.name == "onprem"
    world.run_until(700.0)
    protected = s.submit(trace_job("protected", duration=100.0), 700.0)
    s.apply_placement(placement)  # the tick that asks for the move
    s.schedule(700.0)
    assert protected.node is None, "the scheduler never moves a job by itself"
    with pytest.raises(SourceError, match="does not run there"):
        s.move_off(str(mobile.seq), "elsewhere", str(protected.seq))
    # one 600 s + 10 s cycle done and 90 s since: the move keeps the checkpoint, loses the 90 s
    s.move_off(str(mobile.seq), "onprem", str(protected.seq))
    assert [(h.job_id, h.node, h.for_job) for h in s.held_off()] == [
        (str(mobile.seq), "onprem", str(protected.seq))
    ]
    assert mobile.progress == 600.0 and s.accounting.migrations == 1
    assert s.accounting.requeues == 0 and mobile.interruptions == 0
    s.schedule(700.0)
    assert protected.node is not None and protected.node.name == "onprem"
    assert mobile.node is None and s.held_off() == []
    s.add_node("spot", 1, Capacity.SPOT, "p", 800.0)
    s.schedule(800.0)
    assert mobile.node is not None and mobile.node.name == "spot"


def test_a_moved_job_does_not_take_back_the_node_it_left() -> None:
    world = World()
    s = world.scheduler
    s.add_node("onprem", 2, Capacity.ONPREM, None, 0.0)
    small = s.submit(trace_job("small", duration=9000.0, interval=600.0), 0.0)
    s.schedule(0.0)
    big = s.submit(trace_job("big", gpus=2, duration=100.0, interval=600.0), 5.0)
    filler = s.submit(trace_job("filler", duration=9000.0), 6.0)
    s.schedule(6.0)
    assert filler.node is not None and big.node is None
    s.apply_placement(Placement(rebalance_onprem=True))  # the tick that asks for the move
    s.move_off(str(small.seq), "onprem", str(big.seq))
    s.schedule(7.0)
    # the freed GPU is not enough for the big job; the moved one may not take it back
    assert small.node is None and big.node is None
    assert [h.job_id for h in s.held_off()] == [str(small.seq)]
    s.add_node("spot", 1, Capacity.SPOT, "p", 8.0)
    s.schedule(8.0)
    assert small.node is not None and small.node.name == "spot"


def test_without_rebalance_nothing_moves() -> None:
    world = World()
    s = world.scheduler
    s.apply_placement(Placement(protect_uncheckpointable=True))
    s.add_node("onprem", 1, Capacity.ONPREM, None, 0.0)
    s.add_node("spot", 1, Capacity.SPOT, "p", 0.0)
    mobile = s.submit(trace_job("mobile", interval=600.0), 0.0)
    s.schedule(0.0)
    protected = s.submit(trace_job("protected"), 1.0)
    s.schedule(1.0)
    assert mobile.node is not None and mobile.node.name == "onprem"
    assert protected.node is None


jobs_strategy = st.lists(
    st.tuples(
        st.floats(0, 5000),  # submit
        st.floats(0, 3000),  # duration
        st.sampled_from([1, 1, 1, 2, 4, 8]),  # gpus
        st.none() | st.floats(60, 1200),  # checkpoint interval
        st.floats(0, 60),  # checkpoint cost
        st.booleans(),  # a tick comes before the scheduler next looks at the queue
    ),
    min_size=1,
    max_size=40,
)
nodes_strategy = st.lists(
    st.tuples(
        st.sampled_from([1, 2, 4, 8]),
        st.sampled_from(list(Capacity)),
        st.floats(0, 4000),
        st.none() | st.floats(0, 8000),
    ),
    min_size=1,
    max_size=8,
)


@settings(max_examples=200, deadline=None)
@given(
    jobs_strategy, nodes_strategy, st.sampled_from(list(OnPremUse)), st.booleans(), st.booleans()
)
def test_never_over_commits_and_conserves_gpu_seconds(
    jobs: list[tuple[float, float, int, float | None, float, bool]],
    nodes: list[tuple[int, Capacity, float, float | None]],
    onprem_use: OnPremUse,
    protect: bool,
    rebalance: bool,
) -> None:
    world = World()
    s = world.scheduler
    placement = Placement(
        protect_uncheckpointable=protect,
        spot_safe_onprem=onprem_use,
        rebalance_onprem=rebalance,
    )
    world.tick(placement)
    timeline: list[tuple[float, int, str, object]] = []
    ticked: dict[str, bool] = {}
    for i, (submit, duration, gpus, interval, cost, tick) in enumerate(jobs):
        timeline.append(
            (submit, 1, "submit", trace_job(f"j{i}", gpus, duration, submit, interval, cost))
        )
        ticked[f"j{i}"] = tick
    for i, (gpus, kind, joins, leaves) in enumerate(nodes):
        timeline.append((joins, 0, "join", (f"n{i}", gpus, kind)))
        if leaves is not None and leaves > joins:
            timeline.append((leaves, 2, "leave", f"n{i}"))
    horizon = 20_000.0
    for when, _, what, payload in sorted(timeline, key=lambda e: (e[0], e[1], e[2])):
        world.run_until(when)
        if what == "submit":
            assert isinstance(payload, TraceJob)
            s.submit(payload, when)
            if ticked[payload.id]:
                world.tick(placement)
        elif what == "join":
            name, gpus, kind = cast(tuple[str, int, Capacity], payload)
            s.add_node(name, gpus, kind, None, when)
        else:
            s.remove_node(str(payload), when)
        s.schedule(when)
        world.check()
    world.run_until(horizon)
    s.close(horizon)
    acc = s.accounting
    allocated = sum(acc.allocated_gpu_s.values())
    assert math.isclose(
        allocated,
        acc.useful_gpu_s + acc.lost_gpu_s + acc.checkpoint_gpu_s,
        rel_tol=1e-9,
        abs_tol=1e-6,
    )
    for job in s.jobs:
        assert job.progress <= job.trace.duration + 1e-9
        if job.finished_at is not None:
            assert math.isclose(job.progress, job.trace.duration)
    done = sum(j.gpus * j.trace.duration for j in s.jobs if j.finished_at is not None)
    assert acc.useful_gpu_s + 1e-6 >= done


def test_the_sim_scheduler_is_a_checkpointing_scheduler_for_the_evacuator() -> None:
    from autoscaler.spi.sources import CheckpointingScheduler

    asked: list[tuple[SimJob, int, float, float]] = []
    clock = ManualClock(0.0)
    s = SimScheduler(clock, 5.0, lambda job, end: None, lambda *a: asked.append(a))
    assert isinstance(s, CheckpointingScheduler)
    s.add_node("i-1", 1, Capacity.SPOT, "p", 0.0)
    job = s.submit(trace_job("j", duration=5000.0, interval=300.0, cost=20.0), 0.0)
    s.schedule(0.0)
    (listed,) = s.running_jobs("i-1")
    assert (listed.node, listed.gpus, listed.checkpoint_signal) == ("i-1", 1, "USR1")
    assert s.running_jobs_by_node() == {"i-1": [listed]}

    clock.set(700.0)
    # checkpoints done at 320 and 640 s count as reported the moment they finished
    assert s.checkpoints.last(listed.id) == 640.0
    s.signal(listed.id, "USR1")
    ((_, run_id, asked_at, done_at),) = asked
    assert (asked_at, done_at) == (700.0, 720.0)
    clock.set(720.0)
    s.checkpointed(job, run_id, asked_at, 720.0)
    assert job.progress == 600.0 + 60.0, "the work up to the request is kept"
    assert s.checkpoints.last(listed.id) == 720.0
    assert job.node is not None and job.node.name == "i-1", "it goes on where it was"

    clock.set(725.0)
    s.requeue(listed.id)
    assert job.node is None and s.pending == 1
    assert math.isclose(job.lost_gpu_s, 5.0), "only the 5 s since the asked checkpoint"


def test_a_checkpoint_still_being_written_when_the_node_goes_is_not_kept() -> None:
    asked: list[tuple[SimJob, int, float, float]] = []
    clock = ManualClock(0.0)
    s = SimScheduler(clock, 5.0, lambda job, end: None, lambda *a: asked.append(a))
    s.add_node("i-1", 1, Capacity.SPOT, "p", 0.0)
    job = s.submit(trace_job("j", duration=5000.0, interval=300.0, cost=20.0), 0.0)
    s.schedule(0.0)
    clock.set(700.0)
    s.signal(str(job.seq), "USR1")
    s.remove_node("i-1", 710.0)
    ((_, run_id, asked_at, _),) = asked
    s.checkpointed(job, run_id, asked_at, 720.0)
    assert job.progress == 600.0 and math.isclose(job.lost_gpu_s, 70.0)


def test_a_gang_runs_within_one_locality_never_across_clouds_or_regions() -> None:
    world = World()
    s = world.scheduler
    s.add_node("aws-1", 8, Capacity.SPOT, "aws-pool", 0.0, locality="aws:us-west-2")
    s.add_node("gcp-1", 8, Capacity.SPOT, "gcp-pool", 0.0, locality="gcp:us-central1")
    gang = s.submit(TraceJob("gang", 0.0, 100.0, 16, 1.0, 600.0, 0.0, False, nodes=2), 0.0)
    s.schedule(0.0)
    assert gang.run_start is None, "two free nodes, but in two clouds: no one job spans them"
    s.add_node("aws-2", 8, Capacity.SPOT, "aws-pool", 10.0, locality="aws:us-west-2")
    s.schedule(10.0)
    assert gang.run_start == 10.0
    assert sorted(n.name for n in gang.members) == ["aws-1", "aws-2"]
    assert [s.nodes[n].free for n in ("aws-1", "aws-2", "gcp-1")] == [0, 0, 8]
