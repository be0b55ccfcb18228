"""The long-running controller: a tick every ``tick_seconds``, or sooner when a provider or the
node agents' inbox wakes it with an interruption notice; SIGTERM or SIGINT end the loop after the
tick in flight.

Under a leader lock a keeper thread takes and renews the lock every third of the lease, whatever
the ticks are doing (a slow cloud call must not let the lease run out under a healthy leader); the
loop ticks only while the lock is held, and each tick acts under the fencing token it started
with, so a tick that finds the lock lost or changed hands stops acting at once. A paused process
pauses its keeper too, which is what lets a standby take over.

Background services and providers wake the loop through ``autoscaler.spi.wakeups.Wakeups``: a new
notice for an instance the table holds wakes it at once; notices for other instances, repeats
and checkpoint reports are rate-limited, so no sender can drive ticks by posting.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from types import FrameType
from typing import Any, Protocol

from autoscaler.model.errors import describe
from autoscaler.model.logs import fields
from autoscaler.model.records import LeadershipLost, TickReport
from autoscaler.ops.health import Readiness
from autoscaler.ops.leader import LeaderLock, SoleReplica
from autoscaler.ops.metrics import Metrics
from autoscaler.spi.provider import Closable, Provider, WatchesInBackground
from autoscaler.spi.wakeups import TallyCollector, Wakeups
from autoscaler.tick.controller import Controller

log = logging.getLogger(__name__)

RENEWALS_PER_LEASE = 3.0


class Background(Protocol):
    """Runs beside the loop (the notice inbox, the metrics endpoint) and may wake it."""

    def start(self, wakeup: Callable[[], None]) -> None: ...

    def close(self) -> None: ...


class Runner:
    def __init__(
        self,
        controller: Controller,
        providers: Mapping[str, Provider],
        background: Sequence[Background] = (),
        lock: LeaderLock | None = None,
        readiness: Readiness | None = None,
    ) -> None:
        self.controller = controller
        self.providers = providers
        self.background = background
        self.lock: LeaderLock = lock or SoleReplica()
        self.readiness = readiness
        self.metrics: Metrics | None = controller.metrics
        self.stopping = threading.Event()
        self._wake = threading.Event()
        self.wakeups = Wakeups(self._wake.set, owns=self._owns, leads=self._leads)
        self._state = threading.Lock()
        self._token: int | None = None
        self._acting = False

    def stop(self, signum: int | None = None, frame: FrameType | None = None) -> None:
        """Finish the tick in flight, then leave the loop (also the SIGTERM/SIGINT handler)."""
        self.stopping.set()
        self._wake.set()

    @property
    def renew_every_s(self) -> float:
        lease = self.lock.lease_seconds
        period = self.controller.config.tick_seconds
        return min(period, lease / RENEWALS_PER_LEASE) if lease > 0 else period

    def run(self, max_ticks: int | None = None) -> int:
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self.stop)
            signal.signal(signal.SIGINT, self.stop)
        period = self.controller.config.tick_seconds
        done = 0
        started_background: list[Background] = []
        keeper = threading.Thread(target=self._keep_lease, name="leader-lease", daemon=True)
        self._count_inputs()
        try:
            for provider in self.providers.values():
                if isinstance(provider, WatchesInBackground):
                    provider.start(self.wakeups)
            for service in self.background:
                service.start(self.wakeups)
                started_background.append(service)
            self._lead()
            keeper.start()
            while not self.stopping.is_set() and (max_ticks is None or done < max_ticks):
                token = self._token
                if token is None:
                    self._wake.wait(self.renew_every_s)
                    self._wake.clear()
                    continue
                if token != self.controller.token or not self._acting:
                    self._take_over(token)
                started = time.monotonic()
                self._wake.clear()
                self.wakeups.ticking()
                self._tick()
                done += 1
                if max_ticks is not None and done >= max_ticks:
                    break
                wait = period - (time.monotonic() - started)
                due = self.controller.next_due()
                if due is not None:
                    wait = min(wait, due - self.controller.clock.now())
                self._wake.wait(max(0.0, wait))
        finally:
            self.stopping.set()
            if keeper.is_alive():
                keeper.join(timeout=self.renew_every_s + 5)
            self._release()
            for service in started_background:
                service.close()
            for provider in self.providers.values():
                if isinstance(provider, Closable):
                    provider.close()
        log.info("controller stopped after %d tick(s)", done)
        return 0

    def _leads(self) -> bool:
        """Read from the inbox's threads: whether this replica holds the lock now."""
        return self._token is not None

    def _owns(self, instance_id: str) -> bool:
        """Read from the inbox's threads: one dict lookup in the tick's table."""
        return self.controller.table.get(instance_id) is not None

    def _count_inputs(self) -> None:
        """The notice boundaries' counts on the controller's registry (once per registry)."""
        if self.metrics is None:
            return
        try:
            self.metrics.registry.register(TallyCollector(self.wakeups.tally))
        except ValueError:
            log.debug("the boundary counts are already on this registry")

    def _keep_lease(self) -> None:
        while not self.stopping.wait(self.renew_every_s):
            self._lead()

    def _lead(self) -> bool:
        """Take or renew the lock; True while this replica leads."""
        try:
            token = self.lock.acquire()
        except Exception as exc:
            log.error("leader lock: %s", describe(exc))
            token = None
        with self._state:
            if token != self._token:
                self._changed(token)
        return token is not None

    def _changed(self, token: int | None) -> None:
        previous, self._token = self._token, token
        if token is None:
            self._acting = False
            log.warning("not the leader (fencing token was %s); standing by", previous)
        else:
            log.info("leading as %s", self.lock.identity, extra=fields(fencing_token=token))
            self._wake.set()
        if self.readiness is not None:
            self.readiness.leadership(token is not None)
        if self.metrics is not None:
            self.metrics.leader.set(1 if token is not None else 0)
            self.metrics.fencing_token.set(token or 0)

    def _take_over(self, token: int) -> None:
        """The loop's thread starts acting under a new token. A new leader reads the journal
        afresh: another replica may have written to it, and a killed one may have left calls
        unfinished."""
        self.controller.token = token
        self._acting = True
        journal = self.controller.journal
        if journal is None:
            return
        try:
            journal.reload()
            journal.close_unfinished(self.controller.clock.now())
        except Exception as exc:
            log.error("journal: %s", describe(exc))

    def _release(self) -> None:
        with self._state:
            if self._token is None:
                return
            try:
                self.lock.release()
            except Exception as exc:
                log.error("releasing the leader lock: %s", describe(exc))
            self._token = None

    def _tick(self) -> None:
        try:
            report = self.controller.tick()
        except LeadershipLost as exc:
            log.error("leadership lost mid-tick, no further action: %s", exc)
            self._acting = False
            self._lead()
            return
        except Exception as exc:
            log.exception("tick failed, the controller goes on: %s", describe(exc))
            return
        if self.readiness is not None:
            self.readiness.tick_finished(report.failing_sources)
        log_actions(report)
        log.info(
            "%s",
            summary(report),
            extra=fields(
                tick=report.tick, fencing_token=self.controller.token, **summary_fields(report)
            ),
        )


def log_actions(report: TickReport) -> None:
    """One event per action, with the fields a log search filters on."""
    for action in report.actions:
        level = logging.WARNING if action.outcome == "error" else logging.INFO
        log.log(
            level,
            "%s %s: %s",
            action.kind,
            action.outcome,
            action.detail or "-",
            extra=fields(
                tick=report.tick,
                action=action.kind,
                pool=action.pool,
                outcome=action.outcome,
                request_id=action.request_id,
                instance_ids=list(action.instance_ids) or None,
                job_id=action.job_id,
                requested=action.requested,
                done=action.done,
            ),
        )
    for clamp in report.clamps:
        log.info(
            "guard clamped %s: %s",
            clamp.rule,
            clamp.detail,
            extra=fields(tick=report.tick, action="clamp", pool=clamp.pool),
        )


def summary_fields(report: TickReport) -> dict[str, Any]:
    """The summary's numbers as the JSON event's own keys (``logs.TICK_SUMMARY_FIELDS``), so a
    log store filters and plots them without parsing the message. Unknown demand leaves
    ``pending_gpus`` and ``pending_jobs`` out and says ``demand_known: false``: a count that is
    sometimes the word "unknown" is a key no log index can type."""
    demand = report.view.demand
    done = {kind: 0 for kind in ("launch", "drain", "terminate")}
    for action in report.actions:
        if action.kind in done:
            done[action.kind] += action.done
    values: dict[str, Any] = {
        "demand_known": demand.known,
        "instances": len(report.view.instances),
        "launched": done["launch"],
        "drained": done["drain"],
        "terminated": done["terminate"],
        "notices": len(report.view.notices),
        "duration_ms": round(report.duration_s * 1000, 1),
        "errors": len(report.errors),
    }
    if demand.known:
        values["pending_gpus"] = demand.gpus
        values["pending_jobs"] = demand.jobs
    if report.month_spend is not None:
        values["month_spend_dollars"] = round(report.month_spend, 2)
    if report.held:
        values["held"] = report.held
    if report.clamps:
        values["clamps"] = sorted({c.rule for c in report.clamps})
    return values


def summary(report: TickReport) -> str:
    """The summary as one human line (the ``msg`` of the JSON event, the text format's line)."""
    values = summary_fields(report)
    parts = [
        f"tick={report.tick}",
        f"pending_gpus={values.get('pending_gpus', 'unknown')}",
        f"instances={values['instances']}",
        f"launched={values['launched']}",
        f"terminated={values['terminated']}",
        f"notices={values['notices']}",
        f"ms={report.duration_s * 1000:.0f}",
    ]
    if report.month_spend is not None:
        parts.append(f"month_spend=${report.month_spend:,.2f}")
    if report.held:
        parts.append(f"held={report.held!r}")
    if report.clamps:
        parts.append("clamps=" + ",".join(values["clamps"]))
    if report.errors:
        parts.append(f"errors={len(report.errors)}")
    return " ".join(parts)
