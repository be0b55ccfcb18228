"""Shapes that fit: no plan, guard or act ever buys an instance that cannot host the job it is
for, whatever fails; multi-node jobs are bought whole; jobs nothing can host are named."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from fakes import job, pool, rig
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import generate_latest

from autoscaler.cli import main
from autoscaler.model import (
    Demand,
    DemandGroup,
    FleetView,
    LaunchRequest,
    NodeShape,
    OnPremNode,
    Plan,
    Pool,
    PoolView,
    PriceQuote,
    gpu_model_matches,
)
from autoscaler.model.config import with_catalog_gpus
from autoscaler.model.gpus import memory_gib
from autoscaler.model.shapes import offers_of, onprem_kinds, unhostable_groups
from autoscaler.ops.metrics import Metrics
from autoscaler.spi.policy import POLICY_GROUP, installed, load_policy
from policies.cost_aware import CostAwareParams

NOW = 1_000_000.0
MODELS = ("V100", "A100-40GB", "A100-SXM4-80GB", "T4")


class Scripted:
    Params = CostAwareParams

    def __init__(self, plan: Plan) -> None:
        self.plan = plan

    def decide(self, view: FleetView) -> Plan:
        return self.plan


# -- the vocabulary ------------------------------------------------------------------------------


def test_model_names_match_by_tokens() -> None:
    assert gpu_model_matches("a100", "A100-40GB")
    assert gpu_model_matches("a100", "A100-SXM4-80GB")
    assert gpu_model_matches("A100-80GB", "A100-SXM4-80GB")
    assert not gpu_model_matches("a100-80gb", "A100-40GB")
    assert not gpu_model_matches("h100", "A100-40GB")
    assert not gpu_model_matches("v100", None), "an unknown model never matches a named one"


def test_a_shape_asks_gpus_models_and_memory_of_one_node() -> None:
    shape = NodeShape(gpus=4, gpu_models=("a100", "h100"), min_gpu_memory_gib=60)
    assert shape.accepts(8, "A100-SXM4-80GB", 80)
    assert not shape.accepts(2, "A100-SXM4-80GB", 80), "too few GPUs"
    assert not shape.accepts(8, "V100", 16), "another model"
    assert not shape.accepts(8, "A100-40GB", 40), "too little memory"
    assert not shape.accepts(8, "H100", None), "unknown memory is not enough memory"
    assert NodeShape(gpus=1).accepts(1, None, None), "no constraint: anything with a GPU"


def test_a_multi_node_job_asks_the_same_gpus_of_every_node() -> None:
    group = DemandGroup(gpus_per_job=16, jobs=1, nodes=2, oldest_submit_time=0)
    assert group.gpus_per_node == 8 and group.gpus == 16
    with pytest.raises(ValueError, match="multiple of its nodes"):
        DemandGroup(gpus_per_job=12, jobs=1, nodes=5, oldest_submit_time=0)
    with pytest.raises(ValueError, match="whole number of gangs"):
        LaunchRequest(pool="p", count=3, gang_size=2)


def test_pools_take_their_gpu_model_and_memory_from_the_catalog() -> None:
    g5 = with_catalog_gpus(
        Pool(
            name="g5",
            provider="aws",
            region="us-east-1",
            instance_type="g5.xlarge",
            gpus_per_instance=1,
            market="spot",  # type: ignore[arg-type]
        )
    )
    assert g5.gpu_model == "a10g" and g5.gpu_memory_gib == pytest.approx(22.35, abs=0.01)
    a2 = with_catalog_gpus(
        Pool(
            name="a2",
            provider="gcp",
            region="us-central1",
            instance_type="a2-highgpu-8g",
            gpus_per_instance=8,
            market="spot",  # type: ignore[arg-type]
        )
    )
    assert a2.gpu_model == "NVIDIA A100 40GB" and a2.gpu_memory_gib == 40
    assert memory_gib("V100") == 16 and memory_gib("A100") is None, "two A100 sizes exist"


def test_a_pool_whose_model_the_catalog_contradicts_is_one_clear_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(
        "fleet_id: f\npools:\n"
        "  - {name: g5, provider: aws, region: us-east-1, instance_type: g5.xlarge,\n"
        "     gpus_per_instance: 1, gpu_model: H100, market: spot}\n"
    )
    assert main(["validate", str(config)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert "c.yaml" in err[0] and "pools" in err[0] and "'H100'" in err[0] and "a10g" in err[0]


# -- every built-in policy, whatever fails ---------------------------------------------------------

pool_specs = st.lists(
    st.tuples(
        st.sampled_from([1, 2, 4, 8]),
        st.sampled_from((None, *MODELS)),
        st.booleans(),
        st.floats(0.2, 30.0),
        st.integers(0, 6),
    ),
    min_size=1,
    max_size=6,
)
job_specs = st.lists(
    st.tuples(
        st.sampled_from([1, 2, 4, 8]),
        st.integers(1, 3),
        st.lists(st.sampled_from(("v100", "a100", "a100-80gb", "t4", "h100")), max_size=2),
        st.booleans(),
        st.integers(1, 4),
    ),
    min_size=1,
    max_size=5,
)


@pytest.mark.parametrize("name", sorted(installed(POLICY_GROUP)))
@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(pools=pool_specs, jobs=job_specs, seed=st.integers(0, 2**16))
def test_no_policy_ever_buys_an_instance_that_cannot_host_its_job(
    name: str,
    pools: list[tuple[int, str | None, bool, float, int]],
    jobs: list[tuple[int, int, list[str], bool, int]],
    seed: int,
) -> None:
    configured = [
        pool(
            f"p{i}",
            gpus=gpus,
            gpu_model=model,
            market="spot" if spot else "on-demand",
        )
        for i, (gpus, model, spot, _, _) in enumerate(pools)
    ]
    prices = {f"p{i}": price for i, (_, _, _, price, _) in enumerate(pools)}
    # capacity fails at random: each pool holds only so many instances
    capacity = {f"p{i}": room for i, (_, _, _, _, room) in enumerate(pools)}
    t = rig(configured, prices, policy=load_policy(name, {}), capacity=capacity)
    pending = []
    for k, (per_node, nodes, models, safe, count) in enumerate(jobs):
        for c in range(count):
            pending.append(
                job(
                    f"j{k}-{c}",
                    per_node * nodes,
                    nodes=nodes,
                    models=tuple(models),
                    checkpoint=1800.0 if safe else None,
                )
            )
    t.queue.jobs = pending
    shapes = {(j.shape, j.nodes) for j in pending}
    by_name = {p.name: p for p in configured}
    for _ in range(3):
        report = t.controller.tick()
        for launch in report.plan.launches:
            assert launch.count % launch.gang_size == 0
        for action in report.actions:
            if action.kind != "launch":
                continue
            launched = by_name[action.pool]
            # the instance hosts a node of some pending job, and gangs come in whole
            assert any(launched.can_host(shape) for shape, _ in shapes), (action, shapes)
        for call_pool, count, _ in t.cloud.gang_calls:
            assert any(
                nodes == count and by_name[call_pool].can_host(shape) for shape, nodes in shapes
            )
        t.clock.advance(60)
        t.cloud.boot_all()


def test_act_never_falls_back_to_a_pool_that_cannot_host_the_shape() -> None:
    eight = pool("eight", gpus=8, gpu_model="A100-40GB")
    one = pool("one", gpus=1, gpu_model="A100-40GB")
    other = pool("other-eight", gpus=8, gpu_model="V100")
    spare = pool("spare-eight", gpus=8, gpu_model="A100-40GB")
    shape = NodeShape(gpus=8, gpu_models=("a100",))
    plan = Plan(
        launches=(
            LaunchRequest(
                pool="eight",
                count=2,
                fallbacks=("one", "other-eight", "spare-eight"),
                shape=shape,
            ),
        )
    )
    t = rig(
        [eight, one, other, spare],
        {"eight": 10.0, "one": 1.0, "other-eight": 5.0, "spare-eight": 12.0},
        policy=Scripted(plan),
        capacity={"eight": 0},
    )
    report = t.controller.tick()
    launched = [(a.pool, a.done) for a in report.actions if a.kind == "launch"]
    assert launched == [("eight", 0), ("spare-eight", 2)], "2 nodes of 8, never 16 of 1"
    refused = {c.pool for c in report.clamps if c.rule == "shape"}
    assert refused == {"one", "other-eight"}


def test_a_gang_is_bought_whole_in_one_pool_or_not_at_all() -> None:
    big = pool("big", gpus=8)
    spare = pool("spare", gpus=8)
    plan = Plan(
        launches=(
            LaunchRequest(
                pool="big", count=4, fallbacks=("spare",), shape=NodeShape(gpus=8), gang_size=2
            ),
        )
    )
    t = rig(
        [big, spare],
        {"big": 10.0, "spare": 11.0},
        policy=Scripted(plan),
        capacity={"big": 3, "spare": 8},
    )
    t.controller.tick()
    assert [(p, n) for p, n, _ in t.cloud.gang_calls] == [("big", 2), ("big", 2), ("spare", 2)]
    by_pool: dict[str, int] = {}
    for instance in t.cloud.instances.values():
        by_pool[instance.pool] = by_pool.get(instance.pool, 0) + 1
    assert by_pool == {"big": 2, "spare": 2}, "the second gang did not fit big whole"


def test_a_provider_that_cannot_launch_gangs_is_refused_not_half_used() -> None:
    plan = Plan(launches=(LaunchRequest(pool="p", count=2, shape=NodeShape(gpus=8), gang_size=2),))
    t = rig([pool("p", gpus=8)], {"p": 1.0}, policy=Scripted(plan), gangs=False)
    report = t.controller.tick()
    assert [(a.outcome, a.done) for a in report.actions if a.kind == "launch"] == [("refused", 0)]
    assert not t.cloud.instances


def test_a_capacity_failure_of_one_gang_member_leaves_nothing_running() -> None:
    plan = Plan(launches=(LaunchRequest(pool="p", count=3, shape=NodeShape(gpus=8), gang_size=3),))
    t = rig([pool("p", gpus=8)], {"p": 1.0}, policy=Scripted(plan), capacity={"p": 2})
    report = t.controller.tick()
    assert [a.outcome for a in report.actions if a.kind == "launch"] == ["capacity"]
    assert not t.cloud.instances


# -- jobs nothing can host -----------------------------------------------------------------------


def test_jobs_no_capacity_can_host_stay_pending_with_a_reason_in_log_and_metrics(
    caplog: pytest.LogCaptureFixture,
) -> None:
    metrics = Metrics()
    t = rig([pool("t4", gpus=1, gpu_model="T4")], {"t4": 1.0}, metrics=metrics)
    t.queue.jobs = [job(f"h{i}", 1, models=("h100",)) for i in range(4)] + [job("any", 1)]
    with caplog.at_level(logging.WARNING):
        report = t.controller.tick()
        t.controller.tick()
    bought = sum(a.done for a in report.actions if a.kind == "launch")
    assert bought == 1, "only the job that accepts any GPU gets one; H100 jobs are not put on T4"
    assert [(u.jobs, u.label) for u in report.unhostable] == [(4, "1x1 GPU(s) of h100")]
    said = [r.getMessage() for r in caplog.records if "stay pending" in r.getMessage()]
    assert len(said) == 1 and "4 pending job(s)" in said[0] and "h100" in said[0]
    exposed = generate_latest(metrics.registry).decode()
    assert 'gpu_autoscaler_unhostable_jobs{shape="1x1 GPU(s) of h100"} 4.0' in exposed


def test_a_gang_larger_than_any_pool_may_launch_is_unhostable() -> None:
    groups = [DemandGroup(gpus_per_job=32, jobs=2, nodes=4, oldest_submit_time=0)]
    offers = offers_of(
        [pool("eight", gpus=8, max_instances=3)],
        onprem_kinds([OnPremNode(name=f"n{i}", gpus=8) for i in range(2)]),
    )
    (found,) = unhostable_groups(groups, offers)
    assert found.jobs == 2 and "at most 3 at once" in found.reason
    roomy = offers_of([pool("eight", gpus=8, max_instances=4)], {})
    assert unhostable_groups(groups, roomy) == []


def view_of(pools: list[Pool], groups: list[DemandGroup]) -> FleetView:
    return FleetView(
        now=NOW,
        tick=1,
        fleet_id="t",
        pools=tuple(
            PoolView(pool=p, price=PriceQuote(pool=p.name, price_per_hour=1.0, as_of=NOW))
            for p in pools
        ),
        demand=Demand(groups=tuple(groups)),
    )


def test_cost_aware_buys_the_model_a_job_asks_for_not_the_cheapest_gpu() -> None:
    t4 = pool("t4", gpus=1, gpu_model="T4")
    h100 = pool("h100", gpus=1, gpu_model="H100")
    groups = [
        DemandGroup(
            gpus_per_job=1,
            jobs=4,
            gpu_models=("h100",),
            checkpoint_interval_s=1800,
            oldest_submit_time=0,
        )
    ]
    plan = load_policy("cost-aware", {}).decide(view_of([t4, h100], groups))
    assert [(launch.pool, launch.count, launch.fallbacks) for launch in plan.launches] == [
        ("h100", 4, ())
    ]


def test_with_capacity_failing_the_default_never_falls_back_to_smaller_shapes() -> None:
    eight = pool("eight", gpus=8)
    ones = pool("ones", gpus=1)
    t = rig([eight, ones], {"eight": 8.0, "ones": 0.5}, capacity={"eight": 0})
    t.queue.jobs = [job("big", 8)]
    for _ in range(3):
        report = t.controller.tick()
        assert all(a.pool == "eight" for a in report.actions if a.kind == "launch")
        t.clock.advance(60)
    assert not t.cloud.instances


def test_validate_warns_of_a_pool_whose_gpu_model_nothing_gives(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(
        "fleet_id: f\npools:\n"
        "  - {name: mystery, provider: aws, region: us-east-1, instance_type: x9.big,\n"
        "     gpus_per_instance: 1, market: spot, options: {image_id: ami-0123456789abcdef0}}\n"
        "  - {name: stated, provider: aws, region: us-east-1, instance_type: x9.big,\n"
        "     gpus_per_instance: 1, gpu_model: L4, market: spot,\n"
        "     options: {image_id: ami-0123456789abcdef0}}\n"
        "  - {name: known, provider: aws, region: us-east-1, instance_type: g5.xlarge,\n"
        "     gpus_per_instance: 1, market: spot, options: {image_id: ami-0123456789abcdef0}}\n"
    )
    assert main(["validate", str(config)]) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert "pools[0] (mystery)" in err[0] and "GPU model unknown" in err[0]
