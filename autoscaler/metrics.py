"""The controller's Prometheus metrics, named ``gpu_autoscaler_*`` after the Prometheus
conventions. One ``Metrics`` object per controller, on its own registry, so tests and several
controllers in one process never share series."""

from __future__ import annotations

from collections.abc import Callable
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server


class Metrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.source_up = Gauge(
            "gpu_autoscaler_source_up",
            "1 when the source answered on the last tick, 0 when it failed",
            ["kind", "source"],
            registry=self.registry,
        )
        self.source_errors = Counter(
            "gpu_autoscaler_source_errors",
            "Ticks on which the source failed",
            ["kind", "source"],
            registry=self.registry,
        )
        self.demand_known = Gauge(
            "gpu_autoscaler_demand_known",
            "1 when every queue source answered on the last tick (scale-down is held while 0)",
            registry=self.registry,
        )
        self.pending_gpus = Gauge(
            "gpu_autoscaler_pending_gpus", "GPUs pending jobs ask for", registry=self.registry
        )
        self.evacuations = Counter(
            "gpu_autoscaler_evacuations",
            "Jobs moved off nodes the cloud is taking back, by what happened to each",
            ["move"],
            registry=self.registry,
        )
        self.work_lost = Counter(
            "gpu_autoscaler_work_lost_gpu_seconds",
            "GPU-seconds lost to interruptions: what ran since the checkpoint a job resumes from",
            registry=self.registry,
        )
        self.ticks = Counter(
            "gpu_autoscaler_ticks", "Ticks by outcome", ["outcome"], registry=self.registry
        )
        self.tick_seconds = Histogram(
            "gpu_autoscaler_tick_duration_seconds",
            "Wall time of a tick",
            buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
            registry=self.registry,
        )


class MetricsServer:
    """Serves a registry on ``/metrics`` from a daemon thread, for as long as the run loop runs."""

    def __init__(self, registry: CollectorRegistry, host: str, port: int) -> None:
        self.registry = registry
        self.host = host
        self.requested_port = port
        self.port = port
        self._server: WSGIServer | None = None

    def start(self, wakeup: Callable[[], None] | None = None) -> None:
        self._server, _ = start_http_server(self.requested_port, self.host, self.registry)
        self.port = self._server.server_port

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
