"""The peer policies on hand-built views, one test per documented behaviour of their anchors
(Karpenter, SkyPilot managed jobs, Slurm power saving), and the invariants every launch keeps."""

from __future__ import annotations

from fakes import job, pool, rig
from hypothesis import given, settings
from hypothesis import strategies as st

from autoscaler.model import (
    CloudNode,
    Demand,
    DemandGroup,
    FleetView,
    InstanceState,
    InterruptionNotice,
    LaunchRequest,
    NoticeKind,
    OnPremNode,
    Plan,
    Pool,
    PoolView,
    PriceQuote,
)
from autoscaler.spi.sources import NodeUsage
from policies.baselines import CheapestSpotPolicy
from policies.karpenter import KarpenterParams, KarpenterPolicy
from policies.skypilot import SkyPilotManagedPolicy, SkyPilotParams
from policies.slurm_power_save import SlurmPowerSaveParams, SlurmPowerSavePolicy

NOW = 100_000.0
# Spot Advisor buckets as rates per instance-hour: under 5 % a month, and over 20 %.
CALM = 0.00001
STORMY = 0.001


def mk(
    name: str,
    *,
    gpus: int = 1,
    market: str = "spot",
    provider: str = "aws",
    region: str = "r1",
    zone: str | None = None,
    model: str | None = "V100",
    instance_type: str | None = None,
) -> Pool:
    return Pool(
        name=name,
        provider=provider,
        region=region,
        zone=zone,
        instance_type=instance_type or f"type-{gpus}",
        gpus_per_instance=gpus,
        gpu_model=model,
        market=market,
        boot_seconds=120,
    )


def pv(p: Pool, price: float, *, rate: float | None = None, risky: bool = False) -> PoolView:
    return PoolView(
        pool=p,
        price=PriceQuote(
            pool=p.name, price_per_hour=price, interruption_rate_per_hour=rate, as_of=NOW
        ),
        risky_until=NOW + 600 if risky else None,
    )


def group(
    gpus: int,
    jobs: int,
    *,
    checkpoint: float | None = 1800.0,
    nodes: int = 1,
    models: tuple[str, ...] = (),
) -> DemandGroup:
    return DemandGroup(
        gpus_per_job=gpus,
        jobs=jobs,
        checkpoint_interval_s=checkpoint,
        nodes=nodes,
        gpu_models=models,
        oldest_submit_time=NOW - 30,
    )


def node(
    instance_id: str,
    pool: str,
    *,
    gpus: int = 1,
    allocated: int = 0,
    empty_for: float | None = None,
    underused_for: float | None = None,
    checkpoint: bool | None = None,
    state: InstanceState = InstanceState.RUNNING,
    joined: bool = True,
) -> CloudNode:
    return CloudNode(
        instance_id=instance_id,
        pool=pool,
        state=state,
        launched_at=0.0,
        gpus=gpus,
        gpus_allocated=allocated,
        empty_since=NOW - empty_for if empty_for is not None else None,
        underused_since=NOW - underused_for if underused_for is not None else None,
        jobs_checkpoint=checkpoint,
        joined=joined,
    )


def view(
    pools: list[PoolView],
    groups: list[DemandGroup] = [],  # noqa: B006 - never mutated
    *,
    instances: list[CloudNode] = [],  # noqa: B006
    onprem: list[OnPremNode] = [],  # noqa: B006
    notices: list[InterruptionNotice] = [],  # noqa: B006
) -> FleetView:
    return FleetView(
        now=NOW,
        tick=1,
        fleet_id="t",
        pools=tuple(pools),
        onprem=tuple(onprem),
        instances=tuple(instances),
        demand=Demand(groups=tuple(groups)),
        notices=tuple(notices),
    )


def launched(plan: Plan) -> dict[str, int]:
    counts: dict[str, int] = {}
    for launch in plan.launches:
        counts[launch.pool] = counts.get(launch.pool, 0) + launch.count
    return counts


def only(plan: Plan) -> LaunchRequest:
    (launch,) = plan.launches
    return launch


def notice(
    instance_id: str, pool: str, kind: NoticeKind = NoticeKind.TERMINATE
) -> InterruptionNotice:
    return InterruptionNotice(
        instance_id=instance_id, pool=pool, kind=kind, received_at=NOW, deadline=NOW + 120
    )


# -- karpenter ----------------------------------------------------------------------------------


def test_karpenter_picks_spot_by_price_capacity_not_by_price_alone() -> None:
    stormy = pv(mk("stormy"), 1.0, rate=STORMY)
    calm = pv(mk("calm"), 1.2, rate=CALM)
    calmer_dearer = pv(mk("calm-dear"), 1.3, rate=CALM)
    od = pv(mk("od", market="on-demand"), 3.0)
    v = view([stormy, calmer_dearer, calm, od], [group(1, 1)])
    plan = KarpenterPolicy().decide(v)
    launch = only(plan)
    assert launch.pool == "calm", "the cheapest pool of the best capacity bucket"
    assert launch.fallbacks == ("calm-dear", "stormy", "od"), "then capacity, then on-demand"
    assert launched(CheapestSpotPolicy().decide(v)) == {"stormy": 1}, "price alone differs"


def test_karpenter_ranks_capacity_within_each_cloud_and_clouds_by_price() -> None:
    # AWS's capacity signal says nothing of GCP's: the cheaper cloud's best pool goes first.
    aws = pv(mk("aws-calm", provider="aws"), 1.5, rate=CALM)
    gcp = pv(mk("gcp", provider="gcp"), 1.0)
    assert only(KarpenterPolicy().decide(view([aws, gcp], [group(1, 1)]))).pool == "gcp"


def test_karpenter_fills_a_node_claim_up_to_the_largest_type_that_holds_it() -> None:
    small = pv(mk("small", gpus=1), 1.0)
    big = pv(mk("big", gpus=8), 6.0)
    plan = KarpenterPolicy().decide(view([small, big], [group(1, 3)]))
    launch = only(plan)
    assert (launch.pool, launch.count, launch.gang_size) == ("big", 1, 1)
    assert launch.shape is not None and launch.shape.gpus == 3
    assert "small" not in launch.fallbacks, "a fallback must hold the whole claim"
    # nine pods: a full claim of eight, and a claim of one that the cheapest type holds
    plan = KarpenterPolicy().decide(view([small, big], [group(1, 9)]))
    assert launched(plan) == {"big": 1, "small": 1}


def test_karpenter_prefers_spot_when_allowed_and_keeps_protected_pods_on_demand() -> None:
    spot = pv(mk("spot"), 2.0)
    od = pv(mk("od", market="on-demand"), 1.0)
    plan = KarpenterPolicy().decide(view([spot, od], [group(1, 1)]))
    assert only(plan).pool == "spot" and only(plan).fallbacks == ("od",)
    plan = KarpenterPolicy().decide(view([spot, od], [group(1, 1, checkpoint=None)]))
    assert only(plan).pool == "od" and only(plan).fallbacks == ()


def test_karpenter_launches_each_pod_of_a_multi_node_job_on_its_own_node() -> None:
    big = pv(mk("big", gpus=8), 6.0)
    plan = KarpenterPolicy().decide(view([big], [group(16, 1, nodes=2)]))
    assert launched(plan) == {"big": 2}
    assert all(launch.gang_size == 1 for launch in plan.launches), "Karpenter does not gang"


def test_karpenter_removes_empty_nodes_after_consolidate_after() -> None:
    pools = [pv(mk("spot"), 1.0)]
    fresh = node("fresh", "spot", empty_for=200)
    old = node("old", "spot", empty_for=400)
    plan = KarpenterPolicy(KarpenterParams(consolidate_after_s=300)).decide(
        view(pools, instances=[fresh, old])
    )
    assert [d.instance_id for d in plan.drains] == ["old"]
    plan = KarpenterPolicy().decide(view(pools, instances=[node("n", "spot", empty_for=1)]))
    assert [d.instance_id for d in plan.drains] == ["n"], "consolidateAfter defaults to 0s"
    never = KarpenterPolicy(KarpenterParams(consolidate_after_s=None))
    assert never.decide(view(pools, instances=[old])).drains == ()


def test_karpenter_keeps_an_empty_node_a_pending_pod_fits() -> None:
    pools = [pv(mk("spot"), 1.0)]
    plan = KarpenterPolicy().decide(
        view(pools, [group(1, 1)], instances=[node("n", "spot", empty_for=600)])
    )
    assert plan.drains == () and plan.launches == ()


def test_karpenter_disrupts_no_more_nodes_at_once_than_the_budget_allows() -> None:
    pools = [pv(mk("spot"), 1.0)]
    empty = [node(f"e{i}", "spot", empty_for=600) for i in range(25)]
    assert len(KarpenterPolicy().decide(view(pools, instances=empty)).drains) == 3, "10 % of 25"
    draining = [
        node(f"d{i}", "spot", empty_for=600, state=InstanceState.DRAINING) for i in range(2)
    ]
    plan = KarpenterPolicy().decide(view(pools, instances=empty[:23] + draining))
    assert len(plan.drains) == 1, "nodes already being deleted count against the budget"


def test_karpenter_deletes_an_underused_node_whose_pods_fit_on_other_nodes() -> None:
    pools = [pv(mk("big", gpus=8), 8.0)]
    underused = node("under", "big", gpus=8, allocated=2, underused_for=60, checkpoint=True)
    fuller = node("fuller", "big", gpus=8, allocated=5)
    plan = KarpenterPolicy().decide(view(pools, instances=[underused, fuller]))
    assert [(d.instance_id, d.move_jobs) for d in plan.drains] == [("under", True)]
    assert plan.launches == ()
    when_empty = KarpenterPolicy(KarpenterParams(consolidation_policy="WhenEmpty"))
    assert when_empty.decide(view(pools, instances=[underused, fuller])).drains == ()
    unsaved = underused.model_copy(update={"jobs_checkpoint": False})
    assert KarpenterPolicy().decide(view(pools, instances=[unsaved, fuller])).drains == ()


def test_karpenter_evicts_jobs_that_cannot_checkpoint_only_without_do_not_disrupt() -> None:
    od8 = pv(mk("od8", gpus=8, market="on-demand"), 8.0)
    od1 = pv(mk("od1", market="on-demand"), 2.0)
    spot1 = pv(mk("spot1"), 0.5)
    under = node("under", "od8", gpus=8, allocated=1, underused_for=60, checkpoint=False)
    v = view([od8, od1, spot1], instances=[under])
    assert KarpenterPolicy().decide(v).launches == (), "do-not-disrupt keeps the node"
    evicting = KarpenterPolicy(KarpenterParams(do_not_disrupt_uncheckpointable=False))
    assert launched(evicting.decide(v)) == {"od1": 1}, "replaced, and kept off spot"


def test_karpenter_replaces_an_underused_node_with_a_cheaper_one_spun_up_first() -> None:
    od8 = pv(mk("od8", gpus=8, market="on-demand"), 8.0)
    spot1 = pv(mk("spot1", gpus=1), 0.5)
    under = node("under", "od8", gpus=8, allocated=1, underused_for=60, checkpoint=True)
    policy = KarpenterPolicy()
    first = policy.decide(view([od8, spot1], instances=[under]))
    assert launched(first) == {"spot1": 1}, "on-demand may be replaced by spot"
    assert first.drains == (), "the replacement is pre-spun before the node goes"
    coming = node("new", "spot1", state=InstanceState.PENDING, joined=False)
    second = policy.decide(view([od8, spot1], instances=[under, coming]))
    assert second.launches == () and second.drains == (), "waiting for it to become ready"
    ready = node("new", "spot1", empty_for=5)
    third = policy.decide(view([od8, spot1], instances=[under, ready]))
    assert [(d.instance_id, d.move_jobs) for d in third.drains] == [("under", True)]
    assert third.launches == ()


def test_karpenter_replaces_spot_with_spot_only_with_fifteen_cheaper_types() -> None:
    dear = pv(mk("dear", gpus=8, instance_type="big"), 8.0)
    under = node("under", "dear", gpus=8, allocated=1, underused_for=60, checkpoint=True)

    def cheaper(n: int) -> list[PoolView]:
        return [pv(mk(f"c{i}", instance_type=f"t{i}"), 1.0 + i / 100) for i in range(n)]

    assert KarpenterPolicy().decide(view([dear, *cheaper(14)], instances=[under])).launches == ()
    plan = KarpenterPolicy().decide(view([dear, *cheaper(15)], instances=[under]))
    assert launched(plan) == {"c0": 1}
    gate_off = KarpenterPolicy(KarpenterParams(spot_to_spot_consolidation=False))
    assert gate_off.decide(view([dear, *cheaper(15)], instances=[under])).launches == ()


def test_karpenter_starts_a_new_node_on_a_spot_interruption_warning() -> None:
    a, b = pv(mk("a"), 1.0), pv(mk("b"), 1.1)
    busy = node("i-1", "a", allocated=1)
    plan = KarpenterPolicy().decide(view([a, b], instances=[busy], notices=[notice("i-1", "a")]))
    assert launched(plan) == {"b": 1}, "at once, and not in the offering being reclaimed"
    rebalance = notice("i-1", "a", NoticeKind.REBALANCE)
    plan = KarpenterPolicy().decide(view([a, b], instances=[busy], notices=[rebalance]))
    assert plan.launches == (), "rebalance recommendations are not acted on"
    off = KarpenterPolicy(KarpenterParams(interruption_handling=False))
    assert off.decide(view([a, b], instances=[busy], notices=[notice("i-1", "a")])).launches == ()


def test_karpenter_under_the_controller_drains_the_noticed_node_and_replaces_it_at_once() -> None:
    t = rig([pool("a"), pool("b")], {"a": 1.0, "b": 1.1}, policy=KarpenterPolicy())
    t.queue.jobs = [job("j")]
    t.controller.tick()
    t.cloud.boot_all()
    (instance,) = t.cloud.instances
    t.queue.jobs = []
    t.nodes.cloud[instance] = NodeUsage(gpus_allocated=1)
    now = t.clock.now()
    t.cloud.notices = [
        InterruptionNotice(instance_id=instance, pool="a", received_at=now, deadline=now + 120)
    ]
    t.clock.advance(30)
    report = t.controller.tick()
    assert t.scheduler.drained == [instance], "cordoned and drained on the warning"
    assert [(a.pool, a.done) for a in report.actions if a.kind == "launch"] == [("b", 1)]


# -- skypilot-managed ---------------------------------------------------------------------------


def test_skypilot_gives_each_job_its_own_cluster_on_the_cheapest_fitting_offer() -> None:
    aws = pv(mk("aws1", provider="aws"), 1.0)
    gcp = pv(mk("gcp1", provider="gcp"), 0.8)
    big = pv(mk("aws8", gpus=8), 5.0)
    plan = SkyPilotManagedPolicy().decide(view([aws, gcp, big], [group(1, 3)]))
    launch = only(plan)
    assert (launch.pool, launch.count, launch.gang_size) == ("gcp1", 3, 1), "never packed"


def test_skypilot_launches_a_multi_node_job_as_one_gang() -> None:
    big = pv(mk("aws8", gpus=8), 5.0)
    launch = only(SkyPilotManagedPolicy().decide(view([big], [group(16, 2, nodes=2)])))
    assert (launch.count, launch.gang_size) == (4, 2)


def test_skypilot_fails_over_zone_then_region_then_cloud() -> None:
    pools = [
        pv(mk("use1a", region="us-east-1", zone="a"), 1.0),
        pv(mk("gcp", provider="gcp", region="us-central1"), 1.1),
        pv(mk("usw2", region="us-west-2"), 1.2),
        pv(mk("use1b", region="us-east-1", zone="b"), 1.5),
        pv(mk("od", market="on-demand", region="us-east-1"), 3.0),
    ]
    launch = only(SkyPilotManagedPolicy().decide(view(pools, [group(1, 1)])))
    assert launch.pool == "use1a"
    assert launch.fallbacks == ("use1b", "usw2", "gcp", "od")


def test_skypilot_relaunches_away_from_the_region_that_preempted_it() -> None:
    pools = [pv(mk("east", region="us-east-1"), 1.0, risky=True), pv(mk("west", region="w"), 1.3)]
    launch = only(SkyPilotManagedPolicy().decide(view(pools, [group(1, 1)])))
    assert launch.pool == "west" and launch.fallbacks == ("east",), "EAGER_NEXT_REGION"
    failover = SkyPilotManagedPolicy(SkyPilotParams(recovery_strategy="FAILOVER"))
    assert only(failover.decide(view(pools, [group(1, 1)]))).pool == "east"


def test_skypilot_does_not_act_on_an_interruption_notice() -> None:
    a, b = pv(mk("a"), 1.0), pv(mk("b"), 1.1)
    busy = node("i-1", "a", allocated=1)
    plan = SkyPilotManagedPolicy().decide(
        view([a, b], instances=[busy], notices=[notice("i-1", "a")])
    )
    assert plan.launches == () and plan.drains == ()


def test_skypilot_tears_a_cluster_down_as_soon_as_its_job_ends() -> None:
    pools = [pv(mk("a"), 1.0)]
    done = node("done", "a", empty_for=1)
    plan = SkyPilotManagedPolicy().decide(view(pools, instances=[done]))
    assert [d.instance_id for d in plan.drains] == ["done"]
    plan = SkyPilotManagedPolicy().decide(view(pools, [group(1, 1)], instances=[done]))
    assert plan.drains == () and plan.launches == (), "a pending job the node fits keeps it"


def test_skypilot_counts_a_cluster_coming_up_as_one_job_and_never_shares_a_running_one() -> None:
    big = pv(mk("big", gpus=8), 5.0)
    booting = node("b", "big", gpus=8, state=InstanceState.PENDING, joined=False)
    plan = SkyPilotManagedPolicy().decide(view([big], [group(1, 3)], instances=[booting]))
    assert launched(plan) == {"big": 2}, "one of the three jobs has its cluster coming"
    half = node("half", "big", gpus=8, allocated=4)
    plan = SkyPilotManagedPolicy().decide(view([big], [group(1, 1)], instances=[half]))
    assert launched(plan) == {"big": 1}, "a running cluster is its own job's"


def test_skypilot_keeps_jobs_that_cannot_checkpoint_on_demand() -> None:
    pools = [pv(mk("spot"), 1.0), pv(mk("od", market="on-demand"), 3.0)]
    launch = only(SkyPilotManagedPolicy().decide(view(pools, [group(1, 1, checkpoint=None)])))
    assert launch.pool == "od" and launch.fallbacks == ()
    launch = only(SkyPilotManagedPolicy().decide(view(pools, [group(1, 1)])))
    assert launch.pool == "spot" and launch.fallbacks == ("od",), "any_of falls back on-demand"


# -- slurm-power-save ---------------------------------------------------------------------------


def test_slurm_resumes_nodes_for_pending_jobs_in_weight_order() -> None:
    first = pv(mk("first"), 3.0)
    cheap = pv(mk("cheap"), 1.0)
    plan = SlurmPowerSavePolicy().decide(view([first, cheap], [group(1, 1)]))
    assert only(plan).pool == "first", "equal weights: configuration order, not price"
    assert only(plan).fallbacks == ("cheap",)
    weighted = SlurmPowerSavePolicy(SlurmPowerSaveParams(weights={"first": 10}))
    assert only(weighted.decide(view([first, cheap], [group(1, 1)]))).pool == "cheap"


def test_slurm_allocates_further_jobs_to_a_node_already_powering_up() -> None:
    big = pv(mk("big", gpus=8), 8.0)
    small = pv(mk("small"), 1.0)
    launch = only(SlurmPowerSavePolicy().decide(view([big, small], [group(1, 3)])))
    assert (launch.pool, launch.count) == ("big", 1)
    assert launch.shape is not None and launch.shape.gpus == 3


def test_slurm_resumes_one_node_per_node_of_a_multi_node_job_with_no_gang() -> None:
    big = pv(mk("big", gpus=8), 8.0)
    launch = only(SlurmPowerSavePolicy().decide(view([big], [group(16, 1, nodes=2)])))
    assert (launch.count, launch.gang_size) == (2, 1)


def test_slurm_suspends_nodes_idle_for_suspend_time() -> None:
    pools = [pv(mk("a"), 1.0)]
    nodes = [node("young", "a", empty_for=500), node("old", "a", empty_for=700)]
    plan = SlurmPowerSavePolicy().decide(view(pools, instances=nodes))
    assert [d.instance_id for d in plan.drains] == ["old"], "SuspendTime=600"
    many = [node(f"n{i}", "a", empty_for=700) for i in range(70)]
    assert len(SlurmPowerSavePolicy().decide(view(pools, instances=many)).drains) == 60


def test_slurm_resumes_no_more_nodes_than_resume_rate() -> None:
    pools = [pv(mk("a"), 1.0)]
    plan = SlurmPowerSavePolicy(SlurmPowerSaveParams(resume_rate_per_min=5)).decide(
        view(pools, [group(1, 9)])
    )
    assert launched(plan) == {"a": 5}


def test_slurm_does_not_act_on_an_interruption_notice() -> None:
    a, b = pv(mk("a"), 1.0), pv(mk("b"), 1.1)
    busy = node("i-1", "a", allocated=1)
    plan = SlurmPowerSavePolicy().decide(
        view([a, b], instances=[busy], notices=[notice("i-1", "a")])
    )
    assert plan.launches == () and plan.drains == ()


def test_every_peer_uses_free_onprem_gpus_first() -> None:
    pools = [pv(mk("a"), 1.0)]
    onprem = [OnPremNode(name="n", gpus=8, gpu_model="A100", gpus_allocated=6)]
    for policy in PEERS:
        plan = policy.decide(view(pools, [group(1, 3)], onprem=onprem))
        assert launched(plan) == {"a": 1}, type(policy).__name__


# -- invariants ---------------------------------------------------------------------------------

PEERS = (KarpenterPolicy(), SkyPilotManagedPolicy(), SlurmPowerSavePolicy())
MODELS = ("V100", "A100-40GB", "A100-80GB")


@st.composite
def fleets(draw: st.DrawFn) -> FleetView:
    specs = draw(
        st.lists(
            st.tuples(
                st.sampled_from([1, 2, 4, 8]),
                st.sampled_from(MODELS),
                st.booleans(),
                st.floats(0.2, 30.0),
                st.sampled_from(["aws", "gcp"]),
                st.sampled_from(["r1", "r2"]),
                st.floats(0.0, 0.01),
                st.booleans(),
            ),
            min_size=1,
            max_size=6,
        )
    )
    pools = [
        pv(
            mk(
                f"p{i}",
                gpus=g,
                model=model,
                market="spot" if spot else "on-demand",
                provider=provider,
                region=region,
                instance_type=f"{model}-{g}",
            ),
            price,
            rate=rate,
            risky=risky,
        )
        for i, (g, model, spot, price, provider, region, rate, risky) in enumerate(specs)
    ]
    demand = draw(
        st.lists(
            st.tuples(
                st.sampled_from([1, 2, 4, 8]),
                st.integers(1, 4),
                st.integers(1, 6),
                st.sampled_from([(), ("V100",), ("A100",), ("a100-80gb",)]),
                st.booleans(),
            ),
            max_size=5,
        )
    )
    groups = [
        group(per_node * nodes, jobs, nodes=nodes, models=models, checkpoint=1800 if safe else None)
        for per_node, nodes, jobs, models, safe in demand
    ]
    instances = []
    notices = []
    for i, (pool_index, allocated_share, empty, noticed) in enumerate(
        draw(
            st.lists(
                st.tuples(
                    st.integers(0, len(pools) - 1),
                    st.floats(0.0, 1.0),
                    st.booleans(),
                    st.booleans(),
                ),
                max_size=4,
            )
        )
    ):
        p = pools[pool_index].pool
        allocated = 0 if empty else max(1, int(p.gpus_per_instance * allocated_share))
        instances.append(
            node(
                f"i{i}",
                p.name,
                gpus=p.gpus_per_instance,
                allocated=allocated,
                empty_for=900 if allocated == 0 else None,
                underused_for=900 if 0 < allocated * 2 <= p.gpus_per_instance else None,
                checkpoint=True if allocated * 2 <= p.gpus_per_instance else None,
            )
        )
        if noticed and p.is_spot:
            notices.append(notice(f"i{i}", p.name))
    return view(pools, groups, instances=instances, notices=notices)


@settings(max_examples=200, deadline=None)
@given(fleets())
def test_no_peer_launches_a_shape_its_pool_or_a_fallback_cannot_host(v: FleetView) -> None:
    pools = v.pool_by_name
    wanted = [g.shape for g in v.demand.groups]
    running = {(pools[n.pool].pool.gpu_model,) for n in v.instances if n.gpus_allocated}
    for policy in PEERS:
        plan = policy.decide(v)
        for launch in plan.launches:
            assert launch.shape is not None, type(policy).__name__
            assert launch.count % launch.gang_size == 0
            for name in (launch.pool, *launch.fallbacks):
                assert pools[name].pool.can_host(launch.shape), (type(policy).__name__, name)
            assert launch.pool not in launch.fallbacks
            # what is bought is for a pending job's node, or for work already running
            assert (
                any(
                    s.gpu_models == launch.shape.gpu_models and s.gpus <= launch.shape.gpus
                    for s in wanted
                )
                or launch.shape.gpu_models in running
            ), (type(policy).__name__, launch)
        drained = [d.instance_id for d in plan.drains]
        assert len(drained) == len(set(drained)), "a node is drained once"
