"""The idle tracker: the invariants a drain decision rests on, against a brute-force reading of
the same samples."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from autoscaler.fleet.telemetry import IdleTracker, NodeTelemetry, apply
from autoscaler.spi.sources import GpuSample, NodeUsage

THRESHOLD = 5.0
WINDOW = 600.0
MAX_AGE = 180.0

steps = st.lists(
    st.tuples(
        st.sampled_from(["h1", "h2"]),
        st.sampled_from(["0", "1"]),
        st.floats(min_value=1, max_value=120),
        st.one_of(st.floats(min_value=0, max_value=4.99), st.floats(min_value=5, max_value=100)),
    ),
    min_size=1,
    max_size=60,
)


def feed(rows: list[tuple[str, str, float, float]]) -> tuple[IdleTracker, list[GpuSample], float]:
    tracker = IdleTracker(THRESHOLD, WINDOW, MAX_AGE)
    now = 0.0
    samples = []
    for host, gpu, gap, util in rows:
        now += gap
        sample = GpuSample(host=host, gpu=gpu, util_pct=util, at=now)
        samples.append(sample)
        tracker.observe([sample])
    return tracker, samples, now


@given(steps, st.floats(min_value=0, max_value=400))
def test_idle_since_is_when_the_last_gpu_went_quiet_and_stale_hosts_are_unknown(
    rows: list[tuple[str, str, float, float]], later: float
) -> None:
    tracker, samples, last = feed(rows)
    now = last + later
    nodes = tracker.nodes(now)
    for host in {s.host for s in samples}:
        per_gpu: dict[str, list[GpuSample]] = {}
        for sample in samples:
            if sample.host == host:
                per_gpu.setdefault(sample.gpu, []).append(sample)
        latest = {gpu: readings[-1] for gpu, readings in per_gpu.items()}
        if any(now - s.at > MAX_AGE for s in latest.values()):
            assert host not in nodes, "a host with a stale GPU is unknown, never idle"
            continue
        reading = nodes[host]
        if any(s.util_pct >= THRESHOLD for s in latest.values()):
            assert reading.idle_since is None
            continue
        expected = max(
            max((s.at for s in readings if s.util_pct >= THRESHOLD), default=readings[0].at)
            for readings in per_gpu.values()
        )
        assert reading.idle_since == expected
        assert reading.idle_since <= now


@given(steps)
def test_mean_utilisation_stays_within_the_readings_of_the_window(
    rows: list[tuple[str, str, float, float]],
) -> None:
    tracker, samples, now = feed(rows)
    for host, reading in tracker.nodes(now).items():
        utils = [s.util_pct for s in samples if s.host == host]
        assert min(utils) - 1e-9 <= reading.util_pct <= max(utils) + 1e-9


def test_an_old_or_repeated_reading_does_not_move_the_gpu_back_in_time() -> None:
    """The reading at 150 arrives after the one at 200: the GPU's latest stays the one at 200
    (idle now, and the window's mean is of the readings in order), but the GPU was busy at 150,
    so it has been idle only since then (issue 15: busy evidence is never dropped)."""
    tracker = IdleTracker(THRESHOLD, WINDOW, MAX_AGE)
    tracker.observe([GpuSample("h", "0", 90.0, at=100.0)])
    tracker.observe([GpuSample("h", "0", 0.0, at=200.0)])
    tracker.observe([GpuSample("h", "0", 95.0, at=150.0)])
    assert tracker.nodes(210.0)["h"] == NodeTelemetry(util_pct=45.0, idle_since=150.0)
    tracker.observe([GpuSample("h", "0", 0.0, at=200.0)])
    assert tracker.nodes(210.0)["h"] == NodeTelemetry(util_pct=45.0, idle_since=150.0)


def test_forgotten_hosts_leave_no_readings() -> None:
    tracker = IdleTracker()
    tracker.observe([GpuSample("h", "0", 0.0, at=10.0), GpuSample("g", "0", 0.0, at=10.0)])
    tracker.forget(["h"])
    assert set(tracker.nodes(20.0)) == {"g"}


def test_apply_joins_measurements_and_keeps_the_scheduler_view_for_unmeasured_nodes() -> None:
    usage = {"a": NodeUsage(2, empty_since=5.0), "b": NodeUsage(1)}
    joined = apply(usage, {"a": NodeTelemetry(3.0, 40.0)})
    assert joined["a"] == NodeUsage(2, 3.0, 40.0, 5.0)
    assert joined["b"] == NodeUsage(1)
