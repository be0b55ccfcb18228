from __future__ import annotations

import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autoscaler.sources.exposition import ExpositionError, parse_gpu_samples

DCGM = (Path(__file__).parent / "data" / "exposition" / "two-h100.txt").read_text()


def test_dcgm_exporter_text_gives_one_sample_per_gpu() -> None:
    samples = {s.gpu: s for s in parse_gpu_samples(DCGM, at=100.0)}
    assert set(samples) == {"0", "1"}
    busy = samples["0"]
    assert (busy.host, busy.util_pct, busy.at, busy.uuid) == ("gpu-01", 87.0, 100.0, "GPU-aaa")
    assert busy.model == "NVIDIA H100 80GB HBM3"
    assert busy.memory_used_mib == 40512.0
    assert samples["1"].util_pct == 0.0


def test_a_timestamp_on_the_line_is_when_the_reading_was_taken() -> None:
    text = 'DCGM_FI_DEV_GPU_UTIL{gpu="0",Hostname="n1"} 12.5 1700000000500\n'
    (sample,) = parse_gpu_samples(text, at=1_700_000_003.0)
    assert sample.at == pytest.approx(1_700_000_000.5)
    assert sample.util_pct == 12.5


def test_a_node_override_names_the_node_when_the_series_has_no_hostname() -> None:
    text = 'DCGM_FI_DEV_GPU_UTIL{gpu="3"} 40\n'
    (sample,) = parse_gpu_samples(text, at=1.0, node_override="i-0abc")
    assert (sample.host, sample.gpu) == ("i-0abc", "3")


def test_escaped_label_values_are_unescaped() -> None:
    text = 'DCGM_FI_DEV_GPU_UTIL{gpu="0",modelName="A \\"quoted\\" \\\\ name",Hostname="h"} 1\n'
    (sample,) = parse_gpu_samples(text, at=1.0)
    assert sample.model == 'A "quoted" \\ name'


def test_a_custom_host_label_is_read() -> None:
    text = 'DCGM_FI_DEV_GPU_UTIL{gpu="0",Hostname="pod-x",kubernetes_node="node-7"} 3\n'
    (sample,) = parse_gpu_samples(text, at=1.0, host_label="kubernetes_node")
    assert sample.host == "node-7"


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('DCGM_FI_DEV_GPU_UTIL{gpu="0",Hostname="h"} NaN', "not a finite number"),
        ('DCGM_FI_DEV_GPU_UTIL{gpu="0",Hostname="h"} +Inf', "not a finite number"),
        ('DCGM_FI_DEV_GPU_UTIL{gpu="0",Hostname="h"} -4', "negative"),
        ('DCGM_FI_DEV_GPU_UTIL{gpu="0"} 4', "no 'Hostname' label"),
        ('DCGM_FI_DEV_GPU_UTIL{Hostname="h"} 4', "no 'gpu' label"),
        ('DCGM_FI_DEV_GPU_UTIL{gpu="0",Hostname="h"} busy', "not a number"),
        ('DCGM_FI_DEV_GPU_UTIL{gpu="0",Hostname=h} 4', "malformed labels"),
        ("DCGM_FI_DEV_GPU_UTIL", "not a Prometheus sample line"),
    ],
)
def test_bad_series_raise_one_line_naming_the_series_or_line(line: str, message: str) -> None:
    with pytest.raises(ExpositionError, match=message) as caught:
        parse_gpu_samples("# TYPE x gauge\n" + line + "\n", at=1.0)
    assert "\n" not in str(caught.value)
    assert "DCGM_FI_DEV_GPU_UTIL" in str(caught.value) or "line 2" in str(caught.value)


def test_other_series_are_not_read_even_when_malformed() -> None:
    text = 'up{broken 1\nDCGM_FI_DEV_GPU_UTIL{gpu="0",Hostname="h"} 9\n'
    assert [s.util_pct for s in parse_gpu_samples(text, at=1.0)] == [9.0]


def test_memory_without_utilisation_gives_no_sample() -> None:
    text = 'DCGM_FI_DEV_FB_USED{gpu="0",Hostname="h"} 9\n'
    assert parse_gpu_samples(text, at=1.0) == []


readings = st.lists(
    st.tuples(
        st.sampled_from(["gpu-01", "gpu-02", "node_3", "i-0123456789abcdef0"]),
        st.integers(min_value=0, max_value=7),
        st.floats(min_value=0, max_value=100, allow_nan=False),
    ),
    max_size=30,
    unique_by=lambda r: (r[0], r[1]),
)


@settings(deadline=None)  # a busy 2-core machine is slow, not wrong
@given(readings)
def test_what_is_written_is_read_back(rows: list[tuple[str, int, float]]) -> None:
    text = "".join(
        f'DCGM_FI_DEV_GPU_UTIL{{gpu="{gpu}",UUID="GPU-{host}-{gpu}",Hostname="{host}"}} {util!r}\n'
        for host, gpu, util in rows
    )
    parsed = {(s.host, s.gpu): s.util_pct for s in parse_gpu_samples(text, at=0.0)}
    assert parsed.keys() == {(host, str(gpu)) for host, gpu, _ in rows}
    for host, gpu, util in rows:
        assert math.isclose(parsed[(host, str(gpu))], util)


@pytest.mark.parametrize("sample", ["agent-fake-2gpu.txt", "dcgm-exporter-sample.txt"])
def test_our_agent_and_dcgm_exporter_read_the_same_way(sample: str) -> None:
    text = (Path(__file__).parent / "data" / "dcgm" / sample).read_text()
    samples = parse_gpu_samples(text, at=7.0)
    assert samples, "every GPU in the sample gives a reading"
    for reading in samples:
        assert reading.host and reading.uuid and reading.uuid.startswith("GPU-")
        assert reading.model and 0.0 <= reading.util_pct <= 100.0
        assert reading.memory_used_mib is not None
    assert len({(s.host, s.gpu) for s in samples}) == len(samples)
