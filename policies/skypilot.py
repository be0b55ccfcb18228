"""``skypilot-managed``: SkyPilot managed jobs (``sky jobs launch``) as their documentation says
they behave, for "better than SkyPilot" to mean better than SkyPilot as it really runs.

Sources, and the behaviour taken from each:

* Managed jobs, https://docs.skypilot.co/en/latest/examples/managed-jobs.html
  (``docs/source/examples/managed-jobs.rst`` in skypilot-org/skypilot):
  - "a dedicated auto-managed cluster for each job": the job is launched on a temporary cluster
    and "resources are cleaned up as soon as the job is finished";
  - on preemption or a node failure SkyPilot will "tear down the old temporary cluster and
    provision a new one in another region, then restart the job"; when resources are short it
    will "try other infra (clusters, regions, or clouds) indefinitely";
  - ``any_of: [{use_spot: true}, {use_spot: false}]`` makes SkyPilot "choose the cheapest
    resource to use, which almost certainly will be spot instances. If spot instances are not
    available, SkyPilot will fall back to launching on-demand/reserved instances"; without it a
    managed job uses on-demand.
* Recovery strategies, ``sky/jobs/recovery_strategy.py``: ``EAGER_NEXT_REGION`` is the registered
  default; on recovery it terminates the cluster and relaunches "explicitly blocking the
  previously launched region", failing over through the whole search space and only then
  retrying the old region. ``FAILOVER`` retries the same cloud and region first.
* Auto-failover, https://docs.skypilot.co/en/latest/examples/auto-failover.html: the optimizer
  picks the cheapest resources that satisfy the request; on capacity or quota errors "the
  provisioner first retries across all regions within a task's chosen cloud" (zones of a region
  before the next region), then "retries on the next cheapest cloud".
* Multi-node tasks (``num_nodes``) are provisioned as one cluster, in one zone, all nodes or
  none.

What the simulator cannot model, and what is done instead:

* SkyPilot polls cluster status and recovers after the instance is gone; it does not read the
  cloud's interruption notice, so this policy launches nothing on a notice: the job is requeued
  when its node goes and gets a new cluster then. The controller still cordons and evacuates a
  noticed node, for every policy.
* Which region a requeued job last ran in is not in the view. EAGER_NEXT_REGION's blocking is
  applied to the regions that recently interrupted us (pools marked risky): their pools are tried
  last, for every launch while the mark lasts, not only the preempted job's.
* The workload scheduler, not SkyPilot, binds jobs to nodes: a node freed by one job may take a
  pending job before its teardown, and a job may start on another job's new cluster.
* SkyPilot asks for an exact accelerator count; here the cheapest pool whose instance can host
  the job's node is used, which is the exact-count one whenever one is configured.
* On-prem GPUs take what the on-prem scheduler can run first; SkyPilot is the burst path for
  the rest (a hybrid user's way of running managed jobs). Jobs that cannot checkpoint, or are
  high priority, ask for ``use_spot: false``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from autoscaler.model import (
    Capacity,
    CloudNode,
    FleetView,
    LaunchRequest,
    NodeShape,
    Placement,
    Plan,
    PoolView,
)
from policies.common import (
    Need,
    Supply,
    drain_requests,
    headroom,
    idle_nodes,
    leaving,
    needs_from,
    unmet,
)
from policies.peers_common import booting, peer_placement, pool_order, price_of, usable

SpotChoice = Literal["any_of", "use_spot", "on_demand"]


class SkyPilotParams(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    recovery_strategy: Literal["EAGER_NEXT_REGION", "FAILOVER"] = Field(
        "EAGER_NEXT_REGION",
        description="resources.job_recovery.strategy (EAGER_NEXT_REGION is SkyPilot's default)",
    )
    spot_safe_resources: SpotChoice = Field(
        "any_of",
        description="what jobs that may run on spot ask for: any_of spot or on-demand (the "
        "cheapest, falling back to on-demand), use_spot only, or on_demand (SkyPilot's default)",
    )
    keep_uncheckpointable_off_spot: bool = Field(
        True, description="jobs that cannot checkpoint ask for use_spot: false"
    )
    keep_high_priority_off_spot: bool = Field(
        True, description="high-priority jobs ask for use_spot: false"
    )
    teardown_after_s: float = Field(
        0.0, ge=0, description="how long a cluster outlives its job (managed jobs: at once)"
    )


class SkyPilotManagedPolicy:
    """SkyPilot managed jobs as documented: a cluster per job on the cheapest offer, then down.

    Failover goes zone, region, then cloud; after a preemption the job is relaunched away from
    the region that preempted it (EAGER_NEXT_REGION)."""

    Params = SkyPilotParams

    def __init__(self, params: SkyPilotParams | None = None) -> None:
        self.params = params or SkyPilotParams()
        self.placement: Placement = peer_placement(
            self.params.keep_uncheckpointable_off_spot, self.params.keep_high_priority_off_spot
        )

    def decide(self, view: FleetView) -> Plan:
        ended = idle_nodes(view, self.params.teardown_after_s, by_allocation=True)
        available = _unshared_supply(view, ended)
        needs = unmet(needs_from(view.demand.groups, self.placement), available)
        needs = _minus_coming_up(view, needs)
        launches = self._clusters(view, needs)
        drains = drain_requests(ended, available.kept, view, "managed job ended: cluster down")
        return Plan(
            launches=tuple(launches),
            drains=drains,
            placement=self.placement,
            reason=f"{sum(n.jobs for n in needs)} pending job(s) get a cluster each",
        )

    def _clusters(self, view: FleetView, needs: Sequence[Need]) -> list[LaunchRequest]:
        room = {p.name: headroom(view, p) for p in view.pools}
        blocked = self._blocked_regions(view)
        order = pool_order(view)
        counts: dict[tuple[str, NodeShape, int, tuple[str, ...], str | None], int] = {}
        for need in needs:
            candidates = [p for p in view.pools if usable(p) and self._asks_for(need, p)]
            if not candidates:
                continue
            ranked = sorted(
                candidates,
                key=lambda p: (
                    (p.pool.provider, p.pool.region) in blocked,
                    price_of(p),
                    order[p.name],
                ),
            )
            for _ in range(need.jobs):
                chosen = next((p for p in ranked if room[p.name] >= need.nodes), None)
                if chosen is None:
                    break
                room[chosen.name] -= need.nodes
                fallbacks = tuple(p.name for p in _failover(chosen, candidates, blocked, order))
                key = (chosen.name, need.shape, need.nodes, fallbacks, need.team)
                counts[key] = counts.get(key, 0) + need.nodes
        return [
            LaunchRequest(
                pool=name,
                count=count,
                fallbacks=fallbacks,
                reason=f"managed job cluster{'s' if count > gang else ''} of {gang} node(s) "
                f"with {shape.describe()}",
                shape=shape,
                gang_size=gang,
                team=team,
            )
            for (name, shape, gang, fallbacks, team), count in counts.items()
        ]

    def _asks_for(self, need: Need, pool: PoolView) -> bool:
        """Whether the job's resources allow this pool: the right GPUs, and a market it asked
        for."""
        if not need.allows(pool):
            return False  # also keeps jobs that asked for use_spot: false off spot
        choice = self.params.spot_safe_resources
        if choice == "use_spot":
            return pool.pool.is_spot
        if choice == "on_demand":
            return not pool.pool.is_spot
        return True

    def _blocked_regions(self, view: FleetView) -> set[tuple[str, str]]:
        """Regions a relaunch skips at first: those that just preempted us (EAGER_NEXT_REGION)."""
        if self.params.recovery_strategy != "EAGER_NEXT_REGION":
            return set()
        return {
            (p.pool.provider, p.pool.region)
            for p in view.pools
            if p.risky_until is not None and p.risky_until > view.now
        }


def _failover(
    chosen: PoolView,
    candidates: Sequence[PoolView],
    blocked: set[tuple[str, str]],
    order: dict[str, int],
) -> list[PoolView]:
    """Where the provisioner goes when the chosen zone fails: the same market first (spot before
    the on-demand fallback of ``any_of``), within it the chosen cloud's zones and regions by price
    (the chosen region first), then the next cheapest cloud; blocked regions last."""
    cheapest_of_cloud: dict[str, float] = {}
    for p in candidates:
        cloud = p.pool.provider
        cheapest_of_cloud[cloud] = min(cheapest_of_cloud.get(cloud, price_of(p)), price_of(p))

    def key(p: PoolView) -> tuple[bool, bool, bool, float, bool, float, int]:
        same_cloud = p.pool.provider == chosen.pool.provider
        return (
            p.pool.is_spot != chosen.pool.is_spot,
            (p.pool.provider, p.pool.region) in blocked,
            not same_cloud,
            0.0 if same_cloud else cheapest_of_cloud[p.pool.provider],
            p.pool.region != chosen.pool.region,
            price_of(p),
            order[p.name],
        )

    return sorted((p for p in candidates if p.name != chosen.name), key=key)


def _unshared_supply(view: FleetView, ended: Sequence[CloudNode]) -> Supply:
    """Room pending jobs can count on before a cluster of their own: free on-prem GPUs, and
    clusters whose job ended (offered last, kept if a pending job fits one). A running cluster is
    its job's alone."""
    ended_ids = {n.instance_id for n in ended}
    result = Supply()
    for onprem in view.onprem:
        if onprem.schedulable:
            result.add(
                onprem.gpus_free,
                Capacity.ONPREM,
                gpu_model=onprem.gpu_model,
                gpu_memory_gib=onprem.gpu_memory_gib,
            )
    for node in view.instances:
        pool = view.pool_by_name.get(node.pool)
        if pool is not None and node.instance_id in ended_ids:
            kind = Capacity.SPOT if pool.pool.is_spot else Capacity.ON_DEMAND
            result.idle.append((node, kind, pool.pool))
    return result


def _minus_coming_up(view: FleetView, needs: Sequence[Need]) -> list[Need]:
    """Pending jobs less those a cluster coming up was launched for: each booting instance is
    one node of one job (whatever its size), matched to the largest jobs it can host first."""
    gone = leaving(view)
    coming = [
        (node, view.pool_by_name[node.pool])
        for node in view.instances
        if booting(node) and node.pool in view.pool_by_name and node.instance_id not in gone
    ]
    used: set[str] = set()
    left: list[Need] = []
    for need in needs:
        fitting = [
            node.instance_id
            for node, pool in coming
            if node.instance_id not in used and need.allows(pool)
        ]
        covered = min(need.jobs, len(fitting) // need.nodes)
        used.update(fitting[: covered * need.nodes])
        if need.jobs > covered:
            left.append(need.with_jobs(need.jobs - covered))
    return left
