"""The executor plan mode runs the real tick with: every read goes to the real cloud and
scheduler, every change is recorded instead of made.

A launch "succeeds" with made-up instances (``plan-<request id>-<n>``) so the tick walks on as it
would when every first choice is fulfilled; a terminate, a drain, a placement, a checkpoint
signal or a requeue is written down and returns as if done. Notices are not polled, so plan mode
never takes a message off an interruption queue another replica should see. A provider whose
listing can repair things (``ListingRepairs``) is told to only look.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from autoscaler.model import (
    Instance,
    InstanceState,
    InterruptionNotice,
    Placement,
    Pool,
    PriceQuote,
)
from autoscaler.model.clock import Clock
from autoscaler.spi.provider import (
    Closable,
    GangLauncher,
    LaunchResult,
    ListingRepairs,
    Provider,
)
from autoscaler.spi.sources import (
    CheckpointingScheduler,
    HeldOff,
    MovesJobsOff,
    RunningJob,
    WorkloadScheduler,
)


@dataclass
class Recorded:
    """What the tick would have done, call by call."""

    calls: list[tuple[str, ...]] = field(default_factory=list)


class RecordingProvider:
    def __init__(self, inner: Provider, clock: Clock, recorded: Recorded) -> None:
        self.name = inner.name
        self.inner = inner
        self.clock = clock
        self.recorded = recorded
        if isinstance(inner, ListingRepairs):
            inner.read_only = True

    def list_instances(self, fleet_id: str) -> list[Instance]:
        return self.inner.list_instances(fleet_id)

    def prices(self, pools: Sequence[Pool]) -> list[PriceQuote]:
        return self.inner.prices(pools)

    def poll_notices(self) -> list[InterruptionNotice]:
        return []

    def acknowledge(self, notices: Sequence[InterruptionNotice]) -> None:
        return None

    def launch(
        self, pool: Pool, count: int, request_id: str, fleet_id: str, *, team: str | None = None
    ) -> LaunchResult:
        self.recorded.calls.append(("launch", pool.name, str(count), request_id))
        return self._made_up(pool, count, request_id, team)

    def terminate(self, instance_ids: Sequence[str], request_id: str) -> None:
        self.recorded.calls.append(("terminate", *instance_ids))

    def close(self) -> None:
        if isinstance(self.inner, Closable):
            self.inner.close()

    def _made_up(
        self, pool: Pool, count: int, request_id: str, team: str | None = None
    ) -> LaunchResult:
        now = self.clock.now()
        return LaunchResult(
            tuple(
                Instance(
                    id=f"plan-{request_id}-{n}",
                    pool=pool.name,
                    state=InstanceState.REQUESTED,
                    launched_at=now,
                    request_id=request_id,
                    gpus=pool.gpus_per_instance,
                    team=team,
                )
                for n in range(count)
            )
        )


class RecordingGangProvider(RecordingProvider):
    def launch_gang(
        self, pool: Pool, count: int, request_id: str, fleet_id: str, *, team: str | None = None
    ) -> LaunchResult:
        self.recorded.calls.append(("launch_gang", pool.name, str(count), request_id))
        return self._made_up(pool, count, request_id, team)


def recording_provider(inner: Provider, clock: Clock, recorded: Recorded) -> RecordingProvider:
    """The recording form of ``inner``, with the capabilities ``inner`` declares."""
    if isinstance(inner, GangLauncher):
        return RecordingGangProvider(inner, clock, recorded)
    return RecordingProvider(inner, clock, recorded)


class RecordingScheduler:
    """Placement, drains and evictions written down; how many jobs a node still runs is read
    from the real scheduler where it can list them, so the tick sees what it would wait on."""

    def __init__(self, inner: WorkloadScheduler, recorded: Recorded) -> None:
        self.inner = inner
        self.recorded = recorded

    def apply_placement(self, placement: Placement) -> None:
        self.recorded.calls.append(("placement",))

    def drain(self, node: str, reason: str) -> int:
        self.recorded.calls.append(("drain", node))
        if isinstance(self.inner, CheckpointingScheduler):
            return len(self.inner.running_jobs(node))
        return 0

    def evict(self, node: str, reason: str) -> int:
        self.recorded.calls.append(("evict", node))
        if isinstance(self.inner, CheckpointingScheduler):
            return len(self.inner.running_jobs(node))
        return 0


class RecordingCheckpointingScheduler(RecordingScheduler):
    def __init__(self, inner: CheckpointingScheduler, recorded: Recorded) -> None:
        super().__init__(inner, recorded)  # type: ignore[arg-type]
        self.jobs = inner

    def running_jobs(self, node: str) -> Sequence[RunningJob]:
        return self.jobs.running_jobs(node)

    def signal(self, job_id: str, signal: str) -> None:
        self.recorded.calls.append(("signal", job_id, signal))

    def requeue(self, job_id: str) -> None:
        self.recorded.calls.append(("requeue", job_id))


class RecordingMovingScheduler(RecordingCheckpointingScheduler):
    """Also moves jobs off on-prem nodes (on paper): what on-prem rebalancing would do."""

    def __init__(self, inner: CheckpointingScheduler, recorded: Recorded) -> None:
        super().__init__(inner, recorded)
        self.mover = inner if isinstance(inner, MovesJobsOff) else None

    def move_off(self, job_id: str, node: str, for_job: str) -> None:
        self.recorded.calls.append(("move_off", job_id, node, for_job))

    def bind(self, for_job: str, nodes: Sequence[str]) -> None:
        self.recorded.calls.append(("bind", for_job, *nodes))

    def held_off(self) -> Sequence[HeldOff]:
        return self.mover.held_off() if self.mover is not None else ()


def recording_scheduler(inner: WorkloadScheduler, recorded: Recorded) -> RecordingScheduler:
    """The recording form of ``inner``, with the capabilities ``inner`` declares."""
    if isinstance(inner, CheckpointingScheduler) and isinstance(inner, MovesJobsOff):
        return RecordingMovingScheduler(inner, recorded)
    if isinstance(inner, CheckpointingScheduler):
        return RecordingCheckpointingScheduler(inner, recorded)
    return RecordingScheduler(inner, recorded)
