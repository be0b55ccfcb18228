"""Rebalancing on-prem (``Placement.rebalance_onprem``): a pending job that is hardest to place
elsewhere — it must stay off spot, or it needs several GPUs, whose cloud shapes cost more per GPU
and are scarcer — takes an on-prem node from smaller spot-safe jobs that can restart at once on
free cloud room. Those jobs checkpoint on request first, so they lose no work, only the time to
write the checkpoint.

The rule is the same live and in the simulator: it reads the on-prem nodes' running jobs, the
moves still under way and the scheduler's holds (``OnPremJobs``), and asks, for each demand
group whose jobs may displace others (the group waiting longest first), for its longest-waiting
job (one per group at a time, until that job has started) the on-prem node that frees room for
it by moving the fewest GPUs, with a cloud node of free room
for every job moved (best fit, in the moved job's own tier order). A node the job already fits
on needs no move; one already being emptied for another job is left alone. With teams, another
team's job is moved only from what that team holds beyond its guarantee (its guaranteed
on-prem GPUs are its own, as reclaim keeps them). The guard
rate-limits the moves, act carries them out through the evacuator (checkpoint, then
``MovesJobsOff.move_off``).

Unlike the other rules it runs before the policy, under the placement in force (the last
plan's): a job for which room is being made is about to start on-prem, so the policy is shown
the demand without it (``view_for_policy``) and does not buy cloud capacity for it as well.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from autoscaler.model import (
    Capacity,
    DemandGroup,
    FleetView,
    InstanceState,
    NodeShape,
    OnPremNode,
    Placement,
)
from autoscaler.model.teams import UNASSIGNED, TeamsConfig
from autoscaler.spi.sources import HeldOff, RunningJob
from autoscaler.tick.intents import MoveJobs, Requests

RULE = "rebalance_onprem"


@dataclass(frozen=True)
class OnPremJobs:
    """What observe read for this rule: each on-prem node's running jobs, the scheduler's holds
    (jobs kept off a node until the job they made room for has started) and the jobs whose move
    is still under way (waiting on their checkpoint)."""

    jobs: Mapping[str, Sequence[RunningJob]]
    held: Sequence[HeldOff] = ()
    moving: frozenset[str] = field(default_factory=frozenset)
    making_room_for: frozenset[str] = field(default_factory=frozenset)
    # cloud GPUs held, by instance, for jobs being moved that have not moved yet
    reserved: Mapping[str, int] = field(default_factory=dict)

    @property
    def served(self) -> frozenset[str]:
        """The pending jobs room is being made for: by moves waiting on their checkpoints, and
        by holds still in place."""
        return self.making_room_for | {h.for_job for h in self.held}


class MovesInFlight(Protocol):
    """The moves under way (the evacuator's): jobs waited on, and the jobs they make room for."""

    def waiting(self) -> Collection[str]: ...

    def making_room_for(self) -> Collection[str]: ...

    def reserved(self) -> Mapping[str, int]: ...


@dataclass
class _Room:
    """A cloud node with free GPUs now, and what a job moved there must find on it."""

    name: str
    kind: Capacity
    free: int
    gpus: int
    gpu_model: str | None
    gpu_memory_gib: float | None


def displacing(view: FleetView, placement: Placement) -> list[DemandGroup]:
    """The demand groups whose jobs may take on-prem GPUs from movable jobs, the group waiting
    longest first."""
    if not placement.rebalance_onprem:
        return []
    groups = [
        g
        for g in view.demand.groups
        if g.nodes == 1
        and g.oldest_jobs
        and Capacity.ONPREM in placement.tiers(g.checkpoint_interval_s is not None, g.high_priority)
        and placement.may_displace(
            g.gpus_per_job, g.checkpoint_interval_s is not None, g.high_priority
        )
    ]
    return sorted(groups, key=lambda g: (g.oldest_submit_time, g.oldest_jobs))


def worth_reading(view: FleetView, placement: Placement) -> list[str]:
    """The on-prem nodes whose jobs observe must list for the rule, none when nothing could be
    moved: no group may displace, no cloud room is free, or no busy node could host the job."""
    groups = displacing(view, placement)
    if not groups or not _cloud_room(view, {}):
        return []
    return [
        node.name
        for node in view.onprem
        if node.schedulable
        and node.gpus_allocated > 0
        and any(g.shape.accepts(node.gpus, node.gpu_model, node.gpu_memory_gib) for g in groups)
    ]


def view_for_policy(
    view: FleetView, onprem: OnPremJobs | None, moves: Sequence[MoveJobs]
) -> FleetView:
    """The view the policy plans from: without the pending jobs room is being made for on-prem
    (each off the group that names it among its longest-waiting), so the policy does not buy
    capacity for them too; and with the cloud room held for the jobs being moved counted as
    taken, so the policy does not count it as free for other pending work as well."""
    if onprem is None and not moves:
        return view
    served = set(onprem.served if onprem is not None else ()) | {m.for_job for m in moves}
    held = dict(onprem.reserved) if onprem is not None else {}
    for move in moves:
        for _, instance, gpus in move.room:
            held[instance] = held.get(instance, 0) + gpus
    update: dict[str, object] = {}
    groups: list[DemandGroup] = []
    changed = False
    for group in view.demand.groups:
        placed = sum(1 for job in group.oldest_jobs if job in served)
        if not placed:
            groups.append(group)
            continue
        changed = True
        if group.jobs > placed:
            groups.append(group.model_copy(update={"jobs": group.jobs - placed}))
    if changed:
        update["demand"] = view.demand.model_copy(update={"groups": tuple(groups)})
    if held:
        update["instances"] = tuple(
            node.model_copy(
                update={
                    "gpus_allocated": min(node.gpus, node.gpus_allocated + held[node.instance_id])
                }
            )
            if held.get(node.instance_id)
            else node
            for node in view.instances
        )
    return view.model_copy(update=update) if update else view


def moves(
    view: FleetView,
    placement: Placement,
    onprem: OnPremJobs | None,
    teams: TeamsConfig | None = None,
) -> list[MoveJobs]:
    """The moves to ask for this tick (see the module's docstring)."""
    found = Requests()
    requests(view, placement, onprem, found, teams)
    return found.moves


def requests(
    view: FleetView,
    placement: Placement,
    onprem: OnPremJobs | None,
    requests: Requests,
    teams: TeamsConfig | None = None,
) -> None:
    if onprem is None or not onprem.jobs or not view.demand.known:
        return
    groups = displacing(view, placement)
    room = _cloud_room(view, onprem.reserved)
    if not groups or not room:
        return
    spare = _spare(teams, onprem)
    busy_nodes = {h.node for h in onprem.held}
    busy_jobs = set(onprem.moving) | {h.job_id for h in onprem.held}
    served = onprem.served
    for node, jobs in onprem.jobs.items():
        if any(job.id in onprem.moving for job in jobs):
            busy_nodes.add(node)
    for group in groups:
        # One job per group at a time: the group's longest-waiting job, until it has started.
        # Making room for the next ones in the same tick moved more jobs for less (naming up
        # to eight per tick raised synthetic-long's p95 wait from 235 s to 318 s at the same
        # cost over the evaluation suite; docs/benchmarks.md, issue 16).
        job_id = group.oldest_jobs[0]
        if job_id in served:
            continue
        found = _make_room(
            view.onprem, onprem.jobs, group, placement, room, busy_nodes, busy_jobs, spare
        )
        if found is None:
            continue
        node, moved, targets = found
        busy_nodes.add(node)
        busy_jobs.update(job.id for job in moved)
        if spare is not None:
            for job in moved:
                if _team(job.team) != _team(group.team):
                    spare[_team(job.team)] -= job.gpus_held
        requests.moves.append(
            MoveJobs(
                node,
                tuple(moved),
                job_id,
                f"on-prem {node} for job {job_id} ({group.gpus_per_job} GPU(s)"
                f"{'' if _protected(group, placement) else ', multi-GPU'})",
                targets,
            )
        )


def _team(team: str | None) -> str:
    return team or UNASSIGNED


def _spare(teams: TeamsConfig | None, onprem: OnPremJobs) -> dict[str, float] | None:
    """With teams, the on-prem GPUs each team holds beyond its guarantee: all that rebalancing
    may move off on-prem for another team's job. A team within its guarantee keeps its on-prem
    GPUs (they are its own, as reclaim gives them back); without this, rebalancing moved a
    job reclaim had just started to the cloud for another team, and reclaim took the node back
    (three-team replay). None without teams: any team's job may move."""
    if teams is None:
        return None
    held: dict[str, float] = {}
    for jobs in onprem.jobs.values():
        for job in jobs:
            if job.id not in onprem.moving:
                held[_team(job.team)] = held.get(_team(job.team), 0.0) + job.gpus_held
    return {team: gpus - teams.spec(team).guaranteed_gpus for team, gpus in held.items()}


def _protected(group: DemandGroup, placement: Placement) -> bool:
    return not placement.allows_spot(group.checkpoint_interval_s is not None, group.high_priority)


def _cloud_room(view: FleetView, reserved: Mapping[str, int]) -> list[_Room]:
    """Running, joined cloud nodes with free GPUs (less what moves under way hold there) and no
    notice against them."""
    pools = {p.pool.name: p.pool for p in view.pools}
    noticed = {n.instance_id for n in view.notices}
    room = []
    for node in view.instances:
        pool = pools.get(node.pool)
        free = node.gpus - node.gpus_allocated - reserved.get(node.instance_id, 0)
        if (
            pool is None
            or free <= 0
            or node.state is not InstanceState.RUNNING
            or not node.joined
            or node.instance_id in noticed
        ):
            continue
        kind = Capacity.SPOT if pool.is_spot else Capacity.ON_DEMAND
        room.append(
            _Room(node.instance_id, kind, free, node.gpus, pool.gpu_model, pool.gpu_memory_gib)
        )
    return room


def _make_room(
    nodes: Sequence[OnPremNode],
    jobs: Mapping[str, Sequence[RunningJob]],
    group: DemandGroup,
    placement: Placement,
    room: list[_Room],
    busy_nodes: set[str],
    busy_jobs: set[str],
    spare: Mapping[str, float] | None = None,
) -> tuple[str, list[RunningJob], tuple[tuple[str, str, int], ...]] | None:
    """The on-prem node that frees room for the group's job by moving the fewest GPUs (then
    jobs, then by name), with cloud room reserved in ``room`` for each job moved; None when no
    node can, or when one already has room (the scheduler starts the job there itself). With
    ``spare`` (teams), another team's jobs are moved only from what it holds beyond its
    guarantee."""
    need = group.gpus_per_job
    protected = _protected(group, placement)
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
        movable = [
            job
            for job in jobs.get(node.name, ())
            if job.nodes == 1
            and job.checkpoint_signal is not None
            and job.id not in busy_jobs
            and placement.movable(
                job.gpus, job.checkpoint_interval_s is not None, job.high_priority, need, protected
            )
        ]
        if free + sum(job.gpus for job in movable) < need:
            continue
        # Youngest first: with heavy-tailed run times the job that started last is the one
        # expected to finish soonest, so it holds the cloud room it moves to the shortest.
        movable.sort(key=lambda job: (-job.started_at, job.id))
        chosen: list[RunningJob] = []
        short = need - free
        lendable = dict(spare) if spare is not None else None
        for job in movable:
            if short <= 0:
                break
            team = _team(job.team)
            if lendable is not None and team != _team(group.team):
                if lendable.get(team, 0.0) < job.gpus_held:
                    continue
                lendable[team] -= job.gpus_held
            chosen.append(job)
            short -= job.gpus
        if short > 0:
            continue
        options.append((sum(job.gpus for job in chosen), len(chosen), node.name, chosen))
    for _, _, name, chosen in sorted(options, key=lambda o: (o[0], o[1], o[2])):
        targets = _reserve(chosen, placement, room)
        if targets is not None:
            return name, chosen, targets
    return None


def _reserve(
    jobs: Sequence[RunningJob], placement: Placement, room: list[_Room]
) -> tuple[tuple[str, str, int], ...] | None:
    """Reserve cloud room for every job (the tightest fit of its first tier with room) and say
    where, as (job id, instance, GPUs); leaves ``room`` as it was and answers None when some
    job finds none."""
    taken: list[tuple[_Room, int]] = []
    where: list[tuple[str, str, int]] = []
    for job in jobs:
        shape = NodeShape.model_construct(
            gpus=job.gpus, gpu_models=job.gpu_models, min_gpu_memory_gib=job.min_gpu_memory_gib
        )
        target = None
        for kind in placement.tiers(job.checkpoint_interval_s is not None, job.high_priority):
            fits = [
                r
                for r in room
                if r.kind is kind
                and r.free >= job.gpus
                and shape.accepts(r.gpus, r.gpu_model, r.gpu_memory_gib)
            ]
            if fits:
                target = min(fits, key=lambda r: (r.free, r.name))
                break
        if target is None:
            for held, gpus in taken:
                held.free += gpus
            return None
        target.free -= job.gpus
        taken.append((target, job.gpus))
        where.append((job.id, target.name, job.gpus))
    return tuple(where)
