"""Checkpoint-aware scale-down: which node a plan gives back, and how its jobs leave it."""

from __future__ import annotations

from fakes import FakeCloud, FakeNodes, FakeQueue, pool
from hypothesis import given
from hypothesis import strategies as st
from test_evacuate import CheckpointingFake, running

from autoscaler.fleet.checkpoints import CheckpointLedger, CheckpointReport
from autoscaler.model import (
    CloudNode,
    FleetView,
    InstanceState,
    InterruptionNotice,
    Pool,
    PoolView,
    PriceQuote,
)
from autoscaler.model.clock import ManualClock
from autoscaler.model.config import ControllerConfig, InterruptionConfig, Limits
from autoscaler.spi.sources import NodeUsage, RunningJob
from autoscaler.tick.controller import Controller
from autoscaler.tick.evacuate import EvacuationSettings, Evacuator, Move
from autoscaler.tick.retry import RetryPolicy
from policies.common import drain_requests
from policies.cost_aware import CostAwareParams, CostAwarePolicy

WAIT = 600.0


def test_a_job_that_has_just_saved_leaves_at_once() -> None:
    scheduler = CheckpointingFake({"n": [running("a")]})
    ledger = CheckpointLedger()
    ledger.record(CheckpointReport("a", at=995.0, duration_s=20.0))
    (move,) = Evacuator(scheduler, ledger).scale_down(["n"], 1000.0, WAIT)
    assert (move.move, move.lost_gpu_s) == (Move.REQUEUED, 2 * 5.0)
    assert scheduler.requeued == ["a"]


def test_the_next_natural_checkpoint_is_waited_for_when_it_comes_before_an_asked_one() -> None:
    # saved at 500 s, every 600 s, 20 s to write: the next one is done at 1120 s; asking now
    # would be done at 1020 s, so it is asked (the sooner of the two frees the node first)
    scheduler = CheckpointingFake({"n": [running("asked")]})
    ledger = CheckpointLedger()
    ledger.record(CheckpointReport("asked", at=500.0, duration_s=20.0))
    evacuator = Evacuator(scheduler, ledger)
    (move,) = evacuator.scale_down(["n"], 1000.0, WAIT)
    assert move.move is Move.CHECKPOINT_ASKED and scheduler.signalled == [("asked", "USR1")]

    # a job that cannot be asked is waited on until its own checkpoint is done (1100 + 20 s)
    scheduler = CheckpointingFake({"n": [running("natural", signal=None)]})
    natural = RunningJob("natural", "n", 2, 0.0, 600.0, 20.0, None)
    scheduler.jobs["n"] = [natural]
    ledger = CheckpointLedger()
    ledger.record(CheckpointReport("natural", at=500.0, duration_s=20.0))
    evacuator = Evacuator(scheduler, ledger)
    (move,) = evacuator.scale_down(["n"], 1000.0, WAIT)
    assert move.move is Move.CHECKPOINT_AWAITED and scheduler.signalled == []
    assert evacuator.busy("n")
    assert evacuator.next_due() == 1120.0 + EvacuationSettings().checkpoint_margin_s
    assert evacuator.progress(1110.0) == []
    ledger.record(CheckpointReport("natural", at=1119.0, duration_s=19.0))
    (done,) = evacuator.progress(1121.0)
    assert (done.move, done.lost_gpu_s) == (Move.REQUEUED_AFTER_CHECKPOINT, 2 * 2.0)
    assert not evacuator.busy("n")


def test_a_job_whose_checkpoint_is_out_of_reach_leaves_at_once() -> None:
    scheduler = CheckpointingFake({"n": [RunningJob("x", "n", 4, 0.0, None, None, None)]})
    (move,) = Evacuator(scheduler, CheckpointLedger()).scale_down(["n"], 1000.0, WAIT)
    assert move.move is Move.REQUEUED and move.lost_gpu_s == 4 * 1000.0
    assert "no checkpoint" in move.detail


def test_the_wait_is_bounded_even_when_no_report_comes() -> None:
    scheduler = CheckpointingFake({"n": [running("a", duration=30.0)]})
    evacuator = Evacuator(scheduler, CheckpointLedger())
    evacuator.scale_down(["n"], 1000.0, WAIT)
    due = evacuator.next_due()
    assert due is not None and due <= 1000.0 + WAIT
    (move,) = evacuator.progress(due)
    assert move.move is Move.REQUEUED_AT_DEADLINE


@given(
    st.lists(
        st.tuples(
            st.one_of(st.none(), st.floats(min_value=60, max_value=7200)),
            st.one_of(st.none(), st.floats(min_value=0, max_value=900)),
            st.booleans(),
            st.one_of(st.none(), st.floats(min_value=0, max_value=1000)),
        ),
        min_size=1,
        max_size=10,
    ),
    st.floats(min_value=0, max_value=1800),
)
def test_every_job_leaves_once_within_the_wait(
    specs: list[tuple[float | None, float | None, bool, float | None]], wait: float
) -> None:
    now = 1000.0
    ledger = CheckpointLedger()
    jobs = []
    for index, (interval, duration, signals, last) in enumerate(specs):
        jobs.append(
            RunningJob(str(index), "n", 1, 0.0, interval, duration, "USR1" if signals else None)
        )
        if last is not None:
            ledger.record(CheckpointReport(str(index), last, duration or 0.0))
    scheduler = CheckpointingFake({"n": list(jobs)})
    evacuator = Evacuator(scheduler, ledger)
    evacuator.scale_down(["n"], now, wait)
    due = evacuator.next_due()
    assert due is None or due <= now + wait + EvacuationSettings().checkpoint_margin_s
    evacuator.progress(now + wait + EvacuationSettings().checkpoint_margin_s)
    assert sorted(scheduler.requeued) == sorted(j.id for j in jobs)
    assert not evacuator.busy("n")
    evacuator.close()


def _node(instance_id: str, risk: float | None, pool_name: str = "a") -> CloudNode:
    return CloudNode(
        instance_id=instance_id,
        pool=pool_name,
        state=InstanceState.RUNNING,
        launched_at=0.0,
        gpus=1,
        joined=True,
        work_at_risk_gpu_s=risk,
    )


def _view(*nodes: CloudNode, prices: dict[str, float] | None = None) -> FleetView:
    prices = prices or {"a": 1.0}
    return FleetView(
        now=1000.0,
        tick=1,
        fleet_id="t",
        pools=tuple(
            PoolView(
                pool=pool(name),
                price=PriceQuote(pool=name, price_per_hour=price, as_of=0.0),
            )
            for name, price in prices.items()
        ),
        instances=nodes,
    )


def test_drains_go_to_the_nodes_that_lose_least_then_the_dearest() -> None:
    nodes = (
        _node("big-loss", 7200.0),
        _node("unknown", None),
        _node("small-loss", 60.0),
        _node("empty-cheap", 0.0),
        _node("empty-dear", 0.0, "b"),
    )
    view = _view(*nodes, prices={"a": 1.0, "b": 3.0})
    order = [d.instance_id for d in drain_requests(nodes, set(), view, "idle")]
    assert order == ["empty-dear", "empty-cheap", "small-loss", "big-loss", "unknown"]


def _controller(
    scheduler: CheckpointingFake,
    nodes: FakeNodes,
    cloud: FakeCloud,
    clock: ManualClock,
    pools: tuple[Pool, ...],
    ledger: CheckpointLedger,
    policy: CostAwarePolicy,
    **config: object,
) -> Controller:
    return Controller(
        ControllerConfig(
            fleet_id="test",
            pools=pools,
            limits=Limits(scale_down_cooldown_s=0, max_drains_per_tick=1),
            **config,
        ),
        policy,
        {"fake": cloud},
        clock,
        [FakeQueue()],
        nodes,
        scheduler,
        incarnation="t",
        retry=RetryPolicy(attempts=1, sleep=lambda _s: None),
        checkpoints=ledger,
    )


def test_the_controller_gives_back_the_idle_node_whose_jobs_saved_last() -> None:
    clock = ManualClock(100_000.0)
    cloud = FakeCloud("fake", price_table={"a": 1.0}, now=clock.now)
    ids = [cloud.launch(pool("a"), 1, f"seed-{n}", "test").instances[0].id for n in range(3)]
    cloud.boot_all()
    scheduler = CheckpointingFake()
    ledger = CheckpointLedger()
    started = clock.now() - 3000
    for index, node in enumerate(ids):
        scheduler.jobs[node] = [RunningJob(f"job-{index}", node, 1, started, 1800.0, 30.0, "USR1")]
    # each job idles its GPU; they last saved 1500 s, 20 s and 900 s ago
    for index, ago in enumerate((1500.0, 20.0, 900.0)):
        ledger.record(CheckpointReport(f"job-{index}", clock.now() - ago, 30.0))
    nodes = FakeNodes(cloud={node: NodeUsage(1, 0.0, clock.now() - 3600, None) for node in ids})
    controller = _controller(
        scheduler,
        nodes,
        cloud,
        clock,
        (pool("a"),),
        ledger,
        CostAwarePolicy(CostAwareParams(idle_seconds=600)),
        drain_timeout_s=0,
    )
    report = controller.tick()
    by_id = {n.instance_id: n for n in report.view.instances}
    assert by_id[ids[1]].work_at_risk_gpu_s == 20.0
    drains = [a.instance_ids for a in report.actions if a.kind == "drain" and a.outcome == "ok"]
    assert drains == [(ids[1],)], "one drain per tick: the node whose job saved 20 s ago"
    moves = [(a.job_id, a.outcome) for a in report.actions if a.kind == "evacuate"]
    assert moves == [("job-1", "checkpoint-asked")], "a 30 s checkpoint beats 1780 s to the next"
    assert scheduler.signalled == [("job-1", "USR1")]
    terminated = [a for a in report.actions if a.kind == "terminate" and a.done]
    assert terminated == [], "the node stays until its job has saved"

    clock.advance(31)
    ledger.record(CheckpointReport("job-1", clock.now() - 1, 30.0))
    report = controller.tick()
    moves = [(a.job_id, a.outcome) for a in report.actions if a.kind == "evacuate"]
    assert ("job-1", "requeued-after-checkpoint") in moves
    assert scheduler.requeued == ["job-1"]
    assert any(a.kind == "terminate" and ids[1] in a.instance_ids for a in report.actions), (
        "once its job has left, the node goes in the same tick"
    )


def test_without_checkpoint_awareness_a_timed_out_drain_evicts() -> None:
    clock = ManualClock(100_000.0)
    cloud = FakeCloud("fake", price_table={"a": 1.0}, now=clock.now)
    (instance,) = cloud.launch(pool("a"), 1, "seed", "test").instances
    cloud.boot_all()
    scheduler = CheckpointingFake(
        {instance.id: [RunningJob("j", instance.id, 1, clock.now() - 100, 1800.0, 30.0, "USR1")]}
    )
    nodes = FakeNodes(cloud={instance.id: NodeUsage(1, 0.0, clock.now() - 3600, None)})
    controller = _controller(
        scheduler,
        nodes,
        cloud,
        clock,
        (pool("a"),),
        CheckpointLedger(),
        CostAwarePolicy(CostAwareParams(idle_seconds=600)),
        drain_timeout_s=0,
        interruptions=InterruptionConfig(checkpoint_aware=False),
    )
    report = controller.tick()
    assert report.view.instances[0].work_at_risk_gpu_s is None
    assert [a.kind for a in report.actions if a.kind in ("evict", "evacuate")] == ["evict"]
    assert scheduler.signalled == [] and scheduler.requeued == ["j"]


def _one_job_on_an_eight_gpu_node(
    prices: dict[str, float], usage: NodeUsage | None = None
) -> tuple[ManualClock, Controller]:
    """An 8-GPU spot node running one long 1-GPU job that checkpoints, at 12.5 % utilisation
    (or as ``usage`` says)."""
    clock = ManualClock(100_000.0)
    pools = tuple(pool(name, gpus=8 if name == "big" else 1) for name in prices)
    cloud = FakeCloud("fake", price_table=prices, now=clock.now)
    (instance,) = cloud.launch(pools[0], 1, "seed", "test").instances
    cloud.boot_all()
    long_job = RunningJob("long", instance.id, 1, clock.now() - 7200, 1800.0, 30.0, "USR1")
    scheduler = CheckpointingFake({instance.id: [long_job]})
    nodes = FakeNodes(cloud={instance.id: usage or NodeUsage(1, 12.5, None, None)})
    controller = _controller(
        scheduler, nodes, cloud, clock, pools, CheckpointLedger(), CostAwarePolicy()
    )
    return clock, controller


def test_an_underused_eight_gpu_node_hands_its_job_to_cheaper_capacity() -> None:
    clock, controller = _one_job_on_an_eight_gpu_node({"big": 10.0, "small": 1.2})
    report = controller.tick()
    (node,) = report.view.instances
    assert node.underused_since == clock.now() and node.jobs_checkpoint is True
    assert not [a for a in report.actions if a.kind == "drain"], "not before the boot time"

    clock.advance(121)
    report = controller.tick()
    (drain,) = [a for a in report.actions if a.kind == "drain"]
    assert "1 of 8 GPUs" in drain.detail
    assert [(a.job_id, a.outcome) for a in report.actions if a.kind == "evacuate"] == [
        ("long", "checkpoint-asked")
    ], "moved at once, at a checkpoint, without waiting for the drain timeout"


def test_an_underused_node_stays_when_nothing_cheaper_can_host_its_jobs() -> None:
    clock, controller = _one_job_on_an_eight_gpu_node({"big": 10.0})
    controller.tick()
    clock.advance(600)
    report = controller.tick()
    assert not [a for a in report.actions if a.kind in ("drain", "evacuate")]


# -- replacing what is dearer than it needs to be ------------------------------------------------


def _od_and_spot(
    now: float, instance_type: str, gpus: int, od_price: float, spot_price: float
) -> tuple[PoolView, PoolView]:
    """An on-demand pool and a spot pool of the same V100 instances, each priced."""
    od = Pool(
        name="od",
        provider="aws",
        region="r",
        instance_type=instance_type,
        gpus_per_instance=gpus,
        gpu_model="V100",
        market="on-demand",  # type: ignore[arg-type]
        boot_seconds=180,
    )
    spot = Pool.model_validate({**od.model_dump(), "name": "spot", "market": "spot"})
    return (
        PoolView(pool=od, price=PriceQuote(pool="od", price_per_hour=od_price, as_of=now)),
        PoolView(pool=spot, price=PriceQuote(pool="spot", price_per_hour=spot_price, as_of=now)),
    )


def _od_view(
    *, spot_price: float, checkpoint: bool = True, multi_node: bool = False, age_s: float = 7200
) -> FleetView:
    now = 100_000.0
    node = CloudNode(
        instance_id="od-1",
        pool="od",
        state=InstanceState.RUNNING,
        launched_at=now - age_s,
        gpus=1,
        gpus_allocated=1,
        joined=True,
        work_at_risk_gpu_s=60.0,
        jobs_checkpoint=checkpoint,
        job_gpus=(1,),
        multi_node_jobs=multi_node,
    )
    return FleetView(
        now=now,
        tick=9,
        fleet_id="f",
        pools=_od_and_spot(now, "t1", 1, 3.0, spot_price),
        instances=(node,),
    )


def test_an_on_demand_node_is_given_back_once_spot_hosts_its_jobs_for_much_less() -> None:
    plan = CostAwarePolicy().decide(_od_view(spot_price=0.9))
    assert [(d.instance_id, d.move_jobs) for d in plan.drains] == [("od-1", True)]
    assert "on-demand while spot has room again" in plan.drains[0].reason


def test_an_on_demand_node_stays_while_spot_is_not_much_cheaper_or_the_move_is_unsafe() -> None:
    assert not CostAwarePolicy().decide(_od_view(spot_price=2.0)).drains, "not worth a move"
    assert not CostAwarePolicy().decide(_od_view(spot_price=0.9, checkpoint=False)).drains
    assert not CostAwarePolicy().decide(_od_view(spot_price=0.9, multi_node=True)).drains, (
        "one member of a gang is not moved: the whole job would restart for one node"
    )
    assert not CostAwarePolicy().decide(_od_view(spot_price=0.9, age_s=1800)).drains, (
        "a node bought half an hour ago while spot was short is left to finish its work"
    )
    off = CostAwarePolicy(CostAwareParams(replace_on_demand=False))
    assert not off.decide(_od_view(spot_price=0.9)).drains


def _od_gang_view(
    *, spot_price: float, members_seen: int = 2, spans: int = 2, shared: bool = False
) -> FleetView:
    """A 2-node job on two 8-GPU on-demand nodes at $24/h each, with a spot pool beside."""
    now = 100_000.0
    nodes = tuple(
        CloudNode(
            instance_id=f"od-{i}",
            pool="od",
            state=InstanceState.RUNNING,
            launched_at=now - 7200,
            gpus=8,
            gpus_allocated=8,
            joined=True,
            jobs_checkpoint=True,
            job_gpus=(4, 4) if shared else (8,),
            multi_node_jobs=True,
            gang_jobs=(("train", spans),),
        )
        for i in range(members_seen)
    )
    return FleetView(
        now=now,
        tick=9,
        fleet_id="f",
        pools=_od_and_spot(now, "p3.16xlarge", 8, 24.0, spot_price),
        instances=nodes,
    )


def test_an_on_demand_gang_is_given_back_whole_once_a_spot_gang_hosts_it_for_much_less() -> None:
    plan = CostAwarePolicy().decide(_od_gang_view(spot_price=7.0))
    assert sorted((d.instance_id, d.move_jobs) for d in plan.drains) == [
        ("od-0", True),
        ("od-1", True),
    ]
    assert "on-demand gang of 2" in plan.drains[0].reason


def test_an_on_demand_gang_stays_unless_it_is_seen_whole_alone_and_much_dearer() -> None:
    assert not CostAwarePolicy().decide(_od_gang_view(spot_price=14.0)).drains, (
        "spot at more than half the price is not worth restarting a gang for"
    )
    assert not CostAwarePolicy().decide(_od_gang_view(spot_price=7.0, spans=3)).drains, (
        "a member elsewhere (on spot, or unseen) would be left behind"
    )
    assert not CostAwarePolicy().decide(_od_gang_view(spot_price=7.0, shared=True)).drains, (
        "nodes that also hold other jobs are not freed by moving the gang"
    )
    off = CostAwarePolicy(CostAwareParams(replace_on_demand=False))
    assert not off.decide(_od_gang_view(spot_price=7.0)).drains


def test_a_noticed_node_is_replaced_job_by_job_not_as_one_job_of_all_its_gpus() -> None:
    now = 100_000.0
    eight = Pool(
        name="eight",
        provider="aws",
        region="r",
        instance_type="t8",
        gpus_per_instance=8,
        gpu_model="V100",
        market="spot",  # type: ignore[arg-type]
        boot_seconds=180,
    )
    one = Pool.model_validate({**eight.model_dump(), "name": "one", "gpus_per_instance": 1})
    node = CloudNode(
        instance_id="n8",
        pool="eight",
        state=InstanceState.RUNNING,
        launched_at=0.0,
        gpus=8,
        gpus_allocated=3,
        joined=True,
        job_gpus=(1, 1, 1),
        multi_node_jobs=False,
    )
    view = FleetView(
        now=now,
        tick=3,
        fleet_id="f",
        pools=(
            PoolView(pool=eight, price=PriceQuote(pool="eight", price_per_hour=8.0, as_of=now)),
            PoolView(pool=one, price=PriceQuote(pool="one", price_per_hour=1.0, as_of=now)),
        ),
        instances=(node,),
        notices=(InterruptionNotice(instance_id="n8", pool="eight", received_at=now),),
    )
    plan = CostAwarePolicy().decide(view)
    assert [(launch.pool, launch.count) for launch in plan.launches] == [("one", 3)]


def test_a_node_of_shared_gpus_is_underused_by_what_its_slices_add_up_to() -> None:
    """Slices on six of eight time-sliced GPUs that add up to two GPUs' worth: underused, though
    six GPUs carry a slice; counted by GPUs carrying one, it is not."""
    sliced = NodeUsage(6, 25.0, None, None, gpus_held=2.0)
    clock, controller = _one_job_on_an_eight_gpu_node({"big": 10.0}, sliced)
    (node,) = controller.tick().view.instances
    assert node.underused_since == clock.now()
    whole = NodeUsage(6, 25.0, None, None)
    clock, controller = _one_job_on_an_eight_gpu_node({"big": 10.0}, whole)
    (node,) = controller.tick().view.instances
    assert node.underused_since is None
