"""Time and peak memory of the offline lower bound on a large seeded synthetic job list.

The jobs follow the shipped Alibaba trace's shape: diurnal Poisson arrivals, lognormal durations
(median 616 s, a heavy tail capped at 7 days), mostly one-GPU jobs, some 2-, 4- and 8-GPU jobs,
gangs of 2 and 4 whole 8-GPU nodes, jobs pinned to A100 or V100, a few that need 80 GiB GPUs
(only the on-prem A100s have them) and a few 12-GPU single-node jobs that nothing can host. The
fleet: 960 on-prem GPUs (80 8-GPU A100-80GB nodes, 40 8-GPU V100 nodes) and V100 / A100 pools
of 1 and 8 GPUs, spot and on-demand, with hourly spot prices and blinking spot availability.

Each path runs in a child process, so its peak RSS (``ru_maxrss``) is its own; ``baseline`` is
the child's peak after imports and building the jobs, before the bound. The old path is the
single-price bound of commit 4ef8043 (read with ``git show``), run on the same jobs with the
cheapest GPU price and all on-prem GPUs pooled; it is skipped with ``--no-old``.

    .venv/bin/python bench/bench_lower_bound.py --jobs 30000 --days 14 --onprem-gpus 960
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from autoscaler.model import Market, Pool  # noqa: E402
from autoscaler.sim.cloud import PoolMarketModel  # noqa: E402
from autoscaler.sim.lowerbound_lp import DEFAULT_MAX_PAUSE_VARIABLES  # noqa: E402
from autoscaler.sim.market import AvailabilityTrace  # noqa: E402
from autoscaler.sim.series import StepSeries  # noqa: E402

DAY = 86_400.0
HOUR = 3600.0
OLD_COMMIT = "4ef8043765f3466e3589343dbcb3454571b9d4e5"


@dataclass(frozen=True)
class Job:
    submit: float
    duration: float
    gpus: int
    nodes: int = 1
    gpu_models: tuple[str, ...] = ()
    min_gpu_memory_gib: float | None = None


@dataclass(frozen=True)
class NodeKind:
    name: str
    gpus: int
    gpu_model: str
    count: int
    gpu_memory_gib: float


def _arrivals(rng: np.random.Generator, jobs: int, horizon: float) -> np.ndarray:
    """Diurnal (4:1) Poisson arrivals with quieter weekends, by thinning, sorted."""
    kept: list[np.ndarray] = []
    have = 0
    while have < jobs:
        t = rng.uniform(0.0, horizon, size=2 * (jobs - have) + 1024)
        hour = (t % DAY) / HOUR
        rate = (1.0 + 0.6 * np.cos(2 * math.pi * (hour - 14.0) / 24.0)) * np.where(
            (t // DAY) % 7 >= 5, 0.6, 1.0
        )
        chosen = t[rng.uniform(0.0, 1.6, size=t.size) < rate]
        kept.append(chosen)
        have += chosen.size
    return np.sort(np.concatenate(kept)[:jobs])


def make_jobs(count: int, days: float, seed: int) -> list[Job]:
    rng = np.random.default_rng(seed)
    horizon = days * DAY
    submit = _arrivals(rng, count, horizon)
    duration = np.clip(np.exp(rng.normal(math.log(616.0), 2.8, size=count)), 10.0, 7 * DAY)
    kind = rng.choice(9, size=count, p=(0.62, 0.12, 0.06, 0.06, 0.05, 0.05, 0.02, 0.015, 0.005))
    pin = rng.choice(3, size=count, p=(0.6, 0.3, 0.1))
    jobs: list[Job] = []
    for i in range(count):
        models = ((), ("a100",), ("v100",))[int(pin[i])]
        s, d = float(submit[i]), float(np.rint(duration[i]))
        k = int(kind[i])
        if k <= 1:
            jobs.append(Job(s, d, 1, gpu_models=models))
        elif k <= 4:
            jobs.append(Job(s, d, (2, 4, 8)[k - 2], gpu_models=models))
        elif k == 5:
            jobs.append(Job(s, d, 16, nodes=2, gpu_models=models))
        elif k == 6:
            jobs.append(Job(s, d, 32, nodes=4, gpu_models=models))
        elif k == 7:
            jobs.append(Job(s, d, 1, min_gpu_memory_gib=80.0))
        else:
            jobs.append(Job(s, d, 12))
    return jobs


ONPREM = (
    NodeKind("a100-80gb", 8, "A100-SXM4-80GB", 80, 80.0),
    NodeKind("v100", 8, "V100", 40, 16.0),
)


def _pool(name: str, gpus: int, model: str, memory: float, market: str) -> Pool:
    return Pool(
        name=name,
        provider="aws" if "V100" in model else "gcp",
        region="r",
        instance_type=name,
        gpus_per_instance=gpus,
        gpu_model=model,
        gpu_memory_gib=memory,
        market=Market(market),
    )


POOLS = (
    _pool("v100-1-spot", 1, "V100", 16.0, "spot"),
    _pool("v100-8-spot", 8, "V100", 16.0, "spot"),
    _pool("a100-1-spot", 1, "A100-40GB", 40.0, "spot"),
    _pool("a100-8-spot", 8, "A100-40GB", 40.0, "spot"),
    _pool("v100-1-od", 1, "V100", 16.0, "on-demand"),
    _pool("v100-8-od", 8, "V100", 16.0, "on-demand"),
    _pool("a100-1-od", 1, "A100-40GB", 40.0, "on-demand"),
    _pool("a100-8-od", 8, "A100-40GB", 40.0, "on-demand"),
)
BASE_PRICE = {
    "v100-1-spot": 0.92,
    "v100-8-spot": 8.8,
    "a100-1-spot": 1.2,
    "a100-8-spot": 9.6,
    "v100-1-od": 3.06,
    "v100-8-od": 24.48,
    "a100-1-od": 3.67,
    "a100-8-od": 29.39,
}


def make_markets(days: float, seed: int) -> dict[str, PoolMarketModel]:
    """Hourly spot prices (a ±20 % random walk), blinking spot availability, flat on-demand."""
    rng = np.random.default_rng(seed + 1)
    hours = int(days * 24)
    markets: dict[str, PoolMarketModel] = {}
    for pool in POOLS:
        base = BASE_PRICE[pool.name]
        if pool.is_spot:
            walk = np.clip(1.0 + np.cumsum(rng.normal(0, 0.03, size=hours)), 0.8, 1.2)
            price = StepSeries([h * HOUR for h in range(hours)], (base * walk).tolist())
            cuts = np.sort(rng.uniform(0, 2 * DAY, size=12))
            up = [0.0, *cuts.tolist()]
            avail = AvailabilityTrace(
                pool.name, 1, StepSeries(up, [1.0, *[float(i % 2) for i in range(12)]], 2 * DAY)
            )
            markets[pool.name] = PoolMarketModel(price, availability=avail)
        else:
            markets[pool.name] = PoolMarketModel(StepSeries([0.0], [base]))
    return markets


def _rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _old_module(path: Path) -> Any:
    spec = importlib.util.spec_from_file_location("old_lowerbound", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["old_lowerbound"] = module
    spec.loader.exec_module(module)
    return module


def child(args: argparse.Namespace) -> None:
    """One path, in this process; prints one JSON line."""
    from autoscaler.sim.lowerbound import bound, build_problem, cheapest_gpu_price

    jobs = make_jobs(args.jobs, args.days, args.seed)
    markets = make_markets(args.days, args.seed)
    horizon = args.days * DAY
    scale = args.onprem_gpus / 960.0
    onprem = [
        NodeKind(k.name, k.gpus, k.gpu_model, max(1, round(k.count * scale)), k.gpu_memory_gib)
        for k in ONPREM
    ]
    baseline = _rss_mib()
    out: dict[str, object] = {"path": args.child, "baseline_mib": baseline}
    started = time.perf_counter()
    cpu_started = _cpu_s()
    if args.child == "new":
        problem = build_problem(jobs, onprem, POOLS, markets, horizon)
        setup = time.perf_counter() - started
        results = []
        for wait in (0.0, args.wait):
            r = bound(problem, wait, args.bin, max_pause_variables=args.max_pause_variables)
            results.append(
                {
                    "wait": wait,
                    "cost": r.cost,
                    "status": r.status,
                    "method": r.method,
                    "s": round(r.solve_s, 2),
                    "block_bins": r.block_bins,
                    "pause_variables": r.pause_variables,
                }
            )
        out.update(
            setup_s=round(setup, 2),
            classes=len(problem.classes),
            groups=len(problem.onprem_gpus),
            excluded_jobs=problem.excluded_jobs,
            excluded_gpu_hours=round(problem.excluded_gpu_hours, 1),
            results=results,
        )
    else:
        old: Any = _old_module(Path(args.old_file))
        price = cheapest_gpu_price(markets, POOLS, horizon)
        if args.child == "old-hostable":
            kept = build_problem(jobs, onprem, POOLS, markets, horizon)
            columns = (kept.submit.tolist(), kept.duration.tolist(), kept.gpus.tolist())
            bound_jobs = [old.BoundJob(a, d, int(g)) for a, d, g in zip(*columns, strict=True)]
        else:
            bound_jobs = [old.BoundJob(j.submit, j.duration, j.gpus) for j in jobs]
        onprem_total = sum(k.gpus * k.count for k in onprem)
        results = []
        for wait in (0.0, args.wait):
            r = old.lower_bound(bound_jobs, onprem_total, price, horizon, wait, args.bin)
            results.append(
                {"wait": wait, "cost": r.cost, "status": r.status, "s": round(r.solve_s, 2)}
            )
        out.update(results=results)
    out["total_s"] = round(time.perf_counter() - started, 2)
    out["cpu_s"] = round(_cpu_s() - cpu_started, 2)
    out["peak_mib"] = _rss_mib()
    print(json.dumps(out))


def _run(path: str, args: argparse.Namespace, old_file: str | None) -> dict[str, object] | None:
    command = [
        sys.executable,
        __file__,
        "--child",
        path,
        "--jobs",
        str(args.jobs),
        "--days",
        str(args.days),
        "--seed",
        str(args.seed),
        "--onprem-gpus",
        str(args.onprem_gpus),
        "--wait",
        str(args.wait),
        "--bin",
        str(args.bin),
        "--max-pause-variables",
        str(args.max_pause_variables),
    ]
    if old_file is not None:
        command += ["--old-file", old_file]
    done = subprocess.run(
        command, check=False, capture_output=True, text=True, timeout=args.timeout
    )
    if done.returncode != 0:
        print(f"{path}: failed ({done.returncode}): {done.stderr.strip()[-500:]}")
        return None
    parsed: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return parsed


def _describe(result: dict[str, object]) -> str:
    name = {
        "new": "new path",
        "old": "old path (all jobs, cheapest GPU price, on-prem GPUs pooled)",
        "old-hostable": "old path on the jobs the new bound keeps",
    }[str(result["path"])]
    lines = [
        f"{name}: {result['total_s']} s in all ({result.get('cpu_s', '?')} s CPU), peak RSS "
        f"{result['peak_mib']:.0f} MiB (baseline {result['baseline_mib']:.0f} MiB)"
    ]
    if "classes" in result:
        lines.append(
            f"  {result['classes']} shape classes, {result['groups']} on-prem groups, "
            f"classes and prices built in {result['setup_s']} s; excluded "
            f"{result['excluded_jobs']} jobs ({result['excluded_gpu_hours']} GPU-h)"
        )
    results = result["results"]
    assert isinstance(results, list)
    for r in results:
        cost = "none" if r["cost"] is None else f"${r['cost']:,.2f}"
        extra = ""
        if "block_bins" in r:
            extra = (
                f", {r['method']}, blocks of {r['block_bins']} bin(s), "
                f"{r['pause_variables']:,} pause variables"
            )
        lines.append(f"  W = {r['wait']:g} s: {cost} ({r['status']}) in {r['s']} s{extra}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--jobs", type=int, default=30_000)
    parser.add_argument("--days", type=float, default=14.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--onprem-gpus", type=int, default=960)
    parser.add_argument("--wait", type=float, default=600.0)
    parser.add_argument("--bin", type=float, default=300.0)
    parser.add_argument(
        "--max-pause-variables",
        type=int,
        default=DEFAULT_MAX_PAUSE_VARIABLES,
        help="the LP's budget before it pools pauses in blocks (the report's default)",
    )
    parser.add_argument("--no-old", action="store_true", help="skip the old single-price path")
    parser.add_argument(
        "--old-hostable",
        action="store_true",
        help="also run the old path on the jobs the new bound keeps (same jobs, to compare costs)",
    )
    parser.add_argument("--timeout", type=float, default=1800.0)
    parser.add_argument("--child", choices=("new", "old", "old-hostable"), help=argparse.SUPPRESS)
    parser.add_argument("--old-file", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(args)
        return 0
    print(
        f"lower bound: {args.jobs:,} jobs over {args.days:g} days, {args.onprem_gpus} on-prem "
        f"GPUs, W = {args.wait:g} s, {args.bin:g} s bins, seed {args.seed}"
    )
    new = _run("new", args, None)
    if new is not None:
        print(_describe(new))
    if args.no_old:
        return 0
    shown = subprocess.run(
        ["git", "show", f"{OLD_COMMIT}:autoscaler/sim/lowerbound.py"],
        cwd=ROOT,
        check=False,
        capture_output=True,
        text=True,
    )
    if shown.returncode != 0:
        print("old path: skipped (its source is not in this checkout's history)")
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        old_file = Path(tmp) / "old_lowerbound.py"
        old_file.write_text(shown.stdout, encoding="utf-8")
        paths = ["old", "old-hostable"] if args.old_hostable else ["old"]
        for path in paths:
            old = _run(path, args, str(old_file))
            if old is not None:
                print(_describe(old))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
