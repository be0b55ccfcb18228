"""Reclaiming guaranteed on-prem GPUs (``teams``): a team below its guarantee whose work waits
takes back, by checkpoint, the on-prem GPUs other teams borrowed while it had none to run.

Quotas with borrowing, after Kueue's cohorts (``reclaimWithinCohort``) and Slurm's QOS
``GrpTRES`` with preemption: a team's ``guaranteed_gpus`` are lent to others while it has no work
for them; when its work arrives and the scheduler has no free room that fits it, the rule picks,
for the team's longest-waiting job, the on-prem node that frees room for it by moving the fewest
GPUs of *borrowers* — jobs of teams holding more on-prem GPUs than their own guarantee, taken
only down to that guarantee, never below. Each is asked to checkpoint and requeued through the
move path on-prem rebalancing uses (``MovesJobsOff.move_off``: the job goes back to the queue
and is kept off that node until the owner's job has started). A job that cannot checkpoint, or
whose checkpoint would not end within the bound, is requeued at once, losing what it ran since
its last checkpoint: the guarantee is a promise, as Kueue's preemption is.

The bound is ``teams.reclaim_within_s`` from the owner job's submission: each move carries the
time by which its jobs must be gone (``MoveJobs.by``), one tick before the bound so that the
scheduler has a tick to start the owner's job. The moves are asked for at once, as Kueue
reclaims, not at the last tick that would still keep the bound: replayed on the three-team
scenario, waiting for borrowed GPUs to come free by themselves cost as much and tripled
research's p95 wait (docs/benchmarks.md). A job is entitled only while the team's on-prem
GPUs, with those already being freed for it, stay within its guarantee once it starts (as
Kueue admits by nominal quota), counting the whole job: all its nodes' GPUs.

A job of k nodes gets k distinct on-prem nodes, each freeing its per-node share, all or none:
when k cannot be freed from borrowers' GPUs beyond their guarantees (counted once over all k
nodes), nothing is moved for it, since a part of a gang's room starts nothing. Nodes that have
the room already count toward the k with nothing to move; every move for the job names all k
(``MoveJobs.together``), so the guard grants them together and the job is bound to all of them
when they are decided. Jobs of several nodes are never moved (their gangs are requeued whole:
moving one would free its other nodes too, uncounted, and lose its work on all of them;
docs/teams.md).

Like on-prem rebalancing it runs before the policy, so the policy is shown the demand without
the jobs room is being made for and does not buy cloud capacity for them as well.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from autoscaler.model import Capacity, DemandGroup, FleetView, Placement
from autoscaler.model.teams import UNASSIGNED, TeamsConfig
from autoscaler.spi.sources import RunningJob
from autoscaler.tick.intents import MoveJobs
from autoscaler.tick.rules.rebalance_onprem import OnPremJobs
from autoscaler.tick.rules.taking import Claims, Pick, Room, fewest_moved, room_lost

RULE = "reclaim"


def team_of(team: str | None) -> str:
    return team or UNASSIGNED


def onprem_held(
    view: FleetView, running: Mapping[str, Sequence[RunningJob]], leaving: frozenset[str]
) -> dict[str, float]:
    """On-prem GPUs each team's running jobs hold, less jobs already on their way off; a job on
    a slice of a shared GPU holds its slice (``RunningJob.gpus_held``), as attribution counts it."""
    held: dict[str, float] = {}
    for node in view.onprem:
        for job in running.get(node.name, ()):
            if job.id not in leaving:
                held[team_of(job.team)] = held.get(team_of(job.team), 0.0) + job.gpus_held
    return held


@dataclass(frozen=True)
class Reclaim:
    """This tick's moves (a dataclass of its own so that what a rule returns can grow)."""

    moves: list[MoveJobs] = field(default_factory=list)


def reclaim(
    view: FleetView,
    teams: TeamsConfig | None,
    running: Mapping[str, Sequence[RunningJob]] | None,
    onprem: OnPremJobs | None,
    placement: Placement,
    tick_s: float,
    taken: Sequence[MoveJobs] = (),
) -> Reclaim:
    """The reclaim moves to ask for this tick (see the module's docstring); ``taken`` are moves
    another rule already asks for this tick, whose nodes and jobs are left alone."""
    if teams is None or running is None or onprem is None or not view.demand.known:
        return Reclaim()
    owners = _owner_groups(view, teams, placement)
    if not owners:
        return Reclaim()
    waiting = {g.oldest_jobs[0] for g in owners}
    claims = Claims.of(onprem, running, taken, room_lost(onprem, waiting, view.now, tick_s))
    held = onprem_held(view, running, frozenset(claims.leaving))
    coming = _coming(view, claims.served)
    found: list[MoveJobs] = []
    for group in owners:
        team = team_of(group.team)
        guarantee = teams.spec(group.team).guaranteed_gpus
        job_id = group.oldest_jobs[0]
        need = group.gpus_per_job  # the whole job's, over all its nodes
        if job_id in claims.served or held.get(team, 0) + coming.get(team, 0) + need > guarantee:
            continue
        room = fewest_moved(
            view.onprem, running, group, claims, _borrowed(teams, team, held), job_id
        )
        if room is None:
            continue
        for job in room.jobs:
            held[team_of(job.team)] -= job.gpus
        coming[team] = coming.get(team, 0) + need
        claims.claim(room, job_id)
        found.extend(_moves(room, group, job_id, guarantee, teams, tick_s))
    return Reclaim(found)


def _moves(
    room: Room,
    group: DemandGroup,
    job_id: str,
    guarantee: int,
    teams: TeamsConfig,
    tick_s: float,
) -> list[MoveJobs]:
    """One move for each node of the room with jobs to move, all with the same bound; a
    multi-node job's name every node of its room (``together``), those already free too."""
    team = team_of(group.team)
    together = room.together if group.nodes > 1 else ()
    where = f" ({group.nodes} nodes: {', '.join(together)})" if together else ""
    found = []
    for node, chosen in room.moves:
        lenders = ", ".join(sorted({team_of(j.team) for j in chosen}))
        found.append(
            MoveJobs(
                node,
                chosen,
                job_id,
                f"reclaim on-prem {node} for team {team}'s job {job_id}{where} "
                f"({group.gpus_per_job} GPU(s) of its {guarantee} guaranteed) from {lenders}",
                by=group.oldest_submit_time + teams.reclaim_within_s - tick_s,
                together=together,
            )
        )
    return found

    return Reclaim(found)


def _owner_groups(view: FleetView, teams: TeamsConfig, placement: Placement) -> list[DemandGroup]:
    """Groups of teams with a guarantee that may run on-prem: jobs of more nodes first, then the
    longest waiting. A gang's k whole nodes are the hardest room to find, so it chooses before
    a single-node job of the same tick takes one of them for GPUs it could have found on a
    smaller node (first-fit decreasing); single-node jobs keep their age order."""
    groups = [
        g
        for g in view.demand.groups
        if g.oldest_jobs
        and teams.spec(g.team).guaranteed_gpus >= g.gpus_per_job
        and Capacity.ONPREM in placement.tiers(g.checkpoint_interval_s is not None, g.high_priority)
    ]
    return sorted(groups, key=lambda g: (-g.nodes, g.oldest_submit_time, g.oldest_jobs))


def _coming(view: FleetView, served: frozenset[str] | set[str]) -> dict[str, int]:
    """GPUs already being freed for each team: its pending jobs room is being made for."""
    coming: dict[str, int] = {}
    for group in view.demand.groups:
        n = sum(1 for job in group.oldest_jobs if job in served)
        if n:
            team = team_of(group.team)
            coming[team] = coming.get(team, 0) + n * group.gpus_per_job
    return coming


def _borrowed(teams: TeamsConfig, owner: str, held: Mapping[str, float]) -> Pick:
    """Take jobs of other teams only from what they hold beyond their own guarantee, less what
    is already taken from them on the owner job's other nodes."""

    def pick(
        candidates: Sequence[RunningJob], short: int, elsewhere: Sequence[RunningJob]
    ) -> list[RunningJob] | None:
        spare = {team: gpus - teams.spec(team).guaranteed_gpus for team, gpus in held.items()}
        for job in elsewhere:
            spare[team_of(job.team)] = spare.get(team_of(job.team), 0) - job.gpus
        chosen: list[RunningJob] = []
        for job in candidates:
            if short <= 0:
                break
            lender = team_of(job.team)
            if lender == owner or spare.get(lender, 0) < job.gpus:
                continue
            spare[lender] -= job.gpus
            chosen.append(job)
            short -= job.gpus
        return chosen if short <= 0 else None

    return pick
