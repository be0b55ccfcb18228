"""Evictions of our Spot VMs, seen from the listings: a Spot VM that a listing saw live and that
Azure then deletes (eviction policy Delete), not us, is reported once as a terminate notice, kept
until the controller acknowledges it. Node-side Scheduled Events are the node agent's."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from autoscaler.model import InstanceState, InterruptionNotice, NoticeKind

# what a listing saw of one live VM: its pool, its state, and whether it is a Spot VM
Sighting = tuple[str, InstanceState, bool]


class AzureEvictions:
    def __init__(self) -> None:
        self._seen: dict[str, Sighting] = {}
        self._notices: dict[str, InterruptionNotice] = {}
        self._reported: set[str] = set()

    def last_seen(self, name: str) -> Sighting | None:
        """What the previous listing saw of a VM, if it saw it live."""
        return self._seen.get(name)

    def notice(self, name: str, pool: str, now: float) -> None:
        if name in self._reported:
            return
        self._reported.add(name)
        self._notices[name] = InterruptionNotice(
            instance_id=name, pool=pool, kind=NoticeKind.TERMINATE, received_at=now, deadline=now
        )

    def listed(
        self, live: Mapping[str, Sighting], listed: set[str], deleting: set[str], now: float
    ) -> None:
        """After a listing: a Spot VM seen live before and gone now, not deleted by us, was
        evicted; ``live`` becomes what the next listing compares with."""
        for name, (pool, _, spot) in self._seen.items():
            if spot and name not in listed and name not in deleting:
                self.notice(name, pool, now)
        self._seen = dict(live)
        self._reported &= listed | set(self._notices)

    def poll_notices(self) -> list[InterruptionNotice]:
        """Evictions the listings saw (each reported once), kept until acknowledged."""
        return list(self._notices.values())

    def acknowledge(self, notices: Sequence[InterruptionNotice]) -> None:
        for notice in notices:
            self._notices.pop(notice.instance_id, None)
