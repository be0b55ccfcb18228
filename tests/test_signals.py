"""Signals into the loop: GPU telemetry scraped over real HTTP drives idle drains, a broken
exporter or queue source never reads as idle or as zero demand, and the controller's metrics say
which source failed."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from exporter_server import Answer, ExporterServer
from fakes import FakeCloud, FakeNodes, FakeQueue, FakeScheduler, job, pool
from prometheus_client import generate_latest

from autoscaler.app.assembly import build_signals
from autoscaler.fleet.telemetry import IdleTracker
from autoscaler.model.clock import ManualClock
from autoscaler.model.config import ControllerConfig, Limits
from autoscaler.model.errors import InputError
from autoscaler.ops.metrics import Metrics
from autoscaler.sources.scrape import ScrapeSettings, ScrapeTelemetrySource
from autoscaler.spi.sources import NodeUsage
from autoscaler.tick.controller import Controller
from autoscaler.tick.observe import Signals
from autoscaler.tick.retry import RetryPolicy
from policies.cost_aware import CostAwareParams, CostAwarePolicy


class Loop:
    def __init__(self, exporters: ExporterServer) -> None:
        self.clock = ManualClock(1_000_000.0)
        self.cloud = FakeCloud("fake", price_table={"a": 1.0}, now=self.clock.now)
        self.queue = FakeQueue()
        self.nodes = FakeNodes()
        self.scheduler = FakeScheduler()
        self.metrics = Metrics()
        self.exporters = exporters
        self.scraper = ScrapeTelemetrySource(
            ScrapeSettings(targets=(exporters.url("/node"),), timeout_s=1.0),
            "agents",
            self.clock,
        )
        config = ControllerConfig(
            fleet_id="test", pools=(pool("a"),), limits=Limits(scale_down_cooldown_s=0)
        )
        self.controller = Controller(
            config,
            CostAwarePolicy(CostAwareParams(idle_seconds=600)),
            {"fake": self.cloud},
            self.clock,
            scheduler=self.scheduler,
            incarnation="t",
            retry=RetryPolicy(attempts=1, sleep=lambda _s: None),
            signals=Signals(
                queues=(self.queue,),
                nodes=self.nodes,
                telemetry=(self.scraper,),
                tracker=IdleTracker(idle_util_pct=5.0, window_s=600.0, max_age_s=180.0),
            ),
            metrics=self.metrics,
        )

    def one_running_node(self) -> str:
        self.queue.jobs = [job("x")]
        self.controller.tick()
        self.cloud.boot_all()
        self.queue.jobs = []
        (instance,) = self.cloud.instances
        self.nodes.cloud = {instance: NodeUsage(1, empty_since=None)}
        return instance

    def serve(self, instance: str, util: float) -> None:
        self.exporters.answers["/node"] = Answer(
            f'DCGM_FI_DEV_GPU_UTIL{{gpu="0",UUID="GPU-1",Hostname="{instance}"}} {util}\n'
        )

    def metric(self, name: str, **labels: str) -> float | None:
        value = self.metrics.registry.get_sample_value(name, labels)
        return value

    def close(self) -> None:
        self.scraper.close()


@pytest.fixture
def loop(exporters: ExporterServer) -> Iterator[Loop]:
    built = Loop(exporters)
    yield built
    built.close()


def test_a_node_whose_gpus_read_idle_for_the_window_is_drained(loop: Loop) -> None:
    instance = loop.one_running_node()
    loop.serve(instance, 0.0)
    for _ in range(9):
        loop.clock.advance(60)
        report = loop.controller.tick()
        assert not report.plan.drains, "idle for less than 10 minutes is not idle enough"
    node = next(n for n in report.view.instances if n.instance_id == instance)
    assert node.gpu_util_pct == 0.0 and node.idle_since is not None
    loop.clock.advance(120)
    report = loop.controller.tick()
    assert [d.instance_id for d in report.plan.drains] == [instance]
    assert instance in loop.scheduler.drained


def test_a_busy_gpu_holding_no_allocation_is_not_drained(loop: Loop) -> None:
    instance = loop.one_running_node()
    loop.nodes.cloud = {instance: NodeUsage(0, empty_since=loop.clock.now())}
    loop.serve(instance, 93.0)
    for _ in range(15):
        loop.clock.advance(60)
        report = loop.controller.tick()
        assert not report.plan.drains
    node = next(n for n in report.view.instances if n.instance_id == instance)
    assert node.gpu_util_pct == pytest.approx(93.0)


def test_a_broken_exporter_makes_the_node_unknown_never_idle(loop: Loop) -> None:
    instance = loop.one_running_node()
    loop.serve(instance, 0.0)
    loop.clock.advance(60)
    loop.controller.tick()
    loop.exporters.answers["/node"] = Answer("internal error", status=500)
    for _ in range(20):
        loop.clock.advance(60)
        report = loop.controller.tick()
        assert not report.plan.drains, "a node we cannot read is not idle"
    node = next(n for n in report.view.instances if n.instance_id == instance)
    assert node.gpu_util_pct is None and node.idle_since is None
    assert loop.metric("gpu_autoscaler_source_up", kind="telemetry", source="agents") == 0
    target = f"agents {loop.exporters.url('/node')}"
    assert loop.metric("gpu_autoscaler_source_up", kind="target", source=target) == 0
    assert loop.metric("gpu_autoscaler_source_errors_total", kind="telemetry", source="agents")
    assert any("telemetry agents" in e and "HTTP 500" in e for e in report.errors)


def test_a_failed_queue_source_says_so_in_the_metrics_and_recovers(loop: Loop) -> None:
    loop.queue.jobs = [job("x"), job("y")]
    loop.controller.tick()
    assert loop.metric("gpu_autoscaler_demand_known") == 1
    assert loop.metric("gpu_autoscaler_pending_gpus") == 2
    assert loop.metric("gpu_autoscaler_source_up", kind="queue", source="queue") == 1
    loop.queue.error = ConnectionError("slurmctld down")
    report = loop.controller.tick()
    assert report.view.demand.known is False
    assert loop.metric("gpu_autoscaler_demand_known") == 0
    assert loop.metric("gpu_autoscaler_source_up", kind="queue", source="queue") == 0
    assert loop.metric("gpu_autoscaler_source_errors_total", kind="queue", source="queue") == 1
    exposition = generate_latest(loop.metrics.registry).decode()
    assert 'gpu_autoscaler_source_up{kind="queue",source="queue"} 0.0' in exposition
    loop.queue.error = None
    loop.controller.tick()
    assert loop.metric("gpu_autoscaler_demand_known") == 1
    assert loop.metric("gpu_autoscaler_source_up", kind="queue", source="queue") == 1


def config(*sources: dict[str, object]) -> ControllerConfig:
    return ControllerConfig.model_validate({"fleet_id": "f", "sources": list(sources)})


def test_wiring_gives_each_source_the_roles_it_can_play() -> None:
    wiring = build_signals(
        config(
            {"kind": "scrape", "name": "agents", "settings": {"targets": ["h:9400"]}},
            {
                "kind": "sqs",
                "name": "jobs",
                "settings": {
                    "queue_url": "https://sqs.us-east-1.amazonaws.com/123456789012/jobs",
                    "region": "us-east-1",
                },
            },
        )
    )
    assert [s.name for s in wiring.signals.telemetry] == ["agents"]
    assert [s.name for s in wiring.signals.queues] == ["jobs"]
    assert wiring.signals.nodes is None and wiring.scheduler is None
    for telemetry in wiring.signals.telemetry:
        telemetry.close()  # type: ignore[attr-defined]


def test_a_role_a_source_cannot_play_is_one_clear_error() -> None:
    with pytest.raises(InputError) as caught:
        build_signals(
            config({"kind": "scrape", "roles": ["queue"], "settings": {"targets": ["h:1"]}}),
            where="c.yaml",
        )
    assert str(caught.value) == (
        "c.yaml: sources[0].roles: a scrape source cannot be queue; it can be telemetry"
    )


def test_an_unknown_source_kind_names_what_is_installed() -> None:
    with pytest.raises(InputError, match="scrape") as caught:
        build_signals(config({"kind": "kafka"}), where="c.yaml")
    assert "kafka" in str(caught.value)
