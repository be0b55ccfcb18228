"""A cloud node that boots but never joins the workload scheduler holds no job and never will:
past its pool's boot time plus ``registration_timeout_s`` it is terminated, and, while jobs are
pending, bought again in its pool. After Karpenter, which gives a node claim 15 minutes to
register. Only judged while the scheduler's node listing and the node's cloud were both read
this tick: a node nobody could see is unknown, not unjoined. A pool whose instances are not
meant to join the node source (queue workers beside a Slurm that holds only on-prem nodes) says
``joins_scheduler: false``; ``registration_timeout_s: null`` switches the rule off for all."""

from __future__ import annotations

from collections.abc import Collection

from autoscaler.fleet.instances import InstanceTable
from autoscaler.model import FleetView, InstanceState, LaunchRequest
from autoscaler.model.config import ControllerConfig
from autoscaler.tick.intents import Replace, Requests, Terminate

_BOOTING = (InstanceState.PENDING, InstanceState.RUNNING)
RULE = "registration"
SAID = "(registration timeout)"  # how its terminations end, for metrics


def requests(
    view: FleetView,
    table: InstanceTable,
    config: ControllerConfig,
    nodes_known: bool,
    unlisted: Collection[str],
    requests: Requests,
) -> None:
    timeout = config.registration_timeout_s
    if timeout is None or not nodes_known:
        return
    pools = view.pool_by_name
    claimed = requests.claimed()
    pending = view.demand.known and view.demand.gpus > 0
    for node in view.instances:
        pool = pools.get(node.pool)
        if node.joined or node.state not in _BOOTING or pool is None:
            continue
        if not pool.pool.joins_scheduler:
            continue
        if node.instance_id in claimed:
            continue
        if view.now - node.launched_at <= pool.pool.boot_seconds + timeout:
            continue
        record = table.get(node.instance_id)
        if record is None or record.provider in unlisted:
            continue  # a cloud that could not be listed leaves its nodes unknown
        waited = view.now - node.launched_at
        requests.terminations.append(
            Terminate(
                record.id,
                record.provider,
                record.pool,
                f"never joined the scheduler in {waited:.0f}s {SAID}",
                RULE,
            )
        )
        if pending:
            requests.replacements.append(
                Replace(
                    record.id,
                    LaunchRequest(
                        pool=record.pool,
                        count=1,
                        reason=f"replaces {record.id}, which never joined the scheduler",
                        team=record.team,  # bought for the same team, held to its limits
                    ),
                )
            )
