"""Every call the controller makes to a cloud goes through ``WatchedProvider``: timed and counted
by operation and error code for ``/metrics``, and each mutating call (launch, terminate) first
checked against the leader's fencing token and written ahead to the journal, then completed there
with what it did. Providers stay unaware of all three."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Protocol, TypeVar

from autoscaler.model import Instance, InterruptionNotice, Pool, PriceQuote
from autoscaler.model.errors import ProviderError, describe
from autoscaler.ops.metrics import Metrics
from autoscaler.spi.provider import (
    Closable,
    GangLauncher,
    LaunchResult,
    Provider,
    WatchesInBackground,
)

T = TypeVar("T")


class MutationLedger(Protocol):
    """Where mutating calls are fenced and journaled (the controller's ``CallLedger``)."""

    def started(
        self, kind: str, provider: str, pool: str | None, count: int, request_id: str
    ) -> None:
        """Raises ``LeadershipLost`` when this replica may no longer act."""
        ...

    def finished(
        self, request_id: str, outcome: str, instance_ids: Sequence[str], detail: str
    ) -> None: ...


class WatchedProvider:
    def __init__(
        self,
        inner: Provider,
        metrics: Metrics | None = None,
        ledger: MutationLedger | None = None,
        timer: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.inner = inner
        self.name = inner.name
        self.metrics = metrics
        self.ledger = ledger
        self._timer = timer

    def start(self, wakeup: Callable[[], None] | None = None) -> None:
        """Starts the provider's background part, if it has one (``WatchesInBackground``)."""
        if isinstance(self.inner, WatchesInBackground):
            self.inner.start(wakeup)

    def close(self) -> None:
        if isinstance(self.inner, Closable):
            self.inner.close()

    def list_instances(self, fleet_id: str) -> list[Instance]:
        return self._timed("list_instances", lambda: self.inner.list_instances(fleet_id))

    def prices(self, pools: Sequence[Pool]) -> list[PriceQuote]:
        return self._timed("prices", lambda: self.inner.prices(pools))

    def poll_notices(self) -> list[InterruptionNotice]:
        return self._timed("poll_notices", self.inner.poll_notices)

    def acknowledge(self, notices: Sequence[InterruptionNotice]) -> None:
        self._timed("acknowledge", lambda: self.inner.acknowledge(notices))

    def launch(
        self, pool: Pool, count: int, request_id: str, fleet_id: str, *, team: str | None = None
    ) -> LaunchResult:
        # ``team`` is passed only when there is one: a provider written before teams still
        # launches what no team asked for.
        return self._launch(
            "launch",
            pool,
            count,
            request_id,
            lambda: (
                self.inner.launch(pool, count, request_id, fleet_id)
                if team is None
                else self.inner.launch(pool, count, request_id, fleet_id, team=team)
            ),
        )

    def _launch(
        self,
        operation: str,
        pool: Pool,
        count: int,
        request_id: str,
        call: Callable[[], LaunchResult],
    ) -> LaunchResult:
        if self.ledger is not None:
            self.ledger.started("launch", self.name, pool.name, count, request_id)
        try:
            result = self._timed(operation, call)
        except Exception as exc:
            self._finished(request_id, _code(exc), (), describe(exc))
            raise
        ids = [i.id for i in result.instances]
        outcome = "ok" if len(ids) >= count else ("partial" if ids else _code(result.shortfall))
        self._finished(
            request_id, outcome, ids, describe(result.shortfall) if result.shortfall else ""
        )
        return result

    def terminate(self, instance_ids: Sequence[str], request_id: str) -> None:
        if self.ledger is not None:
            self.ledger.started("terminate", self.name, None, len(instance_ids), request_id)
        try:
            self._timed("terminate", lambda: self.inner.terminate(instance_ids, request_id))
        except Exception as exc:
            self._finished(request_id, _code(exc), instance_ids, describe(exc))
            raise
        self._finished(request_id, "ok", instance_ids, "")

    def _finished(
        self, request_id: str, outcome: str, instance_ids: Sequence[str], detail: str
    ) -> None:
        if self.ledger is not None:
            self.ledger.finished(request_id, outcome, instance_ids, detail)

    def _timed(self, operation: str, call: Callable[[], T]) -> T:
        started = self._timer()
        try:
            return call()
        except Exception as exc:
            if self.metrics is not None:
                self.metrics.provider_errors.labels(self.name, operation, _code(exc)).inc()
            raise
        finally:
            if self.metrics is not None:
                self.metrics.provider_seconds.labels(self.name, operation).observe(
                    self._timer() - started
                )


def _code(error: BaseException | None) -> str:
    if isinstance(error, ProviderError):
        return error.code
    return "error" if error is None else type(error).__name__


class WatchedGangProvider(WatchedProvider):
    """A watched provider whose cloud can launch a multi-node job's nodes together."""

    def __init__(
        self,
        inner: GangLauncher,
        metrics: Metrics | None = None,
        ledger: MutationLedger | None = None,
        timer: Callable[[], float] = time.perf_counter,
    ) -> None:
        super().__init__(inner, metrics, ledger, timer)  # type: ignore[arg-type]
        self.gangs = inner

    def launch_gang(
        self, pool: Pool, count: int, request_id: str, fleet_id: str, *, team: str | None = None
    ) -> LaunchResult:
        """A multi-node job's instances, all or none, fenced and journaled as any launch is."""
        return self._launch(
            "launch_gang",
            pool,
            count,
            request_id,
            lambda: (
                self.gangs.launch_gang(pool, count, request_id, fleet_id)
                if team is None
                else self.gangs.launch_gang(pool, count, request_id, fleet_id, team=team)
            ),
        )


def watch(
    inner: Provider,
    metrics: Metrics | None = None,
    ledger: MutationLedger | None = None,
    timer: Callable[[], float] = time.perf_counter,
) -> WatchedProvider:
    """The watched form of ``inner``, with the capabilities ``inner`` declares and no others:
    ``launch_gang`` only where its cloud can."""
    if isinstance(inner, GangLauncher):
        return WatchedGangProvider(inner, metrics, ledger, timer)
    return WatchedProvider(inner, metrics, ledger, timer)
