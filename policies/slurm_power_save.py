"""``slurm-power-save``: Slurm's power saving with cloud nodes (``State=CLOUD``) as the Slurm
Power Saving Guide says it behaves, for "better than Slurm" to mean better than Slurm as it runs.

Source: https://slurm.schedmd.com/power_save.html (``doc/html/power_save.shtml`` in
SchedMD/slurm), and the behaviour taken from it:

* "Nodes will automatically be resumed by ResumeProgram to complete work allocated to them":
  the scheduler allocates pending jobs to nodes, powered-down cloud nodes included, and the
  nodes so allocated are resumed. A job of several nodes is allocated that many nodes; each is
  resumed on its own (a node that fails to come up within ResumeTimeout goes DOWN and the job is
  requeued), so nothing is all-or-nothing.
* Weight: "Nodes with lower weights are used before those with higher weights. The default value
  is 1. Slurm will allocate from powered up nodes first, powering up nodes second and lastly
  powered down nodes -- respecting node weights in each set." Jobs share a node's GPUs
  (select/cons_tres), so a powering-up node takes further jobs that fit it.
* "Nodes that remain IDLE for SuspendTime will be suspended by SuspendProgram" (for cloud nodes:
  the instance is terminated). SuspendTime defaults to -1 (disabled); the guide's hybrid cluster
  example sets ``SuspendTime=600``, used here.
* ResumeRate (default 300 nodes per minute) and SuspendRate (default 60 per minute) bound how
  many nodes are resumed or suspended.
* A hybrid cluster puts on-prem nodes at a lower weight than cloud nodes (the guide's example:
  local ``Weight=1``, cloud ``Weight=8``), so on-prem GPUs are used first.

What the simulator cannot model, and what is done instead:

* Node weights are per pool: a ``weights`` mapping, else every pool at Slurm's default weight 1
  with ties broken by the pool's order in the configuration (Slurm's node order).
* Slurm's main scheduler takes jobs in priority order and backfills; here pending jobs are
  taken largest first (the shared ``needs_from`` order).
* Slurm knows no spot market and reads no interruption notice: a preempted node goes DOWN and
  its job is requeued, then allocated afresh. Which jobs run on spot is the user's choice of
  partition: jobs that cannot checkpoint, or are high priority, use an on-demand partition.
* ResumeTimeout is the cloud's boot time here; a node slower than ResumeTimeout is not marked
  DOWN. Rates are applied per controller tick (the shipped scenario ticks once a minute).
* A job's allocation on powering-up nodes is bucketed by GPU requirement: jobs that ask for
  different GPU models are not put on the same new node.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field

from autoscaler.model import (
    FleetView,
    LaunchRequest,
    NodeShape,
    Placement,
    Plan,
    PoolView,
    SharingMode,
)
from policies.common import Need, drain_requests, headroom, idle_nodes, needs_from, supply, unmet
from policies.peers_common import combined_shape, peer_placement, pool_order, usable


class SlurmPowerSaveParams(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    suspend_time_s: float = Field(
        600.0,
        ge=0,
        description="SuspendTime: a cloud node idle this long is suspended (power_save.html's "
        "hybrid cluster example; Slurm's default -1 disables power saving)",
    )
    weights: dict[str, int] = Field(
        default_factory=dict,
        description="node Weight per pool (lower used first); pools not named get Slurm's "
        "default 1, ties in configuration order",
    )
    resume_rate_per_min: int = Field(
        300, ge=0, description="ResumeRate: nodes resumed per minute at most (0: no limit)"
    )
    suspend_rate_per_min: int = Field(
        60, ge=0, description="SuspendRate: nodes suspended per minute at most (0: no limit)"
    )
    keep_uncheckpointable_off_spot: bool = Field(
        True, description="jobs that cannot checkpoint are submitted to an on-demand partition"
    )
    keep_high_priority_off_spot: bool = Field(
        True, description="high-priority jobs are submitted to an on-demand partition"
    )


# GPU models, memory per GPU, and the team the node is resumed for (None: no teams): a node is
# shared only by jobs of one key, so each launch is one team's.
_Key = tuple[tuple[str, ...], float | None, str | None, SharingMode | None]


@dataclass
class _Resumed:
    """A powered-down cloud node the scheduler has allocated jobs to in this pass."""

    pool: str
    gpus: int
    used: int
    key: _Key


class SlurmPowerSavePolicy:
    """Slurm power saving: resume the cloud nodes pending jobs are allocated, suspend idle ones.

    Nodes are allocated by weight (lowest first) and suspended after SuspendTime idle."""

    Params = SlurmPowerSaveParams

    def __init__(self, params: SlurmPowerSaveParams | None = None) -> None:
        self.params = params or SlurmPowerSaveParams()
        self.placement: Placement = peer_placement(
            self.params.keep_uncheckpointable_off_spot, self.params.keep_high_priority_off_spot
        )

    def decide(self, view: FleetView) -> Plan:
        idle = idle_nodes(view, self.params.suspend_time_s, by_allocation=True)
        available = supply(view, idle)
        needs = unmet(needs_from(view.demand.groups, self.placement), available)
        launches = self._resume(view, needs)
        drains = drain_requests(idle, available.kept, view, "power save: idle for SuspendTime")
        if self.params.suspend_rate_per_min:
            drains = drains[: self.params.suspend_rate_per_min]
        return Plan(
            launches=tuple(launches),
            drains=drains,
            placement=self.placement,
            reason=f"{sum(n.jobs for n in needs)} pending job(s) allocated powered-down nodes",
        )

    def _resume(self, view: FleetView, needs: Sequence[Need]) -> list[LaunchRequest]:
        order = pool_order(view)
        weight = {p.name: (self.params.weights.get(p.name, 1), order[p.name]) for p in view.pools}
        room = {p.name: headroom(view, p) for p in view.pools}
        limit = self.params.resume_rate_per_min or math.inf
        resumed: list[_Resumed] = []
        by_name = view.pool_by_name
        for need in needs:
            pools = sorted(
                (p for p in view.pools if usable(p) and need.allows(p)),
                key=lambda p: weight[p.name],
            )
            if not pools:
                continue
            key = (need.gpu_models, need.min_gpu_memory_gib, need.team, need.gpu_sharing)
            allowed = {p.name for p in pools}
            if need.nodes == 1:
                self._allocate_singles(need, key, pools, allowed, weight, room, resumed, limit)
                continue
            size = need.gpus_per_node
            for _ in range(need.jobs):
                chosen: list[_Resumed] = []
                # Powering-up nodes first, lowest weight first; one node per node of the job.
                for node in sorted(resumed, key=lambda r: weight[r.pool]):
                    if len(chosen) == need.nodes:
                        break
                    if node.key == key and node.pool in allowed and node.gpus - node.used >= size:
                        chosen.append(node)
                fresh: list[_Resumed] = []
                while len(chosen) + len(fresh) < need.nodes and len(resumed) + len(fresh) < limit:
                    pool = next((p for p in pools if room[p.name] > 0), None)
                    if pool is None:
                        break
                    room[pool.name] -= 1
                    fresh.append(_Resumed(pool.name, pool.pool.gpus_per_instance, 0, key))
                if len(chosen) + len(fresh) < need.nodes:
                    for node in fresh:
                        room[node.pool] += 1
                    break  # the job waits whole; so do the same-shaped jobs behind it
                for node in chosen + fresh:
                    node.used += size
                resumed.extend(fresh)
        counts: dict[tuple[str, NodeShape, str | None], int] = {}
        for node in resumed:
            models, memory, team, sharing = node.key
            shape = combined_shape(node.used, models, memory, sharing)
            counts[(node.pool, shape, team)] = counts.get((node.pool, shape, team), 0) + 1
        launches = []
        for (name, shape, team), count in counts.items():
            spot = by_name[name].pool.is_spot
            # A spot node holds only jobs of a partition with both markets; an on-demand one may
            # hold jobs that must stay off spot.
            fallbacks = tuple(
                p.name
                for p in sorted(view.pools, key=lambda p: weight[p.name])
                if p.name != name
                and usable(p)
                and p.pool.can_host(shape)
                and (spot or not p.pool.is_spot)
            )
            launches.append(
                LaunchRequest(
                    pool=name,
                    count=count,
                    fallbacks=fallbacks,
                    reason=f"ResumeProgram: nodes allocated to pending jobs, {shape.describe()}",
                    shape=shape,
                    team=team,
                )
            )
        return launches

    @staticmethod
    def _allocate_singles(
        need: Need,
        key: _Key,
        pools: Sequence[PoolView],
        allowed: set[str],
        weight: dict[str, tuple[int, int]],
        room: dict[str, int],
        resumed: list[_Resumed],
        limit: float,
    ) -> None:
        """Single-node jobs, all alike: fill powering-up nodes by weight, then resume the
        lowest-weight node that hosts them, as many jobs on each as fit."""
        size = need.gpus_per_node
        remaining = need.jobs
        for node in sorted(resumed, key=lambda r: weight[r.pool]):
            if remaining == 0:
                return
            if node.key == key and node.pool in allowed:
                fit = min(remaining, (node.gpus - node.used) // size)
                node.used += fit * size
                remaining -= fit
        while remaining > 0 and len(resumed) < limit:
            pool = next((p for p in pools if room[p.name] > 0), None)
            if pool is None:
                return
            room[pool.name] -= 1
            fit = min(remaining, pool.pool.gpus_per_instance // size)
            resumed.append(_Resumed(pool.name, pool.pool.gpus_per_instance, fit * size, key))
            remaining -= fit
