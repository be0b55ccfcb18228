"""What the controller knows of each job's checkpoints: when it last saved, and how long saving
takes it. Jobs report each checkpoint they finish (``POST /v1/checkpoints`` on the controller's
inbox); the ledger is what an interruption notice is weighed against: a checkpoint that fits
before the deadline is asked for, one that does not is not waited on.

The expected duration is the largest of the job's recent reports (a checkpoint that took 40 s
once may take 40 s again; an average would promise a fit that is not there), or what the job
declared when it has not reported yet.
"""

from __future__ import annotations

import threading
from collections import OrderedDict, deque
from dataclasses import dataclass, field

RECENT_REPORTS = 5
# A job silent this long has ended or stopped saving: where it would resume no longer comes from
# here (a restarted run resumes from its own start), so its entry goes. Without this the ledger
# holds every job that ever reported, for as long as the controller runs.
KEEP_S = 86_400.0


@dataclass(frozen=True)
class CheckpointReport:
    job_id: str
    at: float
    duration_s: float
    node: str | None = None


@dataclass
class _JobCheckpoints:
    last_at: float
    durations: deque[float] = field(default_factory=lambda: deque(maxlen=RECENT_REPORTS))


class CheckpointLedger:
    """Thread-safe: reports arrive on the inbox's threads, the tick reads."""

    def __init__(self, keep_s: float = KEEP_S) -> None:
        self._lock = threading.Lock()
        self.keep_s = keep_s
        # Least recently reported first, so expiry stops at the first job still reporting.
        self._jobs: OrderedDict[str, _JobCheckpoints] = OrderedDict()
        self.reports = 0

    def record(self, report: CheckpointReport) -> None:
        with self._lock:
            self.reports += 1
            entry = self._jobs.get(report.job_id)
            if entry is None:
                entry = self._jobs[report.job_id] = _JobCheckpoints(report.at)
            else:
                self._jobs.move_to_end(report.job_id)
            entry.last_at = max(entry.last_at, report.at)
            entry.durations.append(report.duration_s)

    def expire(self, now: float) -> int:
        """Drop the jobs whose latest checkpoint is more than ``keep_s`` old; how many went."""
        cutoff = now - self.keep_s
        dropped = 0
        with self._lock:
            while self._jobs:
                job_id, entry = next(iter(self._jobs.items()))
                if entry.last_at >= cutoff:
                    break
                del self._jobs[job_id]
                dropped += 1
        return dropped

    def last(self, job_id: str) -> float | None:
        with self._lock:
            entry = self._jobs.get(job_id)
            return entry.last_at if entry is not None else None

    def expected_duration(self, job_id: str, declared: float | None = None) -> float | None:
        with self._lock:
            entry = self._jobs.get(job_id)
            if entry is None or not entry.durations:
                return declared
            return max(entry.durations)

    def resume_point(self, job_id: str, started_at: float) -> float:
        """Where the job would pick up if it stopped now: its last checkpoint of this run, else
        its start."""
        last = self.last(job_id)
        return max(last, started_at) if last is not None else started_at

    def unsaved_gpu_s(self, job_id: str, gpus: int, started_at: float, now: float) -> float:
        """The work stopping the job now would throw away: GPUs × time since it last saved."""
        return gpus * max(0.0, now - self.resume_point(job_id, started_at))

    def forget(self, job_ids: set[str]) -> None:
        """Jobs that ended: their checkpoints no longer matter."""
        with self._lock:
            for job_id in job_ids & self._jobs.keys():
                del self._jobs[job_id]

    def known(self) -> set[str]:
        with self._lock:
            return set(self._jobs)
