"""Issue 15's failures at the source boundaries, one test per named example: hostile or broken
``squeue``/``sinfo --json``, exposition text and Prometheus answers end in a bounded reading or
one ``SourceError`` line; never negative or guessed demand, never a traceback, never one bad
record, sample or target taking the good ones down, never a reading from the future freezing a
GPU's idle state."""

from __future__ import annotations

import json
import logging
import math
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from answer_server import AnswerServer
from exporter_server import Answer, ExporterServer

from autoscaler.fleet.telemetry import FUTURE_SKEW_S, IdleTracker
from autoscaler.model import OnPremUse, Placement
from autoscaler.model.clock import ManualClock
from autoscaler.model.errors import InputError, SourceError
from autoscaler.sources.exposition import ExpositionError, read_exposition
from autoscaler.sources.prometheus import (
    PrometheusQueueSettings,
    PrometheusQueueSource,
    PrometheusTelemetrySettings,
    PrometheusTelemetrySource,
    parse_query_response,
)
from autoscaler.sources.scrape import ScrapeSettings, ScrapeTelemetrySource
from autoscaler.sources.slurm import DEFAULT_IGNORED_REASONS, SlurmAdapter, SlurmSettings
from autoscaler.sources.slurm_json import (
    DemandRules,
    active_jobs_on,
    count_array_tasks,
    demand_groups,
    read_nodes,
    read_running_jobs,
)
from autoscaler.sources.static import StaticQueueSource
from autoscaler.spi.job_shape import BadShapeError, JobShape, ShapeReader
from autoscaler.spi.sources import GpuSample

RULES = DemandRules(ignored_reasons=frozenset(DEFAULT_IGNORED_REASONS), high_priority_min=1000)
NOW = 1_795_249_300.0
DEEP = "[" * 100_000 + "]" * 100_000


def job(job_id: int, **fields: Any) -> dict[str, Any]:
    return {
        "job_id": job_id,
        "job_state": "PENDING",
        "state_reason": "Priority",
        "partition": "gpu",
        "tres_per_node": "gres:gpu:1",
        "node_count": 1,
        "tasks": 1,
        "submit_time": 1000,
        "priority": 1,
        "comment": "",
        "array_task_string": "",
        "array_max_tasks": 0,
        **fields,
    }


def squeue(*jobs: Any) -> str:
    return json.dumps({"meta": {}, "errors": [], "jobs": list(jobs)})


def one_line(error: BaseException) -> str:
    message = str(error)
    assert "\n" not in message and len(message) < 600, message[:300]
    return message


# ---- Slurm -------------------------------------------------------------------------------


@pytest.fixture
def fake_slurm(tmp_path: Path) -> Iterator[tuple[SlurmAdapter, Path]]:
    """The adapter running a real ``squeue`` program that prints what the test wrote."""
    output = tmp_path / "squeue.json"
    program = tmp_path / "squeue"
    program.write_text(f"#!/bin/sh\ncat '{output}'\n")
    program.chmod(program.stat().st_mode | stat.S_IXUSR)
    adapter = SlurmAdapter(SlurmSettings(bin_dir=str(tmp_path), high_priority_min=1000))
    yield adapter, output


@pytest.mark.parametrize("spec", ["5-1", "9-0:2", "1--3"])
def test_a_backward_array_range_is_unknown_demand_never_negative(
    fake_slurm: tuple[SlurmAdapter, Path], spec: str
) -> None:
    """The issue's example: one 4-GPU job and a 2-GPU array whose range runs backwards read as
    -2 jobs and -2 GPUs. Slurm never prints such a range, so the read fails, naming the job and
    field, and demand is unknown for the tick (never zero, never negative)."""
    adapter, output = fake_slurm
    output.write_text(
        squeue(
            job(1, tres_per_node="gres:gpu:4"),
            job(2, tres_per_node="gres:gpu:2", array_task_string=spec),
        )
    )
    with pytest.raises(SourceError) as failure:
        adapter.read(NOW)
    assert one_line(failure.value) == (
        f"squeue --json: job 2: array_task_string '{spec}' is not an array range"
    )


@pytest.mark.parametrize(
    "spec", ["²", "٣", "1_0", "0x10", " 1", "1-", "0-9%", "%3", "3,1", "1,1", "0-4000001", "0-9:0"]
)
def test_a_garbage_array_spec_is_not_read_as_one_task(spec: str) -> None:
    with pytest.raises(SourceError, match="is not an array range"):
        demand_groups(squeue(job(1, array_task_string=spec)), RULES)
    with pytest.raises(ValueError):
        count_array_tasks(spec, 0)


@pytest.mark.parametrize(
    ("spec", "throttle", "tasks"),
    [
        ("", 0, 1),
        ("7", 0, 1),
        ("0-99:2%8", 0, 8),
        ("1,3,5-7", 0, 5),
        ("0-9:3", 0, 4),
        ("0-4000000", 0, 4_000_001),
        ("0-9", 3, 3),
        ("0-9%0", 3, 10),
    ],
)
def test_array_ranges_as_slurm_prints_them(spec: str, throttle: int, tasks: int) -> None:
    assert count_array_tasks(spec, throttle) == tasks


@pytest.mark.parametrize("command", ["squeue", "running", "drain", "sinfo"])
def test_deeply_nested_output_is_one_line_not_a_recursion_error(command: str) -> None:
    for text in (DEEP, '{"jobs": [{"job_id": 1, "x": ' + DEEP + '}], "nodes": ' + DEEP + "}"):
        with pytest.raises(SourceError, match=r"nested deeper|not JSON") as failure:
            if command == "squeue":
                demand_groups(text, RULES)
            elif command == "running":
                read_running_jobs(text, RULES)
            elif command == "drain":
                active_jobs_on(text, "n1")
            else:
                read_nodes(text, "gpu-autoscaler")
        one_line(failure.value)


def test_a_job_listed_twice_is_corrupted_output_not_twice_the_demand() -> None:
    record = job(41, tres_per_node="gres:gpu:8")
    with pytest.raises(SourceError, match="job 41: is listed twice"):
        demand_groups(squeue(record, job(7), record), RULES)


@pytest.mark.parametrize(
    ("fields", "complaint"),
    [
        ({"submit_time": 2**64}, "submit_time an integer beyond 64 bits"),
        ({"submit_time": 10**400}, "submit_time an integer beyond 64 bits"),
        ({"submit_time": -5}, "submit_time -5 is not a time"),
        ({"submit_time": 253402300800}, "is not a time"),
        ({"priority": 10**40}, "priority an integer beyond 64 bits"),
        ({"priority": 1.5}, "priority 1.5 is not an integer"),
        ({"job_id": -1}, "job_id -1 is not a job id"),
        ({"job_id": "7"}, "job_id '7' is not an integer"),
        ({"tres_per_node": "gres:gpu:²"}, "is not a GPU count"),
        ({"tres_per_node": "gres:gpu:" + "9" * 30}, "is not a GPU count"),
        ({"state_reason": "x" * 70_000, "job_state": {"a": 1}}, "job_state a JSON object"),
        ({"comment": ["x"]}, "comment a JSON list is not a string"),
    ],
)
def test_an_unreadable_field_fails_the_read_in_one_bounded_line(
    fields: dict[str, Any], complaint: str
) -> None:
    with pytest.raises(SourceError) as failure:
        demand_groups(squeue(job(1), {**job(9), **fields}), RULES)
    assert complaint in one_line(failure.value)


def test_numbers_no_decoder_holds_are_one_line() -> None:
    text = squeue(job(1)).replace('"submit_time": 1000', '"submit_time": 1e999')
    with pytest.raises(SourceError, match="not JSON"):
        demand_groups(text, RULES)
    with pytest.raises(SourceError, match="not JSON"):
        demand_groups(squeue(job(1)).replace("1000", "NaN"), RULES)


@pytest.mark.parametrize(
    "errors", [["x"], [{"error": "bad\nthing"}], "str", [{}], 5, {"error": "x"}, [{"e": 1}]]
)
def test_an_errors_field_of_any_shape_is_one_line(errors: Any) -> None:
    text = json.dumps({"errors": errors, "jobs": [], "nodes": []})
    for read in (lambda: demand_groups(text, RULES), lambda: read_nodes(text, "x")):
        with pytest.raises(SourceError, match="Slurm reported an error") as failure:
            read()
        one_line(failure.value)


@pytest.mark.parametrize(
    "node",
    [
        {"state_flags": [{}]},
        {"state_flags": "DRAIN"},
        {"partitions": [{}]},
        {"partitions": 5},
        {"gres": "gpu:1025"},
        {"gres": "gpu:a100:" + "9" * 30},
        {"gres_used": "gpu:²"},
    ],
)
def test_an_unreadable_node_is_one_line_not_a_type_error(node: dict[str, Any]) -> None:
    base = {"name": "n1", "gres": "gpu:a100:4", "state": "idle", "partitions": ["gpu"]}
    text = json.dumps({"nodes": [{**base, **node}]})
    with pytest.raises(SourceError, match=r"^sinfo --json: node n1: ") as failure:
        read_nodes(text, "gpu-autoscaler", partitions=frozenset({"gpu"}))
    one_line(failure.value)


def test_placement_never_names_a_cloud_node_that_is_not_a_node_name() -> None:
    updates: list[tuple[str, ...]] = []

    class Fed(SlurmAdapter):
        def _run(self, *args: str) -> bytes:
            if args[0] == "sinfo":
                return json.dumps({"nodes": nodes}).encode()
            updates.append(args)
            return b""

    nodes = [
        {"name": "i-0abc", "features": "gpu-autoscaler", "weight": 1},
        {"name": "i-0def", "features": ["gpu-autoscaler"], "weight": 1000},
    ]
    adapter = Fed(SlurmSettings())
    adapter.apply_placement(Placement(spot_safe_onprem=OnPremUse.FIRST))
    assert updates == [("scontrol", "update", "nodename=i-0abc", "weight=1000")]
    nodes.append({"name": "a,b --all", "features": "gpu-autoscaler", "weight": 1})
    with pytest.raises(SourceError, match="is not a node name"):
        adapter.apply_placement(Placement(spot_safe_onprem=OnPremUse.FIRST))


# ---- Exposition and scrape ------------------------------------------------------------------

GOOD = 'DCGM_FI_DEV_GPU_UTIL{gpu="0",Hostname="good"} 97\n'


@pytest.mark.parametrize(
    "line",
    [
        'DCGM_FI_DEV_GPU_UTIL{gpu="0",Hostname="bad"} 1e999',
        'DCGM_FI_DEV_GPU_UTIL{gpu="0",Hostname="bad"} ' + "1" * 400,
        'DCGM_FI_DEV_GPU_UTIL{gpu="0",Hostname="bad"} 5 ' + "9" * 400,
        'DCGM_FI_DEV_GPU_UTIL{gpu="0",Hostname="bad"} 5 ' + "9" * 30,
        'DCGM_FI_DEV_GPU_UTIL{gpu="0",Hostname="bad"} 5 ' + str(int((NOW + 3600) * 1000)),
        'DCGM_FI_DEV_GPU_UTIL{gpu="0",Hostname="bad"} 5 -5',
        'DCGM_FI_DEV_GPU_UTIL{gpu="0",Hostname="bad"} 5 1e3',
        'DCGM_FI_DEV_GPU_UTIL{gpu="0",Hostname="bad"} ٣',
        'DCGM_FI_DEV_GPU_UTIL{gpu="0",Hostname="bad"} 1_0',
        'DCGM_FI_DEV_GPU_UTIL{gpu="0",Hostname="bad"} 100.5',
        'DCGM_FI_DEV_FB_USED{gpu="1",Hostname="bad"} 1e300',
        'DCGM_FI_DEV_GPU_UTIL{Hostname="bad"} 5',
    ],
)
def test_a_bad_sample_leaves_its_node_unknown_and_the_others_read(line: str) -> None:
    text = 'DCGM_FI_DEV_GPU_UTIL{gpu="1",Hostname="bad"} 0\n' + line + "\n" + GOOD
    read = read_exposition(text, NOW)
    assert [(s.host, s.util_pct) for s in read.samples] == [("good", 97.0)]
    assert read.unknown_hosts == {"bad"} and read.unread == 1
    assert read.problems[0].startswith("line 2: ")
    assert "\n" not in read.problems[0] and len(read.problems[0]) < 300


def test_a_line_naming_no_node_leaves_the_whole_text_unread() -> None:
    for line in ('DCGM_FI_DEV_GPU_UTIL{gpu="0"} 5', 'DCGM_FI_DEV_GPU_UTIL{gpu="0",Hostname=x} 5'):
        with pytest.raises(ExpositionError, match=r"^line 2: "):
            read_exposition(GOOD + line + "\n", NOW)


def test_a_timestamp_within_the_skew_is_kept() -> None:
    ahead = int((NOW + FUTURE_SKEW_S - 1) * 1000)
    (sample,) = read_exposition(GOOD.replace(" 97", f" 97 {ahead}"), NOW).samples
    assert sample.at == pytest.approx(NOW + FUTURE_SKEW_S - 1)


def test_a_huge_timestamp_in_one_exporter_loses_no_other_targets_readings(
    exporters: ExporterServer, caplog: pytest.LogCaptureFixture
) -> None:
    """The issue: one exporter's huge timestamp failed the whole scrape (an OverflowError out
    of the thread pool), losing every good target's readings."""
    exporters.answers["/a"] = Answer('DCGM_FI_DEV_GPU_UTIL{gpu="0",Hostname="a"} 40\n')
    exporters.answers["/b"] = Answer('DCGM_FI_DEV_GPU_UTIL{gpu="0",Hostname="b"} 0\n')
    exporters.answers["/huge"] = Answer(
        'DCGM_FI_DEV_GPU_UTIL{gpu="0",Hostname="c"} 3 ' + "9" * 400 + "\n"
        'DCGM_FI_DEV_GPU_UTIL{gpu="0",Hostname="d"} 1e999\n'
        'DCGM_FI_DEV_GPU_UTIL{gpu="0",Hostname="e"} 12\n'
    )
    urls = [exporters.url(path) for path in ("/a", "/b", "/huge")]
    scraper = ScrapeTelemetrySource(ScrapeSettings(targets=tuple(urls)), "agents", ManualClock(NOW))
    with caplog.at_level(logging.WARNING):
        samples = scraper.read_gpus(NOW)
    assert sorted((s.host, s.util_pct) for s in samples) == [("a", 40.0), ("b", 0.0), ("e", 12.0)]
    status = scraper.target_status()
    assert status[urls[0]] is None and status[urls[1]] is None
    assert "2 line(s) unread, node(s) left unknown: 'c', 'd'" in str(status[urls[2]])
    assert "is not milliseconds" in str(status[urls[2]])
    assert "1 of 3 targets failed" in caplog.text
    scraper.close()


def test_a_scrape_problem_naming_odd_hosts_is_one_line(exporters: ExporterServer) -> None:
    exporters.answers["/x"] = Answer(
        'DCGM_FI_DEV_GPU_UTIL{gpu="0",Hostname="a\\nb"} NaN\n'
        'DCGM_FI_DEV_GPU_UTIL{gpu="0",Hostname="ok"} 1\n'
    )
    scraper = ScrapeTelemetrySource(
        ScrapeSettings(targets=(exporters.url("/x"),)), "agents", ManualClock(NOW)
    )
    assert [s.host for s in scraper.read_gpus(NOW)] == ["ok"]
    assert "\n" not in str(scraper.target_status()[exporters.url("/x")])
    scraper.close()


# ---- The idle state ------------------------------------------------------------------------


def test_a_reading_from_the_future_does_not_freeze_a_gpus_idle_state() -> None:
    """The issue: one reading stamped in the future stood as the GPU's latest for good, so every
    busy reading after it was ignored and the node never went stale."""
    tracker = IdleTracker(5.0, 600.0, 180.0)
    tracker.observe([GpuSample("n1", "0", 90.0, at=NOW - 30)])
    tracker.observe([GpuSample("n1", "0", 0.0, at=NOW + 10**6)])
    assert "n1" not in tracker.nodes(NOW), "a node with a reading from the future is unknown"
    tracker.observe([GpuSample("n1", "0", 95.0, at=NOW + 10)])
    assert tracker.nodes(NOW + 10)["n1"].idle_since is None, "the busy reading counts"
    tracker.observe([GpuSample("n1", "0", 0.0, at=NOW + 20)])
    assert tracker.nodes(NOW + 20)["n1"].idle_since == NOW + 10
    assert "n1" not in tracker.nodes(NOW + 400), "and the node still goes stale"


def test_a_busy_reading_out_of_order_is_not_ignored() -> None:
    tracker = IdleTracker(5.0, 600.0, 180.0)
    tracker.observe([GpuSample("n1", "0", 0.0, at=NOW - 100)])
    tracker.observe([GpuSample("n1", "0", 0.0, at=NOW + FUTURE_SKEW_S - 1)])
    tracker.observe([GpuSample("n1", "0", 90.0, at=NOW)])
    idle_since = tracker.nodes(NOW)["n1"].idle_since
    assert idle_since is None or idle_since >= NOW


@pytest.mark.parametrize(
    ("util", "at"), [(math.nan, NOW), (150.0, NOW), (-1.0, NOW), (5.0, math.inf), (5.0, math.nan)]
)
def test_a_reading_that_is_no_reading_leaves_its_node_unknown(util: float, at: float) -> None:
    tracker = IdleTracker(5.0, 600.0, 180.0)
    tracker.observe([GpuSample("n1", "0", 0.0, at=NOW - 5), GpuSample("n2", "0", 0.0, at=NOW)])
    tracker.observe([GpuSample("n1", "1", util, at=at)])
    assert set(tracker.nodes(NOW)) == {"n2"}


# ---- PromQL answers ------------------------------------------------------------------------

WHERE = "prometheus source 'work'"


def vector(*rows: Any) -> bytes:
    result = [{"metric": {"queue": "a"}, "value": row} for row in rows]
    answer = {"status": "success", "data": {"resultType": "vector", "result": result}}
    return json.dumps(answer).encode()


@pytest.mark.parametrize(
    ("body", "complaint"),
    [
        (vector([NOW, "NaN"]), "is NaN"),
        (vector([NOW, "+Inf"]), "is +Inf"),
        (vector([NOW, "-1"]), "is negative"),
        (vector([NOW, "1e308"]), "more than 100,000,000 jobs"),
        (vector([NOW, "60000000"], [NOW, "60000000"]), "more than 100,000,000 jobs"),
        (vector([NOW, 5]), "not a Prometheus API response"),
        (vector([True, "5"]), "not a Prometheus API response"),
        (vector([NOW, "٣"]), "has value '٣'"),
        (vector([NOW, "1_000"]), "has value '1_000'"),
        (vector([NOW, " 5"]), "has value ' 5'"),
        (vector([NOW + 10**6, "5"]), "in the future"),
        (vector([NOW, "5", 1]), "not a Prometheus API response"),
        (
            b'{"status":"success","data":{"resultType":"vector","result":' + DEEP.encode() + b"}}",
            "nested deeper",
        ),
        (
            b'{"status":"success","data":{"resultType":"vector","result":[{"value":[1e999,"1"]}]}}',
            "not a Prometheus API response",
        ),
        (
            b'{"status":"success","data":{"resultType":"vector","result":[{"value":[NaN,"1"]}]}}',
            "not JSON",
        ),
        (
            json.dumps(
                {
                    "status": "success",
                    "data": {
                        "resultType": "vector",
                        "result": [{"metric": {"queue": 5}, "value": [NOW, "1"]}],
                    },
                }
            ).encode(),
            "not a Prometheus API response",
        ),
        (
            b'{"status":"success","data":{"resultType":"vector","result":['
            + b'{"value":[1795249300,"1"]},' * 100_000
            + b'{"value":[1795249300,"1"]}]}}',
            "length <= 100000",
        ),
        (
            json.dumps({"status": "error", "errorType": "x\ny", "error": "z\n" * 100_000}).encode(),
            "Prometheus says x y: z z z",
        ),
    ],
)
def test_a_malformed_answer_is_never_demand(body: bytes, complaint: str) -> None:
    server = AnswerServer()
    try:
        server.answer("/api/v1/query", body)
        source = PrometheusQueueSource(
            PrometheusQueueSettings(url=server.url(""), query="q", partition_label="queue"),
            "work",
        )
        with pytest.raises(SourceError) as failure:
            source.read(NOW)
        message = one_line(failure.value)
        assert message.startswith(WHERE) and complaint in message, message
    finally:
        server.close()


def test_a_finite_answer_parses_to_finite_samples() -> None:
    (sample,) = parse_query_response(vector([NOW, "2.5"]), WHERE)
    assert (sample.at, sample.value) == (NOW, 2.5)


def gpu_answer(rows: list[tuple[str, str, Any]], at: float = NOW) -> bytes:
    result = [
        {"metric": {"Hostname": host, "gpu": gpu}, "value": [at, value]}
        for host, gpu, value in rows
    ]
    answer = {"status": "success", "data": {"resultType": "vector", "result": result}}
    return json.dumps(answer).encode()


@pytest.fixture
def prometheus_answers() -> Iterator[AnswerServer]:
    server = AnswerServer()
    yield server
    server.close()


def serve_gpus(server: AnswerServer, util: bytes, stamps: bytes, memory: bytes) -> None:
    server.answer("/api/v1/query", util, query="DCGM_FI_DEV_GPU_UTIL")
    server.answer("/api/v1/query", stamps, query="timestamp(DCGM_FI_DEV_GPU_UTIL)")
    server.answer("/api/v1/query", memory, query="DCGM_FI_DEV_FB_USED")


def test_one_hosts_bad_reading_leaves_that_host_unknown_and_the_others_read(
    prometheus_answers: AnswerServer, caplog: pytest.LogCaptureFixture
) -> None:
    util = gpu_answer([("a", "0", "40"), ("b", "0", "NaN"), ("c", "0", "0"), ("d", "0", "7")])
    stamps = gpu_answer(
        [
            ("a", "0", str(NOW - 5)),
            ("b", "0", str(NOW)),
            ("c", "0", str(NOW + 10**6)),
            ("d", "0", str(NOW)),
        ]
    )
    memory = gpu_answer([("a", "0", "100"), ("d", "0", "1e300")])
    serve_gpus(prometheus_answers, util, stamps, memory)
    source = PrometheusTelemetrySource(
        PrometheusTelemetrySettings(url=prometheus_answers.url("")), "dcgm"
    )
    with caplog.at_level(logging.WARNING):
        (reading,) = source.read_gpus(NOW)
    assert (reading.host, reading.util_pct, reading.at, reading.memory_used_mib) == (
        "a",
        40.0,
        NOW - 5,
        100.0,
    )
    assert "3 host(s) left unknown" in caplog.text and "is NaN" in caplog.text


def test_when_every_host_is_unreadable_the_read_fails(prometheus_answers: AnswerServer) -> None:
    util = gpu_answer([("a", "0", "40")])
    serve_gpus(prometheus_answers, util, gpu_answer([("a", "0", "1e300")]), gpu_answer([]))
    source = PrometheusTelemetrySource(
        PrometheusTelemetrySettings(url=prometheus_answers.url("")), "dcgm"
    )
    with pytest.raises(SourceError, match=r"1 host\(s\) left unknown: .* was scraped at 1e"):
        source.read_gpus(NOW)


# ---- Item shapes (Redis) -------------------------------------------------------------------


@pytest.mark.parametrize(
    "fields",
    [
        {"gpu_models": json.loads("[" * 900 + "]" * 900)},
        {"gpu_models": "[" * 5000 + "]" * 5000},
        {"gpus": json.loads("[" * 900 + "]" * 900)},
        {"gpus": 10**4000},
        {"gpus": "٣"},
        {"gpu_model": "x" * 1_000_000},
        {"min_gpu_memory_gib": {"a": [1]}},
    ],
)
def test_an_items_unreadable_shape_is_one_bounded_line(fields: dict[str, Any]) -> None:
    """A bad item is left out and named (the queue's other items still count): its value never
    ends in a RecursionError from keying or showing it, nor in a megabyte of message."""
    reader = ShapeReader(JobShape(1))
    with pytest.raises(BadShapeError) as failure:
        reader.shape(fields)
    assert len(one_line(failure.value)) < 200
    with pytest.raises(BadShapeError):
        reader.shape(fields)


@pytest.mark.parametrize(
    ("name", "content", "complaint"),
    [
        ("targets.json", "[" * 100_000 + "]" * 100_000, "not valid JSON or YAML"),
        ("targets.json", '[{"targets": ["a:1"], "labels": {"node": 1e999}}]', "not valid JSON"),
        (
            "targets.yaml",
            "- &a [x, x, x, x, x, x, x, x, x]\n"
            + "".join(
                f"- &{chr(98 + i)} [*{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, "
                f"*{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}]\n"
                for i in range(9)
            ),
            "not valid YAML|aliases",
        ),
        ("targets.yaml", "[" * 5000 + "]" * 5000, "targets file"),
    ],
)
def test_a_hostile_targets_file_is_one_line_not_a_hang(
    tmp_path: Path, name: str, content: str, complaint: str
) -> None:
    path = tmp_path / name
    path.write_text(content)
    scraper = ScrapeTelemetrySource(ScrapeSettings(targets_file=path), "agents", ManualClock(NOW))
    with pytest.raises(SourceError, match=complaint) as failure:
        scraper.read_gpus(NOW)
    assert str(path) in one_line(failure.value)
    scraper.close()


@pytest.mark.parametrize(
    "entry",
    [
        {"count": 10**30},
        {"gpus": 10**12},
        {"gpus": 2048},
        {"nodes": 10**9, "gpus": 10**9},
        {"checkpoint_interval_s": float("inf")},
        {"min_gpu_memory_gib": float("nan")},
        {"age_s": 1e300},
        {"gpu_models": [""]},
    ],
)
def test_a_static_queue_holds_only_bounded_demand(entry: dict[str, Any]) -> None:
    with pytest.raises(InputError) as failure:
        StaticQueueSource.from_config({"jobs": [entry]}, "drill")
    assert "sources.drill.jobs" in one_line(failure.value)


def test_slurm_demand_folds_per_qos_once_the_observer_asks(
    fake_slurm: tuple[SlurmAdapter, Path],
) -> None:
    """``FoldsPriorityClasses``: the adapter folds per QOS only once asked, as the observer does
    where the config lists priority classes."""
    adapter, output = fake_slurm
    output.write_text(squeue(job(1, qos="urgent"), job(2, qos="batch"), job(3, qos="batch")))
    before = adapter.read(NOW)
    assert [(g.jobs, g.priority_class) for g in before] == [(3, None)]
    adapter.fold_priority_classes()
    after = adapter.read(NOW)
    assert sorted((g.priority_class or "", g.jobs) for g in after) == [("batch", 2), ("urgent", 1)]
