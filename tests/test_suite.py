"""The evaluation suite: the suite file is checked before anything runs, a small suite runs end to
end through ``gpu-autoscaler report --suite``, and the synthetic families are deterministic and
have the property each one claims."""

from __future__ import annotations

import csv
import math
import os
import statistics
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_sim_engine import job_row, small_scenario

from autoscaler.model import gpu_model_matches
from autoscaler.model.errors import InputError
from autoscaler.report.suite import (
    SuiteReport,
    load_suite,
    median_or_none,
    render_markdown,
    write_suite,
)
from autoscaler.sim.engine import prepare
from autoscaler.sim.scenario import default_scenario_path, load_scenario
from autoscaler.sim.synthetic import (
    CACHE_ENV,
    DAY,
    FAMILIES,
    SyntheticTraceSpec,
    cached_trace,
    generate,
)

SCENARIOS = default_scenario_path().parent
SHIPPED_SUITE = SCENARIOS / "suite.yaml"
EIGHT_GPU_POOLS = (
    "- {name: spot, market: spot, provider: aws, region: r1, instance_type: small, "
    "gpus_per_instance: 8, boot_seconds: 60}\n"
    "- {name: od, market: on-demand, provider: aws, region: r1, instance_type: small, "
    "gpus_per_instance: 8, boot_seconds: 60}\n"
)


def run(*args: str, cache: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, CACHE_ENV: str(cache)}
    return subprocess.run(
        [sys.executable, "-m", "autoscaler.cli", *args],
        capture_output=True,
        text=True,
        check=False,
        env=env,
    )


def named_scenario(
    folder: Path, name: str, jobs: list[str], trace: str | None = None, pools: str | None = None
) -> Path:
    """The small test scenario of test_sim_engine, renamed, optionally with another trace line."""
    folder.mkdir(parents=True)
    path = small_scenario(folder, jobs=jobs, pools=pools)
    text = path.read_text().replace("name: small", f"name: {name}", 1)
    if trace is not None:
        default = "trace: {file: trace.csv, window_start_s: 0, window_end_s: 86400}"
        assert default in text
        text = text.replace(default, trace)
    path.write_text(text)
    return path


def synthetic_scenario(folder: Path, name: str, spec: str, window_end_s: float) -> Path:
    return named_scenario(
        folder,
        name,
        jobs=[job_row("unused", 0, 60)],
        trace=f"trace: {{synthetic: {spec}, window_start_s: 0, window_end_s: {window_end_s:g}}}",
        pools=EIGHT_GPU_POOLS,
    )


# ---------------------------------------------------------------- the shipped suite


def test_the_shipped_suite_runs_the_same_policies_over_real_and_generated_scenarios() -> None:
    loaded = load_suite(SHIPPED_SUITE)
    assert len(loaded.scenarios) >= 5
    suite_policies = loaded.suite.policies
    assert suite_policies is not None
    assert [p.name for p in suite_policies][:3] == ["cost-aware", "cheapest-spot", "on-demand"]
    for specs in loaded.policies:
        assert tuple(s for _, s in specs) == suite_policies, "no per-scenario policy list"
    openb = [
        s.scenario
        for s in loaded.scenarios
        if s.scenario.trace.file and "v2023" in s.scenario.trace.file
    ]
    windows = {(t.trace.busiest_days, t.trace.window_start_s, t.trace.window_end_s) for t in openb}
    sizes = {sum(n.gpus * n.count for n in s.onprem) for s in openb}
    assert len(windows) >= 2 and len(sizes) >= 2
    assert any(s.scenario.trace.file and "v2025" in s.scenario.trace.file for s in loaded.scenarios)
    families = {
        s.scenario.trace.synthetic.family
        for s in loaded.scenarios
        if s.scenario.trace.synthetic is not None
    }
    assert families == {"bursty", "diurnal", "multinode", "long", "pinned"}


def test_every_suite_scenario_buys_from_the_shipped_market() -> None:
    shipped = load_scenario(default_scenario_path()).scenario
    for loaded in load_suite(SHIPPED_SUITE).scenarios:
        scenario = loaded.scenario
        assert scenario.controller == shipped.controller, scenario.name
        assert scenario.market == shipped.market, scenario.name
        assert scenario.start == shipped.start and scenario.notice_lead_s == shipped.notice_lead_s
        assert scenario.wait_target_s == shipped.wait_target_s
        assert scenario.lower_bound == shipped.lower_bound
        assert scenario.policies == shipped.policies, "run alone, it compares the same policies"


def test_the_shipped_real_scenarios_read_their_traces() -> None:
    for name in ("alibaba-dlrm-serving-14d", "alibaba-openb-early-10d"):
        prepared = prepare(load_scenario(SCENARIOS / f"{name}.yaml"))
        assert len(prepared.selection.jobs) > 500, name
        assert prepared.selection.horizon_s > 9 * DAY


# ---------------------------------------------------------------- bad suite files

GOOD_POLICIES = "policies: [{name: cost-aware}, {name: on-demand}]\n"


@pytest.mark.parametrize(
    ("text", "field", "message"),
    [
        ("name: x\n" + GOOD_POLICIES, "scenarios", "required field is missing"),
        ("name: x\n" + GOOD_POLICIES + "scenarios: []\n", "scenarios", "at least 1"),
        (
            "name: x\n" + GOOD_POLICIES + "scenarios:\n  - {fil: a.yaml}\n",
            "scenarios[0].file",
            "required field is missing",
        ),
        (
            "name: x\n" + GOOD_POLICIES + "scenarios:\n  - {file: missing.yaml}\n",
            "scenarios[0].file",
            "no such scenario file",
        ),
        (
            "name: x\npolicies: [{name: cost-aware}, {name: nope}]\n"
            "scenarios:\n  - {file: a.yaml}\n",
            "policies[1].name",
            "no policy named 'nope'",
        ),
        (
            "name: x\npolicies: [{name: cost-aware, params: {idle_secs: 1}}]\n"
            "scenarios:\n  - {file: a.yaml}\n",
            "policies[0].params.idle_secs",
            "unknown field",
        ),
        (
            "name: x\npolicies: [{name: cost-aware}, {name: cost-aware}]\n"
            "scenarios:\n  - {file: a.yaml}\n",
            "policies[1]",
            "a second policy titled 'cost-aware'",
        ),
        (
            "name: x\ndefault_policy: smart\n" + GOOD_POLICIES + "scenarios:\n  - {file: a.yaml}\n",
            "default_policy",
            "'smart' is not among the policies",
        ),
        (
            "name: x\n" + GOOD_POLICIES + "scenarios:\n  - {file: a.yaml}\n  - {file: a.yaml}\n",
            "scenarios[1].file",
            "already scenarios[0]",
        ),
        (
            "name: x\nscenarios:\n  - {file: b.yaml}\n",
            "scenarios[0].file",
            "does not run the suite's default_policy",
        ),
        (
            "name: x\nextra: 1\n" + GOOD_POLICIES + "scenarios:\n  - {file: a.yaml}\n",
            "extra",
            "unknown field",
        ),
    ],
)
def test_a_bad_suite_file_is_one_error_naming_the_line_and_field(
    tmp_path: Path, text: str, field: str, message: str
) -> None:
    named_scenario(tmp_path / "s", "a", [job_row("a", 0, 60)])
    (tmp_path / "a.yaml").write_text(
        (tmp_path / "s" / "scenario.yaml")
        .read_text()
        .replace("file: trace.csv", "file: s/trace.csv")
        .replace("[prices.csv]", "[s/prices.csv]")
        .replace("file: avail.csv", "file: s/avail.csv")
    )
    b = (tmp_path / "a.yaml").read_text().replace("name: a", "name: b", 1)
    (tmp_path / "b.yaml").write_text(b.replace("  - name: cost-aware\n", ""))
    suite = tmp_path / "suite.yaml"
    suite.write_text(text)
    with pytest.raises(InputError) as caught:
        load_suite(suite)
    error = caught.value
    assert error.where.startswith(str(suite)), error
    assert error.field == field, error
    assert message in error.message, error


def test_the_command_refuses_a_bad_suite_with_exit_2_and_one_line(tmp_path: Path) -> None:
    suite = tmp_path / "suite.yaml"
    suite.write_text("name: x\npolicies: [{name: nope}]\nscenarios:\n  - {file: a.yaml}\n")
    done = run("report", "--suite", str(suite), "--out", str(tmp_path / "out"), cache=tmp_path)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "policies[0].name" in lines[0] and "Traceback" not in done.stderr
    assert not (tmp_path / "out").exists()


def test_suite_does_not_combine_with_a_single_scenario(tmp_path: Path) -> None:
    done = run("report", "--suite", str(SHIPPED_SUITE), "--scenario", "x.yaml", cache=tmp_path)
    assert done.returncode == 2
    assert "--scenario cannot be combined with --suite" in done.stderr


# ---------------------------------------------------------------- end to end


def test_a_small_suite_runs_end_to_end_through_report_suite(tmp_path: Path) -> None:
    jobs = [
        job_row(f"j{i}", i * 1800, 3000 + 200 * (i % 4), preemptible=int(i % 3 != 0))
        for i in range(30)
    ]
    first = named_scenario(tmp_path / "real", "from-a-file", jobs)
    second = synthetic_scenario(
        tmp_path / "gen", "generated", "{family: bursty, jobs: 80, days: 0.5, seed: 3}", 43200
    )
    suite = tmp_path / "suite.yaml"
    suite.write_text(
        "name: tiny\n"
        "policies: [{name: cost-aware}, {name: cheapest-spot}, {name: on-demand}]\n"
        f"scenarios:\n  - file: {first.relative_to(tmp_path)}\n  - file: {second}\n"
    )
    out = tmp_path / "out"
    cache = tmp_path / "cache"
    args = ["report", "--suite", str(suite), "--out", str(out), "--no-progress"]
    done = run(*args, cache=cache)
    assert done.returncode == 0, done.stderr
    report = SuiteReport.model_validate_json((out / "suite.json").read_text())
    assert [s.scenario for s in report.scenarios] == ["from-a-file", "generated"]
    assert list(cache.glob("synthetic-bursty-80j-*.csv")), "the generated trace is cached"
    for result in report.scenarios:
        assert [r.policy for r in result.rows] == ["cost-aware", "cheapest-spot", "on-demand"]
        default = result.rows[0]
        assert default.default and not any(r.default for r in result.rows[1:])
        peers = result.rows[1:]
        cheapest = min(peers, key=lambda r: r.cost)
        assert result.best_peer == cheapest.policy
        assert default.cost > 0 and cheapest.cost > 0
        assert result.peer_over_default == pytest.approx(cheapest.cost / default.cost, rel=1e-3)
        assert cheapest.ratio_to_best_peer == 1.0
        assert result.default_wait_p95_s == default.wait_p95_s
        assert result.peer_wait_within_slack == (cheapest.wait_p95_s <= default.wait_p95_s + 5)
        bound = result.lower_bound
        assert bound is not None and bound.max_wait_s == 120 and bound.cost is not None
        for row in result.rows:
            assert row.cost >= bound.cost - 1e-6
            assert row.ratio_to_lower_bound == pytest.approx(row.cost / bound.cost, rel=1e-3)
            assert row.cloud_idle_share is None or 0 <= row.cloud_idle_share <= 1
            assert row.wait_p50_s <= row.wait_p95_s
    medians = {m.policy: m for m in report.medians}
    assert set(medians) == {"cost-aware", "cheapest-spot", "on-demand"}
    assert report.median_peer_over_default == pytest.approx(
        statistics.median(r.peer_over_default for r in report.scenarios if r.peer_over_default),
        rel=1e-3,
    )
    assert sum(m.cheapest_in for m in medians.values()) >= len(report.scenarios)
    markdown = (out / "suite.md").read_text()
    assert markdown == render_markdown(report)
    assert markdown.strip() in done.stdout
    assert "Median over scenarios of best peer's cost / cost-aware's cost" in markdown

    # a broken suite later leaves the earlier report as it was
    before = (out / "suite.json").read_bytes()
    suite.write_text("name: tiny\nscenarios: []\n")
    assert run(*args, cache=cache).returncode == 2
    assert (out / "suite.json").read_bytes() == before


def test_the_suite_can_skip_the_lower_bound_and_keep_some_policies(tmp_path: Path) -> None:
    first = named_scenario(tmp_path / "real", "only", [job_row("a", 0, 600), job_row("b", 0, 600)])
    suite = tmp_path / "suite.yaml"
    suite.write_text(f"name: one\nscenarios:\n  - file: {first}\n")
    out = tmp_path / "out"
    done = run(
        "report",
        "--suite",
        str(suite),
        "--out",
        str(out),
        "--no-lower-bound",
        "--policy",
        "cost-aware",
        "--policy",
        "on-demand",
        "--no-progress",
        cache=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    report = SuiteReport.model_validate_json((out / "suite.json").read_text())
    (result,) = report.scenarios
    assert [r.policy for r in result.rows] == ["cost-aware", "on-demand"]
    assert result.lower_bound is None and all(r.ratio_to_lower_bound is None for r in result.rows)
    assert result.best_peer == "on-demand"


def test_a_suite_report_with_a_figure_that_is_not_finite_is_never_written(tmp_path: Path) -> None:
    first = named_scenario(tmp_path / "real", "only", [job_row("a", 0, 600)])
    suite = tmp_path / "suite.yaml"
    suite.write_text(f"name: one\nscenarios:\n  - file: {first}\n")
    out = tmp_path / "out"
    done = run(
        "report",
        "--suite",
        str(suite),
        "--out",
        str(out),
        "--no-lower-bound",
        "--no-progress",
        cache=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    report = SuiteReport.model_validate_json((out / "suite.json").read_text())
    (result,) = report.scenarios
    broken = report.model_copy(
        update={
            "scenarios": [
                result.model_copy(
                    update={"rows": [result.rows[0].model_copy(update={"cost": math.nan})]}
                )
            ]
        }
    )
    with pytest.raises(InputError) as caught:
        write_suite(broken, tmp_path / "again")
    assert "cost" in str(caught.value) and "not a finite number" in str(caught.value)
    assert not (tmp_path / "again" / "suite.json").exists()


def test_medians_leave_out_unknown_values() -> None:
    assert median_or_none([None, 3.0, 1.0, None, 2.0]) == 2.0
    assert median_or_none([None, None]) is None


# ---------------------------------------------------------------- the synthetic generator


def rows_of(family: str, jobs: int = 3000, days: float = 10, seed: int = 1) -> list[dict[str, str]]:
    spec = {"family": family, "jobs": jobs, "days": days, "seed": seed}
    return generate(SyntheticTraceSpec.model_validate(spec))


def hourly_arrivals(rows: list[dict[str, str]], days: float) -> list[int]:
    counts = Counter(int(float(r["submit_time_s"]) // 3600) for r in rows)
    return [counts.get(h, 0) for h in range(math.ceil(days * 24))]


def test_a_seed_gives_the_same_trace_and_another_seed_another(tmp_path: Path) -> None:
    spec = SyntheticTraceSpec(family="pinned", jobs=500, days=2, seed=7)
    assert generate(spec) == generate(spec)
    assert generate(spec) != generate(spec.model_copy(update={"seed": 8}))
    path = cached_trace(spec, tmp_path)
    content = path.read_bytes()
    assert cached_trace(spec, tmp_path) == path and path.read_bytes() == content
    other = tmp_path / "other"
    assert cached_trace(spec, other).read_bytes() == content, "regenerated byte for byte"
    with path.open() as handle:
        assert list(csv.DictReader(handle)) == generate(spec)


def test_the_bursty_family_has_a_high_peak_to_mean_arrival_rate() -> None:
    def peak_to_mean(family: str) -> float:
        hours = hourly_arrivals(rows_of(family), 10)
        return max(hours) / statistics.fmean(hours)

    bursty, diurnal = peak_to_mean("bursty"), peak_to_mean("diurnal")
    assert bursty >= 8, bursty
    assert bursty > 2 * diurnal


def test_the_diurnal_family_swings_between_day_and_night() -> None:
    hours = hourly_arrivals(rows_of("diurnal"), 10)
    afternoon = sum(c for h, c in enumerate(hours) if 12 <= h % 24 < 16)
    night = sum(c for h, c in enumerate(hours) if 0 <= h % 24 < 4)
    assert afternoon >= 6 * night, (afternoon, night)


def test_the_multinode_family_has_gangs_of_whole_eight_gpu_nodes() -> None:
    rows = rows_of("multinode")
    shapes = Counter((int(r["num_gpus"]), int(r["num_nodes"])) for r in rows)
    assert shapes[(16, 2)] > 0.1 * len(rows) and shapes[(32, 4)] > 0.05 * len(rows)
    assert {n for (_, n) in shapes} == {1, 2, 4}
    assert all(g // n <= 8 and g % n == 0 for (g, n) in shapes)
    assert sum(c for (g, _), c in shapes.items() if g >= 4) >= 0.6 * len(rows)


def test_the_long_family_is_mostly_hours_and_often_days() -> None:
    durations = [float(r["duration_s"]) for r in rows_of("long", days=30) if r["duration_s"]]
    assert statistics.median(durations) >= 3 * 3600
    assert sum(d > DAY for d in durations) >= 0.05 * len(durations)


def test_the_pinned_family_pins_models_the_shipped_pools_offer() -> None:
    rows = rows_of("pinned")
    pinned = [r["gpu_model"] for r in rows if r["gpu_model"]]
    assert 0.45 <= len(pinned) / len(rows) <= 0.55
    shipped = load_scenario(default_scenario_path()).scenario
    onprem = {n.gpu_model for n in shipped.onprem}
    cloud = {p.gpu_model for p in shipped.controller.pools}
    for model in set(pinned):
        alternatives = model.split("|")
        assert any(gpu_model_matches(w, g) for w in alternatives for g in onprem | cloud), model
    only_onprem = [
        m
        for m in set(pinned)
        if not any(gpu_model_matches(w, g) for w in m.split("|") for g in cloud)
    ]
    assert only_onprem == ["A100-80GB"]
    assert {"A100", "V100"} <= set(pinned)


def test_the_mixed_family_pins_nothing_and_spans_one_node() -> None:
    rows = rows_of("mixed", jobs=1000, days=3)
    assert all(r["gpu_model"] == "" and r["num_nodes"] == "1" for r in rows)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    family=st.sampled_from(sorted(FAMILIES)),
    jobs=st.integers(1, 300),
    days=st.floats(0.05, 5),
    seed=st.integers(0, 10_000),
)
def test_every_family_writes_well_formed_jobs(
    family: str, jobs: int, days: float, seed: int
) -> None:
    rows = rows_of(family, jobs, days, seed)
    assert len(rows) == jobs and len({r["job_id"] for r in rows}) == jobs
    submits = [int(r["submit_time_s"]) for r in rows]
    assert submits == sorted(submits) and submits[0] >= 0 and submits[-1] < days * DAY
    for row in rows:
        gpus, nodes = int(row["num_gpus"]), int(row["num_nodes"])
        assert gpus >= 1 and nodes >= 1 and gpus % nodes == 0
        assert (row["duration_s"] == "") == (row["status"] == "Pending")
        assert row["duration_s"] == "" or int(row["start_time_s"]) + int(row["duration_s"]) <= max(
            int(days * DAY), int(row["start_time_s"])
        )


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_a_scenario_replays_a_generated_trace_of_every_family(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, family: str
) -> None:
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    path = synthetic_scenario(
        tmp_path / "s", family, f"{{family: {family}, jobs: 200, days: 2, seed: 5}}", 2 * DAY
    )
    prepared = prepare(load_scenario(path))
    assert len(prepared.selection.jobs) > 150
    assert len(list((tmp_path / "cache").glob(f"synthetic-{family}-200j-2d-seed5-*.csv"))) == 1


@pytest.mark.parametrize(
    "trace",
    [
        "trace: {file: trace.csv, synthetic: {family: long, jobs: 5, days: 1}}",
        "trace: {window_start_s: 0}",
        "trace: {synthetic: {family: sideways, jobs: 5, days: 1}}",
        "trace: {synthetic: {family: long, jobs: 0, days: 1}}",
    ],
)
def test_a_trace_names_exactly_one_valid_source(tmp_path: Path, trace: str) -> None:
    path = named_scenario(tmp_path / "s", "bad", [job_row("a", 0, 60)], trace=trace)
    with pytest.raises(InputError) as caught:
        load_scenario(path)
    assert caught.value.field is not None and caught.value.field.startswith("trace")


def test_an_unwritable_cache_is_one_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv(CACHE_ENV, str(blocker / "cache"))
    path = synthetic_scenario(tmp_path / "s", "x", "{family: long, jobs: 5, days: 1}", DAY)
    with pytest.raises(InputError) as caught:
        prepare(load_scenario(path))
    assert CACHE_ENV in caught.value.message


# ---------------------------------------------------------------- validate on a suite file


def long_unwindowed_scenario(folder: Path) -> Path:
    """A scenario that leaves its window to a trace whose jobs span over a million 1 s ticks."""
    path = named_scenario(
        folder,
        "too-long",
        jobs=[job_row("a", 0, 60), job_row("b", 1_100_000, 60)],
        trace="trace: {file: trace.csv}",
    )
    path.write_text(path.read_text().replace("tick_seconds: 60", "tick_seconds: 1"))
    return path


def test_validate_checks_a_suite_file_as_report_suite_reads_it(tmp_path: Path) -> None:
    first = named_scenario(tmp_path / "a", "a", [job_row("j", 0, 600)])
    suite = tmp_path / "suite.yaml"
    suite.write_text(
        "name: tiny\npolicies: [{name: cost-aware}, {name: on-demand}]\n"
        f"scenarios:\n  - file: {first.relative_to(tmp_path)}\n"
    )
    done = run("validate", str(suite), cache=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "ok: suite 'tiny', 1 scenarios, 1 jobs, 2 policies" in done.stdout, done.stdout


@pytest.mark.parametrize("command", ["validate", "report"])
def test_a_suite_scenario_too_long_to_replay_is_one_line_naming_its_trace(
    tmp_path: Path, command: str
) -> None:
    first = named_scenario(tmp_path / "a", "a", [job_row("j", 0, 600)])
    second = long_unwindowed_scenario(tmp_path / "b")
    suite = tmp_path / "suite.yaml"
    suite.write_text(
        "name: tiny\npolicies: [{name: cost-aware}]\nscenarios:\n"
        f"  - file: {first.relative_to(tmp_path)}\n  - file: {second.relative_to(tmp_path)}\n"
    )
    out = tmp_path / "out"
    args = (
        ["validate", str(suite)]
        if command == "validate"
        else [
            "report",
            "--suite",
            str(suite),
            "--out",
            str(out),
            "--no-progress",
            "--no-lower-bound",
        ]
    )
    done = run(*args, cache=tmp_path)
    assert done.returncode == 2, done.stderr
    (line,) = [s for s in done.stderr.splitlines() if "warning" not in s]
    assert line.startswith(f"error: {second}:5: trace: the trace spans 1,100,001 ticks"), line
    assert not out.exists()
