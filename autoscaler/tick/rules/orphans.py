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
    stray = [
        r for pool in table.live_pools() if pool not in pools for r in table.live_in_pool(pool)
    ]
    for record in sorted(stray, key=lambda r: r.launched_at):
        if record.id not in claimed:
            requests.terminations.append(
                Terminate(record.id, record.provider, record.pool, REASON, RULE)
            )
