"""What reclaim and preemption share: which on-prem nodes free room for a pending job by moving
the fewest GPUs of the jobs a rule may take, and what this tick's moves have claimed already.

The rules differ only in whom they may take from (a borrowing team down to its guarantee, a
lower priority class); each passes that as ``pick``. A job of several nodes gets as many
distinct nodes, each freeing its per-node share, all or none (``Room``).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field

from autoscaler.model import DemandGroup, OnPremNode
from autoscaler.spi.sources import HeldOff, RunningJob
from autoscaler.tick.intents import MoveJobs
from autoscaler.tick.rules.rebalance_onprem import OnPremJobs

# Chooses, from a node's movable jobs in the order they should go, those to move to free
# ``short`` GPUs there, given the jobs already chosen on the pending job's other nodes (a
# multi-node job's: what a team may lend is counted once over all of them); None when they
# cannot.
Pick = Callable[[Sequence[RunningJob], int, Sequence[RunningJob]], list[RunningJob] | None]


@dataclass(frozen=True)
class Room:
    """The on-prem nodes freed for one pending job, one for each node it asks for: each with the
    jobs to move off it (none on a node that has the room already)."""

    nodes: tuple[tuple[str, tuple[RunningJob, ...]], ...]

    @property
    def together(self) -> tuple[str, ...]:
        """Every node of the room, moved off or already free: the job is bound to all of them."""
        return tuple(name for name, _ in self.nodes)

    @property
    def moves(self) -> tuple[tuple[str, tuple[RunningJob, ...]], ...]:
        """The nodes with jobs to move off, and those jobs."""
        return tuple((name, jobs) for name, jobs in self.nodes if jobs)

    @property
    def jobs(self) -> tuple[RunningJob, ...]:
        return tuple(job for _, jobs in self.nodes for job in jobs)


@dataclass
class Claims:
    """Nodes and jobs already spoken for this tick (moves in flight, holds, earlier moves), and
    the pending jobs room is being made for."""

    busy_nodes: set[str]
    leaving: set[str]
    served: set[str]
    # pending job -> the nodes its holds bind it to, the latest first (the scheduler starts it
    # only there while those holds stand, so room elsewhere is no room for it); a job of k
    # nodes counts the latest k
    bound: dict[str, tuple[str, ...]] = field(default_factory=dict)
    # nodes with free room counted toward a multi-node job's room this tick: no room for others
    kept: set[str] = field(default_factory=set)
    # pending job -> the nodes a standing hold keeps it off (it was moved off them for another
    # job): no room for it, neither free nor freed, since a binding there would never start it
    kept_off: dict[str, set[str]] = field(default_factory=dict)

    @classmethod
    def of(
        cls,
        onprem: OnPremJobs,
        running: Mapping[str, Sequence[RunningJob]],
        taken: Sequence[MoveJobs],
        lost: Collection[str] = (),
    ) -> Claims:
        """``lost`` are pending jobs whose freed room another job took: their holds no longer
        stand for them, so room is made for them again (and on those nodes). A hold for a job
        that runs already (it started elsewhere while its movers checkpointed) keeps no node
        busy: the Slurm adapter ends it at its next tick, and the simulator's lasts its bound."""
        started = {job.id for jobs in running.values() for job in jobs}
        held = [h for h in onprem.held if h.for_job not in lost and h.for_job not in started]
        moved_off = {m.node for m in taken if m.jobs}
        busy = {h.node for h in held} | {node for m in taken for node in m.nodes}
        busy |= {node for node, jobs in running.items() if any(j.id in onprem.moving for j in jobs)}
        return cls(
            busy,
            set(onprem.moving) | {j.id for m in taken for j in m.jobs},
            set(onprem.making_room_for) | {h.for_job for h in held} | {m.for_job for m in taken},
            _bound(onprem.held),
            {node for m in taken for node in m.together if node not in moved_off},
            _kept_off(onprem.held),
        )

    def claim(self, room: Room, for_job: str) -> None:
        """Room made for ``for_job``: its nodes (the free ones of a multi-node job's too) and
        their movers are no one else's this tick."""
        self.busy_nodes.update(room.together)
        if len(room.nodes) > 1:
            self.kept.update(name for name, jobs in room.nodes if not jobs)
        self.leaving |= {job.id for job in room.jobs}
        self.served.add(for_job)


def _kept_off(held: Sequence[HeldOff]) -> dict[str, set[str]]:
    """Each job a standing hold keeps off nodes, with those nodes (whoever the hold is for)."""
    kept_off: dict[str, set[str]] = {}
    for h in held:
        kept_off.setdefault(h.job_id, set()).add(h.node)
    return kept_off


def _bound(held: Sequence[HeldOff]) -> dict[str, tuple[str, ...]]:
    """Each pending job's held nodes, the latest hold's first (of holds as recent, the one the
    scheduler listed last, as the binding it made last)."""
    latest: dict[str, dict[str, tuple[float, int]]] = {}
    for i, h in enumerate(held):
        nodes = latest.setdefault(h.for_job, {})
        nodes[h.node] = max((h.since, i), nodes.get(h.node, (h.since, i)))
    return {
        job: tuple(sorted(nodes, key=lambda n: nodes[n], reverse=True))
        for job, nodes in latest.items()
    }


def room_lost(onprem: OnPremJobs, waiting: Collection[str], now: float, tick_s: float) -> set[str]:
    """Pending jobs room was made for two ticks ago or more (any of their holds is that old, no
    move for them is under way) that still wait: the scheduler would have started them had the
    room stayed free, so another job took it (one not held off that node, such as a job moved
    earlier). A multi-node job loses its room when any part of it was taken, a node moved off
    or one that was free already: all its holds are let go and its k nodes found again."""
    return {
        h.for_job
        for h in onprem.held
        if h.since <= now - 2 * tick_s
        and h.for_job in waiting
        and h.for_job not in onprem.making_room_for
    }


def greedy(eligible: Callable[[RunningJob], bool]) -> Pick:
    """Take eligible jobs in order until enough GPUs are free."""

    def pick(
        candidates: Sequence[RunningJob], short: int, _elsewhere: Sequence[RunningJob]
    ) -> list[RunningJob] | None:
        chosen: list[RunningJob] = []
        for job in candidates:
            if short <= 0:
                break
            if eligible(job):
                chosen.append(job)
                short -= job.gpus
        return chosen if short <= 0 else None

    return pick


@dataclass(frozen=True)
class _Option:
    """A node that could be part of the room: what moving its chosen jobs costs, and what to pick
    from again once other nodes' jobs are chosen."""

    moved: int
    count: int
    gpus: int
    name: str
    chosen: tuple[RunningJob, ...]
    candidates: tuple[RunningJob, ...] = ()
    short: int = 0

    @property
    def rank(self) -> tuple[int, int, int, str]:
        return (self.moved, self.count, self.gpus, self.name)


def fewest_moved(
    nodes: Sequence[OnPremNode],
    running: Mapping[str, Sequence[RunningJob]],
    group: DemandGroup,
    claims: Claims,
    pick: Pick,
    job_id: str | None = None,
) -> Room | None:
    """The nodes, one for each of the job's ``group.nodes``, that free ``gpus_per_node`` each
    for one of the group's jobs (``job_id``) by moving the fewest GPUs (then jobs, then the
    smallest node, as the scheduler's best fit would, so that a big node is left for a bigger
    job; then by name); None when enough nodes already have room (the scheduler starts the job
    there) or not enough can be freed: a multi-node job's room is all its nodes or nothing,
    since a part of it starts nothing. Nodes that have the room count toward it with nothing to
    move. Single-node jobs only are moved (``_takeable``), those that checkpoint first, then the
    youngest: the least work lost, and the job that started last is expected to hold its GPUs
    longest. A job still bound to the nodes of earlier holds (``Claims.bound``) starts only
    there: free room on another node is no room for it, and moves elsewhere bind it to their
    nodes instead. A node a standing hold keeps the job off (``Claims.kept_off``: it was moved
    off it for another job) is never its room: bound there, it could start nowhere until the
    hold ends (the three-team replay found a job bound and held off the same node 1,800 s)."""
    k = group.nodes
    bound = claims.bound.get(job_id, ())[:k] if job_id is not None else ()
    kept_off = claims.kept_off.get(job_id, set()) if job_id is not None else set()
    need = group.gpus_per_node
    free: list[_Option] = []
    options: list[_Option] = []
    for node in nodes:
        if (
            not node.schedulable
            or node.name in claims.kept
            or node.name in kept_off
            or not group.shape.accepts(node.gpus, node.gpu_model, node.gpu_memory_gib)
        ):
            continue
        if node.gpus_free >= need:
            if not bound or node.name in bound:
                free.append(_Option(0, 0, node.gpus, node.name, ()))
            continue
        option = _movable(node, running.get(node.name, ()), need, claims, pick)
        if option is not None:
            options.append(option)
    if len(free) >= k:
        return None
    return _cheapest(sorted([*free, *options], key=lambda o: o.rank), k, pick)


def _movable(
    node: OnPremNode, jobs: Sequence[RunningJob], need: int, claims: Claims, pick: Pick
) -> _Option | None:
    """What freeing ``need`` GPUs on ``node`` would move, on its own; None when it cannot."""
    if node.name in claims.busy_nodes:
        return None
    candidates = tuple(
        sorted(
            (j for j in jobs if _takeable(j) and j.id not in claims.leaving),
            key=lambda j: (j.checkpoint_signal is None, -j.started_at, j.id),
        )
    )
    short = need - node.gpus_free
    chosen = pick(candidates, short, ())
    if chosen is None:
        return None
    moved = sum(j.gpus for j in chosen)
    return _Option(moved, len(chosen), node.gpus, node.name, tuple(chosen), candidates, short)


def _cheapest(ranked: Sequence[_Option], k: int, pick: Pick) -> Room | None:
    """The first ``k`` nodes in rank order whose jobs can still be taken once the nodes before
    them are chosen (what a team lends is spent across a multi-node job's nodes); None when
    fewer than ``k`` can."""
    chosen: list[tuple[str, tuple[RunningJob, ...]]] = []
    elsewhere: list[RunningJob] = []
    for option in ranked:
        jobs = option.chosen
        if jobs and elsewhere:
            again = pick(option.candidates, option.short, elsewhere)
            if again is None:
                continue
            jobs = tuple(again)
        chosen.append((option.name, jobs))
        elsewhere.extend(jobs)
        if len(chosen) == k:
            return Room(tuple(chosen))
    return None


def _takeable(job: RunningJob) -> bool:
    """Single-node jobs on whole GPUs. A job on a slice of a shared GPU is never taken: moving
    it frees no whole GPU while others share that GPU, so it would be lost work for nothing. A
    job of several nodes is never taken either: its gang is requeued whole (Slurm, the
    simulator), so moving it would free its other nodes too, which the choice does not count,
    and its work is lost on all of them (docs/teams.md)."""
    return job.nodes == 1 and job.gpu_share is None
