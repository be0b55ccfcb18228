"""A drain under way goes on each tick until its node is empty; past ``drain_timeout_s`` what
still runs is moved at its checkpoints or evicted, and the node is let go."""

from __future__ import annotations

from autoscaler.fleet.instances import InstanceTable
from autoscaler.model import FleetView, InstanceState
from autoscaler.model.config import ControllerConfig
from autoscaler.tick.intents import ContinueDrain, Requests


def requests(
    view: FleetView, table: InstanceTable, config: ControllerConfig, requests: Requests
) -> None:
    claimed = requests.claimed()
    for record in table.in_state(InstanceState.DRAINING):
        if record.id in claimed:
            continue
        started = record.drain_started_at if record.drain_started_at is not None else view.now
        requests.continuing.append(
            ContinueDrain(
                record.id,
                record.provider,
                record.pool,
                timed_out=view.now - started >= config.drain_timeout_s,
                move_jobs=record.move_jobs,
            )
        )
