"""A rebalance recommendation (AWS's "elevated risk of interruption"), when
``interruptions.act_on_rebalance`` is on and jobs can be moved at their checkpoints: the node
takes no new work and is let go once its jobs have moved. With the switch off the notice is only
noted, and the view shows the policy no such notice, so it buys no replacement either."""

from __future__ import annotations

from autoscaler.fleet.instances import InstanceTable, is_drainable
from autoscaler.model import DrainRequest, FleetView, NoticeKind
from autoscaler.model.config import ControllerConfig
from autoscaler.tick.intents import Requests

REASON = "rebalance recommendation"


def requests(
    view: FleetView,
    table: InstanceTable,
    config: ControllerConfig,
    can_evacuate: bool,
    requests: Requests,
) -> None:
    if not (config.interruptions.act_on_rebalance and can_evacuate):
        return
    claimed = requests.claimed()
    for notice in view.notices:
        if notice.kind is not NoticeKind.REBALANCE or notice.instance_id in claimed:
            continue
        record = table.get(notice.instance_id)
        if record is None or not is_drainable(record.state):
            continue
        claimed.add(record.id)
        requests.drains.append(DrainRequest(instance_id=record.id, reason=REASON))
