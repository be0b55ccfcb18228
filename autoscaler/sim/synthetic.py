"""Deterministic synthetic GPU job traces, in families that each stress one thing real clusters do.

The shipped real traces are few and mostly one-GPU jobs on a steady load; a policy tuned on them
can look good for the wrong reasons. Each family below exaggerates one behaviour of real GPU
clusters so that the evaluation suite (docs/evaluation.md) sees it. The same spec (family, jobs,
days, seed) always gives the same file, byte for byte.

Common to every family (the Alibaba 2023 openb trace's shares, as ``mixed`` always had):
priority classes 50 % LS, 40 % BE (``preemptible`` = 1), 7 % Burstable, 3 % Guaranteed; a
one-GPU job uses a share of its GPU drawn from openb's common values (``gpu_fraction``); 30 % of
jobs record a queue delay (exponential, mean 120 s); 25 % end as Failed; twelve user groups with
Zipf shares; durations lognormal, at least 10 s and capped per family; jobs still running when
the trace ends are right-censored. Arrivals follow a rate ``1 + A·cos(2π(h − 14)/24)`` (peak at
14:00, ``A`` the diurnal amplitude, day 0 a Monday, weekends scaled), conditioned on the job
count; in the bursty family most jobs arrive in bursts instead.

The families, what each stresses, and its parameters:

* ``mixed``: the bench's general trace. A = 0.6 (4:1 peak to trough), weekends 0.6; median
  15 min (σ 1.6, cap 3 d); GPUs 1/2/4/8 at 82/7/6/5 %.
* ``bursty``: quiet periods broken by sudden large bursts. 25 % of jobs arrive in the background
  (A = 0.3); 75 % in bursts at Poisson times (4 a day on average), each 15 min long, a burst's
  size drawn with Pareto weights (α 1.5, capped at 5x the smallest) so a few are much larger;
  median 20 min (σ 1.2, cap 12 h); GPUs 1/2/4/8 at 80/10/5/5 %.
* ``diurnal``: a strong day/night swing. A = 0.85 (12:1 peak to trough), weekends 0.5; median
  30 min (σ 1.3, cap 1 d); GPUs as mixed.
* ``multinode``: heavy multi-GPU and multi-node training. GPUs 1/2/4/8 at 25/10/20/20 % on one
  node, and gangs of 16 = 2x8 at 15 % and 32 = 4x8 at 10 % (``num_nodes`` 2 and 4); A = 0.3,
  weekends 0.8; median 1 h (σ 1.0, cap 2 d).
* ``long``: many multi-hour and multi-day jobs. Median 6 h (σ 1.1: about 10 % run past a day),
  cap 7 d; A = 0.3, weekends 0.8; GPUs as mixed.
* ``pinned``: jobs pinned to a GPU model. 50 % name one in ``gpu_model``: ``A100`` 45 %,
  ``V100`` 35 %, ``A100-80GB`` 10 % (only the on-prem A100-SXM4-80GB nodes have it),
  ``A100|V100`` 10 % (either), matching the shipped scenarios' pools (A100-SXM4-80GB on-prem,
  V100 on AWS p3, A100-40GB on GCP a2); A = 0.6, weekends 0.6; median 30 min (σ 1.3, cap 1 d);
  GPUs as mixed.

A scenario names a synthetic trace in ``trace.synthetic`` instead of ``trace.file``; the trace is
generated once into a cache file named by a hash of the spec and of this module's source (a
changed generator never reuses an old file), under ``$GPU_AUTOSCALER_CACHE`` or the system's temp
folder, and then read like any trace file.
"""

from __future__ import annotations

import csv
import hashlib
import math
import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from pydantic import Field, PositiveFloat, PositiveInt

from autoscaler.model import Frozen
from autoscaler.model.errors import InputError
from autoscaler.model.extras import REPORT_INSTALL

if TYPE_CHECKING:
    # numpy is the report extra's: imported where a trace is generated, so that loading a
    # scenario (validate, the sim provider) works on a lean install.
    import numpy as np
    import numpy.typing as npt

    from autoscaler.sim.scenario import LoadedScenario

    FloatArray = npt.NDArray[np.float64]

COLUMNS = (
    "job_id",
    "submit_time_s",
    "start_time_s",
    "duration_s",
    "num_gpus",
    "gpu_fraction",
    "num_cpus",
    "status",
    "queue_delay_s",
    "user_group",
    "priority_class",
    "preemptible",
    "gpu_model",
    "censored",
    "deadline_s",
    "num_nodes",
)
DAY = 86_400.0
CACHE_ENV = "GPU_AUTOSCALER_CACHE"

Family = Literal["mixed", "bursty", "diurnal", "multinode", "long", "pinned"]

# Priority classes of the Alibaba openb trace, with its shares.
PRIORITY_CLASSES = ("LS", "BE", "Burstable", "Guaranteed")
PRIORITY_SHARES = (0.50, 0.40, 0.07, 0.03)
# Share of a GPU a single-GPU job uses (the shipped trace's most common values).
FRACTIONS = (1.0, 0.81, 0.47, 0.32, 0.65, 0.46, 0.23, 0.55)
FRACTION_SHARES = (0.58, 0.16, 0.08, 0.05, 0.04, 0.04, 0.03, 0.02)
CPUS_PER_GPU = (3.152, 4.0, 8.0, 11.3, 12.0)
USER_GROUPS = tuple(f"team-{k:02d}" for k in range(12))
MIN_DURATION_S = 10.0
PEAK_HOUR = 14.0
DELAYED_SHARE = 0.3
MEAN_DELAY_S = 120.0
FAILED_SHARE = 0.25


class SyntheticTraceSpec(Frozen):
    """A generated trace: which family, how many jobs over how many days, and the seed."""

    family: Family
    jobs: PositiveInt = Field(le=2_000_000)
    days: PositiveFloat = Field(le=366)
    seed: int = Field(0, ge=0)


@dataclass(frozen=True)
class Shape:
    """A job's whole GPU count, the nodes it spans at once, and the share of jobs like it."""

    gpus: int
    nodes: int
    share: float


@dataclass(frozen=True)
class Arrivals:
    diurnal_amplitude: float
    weekend_factor: float
    burst_share: float = 0.0
    bursts_per_day: float = 0.0
    burst_minutes: float = 0.0
    burst_size_alpha: float = 1.5
    burst_size_cap: float = 5.0


@dataclass(frozen=True)
class FamilyParams:
    arrivals: Arrivals
    median_duration_s: float
    duration_sigma: float
    max_duration_s: float
    shapes: tuple[Shape, ...]
    pinned_share: float = 0.0
    pinned_models: tuple[tuple[str, float], ...] = ()


SINGLE_NODE = (Shape(1, 1, 0.82), Shape(2, 1, 0.07), Shape(4, 1, 0.06), Shape(8, 1, 0.05))

FAMILIES: dict[str, FamilyParams] = {
    "mixed": FamilyParams(Arrivals(0.6, 0.6), 900.0, 1.6, 3 * DAY, SINGLE_NODE),
    "bursty": FamilyParams(
        Arrivals(0.3, 1.0, burst_share=0.75, bursts_per_day=4.0, burst_minutes=15.0),
        1200.0,
        1.2,
        0.5 * DAY,
        (Shape(1, 1, 0.80), Shape(2, 1, 0.10), Shape(4, 1, 0.05), Shape(8, 1, 0.05)),
    ),
    "diurnal": FamilyParams(Arrivals(0.85, 0.5), 1800.0, 1.3, DAY, SINGLE_NODE),
    "multinode": FamilyParams(
        Arrivals(0.3, 0.8),
        3600.0,
        1.0,
        2 * DAY,
        (
            Shape(1, 1, 0.25),
            Shape(2, 1, 0.10),
            Shape(4, 1, 0.20),
            Shape(8, 1, 0.20),
            Shape(16, 2, 0.15),
            Shape(32, 4, 0.10),
        ),
    ),
    "long": FamilyParams(Arrivals(0.3, 0.8), 6 * 3600.0, 1.1, 7 * DAY, SINGLE_NODE),
    "pinned": FamilyParams(
        Arrivals(0.6, 0.6),
        1800.0,
        1.3,
        DAY,
        SINGLE_NODE,
        pinned_share=0.5,
        pinned_models=(("A100", 0.45), ("V100", 0.35), ("A100-80GB", 0.10), ("A100|V100", 0.10)),
    ),
}


def arrival_rate(t: FloatArray, arrivals: Arrivals) -> FloatArray:
    """Relative arrival rate at trace seconds ``t`` (day 0 is a Monday)."""
    import numpy as np

    hour = (t % DAY) / 3600.0
    diurnal = 1.0 + arrivals.diurnal_amplitude * np.cos(2.0 * math.pi * (hour - PEAK_HOUR) / 24.0)
    weekday = (t // DAY) % 7
    weekly = np.where(weekday >= 5, arrivals.weekend_factor, 1.0)
    rate: FloatArray = diurnal * weekly
    return rate


def _thinned(
    rng: np.random.Generator, arrivals: Arrivals, jobs: int, horizon_s: float
) -> FloatArray:
    """``jobs`` arrival times of the non-homogeneous Poisson process, given that many arrived:
    independent draws from the rate's density (by thinning), unsorted."""
    import numpy as np

    peak = 1.0 + arrivals.diurnal_amplitude
    kept: list[FloatArray] = [np.empty(0)]
    have = 0
    while have < jobs:
        candidates = rng.uniform(0.0, horizon_s, size=2 * (jobs - have) + 1024)
        accept = rng.uniform(0.0, peak, size=candidates.size) < arrival_rate(candidates, arrivals)
        chosen = candidates[accept]
        kept.append(chosen)
        have += chosen.size
    times: FloatArray = np.concatenate(kept)[:jobs]
    return times


def _bursts(
    rng: np.random.Generator, arrivals: Arrivals, jobs: int, horizon_s: float
) -> FloatArray:
    """Arrivals packed into bursts at Poisson times, sized by Pareto weights (heavy-tailed)."""
    import numpy as np

    length = min(arrivals.burst_minutes * 60.0, horizon_s)
    count = max(1, int(rng.poisson(arrivals.bursts_per_day * horizon_s / DAY)))
    starts = rng.uniform(0.0, horizon_s - length, size=count)
    weights = np.minimum(
        rng.pareto(arrivals.burst_size_alpha, size=count) + 1.0, arrivals.burst_size_cap
    )
    sizes = rng.multinomial(jobs, weights / weights.sum())
    offsets = rng.uniform(0.0, length, size=jobs)
    times: FloatArray = np.repeat(starts, sizes) + offsets
    return times


def arrival_times(
    rng: np.random.Generator, arrivals: Arrivals, jobs: int, horizon_s: float
) -> FloatArray:
    """Sorted arrival times of ``jobs`` jobs in [0, horizon_s)."""
    import numpy as np

    bursty = round(jobs * arrivals.burst_share)
    times = _thinned(rng, arrivals, jobs - bursty, horizon_s)
    if bursty:
        times = np.concatenate([times, _bursts(rng, arrivals, bursty, horizon_s)])
    ordered: FloatArray = np.sort(times)
    return ordered


def generate(spec: SyntheticTraceSpec) -> list[dict[str, str]]:
    """The trace's rows, in submission order."""
    try:
        import numpy as np
    except ImportError as exc:
        raise InputError(
            "trace.synthetic", f"generating a synthetic trace needs numpy: {REPORT_INSTALL}"
        ) from exc

    params = FAMILIES[spec.family]
    jobs = spec.jobs
    rng = np.random.default_rng(spec.seed)
    horizon = spec.days * DAY
    submit = np.floor(arrival_times(rng, params.arrivals, jobs, horizon)).astype(np.int64)
    priority = rng.choice(len(PRIORITY_CLASSES), size=jobs, p=PRIORITY_SHARES)
    shape = rng.choice(len(params.shapes), size=jobs, p=[s.share for s in params.shapes])
    gpus = np.asarray([s.gpus for s in params.shapes])[shape]
    nodes = np.asarray([s.nodes for s in params.shapes])[shape]
    fraction = np.asarray(FRACTIONS)[rng.choice(len(FRACTIONS), size=jobs, p=FRACTION_SHARES)]
    fraction = np.where(gpus > 1, 1.0, fraction)
    cpus_per_gpu = rng.choice(CPUS_PER_GPU, size=jobs)
    duration = np.exp(
        rng.normal(math.log(params.median_duration_s), params.duration_sigma, size=jobs)
    )
    duration = np.clip(np.rint(duration), MIN_DURATION_S, params.max_duration_s).astype(np.int64)
    delayed = rng.uniform(size=jobs) < DELAYED_SHARE
    delay = np.where(delayed, np.rint(rng.exponential(MEAN_DELAY_S, size=jobs)), 0).astype(np.int64)
    start = submit + delay
    failed = rng.uniform(size=jobs) < FAILED_SHARE
    group = rng.choice(len(USER_GROUPS), size=jobs, p=_zipf_shares(len(USER_GROUPS)))
    # Drawn last, and only where a family pins models, so that adding pinning to a family never
    # changes the other columns the same seed gives.
    models = [""] * jobs
    if params.pinned_share > 0:
        pinned = rng.uniform(size=jobs) < params.pinned_share
        names = [name for name, _ in params.pinned_models]
        which = rng.choice(len(names), size=jobs, p=[share for _, share in params.pinned_models])
        models = [names[which[i]] if pinned[i] else "" for i in range(jobs)]

    rows: list[dict[str, str]] = []
    end_of_trace = int(horizon)
    for i in range(jobs):
        cls = PRIORITY_CLASSES[priority[i]]
        begin = int(start[i])
        run = int(duration[i])
        censored = "none"
        status = "Failed" if failed[i] else "Succeeded"
        if begin >= end_of_trace:
            begin, run, status, censored = end_of_trace, 0, "Pending", "right"
        elif begin + run > end_of_trace:
            run, status, censored = end_of_trace - begin, "Running", "right"
        rows.append(
            {
                "job_id": f"syn-{spec.seed}-{i:07d}"
                if spec.family == "mixed"
                else f"{spec.family}-{spec.seed}-{i:07d}",
                "submit_time_s": str(int(submit[i])),
                "start_time_s": str(begin),
                "duration_s": str(run) if status != "Pending" else "",
                "num_gpus": str(int(gpus[i])),
                "gpu_fraction": f"{fraction[i]:g}",
                "num_cpus": f"{cpus_per_gpu[i] * gpus[i]:.3f}".rstrip("0").rstrip("."),
                "status": status,
                "queue_delay_s": str(int(delay[i])),
                "user_group": USER_GROUPS[group[i]],
                "priority_class": cls,
                "preemptible": "1" if cls == "BE" else "0",
                "gpu_model": models[i],
                "censored": censored,
                "deadline_s": "",
                "num_nodes": str(int(nodes[i])),
            }
        )
    return rows


def _zipf_shares(n: int) -> FloatArray:
    import numpy as np

    weights: FloatArray = 1.0 / np.arange(1, n + 1)
    shares: FloatArray = weights / weights.sum()
    return shares


def write_rows(path: Path, rows: Sequence[dict[str, str]]) -> None:
    """Write the rows to ``path`` through a temporary file in the same folder, so a reader (or
    a second process generating the same trace) never sees a half-written file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    temp = Path(temp_name)
    try:
        with os.fdopen(fd, "w", newline="", encoding="utf-8") as handle:
            writer = csv.DictWriter(handle, fieldnames=COLUMNS, lineterminator="\n")
            writer.writeheader()
            writer.writerows(rows)
        temp.chmod(0o644)
        os.replace(temp, path)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise


def cache_dir() -> Path:
    configured = os.environ.get(CACHE_ENV)
    if configured:
        return Path(configured)
    user = os.getuid() if hasattr(os, "getuid") else "user"
    return Path(tempfile.gettempdir()) / f"gpu-autoscaler-cache-{user}"


def fingerprint(spec: SyntheticTraceSpec) -> str:
    """Names the generated file: the spec and this module's own source, so a changed generator
    writes a new file instead of reusing one it would no longer produce."""
    digest = hashlib.sha256(spec.model_dump_json().encode())
    digest.update(Path(__file__).read_bytes())
    return digest.hexdigest()[:16]


def cached_trace(spec: SyntheticTraceSpec, directory: Path | None = None) -> Path:
    """The trace file for ``spec``, generated on first use."""
    folder = directory if directory is not None else cache_dir()
    target = folder / (
        f"synthetic-{spec.family}-{spec.jobs}j-{spec.days:g}d-seed{spec.seed}-"
        f"{fingerprint(spec)}.csv"
    )
    if target.is_file():
        return target
    try:
        write_rows(target, generate(spec))
    except OSError as exc:
        raise InputError(
            str(folder),
            f"cannot write the synthetic trace cache: {exc.strerror or exc}; "
            f"set {CACHE_ENV} to a writable folder",
        ) from None
    return target


def trace_path(loaded: LoadedScenario) -> Path:
    """The file a scenario's trace is read from: its own, or its synthetic trace's cache."""
    spec = loaded.scenario.trace
    if spec.synthetic is not None:
        return cached_trace(spec.synthetic)
    if spec.file is None:
        raise InputError(loaded.source, "give trace.file or trace.synthetic", field="trace")
    return loaded.path(spec.file)
