"""Reading a job trace (the common CSV schema of the shipped traces) into replayable jobs.

Times become replay seconds: 0 is the start of the chosen window. Jobs still running when the
window opens are carried in at time 0 with the work they had left (so the fleet does not start
empty), and kept out of the queue-wait statistics because their wait happened before the window.
"""

from __future__ import annotations

import math
import zlib
from bisect import bisect_left
from dataclasses import dataclass, field
from pathlib import Path

from autoscaler.model import NodeShape
from autoscaler.model.csvfile import Row, read_rows
from autoscaler.model.errors import InputError
from autoscaler.sim.scenario import (
    DAY,
    MAX_WINDOW_S,
    CheckpointRule,
    JobMatch,
    TeamAssignment,
    TraceSpec,
)

TRACE_COLUMNS = ("job_id", "submit_time_s", "start_time_s", "duration_s", "num_gpus")
# A replay covers at most MAX_WINDOW_S (a year and a day), and one job asks for at most this many
# GPUs: beyond either, the input is a mistake (a year 9999 submit time, a GPU count with extra
# digits), not a workload, and replaying it would run for hours before saying anything useful.
MAX_JOB_GPUS = 65_536


@dataclass(slots=True)
class TraceJob:
    """One job to replay. ``gpus`` is the whole job's; it runs on ``nodes`` nodes at once with
    ``gpus // nodes`` on each, of one of ``gpu_models`` (any when empty). ``utilisation`` is
    the trace's ``gpu_fraction`` (the share of a GPU the job asked for; 1 when the trace gives
    none): the traces record no measured utilisation, so it stands in for it, for the whole
    run, wherever the simulator judges a node idle (drains, on-prem allocated-idle GPU-hours).
    ``gpu_fraction`` is the same share kept as a request, for a one-GPU job asking for less than a
    whole GPU (0 < f < 1; None otherwise): where GPUs may be shared the job takes a slice of one
    (autoscaler/model/sharing.py), elsewhere a whole GPU as before."""

    id: str
    submit: float
    duration: float
    gpus: int
    utilisation: float
    checkpoint_interval_s: float | None
    checkpoint_duration_s: float
    high_priority: bool
    carried: bool = False
    nodes: int = 1
    gpu_models: tuple[str, ...] = ()
    min_gpu_memory_gib: float | None = None
    team: str | None = None
    gpu_fraction: float | None = None
    priority_class: str | None = None  # the trace's priority_class column ("": None)
    shape: NodeShape = field(init=False)

    def __post_init__(self) -> None:
        # Built once: the scheduler asks for it at every placement attempt.
        self.shape = NodeShape.model_construct(
            gpus=self.gpus // self.nodes,
            gpu_models=self.gpu_models,
            min_gpu_memory_gib=self.min_gpu_memory_gib,
        )

    @property
    def gpus_per_node(self) -> int:
        return self.gpus // self.nodes


@dataclass
class TraceSelection:
    source: str
    jobs: list[TraceJob]
    window_start_s: float
    window_end_s: float
    skipped: dict[str, int] = field(default_factory=dict)
    notes: tuple[str, ...] = ()  # what a report should say of how the jobs were made

    @property
    def horizon_s(self) -> float:
        return self.window_end_s - self.window_start_s


@dataclass(slots=True)
class _Raw:
    row: Row
    id: str
    submit: float
    start: float | None
    duration: float
    gpus: int
    utilisation: float
    priority_class: str
    preemptible: bool
    user_group: str
    nodes: int
    gpu_models: tuple[str, ...]
    min_gpu_memory_gib: float | None


def _share(seed: int, job_id: str) -> float:
    """A stable number in [0, 1) per job, so "a fraction of jobs" means the same jobs every run."""
    return zlib.crc32(f"{seed}:{job_id}".encode()) / 2**32


def _checkpointing(
    raw: _Raw, rules: tuple[CheckpointRule, ...], seed: int
) -> tuple[float | None, float]:
    for index, rule in enumerate(rules):
        if rule.match.matches(
            raw.priority_class, raw.preemptible, raw.gpus, raw.user_group, raw.utilisation
        ):
            if rule.fraction >= 1 or _share(seed + index, raw.id) < rule.fraction:
                return rule.interval_s, rule.duration_s
            return None, 0.0
    return None, 0.0


def _busiest(submits: list[float], length: float) -> tuple[float, float]:
    """The window of ``length`` seconds holding the most submissions (earliest on a tie)."""
    best_count, best_start = -1, submits[0]
    for i, start in enumerate(submits):
        j = bisect_left(submits, start + length, lo=i)
        if j - i > best_count:
            best_count, best_start = j - i, start
    return best_start, best_start + length


def _nodes(row: Row, gpus: int, largest_node: int | None) -> tuple[int, int]:
    """The job's nodes and its (whole-node) GPUs. A trace that gives ``num_nodes`` is taken at
    its word (its GPUs must divide evenly); one that does not, for a job larger than the
    largest node any scenario capacity has, is spread over as few such nodes as hold it, each
    asking the same number of GPUs (12 GPUs on 8-GPU nodes: 2 nodes of 6)."""
    text = row.text("num_nodes") if "num_nodes" in row.values else ""
    if text:
        nodes = row.integer("num_nodes", minimum=1, maximum=gpus)
        if gpus % nodes:
            raise row.error(
                "num_nodes",
                f"expected a number of nodes that divides num_gpus ({gpus}) evenly, got {nodes}",
            )
        return nodes, gpus
    if largest_node is None or gpus <= largest_node:
        return 1, gpus
    nodes = math.ceil(gpus / largest_node)
    return nodes, nodes * math.ceil(gpus / nodes)


def _models(row: Row) -> tuple[str, ...]:
    text = row.text("gpu_model") if "gpu_model" in row.values else ""
    models = tuple(m.strip() for m in text.split("|") if m.strip())
    if text and not models:
        raise row.error("gpu_model", f"expected GPU model names separated by '|', got {text!r}")
    return models


def load_trace(
    path: Path,
    spec: TraceSpec,
    rules: tuple[CheckpointRule, ...],
    high_priority: JobMatch | None,
    seed: int,
    largest_node: int | None = None,
    teams: TeamAssignment | None = None,
) -> TraceSelection:
    """Read the jobs of ``spec``'s window. ``largest_node`` is the most GPUs any one node of the
    scenario has (on-prem or a pool's instance): a job the trace records as larger, with no
    node count, needs several nodes at once."""
    skipped: dict[str, int] = {}
    raws: list[_Raw] = []
    seen: set[str] = set()
    for row in read_rows(path, TRACE_COLUMNS):
        job_id = row.text("job_id")
        if not job_id:
            raise row.error("job_id", "expected a job id, got an empty value")
        if job_id in seen:
            raise row.error("job_id", f"job id {job_id!r} appears twice")
        seen.add(job_id)
        gpus = row.integer("num_gpus", minimum=0, maximum=MAX_JOB_GPUS)
        # Every number of every row is checked, those of rows skipped below too: a damaged row
        # is refused wherever it is, never passed over without a word.
        submit = row.optional_number("submit_time_s", minimum=0)
        started = row.optional_number("start_time_s", minimum=0)
        duration = row.optional_number("duration_s", minimum=0)
        fraction = (
            row.optional_number("gpu_fraction", minimum=0, maximum=1)
            if "gpu_fraction" in row.values
            else None
        )
        memory = (
            row.optional_number("min_gpu_memory_gib", minimum=0)
            if "min_gpu_memory_gib" in row.values
            else None
        )
        preemptible = row.text("preemptible") if "preemptible" in row.values else ""
        if preemptible not in ("", "0", "1"):
            raise row.error("preemptible", f"expected 0 or 1, got {preemptible[:40]!r}")
        if gpus == 0:
            skipped["no GPU requested"] = skipped.get("no GPU requested", 0) + 1
            continue
        if duration is None:
            skipped["never started (no duration)"] = (
                skipped.get("never started (no duration)", 0) + 1
            )
            continue
        if submit is None:
            skipped["no submit time"] = skipped.get("no submit time", 0) + 1
            continue
        nodes, gpus = _nodes(row, gpus, largest_node)
        raws.append(
            _Raw(
                row=row,
                id=job_id,
                submit=submit,
                start=started,
                duration=duration,
                gpus=gpus,
                utilisation=fraction if fraction else 1.0,
                priority_class=row.text("priority_class") if "priority_class" in row.values else "",
                preemptible=preemptible == "1",
                user_group=row.text("user_group") if "user_group" in row.values else "",
                nodes=nodes,
                gpu_models=_models(row),
                min_gpu_memory_gib=memory or None,
            )
        )
    if not raws:
        raise InputError(str(path), "no GPU job with a duration to replay")
    submits = sorted(r.submit for r in raws)
    if spec.busiest_days is not None:
        start, end = _busiest(submits, spec.busiest_days * DAY)
    else:
        start = spec.window_start_s if spec.window_start_s is not None else submits[0]
        end = spec.window_end_s if spec.window_end_s is not None else submits[-1] + 1.0
    if end - start > MAX_WINDOW_S:
        raise InputError(
            str(path),
            f"the replayed window is {(end - start) / DAY:,.1f} days long; at most "
            f"{MAX_WINDOW_S / DAY:.0f} are replayed: set trace.window_start_s and window_end_s "
            "or busiest_days in the scenario",
        )
    jobs: list[TraceJob] = []
    for raw in raws:
        carried = False
        if start <= raw.submit < end:
            submit, duration = raw.submit - start, raw.duration
        elif (
            spec.include_running_at_start
            and raw.submit < start
            and raw.start is not None
            and raw.start + raw.duration > start
        ):
            submit, duration, carried = 0.0, raw.start + raw.duration - start, True
        else:
            continue
        interval, cost = _checkpointing(raw, rules, seed)
        high = high_priority is not None and high_priority.matches(
            raw.priority_class, raw.preemptible, raw.gpus, raw.user_group, raw.utilisation
        )
        jobs.append(
            TraceJob(
                raw.id,
                submit,
                duration,
                raw.gpus,
                raw.utilisation,
                interval,
                cost,
                high,
                carried,
                raw.nodes,
                raw.gpu_models,
                raw.min_gpu_memory_gib,
                None
                if teams is None
                else teams.team_of(
                    raw.priority_class,
                    raw.preemptible,
                    raw.gpus,
                    raw.user_group,
                    raw.utilisation,
                ),
                raw.utilisation if raw.gpus == 1 and raw.utilisation < 1 else None,
                raw.priority_class[:253] or None,
            )
        )
    jobs.sort(key=lambda j: (j.submit, j.id))
    if spec.max_jobs is not None:
        jobs = jobs[: spec.max_jobs]
    if not jobs:
        raise InputError(
            str(path),
            f"no GPU job is submitted or running in the replayed window ({start:g} s to "
            f"{end:g} s of the trace)",
        )
    return TraceSelection(str(path), jobs, start, end, skipped)
