"""Slurm accounting records into the simulator's job trace: what a job asked for, when, and how
long it ran.

Both readers (``sacct_json``, ``sacct_text``) give ``Record``s; ``to_trace`` turns them into
trace rows. The mapping (docs/trace-import.md):

* GPUs: the ``gres/gpu`` count of the job's allocated TRES (the whole job's, over all its
  nodes); the requested TRES of a job that was never allocated anything. The GPU model is the
  gres type the job *requested* (``gres/gpu:a100`` in ReqTRES): Slurm types the allocation even
  of a job that asked for any GPU, so the allocated type says where it ran, not what it needs.
* Nodes: the allocated node count; a job whose GPUs do not divide evenly over its nodes
  (``--gpus=5 -N2``) asks for the larger share on every node, and is counted.
* Times: submit, start and end as recorded; duration is the elapsed run time (end - start where
  the file gives no elapsed time). A job still running when the accounting was read is kept
  with the time it had run so far (``censored`` = right).
* Never started: a job with nothing allocated (cancelled while pending, still pending, an array
  range not yet split into tasks) is left out and counted; Slurm records a start time for a job
  cancelled while pending, so "started" is read from the allocation, not the start time.
* Requeued jobs: the records of one job id (``sacct -D`` lists each run) are one job: submitted
  when the first run was, running as long as its last run did. The earlier runs' GPU-hours are
  not replayed (whether they recur depends on the fleet the replay buys) and are counted.
* Array tasks are jobs of their own (``123_4``), as are heterogeneous job components
  (``123+1``); with several clusters in one file the id starts with the cluster's name.
* ``user_group`` is the account (or the partition, user or QOS, as asked); ``priority_class``
  the QOS, so a scenario's ``high_priority`` can name QOSes.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Literal

from autoscaler.model.errors import InputError

GroupBy = Literal["account", "partition", "user", "qos"]
GROUP_BY: tuple[GroupBy, ...] = ("account", "partition", "user", "qos")
# One job asks for at most this many GPUs (the trace reader's own limit).
MAX_JOB_GPUS = 65_536
# States whose record is a run the job came back from.
RUNNING_STATES = frozenset({"RUNNING", "COMPLETING", "SUSPENDED", "CONFIGURING", "STOPPED"})
HOUR = 3600.0
SHOWN_EXAMPLES = 3


@dataclass(frozen=True, slots=True)
class Gpus:
    """GPUs in one TRES list: the whole count and the count of each gres type named."""

    total: int
    types: tuple[tuple[str, int], ...] = ()


@dataclass(frozen=True, slots=True)
class Record:
    """One accounting record: a job, an array task, a het component, or one run of a requeued
    job. ``allocated`` is None when nothing was allocated (the job never started); times are
    epoch seconds, None where Slurm has none."""

    job_id: str
    cluster: str
    state: str
    submit: float
    start: float | None
    end: float | None
    elapsed: float | None
    allocated: Gpus | None
    requested: Gpus
    nodes: int | None
    partition: str = ""
    account: str = ""
    user: str = ""
    qos: str = ""

    def group(self, by: GroupBy) -> str:
        return {
            "account": self.account,
            "partition": self.partition,
            "user": self.user,
            "qos": self.qos,
        }[by]


@dataclass(frozen=True, slots=True)
class TraceRow:
    """One job of the trace, times in epoch seconds (made relative when written)."""

    job_id: str
    submit: float
    start: float
    duration: float
    gpus: int
    nodes: int
    gpu_model: str
    user_group: str
    priority_class: str
    status: str
    censored: bool


@dataclass
class Imported:
    """The trace rows and what the import left out or changed, in numbers a person checks."""

    rows: list[TraceRow]
    records: int
    skipped: dict[str, int] = field(default_factory=dict)
    requeued_jobs: int = 0
    requeued_runs_gpu_h: float = 0.0
    rounded_up: list[str] = field(default_factory=list)
    still_running: int = 0

    @property
    def gpu_hours(self) -> float:
        return sum(r.gpus * r.duration for r in self.rows) / HOUR

    def lines(self, origin: float) -> list[str]:
        """The summary ``trace import`` prints."""
        out = [
            f"{len(self.rows):,} GPU jobs from {self.records:,} accounting records, "
            f"{self.gpu_hours:,.2f} GPU-hours of run time",
            f"trace time 0 is {_iso(origin)} (set the scenario's start to it to replay at "
            "that moment's prices)",
        ]
        if self.rows:
            span = max(r.submit for r in self.rows) - min(r.submit for r in self.rows)
            out.append(f"submissions span {span / 86_400:,.2f} days")
        for reason, count in sorted(self.skipped.items()):
            out.append(f"left out: {count:,} {reason}")
        if self.requeued_jobs:
            out.append(
                f"requeued: {self.requeued_jobs:,} jobs ran more than once; each is replayed "
                f"from its first submission for its last run's length, and the "
                f"{self.requeued_runs_gpu_h:,.2f} GPU-hours of earlier runs are not replayed"
            )
        if self.still_running:
            out.append(
                f"{self.still_running:,} jobs were still running when the accounting was read: "
                "replayed for the time they had run (censored = right)"
            )
        if self.rounded_up:
            examples = ", ".join(self.rounded_up[:SHOWN_EXAMPLES])
            out.append(
                f"{len(self.rounded_up):,} jobs' GPUs do not divide over their nodes; each asks "
                f"for the larger share on every node (first: {examples})"
            )
        return out


def _iso(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def first_state(text: str) -> str:
    """``CANCELLED by 0`` is CANCELLED; states are upper case."""
    return text.strip().split(" ", 1)[0].upper()


def _skip(skipped: dict[str, int], reason: str) -> None:
    skipped[reason] = skipped.get(reason, 0) + 1


def _model(requested: Gpus, renames: dict[str, str]) -> str:
    models: list[str] = []
    for name, count in requested.types:
        if count <= 0:
            continue
        model = renames.get(name, name)
        if model and model not in models:
            models.append(model)
    return "|".join(models)


def _duration(record: Record) -> float | None:
    if record.elapsed is not None:
        return record.elapsed
    if record.start is not None and record.end is not None:
        return max(0.0, record.end - record.start)
    return None


def _runs(records: Iterable[Record]) -> tuple[list[list[Record]], int]:
    """Records grouped into jobs (one id, one cluster), each job's runs in submit order."""
    jobs: dict[tuple[str, str], list[Record]] = {}
    count = 0
    for record in records:
        count += 1
        jobs.setdefault((record.cluster, record.job_id), []).append(record)
    for runs in jobs.values():
        runs.sort(key=lambda r: r.submit)
    return list(jobs.values()), count


def to_trace(
    records: Iterable[Record],
    group_by: GroupBy = "account",
    gpu_models: dict[str, str] | None = None,
) -> Imported:
    """The trace of ``records``: one row per job that was allocated GPUs. ``gpu_models``
    renames gres types to the models a scenario's pools have (``tesla: V100``); a type renamed
    to an empty name asks for any GPU."""
    renames = gpu_models or {}
    grouped, count = _runs(records)
    clusters = {runs[0].cluster for runs in grouped}
    imported = Imported([], count)
    for runs in grouped:
        last = runs[-1]
        if len(runs) > 1:
            earlier = sum(
                (run.allocated.total if run.allocated else 0) * (_duration(run) or 0.0)
                for run in runs[:-1]
            )
            imported.requeued_jobs += 1
            imported.requeued_runs_gpu_h += earlier / HOUR
        gpus = last.allocated.total if last.allocated is not None else last.requested.total
        state = first_state(last.state)
        if gpus <= 0:
            _skip(imported.skipped, "jobs without GPUs")
            continue
        if last.allocated is None or last.start is None:
            if state == "CANCELLED":
                _skip(imported.skipped, "GPU jobs cancelled before they started")
            elif state in ("PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED"):
                _skip(imported.skipped, "GPU jobs still pending when the accounting was read")
            else:
                _skip(imported.skipped, f"GPU jobs that never started ({state.lower()})")
            continue
        duration = _duration(last)
        running = last.end is None or state in RUNNING_STATES
        if duration is None:
            _skip(imported.skipped, "running GPU jobs without an elapsed time (add ElapsedRaw)")
            continue
        nodes = max(1, last.nodes or 1)
        nodes = min(nodes, gpus)
        if gpus % nodes:
            imported.rounded_up.append(last.job_id)
            gpus = nodes * math.ceil(gpus / nodes)
        job_id = f"{last.cluster}:{last.job_id}" if len(clusters) > 1 else last.job_id
        if running:
            imported.still_running += 1
        imported.rows.append(
            TraceRow(
                job_id=job_id,
                submit=runs[0].submit,
                start=last.start,
                duration=duration,
                gpus=gpus,
                nodes=nodes,
                gpu_model=_model(last.requested, renames),
                user_group=last.group(group_by),
                priority_class=last.qos,
                status=state,
                censored=running,
            )
        )
    imported.rows.sort(key=lambda r: (r.submit, r.job_id))
    return imported


def gpus_from_tres(
    entries: Sequence[tuple[str, str]], fail: Callable[[str], InputError]
) -> Gpus | None:
    """GPUs of a TRES list given as (name, count) pairs (``gres/gpu``, ``gres/gpu:a100``);
    None for an empty list (nothing allocated). Counts are checked here, for both formats;
    ``fail`` makes the error that names the file, line and field."""
    if not entries:
        return None
    total: int | None = None
    typed: dict[str, int] = {}
    for name, raw in entries:
        if name != "gres/gpu" and not name.startswith("gres/gpu:"):
            continue
        if not raw.isascii() or not raw.isdigit() or len(raw) > 12:
            raise fail(f"expected a whole number of GPUs for {name}, got {_shown(raw)}")
        count = int(raw)
        if count > MAX_JOB_GPUS:
            raise fail(f"{name} is {count:,}; a job has at most {MAX_JOB_GPUS:,} GPUs")
        if name == "gres/gpu":
            total = count
        else:
            kind = name.removeprefix("gres/gpu:")
            if not kind or not kind.isprintable() or len(kind) > 128:
                raise fail(f"expected a gres type after gres/gpu:, got {_shown(name)}")
            typed[kind] = typed.get(kind, 0) + count
    if total is None:
        total = sum(typed.values())
        if total > MAX_JOB_GPUS:
            raise fail(f"the typed GPUs add up to {total:,}; a job has at most {MAX_JOB_GPUS:,}")
    return Gpus(total, tuple(sorted(typed.items())))


def _shown(raw: str) -> str:
    text = repr(raw)
    return text if len(text) <= 40 else text[:36] + "...'"
