"""The agent's ``/metrics``: the node's GPUs in dcgm-exporter's names and labels.

Speaking dcgm-exporter's names (``DCGM_FI_DEV_GPU_UTIL`` and friends, labelled ``gpu``, ``UUID``,
``pci_bus_id``, ``device``, ``modelName``, ``Hostname``, ``DCGM_FI_DRIVER_VERSION``) lets the
controller, Prometheus and existing Grafana dashboards read our agent and a dcgm-exporter that ops
already run the same way. Readings are taken at scrape time by a custom collector, so a scrape
always sees the GPUs as they are, never a cached copy.

A node without a usable NVML still serves: ``gpu_autoscaler_agent_nvml_up 0`` and
``gpu_autoscaler_agent_info`` with the reason, and no DCGM series, so a scraper tells "no GPU
here" apart from "agent down".

The agent's own series all start ``gpu_autoscaler_agent_`` (``NAMESPACE``), as its notice
metrics do; it serves no bare ``up``, a name Prometheus writes itself for every target it scrapes
(an exporter's ``up`` would clash with it). dcgm-exporter's ``DCGM_*`` names stay as they are:
they are what makes the agent and a dcgm-exporter read alike.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator
from types import TracebackType
from typing import Any
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.core import GaugeMetricFamily, InfoMetricFamily, Metric
from prometheus_client.registry import Collector

from autoscaler.model.version import package_version
from autoscaler.model.wsgi import App, Serving, bind, text
from node_agent.gpus import GpuReader, GpuReading

log = logging.getLogger(__name__)

NAMESPACE = "gpu_autoscaler_agent"
NVML_UP = f"{NAMESPACE}_nvml_up"

LABELS = ("gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname", "DCGM_FI_DRIVER_VERSION")

Field = tuple[str, str, Callable[[GpuReading], float | None]]

# Names and help texts as in dcgm-exporter's etc/default-counters.csv, in its order.
DCGM_FIELDS: tuple[Field, ...] = (
    ("DCGM_FI_DEV_SM_CLOCK", "SM clock frequency (in MHz).", lambda r: r.sm_clock_mhz),
    ("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C).", lambda r: r.temp_c),
    ("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W).", lambda r: r.power_w),
    ("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).", lambda r: r.util_pct),
    ("DCGM_FI_DEV_MEM_COPY_UTIL", "Memory utilization (in %).", lambda r: r.mem_copy_util_pct),
    (
        "DCGM_FI_DEV_XID_ERRORS",
        "Value of the last XID error encountered.",
        lambda r: None if r.last_xid is None else float(r.last_xid),
    ),
    ("DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB).", lambda r: r.fb_free_mib),
    ("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).", lambda r: r.fb_used_mib),
)
AGENT_FIELDS: tuple[Field, ...] = (
    (
        f"{NAMESPACE}_compute_processes",
        "Compute processes running on the GPU (NVML; not a dcgm-exporter field).",
        lambda r: None if r.compute_processes is None else float(r.compute_processes),
    ),
)


class ExporterError(RuntimeError):
    """The metrics server cannot listen where it was told to; the message says where and why."""


class GpuCollector(Collector):
    """Reads NVML on every scrape and emits dcgm-exporter's series for each GPU that answers."""

    def __init__(self, reader: GpuReader, hostname: str, version: str | None = None) -> None:
        self.reader = reader
        self.hostname = hostname
        self.version = version if version is not None else package_version()

    def collect(self) -> Iterator[Metric]:
        available = self.reader.available
        yield GaugeMetricFamily(
            NVML_UP,
            f"1 when NVML answers on this node, 0 when it cannot start (see {NAMESPACE}_info).",
            value=1.0 if available else 0.0,
        )
        yield InfoMetricFamily(
            NAMESPACE,
            "The node agent: its version, host, NVIDIA driver, and why NVML is unavailable if it "
            "is.",
            value={
                "version": self.version,
                "Hostname": self.hostname,
                "driver_version": self.reader.driver_version,
                "reason": self.reader.reason or "",
            },
        )
        if not available:
            return
        readings = self.reader.read()
        yield GaugeMetricFamily(
            f"{NAMESPACE}_gpus", "GPUs NVML lists on this node.", value=self.reader.gpu_count
        )
        yield GaugeMetricFamily(
            f"{NAMESPACE}_gpus_lost",
            "GPUs that do not answer NVML now (fallen off the bus); left out of the series.",
            value=self.reader.lost_count,
        )
        yield from self._series(readings, DCGM_FIELDS + AGENT_FIELDS)

    def _series(self, readings: Iterable[GpuReading], fields: Iterable[Field]) -> Iterator[Metric]:
        labelled = [(self._labels(reading), reading) for reading in readings]
        for name, help_text, value_of in fields:
            family = GaugeMetricFamily(name, help_text, labels=LABELS)
            for labels, reading in labelled:
                value = value_of(reading)
                if value is not None:
                    family.add_metric(labels, value)
            if family.samples:
                yield family

    def _labels(self, reading: GpuReading) -> list[str]:
        gpu = reading.identity
        return [
            str(gpu.index),
            gpu.uuid,
            gpu.pci_bus_id,
            f"nvidia{gpu.index}",
            gpu.model,
            self.hostname,
            self.reader.driver_version,
        ]


class GpuMetricsServer:
    """Serves ``GET /metrics`` and ``GET /healthz`` for this node's GPUs.

    ``port``, ``available`` and ``reason`` are known as soon as ``__init__`` returns: it binds the
    socket (``port=0`` binds a free port, then ``port`` is the bound one) and starts NVML.
    ``start`` serves from a daemon thread and starts the XID watch; ``stop`` ends both and NVML.
    """

    def __init__(
        self, hostname: str, host: str = "0.0.0.0", port: int = 9400, nvml: Any | None = None
    ) -> None:
        self.hostname = hostname
        self.host = host
        self._serving = Serving(_bind(host, port, self._route), "gpu-metrics")
        self.port: int = self._serving.port
        self._reader = GpuReader(nvml)
        self.available: bool = self._reader.start()
        self.reason: str | None = self._reader.reason
        self.registry = CollectorRegistry()
        self.registry.register(GpuCollector(self._reader, hostname))
        self._metrics_app = make_wsgi_app(self.registry)
        self._started = False
        self._stopped = False
        if self.available:
            log.info(
                "serving %d GPU(s) on %s:%d/metrics (NVIDIA driver %s)",
                self._reader.gpu_count,
                host,
                self.port,
                self._reader.driver_version or "unknown",
            )
        else:
            log.warning(
                "no GPU metrics on this node: %s; %s:%d/metrics serves %s 0",
                self.reason,
                host,
                self.port,
                NVML_UP,
            )

    def start(self) -> None:
        if self._started or self._stopped:
            return
        self._started = True
        self._reader.watch_xids()
        self._serving.start()

    def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        self._serving.close()
        self._reader.close()

    def __enter__(self) -> GpuMetricsServer:
        self.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.stop()

    def _route(self, environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "/")
        if path == "/metrics":
            body: Iterable[bytes] = self._metrics_app(environ, start_response)
            return body
        if path == "/healthz":
            return text(start_response, "200 OK", "ok\n")
        return text(
            start_response, "404 Not Found", "not found: the agent serves /metrics and /healthz\n"
        )


def _bind(host: str, port: int, app: App) -> WSGIServer:
    try:
        return bind(host, port, app)
    except OSError as error:
        reason = error.strerror or str(error)
        raise ExporterError(f"cannot serve GPU metrics on {host}:{port}: {reason}") from None
