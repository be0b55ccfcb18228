"""Free room on running cloud nodes is matched to pending slices only where the node's pool
shares its GPUs the slices' way (issue 19, item 4; ``policies/common.py`` ``unmet``): a GPU of
a pool that does not share, or shares another way, cannot give a time-sliced or MIG slice, so
counting the slice group as placed there would buy nothing and leave it waiting. Whole-GPU
needs take free GPUs of any pool, as they are bought on any pool that fits (a GPU with no
slice on it is a whole GPU: the simulator, Slurm's shards and the policy's buying all give it
to a whole-GPU job)."""

from __future__ import annotations

from collections.abc import Sequence

from hypothesis import given, settings
from hypothesis import strategies as st

from autoscaler.model import (
    CloudNode,
    Demand,
    DemandGroup,
    FleetView,
    InstanceState,
    InterruptionNotice,
    Market,
    Pool,
    PoolView,
    PriceQuote,
)
from autoscaler.model.sharing import GpuSharing, SharingMode
from policies.common import Need, displaced, needs_from, supply, unmet
from policies.cost_aware import CostAwarePolicy

NOW = 100_000.0
SLICED = GpuSharing(mode=SharingMode.TIME_SLICING, replicas=4)
MIG = GpuSharing(mode=SharingMode.MIG, profiles=("1g.5gb", "3g.20gb"))
SHARINGS: dict[str, GpuSharing | None] = {"plain": None, "sliced": SLICED, "mig": MIG}


def _pool(name: str) -> PoolView:
    pool = Pool(
        name=name,
        provider="aws",
        region="us-east-1",
        instance_type="g5.12xlarge",
        gpus_per_instance=4,
        market=Market.ON_DEMAND,
        gpu_sharing=SHARINGS[name],
    )
    return PoolView(pool=pool, price=PriceQuote(pool=name, price_per_hour=4.0, as_of=NOW))


def _node(pool: str, allocated: int = 0, ident: str | None = None) -> CloudNode:
    return CloudNode(
        instance_id=ident or f"i-{pool}",
        pool=pool,
        state=InstanceState.RUNNING,
        launched_at=NOW - 600,
        gpus=4,
        gpus_allocated=allocated,
        joined=True,
    )


def _group(jobs: int, sharing: SharingMode | None) -> DemandGroup:
    return DemandGroup(gpus_per_job=1, jobs=jobs, oldest_submit_time=NOW - 60, gpu_sharing=sharing)


def _view(nodes: Sequence[CloudNode], groups: Sequence[DemandGroup]) -> FleetView:
    return FleetView(
        now=NOW,
        tick=1,
        fleet_id="t",
        pools=tuple(_pool(name) for name in SHARINGS),
        instances=tuple(nodes),
        demand=Demand(groups=tuple(groups)),
    )


def _left(view: FleetView) -> dict[SharingMode | None, int]:
    needs: list[Need] = needs_from(view.demand.groups, CostAwarePolicy().placement)
    return {n.gpu_sharing: n.jobs for n in unmet(needs, supply(view))}


def test_a_slice_is_not_placed_on_a_free_gpu_of_a_pool_that_does_not_share_its_way() -> None:
    groups = [_group(3, SharingMode.TIME_SLICING), _group(2, SharingMode.MIG)]
    # four free GPUs on a pool that does not share, four on the MIG pool: the time-sliced
    # slices find no room, the MIG ones do
    view = _view([_node("plain"), _node("mig")], groups)
    assert _left(view) == {SharingMode.TIME_SLICING: 3}
    # a node of the time-slicing pool with three GPUs free hosts them
    view = _view([_node("plain"), _node("mig"), _node("sliced", allocated=1)], groups)
    assert _left(view) == {}


def test_whole_gpu_jobs_take_free_gpus_of_any_pool() -> None:
    view = _view([_node("sliced"), _node("mig", allocated=2)], [_group(6, None)])
    assert _left(view) == {}
    view = _view([_node("sliced"), _node("mig", allocated=2)], [_group(7, None)])
    assert _left(view) == {None: 1}


def test_a_slice_room_left_by_a_whole_gpu_need_is_not_given_to_a_slice_of_another_way() -> None:
    """Room split by a whole-GPU need keeps the node's sharing: what is left of a plain node
    is still no room for a slice."""
    groups = [_group(2, None), _group(2, SharingMode.TIME_SLICING)]
    view = _view([_node("plain")], groups)
    assert _left(view) == {SharingMode.TIME_SLICING: 2}


@settings(max_examples=100, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(sorted(SHARINGS)), st.integers(0, 4)), min_size=0, max_size=6
    ),
    st.lists(
        st.tuples(
            st.integers(1, 12), st.sampled_from([None, SharingMode.TIME_SLICING, SharingMode.MIG])
        ),
        min_size=1,
        max_size=3,
    ),
)
def test_slices_placed_never_exceed_the_free_gpus_of_the_pools_sharing_their_way(
    nodes: list[tuple[str, int]], asked: list[tuple[int, SharingMode | None]]
) -> None:
    """However the free room and the needs fall, the slices of a mode counted as placed are at
    most the free GPUs of that mode's pools, and all needs placed at most the free GPUs."""
    made = [_node(pool, used, f"i-{i}") for i, (pool, used) in enumerate(nodes)]
    merged: dict[SharingMode | None, int] = {}
    for jobs, mode in asked:
        merged[mode] = merged.get(mode, 0) + jobs
    view = _view(made, [_group(jobs, mode) for mode, jobs in merged.items()])
    left = _left(view)
    free = {name: 0 for name in SHARINGS}
    for pool, used in nodes:
        free[pool] += 4 - used
    for mode, pool in ((SharingMode.TIME_SLICING, "sliced"), (SharingMode.MIG, "mig")):
        placed = merged.get(mode, 0) - left.get(mode, 0)
        assert placed <= free[pool]
    total = sum(merged.values()) - sum(left.values())
    assert total <= sum(free.values())


def test_the_work_of_an_interrupted_sharing_node_is_replaced_as_the_gpus_it_held() -> None:
    """Four quarter-GPU jobs on one GPU and a two-GPU job on a node of the time-slicing pool:
    the replacement is the two-GPU job and one GPU of a time-slicing pool (the slices run on no
    other), not five jobs of whole GPUs on any pool."""
    node = _node("sliced", allocated=3).model_copy(update={"job_gpus": (1, 1, 1, 1, 2)})
    plain = _node("plain", allocated=2, ident="i-p").model_copy(update={"job_gpus": (1, 1)})
    view = _view([node, plain], []).model_copy(
        update={
            "notices": (
                InterruptionNotice(instance_id="i-sliced", pool="sliced", received_at=NOW),
                InterruptionNotice(instance_id="i-p", pool="plain", received_at=NOW),
            )
        }
    )
    found = sorted((g.gpus_per_job, g.jobs, g.gpu_sharing or "") for g in displaced(view, None))
    assert found == [(1, 1, SharingMode.TIME_SLICING), (1, 2, ""), (2, 1, "")]
