"""The instance table: one record per cloud instance we own, with the moves it may make.

After Ray autoscaler v2's instance manager: the lifecycle is a table of allowed transitions with
timestamps, and the table has one writer, ``InstanceTable.apply``, which takes typed updates
(``Launched``, ``Moved``) and checks each against the transition table. Passive sync (mirror what
the cloud lists) and the active step (act's results) both produce updates; neither touches a
record. The cloud stays the source of truth: after a restart the table is rebuilt by listing,
and an instance tagged ours that no record explains is adopted, or collected when its pool is no
longer configured.

The state predicates every step asks (live, billed, drainable, holds capacity) live here too, so
that "what do we pay for" has one answer.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from autoscaler.model import (
    BILLED_STATES,
    CAPACITY_STATES,
    DRAINABLE_STATES,
    LIVE_STATES,
    Instance,
    InstanceState,
)

S = InstanceState


def is_billed(state: InstanceState) -> bool:
    return state in BILLED_STATES


def is_drainable(state: InstanceState) -> bool:
    return state in DRAINABLE_STATES


def holds_capacity(state: InstanceState) -> bool:
    return state in CAPACITY_STATES


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
    # Whom the instance was bought for (``LaunchRequest.team``). None for no team. An instance
    # adopted from a listing after a restart keeps the team its cloud tag names
    # (``Instance.team``), so the team limits still count it for that team (docs/teams.md).
    team: str | None = None

    def _move(self, state: InstanceState, now: float, reason: str = "") -> None:
        """Only ``InstanceTable.apply`` moves a record."""
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
class Launched:
    """A launch call returned this instance (or a listing showed one no record explains);
    ``team`` is whom it was bought for (None: the team the instance's own tag names, if any)."""

    instance: Instance
    provider: str
    reason: str = "launched"
    team: str | None = None


@dataclass(frozen=True)
class Moved:
    """An instance moves to ``state``; ``deadline`` is when the cloud takes an interrupted one
    back, ``move_jobs`` whether a drained one's jobs are asked to leave at once."""

    instance_id: str
    state: InstanceState
    reason: str
    deadline: float | None = None
    move_jobs: bool | None = None


InstanceUpdate = Launched | Moved


@dataclass(frozen=True)
class SyncReport:
    adopted: tuple[str, ...] = ()
    vanished: tuple[str, ...] = ()


class InstanceTable:
    def __init__(self, request_timeout_s: float = 600.0, keep_terminated_s: float = 3600.0) -> None:
        self.request_timeout_s = request_timeout_s
        self.keep_terminated_s = keep_terminated_s
        self._records: dict[str, InstanceRecord] = {}
        # Indexes kept by the one writer, so a rule asks for the draining or interrupted
        # records, or a pool's, without a pass over a fleet of 10,000.
        self._by_state: dict[InstanceState, dict[str, InstanceRecord]] = {s: {} for s in S}
        self._live_by_pool: dict[str, dict[str, InstanceRecord]] = {}

    def __len__(self) -> int:
        return len(self._records)

    def __iter__(self) -> Iterator[InstanceRecord]:
        return iter(self._records.values())

    def get(self, instance_id: str) -> InstanceRecord | None:
        return self._records.get(instance_id)

    def live(self) -> Iterator[InstanceRecord]:
        return (r for r in self._records.values() if r.state in LIVE_STATES)

    def in_state(self, state: InstanceState) -> list[InstanceRecord]:
        """The records in ``state``, oldest first."""
        return list(self._by_state[state].values())

    def teams(self) -> dict[str, str | None]:
        """Whom each live instance was bought for, by instance id: what the guard's team
        limits count (None: no team, or not known since a restart)."""
        return {r.id: r.team for r in self.live()}

    def live_pools(self) -> list[str]:
        """The pools that hold a live record."""
        return [pool for pool, records in self._live_by_pool.items() if records]

    def live_in_pool(self, pool: str) -> list[InstanceRecord]:
        return list(self._live_by_pool.get(pool, {}).values())

    def _index(self, record: InstanceRecord, before: InstanceState | None) -> None:
        if before is not None:
            self._by_state[before].pop(record.id, None)
            if before in LIVE_STATES:
                self._live_by_pool.get(record.pool, {}).pop(record.id, None)
        self._by_state[record.state][record.id] = record
        if record.state in LIVE_STATES:
            self._live_by_pool.setdefault(record.pool, {})[record.id] = record

    def _forget(self, record: InstanceRecord) -> None:
        del self._records[record.id]
        self._by_state[record.state].pop(record.id, None)
        self._live_by_pool.get(record.pool, {}).pop(record.id, None)

    def apply(self, update: InstanceUpdate, now: float) -> InstanceRecord | None:
        """The one way a record is made or changed. A move the transition table does not allow
        raises ``IllegalTransitionError``; a move of an unknown instance is ignored (None)."""
        if isinstance(update, Launched):
            return self._launched(update.instance, update.provider, now, update.reason, update.team)
        record = self._records.get(update.instance_id)
        if record is None:
            return None
        before = record.state
        record._move(update.state, now, update.reason)
        if record.state is not before:
            self._index(record, before)
        if update.deadline is not None:
            record.interrupt_deadline = update.deadline
        if update.move_jobs is not None:
            record.move_jobs = update.move_jobs
        return record

    def _launched(
        self, instance: Instance, provider: str, now: float, reason: str, team: str | None
    ) -> InstanceRecord:
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
            history=[(state, now, reason)],
            team=team if team is not None else instance.team,
        )
        self._records[instance.id] = record
        self._index(record, None)
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
                self.apply(Launched(instance, provider, "adopted from listing"), now)
                adopted.append(instance.id)
                continue
            if record.team is None and instance.team is not None:
                record.team = instance.team  # the cloud's tag says whom it was bought for
            move = _follow_cloud(record.state, instance.state)
            if move is not None:
                self.apply(Moved(record.id, *move), now)
        vanished: list[str] = []
        for record in list(self._records.values()):
            if record.id in seen or record.provider not in providers_listed:
                continue
            if record.state is S.TERMINATED:
                if now - record.updated_at > self.keep_terminated_s:
                    self._forget(record)
                continue
            if record.state is S.REQUESTED and now - record.launched_at < self.request_timeout_s:
                continue
            self.apply(Moved(record.id, S.TERMINATED, "no longer listed"), now)
            vanished.append(record.id)
        return SyncReport(tuple(adopted), tuple(vanished))


def _follow_cloud(
    ours: InstanceState, cloud_state: InstanceState
) -> tuple[InstanceState, str] | None:
    """The move a listing asks of a record, if any: the cloud ends and boots instances; the
    states only the controller knows (draining, interrupted) are never undone by a listing."""
    if cloud_state is S.TERMINATED:
        return S.TERMINATED, "cloud says terminated"
    if cloud_state is S.TERMINATING and ours is not S.TERMINATED:
        return S.TERMINATING, "cloud says terminating"
    if ours in _CONTROLLER_STATES:
        return None
    if cloud_state is S.RUNNING and ours in (S.REQUESTED, S.PENDING):
        return S.RUNNING, "cloud says running"
    if cloud_state is S.PENDING and ours is S.REQUESTED:
        return S.PENDING, "cloud says pending"
    return None
