"""Which pending pods no pool's node can take, judged from what the join puts on our nodes: never
a pod that a node of ours would take (a property against the scheduler's own matching), and
with the requirement that fails named."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from k8s_cluster import node, pod, tried

from autoscaler.model import Market, Pool
from autoscaler.sources.kubernetes.demand import pending_demand
from autoscaler.sources.kubernetes.fit import NodeNeeds, PoolLabels, Requirement, unmet
from autoscaler.sources.kubernetes.nodes import Nodes
from autoscaler.sources.kubernetes.pods import PodRules
from autoscaler.sources.kubernetes.settings import KubernetesSettings
from autoscaler.sources.kubernetes_join import node_labels

EXTRA = {"example.com/rack": "gpu-hall"}


def make_pool(
    name: str = "a100-spot", market: Market = Market.SPOT, zone: str | None = None
) -> Pool:
    return Pool(
        name=name,
        provider="aws",
        region="us-east-1",
        zone=zone,
        instance_type="p4d.24xlarge",
        gpus_per_instance=8,
        gpu_model="A100",
        market=market,
    )


def ours(pool: Pool) -> PoolLabels:
    return PoolLabels.of(pool, node_labels(pool), EXTRA)


def selector(**pairs: str) -> NodeNeeds:
    return NodeNeeds(tuple(sorted(pairs.items())))


def terms(*each: list[Requirement]) -> NodeNeeds:
    return NodeNeeds(terms=tuple(tuple(t) for t in each))


SPOT, ON_DEMAND = make_pool(), make_pool("a100-od", Market.ON_DEMAND, zone="us-east-1a")


@pytest.mark.parametrize(
    "needs",
    [
        NodeNeeds(),
        selector(**{"gpu-autoscaler.io/market": "spot"}),
        selector(**{"gpu-autoscaler.io/pool": "a100-od"}),
        selector(**{"example.com/rack": "gpu-hall"}),
        selector(**{"node.kubernetes.io/instance-type": "p4d.24xlarge"}),
        selector(**{"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}),  # GPU feature discovery
        selector(**{"kubernetes.io/hostname": "i-0abc"}),
        selector(**{"topology.kubernetes.io/zone": "us-east-1a"}),
        terms([("team", "In", ("ml",))], [("gpu-autoscaler.io/market", "In", ("spot",))]),
        terms([("team", "DoesNotExist", ())]),
        terms([("gpu-autoscaler.io/market", "NotIn", ("spot",))]),
        terms([("nvidia.com/gpu.memory", "Gt", ("40000",))]),
    ],
)
def test_what_some_pool_can_carry_is_met(needs: NodeNeeds) -> None:
    assert unmet(needs, [ours(SPOT), ours(ON_DEMAND)]) is None


@pytest.mark.parametrize(
    ("needs", "said"),
    [
        (selector(team="ml"), "a node with team=ml"),
        (selector(**{"gpu-autoscaler.io/pool": "h100"}), "a node with gpu-autoscaler.io/pool=h100"),
        (selector(**{"example.com/rack": "other"}), "a node with example.com/rack=other"),
        (
            selector(**{"node.kubernetes.io/instance-type": "p5.48xlarge"}),
            "a node with node.kubernetes.io/instance-type=p5.48xlarge",
        ),
        (selector(**{"kubernetes.io/os": "windows"}), "a node with kubernetes.io/os=windows"),
        (terms([("team", "Exists", ())]), "a node with team Exists"),
        (terms([("gpu-autoscaler.io/managed", "DoesNotExist", ())]), "gpu-autoscaler.io/managed"),
        (terms([("team", "In", ("ml", "cv"))]), "a node with team In (ml,cv)"),
        (terms([("example.com/rack", "Gt", ("3",))]), "example.com/rack Gt (3)"),
    ],
)
def test_what_no_pool_carries_is_unmet_and_named(needs: NodeNeeds, said: str) -> None:
    found = unmet(needs, [ours(SPOT), ours(ON_DEMAND)])
    assert found is not None and said in found


def test_a_zone_only_one_pool_has_is_met_and_one_none_has_is_not() -> None:
    pools = [ours(SPOT), ours(ON_DEMAND)]  # the spot pool's zones are the provider's (any)
    assert unmet(selector(**{"topology.kubernetes.io/zone": "us-west-2b"}), pools) is None
    only_fixed = [ours(ON_DEMAND)]
    assert unmet(selector(**{"topology.kubernetes.io/zone": "us-west-2b"}), only_fixed)


def test_a_pool_whose_join_is_not_ours_may_carry_anything() -> None:
    assert unmet(selector(team="ml"), [ours(SPOT), PoolLabels.unknown(ON_DEMAND)]) is None
    assert unmet(selector(team="ml"), []) is None, "no pool joins: nothing to judge against"


# -- the property: never judge unmet what a node of ours would take ------------------------------

KEYS = [
    "team",
    "example.com/rack",
    "gpu-autoscaler.io/market",
    "gpu-autoscaler.io/pool",
    "node.kubernetes.io/instance-type",
    "kubernetes.io/os",
    "topology.kubernetes.io/zone",
    "nvidia.com/gpu.count",
    "kubernetes.io/hostname",
]
VALUES = ["ml", "gpu-hall", "spot", "on-demand", "a100-spot", "p4d.24xlarge", "linux", "8", "3"]
OPERATORS = ["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"]

requirement = st.tuples(
    st.sampled_from(KEYS),
    st.sampled_from(OPERATORS),
    st.lists(st.sampled_from(VALUES), min_size=1, max_size=3).map(tuple),
).map(lambda r: (r[0], r[1], r[2][:1] if r[1] in ("Gt", "Lt") else r[2]))
needs_strategy = st.builds(
    NodeNeeds,
    st.dictionaries(st.sampled_from(KEYS), st.sampled_from(VALUES), max_size=2).map(
        lambda d: tuple(sorted(d.items()))
    ),
    st.lists(st.lists(requirement, max_size=3).map(tuple), max_size=3).map(tuple),
)


def _is_integer(text: str) -> bool:
    return re.fullmatch(r"-?[0-9]{1,18}", text) is not None


def matches(labels: Mapping[str, str], needs: NodeNeeds) -> bool:
    """The scheduler's own reading of a node selector and required affinity on one node."""

    def one(key: str, operator: str, values: tuple[str, ...]) -> bool:
        value = labels.get(key)
        if operator == "In":
            return value is not None and value in values
        if operator == "NotIn":
            return value is None or value not in values
        if operator == "Exists":
            return value is not None
        if operator == "DoesNotExist":
            return value is None
        # Gt and Lt compare integers; a label or a bound that is not one never matches
        bound = values[0]
        if value is None or not _is_integer(value) or not _is_integer(bound):
            return False
        return int(value) > int(bound) if operator == "Gt" else int(value) < int(bound)

    if any(labels.get(k) != v for k, v in needs.selector):
        return False
    return not needs.terms or any(all(one(*r) for r in term) for term in needs.terms)


@given(
    needs_strategy,
    st.sampled_from([SPOT, ON_DEMAND]),
    st.dictionaries(
        st.sampled_from(["nvidia.com/gpu.count", "kubernetes.io/hostname"]),
        st.sampled_from(VALUES),
    ),
)
def test_a_pod_a_node_of_ours_would_take_is_never_judged_unmet(
    needs: NodeNeeds, pool: Pool, others: dict[str, str]
) -> None:
    # a node of the pool as it joins: the join's labels, the kubelet's, and what others add
    labels = {
        **EXTRA,
        **node_labels(pool),
        "node.kubernetes.io/instance-type": pool.instance_type,
        "kubernetes.io/os": "linux",
        **({"topology.kubernetes.io/zone": pool.zone} if pool.zone else {}),
        **others,
    }
    if matches(labels, needs):
        assert unmet(needs, [ours(pool)]) is None, labels


# -- what the fuzz target found (tests/fuzz/boundary_kubernetes.py), each now read ---------------


def _pending(name: str = "a", **spec: Any) -> dict[str, Any]:
    made = tried(pod(name, "ml", gpus=1))
    made["spec"].update(spec)
    return made


@pytest.mark.parametrize(
    "spec",
    [
        {
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {
                                "matchExpressions": [
                                    {
                                        "key": "nvidia.com/gpu.memory",
                                        "operator": "Gt",
                                        "values": [digits],
                                    }
                                ]
                            }
                        ]
                    }
                }
            }
        }
        for digits in ("²", "9" * 400, "9" * 5000)
    ]
    + [
        {
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {
                                "matchExpressions": [
                                    {
                                        "key": "gpu-autoscaler.io/pool",
                                        "operator": "Lt",
                                        "values": ["²"],
                                    }
                                ]
                            }
                        ]
                    }
                }
            }
        },
        {"nodeSelector": {"nvidia.com/gpu.memory": "²"}},
        {"priorityClassName": ["urgent"]},
    ],
)
def test_what_the_fuzzer_found_in_a_pod_is_read_or_named_never_a_traceback(
    spec: dict[str, Any],
) -> None:
    rules = PodRules.of(KubernetesSettings(api_url="https://k8s.example"))
    reading = pending_demand(
        [_pending(**spec)], rules, lambda p: unmet(p.needs, [ours(SPOT)]), now=1.0
    )
    assert sum(g.jobs for g in reading.groups) == 1, "still counted, never zero"


def test_a_node_whose_metadata_is_no_object_and_names_with_line_breaks_stay_one_line() -> None:
    rules = PodRules.of(KubernetesSettings(api_url="https://k8s.example"))
    nodes = Nodes.read([{"metadata": "x"}, node("ok", 8)], rules)
    assert list(nodes.by_name) == ["ok"] and len(nodes.bad) == 1
    named = _pending("a\nb" + "c" * 70_000, nodeSelector={"team": "ml"})
    reading = pending_demand([named], rules, lambda p: unmet(p.needs, [ours(SPOT)]), now=1.0)
    lines = [line for found in reading.problems.values() for line in found]
    assert len(lines) == 1 and sum(g.jobs for g in reading.groups) == 1
    assert "\n" not in lines[0] and len(lines[0]) <= 500
