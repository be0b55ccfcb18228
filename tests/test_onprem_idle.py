"""On-prem GPUs allocated but idle by measured utilisation, live: GPU readings served over a real
socket in dcgm-exporter's format, scraped, folded by the idle tracker, joined with the
scheduler's allocation in observe, and exported per node on /metrics by the real controller.
Unknown utilisation is never idle: no series, or NaN, never a zero."""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from exporter_server import Answer, ExporterServer
from fakes import FakeCloud, FakeNodes, FakeQueue, FakeScheduler, pool
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import generate_latest

from autoscaler.fleet.instances import SyncReport
from autoscaler.fleet.telemetry import IdleTracker
from autoscaler.model import Demand, FleetView, OnPremNode, Plan
from autoscaler.model.clock import ManualClock
from autoscaler.model.config import ControllerConfig
from autoscaler.model.records import TickReport
from autoscaler.ops.metrics import Metrics
from autoscaler.ops.onprem_idle import IdleNode, idle_gpu_seconds, onprem_idle
from autoscaler.sources.scrape import ScrapeSettings, ScrapeTelemetrySource
from autoscaler.tick.controller import Controller
from autoscaler.tick.observe import Observation, Signals
from autoscaler.tick.retry import RetryPolicy
from autoscaler.tick.tick_metrics import TickMetrics
from policies.cost_aware import CostAwarePolicy

IDLE = 5.0  # telemetry.idle_util_pct, the threshold idle cloud nodes are drained by
T0 = 1_000_000.0
ALLOCATED = "gpu_autoscaler_onprem_node_allocated_gpus"
UTIL = "gpu_autoscaler_onprem_node_gpu_utilisation_ratio"
NODE_IDLE = "gpu_autoscaler_onprem_node_idle_allocated_gpus"
FLEET_IDLE = "gpu_autoscaler_onprem_idle_allocated_gpus"
IDLE_SECONDS = "gpu_autoscaler_onprem_idle_allocated_gpu_seconds_total"
UNMEASURED = "gpu_autoscaler_onprem_unmeasured_nodes"


def dcgm(host: str, utils: list[float | str]) -> str:
    lines = [
        f'DCGM_FI_DEV_GPU_UTIL{{gpu="{i}",UUID="GPU-{host}-{i}",Hostname="{host}"}} {u}'
        for i, u in enumerate(utils)
    ]
    return "# TYPE DCGM_FI_DEV_GPU_UTIL gauge\n" + "\n".join(lines) + "\n"


@dataclass
class Live:
    controller: Controller
    nodes: FakeNodes
    exporters: ExporterServer
    clock: ManualClock
    metrics: Metrics

    def value(self, name: str, node: str | None = None) -> float | None:
        labels = {"node": node} if node is not None else {}
        return self.metrics.registry.get_sample_value(name, labels)

    def serve(self, host: str, utils: list[float | str]) -> None:
        self.exporters.answers[f"/{host}"] = Answer(dcgm(host, utils))

    def tick(self, after_s: float = 0.0) -> None:
        self.clock.advance(after_s)
        self.controller.tick()


@pytest.fixture
def live(exporters: ExporterServer) -> Iterator[Live]:
    clock = ManualClock(T0)
    scrape = ScrapeTelemetrySource(
        ScrapeSettings(targets=tuple(exporters.url(f"/{h}") for h in ("n1", "n2", "n3", "n4"))),
        "gpus",
        clock,
    )
    nodes = FakeNodes(
        onprem=[
            OnPremNode(name="n1", gpus=8, gpus_allocated=4),
            OnPremNode(name="n2", gpus=8, gpus_allocated=8),
            OnPremNode(name="n3", gpus=4, gpus_allocated=2),
            OnPremNode(name="n4", gpus=8, gpus_allocated=0),
        ]
    )
    metrics = Metrics()
    controller = Controller(
        ControllerConfig(fleet_id="test", pools=(pool("a"),)),
        CostAwarePolicy(),
        {"fake": FakeCloud("fake", price_table={"a": 1.0}, now=clock.now)},
        clock,
        scheduler=FakeScheduler(),
        incarnation="t",
        retry=RetryPolicy(attempts=1, sleep=lambda _s: None),
        signals=Signals(
            queues=(FakeQueue(),),
            nodes=nodes,
            telemetry=(scrape,),
            tracker=IdleTracker(idle_util_pct=IDLE, window_s=600.0, max_age_s=180.0),
        ),
        metrics=metrics,
    )
    world = Live(controller, nodes, exporters, clock, metrics)
    world.serve("n1", [0, 2, 1, 3, 0, 0, 4, 1])  # every GPU below 5 %: idle
    world.serve("n2", [90] * 8)  # busy
    world.serve("n3", ["NaN"] * 4)  # no reading the scraper takes: unmeasured
    world.serve("n4", [0] * 8)  # idle, and nothing allocated
    yield world
    scrape.close()


def test_allocated_idle_gpus_are_exported_per_node_from_measured_utilisation(live: Live) -> None:
    live.tick()
    assert live.value(ALLOCATED, "n1") == 4
    assert live.value(UTIL, "n1") == pytest.approx(11 / 8 / 100)
    assert live.value(NODE_IDLE, "n1") == 4, "all four allocated GPUs sit on an idle node"
    assert live.value(UTIL, "n2") == pytest.approx(0.9)
    assert live.value(NODE_IDLE, "n2") == 0, "a busy node wastes nothing"
    assert live.value(NODE_IDLE, "n4") == 0, "idle, but nothing is allocated on it"
    assert live.value(ALLOCATED, "n3") == 2
    assert live.value(UTIL, "n3") is None, "no reading: no utilisation series, never a zero"
    assert live.value(NODE_IDLE, "n3") is None, "unknown utilisation is not idle"
    assert live.value(FLEET_IDLE) == 4
    assert live.value(UNMEASURED) == 1
    assert live.value(IDLE_SECONDS) == 0, "the first tick has no interval behind it"

    live.tick(60)
    assert live.value(IDLE_SECONDS) == 4 * 60

    # n1's jobs wake up; n2's go quiet (its GPUs last read busy at the tick before)
    live.serve("n1", [50] * 8)
    live.serve("n2", [0] * 8)
    live.tick(60)
    assert live.value(NODE_IDLE, "n1") == 0
    assert live.value(NODE_IDLE, "n2") == 8
    assert live.value(FLEET_IDLE) == 8
    assert live.value(IDLE_SECONDS) == 4 * 60 + 8 * 60


def test_a_node_gone_loses_its_series_and_a_failed_node_source_is_unknown(live: Live) -> None:
    live.tick()
    live.nodes.onprem = [n for n in live.nodes.onprem if n.name != "n4"]
    live.tick(30)
    text = generate_latest(live.metrics.registry).decode()
    assert 'node="n4"' not in text, "a node the scheduler no longer lists leaves no series"
    assert 'node="n1"' in text

    live.nodes.error = RuntimeError("slurmrestd down")
    live.tick(30)
    text = generate_latest(live.metrics.registry).decode()
    assert 'node="' not in text, "no per-node series while the node source fails"
    fleet = live.value(FLEET_IDLE)
    assert fleet is not None and math.isnan(fleet), "unknown, never 0"
    unmeasured = live.value(UNMEASURED)
    assert unmeasured is not None and math.isnan(unmeasured)
    seconds = live.value(IDLE_SECONDS)

    live.nodes.error = None
    live.tick(30)
    assert live.value(NODE_IDLE, "n1") == 4
    assert live.value(IDLE_SECONDS) == (seconds or 0) + 4 * 30


def test_stale_readings_make_a_node_unknown_not_idle(live: Live) -> None:
    live.tick()
    assert live.value(NODE_IDLE, "n1") == 4
    live.exporters.answers.pop("/n1")  # its exporter stops answering
    live.tick(181)  # past telemetry.max_age_s
    assert live.value(NODE_IDLE, "n1") is None
    assert live.value(UTIL, "n1") is None
    assert live.value(ALLOCATED, "n1") == 4, "the scheduler still says what is allocated"
    assert live.value(FLEET_IDLE) == 0, "n2 and n4 are measured and waste nothing"


def test_what_a_tick_records_is_unknown_when_it_cannot_know() -> None:
    measured_idle = OnPremNode(
        name="a", gpus=8, gpus_allocated=3, gpu_util_pct=1.0, idle_since=T0 - 100
    )
    unmeasured = OnPremNode(name="b", gpus=8, gpus_allocated=8)
    nan = OnPremNode(name="c", gpus=8, gpus_allocated=8, gpu_util_pct=math.nan, idle_since=T0)
    assert onprem_idle([measured_idle, unmeasured, nan], []) == (IdleNode("a", 3, T0 - 100),)
    assert onprem_idle([unmeasured, nan], []) is None, "allocated GPUs and no reading at all"
    assert onprem_idle([measured_idle], ["nodes/slurm"]) is None, "the node source failed"
    assert onprem_idle([], []) == (), "no on-prem node: nothing is allocated, nothing idle"
    node = IdleNode("a", 3, T0 - 100)
    assert idle_gpu_seconds(node, T0, None) == 0.0
    assert idle_gpu_seconds(node, T0, T0 - 30) == 3 * 30
    assert idle_gpu_seconds(node, T0, T0 - 300) == 3 * 100, "only the part it has read idle"


node_states = st.tuples(
    st.integers(0, 8),  # allocated
    st.one_of(st.none(), st.just(math.nan), st.floats(0, 100)),  # utilisation %
    st.booleans(),  # reads idle
)


@settings(max_examples=80, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.dictionaries(st.sampled_from(["a", "b", "c", "d"]), node_states),
            st.booleans(),  # the node source failed
        ),
        min_size=1,
        max_size=12,
    )
)
def test_series_always_say_what_the_last_tick_saw(
    ticks: list[tuple[dict[str, tuple[int, float | None, bool]], bool]],
) -> None:
    """However nodes come, go, lose and regain their readings, the exported per-node series
    are exactly those of the last tick's view (series are only set when a value changes, so
    this is what keeps that honest)."""
    metrics = Metrics()
    recorder = TickMetrics(metrics, (), 0)
    for number, (state, failed) in enumerate(ticks):
        now = T0 + 30 * number
        nodes = tuple(
            OnPremNode(
                name=name,
                gpus=8,
                gpus_allocated=allocated,
                gpu_util_pct=util,
                idle_since=now - 10 if idle else None,
            )
            for name, (allocated, util, idle) in sorted(state.items())
        )
        view = FleetView.model_construct(
            now=now,
            tick=number,
            fleet_id="x",
            pools=(),
            onprem=() if failed else nodes,
            instances=(),
            demand=Demand(),
            notices=(),
            last_plan=None,
        )
        report = TickReport(
            tick=number,
            now=now,
            view=view,
            plan=Plan(),
            held=None,
            clamps=[],
            actions=[],
            failing_sources=["nodes/slurm"] if failed else [],
        )
        recorder.record(Observation(view, SyncReport()), report, 0, 1)
        want: dict[tuple[str, str], float] = {}
        for allocated, name, util, idle in (
            (n.gpus_allocated, n.name, n.gpu_util_pct, n.idle_since) for n in view.onprem
        ):
            want[(ALLOCATED, name)] = allocated
            if util is not None and not math.isnan(util):
                want[(UTIL, name)] = util / 100
                want[(NODE_IDLE, name)] = allocated if idle is not None else 0
        got = {
            (sample.name, sample.labels["node"]): sample.value
            for family in metrics.registry.collect()
            for sample in family.samples
            if "node" in sample.labels
        }
        assert got == pytest.approx(want)
        fleet = metrics.registry.get_sample_value(FLEET_IDLE)
        assert fleet is not None
        if failed:
            assert math.isnan(fleet)
        elif not any(k[0] == UTIL for k in want) and any(n.gpus_allocated for n in nodes):
            assert math.isnan(fleet), "allocated GPUs and no reading: unknown"
        else:
            assert fleet == sum(v for (m, _), v in want.items() if m == NODE_IDLE)
