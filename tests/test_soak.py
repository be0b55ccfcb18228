"""The soak: 10,000+ controller ticks in the simulator with the journal and metrics on.

A controller runs for months; whatever it keeps per tick, per instance it ever saw or per job it
ever heard of shows up here as growth. The replay is the shipped scenario's busiest 10 days
(60 s ticks, 18 pools, real spot availability), so launches, drains, interruptions, checkpoints
and requeues keep happening. Warm-up is the first three simulated days: the controller's longest
sliding window (the interruption history) is full by then. ``bench/bench_soak.py`` prints the
same figures.
"""

from __future__ import annotations

import gc
import sys
from array import array
from dataclasses import dataclass, field
from pathlib import Path

from autoscaler.ops.journal.base import open_sqlite
from autoscaler.ops.metrics import Metrics
from autoscaler.sim.engine import TickSeen, prepare, simulate
from autoscaler.sim.scenario import PolicySpec, default_scenario_path, load_scenario

sys.path.insert(0, str(Path(__file__).parents[1] / "bench"))
from bench_soak import percentile, retained_bytes, rss_mib

DAYS = 10
WARMUP_DAYS = 3
SOAK_TICKS = 10_000
EVERY = 1_000
WINDOW = 1_000


@dataclass
class Sample:
    tick: int
    rss: int
    blocks: int
    controller_bytes: int
    series: int


@dataclass
class Watch:
    """What the soak records as it goes: unboxed timings, so its own record does not grow."""

    warmup: int
    metrics: Metrics
    cpu_ms: array[float] = field(default_factory=lambda: array("d"))
    samples: list[Sample] = field(default_factory=list)

    def __call__(self, seen: TickSeen) -> None:
        self.cpu_ms.append(seen.cpu_s * 1000.0)
        done = seen.report.tick + 1
        if done == self.warmup or done % EVERY == 0:
            gc.collect()
            self.samples.append(
                Sample(
                    tick=done,
                    rss=round(rss_mib() * 2**20),
                    blocks=sys.getallocatedblocks(),
                    controller_bytes=retained_bytes([seen.controller]),
                    series=len(_series(self.metrics)),
                )
            )


def _series(metrics: Metrics) -> list[tuple[str, dict[str, str]]]:
    return [(s.name, s.labels) for family in metrics.registry.collect() for s in family.samples]


def test_ten_thousand_ticks_with_journal_and_metrics_stay_flat(tmp_path: Path) -> None:
    loaded = load_scenario(default_scenario_path())
    scenario = loaded.scenario
    loaded = loaded.derive(trace=scenario.trace.model_copy(update={"busiest_days": DAYS}))
    warmup = round(WARMUP_DAYS * 86_400 / scenario.controller.tick_seconds)
    metrics = Metrics()
    watch = Watch(warmup, metrics)
    journal = open_sqlite(tmp_path / "journal.sqlite")
    try:
        result = simulate(
            prepare(loaded),
            PolicySpec(name="cost-aware"),
            journal=journal,
            metrics=metrics,
            on_tick=watch,
        )
        ticks = journal.ticks()
        calls = journal.calls()
        actions = journal.actions()
    finally:
        journal.close()

    assert result.ticks - warmup >= SOAK_TICKS, "the soak is 10,000 ticks after warm-up"
    kinds = {a.kind for a in actions}
    assert {"launch", "drain", "terminate", "interruption", "evacuate"} <= kinds, kinds
    assert result.interruptions > 0 and result.requeues > 0

    # The journal: exactly one row per tick, and no cloud call left open.
    assert [t.tick for t in ticks] == list(range(result.ticks))
    assert calls, "cloud calls were journaled"
    unfinished = [c.request_id for c in calls if c.finished_at is None or c.outcome == "started"]
    assert unfinished == []
    assert {a.request_id for a in actions if a.kind == "launch"} <= {c.request_id for c in calls}

    # Memory: the process (RSS, live interpreter allocations) grows at most 10 % after warm-up;
    # the controller's own state follows the fleet's size, not the number of ticks.
    at_warmup = next(s for s in watch.samples if s.tick == warmup)
    after = [s for s in watch.samples if s.tick > warmup]
    end = after[-1]
    assert end.rss <= 1.10 * at_warmup.rss, (at_warmup.rss, end.rss)
    assert end.blocks <= 1.10 * at_warmup.blocks, (at_warmup.blocks, end.blocks)
    warm_peak = max(s.controller_bytes for s in watch.samples if s.tick <= warmup)
    late_peak = max(s.controller_bytes for s in after)
    assert late_peak <= 1.25 * warm_peak, [(s.tick, s.controller_bytes) for s in watch.samples]

    # Metrics: no label carries an id, so the series stay bounded by pools, states and kinds.
    series = _series(metrics)
    ids = {c.request_id for c in calls} | {i for c in calls for i in c.instance_ids}
    ids |= {a.job_id for a in actions if a.job_id is not None}
    leaked = sorted({v for _, labels in series for v in labels.values()} & ids)
    assert leaked == [], leaked
    values: dict[tuple[str, str], set[str]] = {}
    for name, labels in series:
        for label, value in labels.items():
            values.setdefault((name, label), set()).add(value)
    widest = max(len(v) for v in values.values())
    assert widest <= len(scenario.controller.pools) + 1, widest
    assert end.series <= 1.10 * at_warmup.series, (at_warmup.series, end.series)

    # Tick cost (CPU, journal write and metrics included) is as steady at the end as after the
    # first window; the first is left out, it pays for first-use caches.
    windows = [
        watch.cpu_ms[i : i + WINDOW] for i in range(0, len(watch.cpu_ms) - WINDOW + 1, WINDOW)
    ]
    p99 = [percentile(window, 0.99) for window in windows]
    assert p99[-1] <= 2 * p99[1], (p99[1], p99[-1])
