"""The simulator end to end on small scenarios written by the test, and on the shipped one."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from autoscaler.model.errors import InputError
from autoscaler.report.build import build_report
from autoscaler.sim import replay
from autoscaler.sim.engine import prepare, simulate
from autoscaler.sim.scenario import LoadedScenario, default_scenario_path, load_scenario

TRACE_HEADER = (
    "job_id,submit_time_s,start_time_s,duration_s,num_gpus,gpu_fraction,num_cpus,"
    "status,queue_delay_s,user_group,priority_class,preemptible,gpu_model,censored,"
    "deadline_s\n"
)


def small_scenario(
    tmp_path: Path,
    *,
    jobs: list[str],
    availability: str = "",
    extra: str = "",
    pools: str | None = None,
    market: str | None = None,
) -> Path:
    (tmp_path / "trace.csv").write_text(TRACE_HEADER + "".join(j + "\n" for j in jobs))
    (tmp_path / "prices.csv").write_text(
        "timestamp,cloud,region,zone,instance_type,price_per_hour,on_demand_price_per_hour\n"
        "2024-01-01T00:00:00Z,aws,r1,,small,1.0,3.0\n"
        "2024-01-01T12:00:00Z,aws,r1,,small,2.0,3.0\n"
    )
    (tmp_path / "avail.csv").write_text(
        "trace_id,kind,nodes_tracked,cloud,zone,instance_type,start_date,gap_seconds,start_tick,"
        "end_tick_exclusive,start_elapsed_s,duration_s,available_instances\n" + availability
    )
    shape = (
        "provider: aws, region: r1, instance_type: small, gpus_per_instance: 1, boot_seconds: 60"
    )
    pools = pools or (
        f"- {{name: spot, market: spot, {shape}}}\n- {{name: od, market: on-demand, {shape}}}\n"
    )
    market = market or "pools: {spot: {interruption_rate_per_hour: 0.0}}"
    text = (
        textwrap.dedent("""\
        name: small
        seed: 1
        start: "2024-01-01T00:00:00Z"
        wait_target_s: 120
        trace: {file: trace.csv, window_start_s: 0, window_end_s: 86400}
        checkpointing:
          - {match: {preemptible: true}, interval_s: 600, duration_s: 10}
        onprem:
          - {name: local, gpus: 1}
        controller:
          fleet_id: small
          tick_seconds: 60
          limits: {scale_down_cooldown_s: 0}
          pools:
        POOLS
        policies:
          - name: cost-aware
          - name: cheapest-spot
          - name: on-demand
        market:
          price_files: [prices.csv]
          availability_file: avail.csv
          MARKET
        """)
        .replace("POOLS", textwrap.indent(pools, "    "))
        .replace("MARKET", market)
        + extra
    )
    path = tmp_path / "scenario.yaml"
    path.write_text(text)
    return path


def job_row(job_id: str, submit: int, duration: int, gpus: int = 1, preemptible: int = 1) -> str:
    cls = "BE" if preemptible else "LS"
    return (
        f"{job_id},{submit},{submit},{duration},{gpus},1.0,4,Succeeded,0,,{cls},{preemptible},,"
        "none,"
    )


def test_one_job_bursts_to_spot_and_pays_the_real_price_for_boot_and_run(tmp_path: Path) -> None:
    path = small_scenario(tmp_path, jobs=[job_row("a", 0, 7200), job_row("b", 0, 3600)])
    result = replay(path, "cost-aware", {"idle_seconds": 0})
    # 'a' takes the on-prem GPU; 'b' waits for a spot node: launched at t=0, joins at 60 s, runs
    # 3600 s plus five 10 s checkpoints, so ends at 3710 s; the node is drained at the next tick
    # (3720 s), billed at 1 $/h from launch.
    assert result.jobs_finished == 2
    assert result.cost_by_pool["spot"] == pytest.approx(3720 / 3600)
    assert sorted(result.waits_s) == [0.0, 60.0]
    assert result.useful_gpu_s == 7200 + 3600


def test_the_price_of_the_moment_is_billed(tmp_path: Path) -> None:
    path = small_scenario(tmp_path, jobs=[job_row("a", 0, 86000), job_row("b", 0, 86000)])
    result = replay(path, "cost-aware")
    # one spot instance from 0 to the end of the day: 12 h at 1 $/h, 12 h at 2 $/h
    assert result.cost_by_pool["spot"] == pytest.approx(12 * 1.0 + 12 * 2.0)


def test_protected_jobs_go_on_demand_and_the_baseline_puts_them_on_spot(tmp_path: Path) -> None:
    jobs = [job_row("onprem", 0, 7200, preemptible=0), job_row("p", 0, 3600, preemptible=0)]
    path = small_scenario(tmp_path, jobs=jobs)
    default = replay(path, "cost-aware", {"idle_seconds": 0})
    baseline = replay(path, "cheapest-spot", {"idle_seconds": 0})
    assert default.cost_by_pool["od"] > 0 and default.cost_by_pool["spot"] == 0
    assert baseline.cost_by_pool["spot"] > 0 and baseline.cost_by_pool["od"] == 0


def test_availability_trace_interrupts_with_the_cloud_notice_lead_and_work_is_requeued(
    tmp_path: Path,
) -> None:
    availability = (
        "t,availability,1-node,aws,z,small,2024-01-01,60,0,10,0,1000,1\n"
        "t,availability,1-node,aws,z,small,2024-01-01,60,10,20,1000,1000,0\n"
        "t,availability,1-node,aws,z,small,2024-01-01,60,20,100,2000,90000,1\n"
    )
    path = small_scenario(
        tmp_path,
        jobs=[job_row("local", 0, 80000), job_row("spot-job", 0, 3000)],
        availability=availability,
        market="pools: {spot: {availability_trace: t}}",
    )
    unaware = replay(path, "cheapest-spot", {"idle_seconds": 0}, checkpoint_aware=False)
    assert unaware.interruptions == 1
    # the job started when the node joined (60 s); capacity vanished at 1000 s and the node was
    # reclaimed 120 s later. It had finished one 600 s + 10 s checkpoint cycle, so it keeps
    # 600 s of work and loses the 450 s after the checkpoint.
    assert unaware.lost_gpu_s == pytest.approx(1120 - 60 - 610)
    assert unaware.requeues == 1
    assert unaware.jobs_finished == 2, "capacity is back at 2000 s and the job resumes"
    assert unaware.useful_gpu_s == pytest.approx(80000 + 3000)

    aware = replay(path, "cheapest-spot", {"idle_seconds": 0})
    # the notice at 1000 s wakes the controller, which asks the job to checkpoint (10 s fits in
    # the 120 s lead) and requeues it the moment the checkpoint is reported: nothing is lost,
    # and the 10 s write is the only price
    assert aware.interruptions == 1
    assert aware.lost_gpu_s == pytest.approx(0.0)
    assert aware.requeues == 1
    assert aware.checkpoint_gpu_s == pytest.approx(unaware.checkpoint_gpu_s + 10)
    assert aware.jobs_finished == 2
    assert aware.useful_gpu_s == pytest.approx(80000 + 3000)


def test_capacity_failure_falls_back_to_on_demand_in_the_same_tick(tmp_path: Path) -> None:
    availability = "t,availability,1-node,aws,z,small,2024-01-01,60,0,100,0,90000,0\n"
    path = small_scenario(
        tmp_path,
        jobs=[job_row("local", 0, 80000), job_row("j", 0, 600)],
        availability=availability,
        market="pools: {spot: {availability_trace: t}}",
    )
    result = replay(path, "cheapest-spot", {"idle_seconds": 0})
    assert result.capacity_failures == 1
    assert result.cost_by_pool["od"] > 0
    assert result.waits_s[1] == 60.0, "on-demand launched at t=0 after the spot failure"


def test_same_seed_same_report(tmp_path: Path) -> None:
    path = small_scenario(
        tmp_path,
        jobs=[job_row(f"j{i}", i * 300, 2000 + 37 * i, gpus=1 + i % 2) for i in range(40)],
        market="pools: {spot: {interruption_rate_per_hour: 0.5}}",
    )
    loaded = load_scenario(path)

    def run(seed: int) -> str:
        changed = LoadedScenario(
            loaded.scenario.model_copy(update={"seed": seed}), loaded.base, loaded.source
        )
        prepared = prepare(changed)
        results = [simulate(prepared, spec) for spec in changed.scenario.policies]
        report = build_report(prepared, results, [])
        data = json.loads(report.model_dump_json())
        for policy in data["policies"]:
            policy.pop("replay_wall_s")
            policy.pop("tick_ms")
        return json.dumps(data, sort_keys=True)

    first = run(7)
    assert first == run(7)
    assert first != run(8), "the interruption model draws from the seed"


def test_bad_trace_row_names_file_line_and_column(tmp_path: Path) -> None:
    path = small_scenario(
        tmp_path, jobs=[job_row("a", 0, 100), "b,10,10,ten,1,1.0,4,x,0,,BE,1,,none,"]
    )
    with pytest.raises(InputError) as caught:
        replay(path, "cost-aware")
    assert (
        str(caught.value) == f"{tmp_path / 'trace.csv'}:3: duration_s: expected a number, got 'ten'"
    )


def test_bad_price_row_names_file_line_and_column(tmp_path: Path) -> None:
    path = small_scenario(tmp_path, jobs=[job_row("a", 0, 100)])
    prices = tmp_path / "prices.csv"
    prices.write_text(prices.read_text() + "yesterday,aws,r1,,small,1.0,3.0\n")
    with pytest.raises(InputError) as caught:
        replay(path, "cost-aware")
    assert str(caught.value).startswith(
        f"{tmp_path / 'prices.csv'}:4: timestamp: expected an ISO-8601"
    )


def test_a_pool_without_a_price_or_interruption_model_is_refused(tmp_path: Path) -> None:
    pools = (
        "- {name: spot, provider: aws, region: r1, instance_type: big, gpus_per_instance: 1,"
        " market: spot}\n"
    )
    path = small_scenario(tmp_path, jobs=[job_row("a", 0, 100)], pools=pools)
    with pytest.raises(InputError, match=r"controller.pools\[0\]: no spot price for aws r1 big"):
        replay(path, "cost-aware")
    pools = pools.replace("big", "small")
    path = small_scenario(tmp_path, jobs=[job_row("a", 0, 100)], pools=pools, market="pools: {}")
    with pytest.raises(InputError, match="has no interruption model"):
        replay(path, "cost-aware")


def test_shipped_scenario_window_and_carried_jobs() -> None:
    prepared = prepare(load_scenario(default_scenario_path()))
    selection = prepared.selection
    assert selection.horizon_s == 25 * 86400
    carried = [j for j in selection.jobs if j.carried]
    assert carried and all(j.submit == 0 for j in carried)
    assert all(0 <= j.submit < selection.horizon_s for j in selection.jobs)
    assert len(selection.jobs) > 4000
