"""The instance table: one record per cloud instance we own, with the moves it may make.

After Ray autoscaler v2's instance manager: the lifecycle is a table of allowed transitions with
timestamps, and passive sync (mirror what the cloud lists) is kept apart from the active step
(decide and act). The cloud stays the source of truth: after a restart the table is rebuilt by
listing, and an instance tagged ours that no record explains is adopted, or collected when its
pool is no longer configured.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from autoscaler.model import LIVE_STATES, Instance, InstanceState

S = InstanceState

ALLOWED: dict[InstanceState, frozenset[InstanceState]] = {
    S.REQUESTED: frozenset({S.PENDING, S.RUNNING, S.DRAINING, S.TERMINATING, S.TERMINATED}),
    S.PENDING: frozenset({S.RUNNING, S.DRAINING, S.INTERRUPTED, S.TERMINATING, S.TERMINATED}),
    S.RUNNING: frozenset({S.DRAINING, S.INTERRUPTED, S.TERMINATING, S.TERMINATED}),
    S.DRAINING: frozenset({S.INTERRUPTED, S.TERMINATING, S.TERMINATED}),
    S.INTERRUPTED: frozenset({S.TERMINATING, S.TERMINATED}),
    S.TERMINATING: frozenset({S.TERMINATED}),
    S.TERMINATED: frozenset(),
}

# States only the controller knows; a cloud listing never moves a record out of them except to
# say the instance is gone.
_CONTROLLER_STATES = frozenset({S.DRAINING, S.INTERRUPTED, S.TERMINATING})


class IllegalTransitionError(RuntimeError):
    pass


@dataclass
class InstanceRecord:
    id: str
    provider: str
    pool: str
    request_id: str
    gpus: int
    state: InstanceState
    launched_at: float
    updated_at: float
    history: list[tuple[InstanceState, float, str]] = field(default_factory=list)
    drain_started_at: float | None = None
    interrupt_deadline: float | None = None
    move_jobs: bool = False

    def move(self, state: InstanceState, now: float, reason: str = "") -> None:
        if state is self.state:
            return
        if state not in ALLOWED[self.state]:
            raise IllegalTransitionError(f"{self.id}: {self.state} -> {state} is not allowed")
        self.state = state
        self.updated_at = now
        self.history.append((state, now, reason))
        if state is S.DRAINING:
            self.drain_started_at = now

    @property
    def live(self) -> bool:
        return self.state in LIVE_STATES


@dataclass(frozen=True)
class SyncReport:
    adopted: tuple[str, ...] = ()
    vanished: tuple[str, ...] = ()


class InstanceTable:
    def __init__(self, request_timeout_s: float = 600.0, keep_terminated_s: float = 3600.0) -> None:
        self.request_timeout_s = request_timeout_s
        self.keep_terminated_s = keep_terminated_s
        self._records: dict[str, InstanceRecord] = {}

    def __len__(self) -> int:
        return len(self._records)

    def __iter__(self) -> Iterator[InstanceRecord]:
        return iter(self._records.values())

    def get(self, instance_id: str) -> InstanceRecord | None:
        return self._records.get(instance_id)

    def live(self) -> Iterator[InstanceRecord]:
        return (r for r in self._records.values() if r.state in LIVE_STATES)

    def record_launch(self, instance: Instance, provider: str, now: float) -> InstanceRecord:
        existing = self._records.get(instance.id)
        if existing is not None:
            return existing
        # An instance is recorded in the state the cloud lists it in: one adopted while shutting
        # down must not count as capacity on its way.
        state = instance.state if instance.state is not S.DRAINING else S.RUNNING
        record = InstanceRecord(
            id=instance.id,
            provider=provider,
            pool=instance.pool,
            request_id=instance.request_id,
            gpus=instance.gpus,
            state=state,
            launched_at=instance.launched_at,
            updated_at=now,
            history=[(state, now, "launched")],
        )
        self._records[instance.id] = record
        return record

    def sync(
        self, listed: Iterable[tuple[str, Instance]], now: float, providers_listed: set[str]
    ) -> SyncReport:
        """Mirror one listing of the clouds (provider name, instance) into the table.

        ``providers_listed`` names the providers whose listing succeeded: a record of a provider
        that failed to list is left alone, never declared gone.
        """
        seen: set[str] = set()
        adopted: list[str] = []
        for provider, instance in listed:
            seen.add(instance.id)
            record = self._records.get(instance.id)
            if record is None:
                record = self.record_launch(instance, provider, now)
                record.history[-1] = (record.state, now, "adopted from listing")
                adopted.append(instance.id)
                continue
            self._follow_cloud(record, instance.state, now)
        vanished: list[str] = []
        for record in list(self._records.values()):
            if record.id in seen or record.provider not in providers_listed:
                continue
            if record.state is S.TERMINATED:
                if now - record.updated_at > self.keep_terminated_s:
                    del self._records[record.id]
                continue
            if record.state is S.REQUESTED and now - record.launched_at < self.request_timeout_s:
                continue
            record.move(S.TERMINATED, now, "no longer listed")
            vanished.append(record.id)
        return SyncReport(tuple(adopted), tuple(vanished))

    @staticmethod
    def _follow_cloud(record: InstanceRecord, cloud_state: InstanceState, now: float) -> None:
        if cloud_state is S.TERMINATED:
            record.move(S.TERMINATED, now, "cloud says terminated")
        elif cloud_state is S.TERMINATING and record.state is not S.TERMINATED:
            record.move(S.TERMINATING, now, "cloud says terminating")
        elif record.state in _CONTROLLER_STATES:
            return
        elif cloud_state is S.RUNNING and record.state in (S.REQUESTED, S.PENDING):
            record.move(S.RUNNING, now, "cloud says running")
        elif cloud_state is S.PENDING and record.state is S.REQUESTED:
            record.move(S.PENDING, now, "cloud says pending")
