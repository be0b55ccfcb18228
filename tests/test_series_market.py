"""Step series, price books, availability traces and spot advisor buckets."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from autoscaler.model.catalog import SpotAdvisor, bucket_rate_per_hour
from autoscaler.model.errors import InputError
from autoscaler.sim.market import AvailabilityFile, PriceBook
from autoscaler.sim.scenario import CheckpointRule, JobMatch, TraceSpec
from autoscaler.sim.series import StepSeries
from autoscaler.sim.trace import load_trace


def test_step_series_lookup_integral_and_changes() -> None:
    s = StepSeries([0.0, 10.0, 30.0], [1.0, 2.0, 0.5])
    assert [s.at(t) for t in (0, 9.9, 10, 29, 30, 1e9)] == [1.0, 1.0, 2.0, 2.0, 0.5, 0.5]
    assert s.integral(5, 35) == pytest.approx(5 * 1 + 20 * 2 + 5 * 0.5)
    assert s.next_change(0) == 10 and s.next_change(10) == 30 and s.next_change(30) == math.inf
    assert s.minimum(0, 29) == 1.0 and s.minimum(5, 31) == 0.5


def test_periodic_series_repeats() -> None:
    s = StepSeries([0.0, 10.0], [1.0, 0.0], period=20.0)
    assert [s.at(t) for t in (5, 15, 25, 35, 45)] == [1.0, 0.0, 1.0, 0.0, 1.0]
    assert s.next_change(15) == 20 and s.next_change(21) == 30
    assert s.integral(0, 100) == pytest.approx(50.0)


@given(
    st.lists(st.tuples(st.floats(0, 100), st.floats(0, 10)), min_size=1, max_size=8),
    st.floats(0, 150),
    st.floats(0, 150),
    st.floats(0, 150),
)
def test_integral_is_additive(
    points: list[tuple[float, float]], a: float, b: float, c: float
) -> None:
    points.sort()
    s = StepSeries([p[0] for p in points], [p[1] for p in points])
    lo, mid, hi = sorted((a, b, c))
    assert s.integral(lo, hi) == pytest.approx(s.integral(lo, mid) + s.integral(mid, hi), abs=1e-6)


def test_price_book_takes_the_zone_median_unless_a_zone_is_chosen(tmp_path: Path) -> None:
    prices = tmp_path / "p.csv"
    prices.write_text(
        "timestamp,cloud,region,zone,instance_type,price_per_hour\n"
        "2024-01-01T00:00:00Z,aws,r,az1,t,3.0\n"
        "2024-01-01T00:00:00Z,aws,r,az2,t,1.0\n"
        "2024-01-01T00:00:00Z,aws,r,az3,t,1.2\n"
        "2024-01-01T06:00:00Z,aws,r,az2,t,2.0\n"
    )
    book = PriceBook([prices])
    origin = 1704067200.0  # 2024-01-01T00:00:00Z
    regional = book.series("aws", "r", "t", spot=True, zone=None, origin=origin)
    assert regional is not None
    assert regional.at(0) == 1.2 and regional.at(6 * 3600) == 2.0
    zonal = book.series("aws", "r", "t", spot=True, zone="az2", origin=origin)
    assert zonal is not None and zonal.at(0) == 1.0
    assert book.series("aws", "r", "t", spot=False, zone=None, origin=origin) is None


def test_price_file_without_a_price_column_is_refused(tmp_path: Path) -> None:
    prices = tmp_path / "p.csv"
    prices.write_text("timestamp,cloud,region,zone,instance_type\n2024-01-01T00:00:00Z,a,r,,t\n")
    with pytest.raises(InputError, match="price_per_hour or on_demand_price_per_hour"):
        PriceBook([prices])


def test_availability_one_node_is_all_or_nothing_and_multi_node_caps(tmp_path: Path) -> None:
    runs = tmp_path / "a.csv"
    head = (
        "trace_id,kind,nodes_tracked,cloud,zone,instance_type,start_date,gap_seconds,"
        "start_tick,end_tick_exclusive,start_elapsed_s,duration_s,available_instances\n"
    )
    runs.write_text(
        head
        + "one,availability,1-node,aws,z,t,d,60,0,1,0,60,1\n"
        + "one,availability,1-node,aws,z,t,d,60,1,2,60,60,0\n"
        + "many,availability,16-node,aws,z,t,d,60,0,1,0,60,12\n"
    )
    file = AvailabilityFile(runs)
    one = file.trace("one", offset_s=0, loop=True)
    assert one.capacity(10) == math.inf and one.capacity(70) == 0 and one.capacity(130) == math.inf
    assert file.trace("many", offset_s=0, loop=False).capacity(10) == 12
    with pytest.raises(InputError, match="no availability runs for trace 'missing'"):
        file.trace("missing", 0, True)


def test_advisor_buckets_become_hourly_rates(tmp_path: Path) -> None:
    path = tmp_path / "adv.csv"
    path.write_text(
        "snapshot_date,region,instance_type,interruption_bucket\n"
        "2021-01-01,r,t,0\n2025-01-01,r,t,4\n"
    )
    assert SpotAdvisor(path, None).rate_per_hour("r", "t") == bucket_rate_per_hour(4)
    assert SpotAdvisor(path, "2021-01-01").rate_per_hour("r", "t") == bucket_rate_per_hour(0)
    assert bucket_rate_per_hour(4) == pytest.approx(-math.log(0.75) / 730)
    path.write_text("snapshot_date,region,instance_type,interruption_bucket\n2021-01-01,r,t,9\n")
    with pytest.raises(InputError, match=":2: interruption_bucket: expected 0 to 4"):
        SpotAdvisor(path, None)


HEADER = (
    "job_id,submit_time_s,start_time_s,duration_s,num_gpus,gpu_fraction,priority_class,"
    "preemptible\n"
)


def test_trace_window_carries_running_jobs_and_applies_checkpoint_rules(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text(
        HEADER
        + "early,0,0,50,1,1.0,LS,0\n"  # ends before the window
        + "running,50,60,1000,2,1.0,LS,0\n"  # runs across the window start at 100
        + "inside,150,150,10,1,0.5,BE,1\n"
        + "cpu,160,160,10,0,0,BE,1\n"
        + "pending,170,,,1,1.0,LS,0\n"
        + "after,500,500,10,1,1.0,LS,0\n"
    )
    rules = (CheckpointRule(match=JobMatch(preemptible=True), interval_s=600, duration_s=5),)
    selection = load_trace(
        path,
        TraceSpec(file="t.csv", window_start_s=100, window_end_s=400),
        rules,
        JobMatch(min_gpus=2),
        seed=1,
    )
    assert [(j.id, j.submit, j.duration, j.carried) for j in selection.jobs] == [
        ("running", 0.0, 960.0, True),
        ("inside", 50.0, 10.0, False),
    ]
    running, inside = selection.jobs
    assert running.high_priority and running.checkpoint_interval_s is None
    assert inside.checkpoint_interval_s == 600 and inside.utilisation == 0.5
    assert selection.skipped == {"no GPU requested": 1, "never started (no duration)": 1}


def test_a_fraction_rule_picks_the_same_jobs_for_the_same_seed(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text(HEADER + "".join(f"j{i},{i},{i},10,1,1.0,LS,0\n" for i in range(400)))
    rules = (CheckpointRule(fraction=0.25, interval_s=600),)
    spec = TraceSpec(file="t.csv")
    picked = [j.id for j in load_trace(path, spec, rules, None, 3).jobs if j.checkpoint_interval_s]
    again = [j.id for j in load_trace(path, spec, rules, None, 3).jobs if j.checkpoint_interval_s]
    other = [j.id for j in load_trace(path, spec, rules, None, 4).jobs if j.checkpoint_interval_s]
    assert picked == again and picked != other
    assert 60 < len(picked) < 140


def test_busiest_window_is_the_densest(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    sparse = [f"s{i},{i * 86400},{i * 86400},10,1,1.0,LS,0\n" for i in range(10)]
    dense = [
        f"d{i},{20 * 86400 + i * 600},{20 * 86400 + i * 600},10,1,1.0,LS,0\n" for i in range(50)
    ]
    path.write_text(HEADER + "".join(sparse + dense))
    selection = load_trace(path, TraceSpec(file="t.csv", busiest_days=1), (), None, 0)
    assert selection.window_start_s == 20 * 86400
    assert len(selection.jobs) == 50


def test_trace_errors_name_the_row(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text(HEADER + "a,0,0,10,1,1.0,LS,0\na,1,1,10,1,1.0,LS,0\n")
    with pytest.raises(InputError, match=r"t.csv:3: job_id: job id 'a' appears twice"):
        load_trace(path, TraceSpec(file="t.csv"), (), None, 0)
    path.write_text(HEADER + "a,0,0,10,1.5,1.0,LS,0\n")
    with pytest.raises(InputError, match=r"t.csv:2: num_gpus: expected a whole number, got '1.5'"):
        load_trace(path, TraceSpec(file="t.csv"), (), None, 0)
    path.write_text("job_id,submit_time_s\n")
    with pytest.raises(InputError, match="missing column"):
        load_trace(path, TraceSpec(file="t.csv"), (), None, 0)
