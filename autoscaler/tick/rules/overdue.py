"""An instance the cloud said it would take back and still lists well past the deadline is
terminated by us: we never pay for capacity we have already written off."""

from __future__ import annotations

from autoscaler.fleet.instances import InstanceTable
from autoscaler.model import FleetView, InstanceState
from autoscaler.tick.intents import Requests, Terminate

GRACE_S = 60.0
RULE = "overdue"
REASON = "interrupted and still running past its deadline"


def requests(view: FleetView, table: InstanceTable, requests: Requests) -> None:
    for record in table.in_state(InstanceState.INTERRUPTED):
        if record.interrupt_deadline is not None and view.now > record.interrupt_deadline + GRACE_S:
            requests.terminations.append(
                Terminate(record.id, record.provider, record.pool, REASON, RULE)
            )
