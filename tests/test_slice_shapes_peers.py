"""The peers' emulations (Karpenter, Slurm power saving) put a slice need into a node of its own
sharing: whole-GPU pods and slice pods of one shape never share a node claim (or a resumed
node), so the slices' launch names, and is granted, only the pool that shares that way."""

from __future__ import annotations

import pytest
from test_slice_shapes import NOW, SLICED4, fleet, granted, granted_pools, make_pool, priced

from autoscaler.model import DemandGroup
from autoscaler.model.sharing import SharingMode
from autoscaler.spi.policy import Policy
from policies.karpenter import KarpenterPolicy
from policies.slurm_power_save import SlurmPowerSavePolicy


@pytest.mark.parametrize("policy", [KarpenterPolicy(), SlurmPowerSavePolicy()])
@pytest.mark.parametrize("slices_first", [False, True])
def test_a_peer_never_puts_slices_on_a_node_claim_of_a_pool_that_does_not_share(
    policy: Policy, slices_first: bool
) -> None:
    pools = [
        priced(make_pool("plain", None, gpus=8), 1.0),
        priced(make_pool("ts", SLICED4, gpus=8), 5.0),
    ]
    whole = DemandGroup(gpus_per_job=1, jobs=2, oldest_submit_time=NOW - 30)
    sliced = whole.model_copy(update={"gpu_sharing": SharingMode.TIME_SLICING})
    view = fleet(pools, [sliced, whole] if slices_first else [whole, sliced])
    plan = policy.decide(view)
    for_slices = [
        launch
        for launch in plan.launches
        if launch.shape is not None and launch.shape.gpu_sharing is SharingMode.TIME_SLICING
    ]
    assert [(launch.pool, launch.fallbacks) for launch in for_slices] == [("ts", ())]
    assert granted_pools(granted(plan, view)).get("ts", 0) >= 1
