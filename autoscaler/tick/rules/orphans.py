"""An instance tagged ours in a pool no longer configured is collected, never leaked."""

from __future__ import annotations

from autoscaler.fleet.instances import InstanceTable
from autoscaler.model import FleetView
from autoscaler.model.config import ControllerConfig
from autoscaler.tick.intents import Requests, Terminate

RULE = "orphans"
REASON = "collected: tagged ours but its pool is not configured"


def requests(
    view: FleetView, table: InstanceTable, config: ControllerConfig, requests: Requests
) -> None:
    pools = {p.name for p in config.pools}
    claimed = requests.claimed()
    for record in table.live():
        if record.pool not in pools and record.id not in claimed:
            requests.terminations.append(
                Terminate(record.id, record.provider, record.pool, REASON, RULE)
            )
