"""The node agent's GPU metrics: NVML (through the pynvml-shaped fake, or the real nvidia-ml-py on
this GPU-less machine) read into dcgm-exporter's series and served over real HTTP."""

from __future__ import annotations

import inspect
import logging
import re
import socket
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pynvml
import pytest
from fake_pynvml import H100, H100_MEMORY_BYTES, FakeNvml, fake_nvml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample
from waits import bound

from autoscaler.model.clock import ManualClock
from autoscaler.sources.scrape import ScrapeSettings, ScrapeTelemetrySource
from node_agent.exporter import (
    DCGM_FIELDS,
    LABELS,
    NAMESPACE,
    NVML_UP,
    ExporterError,
    GpuCollector,
    GpuMetricsServer,
)
from node_agent.gpus import MIB, GpuReader

HOST = "gpu-node-01"
SAMPLE_VERSION = "0.1.0"
"""The agent version the saved sample shows, fixed so that a release does not make it stale."""
DATA = Path(__file__).parent / "data" / "dcgm"
AGENT_SAMPLE = DATA / "agent-fake-2gpu.txt"
DCGM_SAMPLE = DATA / "dcgm-exporter-sample.txt"
FIELD_CALLS = (
    "nvmlDeviceGetUtilizationRates",
    "nvmlDeviceGetMemoryInfo",
    "nvmlDeviceGetTemperature",
    "nvmlDeviceGetPowerUsage",
    "nvmlDeviceGetClockInfo",
    "nvmlDeviceGetComputeRunningProcesses",
)

Families = dict[str, list[Sample]]


def parse(text: str) -> Families:
    return {family.name: family.samples for family in text_string_to_metric_families(text)}


def get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=bound(30)) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def scrape(port: int) -> Families:
    status, text = get(port, "/metrics")
    assert status == 200
    return parse(text)


def by_gpu(families: Families, name: str) -> dict[str, Sample]:
    return {sample.labels["gpu"]: sample for sample in families.get(name, [])}


@pytest.fixture
def nvml() -> FakeNvml:
    return fake_nvml(8)


@pytest.fixture
def server(nvml: FakeNvml) -> Iterator[GpuMetricsServer]:
    with GpuMetricsServer(HOST, host="127.0.0.1", port=0, nvml=nvml) as started:
        yield started
    assert nvml.initialised == 0, "stop() ends the NVML session"


def test_metrics_carry_dcgm_names_labels_and_converted_values(
    nvml: FakeNvml, server: GpuMetricsServer
) -> None:
    gpu = nvml.gpus[0]
    gpu.util_gpu, gpu.util_memory = 87, 41
    gpu.memory_used = 30_000 * MIB + 123
    gpu.power_mw = 412_345
    gpu.temperature_c, gpu.sm_clock_mhz, gpu.processes = 61, 1980, 3

    families = scrape(server.port)

    assert server.available and server.reason is None and server.port > 0
    assert families[NVML_UP][0].value == 1
    assert families["gpu_autoscaler_agent_gpus"][0].value == 8
    util = by_gpu(families, "DCGM_FI_DEV_GPU_UTIL")
    assert sorted(util, key=int) == [str(i) for i in range(8)]
    assert util["0"].labels == {
        "gpu": "0",
        "UUID": gpu.uuid,
        "pci_bus_id": "00000000:18:00.0",
        "device": "nvidia0",
        "modelName": H100,
        "Hostname": HOST,
        "DCGM_FI_DRIVER_VERSION": "550.90.07",
    }
    first = {name: by_gpu(families, name)["0"].value for name, _, _ in DCGM_FIELDS}
    assert first == {
        "DCGM_FI_DEV_SM_CLOCK": 1980,
        "DCGM_FI_DEV_GPU_TEMP": 61,
        "DCGM_FI_DEV_POWER_USAGE": 412.345,
        "DCGM_FI_DEV_GPU_UTIL": 87,
        "DCGM_FI_DEV_MEM_COPY_UTIL": 41,
        "DCGM_FI_DEV_XID_ERRORS": 0,
        "DCGM_FI_DEV_FB_FREE": 81559 - 30_001,
        "DCGM_FI_DEV_FB_USED": 30_000,
    }
    assert by_gpu(families, "gpu_autoscaler_agent_compute_processes")["0"].value == 3
    assert by_gpu(families, "DCGM_FI_DEV_GPU_UTIL")["7"].value == 0


def test_readings_follow_the_gpus_between_scrapes(nvml: FakeNvml, server: GpuMetricsServer) -> None:
    assert by_gpu(scrape(server.port), "DCGM_FI_DEV_GPU_UTIL")["3"].value == 0
    nvml.gpus[3].util_gpu = 100
    nvml.gpus[3].memory_used = 70_000 * MIB
    families = scrape(server.port)
    assert by_gpu(families, "DCGM_FI_DEV_GPU_UTIL")["3"].value == 100
    assert by_gpu(families, "DCGM_FI_DEV_FB_USED")["3"].value == 70_000


def test_an_unsupported_field_is_left_out_for_that_gpu_only_and_quietly(
    nvml: FakeNvml, server: GpuMetricsServer, caplog: pytest.LogCaptureFixture
) -> None:
    nvml.gpus[2].unsupported.add("nvmlDeviceGetPowerUsage")
    nvml.gpus[4].unsupported.add("nvmlDeviceGetUtilizationRates")
    families = scrape(server.port)
    power = by_gpu(families, "DCGM_FI_DEV_POWER_USAGE")
    assert "2" not in power and len(power) == 7
    util = by_gpu(families, "DCGM_FI_DEV_GPU_UTIL")
    assert "4" not in util and "4" not in by_gpu(families, "DCGM_FI_DEV_MEM_COPY_UTIL")
    assert "4" in by_gpu(families, "DCGM_FI_DEV_FB_USED")
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], "normal, not news"


def test_a_lost_gpu_is_left_out_logged_once_and_comes_back(
    nvml: FakeNvml, server: GpuMetricsServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="node_agent")
    nvml.gpus[5].lost = True
    for _ in range(3):
        families = scrape(server.port)
        assert "5" not in by_gpu(families, "DCGM_FI_DEV_GPU_UTIL")
        assert len(by_gpu(families, "DCGM_FI_DEV_FB_USED")) == 7
        assert families["gpu_autoscaler_agent_gpus_lost"][0].value == 1
        assert families[NVML_UP][0].value == 1
    lost_lines = [
        r.getMessage() for r in caplog.records if "does not answer NVML" in r.getMessage()
    ]
    assert len(lost_lines) == 1 and "GPU 5" in lost_lines[0] and "GPU is lost" in lost_lines[0]

    nvml.gpus[5].lost = False
    families = scrape(server.port)
    assert "5" in by_gpu(families, "DCGM_FI_DEV_GPU_UTIL")
    assert families["gpu_autoscaler_agent_gpus_lost"][0].value == 0


def test_a_gpu_lost_before_start_joins_once_it_answers() -> None:
    nvml = fake_nvml(4)
    nvml.gpus[1].lost = True
    reader = GpuReader(nvml)
    assert reader.start() and reader.gpu_count == 4
    try:
        assert [r.identity.index for r in reader.read()] == [0, 2, 3]
        nvml.gpus[1].lost = False
        readings = reader.read()
        assert [r.identity.index for r in readings] == [0, 1, 2, 3]
        assert readings[1].identity.uuid == nvml.gpus[1].uuid
    finally:
        reader.close()


def test_an_unexpected_field_error_is_left_out_and_warned_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    nvml = fake_nvml(2)
    nvml.gpus[0].failing["nvmlDeviceGetTemperature"] = pynvml.NVMLError_Unknown()
    reader = GpuReader(nvml)
    reader.start()
    try:
        for _ in range(3):
            first, second = reader.read()
            assert first.temp_c is None and first.util_pct == 0 and second.temp_c == 34
    finally:
        reader.close()
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert warnings == ["GPU 0: NVML cannot read its temperature (Unknown Error); left out"]


def test_without_nvml_the_agent_serves_nvml_up_0_and_says_why(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The real nvidia-ml-py on this machine, which has no NVIDIA driver."""
    caplog.set_level(logging.INFO, logger="node_agent")
    with GpuMetricsServer(HOST, host="127.0.0.1", port=0) as server:
        assert not server.available
        assert server.reason == "NVML: library not found (no NVIDIA driver on this machine)"
        families = scrape(server.port)
        assert get(server.port, "/healthz") == (200, "ok\n")
    assert families[NVML_UP][0].value == 0
    assert not [name for name in families if name.startswith("DCGM_")]
    assert families["gpu_autoscaler_agent_info"][0].labels["reason"] == server.reason
    records = [r for r in caplog.records if r.name.startswith("node_agent")]
    assert len(records) == 1
    assert records[0].levelno == logging.WARNING and records[0].exc_info is None
    assert "\n" not in records[0].getMessage() and server.reason in records[0].getMessage()


@pytest.mark.parametrize(
    ("error", "reason"),
    [
        (pynvml.NVMLError_DriverNotLoaded(), "NVML: the NVIDIA driver is not loaded"),
        (pynvml.NVMLError_LibraryNotFound(), "NVML: library not found"),
        (pynvml.NVMLError_NoPermission(), "NVML: no permission to open the GPUs"),
        (pynvml.NVMLError_Unknown(), "NVML: cannot start (Unknown Error)"),
    ],
)
def test_each_nvml_start_failure_has_its_own_reason(error: pynvml.NVMLError, reason: str) -> None:
    nvml = fake_nvml(8, init_error=error)
    with GpuMetricsServer(HOST, host="127.0.0.1", port=0, nvml=nvml) as server:
        assert not server.available
        assert server.reason is not None and server.reason.startswith(reason)
        assert scrape(server.port)[NVML_UP][0].value == 0


def test_xid_events_reach_the_last_xid_gauge() -> None:
    nvml = fake_nvml(8)
    nvml.gpus[6].xid_events = False
    with GpuMetricsServer(HOST, host="127.0.0.1", port=0, nvml=nvml) as server:
        nvml.emit_xid(1, 79)
        xids = by_gpu(scrape(server.port), "DCGM_FI_DEV_XID_ERRORS")
        deadline = time.monotonic() + bound(30)
        while xids["1"].value != 79 and time.monotonic() < deadline:
            time.sleep(0.02)
            xids = by_gpu(scrape(server.port), "DCGM_FI_DEV_XID_ERRORS")
    assert xids["1"].value == 79
    assert "6" not in xids, "a GPU without XID events reports no XID"
    assert {gpu for gpu, sample in xids.items() if sample.value == 0} == {
        "0",
        "2",
        "3",
        "4",
        "5",
        "7",
    }
    assert nvml.event_sets[0].freed and nvml.initialised == 0


def test_the_fake_has_pynvml_own_signatures() -> None:
    """The fake may not drift from the module it stands in for."""
    fake = fake_nvml(1)
    calls = [
        name for name in dir(FakeNvml) if name.startswith("nvml") and callable(getattr(fake, name))
    ]
    assert len(calls) >= 15
    for name in calls:
        theirs = inspect.signature(getattr(pynvml, name)).parameters
        ours = inspect.signature(getattr(fake, name)).parameters
        required = [p for p in theirs.values() if p.default is inspect.Parameter.empty]
        assert len(required) <= len(ours) <= len(theirs), name


def test_a_driver_that_cannot_list_gpus_is_unavailable() -> None:
    nvml = fake_nvml(2)
    nvml.count_error = pynvml.NVMLError_Unknown()
    reader = GpuReader(nvml)
    assert not reader.start()
    assert reader.reason == "NVML: cannot list GPUs (Unknown Error)"
    assert nvml.initialised == 0 and reader.read() == []


def test_healthz_and_unknown_paths(server: GpuMetricsServer) -> None:
    assert get(server.port, "/healthz") == (200, "ok\n")
    status, _ = get(server.port, "/")
    assert status == 404


def test_a_taken_port_is_one_clear_error_and_nvml_stays_closed() -> None:
    nvml = fake_nvml(2)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(ExporterError) as raised:
            GpuMetricsServer(HOST, host="127.0.0.1", port=port, nvml=nvml)
    assert (
        str(raised.value) == f"cannot serve GPU metrics on 127.0.0.1:{port}: Address already in use"
    )
    assert nvml.initialised == 0


def test_stop_frees_the_port_and_is_safe_twice(nvml: FakeNvml) -> None:
    server = GpuMetricsServer(HOST, host="127.0.0.1", port=0, nvml=nvml)
    server.start()
    port = server.port
    server.stop()
    server.stop()
    with socket.socket() as again:
        again.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        again.bind(("127.0.0.1", port))


@dataclass(frozen=True)
class GpuState:
    util: int
    used: int
    power_mw: int
    lost: bool
    unsupported: frozenset[str]


gpu_states = st.builds(
    GpuState,
    util=st.integers(0, 100),
    used=st.integers(0, H100_MEMORY_BYTES),
    power_mw=st.integers(0, 1_000_000),
    lost=st.booleans(),
    unsupported=st.frozensets(st.sampled_from(FIELD_CALLS)),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(gpu_states, min_size=1, max_size=8))
def test_every_answering_gpu_is_exported_with_exact_unit_conversions(
    states: list[GpuState],
) -> None:
    """Whatever mix of values, unsupported fields and lost GPUs: collection never fails, lost
    GPUs are absent, and MiB and W are the NVML bytes and mW converted exactly."""
    logging.getLogger("node_agent").setLevel(logging.ERROR)
    nvml = fake_nvml(len(states))
    for gpu, state in zip(nvml.gpus, states, strict=True):
        gpu.util_gpu, gpu.memory_used, gpu.power_mw = state.util, state.used, state.power_mw
        gpu.unsupported = set(state.unsupported)
    reader = GpuReader(nvml)
    reader.start()
    for gpu, state in zip(nvml.gpus, states, strict=True):
        gpu.lost = state.lost
    try:
        registry = CollectorRegistry()
        registry.register(GpuCollector(reader, HOST))
        families = parse(generate_latest(registry).decode())
    finally:
        reader.close()
        logging.getLogger("node_agent").setLevel(logging.NOTSET)

    answering = [gpu for gpu in nvml.gpus if not gpu.lost]
    assert families["gpu_autoscaler_agent_gpus_lost"][0].value == len(states) - len(answering)

    def exported(name: str, call: str) -> dict[str, float]:
        expected = {str(g.index) for g in answering if call not in g.unsupported}
        samples = by_gpu(families, name)
        assert set(samples) == expected, name
        return {gpu: sample.value for gpu, sample in samples.items()}

    used = exported("DCGM_FI_DEV_FB_USED", "nvmlDeviceGetMemoryInfo")
    free = exported("DCGM_FI_DEV_FB_FREE", "nvmlDeviceGetMemoryInfo")
    power = exported("DCGM_FI_DEV_POWER_USAGE", "nvmlDeviceGetPowerUsage")
    util = exported("DCGM_FI_DEV_GPU_UTIL", "nvmlDeviceGetUtilizationRates")
    for gpu in answering:
        key = str(gpu.index)
        if key in used:
            assert used[key] == gpu.memory_used // MIB
            assert free[key] == (gpu.memory_total - gpu.memory_used) // MIB
        if key in power:
            assert power[key] == gpu.power_mw / 1000
        if key in util:
            assert util[key] == gpu.util_gpu


def render_two_gpu_sample() -> str:
    """What the agent serves for a 2-GPU node mid-job (the saved sample's source)."""
    nvml = fake_nvml(2)
    for gpu, util, used_mib, power_mw, temp, clock in (
        (nvml.gpus[0], 97, 71_520, 612_480, 63, 1980),
        (nvml.gpus[1], 94, 71_498, 598_102, 61, 1980),
    ):
        gpu.util_gpu, gpu.util_memory, gpu.memory_used = util, util // 2, used_mib * MIB
        gpu.power_mw, gpu.temperature_c, gpu.sm_clock_mhz, gpu.processes = power_mw, temp, clock, 1
    reader = GpuReader(nvml)
    reader.start()
    reader.watch_xids()
    try:
        registry = CollectorRegistry()
        registry.register(GpuCollector(reader, HOST, version=SAMPLE_VERSION))
        return generate_latest(registry).decode()
    finally:
        reader.close()


def test_every_series_of_the_agent_is_prefixed_and_none_is_a_bare_up(
    server: GpuMetricsServer,
) -> None:
    """``up`` is Prometheus's own name for every target it scrapes; the agent's own series share
    one prefix, and dcgm-exporter's names stay dcgm-exporter's."""
    names = set(scrape(server.port))
    assert "up" not in names
    ours = {name for name in names if not name.startswith("DCGM_FI_")}
    assert ours and all(name.startswith(NAMESPACE + "_") for name in ours), ours
    for text in (AGENT_SAMPLE.read_text(), generate_latest(server.registry).decode()):
        assert not re.search(r"^up[ {]", text, re.MULTILINE)


def test_the_scrape_source_reads_the_agent_with_and_without_gpus(nvml: FakeNvml) -> None:
    """The controller's scrape source against the real agent: a node's GPUs by its host name;
    an agent whose node has no usable NVML is a target without readings, named as such."""
    nvml.gpus[0].util_gpu = 55
    with (
        GpuMetricsServer(HOST, host="127.0.0.1", port=0, nvml=nvml) as with_gpus,
        GpuMetricsServer(
            "cpu-node",
            host="127.0.0.1",
            port=0,
            nvml=fake_nvml(1, init_error=pynvml.NVMLError_LibraryNotFound()),
        ) as without,
    ):
        targets = [f"127.0.0.1:{with_gpus.port}", f"127.0.0.1:{without.port}"]
        source = ScrapeTelemetrySource(
            ScrapeSettings(targets=tuple(targets)), "agents", ManualClock(1_000.0)
        )
        samples = source.read_gpus(1_000.0)
        status = source.target_status()
    assert {s.host for s in samples} == {HOST} and len(samples) == 8
    assert sorted(s.util_pct for s in samples)[-1] == 55
    assert status[f"http://{targets[0]}/metrics"] is None
    assert "no DCGM_FI_DEV_GPU_UTIL series" in str(status[f"http://{targets[1]}/metrics"])


def test_the_saved_agent_sample_is_what_the_agent_serves() -> None:
    assert AGENT_SAMPLE.read_text() == render_two_gpu_sample(), (
        "regenerate with: .venv/bin/python tests/test_agent_gpus.py"
    )


_UTIL_LINE = re.compile(r"^DCGM_FI_DEV_GPU_UTIL\{(?P<labels>[^}]*)\}", re.MULTILINE)
_LABEL_NAME = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="(?:[^"\\]|\\.)*"')


def util_label_names(text: str) -> set[frozenset[str]]:
    return {frozenset(_LABEL_NAME.findall(m["labels"])) for m in _UTIL_LINE.finditer(text)}


def test_agent_and_dcgm_exporter_samples_label_utilisation_alike() -> None:
    """The controller reads either: the same label names on DCGM_FI_DEV_GPU_UTIL in both."""
    ours = util_label_names(AGENT_SAMPLE.read_text())
    theirs = util_label_names(DCGM_SAMPLE.read_text())
    assert ours == theirs == {frozenset(LABELS)}
    assert len(_UTIL_LINE.findall(DCGM_SAMPLE.read_text())) == 2


if __name__ == "__main__":
    AGENT_SAMPLE.parent.mkdir(parents=True, exist_ok=True)
    AGENT_SAMPLE.write_text(render_two_gpu_sample())
    sys.stdout.write(f"wrote {AGENT_SAMPLE}\n")
