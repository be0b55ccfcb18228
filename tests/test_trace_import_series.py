"""Demand series: the jobs inferred from pending and running GPUs over time, the error the
inference states, a scenario that replays a series, and the Prometheus and CSV importers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from test_trace_import import cli, read_csv, replay_report, tiny_scenario

from autoscaler.model.errors import InputError
from autoscaler.sim.demand_series import Inference, InferredJob, infer
from autoscaler.sim.engine import prepare
from autoscaler.sim.scenario import load_scenario

T0 = 1_795_500_000.0


def series(pending: list[float], running: list[float], step: float = 60.0) -> list[Any]:
    return [(T0 + i * step, p, r) for i, (p, r) in enumerate(zip(pending, running, strict=True))]


def write_series(path: Path, pending: list[float], running: list[float]) -> Path:
    rows = ["time_s,pending_gpus,running_gpus"]
    rows += [f"{t:.0f},{p:g},{r:g}" for t, p, r in series(pending, running)]
    path.write_text("\n".join(rows) + "\n")
    return path


def running_at(inference: Inference, t: float) -> int:
    return sum(1 for j in inference.jobs if j.start <= t and (j.end is None or j.end > t))


def test_a_queue_that_fills_then_runs_is_two_jobs_waiting_then_running() -> None:
    inference = infer(series([0, 2, 0, 0], [0, 0, 2, 0]))
    assert inference.jobs == [InferredJob(60.0, 120.0, 180.0, False)] * 2
    assert inference.running_error == 0.0
    assert inference.series_pending_gpu_s == inference.inferred_pending_gpu_s == 2 * 60


def test_running_falling_while_pending_rises_is_ends_and_new_arrivals() -> None:
    inference = infer(series([0, 1], [1, 0]))  # a preemption or requeue looks like this
    assert inference.jobs == [InferredJob(0.0, 0.0, 60.0, True)]
    assert inference.pending_at_end == 1


def test_a_queue_that_empties_without_running_is_not_replayed_and_counted() -> None:
    inference = infer(series([3, 0, 0], [1, 1, 1]))
    # the queue drains as jobs finish: the running job ends and the oldest pending one starts;
    # the other two left the queue without being seen running
    assert inference.left_unseen == 2
    assert inference.jobs == [
        InferredJob(0.0, 0.0, 60.0, True),
        InferredJob(0.0, 60.0, None, False),
    ]
    assert inference.carried == 1 and inference.running_at_end == 1


def test_rounding_to_jobs_of_several_gpus_is_the_stated_error() -> None:
    inference = infer(series([0, 0, 0], [3, 5, 0]), job_gpus=4)
    # 3 and 5 GPUs round to one job of 4: 4 GPU-minutes twice against 3 and 5 in the series
    assert inference.series_running_gpu_s == 8 * 60
    assert inference.inferred_running_gpu_s == 8 * 60
    inference = infer(series([0, 0, 0], [3, 3, 0]), job_gpus=4)
    assert inference.running_error == pytest.approx(4 / 3 - 1)
    assert "+33.33%" in inference.lines()[1]


values = st.lists(st.integers(0, 12), min_size=2, max_size=40)


@given(data=st.data())
def test_the_inferred_jobs_hold_the_series_running_gpus_at_every_sample(data: Any) -> None:
    running = data.draw(values)
    pending = data.draw(st.lists(st.integers(0, 12), min_size=len(running), max_size=len(running)))
    steps = data.draw(st.lists(st.sampled_from([1.0, 15.0, 60.0]), min_size=len(running)))
    samples = []
    t = T0
    for p, r, step in zip(pending, running, steps, strict=False):
        samples.append((t, float(p), float(r)))
        t += step
    inference = infer(samples)
    for sample_t, _, r in samples:
        assert running_at(inference, sample_t - T0) == r
    assert inference.running_error in (None, 0.0)
    assert inference.inferred_pending_gpu_s == inference.series_pending_gpu_s
    arrived = (
        pending[0]
        + running[0]
        + sum(
            max(0, (p1 + r1) - (p0 + r0)) + max(0, (r0 - r1) - max(0, (p0 + r0) - (p1 + r1)))
            for p0, r0, p1, r1 in zip(pending, running, pending[1:], running[1:], strict=False)
        )
    )
    assert len(inference.jobs) + inference.left_unseen + inference.pending_at_end == arrived
    for job in inference.jobs:
        assert job.submit <= job.start and (job.end is None or job.end > job.start)


@given(
    running=st.lists(st.floats(0, 500, allow_nan=False), min_size=2, max_size=30),
    job_gpus=st.integers(1, 16),
)
def test_the_rounding_error_is_at_most_half_a_job_per_sample(
    running: list[float], job_gpus: int
) -> None:
    inference = infer(series([0.0] * len(running), running), job_gpus)
    bound = job_gpus / 2 * inference.span_s
    assert abs(inference.inferred_running_gpu_s - inference.series_running_gpu_s) <= bound + 1e-6


def test_a_scenario_replays_a_series_and_its_report_states_the_inference(tmp_path: Path) -> None:
    pending = [0, 2, 2, 0, 0, 3, 0, 3]
    running = [2, 2, 3, 5, 4, 4, 1, 1]
    # 2 running at the start; 2 arrive at 60 s and 1 at 120 s, all running by 180 s; 3 arrive
    # at 300 s, of which 1 starts at 360 s as 4 end and 2 leave unseen; 3 arrive at 420 s
    write_series(tmp_path / "series.csv", pending, running)
    path = tiny_scenario(tmp_path, "{series: {file: series.csv}}", start="2026-11-24T00:00:00Z")
    prepared = prepare(load_scenario(path))
    jobs = prepared.selection.jobs
    assert len(jobs) == len(infer(series(pending, running)).jobs) == 6
    assert sum(j.carried for j in jobs) == 2
    assert prepared.selection.skipped == {
        "inferred jobs pending at the series' end (run time unknown)": 3,
        "inferred jobs that left the queue unseen running": 2,
    }
    report = replay_report(path, tmp_path / "report")
    window = report["window"]
    assert "demand series, replayed as 6 inferred jobs of 1 GPU(s)" in window["trace"]
    assert "in the series vs 0.3 in the jobs (+0.00%)" in window["trace"], window["trace"]
    assert "2 left the queue unseen running and 3 pending at the end" in window["trace"]
    assert window["jobs"] == 6 and window["carried_jobs"] == 2
    assert "demand series" in (tmp_path / "report" / "report.md").read_text()


def test_a_window_of_a_series_carries_in_what_runs_at_its_start(tmp_path: Path) -> None:
    write_series(tmp_path / "series.csv", [0, 0, 0, 0, 0], [2, 4, 4, 4, 2])
    path = tiny_scenario(
        tmp_path,
        "{series: {file: series.csv, job_gpus: 2}, window_start_s: 90, window_end_s: 240}",
    )
    jobs = prepare(load_scenario(path)).selection.jobs
    # one 2-GPU job runs throughout, one from 60 s to 240 s: both carried in at 90 s
    assert [(j.submit, j.duration, j.gpus, j.carried) for j in jobs] == [
        (0.0, 150.0, 2, True),
        (0.0, 150.0, 2, True),
    ]


def test_a_scenario_names_one_source_of_jobs(tmp_path: Path) -> None:
    write_series(tmp_path / "series.csv", [0, 0], [1, 1])
    path = tiny_scenario(tmp_path, "{file: t.csv, series: {file: series.csv}}")
    with pytest.raises(InputError) as caught:
        load_scenario(path)
    assert caught.value.where == f"{path}:5"
    assert "give exactly one of file" in caught.value.message


BAD_SERIES = [
    ("time_s,pending_gpus,running_gpus\n60,0,1\n0,0,1\n", ":3: time_s:", "after the previous"),
    ("time_s,pending_gpus,running_gpus\n0,-1,1\n60,0,1\n", ":2: pending_gpus:", ">= 0"),
    ("time_s,pending_gpus,running_gpus\n0,0,1\n", "", "at least two samples"),
    ("time_s,pending_gpus\n0,0\n60,0\n", ":1:", "running_gpus"),
    ("time_s,pending_gpus,running_gpus\n0,0,1\n60,0,NaN\n", ":3: running_gpus:", "number"),
    ("time_s,pending_gpus,running_gpus\n0,0,1\n40000000,0,1\n", "", "days"),
]


@pytest.mark.parametrize(("text", "where", "says"), BAD_SERIES)
def test_a_bad_series_named_by_a_scenario_is_one_line_naming_its_line(
    tmp_path: Path, text: str, where: str, says: str
) -> None:
    series_file = tmp_path / "series.csv"
    series_file.write_text(text)
    path = tiny_scenario(tmp_path, "{series: {file: series.csv}}")
    run = cli("validate", path)
    assert run.rc == 2
    assert run.err.count("\n") == 1
    assert run.err.startswith(f"error: {series_file.resolve()}{where}"), run.err
    assert says in run.err


def test_a_dashboard_csv_imports_with_its_own_columns_and_iso_times(tmp_path: Path) -> None:
    source = tmp_path / "dash.csv"
    source.write_text(
        "when,queued,busy\n"
        "2026-11-24T00:00:00Z,0,4\n2026-11-24T00:01:00Z,2,4\n2026-11-24T00:02:00Z,0,6\n"
    )
    out = tmp_path / "series.csv"
    run = cli(
        "trace", "import", "csv", source, "--out", out, "--time-column", "when",
        "--pending-column", "queued", "--running-column", "busy",
    )  # fmt: skip
    assert run.rc == 0, run.err
    assert read_csv(out) == [
        {"time_s": "1795478400", "pending_gpus": "0", "running_gpus": "4"},
        {"time_s": "1795478460", "pending_gpus": "2", "running_gpus": "4"},
        {"time_s": "1795478520", "pending_gpus": "0", "running_gpus": "6"},
    ]
    assert "6 jobs of 1 GPU inferred from 3 samples" in run.out
    assert "trace: {series: {file:" in run.out
    source.write_text("when,queued,busy\n2026-11-24T00:00:00Z,0,4\nyesterday,1,1\n")
    run = cli("trace", "import", "csv", source, "--out", out, "--time-column", "when",
              "--pending-column", "queued", "--running-column", "busy")  # fmt: skip
    assert run.rc == 2 and run.err.startswith(f"error: {source}:3: when: expected an ISO-8601")


def answer(*series_values: list[tuple[float, str]], labels: str = "partition") -> dict[str, Any]:
    return {
        "status": "success",
        "data": {
            "resultType": "matrix",
            "result": [
                {"metric": {labels: f"p{i}"}, "values": [[t, v] for t, v in values]}
                for i, values in enumerate(series_values)
            ],
        },
    }


def test_prometheus_answers_sum_their_series_and_fill_a_missed_scrape(tmp_path: Path) -> None:
    pending = tmp_path / "pending.json"
    running = tmp_path / "running.json"
    pending.write_text(
        json.dumps(
            answer(
                [(T0, "1"), (T0 + 60, "2"), (T0 + 180, "0")],  # the scrape at +120 missed
                [(T0 + 60, "1"), (T0 + 120, "1")],  # a partition with demand only a while
            )
        )
    )
    running.write_text(json.dumps(answer([(T0 + t, "3") for t in (0, 60, 120, 180, 240)])))
    out = tmp_path / "series.csv"
    run = cli("trace", "import", "prometheus", "--pending", pending, "--running", running,
              "--out", out)  # fmt: skip
    assert run.rc == 0, run.err
    assert [(r["time_s"], r["pending_gpus"]) for r in read_csv(out)] == [
        (f"{T0 + t:.0f}", p) for t, p in ((0, "1"), (60, "3"), (120, "3"), (180, "0"))
    ]
    assert "1 missing points inside a series took its previous value" in run.out


def _matrix(**changes: Any) -> dict[str, Any]:
    document = answer([(T0, "1"), (T0 + 60, "2")])
    document.update(changes)
    return document


BAD_ANSWERS: list[tuple[Any, str, str]] = [
    ({"status": "error", "error": "parse error at char 5"}, "status:", "query failed"),
    (_matrix(data={"resultType": "vector", "result": []}), "data.resultType:", "query_range"),
    (_matrix(data={"resultType": "matrix", "result": []}), "data.result:", "matched nothing"),
    (answer([(T0, "NaN"), (T0 + 60, "1")]), "data.result[0].values[0][1]:", "vector(0)"),
    (answer([(T0, "1"), (T0 - 60, "1")]), "data.result[0].values[1][0]:", "after"),
    (answer([(T0, "1"), (T0 + 60, "-2")]), "data.result[0].values[1][1]:", "from 0"),
    (answer([(T0, "1"), (T0 + 60, 2)]), "data.result[0].values[1][1]:", "expected text"),
    (answer([(T0, "1"), (1e12, "1")]), "data.result[0].values[1][0]:", "2100"),
    (
        {
            "status": "success",
            "data": {"resultType": "matrix", "result": [{"values": [[T0, "1", 5]]}]},
        },
        "data.result[0].values[0]:",
        "[time, value]",
    ),
]


@pytest.mark.parametrize(("document", "field", "says"), BAD_ANSWERS)
def test_a_bad_prometheus_answer_is_one_line_naming_its_field(
    tmp_path: Path, document: Any, field: str, says: str
) -> None:
    bad = tmp_path / "pending.json"
    bad.write_text(json.dumps(document, indent=2))
    good = tmp_path / "running.json"
    good.write_text(json.dumps(answer([(T0, "1"), (T0 + 60, "1")])))
    run = cli("trace", "import", "prometheus", "--pending", bad, "--running", good,
              "--out", tmp_path / "s.csv")  # fmt: skip
    assert run.rc == 2
    assert run.err.count("\n") == 1
    assert run.err.startswith(f"error: {bad}:"), run.err
    assert f": {field} " in run.err and says in run.err, run.err


def test_answers_over_different_ranges_are_refused(tmp_path: Path) -> None:
    pending = tmp_path / "pending.json"
    running = tmp_path / "running.json"
    pending.write_text(json.dumps(answer([(T0, "1"), (T0 + 60, "1")])))
    running.write_text(json.dumps(answer([(T0 + 600, "1"), (T0 + 660, "1")])))
    run = cli("trace", "import", "prometheus", "--pending", pending, "--running", running,
              "--out", tmp_path / "s.csv")  # fmt: skip
    assert run.rc == 2 and "share no time range" in run.err


def test_a_series_elsewhere_is_shown_by_its_name_with_the_whole_statement(tmp_path: Path) -> None:
    elsewhere = tmp_path / "exports" / "prometheus"
    elsewhere.mkdir(parents=True)
    series_file = write_series(elsewhere / "series.csv", [0, 1, 0], [1, 1, 2])
    folder = tmp_path / "scenario"
    folder.mkdir()
    path = tiny_scenario(folder, f"{{series: {{file: {series_file}}}}}")
    prepared = prepare(load_scenario(path))
    assert prepared.selection.notes == tuple(infer(series([0, 1, 0], [1, 1, 2])).lines())
    trace = replay_report(path, tmp_path / "report")["window"]["trace"]
    assert trace.startswith("series.csv (demand series, replayed as 2 inferred jobs")
    assert trace.endswith("see trace-import.md in the docs)")
