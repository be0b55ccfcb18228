"""Replaying a demand series: pending and running GPUs over time (what every queue dashboard
records) turned into jobs the simulator replays, with the error that inference makes stated.

The series is a CSV of ``time_s, pending_gpus, running_gpus`` (seconds, any origin, strictly
increasing; each sample holds until the next, and the replay ends at the last). A series does
not say what the jobs were, so they are inferred, in units of ``job_gpus`` GPUs (one unit, one
job), between each pair of samples:

* demand D = pending + running, both rounded to whole units; a rise in D is that many jobs
  arriving, a fall is that many ending; a fall in running beyond the fall in D is jobs ending
  that new arrivals replaced (a preemption or a requeue looks the same);
* jobs end oldest-started first (FIFO); jobs start oldest-submitted first, as many as running
  rose by plus the ones that replaced those ending;
* a fall in D larger than what was running is jobs that left the queue without being seen
  running (cancelled, or run for less than one sample step): they are not replayed;
* every event is placed at the sample where it is first seen (up to one step late).

So by construction the inferred jobs hold the series' running and pending GPUs at every sample,
up to the rounding to units, and the replay asks the simulated fleet for the same work. What the
series cannot tell is stated in the report: each job's size (all are ``job_gpus``), which job
ended when (FIFO is assumed: durations are as even as the series allows), and arrivals and
departures that cancel within one step. Jobs running at the first sample enter as already
running (their wait is unknown, left out of the wait statistics); jobs pending at the last
sample are not replayed (their run time is unknown); jobs running at the last sample run until
it. ``Inference`` holds the figures: GPU-hours of the series against those of the inferred
jobs, and the counts of each case.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

from autoscaler.model.csvfile import read_rows
from autoscaler.model.errors import InputError
from autoscaler.sim.scenario import DAY, MAX_WINDOW_S, CheckpointRule, JobMatch, TraceSpec
from autoscaler.sim.trace import TraceJob, TraceSelection, _busiest, _share

SERIES_COLUMNS = ("time_s", "pending_gpus", "running_gpus")
# Beyond these the input is a mistake (a GPU count with extra digits), not a fleet's demand,
# and the inferred jobs would not fit a replay.
MAX_SERIES_GPUS = 10_000_000
MAX_INFERRED_JOBS = 2_000_000
HOUR = 3600.0


@dataclass(frozen=True, slots=True)
class InferredJob:
    """One inferred job, in series seconds (0 is the first sample). ``end`` is None for a job
    still running at the last sample; ``carried`` for one already running at the first."""

    submit: float
    start: float
    end: float | None
    carried: bool


@dataclass
class Inference:
    jobs: list[InferredJob]
    job_gpus: int
    samples: int
    span_s: float
    step_s: float
    series_running_gpu_s: float
    series_pending_gpu_s: float
    inferred_pending_gpu_s: float
    pending_at_start: int = 0
    pending_at_end: int = 0
    left_unseen: int = 0
    inferred_running_gpu_s: float = field(init=False)

    def __post_init__(self) -> None:
        self.inferred_running_gpu_s = self.job_gpus * sum(
            (self.span_s if j.end is None else j.end) - j.start for j in self.jobs
        )

    @property
    def carried(self) -> int:
        return sum(1 for j in self.jobs if j.carried)

    @property
    def running_at_end(self) -> int:
        return sum(1 for j in self.jobs if j.end is None)

    @property
    def running_error(self) -> float | None:
        """Inferred over series running GPU-hours, less one (None for a series never running)."""
        if self.series_running_gpu_s <= 0:
            return None
        return self.inferred_running_gpu_s / self.series_running_gpu_s - 1.0

    def lines(self) -> list[str]:
        """The inference and its error, as ``trace import`` prints it and docs explain it."""
        g = self.job_gpus
        size = f"{g} GPU{'s' if g > 1 else ''}"
        error = self.running_error
        error_text = f" ({error:+.2%})" if error is not None else ""
        return [
            f"{len(self.jobs):,} jobs of {size} inferred from {self.samples:,} samples over "
            f"{self.span_s / DAY:,.2f} days (median step {self.step_s:g} s)",
            f"running GPU-hours: {self.series_running_gpu_s / HOUR:,.1f} in the series, "
            f"{self.inferred_running_gpu_s / HOUR:,.1f} held by the inferred jobs{error_text}; "
            f"pending GPU-hours: {self.series_pending_gpu_s / HOUR:,.1f} in the series, "
            f"{self.inferred_pending_gpu_s / HOUR:,.1f} inferred (the difference is rounding "
            f"to jobs of {size})",
            f"{self.carried:,} jobs running at the first sample enter already running; "
            f"{self.pending_at_start:,} pending at it are submitted at it",
            f"{self.running_at_end:,} jobs running at the last sample run until it; "
            f"{self.pending_at_end:,} still pending at it are not replayed (run time unknown)",
            f"{self.left_unseen:,} jobs left the queue without being seen running (cancelled, "
            "or ran for less than one step): not replayed",
            f"not in the series, so assumed: every job is {size} on one node; jobs end oldest "
            "started first; arrivals and departures that cancel within one step are not seen",
        ]

    def summary(self) -> str:
        """One line for the report's trace line; without a slash, so that the report's path
        shortening (``autoscaler.report.render_paths``) keeps it whole after the file name."""
        error = self.running_error
        return (
            f"demand series, replayed as {len(self.jobs):,} inferred jobs of {self.job_gpus} "
            f"GPU(s) each; running GPU-hours {self.series_running_gpu_s / HOUR:,.1f} in the "
            f"series vs {self.inferred_running_gpu_s / HOUR:,.1f} in the jobs"
            + (f" ({error:+.2%})" if error is not None else "")
            + f"; {self.left_unseen:,} left the queue unseen running and "
            f"{self.pending_at_end:,} pending at the end are not replayed; job sizes and "
            "durations are assumed, see trace-import.md in the docs"
        )


def read_series(path: Path) -> list[tuple[float, float, float]]:
    """The samples of a series CSV as (time_s, pending_gpus, running_gpus), checked."""
    samples: list[tuple[float, float, float]] = []
    for row in read_rows(path, SERIES_COLUMNS):
        t = row.number("time_s", minimum=0)
        pending = row.number("pending_gpus", minimum=0, maximum=MAX_SERIES_GPUS)
        running = row.number("running_gpus", minimum=0, maximum=MAX_SERIES_GPUS)
        if samples and t <= samples[-1][0]:
            raise row.error(
                "time_s", f"expected a time after the previous sample's {samples[-1][0]:g}"
            )
        samples.append((t, pending, running))
    check_span(samples, str(path))
    return samples


def check_span(samples: list[tuple[float, float, float]], where: str) -> None:
    """A series is replayed whole or in a window: it has two samples and spans at most what a
    replay covers."""
    if len(samples) < 2:
        raise InputError(where, "a demand series needs at least two samples")
    if samples[-1][0] - samples[0][0] > MAX_WINDOW_S:
        raise InputError(
            where,
            f"the series spans {(samples[-1][0] - samples[0][0]) / DAY:,.1f} days; at most "
            f"{MAX_WINDOW_S / DAY:.0f} are replayed: export a shorter range",
        )


def _units(gpus: float, job_gpus: int) -> int:
    return math.floor(gpus / job_gpus + 0.5)


def _take(queue: deque[list[float]], count: int) -> list[list[float]]:
    """Up to ``count`` units off the head of a queue of [time..., units] runs."""
    taken: list[list[float]] = []
    while count > 0 and queue:
        head = queue[0]
        units = int(head[-1])
        if units <= count:
            taken.append(queue.popleft())
            count -= units
        else:
            head[-1] = units - count
            taken.append([*head[:-1], count])
            count = 0
    return taken


def infer(
    samples: list[tuple[float, float, float]], job_gpus: int = 1, where: str = "series"
) -> Inference:
    """The jobs of a series (see the module's docstring)."""
    origin = samples[0][0]
    pending: deque[list[float]] = deque()  # [submit, units]
    running: deque[list[float]] = deque()  # [submit, start, carried, units]
    jobs: list[InferredJob] = []
    pending_units, running_units = _units(samples[0][1], job_gpus), _units(samples[0][2], job_gpus)
    if running_units:
        running.append([0.0, 0.0, 1.0, running_units])
    if pending_units:
        pending.append([0.0, pending_units])
    left_unseen = 0
    arrived = running_units + pending_units
    series_running = series_pending = inferred_pending = 0.0
    before = 0.0
    steps: list[float] = []
    for now_epoch, pending_gpus, running_gpus in samples[1:]:
        now = now_epoch - origin
        step = now - before
        steps.append(step)
        series_running += samples[len(steps) - 1][2] * step
        series_pending += samples[len(steps) - 1][1] * step
        inferred_pending += pending_units * job_gpus * step
        new_pending, new_running = _units(pending_gpus, job_gpus), _units(running_gpus, job_gpus)
        change = (new_pending + new_running) - (pending_units + running_units)
        arrivals, ends = max(0, change), max(0, -change)
        starts = new_running - running_units + ends
        if starts < 0:  # running fell by more than demand did: ends that arrivals replaced
            arrivals -= starts
            ends -= starts
        ends_running = min(ends, running_units)
        gone = ends - ends_running
        starts = new_running - running_units + ends_running
        for submit, start, carried, units in _take(running, ends_running):
            jobs.extend(InferredJob(submit, start, now, carried > 0) for _ in range(int(units)))
        if arrivals:
            pending.append([now, arrivals])
            arrived += arrivals
            if arrived > MAX_INFERRED_JOBS:
                raise InputError(
                    where,
                    f"more than {MAX_INFERRED_JOBS:,} jobs of {job_gpus} GPU(s) would be "
                    "inferred; give trace.series.job_gpus a larger size",
                )
        left_unseen += sum(int(run[-1]) for run in _take(pending, gone))
        for submit, units in _take(pending, starts):
            running.append([submit, now, 0.0, units])
        pending_units, running_units = new_pending, new_running
        before = now
    for submit, start, carried, units in running:
        jobs.extend(InferredJob(submit, start, None, carried > 0) for _ in range(int(units)))
    jobs.sort(key=lambda j: (j.submit, j.start))
    return Inference(
        jobs=jobs,
        job_gpus=job_gpus,
        samples=len(samples),
        span_s=before,
        step_s=statistics.median(steps),
        series_running_gpu_s=series_running,
        series_pending_gpu_s=series_pending,
        inferred_pending_gpu_s=inferred_pending,
        pending_at_start=_units(samples[0][1], job_gpus),
        pending_at_end=sum(int(run[-1]) for run in pending),
        left_unseen=left_unseen,
    )


def _checkpointing(
    job_id: str, gpus: int, rules: tuple[CheckpointRule, ...], seed: int
) -> tuple[float | None, float]:
    """The trace's rule (first match wins) for a job the series says nothing about but its
    size: no priority class, user group or preemptibility to match on."""
    for index, rule in enumerate(rules):
        if rule.match.matches("", False, gpus, "", 1.0):
            if rule.fraction >= 1 or _share(seed + index, job_id) < rule.fraction:
                return rule.interval_s, rule.duration_s
            return None, 0.0
    return None, 0.0


def load_series(
    path: Path,
    spec: TraceSpec,
    rules: tuple[CheckpointRule, ...],
    high_priority: JobMatch | None,
    seed: int,
) -> TraceSelection:
    """The inferred jobs of ``spec``'s window of the series at ``path``, as the replay takes a
    trace's; the selection's ``source`` carries the inference's error for the report."""
    assert spec.series is not None
    job_gpus = spec.series.job_gpus
    inference = infer(read_series(path), job_gpus, str(path))
    if spec.busiest_days is not None:
        submits = sorted(j.submit for j in inference.jobs if not j.carried)
        if not submits:
            raise InputError(str(path), "no job arrives in the series: busiest_days has no window")
        start, end = _busiest(submits, spec.busiest_days * DAY)
    else:
        start = spec.window_start_s if spec.window_start_s is not None else 0.0
        end = spec.window_end_s if spec.window_end_s is not None else inference.span_s
    jobs: list[TraceJob] = []
    for index, job in enumerate(inference.jobs):
        job_id = f"series-{index:07d}"
        finish = inference.span_s if job.end is None else job.end
        if not job.carried and start <= job.submit < end:
            submit, duration, carried = job.submit - start, finish - job.start, False
        elif not job.carried and job.submit < start <= job.start:
            submit, duration, carried = 0.0, finish - job.start, False  # still pending
        elif spec.include_running_at_start and job.start <= start < finish:
            submit, duration, carried = 0.0, finish - start, True
        else:
            continue
        interval, cost = _checkpointing(job_id, job_gpus, rules, seed)
        high = high_priority is not None and high_priority.matches("", False, job_gpus, "", 1.0)
        jobs.append(
            TraceJob(job_id, submit, duration, job_gpus, 1.0, interval, cost, high, carried)
        )
    jobs.sort(key=lambda j: (j.submit, j.id))
    if spec.max_jobs is not None:
        jobs = jobs[: spec.max_jobs]
    if not jobs:
        raise InputError(
            str(path),
            f"no inferred job is submitted or running in the replayed window ({start:g} s to "
            f"{end:g} s of the series)",
        )
    skipped = {
        key: value
        for key, value in (
            (
                "inferred jobs pending at the series' end (run time unknown)",
                inference.pending_at_end,
            ),
            ("inferred jobs that left the queue unseen running", inference.left_unseen),
        )
        if value
    }
    return TraceSelection(
        f"{path} ({inference.summary()})", jobs, start, end, skipped, tuple(inference.lines())
    )
