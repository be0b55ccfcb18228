"""Evacuating interrupted nodes: which jobs are asked to checkpoint, when each is requeued, and
the work it loses; then the same through the controller's tick."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, field

from fakes import FakeCloud, FakeQueue, job, pool
from hypothesis import given
from hypothesis import strategies as st

from autoscaler.app.recording import Recorded, recording_scheduler
from autoscaler.fleet.checkpoints import CheckpointLedger, CheckpointReport
from autoscaler.model import InterruptionNotice, NoticeKind, Placement
from autoscaler.model.clock import ManualClock
from autoscaler.model.config import ControllerConfig, InterruptionConfig
from autoscaler.model.errors import SourceError
from autoscaler.ops.metrics import Metrics
from autoscaler.spi.sources import CheckpointingScheduler, HeldOff, MovesJobsOff, RunningJob
from autoscaler.tick.controller import Controller
from autoscaler.tick.evacuate import EvacuationSettings, Evacuator, Move
from autoscaler.tick.retry import RetryPolicy
from policies.cost_aware import CostAwarePolicy


@dataclass
class CheckpointingFake:
    """A scheduler that knows each node's jobs and records what it is asked to do."""

    jobs: dict[str, list[RunningJob]] = field(default_factory=dict)
    signalled: list[tuple[str, str]] = field(default_factory=list)
    requeued: list[str] = field(default_factory=list)
    drained: list[str] = field(default_factory=list)
    failing_signal: set[str] = field(default_factory=set)
    bulk_calls: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def running_jobs(self, node: str) -> Sequence[RunningJob]:
        return list(self.jobs.get(node, []))

    def running_jobs_by_node(self) -> dict[str, list[RunningJob]]:
        self.bulk_calls += 1
        return {node: list(jobs) for node, jobs in self.jobs.items()}

    def signal(self, job_id: str, signal: str) -> None:
        if job_id in self.failing_signal:
            raise RuntimeError(f"scancel: job {job_id} is gone")
        with self.lock:
            self.signalled.append((job_id, signal))

    def requeue(self, job_id: str) -> None:
        with self.lock:
            self.requeued.append(job_id)
            for jobs in self.jobs.values():
                jobs[:] = [j for j in jobs if j.id != job_id]

    def apply_placement(self, placement: Placement) -> None:
        """Placement is not what these tests are about."""

    def drain(self, node: str, reason: str) -> int:
        self.drained.append(node)
        return len(self.jobs.get(node, []))

    def evict(self, node: str, reason: str) -> int:
        moved = [j.id for j in self.jobs.get(node, [])]
        for job_id in moved:
            self.requeue(job_id)
        return len(moved)


def running(
    job_id: str,
    node: str = "i-1",
    gpus: int = 2,
    started_at: float = 0.0,
    signal: str | None = "USR1",
    duration: float | None = 20.0,
) -> RunningJob:
    return RunningJob(job_id, node, gpus, started_at, 600.0 if signal else None, duration, signal)


def test_a_fake_of_the_right_shape_is_a_checkpointing_scheduler() -> None:
    assert isinstance(CheckpointingFake(), CheckpointingScheduler)


def test_a_checkpoint_that_fits_is_asked_for_and_the_job_requeued_once_it_reports() -> None:
    scheduler = CheckpointingFake({"i-1": [running("a"), running("b", signal=None)]})
    ledger = CheckpointLedger()
    ledger.record(CheckpointReport("b", at=900.0, duration_s=5.0))
    evacuator = Evacuator(scheduler, ledger)
    moves = {m.job_id: m for m in evacuator.interrupted([("i-1", 1120.0)], now=1000.0)}
    assert moves["a"].move is Move.CHECKPOINT_ASKED
    assert scheduler.signalled == [("a", "USR1")]
    assert moves["b"].move is Move.REQUEUED, "b cannot be asked: it goes at once"
    assert moves["b"].lost_gpu_s == 2 * (1000.0 - 900.0)
    assert evacuator.next_due() == 1120.0 - EvacuationSettings().requeue_lead_s

    assert evacuator.progress(now=1005.0) == [], "no report yet, deadline not near"
    ledger.record(CheckpointReport("a", at=1012.0, duration_s=11.0))
    (move,) = evacuator.progress(now=1013.0)
    assert (move.job_id, move.move) == ("a", Move.REQUEUED_AFTER_CHECKPOINT)
    assert move.lost_gpu_s == 2 * (1013.0 - 1012.0)
    assert scheduler.requeued == ["b", "a"]
    assert evacuator.next_due() is None and evacuator.waiting() == set()


def test_a_checkpoint_that_cannot_fit_is_not_waited_on() -> None:
    scheduler = CheckpointingFake({"vm-1": [running("a", node="vm-1", duration=40.0)]})
    evacuator = Evacuator(scheduler, CheckpointLedger())
    (move,) = evacuator.interrupted([("vm-1", 1030.0)], now=1000.0)
    assert move.move is Move.REQUEUED
    assert "does not fit" in move.detail
    assert move.lost_gpu_s == 2 * 1000.0, "no checkpoint yet: everything since the start"
    assert scheduler.signalled == [] and scheduler.requeued == ["a"]


def test_measured_checkpoint_time_beats_the_declared_one() -> None:
    scheduler = CheckpointingFake({"i-1": [running("a", duration=5.0)]})
    ledger = CheckpointLedger()
    ledger.record(CheckpointReport("a", at=500.0, duration_s=110.0))
    (move,) = Evacuator(scheduler, ledger).interrupted([("i-1", 1120.0)], now=1000.0)
    assert move.move is Move.REQUEUED, (
        "it took 110 s last time; 120 s less the margins is too short"
    )
    assert move.lost_gpu_s == 2 * 500.0


def test_no_report_before_the_deadline_requeues_from_the_last_checkpoint() -> None:
    scheduler = CheckpointingFake({"i-1": [running("a")]})
    ledger = CheckpointLedger()
    ledger.record(CheckpointReport("a", at=400.0, duration_s=10.0))
    evacuator = Evacuator(scheduler, ledger)
    evacuator.interrupted([("i-1", 1120.0)], now=1000.0)
    due = evacuator.next_due()
    assert due is not None
    assert evacuator.progress(now=due - 1) == []
    (move,) = evacuator.progress(now=due)
    assert move.move is Move.REQUEUED_AT_DEADLINE
    assert move.lost_gpu_s == 2 * (due - 400.0)


def test_a_failed_signal_requeues_at_once() -> None:
    scheduler = CheckpointingFake({"i-1": [running("a")]}, failing_signal={"a"})
    evacuator = Evacuator(scheduler, CheckpointLedger())
    moves = evacuator.interrupted([("i-1", 1120.0)], now=1000.0)
    assert [m.move for m in moves] == [Move.FAILED, Move.REQUEUED]
    assert scheduler.requeued == ["a"]
    assert evacuator.waiting() == set()


def test_rebalance_moves_fresh_checkpoints_now_and_the_rest_when_they_next_save() -> None:
    scheduler = CheckpointingFake({"i-1": [running("fresh"), running("stale")]})
    ledger = CheckpointLedger()
    ledger.record(CheckpointReport("fresh", at=950.0, duration_s=5.0))
    ledger.record(CheckpointReport("stale", at=100.0, duration_s=5.0))
    evacuator = Evacuator(scheduler, ledger)
    (move,) = evacuator.at_risk(["i-1"], now=1000.0)
    assert (move.job_id, move.lost_gpu_s) == ("fresh", 2 * 50.0)
    assert scheduler.signalled == [], "nobody is made to checkpoint early on a mere risk"
    assert evacuator.next_due() is None, "no deadline to wake for"
    assert evacuator.progress(now=1500.0) == []
    ledger.record(CheckpointReport("stale", at=1600.0, duration_s=5.0))
    (later,) = evacuator.progress(now=1601.0)
    assert (later.job_id, later.move, later.lost_gpu_s) == (
        "stale",
        Move.REQUEUED_AFTER_CHECKPOINT,
        2 * 1.0,
    )


def test_a_zone_wide_reclaim_reads_the_jobs_once_and_moves_them_all() -> None:
    scheduler = CheckpointingFake(
        {
            f"i-{n}": [
                running(f"{n}-a", node=f"i-{n}"),
                running(f"{n}-b", node=f"i-{n}", signal=None),
            ]
            for n in range(500)
        }
    )
    evacuator = Evacuator(scheduler, CheckpointLedger())
    moves = evacuator.interrupted([(f"i-{n}", 1120.0) for n in range(500)], now=1000.0)
    assert scheduler.bulk_calls == 1
    assert len(scheduler.signalled) == 500 and len(scheduler.requeued) == 500
    assert len(moves) == 1000
    evacuator.close()


jobs_strategy = st.lists(
    st.tuples(
        st.integers(min_value=1, max_value=8),
        st.one_of(st.none(), st.floats(min_value=0, max_value=200)),
        st.booleans(),
        st.one_of(st.none(), st.floats(min_value=0, max_value=990)),
    ),
    min_size=1,
    max_size=12,
)


@given(jobs_strategy, st.floats(min_value=0, max_value=180), st.floats(min_value=0, max_value=300))
def test_every_job_leaves_exactly_once_and_is_asked_only_when_it_fits(
    specs: list[tuple[int, float | None, bool, float | None]], lead: float, later: float
) -> None:
    now, deadline = 1000.0, 1000.0 + lead
    ledger = CheckpointLedger()
    jobs = []
    for index, (gpus, duration, signals, last) in enumerate(specs):
        jobs.append(
            RunningJob(str(index), "n", gpus, 0.0, 600.0, duration, "USR1" if signals else None)
        )
        if last is not None:
            ledger.record(CheckpointReport(str(index), last, 1.0))
    scheduler = CheckpointingFake({"n": list(jobs)})
    settings = EvacuationSettings()
    evacuator = Evacuator(scheduler, ledger, settings)
    first = evacuator.interrupted([("n", deadline)], now)
    for move in first:
        job_ = jobs[int(move.job_id)]
        expected = ledger.expected_duration(job_.id, job_.checkpoint_duration_s)
        fits = (
            job_.checkpoint_signal is not None
            and expected is not None
            and now + expected + settings.checkpoint_margin_s <= deadline - settings.requeue_lead_s
        )
        assert (move.move is Move.CHECKPOINT_ASKED) == fits
    evacuator.progress(now + lead + later)
    assert sorted(scheduler.requeued) == sorted(j.id for j in jobs), "every job left, once"
    assert evacuator.waiting() == set()
    evacuator.close()


def test_the_controller_evacuates_on_a_notice_and_counts_the_work_lost() -> None:
    clock = ManualClock(1_000_000.0)
    cloud = FakeCloud("fake", price_table={"a": 1.0}, now=clock.now)
    queue = FakeQueue()
    scheduler = CheckpointingFake()
    metrics = Metrics()
    ledger = CheckpointLedger()
    controller = Controller(
        ControllerConfig(fleet_id="test", pools=(pool("a"),), interruptions=InterruptionConfig()),
        CostAwarePolicy(),
        {"fake": cloud},
        clock,
        [queue],
        scheduler=scheduler,
        incarnation="t",
        retry=RetryPolicy(attempts=1, sleep=lambda _s: None),
        metrics=metrics,
        checkpoints=ledger,
    )
    queue.jobs = [job("x")]
    controller.tick()
    cloud.boot_all()
    (instance,) = cloud.instances
    start = clock.now()
    scheduler.jobs[instance] = [
        RunningJob("x", instance, 1, start, 600.0, 10.0, "USR1"),
        RunningJob("y", instance, 1, start, None, None, None),
    ]
    clock.advance(300)
    cloud.notices.append(
        InterruptionNotice(
            instance_id=instance,
            pool="a",
            kind=NoticeKind.TERMINATE,
            received_at=clock.now(),
            deadline=clock.now() + 120,
        )
    )
    report = controller.tick()
    moves = {a.job_id: a.outcome for a in report.actions if a.kind == "evacuate"}
    assert moves == {"x": "checkpoint-asked", "y": "requeued"}
    assert instance in scheduler.drained
    due = controller.next_due()
    assert due is not None and due < clock.now() + 120

    clock.advance(8)
    ledger.record(CheckpointReport("x", clock.now() - 1, 7.0))
    report = controller.tick()
    moves = {a.job_id: a.outcome for a in report.actions if a.kind == "evacuate"}
    assert moves == {"x": "requeued-after-checkpoint"}
    assert sorted(scheduler.requeued) == ["x", "y"]
    lost = metrics.registry.get_sample_value("gpu_autoscaler_work_lost_gpu_seconds_total")
    assert lost == 300.0 + 1.0, "y lost its 300 s; x only the second after its checkpoint"


# -- making room for a pending job: binding it when the moves are decided ----------------------


@dataclass
class BindingFake(CheckpointingFake):
    """A scheduler that moves jobs off nodes and binds pending jobs, logging every call in
    order; ``refuse`` names the pending jobs it will not bind (started or gone meanwhile)."""

    calls: list[tuple[str, ...]] = field(default_factory=list)
    refuse: set[str] = field(default_factory=set)

    def signal(self, job_id: str, signal: str) -> None:
        super().signal(job_id, signal)
        self.calls.append(("signal", job_id))

    def move_off(self, job_id: str, node: str, for_job: str) -> None:
        self.calls.append(("move_off", job_id, node, for_job))

    def bind(self, for_job: str, nodes: Sequence[str]) -> None:
        if for_job in self.refuse:
            raise SourceError(f"bind job {for_job}: it is not pending")
        self.calls.append(("bind", for_job, *nodes))

    def held_off(self) -> list[HeldOff]:
        return []


def test_a_move_with_a_bound_binds_its_job_before_any_job_is_asked_to_checkpoint() -> None:
    fake = BindingFake()
    assert isinstance(fake, MovesJobsOff)
    ledger = CheckpointLedger()
    evacuator = Evacuator(fake, ledger, EvacuationSettings(checkpoint_margin_s=10.0))
    saving = running("saving", "gpu-a", gpus=1)
    silent = running("silent", "gpu-a", gpus=1, signal=None)
    asked = evacuator.make_room("gpu-a", [saving, silent], "owner", 1_000.0, by=1_300.0)
    assert sorted((m.job_id, m.move) for m in asked) == [
        ("saving", Move.CHECKPOINT_ASKED),
        ("silent", Move.MOVED_OFF),
    ]
    # bound first; then the job that cannot checkpoint leaves and the other is asked (in
    # parallel, so in either order)
    assert fake.calls[0] == ("bind", "owner", "gpu-a")
    assert sorted(fake.calls[1:]) == [
        ("move_off", "silent", "gpu-a", "owner"),
        ("signal", "saving"),
    ]
    ledger.record(CheckpointReport("saving", 1_015.0, 15.0, "gpu-a"))
    evacuator.progress(1_015.0)
    assert fake.calls[-1] == ("move_off", "saving", "gpu-a", "owner"), "moving binds no more"
    assert [c for c in fake.calls if c[0] == "bind"] == [("bind", "owner", "gpu-a")]
    evacuator.close()


def test_a_multi_node_job_is_bound_once_to_all_the_nodes_freed_for_it() -> None:
    """The guard grants a multi-node job's moves together; each names every node freed for it
    and binds it to all of them, once in the tick."""
    fake = BindingFake()
    evacuator = Evacuator(fake, CheckpointLedger())
    nodes = ("gpu-a", "gpu-b")
    for node in nodes:
        evacuator.make_room(
            node, [running(f"on-{node}", node)], "gang", 1_000.0, None, 1_300.0, nodes
        )
    assert fake.calls[0] == ("bind", "gang", "gpu-a", "gpu-b")
    assert [c for c in fake.calls if c[0] == "bind"] == [fake.calls[0]]
    assert {c for c in fake.calls if c[0] == "signal"} == {
        ("signal", "on-gpu-a"),
        ("signal", "on-gpu-b"),
    }
    # a later tick binds again (the scheduler keeps the same binding as it is)
    evacuator.make_room("gpu-a", [running("more", "gpu-a")], "gang", 1_060.0, None, 1_300.0, nodes)
    assert [c for c in fake.calls if c[0] == "bind"] == [fake.calls[0]] * 2
    evacuator.close()


def test_a_binding_refused_moves_nothing() -> None:
    """The job room was to be made for started (or left) meanwhile: freeing room for it now
    would free it for nobody, so no job is asked to checkpoint or moved."""
    fake = BindingFake(refuse={"owner"})
    evacuator = Evacuator(fake, CheckpointLedger())
    jobs = [running("saving", "gpu-a", gpus=1), running("silent", "gpu-a", gpus=1, signal=None)]
    moves = evacuator.make_room("gpu-a", jobs, "owner", 1_000.0, by=1_300.0)
    assert [(m.job_id, m.move) for m in moves] == [("saving", Move.FAILED), ("silent", Move.FAILED)]
    assert all("binding it failed" in m.detail and "not pending" in m.detail for m in moves)
    assert (
        fake.calls == [] and evacuator.waiting() == set() and evacuator.making_room_for() == set()
    )
    evacuator.close()


def test_rebalancing_binds_nobody() -> None:
    fake = BindingFake(refuse={"p"})
    ledger = CheckpointLedger()
    evacuator = Evacuator(fake, ledger)
    (asked,) = evacuator.make_room("gpu-a", [running("saving", "gpu-a")], "p", 1_000.0)
    assert asked.move is Move.CHECKPOINT_ASKED and fake.calls == [("signal", "saving")]
    ledger.record(CheckpointReport("saving", 1_010.0, 10.0, "gpu-a"))
    evacuator.progress(1_010.0)
    assert fake.calls[-1] == ("move_off", "saving", "gpu-a", "p")
    evacuator.close()


def test_a_dry_run_records_the_binding_and_the_moves_and_does_neither() -> None:
    inner = BindingFake()
    recorded = Recorded()
    scheduler = recording_scheduler(inner, recorded)
    assert isinstance(scheduler, MovesJobsOff)
    evacuator = Evacuator(scheduler, CheckpointLedger())
    nodes = ("gpu-a", "gpu-b")
    job = running("silent", "gpu-a", signal=None)
    evacuator.make_room("gpu-a", [job], "gang", 1_000.0, None, 1_300.0, nodes)
    assert recorded.calls == [
        ("bind", "gang", "gpu-a", "gpu-b"),
        ("move_off", "silent", "gpu-a", "gang"),
    ]
    assert inner.calls == []
    evacuator.close()
