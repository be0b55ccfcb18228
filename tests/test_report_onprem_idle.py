"""On-prem GPUs allocated but idle in the dry run: the simulated scheduler counts, exactly between
job events, the GPU-seconds its on-prem nodes hold for jobs while every job on the node is below
the idle threshold by its trace utilisation, and the report shows them per policy in JSON,
Markdown and HTML."""

from __future__ import annotations

import heapq
import itertools
import json
import textwrap
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autoscaler.model import Capacity
from autoscaler.model.clock import ManualClock
from autoscaler.report.build import build_report
from autoscaler.report.render import render_html, render_markdown
from autoscaler.sim.engine import TickSeen, prepare, simulate
from autoscaler.sim.scenario import load_scenario
from autoscaler.sim.scheduler import SimJob, SimScheduler
from autoscaler.sim.trace import TraceJob

IDLE_PCT = 5.0


def trace_job(
    job_id: str, gpus: int, duration: float, submit: float, utilisation: float
) -> TraceJob:
    return TraceJob(job_id, submit, duration, gpus, utilisation, None, 0.0, False)


class World:
    """Drives the scheduler as the engine does, and integrates the allocated-idle GPU-seconds
    on its own, from what runs where between events (the brute-force reading)."""

    def __init__(self, nodes: dict[str, int]) -> None:
        self.clock = ManualClock(0.0)
        self.events: list[tuple[float, int, SimJob, int]] = []
        self.order = itertools.count()
        self.scheduler = SimScheduler(self.clock, IDLE_PCT, self._started)
        for name, gpus in nodes.items():
            self.scheduler.add_node(name, gpus, Capacity.ONPREM, None, 0.0)
        self.expected = 0.0
        self.last = 0.0

    def _started(self, job: SimJob, end: float) -> None:
        heapq.heappush(self.events, (end, next(self.order), job, job.run_id))

    def _integrate(self, now: float) -> None:
        for node in self.scheduler.nodes.values():
            jobs = list(node.jobs.values())
            if jobs and all(j.trace.utilisation * 100 < IDLE_PCT for j in jobs):
                self.expected += sum(j.gpus_per_node for j in jobs) * (now - self.last)
        self.last = now

    def at(self, now: float) -> None:
        while self.events and self.events[0][0] <= now:
            when, _, job, run_id = heapq.heappop(self.events)
            self._integrate(when)
            self.clock.set(when)
            self.scheduler.finish(job, run_id, when)
            self.scheduler.schedule(when)
        self._integrate(now)
        self.clock.set(now)

    def submit(self, job: TraceJob) -> None:
        self.at(job.submit)
        self.scheduler.submit(job, job.submit)
        self.scheduler.schedule(job.submit)

    def close(self, horizon: float) -> None:
        self.at(horizon)
        self.scheduler.close(horizon)


def test_a_node_is_idle_only_while_every_job_on_it_is() -> None:
    world = World({"n": 8})
    world.submit(trace_job("quiet", 2, 100, 0, 0.01))
    world.submit(trace_job("busy", 4, 30, 50, 0.9))
    world.close(200)
    # 2 GPUs idle-held from 0 to 50 and from 80 to 100; the busy job makes the node busy
    assert world.scheduler.accounting.onprem_idle_gpu_s == pytest.approx(2 * 50 + 2 * 20)
    assert world.expected == pytest.approx(140)


def test_jobs_still_running_at_the_end_are_counted_up_to_it() -> None:
    world = World({"n": 4})
    world.submit(trace_job("quiet", 3, 10_000, 0, 0.0))
    world.close(600)
    assert world.scheduler.accounting.onprem_idle_gpu_s == pytest.approx(3 * 600)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(1, 4),
            st.floats(1, 500),
            st.floats(0, 400),
            st.sampled_from([0.0, 0.02, 0.049, 0.05, 0.5, 1.0]),
        ),
        min_size=1,
        max_size=25,
    )
)
def test_counted_idle_gpu_seconds_are_the_integral_of_allocation_on_idle_nodes(
    jobs: list[tuple[int, float, float, float]],
) -> None:
    world = World({"a": 4, "b": 8})
    for index, (gpus, duration, submit, utilisation) in enumerate(sorted(jobs, key=lambda j: j[2])):
        world.submit(trace_job(f"j{index}", gpus, duration, submit, utilisation))
    world.close(1000)
    counted = world.scheduler.accounting.onprem_idle_gpu_s
    assert counted == pytest.approx(world.expected, rel=1e-9, abs=1e-6)
    onprem = world.scheduler.accounting.allocated_gpu_s[Capacity.ONPREM]
    assert 0.0 <= counted <= onprem + 1e-6, "idle-held GPUs are a part of those allocated"


# -- the report --------------------------------------------------------------------------------

TRACE_HEADER = (
    "job_id,submit_time_s,start_time_s,duration_s,num_gpus,gpu_fraction,num_cpus,"
    "status,queue_delay_s,user_group,priority_class,preemptible,gpu_model,censored,"
    "deadline_s\n"
)


def scenario(tmp_path: Path) -> Path:
    rows = [
        # 2 GPUs held by a job that uses 2 % of them, for an hour
        "quiet,0,0,3600,2,0.02,4,Succeeded,0,,BE,1,,none,",
        # a busy job on the same node for 10 minutes of that hour
        "busy,1800,1800,600,1,1.0,4,Succeeded,0,,BE,1,,none,",
    ]
    (tmp_path / "trace.csv").write_text(TRACE_HEADER + "".join(r + "\n" for r in rows))
    (tmp_path / "prices.csv").write_text(
        "timestamp,cloud,region,zone,instance_type,price_per_hour,on_demand_price_per_hour\n"
        "2024-01-01T00:00:00Z,aws,r1,,small,1.0,3.0\n"
    )
    text = textwrap.dedent("""\
        name: idle-onprem
        seed: 1
        start: "2024-01-01T00:00:00Z"
        idle_util_pct: 5
        trace: {file: trace.csv, window_start_s: 0, window_end_s: 7200}
        onprem:
          - {name: local, gpus: 4}
        controller:
          fleet_id: idle
          tick_seconds: 60
          pools:
            - {name: spot, market: spot, provider: aws, region: r1, instance_type: small,
               gpus_per_instance: 1, boot_seconds: 60}
        policies:
          - name: cost-aware
        market:
          price_files: [prices.csv]
          pools: {spot: {interruption_rate_per_hour: 0.0}}
        """)
    path = tmp_path / "scenario.yaml"
    path.write_text(text)
    return path


def test_the_report_shows_onprem_gpu_hours_allocated_but_idle_per_policy(tmp_path: Path) -> None:
    prepared = prepare(load_scenario(scenario(tmp_path)))
    seen: list[SimScheduler] = []

    def on_tick(tick: TickSeen) -> None:
        nodes = tick.controller.signals.nodes
        if not seen and isinstance(nodes, SimScheduler):
            seen.append(nodes)

    result = simulate(prepared, prepared.loaded.scenario.policies[0], on_tick=on_tick)
    (scheduler,) = seen
    idle_s = scheduler.accounting.onprem_idle_gpu_s
    assert idle_s == pytest.approx(2 * 1800 + 2 * 1200), "the busy job's 10 minutes are not idle"
    assert result.onprem_idle_gpu_s == idle_s, "simulate hands the scheduler's figure on"
    report = build_report(prepared, [result], [])
    (policy,) = report.policies
    assert policy.gpu_hours.onprem_allocated_idle == pytest.approx(6000 / 3600, abs=0.01)
    raw = json.loads(report.model_dump_json())
    assert raw["policies"][0]["gpu_hours"]["onprem_allocated_idle"] == pytest.approx(1.67)
    markdown = render_markdown(report)
    assert "On-prem allocated idle" in markdown and "| 1.7 |" in markdown
    assert any("read idle for 1.7 GPU-h" in line for line in report.findings)
    assert any("5 % idle threshold" in line for line in report.assumptions)
    assert "On-prem allocated idle" in render_html(report)
