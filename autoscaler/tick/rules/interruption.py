"""A termination notice for an instance we own: it leaves at the deadline, and its jobs first.

A notice for an instance already gone is an interruption all the same (counted against its
pool) unless we were the ones who ended it; a recommendation (rebalance, maintenance) changes
nothing here and is only noted.
"""

from __future__ import annotations

from collections.abc import Sequence

from autoscaler.fleet.instances import InstanceTable
from autoscaler.model import FleetView, InstanceState, InterruptionNotice, NoticeKind
from autoscaler.tick.intents import Interrupt, Note, Requests

_PAST = (InstanceState.INTERRUPTED, InstanceState.TERMINATING)


def requests(
    view: FleetView,
    notices: Sequence[InterruptionNotice],
    table: InstanceTable,
    requests: Requests,
) -> None:
    """``notices`` are all this tick's notices for instances we own, recommendations the view
    leaves out included (they are noted)."""
    seen: set[str] = set()
    for notice in notices:
        record = table.get(notice.instance_id)
        if record is None or record.state in _PAST or notice.instance_id in seen:
            continue
        if record.state is InstanceState.TERMINATED:
            if not any(state is InstanceState.TERMINATING for state, _, _ in record.history):
                seen.add(record.id)
                requests.notices.append(
                    Note(
                        "interruption",
                        record.id,
                        record.pool,
                        "gone",
                        f"{notice.kind} notice for an instance already gone",
                        interrupted=True,
                    )
                )
            continue
        if notice.kind is not NoticeKind.TERMINATE:
            requests.notices.append(
                Note("notice", record.id, record.pool, "noted", f"{notice.kind} recommendation")
            )
            continue
        seen.add(record.id)
        deadline = notice.deadline if notice.deadline is not None else view.now
        requests.notices.append(
            Interrupt(
                record.id,
                record.pool,
                notice.deadline,
                f"{notice.kind} notice",
                f"{notice.kind} notice, deadline in {deadline - view.now:.0f}s",
            )
        )
