"""The controller's own rules: what it asks of a tick beside the policy's plan.

One file per rule, after Karpenter's one file per disruption method. Each is a pure function of
the frozen view, the instance table as it stood when the tick began and the config; it appends
requests and changes nothing. The guard grants them, act carries them out. They run in a fixed
order, and a later rule leaves alone an instance an earlier one has already decided for.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from autoscaler.fleet.instances import InstanceTable
from autoscaler.model import FleetView, InterruptionNotice
from autoscaler.model.config import ControllerConfig
from autoscaler.tick.intents import MoveJobs, Requests
from autoscaler.tick.rules import drains, interruption, orphans, overdue, rebalance, registration


def controller_requests(
    view: FleetView,
    notices: Sequence[InterruptionNotice],
    table: InstanceTable,
    config: ControllerConfig,
    *,
    can_evacuate: bool,
    nodes_known: bool,
    unlisted: Collection[str] = (),
    moves: Sequence[MoveJobs] = (),
) -> Requests:
    """Every rule's requests for this tick, in the order they are decided. ``moves`` are the
    on-prem rebalance rule's, decided before the policy (``rebalance_onprem``)."""
    requests = Requests()
    interruption.requests(view, notices, table, requests)
    rebalance.requests(view, table, config, can_evacuate, requests)
    overdue.requests(view, table, requests)
    orphans.requests(view, table, config, requests)
    registration.requests(view, table, config, nodes_known, unlisted, requests)
    drains.requests(view, table, config, requests)
    requests.moves.extend(moves)
    return requests
