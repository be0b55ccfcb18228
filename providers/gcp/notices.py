"""Preemptions of our Spot VMs, read centrally: each zone's ``compute.instances.preempted``
operations, and Spot VMs of ours that the last listing showed ``TERMINATED``; each VM is reported
once. The node-side metadata watcher (``node_agent``) sees the same preemption from inside."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from autoscaler.model import InterruptionNotice, NoticeKind
from autoscaler.model.clock import Clock
from providers.gcp.errors import typed
from providers.gcp.instances import MAX_RESULTS, GcpInstances, last, timestamp
from providers.gcp.sdk import ComputeClients
from providers.gcp.settings import GcpSettings

PREEMPTED = "compute.instances.preempted"


class GcpNotices:
    def __init__(
        self,
        sdk: ComputeClients,
        settings: GcpSettings,
        clock: Clock,
        instances: GcpInstances,
    ) -> None:
        self.sdk = sdk
        self.settings = settings
        self.clock = clock
        self.instances = instances
        self._reported: dict[str, float] = {}

    def poll_notices(self) -> list[InterruptionNotice]:
        """Preemptions of our VMs since the lookback: each zone's ``compute.instances.preempted``
        operations (the operation's time is the deadline: it has passed), then Spot VMs of ours
        that the last listing showed ``TERMINATED``. Each VM is reported once."""
        now = self.clock.now()
        since = now - self.settings.preemption_lookback_s
        seen = self.instances.seen
        for name, sighting in list(seen.items()):
            if sighting.at < since:
                del seen[name]
        for name, at in list(self._reported.items()):
            if at < since and name not in seen:
                del self._reported[name]
        # only a zone where we have had a VM lately can hold a preemption of ours
        zones = sorted({sighting.zone for sighting in seen.values()})
        notices: list[InterruptionNotice] = []
        for zone in zones:
            for operation in self._preemptions(zone):
                name = last(str(operation.target_link))
                ours = seen.get(name)
                when = timestamp(str(operation.end_time)) or timestamp(str(operation.insert_time))
                if ours is None or name in self._reported or (when is not None and when < since):
                    continue
                # the preemption has happened: a time after now is not one (never a deadline
                # in year 9999 from a garbled record)
                notices.append(
                    self._notice(name, ours.pool, now, now if when is None else min(when, now))
                )
        for name, pool in self.instances.preempted.items():
            if name not in self._reported:
                notices.append(self._notice(name, pool, now, now))
        return notices

    def _notice(self, name: str, pool: str, now: float, deadline: float) -> InterruptionNotice:
        self._reported[name] = now
        return InterruptionNotice(
            instance_id=name,
            pool=pool,
            kind=NoticeKind.TERMINATE,
            received_at=now,
            deadline=deadline,
        )

    def _preemptions(self, zone: str) -> list[Any]:
        _, operations = self.sdk.clients()
        try:
            pages = self.sdk.call(
                operations.list,
                {
                    "project": self.settings.project,
                    "zone": zone,
                    "filter": f'(operationType = "{PREEMPTED}")',
                    "max_results": MAX_RESULTS,
                },
            )
            return list(pages)
        except Exception as exc:
            raise typed(exc) from None

    def acknowledge(self, notices: Sequence[InterruptionNotice]) -> None:
        """Nothing to delete: preemptions are read from the cloud's own records, and a notice is
        never reported twice by this provider object."""
