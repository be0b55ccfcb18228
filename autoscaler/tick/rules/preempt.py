"""Preemption by priority class (``teams.priority_classes``): pending work of a class that
``preempts`` takes an on-prem node from running work of strictly lower classes, by checkpoint.

After Kubernetes' scheduler preemption and Slurm's ``PreemptMode=REQUEUE`` by QOS, with the
victims asked to checkpoint first: when a pending single-node job of such a class may run
on-prem and no on-prem node has free room that fits it, the rule picks the on-prem node that
frees room for it by moving the fewest GPUs (then jobs, then by name) of single-node jobs of a
class of lower order (checkpointing jobs first, then the youngest: the least work lost, and the
job that started last is the one expected to hold the GPUs longest). A job of an equal or higher
class is never taken, nor a job spread over several nodes. Each is asked to checkpoint and
requeued through the move path reclaim and on-prem rebalancing use (``MovesJobsOff.move_off``:
it goes back to the queue and is kept off that node until the preempting job has started).

The bound is the class's ``preempt_within_s`` (else ``teams.reclaim_within_s``) from the
submission of the group's longest-waiting job: each move carries it less one tick
(``MoveJobs.by``), so that the scheduler has a tick to start the job; the moves are asked for
at once, as reclaim's are, and the job is hidden from the policy while room is made for it. A
job that cannot checkpoint by then is requeued at once.

A running job counts in the class its age when it last started (from its submission, as the
scheduler reports it) had aged to (``priorities.promoted_order``): a job requeued by preemption
again and again grows older at each start and ages into classes that may no longer take it, so
lower classes do not starve behind a stream of preempting work. The preempting job counts in its
own class's order. Teams' guarantees are not consulted: a preempting class may take GPUs from a
team within its guarantee (docs/teams.md).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from autoscaler.model import Capacity, DemandGroup, FleetView, OnPremNode, Placement
from autoscaler.model.priorities import promoted_order, resolve
from autoscaler.model.teams import PriorityClass, TeamsConfig
from autoscaler.spi.sources import RunningJob
from autoscaler.tick.intents import MoveJobs
from autoscaler.tick.rules.rebalance_onprem import OnPremJobs
from autoscaler.tick.rules.reclaim import Reclaim

RULE = "preempt"


def preempt(
    view: FleetView,
    teams: TeamsConfig | None,
    running: Mapping[str, Sequence[RunningJob]] | None,
    onprem: OnPremJobs | None,
    placement: Placement,
    tick_s: float,
    taken: Sequence[MoveJobs] = (),
) -> Reclaim:
    """The preemption moves to ask for this tick (see the module's docstring); ``taken`` are
    moves other rules already ask for this tick, whose nodes and jobs are left alone."""
    if teams is None or running is None or onprem is None or not view.demand.known:
        return Reclaim()
    classes = teams.priority_classes
    preemptors = _preempting_groups(view, classes, placement)
    if not preemptors:
        return Reclaim()
    leaving = set(onprem.moving) | {j.id for m in taken for j in m.jobs}
    busy_nodes = {h.node for h in onprem.held} | {m.node for m in taken}
    busy_nodes |= {
        node for node, jobs in running.items() if any(j.id in onprem.moving for j in jobs)
    }
    served = set(onprem.served) | {m.for_job for m in taken}
    found: list[MoveJobs] = []
    for group, cls in preemptors:
        within = cls.preempt_within_s or teams.reclaim_within_s
        by = group.oldest_submit_time + within - tick_s
        for job_id in group.oldest_jobs:
            if job_id in served:
                continue
            choice = _node_for(view.onprem, running, group, cls, classes, busy_nodes, leaving)
            if choice is None:
                break
            node, chosen = choice
            busy_nodes.add(node)
            leaving |= {job.id for job in chosen}
            served.add(job_id)
            victims = ", ".join(
                sorted({f"{j.id} ({j.priority_class or 'no class'})" for j in chosen})
            )
            found.append(
                MoveJobs(
                    node,
                    tuple(chosen),
                    job_id,
                    f"preempt on-prem {node} for job {job_id} of priority class "
                    f"{group.priority_class} (order {cls.order}): {victims}",
                    by=by,
                )
            )
    return Reclaim(found)


def running_order(classes: Mapping[str, PriorityClass], job: RunningJob) -> int:
    """The order a running job is preempted by: its class aged by how long it had waited since
    its submission when it last started (its own class's when that is not known)."""
    if job.submitted_at is None:
        return resolve(classes, job.priority_class).order
    return promoted_order(classes, job.priority_class, job.started_at - job.submitted_at)


def _preempting_groups(
    view: FleetView, classes: Mapping[str, PriorityClass], placement: Placement
) -> list[tuple[DemandGroup, PriorityClass]]:
    """Single-node groups of a class that preempts and may run on-prem, highest class first,
    then the longest waiting."""
    found = []
    for group in view.demand.groups:
        cls = resolve(classes, group.priority_class)
        if (
            cls.preempts
            and group.nodes == 1
            and group.oldest_jobs
            and Capacity.ONPREM
            in placement.tiers(group.checkpoint_interval_s is not None, group.high_priority)
        ):
            found.append((group, cls))
    return sorted(found, key=lambda p: (-p[1].order, p[0].oldest_submit_time, p[0].oldest_jobs))


def _node_for(
    nodes: Sequence[OnPremNode],
    running: Mapping[str, Sequence[RunningJob]],
    group: DemandGroup,
    cls: PriorityClass,
    classes: Mapping[str, PriorityClass],
    busy_nodes: set[str],
    leaving: set[str],
) -> tuple[str, list[RunningJob]] | None:
    """The node that frees room for one of the group's jobs by moving the fewest GPUs of lower
    classes (then jobs, then by name); None when a node already has room (the scheduler starts
    the job there) or none can be freed."""
    need = group.gpus_per_job
    shape = group.shape
    options: list[tuple[int, int, str, list[RunningJob]]] = []
    for node in nodes:
        if not node.schedulable or not shape.accepts(
            node.gpus, node.gpu_model, node.gpu_memory_gib
        ):
            continue
        free = node.gpus_free
        if free >= need:
            return None
        if node.name in busy_nodes:
            continue
        candidates = sorted(
            (
                j
                for j in running.get(node.name, ())
                if j.nodes == 1 and j.id not in leaving and running_order(classes, j) < cls.order
            ),
            key=lambda j: (j.checkpoint_signal is None, -j.started_at, j.id),
        )
        chosen: list[RunningJob] = []
        short = need - free
        for job in candidates:
            if short <= 0:
                break
            chosen.append(job)
            short -= job.gpus
        if short <= 0:
            options.append((sum(j.gpus for j in chosen), len(chosen), node.name, chosen))
    if not options:
        return None
    _, _, name, chosen = min(options, key=lambda o: (o[0], o[1], o[2]))
    return name, chosen
