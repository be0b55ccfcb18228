"""The scenario boundary: fuzzed (``boundary_scenario``), and each failure issue 15 named in it
as a regression test, through ``validate`` and ``report --scenario`` as a user runs them."""

from __future__ import annotations

import random
import re
from pathlib import Path

import pytest
from boundary_config import run_cli
from boundary_scenario import SCENARIO, ScenarioBoundary
from harness import assert_held, fuzz_settings
from hypothesis import given
from hypothesis import strategies as st

BOUNDARY = ScenarioBoundary()


@fuzz_settings()
@given(st.randoms(use_true_random=False))
def test_the_scenario_boundary_holds(rng: random.Random) -> None:
    assert_held(BOUNDARY, BOUNDARY.generate(rng))


def test_every_seed_is_accepted_and_replayed() -> None:
    for seed in BOUNDARY.seeds():
        outcome = assert_held(BOUNDARY, {"files": seed, "replay": True})
        assert outcome.detail == "validated and replayed", outcome.detail


def scenario(tmp_path: Path, **changes: str | bytes) -> Path:
    """The first seed written to ``tmp_path``, with some files replaced or edited."""
    files = dict(BOUNDARY.seeds()[0])
    files.update(changes)
    for name, content in files.items():
        if isinstance(content, bytes):
            (tmp_path / name).write_bytes(content)
        else:
            (tmp_path / name).write_text(content)
    return tmp_path / SCENARIO


def seed_text(name: str) -> str:
    text = BOUNDARY.seeds()[0][name]
    assert isinstance(text, str)
    return text


def refused(path: Path) -> str:
    run = run_cli(["validate", str(path)])
    assert run.rc == 2, run.err
    assert len(run.error_lines) == 1, run.err
    return run.error_lines[0]


def test_a_csv_in_another_encoding_names_its_line(tmp_path: Path) -> None:
    prices = seed_text("prices.csv").replace("aws,r1,,small,2.0", "aws,r1,,smäll,2.0")
    path = scenario(tmp_path, **{"prices.csv": prices.encode("latin-1")})
    assert refused(path) == f"error: {tmp_path / 'prices.csv'}:3: not UTF-8 text"


def test_a_short_row_and_a_column_named_twice_are_refused(tmp_path: Path) -> None:
    trace = seed_text("trace.csv").splitlines()
    trace[2] = ",".join(trace[2].split(",")[:5])
    path = scenario(tmp_path, **{"trace.csv": "\n".join(trace) + "\n"})
    assert refused(path) == (
        f"error: {tmp_path / 'trace.csv'}:3: expected 15 fields as the header has, got 5"
    )
    prices = seed_text("prices.csv").replace("zone,", "region,", 1)
    path = scenario(tmp_path, **{"prices.csv": prices})
    assert refused(path) == f"error: {tmp_path / 'prices.csv'}:1: the column 'region' appears twice"


@pytest.mark.parametrize("number", ["nan", "inf", "1e999", "1e16", "٣", "1_000", "0x10"])
def test_numbers_in_every_csv_are_plain_finite_and_in_range(tmp_path: Path, number: str) -> None:
    prices = seed_text("prices.csv").replace(",2.0,", f",{number},")
    path = scenario(tmp_path, **{"prices.csv": prices})
    assert re.match(
        rf"error: {tmp_path / 'prices.csv'}:3: price_per_hour: expected ", refused(path)
    )


def test_a_skipped_trace_row_is_checked_too(tmp_path: Path) -> None:
    trace = seed_text("trace.csv") + "z,NaN,,,0,,4,Failed,0,,LS,0,,none,\n"
    line = refused(scenario(tmp_path, **{"trace.csv": trace}))
    assert line == (
        f"error: {tmp_path / 'trace.csv'}:5: submit_time_s: expected a number, got 'NaN'"
    )


def test_times_outside_1970_to_2100_are_refused(tmp_path: Path) -> None:
    prices = seed_text("prices.csv").replace("2024-01-01T12", "9999-01-01T12")
    line = refused(scenario(tmp_path, **{"prices.csv": prices}))
    assert line.startswith(f"error: {tmp_path / 'prices.csv'}:3: timestamp: expected a time")
    text = seed_text(SCENARIO).replace('"2024-01-01T00:00:00Z"', "9999-12-31T23:59:59-23:59")
    assert ":3: start: expected an ISO-8601 time" in refused(scenario(tmp_path, **{SCENARIO: text}))


def test_a_degenerate_availability_trace_is_refused_not_divided_by(tmp_path: Path) -> None:
    runs = seed_text("avail.csv") + "t,availability,1-node,aws,z,small,2024-01-01,60,0,0,0,0,1\n"
    text = seed_text(SCENARIO).replace(
        "pools: {spot: {interruption_rate_per_hour: 0.0}}", "pools: {spot: {availability_trace: t}}"
    )
    line = refused(scenario(tmp_path, **{"avail.csv": runs, SCENARIO: text}))
    assert (
        line == f"error: {tmp_path / 'avail.csv'}:2: duration_s: expected a number >= 60, got '0'"
    )


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        ("window_end_s: 14400", "window_end_s: 1e9", ":5: trace: the window is 11,574.1 days"),
        ("tick_seconds: 60", "tick_seconds: 0.001", ":11: controller: tick_seconds is 0.001"),
        ("interval_s: 600", "interval_s: 1e-9", ":7: checkpointing[0].interval_s: input should"),
        ("{name: local, gpus: 1}", "{name: local, gpus: 1, count: 1e9}", ":9: onprem[0].count"),
        ("seed: 1", "seed: 99999999999999999999", ":2: seed: expected a number of at most"),
    ],
)
def test_a_scenario_that_would_replay_for_ever_is_refused(
    tmp_path: Path, old: str, new: str, expected: str
) -> None:
    text = seed_text(SCENARIO)
    assert old in text
    line = refused(scenario(tmp_path, **{SCENARIO: text.replace(old, new)}))
    assert line.startswith(f"error: {tmp_path / SCENARIO}{expected}"), line


def test_a_window_with_no_job_is_refused(tmp_path: Path) -> None:
    text = seed_text(SCENARIO).replace("window_start_s: 0", "window_start_s: 14000")
    line = refused(scenario(tmp_path, **{SCENARIO: text}))
    assert line.startswith(f"error: {tmp_path / 'trace.csv'}: no GPU job is submitted or running")


def test_a_market_error_names_the_scenario_line(tmp_path: Path) -> None:
    prices = seed_text("prices.csv").replace("2024-01-01T00", "2024-01-01T06")
    line = refused(scenario(tmp_path, **{"prices.csv": prices}))
    assert line.startswith(f"error: {tmp_path / SCENARIO}:15: controller.pools[0]: the first spot")


def test_report_writes_nothing_from_refused_inputs(tmp_path: Path) -> None:
    prices = seed_text("prices.csv").replace(",3.0\n", ",nan\n", 1)
    path = scenario(tmp_path, **{"prices.csv": prices})
    out = tmp_path / "out"
    run = run_cli(["report", "--scenario", str(path), "--out", str(out), "--no-progress"])
    assert run.rc == 2 and "on_demand_price_per_hour: expected a number" in run.err
    assert not out.exists()


def test_a_trace_left_to_set_its_own_window_is_bounded_in_ticks_too(tmp_path: Path) -> None:
    text = (
        seed_text(SCENARIO)
        .replace(
            "trace: {file: trace.csv, window_start_s: 0, window_end_s: 14400}",
            "trace: {file: trace.csv}",
        )
        .replace("tick_seconds: 60", "tick_seconds: 1")
    )
    trace = seed_text("trace.csv") + "late,2000000,2000000,60,1,1.0,4,Succeeded,0,,BE,1,,none,\n"
    line = refused(scenario(tmp_path, **{SCENARIO: text, "trace.csv": trace}))
    assert line.startswith(
        f"error: {tmp_path / SCENARIO}:5: trace: the trace spans 2,000,001 ticks of 1 s"
    ), line
