"""What the peer policies (``karpenter``, ``skypilot-managed``, ``slurm-power-save``) share and
the built-in policies do not: how a user configures them to keep work off spot, the notices they
act on, and the spot interruption signal AWS's allocation strategy ranks pools by.

Each peer models a real autoscaler from its documentation, so these helpers carry no judgement
of their own: they only translate what the view holds into the terms the anchors speak.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from autoscaler.model import (
    CloudNode,
    FleetView,
    InstanceState,
    NodeShape,
    NoticeKind,
    Placement,
    PoolView,
    SharingMode,
)

HOURS_PER_MONTH = 730.0
# The Spot Instance Advisor's "frequency of interruption" buckets, as monthly fractions: <5 %,
# 5-10 %, 10-15 %, 15-20 %, >20 % (https://aws.amazon.com/ec2/spot/instance-advisor/).
ADVISOR_BUCKET_UPPER = (0.05, 0.10, 0.15, 0.20)


def peer_placement(
    keep_uncheckpointable_off_spot: bool, keep_high_priority_off_spot: bool
) -> Placement:
    """Where the peers' users put their jobs. None of the anchors knows which jobs checkpoint;
    their users say so by hand (a Karpenter NodePool restricted to on-demand that such pods select,
    SkyPilot ``use_spot: false``, a Slurm on-demand partition). On-prem GPUs come first (Slurm node
    weights, a hybrid cluster's scheduler) and never move work to make room. Being declared at
    submission, a job's place is known on arrival: no tick has to judge it first."""
    return Placement(
        protect_uncheckpointable=keep_uncheckpointable_off_spot,
        protect_high_priority=keep_high_priority_off_spot,
        judged_each_tick=False,
    )


def terminations_only(view: FleetView) -> FleetView:
    """The view with rebalance recommendations dropped: none of the anchors acts on them
    (Karpenter: "does not currently support taint, drain, and terminate logic for Spot Rebalance
    Recommendations"), and a node that merely got one is still capacity."""
    kept = tuple(n for n in view.notices if n.kind is NoticeKind.TERMINATE)
    if len(kept) == len(view.notices):
        return view
    return view.model_copy(update={"notices": kept})


def interruption_rate(pool: PoolView, default_rate: float, prior_hours: float) -> float:
    """Interruptions per instance-hour a pool is believed to suffer: the quoted rate (the Spot
    Advisor bucket where the price source has one, else ``default_rate``) as a prior worth
    ``prior_hours`` of observation, sharpened by our own interruptions in the pool. AWS's own
    capacity signal is invisible to us; this is the nearest thing the view holds."""
    quoted = pool.price.interruption_rate_per_hour if pool.price is not None else None
    prior = default_rate if quoted is None else quoted
    return (pool.recent_interruptions + prior * prior_hours) / (
        pool.recent_instance_hours + prior_hours
    )


def advisor_bucket(rate_per_hour: float) -> int:
    """The Spot Advisor bucket (0 best .. 4 worst) a rate per instance-hour falls in."""
    monthly = 1.0 - math.exp(-rate_per_hour * HOURS_PER_MONTH)
    for bucket, upper in enumerate(ADVISOR_BUCKET_UPPER):
        if monthly < upper:
            return bucket
    return len(ADVISOR_BUCKET_UPPER)


def price_of(pool: PoolView) -> float:
    return pool.price.price_per_hour if pool.price is not None else math.inf


def usable(pool: PoolView) -> bool:
    """A pool the peers may launch in now: priced, and not in the capacity cache."""
    return pool.price is not None and pool.unavailable_until is None


def booting(node: CloudNode) -> bool:
    """Launched but not yet a schedulable node: still coming up, or up and not yet joined."""
    if node.state in (InstanceState.REQUESTED, InstanceState.PENDING):
        return True
    return node.state is InstanceState.RUNNING and not node.joined


def combined_shape(
    gpus: int,
    gpu_models: tuple[str, ...],
    min_gpu_memory_gib: float | None,
    gpu_sharing: SharingMode | None = None,
) -> NodeShape:
    """What one new node must offer to hold ``gpus`` GPUs of jobs that share these needs
    (slices of GPUs shared as ``gpu_sharing`` says, for jobs that ask slices)."""
    return NodeShape.model_construct(
        gpus=gpus,
        gpu_models=gpu_models,
        min_gpu_memory_gib=min_gpu_memory_gib,
        gpu_sharing=gpu_sharing,
    )


def pool_order(view: FleetView) -> dict[str, int]:
    """Each pool's position in the configuration."""
    return {p.pool.name: i for i, p in enumerate(view.pools)}


def count_by(names: Iterable[str]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for name in names:
        counts[name] = counts.get(name, 0) + 1
    return counts
