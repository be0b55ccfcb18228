"""A soak: thousands of controller ticks in the simulator with the journal and metrics on.

Replays the busiest ``--days`` of the shipped scenario (60 s ticks, its full fleet of 18 pools,
real spot availability, so launches, drains, interruptions and checkpoints keep happening)
through the real controller with an SQLite journal in a temporary folder and a ``Metrics``
registry, and watches whether anything the loop keeps grows with the number of ticks.

Warm-up is the first ``--warmup-days`` (3 by default: the controller's longest sliding window,
the interruption history, fills in that time); growth is measured from there to the end. Every
``--every`` ticks, after a full garbage collection, it samples:

* RSS (``/proc/self/statm``) and the interpreter's allocated blocks (``sys.getallocatedblocks``):
  the whole process, the simulated world and its per-job records included;
* the controller stack's retained bytes: everything reachable from the controller (instance
  table, caches, policy, ledgers, journal, metrics registry) except the simulated world;
* the metrics registry's series count.

Per-tick wall and CPU time cover the whole ``Controller.tick()`` call (journal write and metrics
included); p50/p99 are printed per 1,000-tick window. A second run of the same replay under
``tracemalloc`` (skip with ``--skip-tracemalloc``; it makes ticks ~7x slower) prints traced
memory at warm-up and at the end and the allocation sites that grew most in between.

Figures only: the exit status is 0 whatever they show (1 only if the soak fails to run).

    .venv/bin/python bench/bench_soak.py [--days 10] [--warmup-days 3] [--every 500]
        [--skip-tracemalloc] [--json OUT.json]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sqlite3
import subprocess
import sys
import tempfile
import time
import tracemalloc
import types
from array import array
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from autoscaler.ops.journal.base import open_sqlite
from autoscaler.ops.metrics import Metrics
from autoscaler.sim.engine import TickSeen, prepare, simulate
from autoscaler.sim.scenario import PolicySpec, default_scenario_path, load_scenario

DAY = 86_400.0
WINDOW = 1_000
POLICY = "cost-aware"
# Not part of the controller's memory: code and classes are shared and fixed, and the simulated
# world (scheduler, clouds, clock) grows with the jobs it replays, by design.
_OPAQUE = (
    type,
    types.ModuleType,
    types.FunctionType,
    types.BuiltinFunctionType,
    types.CodeType,
    types.FrameType,
)
_WORLD_MODULES = ("autoscaler.sim.",)


def _in_world(filename: str) -> bool:
    """Allocated by the simulated world or by this soak's own record of the ticks."""
    return "/autoscaler/sim/" in filename or filename == __file__


def rss_mib() -> float:
    with open("/proc/self/statm", encoding="ascii") as handle:
        resident = int(handle.read().split()[1])
    return resident * os.sysconf("SC_PAGE_SIZE") / 2**20


def retained_bytes(roots: Iterable[object]) -> int:
    """Bytes reachable from ``roots``, each object once, not entering code, classes, modules or
    the simulated world: what the controller itself keeps alive."""
    seen: set[int] = set()
    stack = list(roots)
    total = 0
    while stack:
        obj = stack.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, _OPAQUE) or type(obj).__module__.startswith(_WORLD_MODULES):
            continue
        total += sys.getsizeof(obj)
        stack.extend(gc.get_referents(obj))
    return total


def series_count(metrics: Metrics) -> int:
    return sum(len(family.samples) for family in metrics.registry.collect())


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


def windows(values: Sequence[float], size: int = WINDOW) -> list[tuple[float, float]]:
    """(p50, p99) per full window of ``size`` ticks."""
    return [
        (percentile(values[i : i + size], 0.5), percentile(values[i : i + size], 0.99))
        for i in range(0, len(values) - size + 1, size)
    ]


def journal_figures(path: Path) -> dict[str, Any]:
    size = sum(p.stat().st_size for p in path.parent.glob(path.name + "*"))
    db = sqlite3.connect(str(path))
    try:
        rows = {
            table: int(db.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0])
            for table in ("ticks", "actions", "cloud_calls", "instance_costs")
        }
        unfinished = int(
            db.execute("SELECT COUNT(*) FROM cloud_calls WHERE finished_at IS NULL").fetchone()[0]
        )
        kinds = dict(db.execute("SELECT kind, COUNT(*) FROM actions GROUP BY kind").fetchall())
    finally:
        db.close()
    return {"bytes": size, "rows": rows, "unfinished_calls": unfinished, "actions_by_kind": kinds}


def soak(days: float, warmup_days: float, every: int, traced: bool) -> dict[str, Any]:
    """One replay; with ``traced`` only tracemalloc's figures are taken (timings would be its)."""
    if traced:
        # From before the scenario is read, so the traced total is the whole replay's memory.
        tracemalloc.start()
    loaded = load_scenario(default_scenario_path())
    scenario = loaded.scenario
    loaded = loaded.derive(trace=scenario.trace.model_copy(update={"busiest_days": days}))
    warmup = round(warmup_days * DAY / scenario.controller.tick_seconds)
    prepared = prepare(loaded)
    # Unboxed, so that the soak's own record of 10,000+ ticks is not what grows.
    wall_ms = array("d")
    cpu_ms = array("d")
    samples: list[dict[str, Any]] = []
    snapshots: list[tracemalloc.Snapshot] = []
    metrics = Metrics()

    def sample(seen: TickSeen) -> None:
        gc.collect()
        if traced:
            samples.append(
                {
                    "tick": seen.report.tick + 1,
                    "traced_mib": tracemalloc.get_traced_memory()[0] / 2**20,
                }
            )
            # The warm-up's snapshot, and the latest one (the end is inside the replay, before
            # the result's lists are built).
            if seen.report.tick + 1 >= warmup:
                snapshots[1:] = [tracemalloc.take_snapshot()]
            return
        samples.append(
            {
                "tick": seen.report.tick + 1,
                "rss_mib": rss_mib(),
                "blocks": sys.getallocatedblocks(),
                "controller_bytes": retained_bytes([seen.controller]),
                "series": series_count(metrics),
            }
        )

    def on_tick(seen: TickSeen) -> None:
        wall_ms.append(seen.wall_s * 1000.0)
        cpu_ms.append(seen.cpu_s * 1000.0)
        done = seen.report.tick + 1
        if done == warmup or done % every == 0:
            sample(seen)

    with tempfile.TemporaryDirectory(prefix="bench-soak-") as scratch:
        path = Path(scratch) / "journal.sqlite"
        journal = open_sqlite(path)
        started = time.perf_counter()
        result = simulate(
            prepared, PolicySpec(name=POLICY), journal=journal, metrics=metrics, on_tick=on_tick
        )
        wall_s = time.perf_counter() - started
        if traced:
            tracemalloc.stop()
        journal.close()
        figures: dict[str, Any] = {
            "days": days,
            "ticks": result.ticks,
            "warmup_ticks": warmup,
            "wall_s": wall_s,
            "samples": samples,
            "launched": result.launched,
            "interruptions": result.interruptions,
            "requeues": result.requeues,
            "migrations": result.migrations,
            "capacity_failures": result.capacity_failures,
            "jobs_total": result.jobs_total,
        }
        if traced:
            grown = snapshots[1].compare_to(snapshots[0], "lineno") if len(snapshots) > 1 else []
            world = [g for g in grown if _in_world(g.traceback[0].filename)]
            rest = [g for g in grown if not _in_world(g.traceback[0].filename)]
            figures["world_growth_bytes"] = sum(g.size_diff for g in world)
            figures["rest_growth_bytes"] = sum(g.size_diff for g in rest)
            figures["top_growth"] = [str(g) for g in rest[:10]]
            return figures
        figures["journal"] = journal_figures(path)
    figures["wall_windows_ms"] = windows(wall_ms)
    figures["cpu_windows_ms"] = windows(cpu_ms)
    figures["tick_wall_ms_p50"] = percentile(wall_ms, 0.5)
    figures["tick_wall_ms_p99"] = percentile(wall_ms, 0.99)
    return figures


def _growth(samples: list[dict[str, Any]], warmup: int, key: str) -> tuple[float, float, float]:
    first = next(s for s in samples if s["tick"] == warmup)[key]
    last = samples[-1][key]
    return first, last, 100.0 * (last - first) / first


def report(plain: dict[str, Any], traced: dict[str, Any] | None) -> None:
    warmup = plain["warmup_ticks"]
    print(
        f"soak: busiest {plain['days']:g} days of {default_scenario_path().name}, policy {POLICY}, "
        f"SQLite journal + metrics on"
    )
    print(
        f"  {plain['ticks']:,} ticks in {plain['wall_s']:.1f} s wall; warm-up {warmup:,} ticks; "
        f"{plain['jobs_total']:,} jobs, {plain['launched']:,} instances launched, "
        f"{plain['interruptions']} interruptions, {plain['requeues']} requeues, "
        f"{plain['migrations']} migrations, {plain['capacity_failures']} capacity failures"
    )
    print(f"  {'tick':>7s} {'RSS MiB':>8s} {'blocks':>9s} {'ctrl KiB':>9s} {'series':>7s}")
    for s in plain["samples"]:
        print(
            f"  {s['tick']:7,d} {s['rss_mib']:8.1f} {s['blocks']:9,d} "
            f"{s['controller_bytes'] / 1024:9.0f} {s['series']:7d}"
        )
    for key, label in (
        ("rss_mib", "RSS (MiB)"),
        ("blocks", "allocated blocks"),
        ("controller_bytes", "controller retained bytes"),
        ("series", "metric series"),
    ):
        first, last, pct = _growth(plain["samples"], warmup, key)
        print(f"  {label}: {first:,.1f} at warm-up -> {last:,.1f} at the end ({pct:+.1f} %)")
    walls, cpus = plain["wall_windows_ms"], plain["cpu_windows_ms"]
    print("  tick ms per 1,000-tick window (whole tick() call, journal + metrics included):")
    print(f"    {'window':>8s} {'wall p50':>9s} {'wall p99':>9s} {'cpu p50':>8s} {'cpu p99':>8s}")
    for i, ((w50, w99), (c50, c99)) in enumerate(zip(walls, cpus, strict=True)):
        if i in (0, 1) or i >= len(walls) - 1:
            print(f"    {i + 1:8d} {w50:9.2f} {w99:9.2f} {c50:8.2f} {c99:8.2f}")
        elif i == 2:
            print("    ...")
    if len(walls) >= 2:
        print(
            f"  last window p99 / second window p99: wall {walls[-1][1] / walls[1][1]:.2f}x, "
            f"cpu {cpus[-1][1] / cpus[1][1]:.2f}x"
        )
    journal = plain["journal"]
    print(
        f"  journal: {journal['bytes'] / 2**20:.1f} MiB (db + WAL), rows {journal['rows']}, "
        f"unfinished cloud calls {journal['unfinished_calls']}, "
        f"actions by kind {journal['actions_by_kind']}"
    )
    if traced is not None:
        first, last, pct = _growth(traced["samples"], traced["warmup_ticks"], "traced_mib")
        print(
            f"  tracemalloc (second run, {traced['wall_s']:.0f} s): traced {first:.2f} MiB at "
            f"warm-up -> {last:.2f} MiB at the end ({pct:+.1f} %)"
        )
        print(
            f"    of the growth, {traced['world_growth_bytes'] / 1024:+,.0f} KiB was allocated in "
            f"autoscaler/sim/ and by this soak's record, {traced['rest_growth_bytes'] / 1024:+,.0f}"
            " KiB elsewhere; largest growth elsewhere by line:"
        )
        for line in traced["top_growth"]:
            print(f"    {line}")


def _in_subprocess(args: list[str]) -> dict[str, Any]:
    """Each run in a fresh process, so one's memory does not show in the other's."""
    command = [sys.executable, str(Path(__file__).resolve()), "--worker", *args]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{done.stderr[-4000:]}")
    figures: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return figures


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--worker"]:
        days, warmup_days, every, under_tracemalloc = argv[1:5]
        figures = soak(float(days), float(warmup_days), int(every), under_tracemalloc == "1")
        print(json.dumps(figures))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--days", type=float, default=10.0, help="busiest days replayed")
    parser.add_argument("--warmup-days", type=float, default=3.0)
    parser.add_argument("--every", type=int, default=1_000, help="sample memory every N ticks")
    parser.add_argument("--skip-tracemalloc", action="store_true")
    parser.add_argument("--json", type=Path, help="also write the figures here as JSON")
    args = parser.parse_args(argv)
    common = [str(args.days), str(args.warmup_days), str(args.every)]
    try:
        plain = _in_subprocess([*common, "0"])
        traced = None if args.skip_tracemalloc else _in_subprocess([*common, "1"])
    except RuntimeError as exc:
        print(exc, file=sys.stderr)
        return 1
    report(plain, traced)
    if args.json is not None:
        args.json.write_text(json.dumps({"plain": plain, "traced": traced}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
