"""A job asking a slice of a shared GPU is bought only pools that share GPUs the way it asks
(issue 19, item 4): its demand group names the sharing (``DemandGroup.gpu_sharing``), its node
shape carries it, and the policy's packing and the guard's fitting both refuse a pool whose
``gpu_sharing`` is unset or of the other mode, as first choice and as fallback. A Kubernetes
pod asking ``nvidia.com/gpu.shared`` or ``nvidia.com/mig-<profile>`` (through the client
against the API emulator), a Slurm ``--gres=shard:N`` job (the captured ``squeue --json``), and
random pools and groups (hypothesis); whole-GPU groups are bought as before."""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from k8s_api_emulator import K8sApi
from k8s_cluster import pod, tried
from k8s_source_support import make_source

from autoscaler.fleet.memory import Cooldowns
from autoscaler.model import (
    Demand,
    DemandGroup,
    FleetView,
    Market,
    Plan,
    Pool,
    PoolView,
    PriceQuote,
)
from autoscaler.model.config import Limits
from autoscaler.model.sharing import GpuSharing, SharingMode
from autoscaler.sources.kubernetes import KubernetesSource
from autoscaler.sources.slurm_json import DemandRules, demand_groups
from autoscaler.sources.slurm_shards import shard_pools
from autoscaler.spi.policy import Policy
from autoscaler.tick.guard import guard
from autoscaler.tick.intents import Intents, Requests
from policies.baselines import CheapestSpotPolicy, OnDemandPolicy
from policies.cost_aware import CostAwarePolicy

NOW = 100_000.0
TICKS = itertools.count(1_000, 100)
DATA = Path(__file__).parent / "data" / "slurm"
SLICED4 = GpuSharing(mode=SharingMode.TIME_SLICING, replicas=4)
SLICED16 = GpuSharing(mode=SharingMode.TIME_SLICING, replicas=16)
MIG = GpuSharing(mode=SharingMode.MIG, profiles=("1g.5gb", "2g.10gb", "3g.20gb", "7g.40gb"))
POLICIES: tuple[Policy, ...] = (CostAwarePolicy(), CheapestSpotPolicy(), OnDemandPolicy())


def make_pool(
    name: str,
    sharing: GpuSharing | None,
    *,
    gpus: int = 1,
    market: Market = Market.ON_DEMAND,
    gpu_model: str | None = None,
) -> Pool:
    return Pool(
        name=name,
        provider="aws",
        region="us-east-1",
        instance_type=f"type-{gpus}",
        gpus_per_instance=gpus,
        gpu_model=gpu_model,
        market=market,
        gpu_sharing=sharing,
    )


def priced(pool: Pool, price: float) -> PoolView:
    return PoolView(
        pool=pool,
        price=PriceQuote(pool=pool.name, price_per_hour=price, as_of=NOW),
    )


def fleet(pools: Sequence[PoolView], groups: Sequence[DemandGroup]) -> FleetView:
    return FleetView(
        now=NOW,
        tick=1,
        fleet_id="t",
        pools=tuple(pools),
        demand=Demand(groups=tuple(groups)),
    )


def granted(plan: Plan, view: FleetView) -> Intents:
    return guard(plan, Requests(), view, Limits(max_launches_per_tick=1000), Cooldowns())


def planned_pools(plan: Plan) -> set[str]:
    """Every pool the plan names, first choices and fallbacks."""
    return {name for launch in plan.launches for name in (launch.pool, *launch.fallbacks)}


def granted_pools(intents: Intents) -> dict[str, int]:
    """Every pool the guard lets a launch walk to (fallbacks included), with what it grants."""
    found: dict[str, int] = {}
    for intent in intents.launches:
        for step in (*intent.steps, *(s for gang in intent.gangs for s in gang)):
            found[step.pool] = found.get(step.pool, 0) + step.granted
    return found


# -- Kubernetes ------------------------------------------------------------------------------


@pytest.fixture
def source(k8s_api: K8sApi, monkeypatch: pytest.MonkeyPatch) -> Iterator[KubernetesSource]:
    made = make_source(k8s_api, monkeypatch)
    yield made
    made.close()


def slice_pod(name: str, resource: str, units: int = 1, **kw: Any) -> dict[str, Any]:
    return pod(name, gpus=units, resource=resource, **kw)


K8S_POOLS = (
    priced(make_pool("whole-cheap", None), 0.5),
    priced(make_pool("whole-spot", None, market=Market.SPOT), 0.2),
    priced(make_pool("whole-8", None, gpus=8), 3.0),
    priced(make_pool("sliced", SLICED4), 2.0),
    priced(make_pool("sliced-dear", SLICED4), 2.5),
    priced(make_pool("mig", MIG), 4.0),
)


@pytest.mark.parametrize(
    ("resource", "mode", "hosts"),
    [
        ("nvidia.com/gpu.shared", SharingMode.TIME_SLICING, {"sliced", "sliced-dear"}),
        ("nvidia.com/mig-1g.5gb", SharingMode.MIG, {"mig"}),
    ],
)
def test_a_pending_slice_pod_is_bought_only_on_pools_that_share_its_way(
    k8s_api: K8sApi,
    source: KubernetesSource,
    resource: str,
    mode: SharingMode,
    hosts: set[str],
) -> None:
    source.know_pools([v.pool for v in K8S_POOLS])
    for i in range(3):
        k8s_api.put("pods", tried(slice_pod(f"slice-{i}", resource)))
    k8s_api.put("pods", tried(pod("whole", gpus=1)))
    groups = list(source.read(next(TICKS)))
    sliced = [g for g in groups if g.gpu_sharing is not None]
    # three slices folded against the pools that host them alone: one GPU of theirs
    assert [(g.gpu_sharing, g.jobs) for g in sliced] == [(mode, 1)]
    (whole,) = [g for g in groups if g.gpu_sharing is None]  # never one group with the slices
    assert whole.jobs == 1
    view = fleet(K8S_POOLS, sliced)
    for policy in POLICIES:
        plan = policy.decide(view)
        assert planned_pools(plan) <= hosts, type(policy).__name__
        grants = granted_pools(granted(plan, view))
        assert set(grants) <= hosts, type(policy).__name__
        # the sharing pools are on-demand: the spot-only baseline buys none, never a wrong one
        bought = 0 if isinstance(policy, CheapestSpotPolicy) else 1
        assert sum(grants.values()) == bought, type(policy).__name__
    # the whole-GPU pod alone still goes to the cheapest pool it fits, shared or not
    plan = CostAwarePolicy().decide(fleet(K8S_POOLS, [whole]))
    assert {launch.pool for launch in plan.launches} == {"whole-cheap"}


def test_a_guard_drops_a_plugin_s_launch_for_slices_on_a_pool_that_does_not_share(
    k8s_api: K8sApi, source: KubernetesSource
) -> None:
    """A plan naming a non-sharing pool for a slice shape (a plugin that ignores the sharing)
    has that pool dropped, as first choice and as fallback; only the sharing pool is bought."""
    source.know_pools([v.pool for v in K8S_POOLS])
    k8s_api.put("pods", tried(slice_pod("s", "nvidia.com/gpu.shared")))
    (group,) = source.read(next(TICKS))
    view = fleet(K8S_POOLS, [group])
    plan = CostAwarePolicy().decide(view)
    (launch,) = plan.launches
    rogue = launch.model_copy(
        update={"pool": "whole-cheap", "fallbacks": ("whole-spot", "mig", launch.pool)}
    )
    intents = granted(Plan(launches=(rogue,)), view)
    assert set(granted_pools(intents)) == {launch.pool}
    assert {c.rule for c in intents.clamps} >= {"shape"}


# -- Slurm shards ----------------------------------------------------------------------------


def test_a_pending_shard_job_is_bought_only_on_pools_that_time_slice() -> None:
    plain = make_pool("plain", None, gpus=8, gpu_model="A100")
    plain_spot = make_pool("plain-spot", None, gpus=8, gpu_model="A100", market=Market.SPOT)
    mig = make_pool("mig-a100", MIG, gpus=8, gpu_model="A100")
    sliced = make_pool("sliced-a100", SLICED16, gpus=8, gpu_model="A100")
    pools = (
        priced(plain, 10.0),
        priced(plain_spot, 3.0),
        priced(mig, 12.0),
        priced(sliced, 30.0),
    )
    text = (DATA / "squeue-shards.json").read_text()
    rules = DemandRules(shard_pools=shard_pools([v.pool.gpu_sharing for v in pools]))
    (group,) = demand_groups(text, rules)  # the captured job: 9 shards of one GPU
    assert (group.gpu_sharing, group.gpus_per_job, group.jobs) == (SharingMode.TIME_SLICING, 1, 1)
    view = fleet(pools, [group])
    for policy in POLICIES:
        plan = policy.decide(view)
        grants = granted_pools(granted(plan, view))
        if isinstance(policy, CheapestSpotPolicy):  # no spot pool time-slices: nothing bought
            assert (planned_pools(plan), grants) == (set(), {})
            continue
        assert planned_pools(plan) == {"sliced-a100"}, type(policy).__name__
        assert grants == {"sliced-a100": 1}, type(policy).__name__
    # the same job without shards (a whole GPU) is bought where it was: the cheapest pool
    whole = group.model_copy(update={"gpu_sharing": None})
    (launch,) = CostAwarePolicy().decide(fleet(pools, [whole])).launches
    assert launch.pool == "plain" and "sliced-a100" in launch.fallbacks


# -- any pools, any groups -------------------------------------------------------------------

SHARINGS: tuple[GpuSharing | None, ...] = (None, SLICED4, SLICED16, MIG)


@st.composite
def pool_views(draw: st.DrawFn) -> list[PoolView]:
    count = draw(st.integers(1, 6))
    found = []
    for i in range(count):
        sharing = draw(st.sampled_from(SHARINGS))
        market = draw(st.sampled_from((Market.SPOT, Market.ON_DEMAND)))
        gpus = draw(st.sampled_from((1, 2, 4, 8)))
        price = draw(st.floats(0.1, 40.0))
        found.append(priced(make_pool(f"p{i}", sharing, gpus=gpus, market=market), price))
    return found


@st.composite
def demand_groups_drawn(draw: st.DrawFn) -> list[DemandGroup]:
    found = []
    for _ in range(draw(st.integers(1, 5))):
        found.append(
            DemandGroup(
                gpus_per_job=draw(st.sampled_from((1, 1, 2, 4, 8))),
                jobs=draw(st.integers(1, 12)),
                checkpoint_interval_s=draw(st.sampled_from((None, 1800.0))),
                high_priority=draw(st.booleans()),
                oldest_submit_time=NOW - 30,
                gpu_sharing=draw(st.sampled_from((None, *SharingMode))),
            )
        )
    return found


def _mode(pool: Pool) -> SharingMode | None:
    return pool.gpu_sharing.mode if pool.gpu_sharing is not None else None


@settings(max_examples=200, deadline=None)
@given(
    pools=pool_views(),
    groups=demand_groups_drawn(),
    which=st.integers(0, len(POLICIES) - 1),
    every=st.sampled_from((None, *SharingMode)),
)
def test_no_granted_launch_for_a_slice_group_is_on_a_pool_that_does_not_share_its_way(
    pools: list[PoolView], groups: list[DemandGroup], which: int, every: SharingMode | None
) -> None:
    """A launch whose shape asks shared GPUs names only pools shared that way, and the guard
    grants it only such pools; where every group asks slices of one mode (``every``), nothing
    at all is granted on another pool."""
    if every is not None:
        groups = [g.model_copy(update={"gpu_sharing": every}) for g in groups]
    view = fleet(pools, groups)
    by_name = {v.pool.name: v.pool for v in pools}
    plan = POLICIES[which].decide(view)
    for launch in plan.launches:
        assert launch.shape is not None
        wanted = launch.shape.gpu_sharing
        if wanted is not None:
            named = (launch.pool, *launch.fallbacks)
            assert all(_mode(by_name[n]) is wanted for n in named), (launch, named)
    for intent in granted(plan, view).launches:
        shape = intent.request.shape
        assert shape is not None
        steps = (*intent.steps, *(s for gang in intent.gangs for s in gang))
        for step in steps:
            pool = by_name[step.pool]
            assert pool.can_host(shape)
            if shape.gpu_sharing is not None:
                assert _mode(pool) is shape.gpu_sharing, (shape, step)
            if every is not None and step.granted:
                assert _mode(pool) is every, (shape, step)


@settings(max_examples=100, deadline=None)
@given(pools=pool_views(), groups=demand_groups_drawn(), which=st.integers(0, len(POLICIES) - 1))
def test_whole_gpu_groups_are_bought_as_if_no_pool_shared(
    pools: list[PoolView], groups: list[DemandGroup], which: int
) -> None:
    """Whole-GPU jobs ask nothing of the sharing: the same plan, and the same grants, as on the
    same pools with their sharing taken away (as before slices were read)."""
    whole = [g.model_copy(update={"gpu_sharing": None}) for g in groups]
    unshared = [
        v.model_copy(update={"pool": v.pool.model_copy(update={"gpu_sharing": None})})
        for v in pools
    ]
    policy = POLICIES[which]
    shared_view, unshared_view = fleet(pools, whole), fleet(unshared, whole)
    plan, before = policy.decide(shared_view), policy.decide(unshared_view)
    assert plan.launches == before.launches
    assert granted_pools(granted(plan, shared_view)) == granted_pools(
        granted(before, unshared_view)
    )
