"""What reclaim and preemption share: which on-prem node frees room for a pending job by moving
the fewest GPUs of the jobs a rule may take, and what this tick's moves have claimed already.

The rules differ only in whom they may take from (a borrowing team down to its guarantee, a
lower priority class); each passes that as ``pick``.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field

from autoscaler.model import DemandGroup, OnPremNode
from autoscaler.spi.sources import RunningJob
from autoscaler.tick.intents import MoveJobs
from autoscaler.tick.rules.rebalance_onprem import OnPremJobs

# Chooses, from a node's movable jobs in the order they should go, those to move to free
# ``short`` GPUs; None when they cannot.
Pick = Callable[[Sequence[RunningJob], int], list[RunningJob] | None]


@dataclass
class Claims:
    """Nodes and jobs already spoken for this tick (moves in flight, holds, earlier moves), and
    the pending jobs room is being made for."""

    busy_nodes: set[str]
    leaving: set[str]
    served: set[str]
    # pending job -> the node its latest hold binds it to (the scheduler starts it only there
    # while that hold stands, so room elsewhere is no room for it)
    bound: dict[str, str] = field(default_factory=dict)

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
        busy = {h.node for h in held} | {m.node for m in taken}
        busy |= {node for node, jobs in running.items() if any(j.id in onprem.moving for j in jobs)}
        bound: dict[str, tuple[float, str]] = {}
        for h in onprem.held:
            if h.for_job not in bound or h.since >= bound[h.for_job][0]:
                bound[h.for_job] = (h.since, h.node)
        return cls(
            busy,
            set(onprem.moving) | {j.id for m in taken for j in m.jobs},
            set(onprem.making_room_for) | {h.for_job for h in held} | {m.for_job for m in taken},
            {job: node for job, (_, node) in bound.items()},
        )

    def claim(self, node: str, jobs: Sequence[RunningJob], for_job: str) -> None:
        self.busy_nodes.add(node)
        self.leaving |= {job.id for job in jobs}
        self.served.add(for_job)


def room_lost(onprem: OnPremJobs, waiting: Collection[str], now: float, tick_s: float) -> set[str]:
    """Pending jobs room was made for two ticks ago or more (their holds stand, no move for them
    is under way) that still wait: the scheduler would have started them had the room stayed
    free, so another job took it (one not held off that node, such as a job moved earlier)."""
    return {
        h.for_job
        for h in onprem.held
        if h.since <= now - 2 * tick_s
        and h.for_job in waiting
        and h.for_job not in onprem.making_room_for
    }


def greedy(eligible: Callable[[RunningJob], bool]) -> Pick:
    """Take eligible jobs in order until enough GPUs are free."""

    def pick(candidates: Sequence[RunningJob], short: int) -> list[RunningJob] | None:
        chosen: list[RunningJob] = []
        for job in candidates:
            if short <= 0:
                break
            if eligible(job):
                chosen.append(job)
                short -= job.gpus
        return chosen if short <= 0 else None

    return pick


def fewest_moved(
    nodes: Sequence[OnPremNode],
    running: Mapping[str, Sequence[RunningJob]],
    group: DemandGroup,
    claims: Claims,
    pick: Pick,
    job_id: str | None = None,
) -> tuple[str, list[RunningJob]] | None:
    """The node that frees room for one of the group's jobs (``job_id``) by moving the fewest
    GPUs (then jobs, then the smallest node, as the scheduler's best fit would, so that a big
    node is left for a bigger job; then by name); None when a node already has room (the
    scheduler starts the job there) or none can be freed. Single-node jobs only, those that
    checkpoint first, then the youngest: the least work lost, and the job that started last is
    expected to hold its GPUs longest. A job still bound to the node of an earlier hold
    (``Claims.bound``) starts only there: free room on another node is no room for it, and a
    move elsewhere binds it to that node instead."""
    bound = claims.bound.get(job_id) if job_id is not None else None
    need = group.gpus_per_job
    shape = group.shape
    options: list[tuple[int, int, int, str, list[RunningJob]]] = []
    for node in nodes:
        if not node.schedulable or not shape.accepts(
            node.gpus, node.gpu_model, node.gpu_memory_gib
        ):
            continue
        free = node.gpus_free
        if free >= need:
            if bound is None or bound == node.name:
                return None
            continue
        if node.name in claims.busy_nodes:
            continue
        candidates = sorted(
            (j for j in running.get(node.name, ()) if _takeable(j) and j.id not in claims.leaving),
            key=lambda j: (j.checkpoint_signal is None, -j.started_at, j.id),
        )
        chosen = pick(candidates, need - free)
        if chosen is not None:
            moved = sum(j.gpus for j in chosen)
            options.append((moved, len(chosen), node.gpus, node.name, chosen))
    if not options:
        return None
    _, _, _, name, chosen = min(options, key=lambda o: (o[0], o[1], o[2], o[3]))
    return name, chosen


def _takeable(job: RunningJob) -> bool:
    """Single-node jobs on whole GPUs. A job on a slice of a shared GPU is never taken: moving
    it frees no whole GPU while others share that GPU, so it would be lost work for nothing."""
    return job.nodes == 1 and job.gpu_share is None
