"""A real Prometheus (Debian's) scraping a small real exporter, once per test session and worker.

The exporter is prometheus-client's HTTP server with its own registry on a free loopback port:
a ``queue_depth`` gauge by ``queue`` and dcgm-exporter's GPU gauges with dcgm-exporter's labels.
Prometheus scrapes it every second; tests set gauges and poll (bounded) until Prometheus has
the new values. Prometheus is stopped by its pid, the exporter by shutting its server down.
"""

from __future__ import annotations

import json
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, Gauge, start_http_server
from waits import bound

READY_WITHIN_S = 60.0
DCGM_LABELS = ("gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname")


@dataclass(frozen=True)
class FakeGpu:
    host: str
    index: str
    uuid: str
    model: str
    util_pct: float
    memory_used_mib: float

    @property
    def labels(self) -> dict[str, str]:
        return {
            "gpu": self.index,
            "UUID": self.uuid,
            "pci_bus_id": f"00000000:{10 + int(self.index):02X}:00.0",
            "device": f"nvidia{self.index}",
            "modelName": self.model,
            "Hostname": self.host,
        }


GPUS = (
    FakeGpu("node-a", "0", "GPU-aaaa0000-0000", "NVIDIA A100-SXM4-80GB", 87.0, 40_000.0),
    FakeGpu("node-a", "1", "GPU-aaaa0000-0001", "NVIDIA A100-SXM4-80GB", 0.0, 512.0),
    FakeGpu("node-b", "0", "GPU-bbbb0000-0000", "NVIDIA H100 80GB HBM3", 42.5, 10_240.0),
)
QUEUES = {"train": 3.0, "infer": 2.5}


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclass
class PrometheusWorld:
    url: str
    exporter_url: str
    queue_depth: Gauge
    gpu_util: Gauge
    fb_used: Gauge

    def query(self, promql: str) -> list[dict[str, Any]]:
        address = f"{self.url}/api/v1/query?{urllib.parse.urlencode({'query': promql})}"
        with urllib.request.urlopen(address, timeout=bound(30)) as answer:
            result: list[dict[str, Any]] = json.load(answer)["data"]["result"]
        return result

    def wait_for(
        self,
        promql: str,
        ready: Callable[[list[dict[str, Any]]], bool],
        within_s: float = 60.0,
    ) -> list[dict[str, Any]]:
        """Poll until Prometheus's answer to ``promql`` satisfies ``ready``; scrapes are 1 s
        apart, so a value set by a test shows within a couple of seconds; ``within_s`` is only
        a ceiling, scaled by the wait knob."""
        deadline = time.monotonic() + bound(within_s)
        while True:
            try:
                result = self.query(promql)
                if ready(result):
                    return result
            except (urllib.error.URLError, OSError, KeyError):
                result = []
            if time.monotonic() > deadline:
                raise AssertionError(f"Prometheus never answered {promql!r} as wanted: {result}")
            time.sleep(0.1)

    def set_queue(self, queue: str, depth: float) -> None:
        self.queue_depth.labels(queue=queue).set(depth)
        self.wait_for(
            f'queue_depth{{queue="{queue}"}}',
            lambda result: len(result) == 1 and float(result[0]["value"][1]) == depth,
        )


def _exporter() -> tuple[Any, Gauge, Gauge, Gauge]:
    registry = CollectorRegistry()
    queue_depth = Gauge("queue_depth", "jobs waiting", ["queue"], registry=registry)
    gpu_util = Gauge(
        "DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).", DCGM_LABELS, registry=registry
    )
    fb_used = Gauge(
        "DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).", DCGM_LABELS, registry=registry
    )
    for queue, depth in QUEUES.items():
        queue_depth.labels(queue=queue).set(depth)
    for gpu in GPUS:
        gpu_util.labels(**gpu.labels).set(gpu.util_pct)
        fb_used.labels(**gpu.labels).set(gpu.memory_used_mib)
    server, _thread = start_http_server(0, addr="127.0.0.1", registry=registry)
    return server, queue_depth, gpu_util, fb_used


def _start_prometheus(directory: Path, exporter_port: int) -> tuple[subprocess.Popen[bytes], str]:
    config = directory / "prometheus.yml"
    config.write_text(
        "global: {scrape_interval: 1s, scrape_timeout: 1s, evaluation_interval: 1s}\n"
        "scrape_configs:\n"
        "  - job_name: dcgm\n"
        f"    static_configs: [{{targets: ['127.0.0.1:{exporter_port}']}}]\n"
    )
    for attempt in range(3):
        port = free_port()
        log = (directory / f"prometheus-{attempt}.log").open("wb")
        process = subprocess.Popen(
            [
                "prometheus",
                f"--config.file={config}",
                f"--storage.tsdb.path={directory / f'data-{attempt}'}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()
        url = f"http://127.0.0.1:{port}"
        if _first_scrape(process, url):
            return process, url
        _stop(process)
    raise RuntimeError(f"prometheus did not start; see {directory}/prometheus-*.log")


def _first_scrape(process: subprocess.Popen[bytes], url: str) -> bool:
    """Ready once the exporter has been scraped (the first scrape comes a few seconds in)."""
    deadline = time.monotonic() + bound(READY_WITHIN_S)
    address = f"{url}/api/v1/query?query=up%7Bjob%3D%22dcgm%22%7D%3D%3D1"
    while process.poll() is None and time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(address, timeout=bound(10)) as answer:
                if json.load(answer)["data"]["result"]:
                    return True
        except (urllib.error.URLError, OSError, KeyError, ValueError):
            pass
        time.sleep(0.2)
    return False


def _stop(process: subprocess.Popen[bytes]) -> None:
    process.terminate()
    try:
        process.wait(timeout=bound(30))
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=bound(30))


@pytest.fixture(scope="session")
def prometheus_world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrometheusWorld]:
    server, queue_depth, gpu_util, fb_used = _exporter()
    try:
        process, url = _start_prometheus(tmp_path_factory.mktemp("prometheus"), server.server_port)
        try:
            yield PrometheusWorld(
                url, f"http://127.0.0.1:{server.server_port}", queue_depth, gpu_util, fb_used
            )
        finally:
            _stop(process)
    finally:
        server.shutdown()
        server.server_close()
