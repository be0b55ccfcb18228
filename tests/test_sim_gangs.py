"""Multi-node jobs and GPU models in the simulator: a gang starts on all its nodes at once or not
at all, one member taken away stops and requeues the whole job, only the lost member is
replaced, and no job runs on a GPU model it did not ask for."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_sim_engine import TRACE_HEADER, small_scenario

from autoscaler.cli import main
from autoscaler.model import (
    Capacity,
    CloudNode,
    Demand,
    FleetView,
    InstanceState,
    InterruptionNotice,
    Pool,
    PoolView,
    PriceQuote,
)
from autoscaler.model.clock import ManualClock
from autoscaler.model.errors import InputError
from autoscaler.sim import replay
from autoscaler.sim.engine import TickSeen, prepare, simulate
from autoscaler.sim.hostable import check_hostable
from autoscaler.sim.scenario import PolicySpec, load_scenario
from autoscaler.sim.scheduler import SimJob, SimScheduler
from autoscaler.sim.trace import TraceJob
from policies.cost_aware import CostAwarePolicy


def trace_job(
    job_id: str, gpus: int, nodes: int = 1, models: tuple[str, ...] = (), duration: float = 600
) -> TraceJob:
    return TraceJob(
        job_id, 0.0, duration, gpus, 1.0, 300.0, 10.0, False, nodes=nodes, gpu_models=models
    )


def scheduler() -> tuple[SimScheduler, list[tuple[SimJob, float]]]:
    started: list[tuple[SimJob, float]] = []
    sim = SimScheduler(ManualClock(0.0), 5.0, lambda job, end: started.append((job, end)))
    return sim, started


def test_a_gang_starts_on_as_many_distinct_nodes_at_once_or_waits() -> None:
    sim, started = scheduler()
    sim.add_node("a", 8, Capacity.ONPREM, None, 0.0)
    sim.submit(trace_job("g", 16, nodes=2), 0.0)
    sim.schedule(0.0)
    assert not started, "one 8-GPU node cannot hold a job of two 8-GPU nodes"
    (group,) = sim.read(0.0)
    assert (group.gpus_per_job, group.nodes, group.gpus_per_node) == (16, 2, 8)
    sim.add_node("b", 8, Capacity.ONPREM, None, 0.0)
    sim.schedule(0.0)
    ((job, _),) = started
    assert sorted(n.name for n in job.members) == ["a", "b"]
    assert sim.nodes["a"].free == 0 and sim.nodes["b"].free == 0
    assert sim.busy_gpus[Capacity.ONPREM] == 16
    assert {r.gpus for r in sim.running_jobs("a")} == {8}, "each node reports its own share"


def test_losing_one_member_requeues_the_whole_job_and_frees_the_other() -> None:
    sim, started = scheduler()
    for name in ("a", "b", "c"):
        sim.add_node(name, 8, Capacity.SPOT, "p", 0.0)
    sim.submit(trace_job("g", 16, nodes=2, duration=3600), 0.0)
    sim.schedule(0.0)
    ((job, _),) = started
    lost = job.members[0].name
    kept = job.members[1].name
    assert sim.remove_node(lost, 700.0) == 1
    assert job.node is None and job.interruptions == 1
    assert sim.nodes[kept].free == 8, "the surviving member is free again"
    assert sim.pending == 1 and sim.busy_gpus[Capacity.SPOT] == 0
    # 700 s in, the 300 s checkpoints (10 s each) saved 600 s; both nodes' GPUs lost the rest
    assert job.progress == pytest.approx(600.0)
    assert job.lost_gpu_s == pytest.approx(16 * (700 - 620))
    sim.schedule(700.0)
    assert len(started) == 2 and {n.name for n in started[1][0].members} == {kept, "c"}


def test_a_job_runs_only_on_a_gpu_model_it_accepts() -> None:
    sim, started = scheduler()
    sim.add_node("v100", 8, Capacity.ONPREM, None, 0.0, "V100")
    sim.submit(trace_job("pinned", 1, models=("a100",)), 0.0)
    sim.schedule(0.0)
    assert not started, "free V100s do not run a job that asks for an A100"
    sim.add_node("a100", 8, Capacity.SPOT, "p", 0.0, "A100-40GB")
    sim.schedule(0.0)
    assert [j.node.name for j, _ in started if j.node] == ["a100"]


def _pool(name: str, gpus: int) -> Pool:
    return Pool(
        name=name,
        provider="aws",
        region="r",
        instance_type=f"t{gpus}",
        gpus_per_instance=gpus,
        market="spot",  # type: ignore[arg-type]
        boot_seconds=60,
    )


def test_only_the_lost_member_of_a_gang_is_replaced_on_a_notice() -> None:
    now = 10_000.0
    nodes = tuple(
        CloudNode(
            instance_id=name,
            pool="eight",
            state=InstanceState.RUNNING,
            launched_at=0.0,
            gpus=8,
            gpus_allocated=8,
            joined=True,
        )
        for name in ("m1", "m2")
    )
    view = FleetView(
        now=now,
        tick=3,
        fleet_id="f",
        pools=(
            PoolView(
                pool=_pool("eight", 8),
                price=PriceQuote(pool="eight", price_per_hour=8.0, as_of=now),
            ),
        ),
        instances=nodes,
        demand=Demand(),
        notices=(
            InterruptionNotice(instance_id="m1", pool="eight", received_at=now, deadline=now + 120),
        ),
    )
    plan = CostAwarePolicy().decide(view)
    assert [(launch.pool, launch.count, launch.gang_size) for launch in plan.launches] == [
        ("eight", 1, 1)
    ]


def test_the_replay_buys_a_gang_for_a_job_larger_than_any_node(tmp_path: Path) -> None:
    pools = (
        "- {name: eight, market: spot, provider: aws, region: r1, instance_type: small, "
        "gpus_per_instance: 8, boot_seconds: 60}\n"
        "- {name: one, market: spot, provider: aws, region: r1, instance_type: small, "
        "gpus_per_instance: 1, boot_seconds: 60}\n"
    )
    row = "big,0,0,1800,16,1.0,4,Succeeded,0,,BE,1,,none,"
    path = small_scenario(
        tmp_path,
        jobs=[row],
        pools=pools,
        market="pools: {eight: {interruption_rate_per_hour: 0.0}, "
        "one: {interruption_rate_per_hour: 0.0}}",
    )
    prepared = prepare(load_scenario(path))
    (job,) = prepared.selection.jobs
    assert (job.gpus, job.nodes) == (16, 2), "16 GPUs on 8-GPU nodes: a gang of two"
    result = replay(path, "cost-aware", {"idle_seconds": 0})
    assert result.jobs_finished == 1
    assert result.instance_hours_by_pool["one"] == 0, "1-GPU instances never host an 8-GPU node"
    assert result.launched == 2


def test_the_trace_may_state_nodes_and_models_and_bad_ones_are_one_clear_error(
    tmp_path: Path,
) -> None:
    header = TRACE_HEADER.strip() + ",num_nodes\n"
    rows = [
        "g,0,0,600,16,1.0,4,Succeeded,0,,BE,1,a100|h100,none,,4",
        "s,0,0,600,1,1.0,4,Succeeded,0,,BE,1,,none,,",
    ]
    path = small_scenario(tmp_path, jobs=[])
    (tmp_path / "trace.csv").write_text(header + "\n".join(rows) + "\n")
    jobs = {j.id: j for j in prepare(load_scenario(path)).selection.jobs}
    assert (jobs["g"].nodes, jobs["g"].gpus_per_node, jobs["g"].gpu_models) == (
        4,
        4,
        ("a100", "h100"),
    )
    assert (jobs["s"].nodes, jobs["s"].gpu_models) == (1, ())
    (tmp_path / "trace.csv").write_text(header + rows[0][:-1] + "3\n")
    with pytest.raises(InputError) as caught:
        prepare(load_scenario(path))
    assert "num_nodes" in str(caught.value) and "trace.csv:2" in str(caught.value)


def test_validate_names_jobs_no_configured_capacity_can_host(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = [
        "pinned,0,0,600,1,1.0,4,Succeeded,0,,BE,1,h100,none,",
        "fine,0,0,600,1,1.0,4,Succeeded,0,,BE,1,,none,",
    ]
    path = small_scenario(tmp_path, jobs=rows)
    check = check_hostable(prepare(load_scenario(path)))
    assert check.jobs == 1 and "job pinned" in check.examples[0]
    assert main(["validate", str(path)]) == 2
    # the small scenario's pools name no GPU model: each is warned of, then the one error
    err = [line for line in capsys.readouterr().err.strip().splitlines() if "warning" not in line]
    assert len(err) == 1 and "1 job(s)" in err[0] and "h100" in err[0]


def test_the_view_names_the_gang_on_each_of_its_nodes(tmp_path: Path) -> None:
    # A 16-GPU job that cannot checkpoint runs on two on-demand 8-GPU nodes (spot exists, so
    # what runs on on-demand nodes is read every tick: a policy may replace them by spot).
    shape = (
        "provider: aws, region: r1, instance_type: small, gpus_per_instance: 8, boot_seconds: 60"
    )
    pools = f"- {{name: spot, market: spot, {shape}}}\n- {{name: od, market: on-demand, {shape}}}\n"
    row = "big,0,0,7200,16,1.0,4,Succeeded,0,,LS,0,,none,"
    path = small_scenario(tmp_path, jobs=[row], pools=pools)
    seen: set[tuple[str, str, tuple[tuple[str, int], ...] | None]] = set()

    def on_tick(tick: TickSeen) -> None:
        for node in tick.report.view.instances:
            if node.state is InstanceState.RUNNING and node.gpus_allocated:
                seen.add((node.instance_id, node.pool, node.gang_jobs))

    simulate(prepare(load_scenario(path)), PolicySpec(name="cost-aware"), on_tick=on_tick)
    assert len(seen) == 2, "both members, each seen the same way every tick"
    assert {pool for _, pool, _ in seen} == {"od"}
    assert len({gangs for _, _, gangs in seen}) == 1
    ((_, spans),) = next(iter(seen))[2] or ()
    assert spans == 2
