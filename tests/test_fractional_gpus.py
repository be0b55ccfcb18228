"""Fractional GPUs (issue 19): jobs asking for a fraction of a GPU share GPUs that may be shared
(time-slicing replicas or MIG profiles), in whole slices, so no GPU ever holds more than one
GPU's worth; their GPU-seconds count their slice; sharing buys fewer cloud GPUs."""

from __future__ import annotations

import heapq
import itertools
import math
import os
import textwrap
from dataclasses import replace
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from autoscaler.model import Capacity
from autoscaler.model.clock import ManualClock
from autoscaler.model.errors import InputError
from autoscaler.model.sharing import GpuSharing, SharingMode
from autoscaler.sim import replay
from autoscaler.sim.packing import SharedGpus
from autoscaler.sim.scenario import load_scenario
from autoscaler.sim.scheduler import SimJob, SimScheduler
from autoscaler.sim.trace import TraceJob

A100_40GB = ("1g.5gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb")
MIG = GpuSharing(mode=SharingMode.MIG, profiles=A100_40GB)
EXAMPLES = int(os.environ.get("FRACTION_EXAMPLES", "200"))


def sliced(replicas: int) -> GpuSharing:
    return GpuSharing(mode=SharingMode.TIME_SLICING, replicas=replicas)


# -- the shapes ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fraction", "profile", "slices"),
    [
        (0.1, "1g.5gb", 1),
        (1 / 7, "1g.5gb", 1),
        (0.15, "2g.10gb", 2),
        (0.29, "3g.20gb", 3),
        (0.46, "4g.20gb", 4),
        (4 / 7, "4g.20gb", 4),
        (0.6, None, None),  # only 7g.40gb covers it: that is the whole GPU
    ],
)
def test_mig_gives_the_smallest_profile_that_covers_the_fraction(
    fraction: float, profile: str | None, slices: int | None
) -> None:
    assert MIG.profile_for(fraction) == profile
    assert MIG.slices_for(fraction) == slices


def test_mig_without_small_profiles_gives_the_next_one_up() -> None:
    sharing = GpuSharing(mode=SharingMode.MIG, profiles=("3g.20gb", "7g.40gb"))
    assert sharing.slices_for(0.05) == 3
    assert sharing.profile_for(0.05) == "3g.20gb"
    assert sharing.slices_for(0.5) is None


@pytest.mark.parametrize(
    ("replicas", "fraction", "slices"),
    [
        (10, 0.3, 3),
        (10, 0.46, 5),
        (10, 0.01, 1),
        (4, 0.25, 1),
        (4, 0.26, 2),
        (3, 0.6, 2),
        (3, 0.999, None),
        (2, 0.7, None),
    ],
)
def test_time_slicing_rounds_the_fraction_up_to_replicas(
    replicas: int, fraction: float, slices: int | None
) -> None:
    # 0.3 is three tenths as the trace wrote it, not 0.30000000000000004 (which would be 4);
    # a fraction that rounds up to every replica is a whole GPU
    assert sliced(replicas).slices_for(fraction) == slices


@pytest.mark.parametrize(
    "data",
    [
        {"mode": "time-slicing"},
        {"mode": "time-slicing", "replicas": 1},
        {"mode": "time-slicing", "replicas": 4, "profiles": ["1g.5gb"]},
        {"mode": "mig"},
        {"mode": "mig", "profiles": ["5g.20gb"]},
        {"mode": "mig", "profiles": ["1g.5"]},
        {"mode": "mig", "profiles": ["1g.5gb"], "replicas": 2},
        {"mode": "mps", "replicas": 2},
    ],
)
def test_a_sharing_that_does_not_say_its_shape_is_refused(data: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        GpuSharing.model_validate(data)


def test_best_fit_fills_a_partly_used_gpu_before_an_empty_one() -> None:
    gpus = SharedGpus(sliced(10), 3)
    assert gpus.place(1, 5) == 0
    assert gpus.place(2, 3) == 0  # onto the half-used GPU, not an empty one
    assert gpus.place(3, 3) == 1  # 2 left on GPU 0: too few
    assert gpus.place(4, 2) == 0  # the tightest: GPU 0 has exactly 2
    assert gpus.used == [10, 3, 0]
    assert gpus.free_gpus() == 1
    assert gpus.stranded() == Fraction(7, 10)
    gpus.release(4)
    gpus.release(1)
    assert gpus.used == [3, 3, 0]


# -- the property --------------------------------------------------------------------------------

SHARINGS = st.one_of(
    st.none(),
    st.integers(2, 12).map(sliced),
    st.sampled_from(
        [MIG, GpuSharing(mode=SharingMode.MIG, profiles=("1g.10gb", "3g.40gb", "7g.80gb"))]
    ),
)
FRACTIONS = st.one_of(
    st.none(), st.sampled_from([0.05, 0.1, 0.25, 0.3, 0.46, 0.5, 0.7, 0.99]), st.floats(0.01, 0.99)
)
OPS = st.lists(
    st.one_of(
        st.tuples(st.just("node"), st.integers(1, 4), SHARINGS),
        st.tuples(st.just("job"), st.integers(1, 3), FRACTIONS, st.integers(1, 5000)),
        st.tuples(st.just("advance"), st.integers(1, 4000)),
        st.tuples(st.just("remove"), st.integers(0, 20)),
        st.tuples(st.just("interrupt"), st.integers(0, 200)),
    ),
    max_size=60,
)


Op = tuple[Any, ...]


class World:
    def __init__(self) -> None:
        self.clock = ManualClock(0.0)
        self.events: list[tuple[float, int, SimJob, int]] = []
        self.order = itertools.count()
        self.scheduler = SimScheduler(self.clock, 5.0, self._started)
        self.nodes = 0

    def _started(self, job: SimJob, end: float) -> None:
        heapq.heappush(self.events, (end, next(self.order), job, job.run_id))

    def advance(self, seconds: float) -> None:
        until = self.clock.now() + seconds
        while self.events and self.events[0][0] <= until:
            when, _, job, run_id = heapq.heappop(self.events)
            self.clock.set(when)
            self.scheduler.finish(job, run_id, when)
            self.scheduler.schedule(when)
            self.check()
        self.clock.set(until)

    def check(self) -> None:
        """No GPU holds more than one GPU's worth, counted from the jobs themselves."""
        for node in self.scheduler.nodes.values():
            shared = node.shared
            if shared is None:
                assert node.free == node.gpus - sum(j.gpus_per_node for j in node.jobs.values())
                assert all(j.slice is None for j in node.jobs.values())
                continue
            per_gpu = [0] * node.gpus
            for seq, held in shared.held.items():
                assert seq in node.jobs
                for gpu, slices in held:
                    per_gpu[gpu] += slices
            assert set(shared.held) == set(node.jobs)
            assert per_gpu == shared.used
            assert all(0 <= used <= shared.units for used in per_gpu)
            assert node.free == per_gpu.count(0)
            for job in node.jobs.values():
                if job.slice is not None:
                    (gpu, slices), *rest = shared.held[job.seq]
                    assert not rest and job.slice == Fraction(slices, shared.units) < 1
                    assert job.trace.gpu_fraction is not None
                    assert Fraction(slices, shared.units) >= Fraction(repr(job.trace.gpu_fraction))
                else:
                    assert sum(s for _, s in shared.held[job.seq]) == (
                        shared.units * job.gpus_per_node
                    )


@settings(max_examples=EXAMPLES, deadline=None)
@given(OPS)
def test_fractional_packing_never_puts_more_than_one_gpu_on_a_gpu(ops: list[Op]) -> None:
    world = World()
    s = world.scheduler
    ids = itertools.count()
    for op in ops:
        now = world.clock.now()
        if op[0] == "node":
            _, gpus, sharing = op
            s.add_node(f"n{world.nodes}", gpus, Capacity.ONPREM, None, now, sharing=sharing)
            world.nodes += 1
        elif op[0] == "job":
            _, gpus, fraction, duration = op
            fraction = fraction if gpus == 1 and fraction is not None else None
            job_id = str(next(ids))
            s.submit(
                TraceJob(
                    job_id,
                    now,
                    float(duration),
                    gpus,
                    fraction or 1.0,
                    None,
                    0.0,
                    False,
                    gpu_fraction=fraction,
                ),
                now,
            )
        elif op[0] == "advance":
            world.advance(op[1])
        elif op[0] == "remove" and s.nodes:
            names = sorted(s.nodes)
            s.remove_node(names[op[1] % len(names)], now)
        elif op[0] == "interrupt":
            running = [j for j in s.jobs if j.node is not None]
            if running:
                s.requeue(str(running[op[1] % len(running)].seq))
        s.schedule(world.clock.now())
        world.check()
    end = world.clock.now() + 10_000
    world.advance(10_000)
    s.close(end)
    a = s.accounting
    allocated = sum(a.allocated_gpu_s.values())
    assert allocated == pytest.approx(
        a.useful_gpu_s + a.lost_gpu_s + a.checkpoint_gpu_s, rel=1e-9, abs=1e-6
    )
    # each job's GPU-seconds are its slice's: a finished job that ran once on a slice of f
    # used exactly slice * duration
    assert allocated <= sum(j.trace.gpus * (end - j.trace.submit) for j in s.jobs) + 1e-6


def test_a_fractional_job_counts_its_slice_and_a_whole_gpu_job_its_gpus() -> None:
    world = World()
    s = world.scheduler
    s.add_node("shared", 2, Capacity.ONPREM, None, 0.0, sharing=sliced(10))
    for i in range(3):
        s.submit(TraceJob(f"f{i}", 0.0, 100.0, 1, 0.3, None, 0.0, False, gpu_fraction=0.3), 0.0)
    s.submit(TraceJob("w", 0.0, 100.0, 1, 1.0, None, 0.0, False), 0.0)
    assert s.schedule(0.0) == 4
    node = s.nodes["shared"]
    assert node.shared is not None and sorted(node.shared.used) == [9, 10]
    world.advance(200)
    a = s.accounting
    assert a.allocated_gpu_s[Capacity.ONPREM] == pytest.approx(3 * 0.3 * 100 + 100)
    assert a.useful_gpu_s == pytest.approx(3 * 0.3 * 100 + 100)


def test_guarantees_count_a_running_slice_by_its_slice_and_a_pending_one_by_its_fraction() -> None:
    world = World()
    s = world.scheduler
    s.add_node("shared", 1, Capacity.ONPREM, None, 0.0, sharing=sliced(10))
    for i in range(3):
        job = TraceJob(f"f{i}", 0.0, 100.0, 1, 0.3, None, 0.0, False, gpu_fraction=0.3)
        s.submit(replace(job, team="ml"), 0.0)
    s.submit(replace(TraceJob("w", 0.0, 100.0, 1, 1.0, None, 0.0, False), team="ml"), 0.0)
    assert s.schedule(0.0) == 3  # three slices of 3 on the one GPU; the whole job waits
    held, pending = s.team_gpus()["ml"]
    assert held == pytest.approx(0.9) and pending == pytest.approx(1.0)


def test_without_sharing_a_fractional_job_takes_a_whole_gpu() -> None:
    world = World()
    s = world.scheduler
    s.add_node("plain", 2, Capacity.ONPREM, None, 0.0)
    for i in range(3):
        s.submit(TraceJob(f"f{i}", 0.0, 100.0, 1, 0.3, None, 0.0, False, gpu_fraction=0.3), 0.0)
    assert s.schedule(0.0) == 2
    assert s.pending == 1


def test_whole_gpu_jobs_are_not_blocked_by_slices_spread_over_gpus() -> None:
    world = World()
    s = world.scheduler
    s.add_node("shared", 4, Capacity.ONPREM, None, 0.0, sharing=MIG)
    for i in range(4):  # four 1g slices: best fit puts them all on one GPU
        s.submit(TraceJob(f"f{i}", 0.0, 100.0, 1, 0.1, None, 0.0, False, gpu_fraction=0.1), 0.0)
    s.submit(TraceJob("w", 0.0, 100.0, 3, 1.0, None, 0.0, False), 0.0)
    assert s.schedule(0.0) == 5
    node = s.nodes["shared"]
    assert node.shared is not None and node.shared.used.count(4) == 1
    stranded, free = s.fragmentation()
    assert stranded == Fraction(3, 7) and free == 0


# -- demand and replay ---------------------------------------------------------------------------


def test_pending_fractions_reach_the_controller_as_their_slices_rounded_up() -> None:
    clock = ManualClock(0.0)
    s = SimScheduler(clock, 5.0, lambda job, end: None, None, {"od": sliced(4)}, ["od"])
    for i in range(9):
        s.submit(TraceJob(f"f{i}", 0.0, 100.0, 1, 0.25, None, 0.0, False, gpu_fraction=0.25), 0.0)
    s.submit(TraceJob("w", 0.0, 100.0, 1, 1.0, None, 0.0, False), 0.0)
    groups = s.read(0.0)
    assert sorted(g.jobs for g in groups) == [1, 3]  # 9 quarters: 3 GPUs; the whole job: 1
    assert s.pending_gpus == 4
    # jobs alike but for their fraction are one group, rounded up once: 9/4 + 2/2 is 4 GPUs
    for i in range(2):
        s.submit(TraceJob(f"h{i}", 0.0, 100.0, 1, 0.5, None, 0.0, False, gpu_fraction=0.5), 0.0)
    assert sorted(g.jobs for g in s.read(0.0)) == [1, 4]
    assert s.pending_gpus == 5
    # a pool that does not share would give each a whole GPU: they are asked for one each
    plain = SimScheduler(clock, 5.0, lambda job, end: None, None, {"od": sliced(4)}, ["od", "x"])
    for i in range(9):
        plain.submit(
            TraceJob(f"f{i}", 0.0, 100.0, 1, 0.25, None, 0.0, False, gpu_fraction=0.25), 0.0
        )
    assert [g.jobs for g in plain.read(0.0)] == [9]


def fraction_scenario(tmp_path: Path, sharing: str) -> Path:
    quarter = ",3600,1,0.25,4,Succeeded,0,,LS,0,,none,"
    rows = [f"j{i},{i * 10},{i * 10}{quarter}" for i in range(24)]
    rows.append("w0,0,0,3600,1,1.0,4,Succeeded,0,,LS,0,,none,")
    (tmp_path / "trace.csv").write_text(
        "job_id,submit_time_s,start_time_s,duration_s,num_gpus,gpu_fraction,num_cpus,status,"
        "queue_delay_s,user_group,priority_class,preemptible,gpu_model,censored,deadline_s\n"
        + "\n".join(rows)
        + "\n"
    )
    (tmp_path / "prices.csv").write_text(
        "timestamp,cloud,region,zone,instance_type,price_per_hour,on_demand_price_per_hour\n"
        "2024-01-01T00:00:00Z,aws,r1,,quad,4.0,4.0\n"
    )
    text = textwrap.dedent(f"""\
        name: fractions
        seed: 1
        start: "2024-01-01T00:00:00Z"
        trace: {{file: trace.csv, window_start_s: 0, window_end_s: 14400}}
        controller:
          fleet_id: fractions
          tick_seconds: 60
          limits: {{scale_down_cooldown_s: 0}}
          pools:
            - {{name: od, market: on-demand, provider: aws, region: r1, instance_type: quad,
                gpus_per_instance: 4, boot_seconds: 60}}
        policies:
          - name: cost-aware
        market:
          price_files: [prices.csv]
        {sharing}
        """)
    path = tmp_path / "scenario.yaml"
    path.write_text(text)
    return path


def test_sharing_buys_fewer_cloud_gpu_hours_for_fractional_jobs(tmp_path: Path) -> None:
    (tmp_path / "plain").mkdir()
    (tmp_path / "shared").mkdir()
    plain = replay(fraction_scenario(tmp_path / "plain", ""), "cost-aware")
    shared = replay(
        fraction_scenario(
            tmp_path / "shared", "gpu_sharing: {pools: {od: {mode: time-slicing, replicas: 4}}}"
        ),
        "cost-aware",
    )
    assert plain.jobs_finished == shared.jobs_finished == 25
    # 24 quarter-GPU jobs and one whole: 25 GPUs without sharing, 7 with
    assert shared.cloud_paid_gpu_s < plain.cloud_paid_gpu_s / 2
    assert shared.cost < plain.cost / 2
    assert shared.useful_gpu_s == pytest.approx(24 * 0.25 * 3600 + 3600)
    assert plain.useful_gpu_s == pytest.approx(25 * 3600)
    assert shared.shares_gpus and not plain.shares_gpus
    assert shared.frag_ticks > 0 and shared.stranded_gpu_ticks <= shared.free_gpu_ticks


def test_a_pools_own_gpu_sharing_in_the_controller_config_is_replayed_as_the_scenarios(
    tmp_path: Path,
) -> None:
    """The live controller reads ``pools[].gpu_sharing``; a scenario whose controller config
    says it is replayed exactly as one that says it in ``gpu_sharing.pools``."""
    (tmp_path / "scenario").mkdir()
    (tmp_path / "pool").mkdir()
    by_scenario = replay(
        fraction_scenario(
            tmp_path / "scenario", "gpu_sharing: {pools: {od: {mode: time-slicing, replicas: 4}}}"
        ),
        "cost-aware",
    )
    path = fraction_scenario(tmp_path / "pool", "")
    text = path.read_text().replace(
        "gpus_per_instance: 4, boot_seconds: 60}",
        "gpus_per_instance: 4, boot_seconds: 60,\n"
        "                gpu_sharing: {mode: time-slicing, replicas: 4}}",
    )
    assert "gpu_sharing" in text
    path.write_text(text)
    by_pool = replay(path, "cost-aware")
    assert by_pool.shares_gpus
    assert (by_pool.cost, by_pool.cloud_paid_gpu_s, by_pool.waits_s) == (
        by_scenario.cost,
        by_scenario.cloud_paid_gpu_s,
        by_scenario.waits_s,
    )


def test_sharing_a_pool_the_scenario_lacks_is_an_error(tmp_path: Path) -> None:
    path = fraction_scenario(
        tmp_path, "gpu_sharing: {pools: {nope: {mode: time-slicing, replicas: 4}}}"
    )
    with pytest.raises(InputError, match="nope"):
        load_scenario(path)


def test_the_trace_keeps_a_one_gpu_jobs_fraction(tmp_path: Path) -> None:
    from autoscaler.sim.engine import prepare

    prepared = prepare(load_scenario(fraction_scenario(tmp_path, "")))
    fractions = {j.id: j.gpu_fraction for j in prepared.selection.jobs}
    assert fractions["j0"] == 0.25 and fractions["w0"] is None
    assert math.isclose(sum(f or 0 for f in fractions.values()), 6.0)


def test_the_report_measures_fragmentation_only_where_gpus_are_shared(tmp_path: Path) -> None:
    from autoscaler.report.build import build_report
    from autoscaler.report.render import render_markdown
    from autoscaler.sim.engine import prepare, simulate
    from autoscaler.sim.scenario import PolicySpec

    (tmp_path / "plain").mkdir()
    (tmp_path / "shared").mkdir()
    sections = {}
    for name, sharing in (
        ("plain", ""),
        ("shared", "gpu_sharing: {every_pool: {mode: mig, profiles: [1g.5gb, 3g.20gb]}}"),
    ):
        prepared = prepare(load_scenario(fraction_scenario(tmp_path / name, sharing)))
        result = simulate(prepared, PolicySpec(name="cost-aware"))
        report = build_report(prepared, [result], [])
        sections[name] = (report.policies[0].fragmentation, render_markdown(report))
    assert sections["plain"][0] is None
    assert "fragmentation" not in sections["plain"][1]
    found, text = sections["shared"]
    assert found is not None and found.ticks > 0
    assert 0 <= found.stranded_gpus <= found.free_gpus
    assert "GPU sharing and fragmentation" in text and "MIG 1g.5gb, 3g.20gb" in text
