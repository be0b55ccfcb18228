"""Preemption by priority class (``teams.priority_classes``): pending work of a class that
``preempts`` takes an on-prem node from running work of strictly lower classes, by checkpoint.

After Kubernetes' scheduler preemption and Slurm's ``PreemptMode=REQUEUE`` by QOS, with the
victims asked to checkpoint first: when a pending job of such a class may run on-prem and no
on-prem node has free room that fits it, the rule picks the on-prem node that frees room for it
by moving the fewest GPUs (then jobs, then by name) of single-node jobs of a class of lower
order (checkpointing jobs first, then the youngest: the least work lost, and the job that
started last is the one expected to hold the GPUs longest). A job of k nodes gets k distinct
nodes so freed, all or none (nodes with the room already count toward them; every move names
all k, ``MoveJobs.together``); when k cannot be freed from strictly lower classes nothing is
moved for it. A job of an equal or higher class is never taken, nor a job spread over several
nodes (its gang is requeued whole; docs/teams.md). Each is asked to checkpoint and requeued
through the move path reclaim and on-prem rebalancing use (``MovesJobsOff.move_off``: it goes
back to the queue and is kept off that node until the preempting job has started).

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

from collections.abc import Callable, Mapping, Sequence

from autoscaler.model import Capacity, DemandGroup, FleetView, Placement
from autoscaler.model.priorities import promoted_order, resolve
from autoscaler.model.teams import PriorityClass, TeamsConfig
from autoscaler.spi.sources import RunningJob
from autoscaler.tick.intents import MoveJobs
from autoscaler.tick.rules.rebalance_onprem import OnPremJobs
from autoscaler.tick.rules.reclaim import Reclaim
from autoscaler.tick.rules.taking import Claims, Room, fewest_moved, greedy, room_lost

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
    waiting = {job for group, _ in preemptors for job in group.oldest_jobs}
    claims = Claims.of(onprem, running, taken, room_lost(onprem, waiting, view.now, tick_s))
    found: list[MoveJobs] = []
    for group, cls in preemptors:
        within = cls.preempt_within_s or teams.reclaim_within_s
        by = group.oldest_submit_time + within - tick_s
        lower = greedy(_below(classes, cls.order))
        for job_id in group.oldest_jobs:
            if job_id in claims.served:
                continue
            room = fewest_moved(view.onprem, running, group, claims, lower, job_id)
            if room is None:
                break
            claims.claim(room, job_id)
            found.extend(_moves(room, group, cls, job_id, by))
    return Reclaim(found)


def _moves(
    room: Room, group: DemandGroup, cls: PriorityClass, job_id: str, by: float
) -> list[MoveJobs]:
    """One move for each node of the room with jobs to move, all with the same bound; a
    multi-node job's name every node of its room (``together``), those already free too."""
    together = room.together if group.nodes > 1 else ()
    where = f" ({group.nodes} nodes: {', '.join(together)})" if together else ""
    found = []
    for node, chosen in room.moves:
        victims = ", ".join(sorted({f"{j.id} ({j.priority_class or 'no class'})" for j in chosen}))
        found.append(
            MoveJobs(
                node,
                chosen,
                job_id,
                f"preempt on-prem {node} for job {job_id}{where} of priority class "
                f"{group.priority_class} (order {cls.order}): {victims}",
                by=by,
                together=together,
            )
        )
    return found


def running_order(classes: Mapping[str, PriorityClass], job: RunningJob) -> int:
    """The order a running job is preempted by: its class aged by how long it had waited since
    its submission when it last started (its own class's when that is not known)."""
    if job.submitted_at is None:
        return resolve(classes, job.priority_class).order
    return promoted_order(classes, job.priority_class, job.started_at - job.submitted_at)


def _preempting_groups(
    view: FleetView, classes: Mapping[str, PriorityClass], placement: Placement
) -> list[tuple[DemandGroup, PriorityClass]]:
    """Groups of a class that preempts and may run on-prem: highest class first, then jobs of
    more nodes (a gang's k whole nodes are the hardest room to find, as for reclaim), then the
    longest waiting."""
    found = []
    for group in view.demand.groups:
        cls = resolve(classes, group.priority_class)
        if (
            cls.preempts
            and group.oldest_jobs
            and Capacity.ONPREM
            in placement.tiers(group.checkpoint_interval_s is not None, group.high_priority)
        ):
            found.append((group, cls))
    return sorted(
        found,
        key=lambda p: (-p[1].order, -p[0].nodes, p[0].oldest_submit_time, p[0].oldest_jobs),
    )


def _below(classes: Mapping[str, PriorityClass], order: int) -> Callable[[RunningJob], bool]:
    """Whether a running job's class is strictly lower than ``order``."""
    return lambda job: running_order(classes, job) < order
