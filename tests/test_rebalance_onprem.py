"""On-prem rebalancing as a controller rule (``autoscaler/tick/rules/rebalance_onprem.py``): what
it asks for whatever the fleet looks like, how the policy is shown the demand while room is being
made, how the guard limits it, how the evacuator carries it out, and the same rule replayed
through the simulator, which no longer moves jobs by itself."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from test_evacuate import CheckpointingFake, running
from test_sim_engine import job_row, small_scenario

from autoscaler.fleet.checkpoints import CheckpointLedger, CheckpointReport
from autoscaler.fleet.memory import Cooldowns
from autoscaler.model import (
    Capacity,
    CloudNode,
    Demand,
    DemandGroup,
    FleetView,
    InstanceState,
    NodeShape,
    OnPremNode,
    Placement,
    Plan,
    Pool,
    PoolView,
)
from autoscaler.model.config import Limits
from autoscaler.sim import replay
from autoscaler.spi.sources import HeldOff, RunningJob
from autoscaler.tick.evacuate import EvacuationSettings, Evacuator, Move
from autoscaler.tick.guard import guard
from autoscaler.tick.intents import MoveJobs, Requests
from autoscaler.tick.rules import rebalance_onprem
from autoscaler.tick.rules.rebalance_onprem import OnPremJobs

REBALANCE = Placement(
    protect_uncheckpointable=True, protect_high_priority=True, rebalance_onprem=True
)
MODELS = ("A100", "H100")


def cloud_pool(name: str, market: str, gpus: int, model: str | None) -> Pool:
    return Pool(
        name=name,
        provider="fake",
        region="r1",
        instance_type=f"t-{gpus}",
        gpus_per_instance=gpus,
        gpu_model=model,
        market=market,  # type: ignore[arg-type]
        boot_seconds=60,
    )


def view_of(
    onprem: Sequence[OnPremNode],
    cloud: Sequence[tuple[Pool, int]],
    groups: Sequence[DemandGroup],
    known: bool = True,
) -> FleetView:
    pools = {p.name: p for p, _ in cloud}
    return FleetView(
        now=10_000.0,
        tick=1,
        fleet_id="f",
        pools=tuple(PoolView(pool=p) for p in pools.values()),
        onprem=tuple(onprem),
        instances=tuple(
            CloudNode(
                instance_id=f"i-{n}",
                pool=p.name,
                state=InstanceState.RUNNING,
                launched_at=0.0,
                gpus=p.gpus_per_instance,
                gpus_allocated=allocated,
                joined=True,
            )
            for n, (p, allocated) in enumerate(cloud)
        ),
        demand=Demand(groups=tuple(groups), known=known),
    )


def group(
    gpus: int,
    oldest: str,
    *,
    checkpoint: bool = False,
    high: bool = False,
    submitted: float = 0.0,
    jobs: int = 1,
    models: tuple[str, ...] = (),
) -> DemandGroup:
    return DemandGroup(
        gpus_per_job=gpus,
        jobs=jobs,
        checkpoint_interval_s=600.0 if checkpoint else None,
        high_priority=high,
        gpu_models=models,
        oldest_submit_time=submitted,
        oldest_jobs=(oldest,) if jobs == 1 else tuple(f"{oldest}-{n}" for n in range(jobs)),
    )


def onprem_job(
    job_id: str, node: str, gpus: int, started: float, *, signal: bool = True, high: bool = False
) -> RunningJob:
    return RunningJob(
        job_id,
        node,
        gpus,
        started,
        600.0,
        20.0,
        "USR1" if signal else None,
        high_priority=high,
    )


# -- the rule ----------------------------------------------------------------------------------


def test_a_protected_job_gets_the_node_whose_youngest_small_jobs_can_move_to_spot_room() -> None:
    spot = cloud_pool("spot", "spot", 4, None)
    nodes = [OnPremNode(name="gpu-a", gpus=4, gpus_allocated=4)]
    jobs = {
        "gpu-a": [
            onprem_job("old", "gpu-a", 2, 100.0),
            onprem_job("young", "gpu-a", 1, 900.0),
            onprem_job("mid", "gpu-a", 1, 500.0),
        ]
    }
    view = view_of(nodes, [(spot, 2)], [group(2, "p1")])
    moves = rebalance_onprem.moves(view, REBALANCE, OnPremJobs(jobs))
    assert [(m.node, [j.id for j in m.jobs], m.for_job) for m in moves] == [
        ("gpu-a", ["young", "mid"], "p1")
    ]
    # the policy is shown the demand without the job room is being made for
    shown = rebalance_onprem.view_for_policy(view, OnPremJobs(jobs), moves)
    assert shown.demand.groups == () and view.demand.groups != ()


def test_nothing_moves_without_cloud_room_when_the_job_fits_already_or_for_a_job_as_big() -> None:
    spot = cloud_pool("spot", "spot", 1, None)
    busy = [OnPremNode(name="gpu-a", gpus=2, gpus_allocated=2)]
    jobs = {"gpu-a": [onprem_job("a", "gpu-a", 1, 1.0), onprem_job("b", "gpu-a", 1, 2.0)]}
    on = OnPremJobs(jobs)
    assert rebalance_onprem.moves(view_of(busy, [(spot, 1)], [group(2, "p")]), REBALANCE, on) == []
    free = [*busy, OnPremNode(name="gpu-b", gpus=2, gpus_allocated=0)]
    assert rebalance_onprem.moves(view_of(free, [(spot, 0)], [group(2, "p")]), REBALANCE, on) == []
    # a spot-safe single-GPU job never displaces others: it may go to spot itself
    one = [group(1, "p", checkpoint=True)]
    assert rebalance_onprem.moves(view_of(busy, [(spot, 0)], one), REBALANCE, on) == []
    off = REBALANCE.model_copy(update={"rebalance_onprem": False})
    assert rebalance_onprem.moves(view_of(busy, [(spot, 0)], [group(2, "p")]), off, on) == []


def test_cloud_room_found_for_moved_jobs_is_held_from_the_policy_and_from_later_moves() -> None:
    """The spot room a move counts on is the moved job's until it has moved: the policy sees
    it as taken (it would otherwise plan other pending work onto it and buy too little), and a
    later tick's move does not count on it again while the first is still under way."""
    spot = cloud_pool("spot", "spot", 2, None)
    nodes = [
        OnPremNode(name="gpu-a", gpus=2, gpus_allocated=2),
        OnPremNode(name="gpu-b", gpus=2, gpus_allocated=2),
    ]
    jobs = {
        "gpu-a": [onprem_job("a1", "gpu-a", 1, 10.0), onprem_job("a2", "gpu-a", 1, 20.0)],
        "gpu-b": [onprem_job("b1", "gpu-b", 1, 30.0), onprem_job("b2", "gpu-b", 1, 40.0)],
    }
    waiting_work = group(1, "w", checkpoint=True, submitted=50.0)
    view = view_of(nodes, [(spot, 0)], [group(2, "p", submitted=1.0), waiting_work])
    (move,) = rebalance_onprem.moves(view, REBALANCE, OnPremJobs(jobs))
    assert sorted(move.room) == [("a1", "i-0", 1), ("a2", "i-0", 1)]
    shown = rebalance_onprem.view_for_policy(view, OnPremJobs(jobs), [move])
    assert [n.gpus_allocated for n in shown.instances] == [2], "the room is taken"
    assert shown.demand.groups == (waiting_work,)
    # the next tick, the move is still waiting on its checkpoints: its room stays held
    under_way = OnPremJobs(
        jobs,
        moving=frozenset({"a1", "a2"}),
        making_room_for=frozenset({"p"}),
        reserved={"i-0": 2},
    )
    second = view_of(nodes, [(spot, 0)], [group(2, "p", submitted=1.0), group(2, "q")])
    assert rebalance_onprem.moves(second, REBALANCE, under_way) == [], "no room left for q"
    shown = rebalance_onprem.view_for_policy(second, under_way, [])
    assert [n.gpus_allocated for n in shown.instances] == [2]


def test_moves_under_way_and_holds_are_not_asked_again() -> None:
    spot = cloud_pool("spot", "spot", 4, None)
    nodes = [OnPremNode(name="gpu-a", gpus=1, gpus_allocated=1)]
    jobs = {"gpu-a": [onprem_job("a", "gpu-a", 1, 1.0)]}
    view = view_of(nodes, [(spot, 0)], [group(1, "p")])
    waiting = OnPremJobs(jobs, moving=frozenset({"a"}), making_room_for=frozenset({"p"}))
    assert rebalance_onprem.moves(view, REBALANCE, waiting) == []
    held = OnPremJobs(jobs, held=(HeldOff("x", "gpu-a", "p", 5.0),))
    assert rebalance_onprem.moves(view, REBALANCE, held) == []
    shown = rebalance_onprem.view_for_policy(view, held, [])
    assert shown.demand.groups == ()


@dataclass
class Fleet:
    view: FleetView
    onprem: OnPremJobs
    jobs_by_id: dict[str, RunningJob] = field(default_factory=dict)


@st.composite
def fleets(draw: st.DrawFn) -> Fleet:
    nodes: list[OnPremNode] = []
    jobs: dict[str, list[RunningJob]] = {}
    count = 0
    for n in range(draw(st.integers(1, 4))):
        name = f"gpu-{n}"
        gpus = draw(st.sampled_from([1, 2, 4, 8]))
        used = 0
        placed = []
        for _ in range(draw(st.integers(0, 4))):
            size = draw(st.sampled_from([1, 1, 2, 4]))
            if used + size > gpus:
                break
            used += size
            count += 1
            placed.append(
                RunningJob(
                    f"r{count}",
                    name,
                    size,
                    draw(st.floats(0, 5000)),
                    draw(st.none() | st.just(600.0)),
                    20.0,
                    draw(st.none() | st.just("USR1")),
                    draw(st.sampled_from([1, 1, 2])),
                    draw(st.booleans()),
                    draw(st.sampled_from([(), ("A100",), ("H100",)])),
                )
            )
        jobs[name] = placed
        nodes.append(
            OnPremNode(
                name=name,
                gpus=gpus,
                gpu_model=draw(st.sampled_from(MODELS)),
                gpus_allocated=used,
                schedulable=draw(st.booleans()) or True,
            )
        )
    cloud = []
    for c in range(draw(st.integers(0, 4))):
        gpus = draw(st.sampled_from([1, 2, 4]))
        market = draw(st.sampled_from(["spot", "on-demand"]))
        model = draw(st.sampled_from([None, *MODELS]))
        cloud.append((cloud_pool(f"{market}-{c}", market, gpus, model), draw(st.integers(0, gpus))))
    groups = [
        group(
            draw(st.sampled_from([1, 2, 4, 8])),
            f"p{g}",
            checkpoint=draw(st.booleans()),
            high=draw(st.booleans()),
            submitted=draw(st.floats(0, 5000)),
            jobs=draw(st.integers(1, 3)),
            models=draw(st.sampled_from([(), ("A100",)])),
        )
        for g in range(draw(st.integers(0, 4)))
    ]
    held = tuple(
        HeldOff(f"h{i}", draw(st.sampled_from([n.name for n in nodes])), f"p{i}", 1.0)
        for i in range(draw(st.integers(0, 1)))
    )
    onprem = OnPremJobs(jobs, held)
    every = {j.id: j for js in jobs.values() for j in js}
    return Fleet(view_of(nodes, cloud, groups), onprem, every)


@given(fleets())
def test_every_move_is_one_the_placement_allows_and_the_free_cloud_room_holds(fleet: Fleet) -> None:
    view, onprem = fleet.view, fleet.onprem
    moves = rebalance_onprem.moves(view, REBALANCE, onprem)
    groups = {job: g for g in view.demand.groups for job in g.oldest_jobs}
    nodes = {n.name: n for n in view.onprem}
    served = onprem.served
    assert len({m.node for m in moves}) == len(moves), "one move per node"
    assert len({m.for_job for m in moves}) == len(moves), "one move per pending job"
    moved = [j.id for m in moves for j in m.jobs]
    assert len(set(moved)) == len(moved), "no job moved twice"
    for move in moves:
        wanted = groups[move.for_job]
        node = nodes[move.node]
        assert move.for_job not in served and move.node not in {h.node for h in onprem.held}
        assert REBALANCE.may_displace(
            wanted.gpus_per_job, wanted.checkpoint_interval_s is not None, wanted.high_priority
        )
        assert wanted.shape.accepts(node.gpus, node.gpu_model, node.gpu_memory_gib)
        assert node.gpus_free < wanted.gpus_per_job
        assert node.gpus_free + sum(j.gpus for j in move.jobs) >= wanted.gpus_per_job
        protected = not REBALANCE.allows_spot(
            wanted.checkpoint_interval_s is not None, wanted.high_priority
        )
        for job in move.jobs:
            assert job in onprem.jobs[move.node] and job.nodes == 1
            assert job.checkpoint_signal is not None
            assert REBALANCE.movable(
                job.gpus,
                job.checkpoint_interval_s is not None,
                job.high_priority,
                wanted.gpus_per_job,
                protected,
            )
    # every job moved this tick finds free cloud room of a kind its placement allows, at once
    pools = {p.pool.name: p.pool for p in view.pools}
    room = {
        n.instance_id: [n.gpus - n.gpus_allocated, pools[n.pool]]
        for n in view.instances
        if n.gpus > n.gpus_allocated
    }
    for job in (j for m in moves for j in m.jobs):
        shape = NodeShape(
            gpus=job.gpus, gpu_models=job.gpu_models, min_gpu_memory_gib=job.min_gpu_memory_gib
        )
        kinds = REBALANCE.tiers(job.checkpoint_interval_s is not None, job.high_priority)
        fits = [
            (free, name)
            for name, (free, pool) in room.items()
            if (Capacity.SPOT if pool.is_spot else Capacity.ON_DEMAND) in kinds  # type: ignore[attr-defined]
            and free >= job.gpus  # type: ignore[operator]
            and shape.accepts(pool.gpus_per_instance, pool.gpu_model, pool.gpu_memory_gib)  # type: ignore[attr-defined]
        ]
        assert fits, f"job {job.id} has no cloud room to restart on"
        _, name = min(fits)
        room[name][0] -= job.gpus  # type: ignore[operator]
    shown = rebalance_onprem.view_for_policy(view, onprem, moves)
    dropped = served | {m.for_job for m in moves}
    expected = sum(g.gpus for g in view.demand.groups) - sum(
        g.gpus_per_job for g in view.demand.groups for job in g.oldest_jobs if job in dropped
    )
    assert sum(g.gpus for g in shown.demand.groups) == expected


# -- the guard ---------------------------------------------------------------------------------


def move(node: str, jobs: int, for_job: str) -> MoveJobs:
    return MoveJobs(
        node, tuple(onprem_job(f"{node}-{i}", node, 1, 1.0) for i in range(jobs)), for_job, "t"
    )


def test_the_guard_admits_whole_moves_up_to_the_move_rate_and_none_while_demand_is_unknown() -> (
    None
):
    requests = Requests(moves=[move("a", 2, "p1"), move("b", 2, "p2"), move("c", 1, "p3")])
    limits = Limits(max_job_moves_per_tick=3)
    view = view_of([], [], [])
    granted = guard(Plan(), requests, view, limits, Cooldowns())
    assert [m.for_job for m in granted.moves] == ["p1", "p3"]
    assert [c.rule for c in granted.clamps] == ["job_move_rate"]
    unknown = view_of([], [], [], known=False)
    held = guard(Plan(), requests, unknown, limits, Cooldowns())
    assert held.moves == () and [c.rule for c in held.clamps] == ["demand_unknown"]


# -- the evacuator -----------------------------------------------------------------------------


@dataclass
class MovingFake(CheckpointingFake):
    moved: list[tuple[str, str, str]] = field(default_factory=list)
    bound: list[tuple[str, tuple[str, ...]]] = field(default_factory=list)

    def move_off(self, job_id: str, node: str, for_job: str) -> None:
        self.moved.append((job_id, node, for_job))

    def bind(self, for_job: str, nodes: Sequence[str]) -> None:
        self.bound.append((for_job, tuple(nodes)))

    def held_off(self) -> list[HeldOff]:
        return []


def test_a_job_moved_for_room_checkpoints_first_and_is_moved_off_when_it_reports() -> None:
    fake = MovingFake()
    ledger = CheckpointLedger()
    evacuator = Evacuator(fake, ledger, EvacuationSettings(checkpoint_margin_s=10.0))
    saving = running("saving", "gpu-a", gpus=1, started_at=0.0)
    silent = running("silent", "gpu-a", gpus=1, started_at=0.0)
    fake.failing_signal.add("gone")
    gone = running("gone", "gpu-a", gpus=1, started_at=0.0)
    room = {"saving": ("i-0", 1), "silent": ("i-1", 1), "gone": ("i-1", 1)}
    asked = evacuator.make_room("gpu-a", [saving, silent, gone], "p", 1_000.0, room)
    assert sorted((m.job_id, m.move) for m in asked) == [
        ("gone", Move.FAILED),
        ("saving", Move.CHECKPOINT_ASKED),
        ("silent", Move.CHECKPOINT_ASKED),
    ]
    assert evacuator.making_room_for() == {"p"} and evacuator.waiting() == {"saving", "silent"}
    # the cloud room each waiting job will move to is held for it until it has moved
    assert evacuator.reserved() == {"i-0": 1, "i-1": 1}
    ledger.record(CheckpointReport("saving", 1_015.0, 15.0, "gpu-a"))
    done = evacuator.progress(1_015.0)
    assert evacuator.reserved() == {"i-1": 1}
    assert [(m.job_id, m.move) for m in done] == [("saving", Move.MOVED_OFF)]
    assert done[0].lost_gpu_s == 0.0 and fake.moved == [("saving", "gpu-a", "p")]
    # no report: moved once its expected checkpoint (20 s) and the margin (10 s) are over
    assert evacuator.progress(1_029.0) == []
    late = evacuator.progress(1_030.0)
    assert [(m.job_id, m.move) for m in late] == [("silent", Move.MOVED_OFF)]
    assert fake.moved[-1] == ("silent", "gpu-a", "p") and fake.requeued == []
    assert evacuator.making_room_for() == set() and evacuator.reserved() == {}
    # rebalancing keeps no promise: its pending job is not bound to the node freed for it
    assert fake.bound == []
    evacuator.close()


def test_a_move_with_a_bound_binds_the_job_it_makes_room_for() -> None:
    """Reclaim and preemption (a move with ``by``) bind their owner job to the node freed for
    it when the move is decided, so that another job made room for in the same tick cannot
    take it."""
    fake = MovingFake()
    ledger = CheckpointLedger()
    evacuator = Evacuator(fake, ledger, EvacuationSettings(checkpoint_margin_s=10.0))
    lender = running("lender", "gpu-a", gpus=1, started_at=0.0)
    evacuator.make_room("gpu-a", [lender], "owner", 1_000.0, by=2_000.0)
    assert fake.bound == [("owner", ("gpu-a",))] and fake.moved == []
    ledger.record(CheckpointReport("lender", 1_015.0, 15.0, "gpu-a"))
    evacuator.progress(1_015.0)
    assert fake.moved == [("lender", "gpu-a", "owner")] and len(fake.bound) == 1
    evacuator.close()


# -- through the controller, in the simulator --------------------------------------------------


@pytest.mark.parametrize("rebalance", [True, False])
def test_replayed_a_protected_job_takes_onprem_from_a_spot_safe_one_that_moves_without_loss(
    tmp_path: Path, rebalance: bool
) -> None:
    """One on-prem GPU runs a long spot-safe job; a second spot-safe job bursts to spot and ends,
    leaving the spot node idle; then a job that must stay off spot arrives. With rebalancing the
    long job checkpoints (10 s) and moves to the idle spot node, the protected job starts
    on-prem after that checkpoint, and no on-demand node is bought for it; without, it waits for
    an on-demand node."""
    jobs = [
        job_row("mobile", 0, 20000),
        job_row("other", 0, 1200),
        job_row("protected", 1500, 3600, preemptible=0),
    ]
    path = small_scenario(tmp_path, jobs=jobs)
    result = replay(path, "cost-aware", {"idle_seconds": 1200, "rebalance_onprem": rebalance})
    waits = dict(zip(result.wait_job_ids, result.waits_s, strict=True))
    assert result.jobs_finished == 3
    if rebalance:
        assert result.migrations == 1 and result.requeues == 0
        assert waits["protected"] == pytest.approx(10.0)
        assert result.cost_by_pool["od"] == 0.0
        assert result.lost_gpu_s == 0.0
    else:
        assert result.migrations == 0
        assert waits["protected"] == pytest.approx(60.0)
        assert result.cost_by_pool["od"] > 0.0


def test_with_teams_another_teams_job_is_moved_only_from_what_it_holds_beyond_its_guarantee() -> (
    None
):
    """Rebalancing moves a spot-safe job to the cloud for a protected one; with teams it takes
    another team's job only while that team keeps its guarantee on-prem (the GPUs are its own,
    reclaim would take them back: the three-team replay moved a job reclaim had just started
    for its team, and reclaim took the node back). A team's own jobs may still make room for
    its own."""
    from autoscaler.model.teams import TeamsConfig, TeamSpec

    spot = cloud_pool("spot", "spot", 4, None)
    nodes = [OnPremNode(name="gpu-a", gpus=2, gpus_allocated=2)]

    def team_job(job_id: str, team: str, started: float) -> RunningJob:
        return RunningJob(job_id, "gpu-a", 1, started, 600.0, 20.0, "USR1", team=team)

    jobs = {"gpu-a": [team_job("r1", "research", 10.0), team_job("r2", "research", 20.0)]}
    protected = group(2, "s1").model_copy(update={"team": "serving"})
    view = view_of(nodes, [(spot, 0)], [protected])
    within = TeamsConfig(
        teams={"research": TeamSpec(guaranteed_gpus=2), "serving": TeamSpec(guaranteed_gpus=2)}
    )
    assert rebalance_onprem.moves(view, REBALANCE, OnPremJobs(jobs), within) == []
    beyond = TeamsConfig(
        teams={"research": TeamSpec(guaranteed_gpus=0), "serving": TeamSpec(guaranteed_gpus=2)}
    )
    (move,) = rebalance_onprem.moves(view, REBALANCE, OnPremJobs(jobs), beyond)
    assert sorted(j.id for j in move.jobs) == ["r1", "r2"]
    # research lends one GPU only: one job may go, which frees too little for a 2-GPU job
    one_spare = TeamsConfig(
        teams={"research": TeamSpec(guaranteed_gpus=1), "serving": TeamSpec(guaranteed_gpus=3)}
    )
    assert rebalance_onprem.moves(view, REBALANCE, OnPremJobs(jobs), one_spare) == []
    # its own team's job makes room for itself whatever the guarantee
    own = group(2, "r9").model_copy(update={"team": "research"})
    (move,) = rebalance_onprem.moves(
        view_of(nodes, [(spot, 0)], [own]), REBALANCE, OnPremJobs(jobs), within
    )
    assert move.for_job == "r9"
    # without teams any team's job may move, as before
    assert len(rebalance_onprem.moves(view, REBALANCE, OnPremJobs(jobs))) == 1
