"""The Prometheus queue and telemetry sources against a real Prometheus scraping a real exporter,
and the answer parser's invariants on generated answers."""

from __future__ import annotations

import json
import math
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_server import GPUS, PrometheusWorld, free_port
from waits import bound

from autoscaler.model.errors import InputError, SourceError
from autoscaler.sources.prometheus import (
    PrometheusQueueSettings,
    PrometheusQueueSource,
    PrometheusTelemetrySource,
    demand_from_samples,
    parse_query_response,
)
from autoscaler.spi.sources import QueueSource, TelemetrySource

WHERE = "prometheus source 'work'"
SUM = 'sum(queue_depth{queue=~"train|infer"})'


def queue(url: str, query: str, **extra: Any) -> PrometheusQueueSource:
    return PrometheusQueueSource.from_config({"url": url, "query": query, **extra}, "work")


def telemetry(url: str, **extra: Any) -> PrometheusTelemetrySource:
    return PrometheusTelemetrySource.from_config({"url": url, **extra}, "gpus")


def test_a_vector_without_labels_is_one_group_rounded_up(prometheus_world: PrometheusWorld) -> None:
    source = queue(prometheus_world.url, SUM, gpus_per_unit=2, high_priority=True)
    assert isinstance(source, QueueSource)
    now = time.time()
    (group,) = source.read(now)
    assert (group.jobs, group.gpus, group.high_priority, group.partition) == (6, 12, True, None)
    assert group.oldest_submit_time == now


def test_the_counted_jobs_have_the_shape_the_settings_give(
    prometheus_world: PrometheusWorld,
) -> None:
    source = queue(
        prometheus_world.url,
        SUM,
        gpus_per_unit=16,
        nodes=2,
        gpu_models=["H100", "A100-80GB", "H100"],
        min_gpu_memory_gib=80,
    )
    (group,) = source.read(time.time())
    assert (group.jobs, group.gpus_per_job, group.nodes, group.gpus_per_node) == (6, 16, 2, 8)
    assert (group.gpu_models, group.min_gpu_memory_gib) == (("A100-80GB", "H100"), 80.0)
    assert group.shape.describe() == "8 GPU(s) of A100-80GB|H100 with >= 80 GiB each"


def test_a_scalar_is_demand_too(prometheus_world: PrometheusWorld) -> None:
    (group,) = queue(prometheus_world.url, 'scalar(queue_depth{queue="train"})').read(time.time())
    assert (group.jobs, group.gpus_per_job) == (3, 1)


def test_a_vector_splits_into_groups_by_the_partition_label(
    prometheus_world: PrometheusWorld,
) -> None:
    source = queue(
        prometheus_world.url,
        'sum by (queue) (queue_depth{queue=~"train|infer"})',
        partition_label="queue",
        gpus_per_unit=4,
        checkpoint_interval_s=900,
    )
    groups = source.read(time.time())
    assert [(g.partition, g.jobs, g.gpus, g.checkpoint_interval_s) for g in groups] == [
        ("infer", 3, 12, 900),
        ("train", 3, 12, 900),
    ]


def test_a_series_without_the_partition_label_fails_naming_it(
    prometheus_world: PrometheusWorld,
) -> None:
    with pytest.raises(SourceError, match=r"series \{\} has no 'queue' label"):
        queue(prometheus_world.url, SUM, partition_label="queue").read(time.time())


def test_vector_zero_is_real_zero_demand(prometheus_world: PrometheusWorld) -> None:
    assert queue(prometheus_world.url, "vector(0)").read(time.time()) == []


def test_a_query_matching_nothing_is_unknown_unless_told_it_means_zero(
    prometheus_world: PrometheusWorld,
) -> None:
    nothing = 'queue_depth{queue="no-such-queue"}'
    with pytest.raises(SourceError, match="matched no series") as failure:
        queue(prometheus_world.url, nothing).read(time.time())
    assert str(failure.value).startswith(WHERE)
    assert queue(prometheus_world.url, nothing, empty_result="zero").read(time.time()) == []


def test_a_value_set_on_the_exporter_becomes_demand_once_scraped(
    prometheus_world: PrometheusWorld,
) -> None:
    name = f"q-{uuid.uuid4().hex[:8]}"
    source = queue(prometheus_world.url, f'queue_depth{{queue="{name}"}}', gpus_per_unit=8)
    prometheus_world.set_queue(name, 4)
    (group,) = source.read(time.time())
    assert (group.jobs, group.gpus) == (4, 32)
    prometheus_world.set_queue(name, 0)
    assert source.read(time.time()) == []


def test_nan_fails(prometheus_world: PrometheusWorld) -> None:
    with pytest.raises(SourceError, match=r"series \{\} is NaN"):
        queue(prometheus_world.url, "0/0").read(time.time())


def test_infinity_fails(prometheus_world: PrometheusWorld) -> None:
    with pytest.raises(SourceError, match=r"is \+Inf"):
        queue(prometheus_world.url, f"{SUM} / 0").read(time.time())


def test_a_negative_count_fails(prometheus_world: PrometheusWorld) -> None:
    with pytest.raises(SourceError, match=r"negative \(-5\.5\)"):
        queue(prometheus_world.url, f"-{SUM}").read(time.time())


def test_a_syntax_error_carries_prometheus_own_message(prometheus_world: PrometheusWorld) -> None:
    with pytest.raises(SourceError) as failure:
        queue(prometheus_world.url, "sum(queue_depth").read(time.time())
    message = str(failure.value)
    assert message.startswith(f"{WHERE}: HTTP 400")
    assert "bad_data" in message and "parse error" in message and "\n" not in message


def test_a_range_vector_is_refused(prometheus_world: PrometheusWorld) -> None:
    with pytest.raises(SourceError, match="returns a matrix"):
        queue(prometheus_world.url, "queue_depth[10s]").read(time.time())


def test_an_answer_older_than_allowed_is_stale(prometheus_world: PrometheusWorld) -> None:
    later = time.time() + 600
    with pytest.raises(SourceError, match=r"s old \(max_sample_age_s 60\)"):
        queue(prometheus_world.url, SUM, max_sample_age_s=60).read(later)


def test_an_exporter_is_not_prometheus(prometheus_world: PrometheusWorld) -> None:
    with pytest.raises(SourceError, match="the answer is not JSON"):
        queue(prometheus_world.exporter_url, SUM).read(time.time())


def test_a_port_nothing_listens_on_cannot_be_reached() -> None:
    with pytest.raises(SourceError, match=r"cannot reach .*Connection refused"):
        queue(f"http://127.0.0.1:{free_port()}", "up").read(time.time())


@pytest.fixture
def silent_server() -> Iterator[str]:
    """A listener that accepts connections and never answers."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.1)
        while not stop.is_set():
            try:
                held.append(listener.accept()[0])
            except TimeoutError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    stop.set()
    thread.join(timeout=bound(30))
    for connection in held:
        connection.close()
    listener.close()


def test_a_server_that_never_answers_times_out(silent_server: str) -> None:
    with pytest.raises(SourceError, match=r"timed out after 0\.3s"):
        queue(silent_server, "up", timeout_s=0.3).read(time.time())


def test_an_unset_token_variable_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NO_SUCH_PROM_TOKEN", raising=False)
    source = queue("http://127.0.0.1:1", "up", bearer_token_env="NO_SUCH_PROM_TOKEN")
    with pytest.raises(SourceError, match=r"NO_SUCH_PROM_TOKEN \(bearer_token_env\) is not set"):
        source.read(time.time())


@pytest.mark.parametrize(
    ("block", "field"),
    [
        ({"url": "127.0.0.1:9090", "query": "up"}, "sources.work.url"),
        ({"url": "http://p:9090", "query": ""}, "sources.work.query"),
        (
            {"url": "http://p:9090", "query": "up", "empty_result": "none"},
            "sources.work.empty_result",
        ),
        ({"url": "http://p:9090", "query": "up", "gpus_per_unit": 0}, "sources.work.gpus_per_unit"),
        ({"url": "http://p:9090"}, "sources.work.query"),
        ({"url": "http://p:9090", "query": "up", "gpus_per_unit": 6, "nodes": 4}, "sources.work"),
        ({"url": "http://p:9090", "query": "up", "nodes": 0}, "sources.work.nodes"),
        ({"url": "http://p:9090", "query": "up", "gpu_models": [""]}, "sources.work.gpu_models[0]"),
        (
            {"url": "http://p:9090", "query": "up", "min_gpu_memory_gib": 0},
            "sources.work.min_gpu_memory_gib",
        ),
    ],
)
def test_settings_errors_name_the_field(block: dict[str, Any], field: str) -> None:
    with pytest.raises(InputError) as failure:
        PrometheusQueueSource.from_config(block, "work")
    assert failure.value.field == field


def test_gpu_readings_carry_hosts_gpus_and_scrape_times(prometheus_world: PrometheusWorld) -> None:
    source = telemetry(prometheus_world.url)
    assert isinstance(source, TelemetrySource)
    before = time.time()
    readings = source.read_gpus(before)
    after = time.time()
    assert {(r.host, r.gpu, r.util_pct, r.uuid, r.model, r.memory_used_mib) for r in readings} == {
        (g.host, g.index, g.util_pct, g.uuid, g.model, g.memory_used_mib) for g in GPUS
    }
    for reading in readings:
        assert before - 5 < reading.at <= after
    again = source.read_gpus(time.time())
    assert min(r.at for r in again) >= min(r.at for r in readings)


def test_gpu_readings_without_memory(prometheus_world: PrometheusWorld) -> None:
    readings = telemetry(prometheus_world.url, memory_query=None).read_gpus(time.time())
    assert len(readings) == len(GPUS)
    assert all(r.memory_used_mib is None for r in readings)


def test_a_series_without_hostname_fails_naming_its_labels(
    prometheus_world: PrometheusWorld,
) -> None:
    source = telemetry(prometheus_world.url, query="max by (gpu) (DCGM_FI_DEV_GPU_UTIL)")
    with pytest.raises(SourceError) as failure:
        source.read_gpus(time.time())
    assert str(failure.value).startswith("prometheus telemetry 'gpus': series {gpu=")
    assert "has no 'Hostname' label" in str(failure.value)


def test_a_nan_reading_fails(prometheus_world: PrometheusWorld) -> None:
    source = telemetry(prometheus_world.url, query="DCGM_FI_DEV_GPU_UTIL * 0 / 0")
    with pytest.raises(SourceError, match=r'Hostname="node-a".* is NaN'):
        source.read_gpus(time.time())


def test_a_reading_that_is_not_a_percentage_fails(prometheus_world: PrometheusWorld) -> None:
    source = telemetry(prometheus_world.url, query="DCGM_FI_DEV_GPU_UTIL + 150")
    with pytest.raises(SourceError, match="not a utilisation percentage"):
        source.read_gpus(time.time())


def test_no_gpu_series_at_all_fails(prometheus_world: PrometheusWorld) -> None:
    source = telemetry(prometheus_world.url, query='DCGM_FI_DEV_GPU_UTIL{Hostname="nowhere"}')
    with pytest.raises(SourceError, match="matched no series"):
        source.read_gpus(time.time())


def vector_answer(values: list[tuple[str | None, float]], at: float) -> bytes:
    result = [
        {
            "metric": {} if queue_name is None else {"queue": queue_name},
            "value": [at, repr(value)],
        }
        for queue_name, value in values
    ]
    return json.dumps(
        {"status": "success", "data": {"resultType": "vector", "result": result}}
    ).encode()


@given(
    values=st.lists(
        st.tuples(
            st.sampled_from(["a", "b", "c"]),
            st.floats(min_value=0, max_value=1e6, allow_nan=False, allow_infinity=False),
        ),
        max_size=20,
    ),
    gpus_per_unit=st.integers(min_value=1, max_value=16),
    split=st.booleans(),
)
def test_any_finite_non_negative_vector_gives_its_rounded_up_sum(
    values: list[tuple[str, float]], gpus_per_unit: int, split: bool
) -> None:
    at = 1_700_000_000.5
    settings = PrometheusQueueSettings(
        url="http://p:9090",
        query="q",
        gpus_per_unit=gpus_per_unit,
        partition_label="queue" if split else None,
        empty_result="zero",
    )
    samples = parse_query_response(vector_answer(values, at), WHERE)
    groups = demand_from_samples(samples, settings, at, WHERE)
    assert sum(g.gpus for g in groups) == sum(math.ceil(v) for _, v in values) * gpus_per_unit
    assert all(g.jobs > 0 and g.gpus_per_job == gpus_per_unit for g in groups)
    if split:
        busy = {name for name, value in values if value > 0}
        assert [g.partition for g in groups] == sorted(busy)
    else:
        assert len(groups) == (1 if any(v > 0 for _, v in values) else 0)


JSON = st.recursive(
    st.none() | st.booleans() | st.floats() | st.integers() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=12,
)
ANSWER_SHAPES = st.fixed_dictionaries(
    {
        "status": st.sampled_from(["success", "error", "ok"]),
        "data": st.fixed_dictionaries(
            {
                "resultType": st.sampled_from(["vector", "scalar", "matrix", "string", "x"]),
                "result": JSON,
            }
        ),
    }
)


@given(
    st.binary(max_size=64)
    | JSON.map(lambda v: json.dumps(v).encode())
    | ANSWER_SHAPES.map(lambda v: json.dumps(v).encode())
)
def test_any_answer_either_parses_to_finite_samples_or_fails_with_a_source_error(
    body: bytes,
) -> None:
    try:
        samples = parse_query_response(body, WHERE)
    except SourceError as failure:
        assert str(failure).startswith(WHERE) and "\n" not in str(failure)
        return
    assert all(math.isfinite(s.value) and math.isfinite(s.at) for s in samples)
