"""Issue 18's Kubernetes boundary: the pod and node objects the API server sends, as the
``kubernetes`` source folds them (``autoscaler.sources.kubernetes``: ``demand``, ``pods``,
``nodes``, ``fit``).

Each input is a pod list and a node list, mutated from realistic objects (the tests' builders in
``k8s_cluster``): a field of the wrong type anywhere, huge and negative quantities, odd strings,
missing metadata, malformed selectors, affinity, tolerations and annotations, gang labels. The
lists go through the code the source runs on every tick: ``pending_demand`` (with ``unmet`` over
two pools' labels, as ``know_pools`` builds them), ``Nodes.read``, ``Allocation.of``,
``node_reading``, ``running_jobs`` and ``workload``.

What is checked besides "no traceback, no hang": every reading is bounded (groups of whole
positive jobs, GPUs per node within 1,024, finite numbers), every problem line is one bounded
line, and an independent reading of the documented rules (docs/kubernetes.md, "Demand: what
counts"; written apart from the source, and claiming only what it reads plainly) says what may
not go missing:

* every pod that is plainly pending and unschedulable and asks for 1 to 1,024 ``nvidia.com/gpu``
  is demand: a job of its own, or part of its gang's one job; so the groups hold at least one
  job per such pod or gang and at least their GPUs (a gang named ``too-large`` excepted);
* a pod that plainly lacks the spot toleration is never planned on spot, and a pod of a
  high-priority class is never planned as low priority;
* a node that plainly reads is read with its GPUs and, if it is ours, its instance id; the GPUs
  its plainly read bound pods request are counted as allocated on it.

The only error a reading may end in is a managed node that cannot be read (the source's one-line
``SourceError``, here ``BadNodeError``): that input is ``rejected``.
"""

from __future__ import annotations

import copy
import itertools
import json
import logging
import math
import os
import random
import re
from collections.abc import Callable, Sequence
from typing import Any

from answer_server import AnswerServer
from harness import Outcome, mutate_text
from k8s_cluster import node, pod, spot_taint, spot_toleration, tried

from autoscaler.model import Market, Pool
from autoscaler.model.errors import SourceError
from autoscaler.sources.kubernetes import KubernetesSource
from autoscaler.sources.kubernetes.demand import (
    PROBLEMS,
    TOO_LARGE,
    UNREADABLE_MODEL,
    pending_demand,
)
from autoscaler.sources.kubernetes.fit import PoolLabels, unmet
from autoscaler.sources.kubernetes.nodes import (
    Allocation,
    BadNodeError,
    Nodes,
    node_reading,
    running_jobs,
    workload,
)
from autoscaler.sources.kubernetes.pods import Pod, PodRules
from autoscaler.sources.kubernetes.settings import KubernetesSettings
from autoscaler.sources.kubernetes_join import node_labels

Obj = dict[str, Any]
NOW = 1_795_249_300.0
WHEN = 1_795_240_000.0
MAX_GPUS_PER_NODE = 1024
MAX_JOB_NODES = 100_000
LONGEST_LINE = 1000
MAX_CHECKPOINT_S = 30 * 86_400.0
GPU = "nvidia.com/gpu"
GROUP = "scheduling.x-k8s.io/pod-group"
KUEUE = "kueue.x-k8s.io/pod-group-name"
SIZE = "scheduling.x-k8s.io/min-available"
JOB_INDEX = "batch.kubernetes.io/job-completion-index"
MANAGED = "gpu-autoscaler.io/managed"
CHECKPOINTS = {
    "gpu-autoscaler.io/checkpoint_interval": "600",
    "gpu-autoscaler.io/checkpoint_duration": "30",
}
# Resource names the reference reads; a pod asking for any other is not claimed by it.
PLAIN_RESOURCES = frozenset({"cpu", "memory", "ephemeral-storage", GPU})
_QUANTITY = re.compile(r"[0-9]{1,5}", re.ASCII)


def _pools() -> list[PoolLabels]:
    pools = [
        Pool(
            name="a100-spot",
            provider="aws",
            region="us-east-1",
            instance_type="p4d.24xlarge",
            gpus_per_instance=8,
            gpu_model="A100",
            market=Market.SPOT,
        ),
        Pool(
            name="h100-od",
            provider="aws",
            region="us-east-1",
            zone="us-east-1a",
            instance_type="p5.48xlarge",
            gpus_per_instance=8,
            gpu_model="H100",
            market=Market.ON_DEMAND,
        ),
    ]
    return [PoolLabels.of(p, node_labels(p), {"example.com/rack": "gpu-hall"}) for p in pools]


FITS = _pools()


def _unmet(found: Pod) -> str | None:
    return unmet(found.needs, FITS)


# (settings, whether ``unmet`` is given): the defaults a site starts from, and a narrowed one
VARIANTS: list[tuple[KubernetesSettings, bool]] = [
    (
        KubernetesSettings(
            gpu_models={"NVIDIA-A100-SXM4-80GB": "A100"},
            instance_type_gpu_models={"p5.48xlarge": "H100"},
            high_priority_classes=["urgent"],
            high_priority_min=1000,
        ),
        True,
    ),
    (
        KubernetesSettings(
            namespaces=["ml", "default"],
            extra_gpu_resources=["nvidia.com/mig-3g.40gb"],
            indexed_jobs_as_gangs=False,
            high_priority_classes=["urgent"],
        ),
        False,
    ),
]
RULES = [PodRules.of(settings) for settings, _ in VARIANTS]


# -- the seeds: realistic pods and nodes ---------------------------------------------------------


def _tried(made: Obj) -> Obj:
    tried(made)
    made["status"]["conditions"][0]["lastTransitionTime"] = "2026-11-24T10:00:00Z"
    return made


AFFINITY: Obj = {
    "nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [
                {
                    "matchExpressions": [
                        {
                            "key": "node.kubernetes.io/instance-type",
                            "operator": "In",
                            "values": ["p5.48xlarge"],
                        },
                        {"key": "nvidia.com/gpu.memory", "operator": "Gt", "values": ["40959"]},
                    ]
                },
                {
                    "matchExpressions": [
                        {"key": "nvidia.com/gpu.product", "operator": "In", "values": ["L4"]}
                    ]
                },
            ]
        }
    }
}


def _bound(made: Obj, node_name: str) -> Obj:
    made["spec"]["nodeName"] = node_name
    made["status"] = {
        "phase": "Running",
        "startTime": "2026-11-24T10:00:00Z",
        "conditions": [{"type": "PodScheduled", "status": "True"}],
    }
    return made


def _nodes() -> list[Obj]:
    ours = node(
        "ip-10-0-0-1",
        8,
        labels={MANAGED: "true", "gpu-autoscaler.io/market": "spot", "gpu-autoscaler.io/pool": "a"},
        taints=[spot_taint()],
        provider_id="aws:///us-east-1a/i-0abc",
    )
    return [
        node("onprem-1", 8, labels={"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}),
        node("onprem-2", 4, labels={"nvidia.com/gpu.memory": "81920"}, unschedulable=True),
        ours,
        node("cpu-1"),
    ]


def _plain() -> list[Obj]:
    preempting = _tried(pod("preempting", gpus=8, created=WHEN))
    preempting["status"]["nominatedNodeName"] = "onprem-1"
    leaving = _tried(pod("leaving", gpus=2, created=WHEN))
    leaving["metadata"]["deletionTimestamp"] = "2030-01-01T00:00:00Z"
    return [
        _tried(pod("a", gpus=1, created=WHEN)),
        _tried(pod("b", "ml", gpus=4, limits_only=True, created=WHEN - 50)),
        _tried(pod("init-heavy", gpus=1, init_gpus=2, created=WHEN)),
        pod("untried", gpus=8, created=WHEN),
        _tried(pod("cpu-only", created=WHEN)),
        _bound(pod("running", gpus=2, created=WHEN), "onprem-1"),
        _bound(pod("running-ours", "ml", gpus=8, created=WHEN), "ip-10-0-0-1"),
        preempting,
        leaving,
    ]


def _shapes() -> list[Obj]:
    spot = [spot_toleration()]
    return [
        _tried(pod("safe", "ml", gpus=2, annotations=CHECKPOINTS, tolerations=spot, created=WHEN)),
        _tried(pod("declares-only", gpus=2, annotations=CHECKPOINTS, created=WHEN)),
        _tried(pod("urgent", gpus=2, tolerations=spot, priority_class="urgent", created=WHEN)),
        _tried(pod("high", gpus=1, priority=5000, created=WHEN)),
        _tried(
            pod(
                "a100",
                gpus=8,
                node_selector={"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"},
                created=WHEN,
            )
        ),
        _tried(pod("h100-or-l4", "ml", gpus=4, affinity=copy.deepcopy(AFFINITY), created=WHEN)),
        _tried(pod("team", gpus=1, node_selector={"team": "ml"}, created=WHEN)),
        _tried(pod("amd", gpus=2, resource="amd.com/gpu", created=WHEN)),
        _tried(pod("mig", "ml", gpus=1, resource="nvidia.com/mig-3g.40gb", created=WHEN)),
        _bound(pod("running-safe", gpus=1, annotations=CHECKPOINTS, created=WHEN), "onprem-1"),
    ]


def _gangs() -> list[Obj]:
    ring = {GROUP: "ring"}
    big = {"pod-group.scheduling.sigs.k8s.io": "big"}
    size = {"pod-group.scheduling.sigs.k8s.io/min-available": "4"}
    made = [_tried(pod(f"ring-{i}", "ml", gpus=8, labels=ring, created=WHEN)) for i in range(3)]
    made.append(_tried(pod("big-0", "ml", gpus=4, labels=big, annotations=size, created=WHEN)))
    made.append(_bound(pod("big-1", "ml", gpus=4, labels=big, annotations=size), "onprem-1"))
    for index in range(2):
        labels = {
            JOB_INDEX: str(index),
            "batch.kubernetes.io/job-name": "indexed",
            "job-name": "indexed",
        }
        owner = {"kind": "Job", "name": "indexed", "controller": True, "apiVersion": "batch/v1"}
        made.append(
            _tried(pod(f"indexed-{index}", "ml", gpus=2, labels=labels, owner=owner, created=WHEN))
        )
    made.append(_tried(pod("single", "ml", gpus=1, created=WHEN)))
    return made


SEEDS: list[tuple[list[Obj], list[Obj]]] = [
    (_plain(), _nodes()),
    (_shapes(), _nodes()),
    (_gangs(), _nodes()),
]


# -- mutations -----------------------------------------------------------------------------------

Path = tuple[str | int, ...]
UNSCHEDULABLE = [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]
GATED = [{"type": "PodScheduled", "status": "False", "reason": "SchedulingGated"}]
DEEP: Any = []
for _ in range(400):
    DEEP = [DEEP]

# fmt: off
QUANTITIES: list[Any] = [
    "1", "8", "0", "-1", -1, 0, 3, 1024, 1025, "1025", "1024", 2**63, 2**64, 10**30, "1e3", "²",
    "٣", "1.5", 1.5, True, None, "", "9" * 30, "999999999", "1000000000", " 1", "+1", "0x10",
    "4\n", "lots", [], {}, 1e308, "500m",
]
TIMES: list[Any] = [
    "2026-11-24T10:00:00Z", "x", 5, None, "", "2026-11-24T10:00:00", "0001-01-01T00:00:00Z",
    "9999-12-31T23:59:59Z", "2026-11-24T10:00:00+14:00", "2026-13-45T00:00:00Z",
    "２０２６-11-24T10:00:00Z", "2026-11-24T10:00:00.123456789Z", 1e308, [],
]
SECONDS: list[Any] = [
    "600", "0", "-5", "nan", "inf", "1e308", "2592000", "2592001", "soon", "", 5, None, "٣٠٠",
    "1_000", " 60 ", "0x10", "6e2", "1" * 400,
]
ODD: list[Any] = [
    None, 5, -1, 2**64, 10**30, 1.5, 1e308, "", "x" * 70_000, "\n", "é", "²", "a\nb", [], {},
    True, DEEP, "\u202e", "\x00", [None], {"": None},
]
POD_FIELDS: dict[str, tuple[Path, list[Any]]] = {
    "gpus": (("spec", "containers", 0, "resources", "requests", GPU), QUANTITIES),
    "limit": (("spec", "containers", 0, "resources", "limits", GPU), QUANTITIES),
    "amd": (("spec", "containers", 0, "resources", "requests", "amd.com/gpu"), QUANTITIES),
    "mig": (("spec", "containers", 0, "resources", "limits", "nvidia.com/mig-3g.40gb"), QUANTITIES),
    "second": (("spec", "containers", 1, "resources", "requests", GPU), QUANTITIES),
    "resources": (("spec", "containers", 0, "resources"), [None, "x", 5, [], {"requests": "x"}]),
    "init": (
        ("spec", "initContainers"),
        [
            [{"name": "i", "resources": {"limits": {GPU: "16"}}}], "x", [5], None,
            [{"resources": "x"}], [{"resources": {"limits": {GPU: "2000"}}}], [],
        ],
    ),
    "containers": (
        ("spec", "containers"),
        [
            "x", None, [], [5], [{}], {"a": 1}, [{"resources": None}],
            [{"resources": {"requests": 5}}],
        ],
    ),
    "phase": (
        ("status", "phase"),
        ["Pending", "Running", "Succeeded", "Failed", "Unknown", "", None, 5, ["Pending"]],
    ),
    "nodeName": (("spec", "nodeName"), ["onprem-1", "", None, 5, "x" * 300, "ip-10-0-0-1", "gone"]),
    "nominated": (("status", "nominatedNodeName"), ["onprem-1", "", None, 5]),
    "deleting": (("metadata", "deletionTimestamp"), ["2030-01-01T00:00:00Z", "", None, 5, "x"]),
    "conditions": (
        ("status", "conditions"),
        [
            UNSCHEDULABLE, GATED, [{"type": "PodScheduled", "status": "True"}], "x", None, [5],
            [None, *UNSCHEDULABLE], [{"type": "PodScheduled"}], [],
            [*UNSCHEDULABLE, {"type": "PodScheduled", "status": "True"}],
            [{"type": "Ready", "status": "False"}, *UNSCHEDULABLE],
        ],
    ),
    "reason": (
        ("status", "conditions", 0, "reason"), ["Unschedulable", "SchedulingGated", None, 5],
    ),
    "status-of": (("status", "conditions", 0, "status"), ["False", "True", False, None]),
    "namespace": (
        ("metadata", "namespace"), ["default", "ml", "web", "", None, 5, "x" * 100, "é", "a\nb"],
    ),
    "name": (("metadata", "name"), ["a", "", None, 5, "x" * 70_000, "a\nb", "é", "../x", "a"]),
    "uid": (("metadata", "uid"), [5, None, "u-1", ""]),
    "metadata": (("metadata",), [None, "x", 5, [], {}]),
    "spec": (("spec",), [None, "x", 5, [], {}]),
    "status": (("status",), [None, "x", 5, [], {}]),
    "labels": (
        ("metadata", "labels"),
        [
            None, "x", {"a": 5}, {}, {GROUP: "ring"}, {GROUP: ""}, {GROUP: 5},
            {"pod-group.scheduling.sigs.k8s.io": "g" * 300},
            {JOB_INDEX: "0", "batch.kubernetes.io/job-name": "idx"}, {JOB_INDEX: "1"},
            {GROUP: "a\nb"}, {GROUP: "ring", SIZE: "3"}, {KUEUE: "ring"},
            {KUEUE: "kq", "kueue.x-k8s.io/pod-group-total-count": "x"},
        ],
    ),
    "group": (("metadata", "labels", GROUP), ["ring", "big", "", 5, None, "x\ny", "é" * 100]),
    "size": (
        ("metadata", "annotations", SIZE),
        ["4", "0", "-1", "x", "100001", "999999999", "1000000000", "²", "4\n", 5, None, ""],
    ),
    "size-label": (("metadata", "labels", SIZE), ["2", "0", "x", "100001", 5]),
    "kueue": (("metadata", "labels", KUEUE), ["ring", "kq", "", 5]),
    "kueue-size": (
        ("metadata", "annotations", "kueue.x-k8s.io/pod-group-total-count"),
        ["2", "0", "x", "200000", None],
    ),
    "annotations": (("metadata", "annotations"), [None, "x", {"a": 5}, [], {}]),
    "interval": (("metadata", "annotations", "gpu-autoscaler.io/checkpoint_interval"), SECONDS),
    "duration": (("metadata", "annotations", "gpu-autoscaler.io/checkpoint_duration"), SECONDS),
    "signal": (
        ("metadata", "annotations", "gpu-autoscaler.io/checkpoint_signal"),
        ["USR1", "SIGTERM", "KILL", "none", "NONE", "x" * 200, "", 5, "sigusr2", "a\nb"],
    ),
    "tolerations": (
        ("spec", "tolerations"),
        [
            [spot_toleration()], [{"operator": "Exists"}],
            [{"operator": "Exists", "effect": "NoExecute"}], "everything", [5], None,
            [{"key": 5, "operator": "Equal"}],
            [{"key": "gpu-autoscaler.io/spot", "operator": "Exists"}],
            [{"key": "gpu-autoscaler.io/spot", "value": "false"}], [{"operator": 5}],
        ],
    ),
    "priority": (("spec", "priority"), [5000, 999, -1, 2**63, 10**30, "high", True, 1.5, None]),
    "class": (("spec", "priorityClassName"), ["urgent", "", 5, None, ["urgent"]]),
    "selector": (
        ("spec", "nodeSelector"),
        [
            {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}, {"team": "ml"},
            {"nvidia.com/gpu.memory": "81920"}, {"nvidia.com/gpu.memory": "²"},
            {"nvidia.com/gpu.memory": "0"}, {"nvidia.com/gpu.memory": "9" * 400},
            {"node.kubernetes.io/instance-type": "p5.48xlarge"},
            {"gpu-autoscaler.io/market": "spot"}, {"gpu-autoscaler.io/pool": "nope"}, {"a": 5},
            "x", 5, [], {"": ""}, {"x" * 1000: "y"}, {"a\nb": "c"},
            {"topology.kubernetes.io/zone": "us-east-1a"},
        ],
    ),
    "affinity": (("spec", "affinity"), []),  # filled below
    "created": (("metadata", "creationTimestamp"), TIMES),
    "started": (("status", "startTime"), TIMES),
    "owner": (
        ("metadata", "ownerReferences"),
        [
            [{"kind": "Job", "controller": True, "name": "j"}], "x", [5],
            [{"kind": 5, "controller": True}], None, [{"kind": "DaemonSet", "controller": True}],
        ],
    ),
    "gates": (("spec", "schedulingGates"), [[{"name": "g"}], [], "x"]),
}


def _term(*expressions: Any) -> Obj:
    return {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": list(expressions)}]
            }
        }
    }


POD_FIELDS["affinity"][1].extend(
    [
        AFFINITY, "x", {"nodeAffinity": 5},
        {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": 5}},
        {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": "x"}}},
        {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [5, {}]}}},
        {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{}]}}},
        _term({"key": 5, "operator": "In", "values": ["a"]}),
        _term({"key": "team", "operator": "In", "values": "ml"}),
        _term({"key": "team", "operator": "In", "values": [5]}),
        _term({"key": "team", "operator": "Foo", "values": []}),
        _term({"key": "team", "operator": 5}),
        _term({"key": "team", "operator": "In", "values": ["ml"]}),
        _term({"key": "team", "operator": "DoesNotExist"}),
        _term({"key": "gpu-autoscaler.io/market", "operator": "NotIn", "values": ["spot"]}),
        _term({"key": "gpu-autoscaler.io/market", "operator": "Exists"}),
        _term({"key": "nvidia.com/gpu.memory", "operator": "Gt", "values": ["²"]}),
        _term({"key": "nvidia.com/gpu.memory", "operator": "Gt", "values": ["9" * 30]}),
        _term({"key": "nvidia.com/gpu.memory", "operator": "Gt", "values": []}),
        _term({"key": "gpu-autoscaler.io/pool", "operator": "Gt", "values": ["-5"]}),
        _term({"key": "gpu-autoscaler.io/pool", "operator": "Lt", "values": ["²"]}),
        _term({"key": "example.com/rack", "operator": "Gt", "values": ["٣"]}),
        _term({"key": "nvidia.com/gpu.product", "operator": "In", "values": ["x"] * 3000}),
        _term(*[{"key": f"k{i}", "operator": "Exists"} for i in range(300)]),
        _term("x"),
    ]
)

NODE_FIELDS: dict[str, tuple[Path, list[Any]]] = {
    "gpus": (("status", "allocatable", GPU), QUANTITIES),
    "mig": (("status", "allocatable", "nvidia.com/mig-3g.40gb"), QUANTITIES),
    "allocatable": (("status", "allocatable"), [None, "x", 5, []]),
    "labels": (
        ("metadata", "labels"),
        [
            {MANAGED: "true"}, {MANAGED: "true", "x": 5}, "x", None, {"nvidia.com/gpu.memory": "²"},
            {"nvidia.com/gpu.memory": "81920"},
            {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"},
            {"node.kubernetes.io/instance-type": "p5.48xlarge"},
            {"gpu-autoscaler.io/gpu-model": ""},
        ],
    ),
    "managed": (("metadata", "labels", MANAGED), ["true", "false", 5, None, "True"]),
    "memory": (
        ("metadata", "labels", "nvidia.com/gpu.memory"), ["81920", "²", "0", "-5", "9" * 400],
    ),
    "model": (("metadata", "labels", "gpu-autoscaler.io/gpu-model"), ["A100", "", 5, "x" * 1000]),
    "provider": (
        ("spec", "providerID"),
        [
            "aws:///us-east-1a/i-0abc", "gce://p/z/n", "azure:///subscriptions/x/virtualMachines/vm",
            "", "://", "aws:///", 5, None, "x" * 1000, "no-scheme", "aws:///a/i-0abc\n",
        ],
    ),
    "name": (("metadata", "name"), ["n", "", None, 5, "x" * 300, "a\nb", "onprem-1"]),
    "cordoned": (("spec", "unschedulable"), [True, "true", None, 1]),
    "conditions": (
        ("status", "conditions"),
        ["x", [5], [{"type": "Ready", "status": "True"}], None, [{"type": "Ready"}]],
    ),
    "taints": (("spec", "taints"), ["x", [5], [spot_taint()], None, [{"key": 5}]]),
    "metadata": (("metadata",), [None, "x", 5, [], {}]),
    "spec": (("spec",), [None, "x", 5, []]),
    "status": (("status",), [None, "x", 5, []]),
    "version": (("metadata", "resourceVersion"), [5, None, "x" * 100, []]),
}
SCRATCH: list[Any] = [
    None, 5, "x", [], {}, {"metadata": None}, {"metadata": {"namespace": 5}}, DEEP,
]
# fmt: on


def _set(obj: Any, path: Path, value: Any) -> None:
    """Set ``path`` in ``obj`` to ``value``, making the objects on the way where they lack."""
    for index, step in enumerate(path):
        last = index == len(path) - 1
        if isinstance(step, int):
            if not isinstance(obj, list) or step >= len(obj):
                return
            if last:
                obj[step] = value
                return
            if not isinstance(obj[step], dict):
                obj[step] = {}
            obj = obj[step]
            continue
        if not isinstance(obj, dict):
            return
        if last:
            obj[step] = value
            return
        following = path[index + 1]
        wanted = list if isinstance(following, int) else dict
        if not isinstance(obj.get(step), wanted):
            obj[step] = [] if wanted is list else {}
        obj = obj[step]


def _containers(obj: Any, rng: random.Random) -> list[tuple[Any, Any]]:
    """Every (container, key) pair in ``obj``'s tree: where a random edit may land."""
    found: list[tuple[Any, Any]] = []
    stack = [obj]
    while stack and len(found) < 500:
        here = stack.pop()
        if isinstance(here, dict):
            for key, value in here.items():
                found.append((here, key))
                if value is not DEEP:
                    stack.append(value)
        elif isinstance(here, list) and here is not DEEP:
            for index, value in enumerate(here[:50]):
                found.append((here, index))
                stack.append(value)
    return found


def _random_edit(obj: Any, rng: random.Random) -> None:
    spots = _containers(obj, rng)
    if not spots:
        return
    holder, key = rng.choice(spots)
    if isinstance(holder, dict) and rng.random() < 0.3:
        del holder[key]
    else:
        holder[key] = copy.deepcopy(rng.choice(ODD))


def _mutate(
    items: list[Any], fields: dict[str, tuple[Path, list[Any]]], rng: random.Random
) -> None:
    roll = rng.random()
    if not items or roll < 0.05:
        items.append(copy.deepcopy(rng.choice(SCRATCH)))
        return
    at = rng.randrange(len(items))
    if roll < 0.6:
        path, values = fields[rng.choice(sorted(fields))]
        _set(items[at], path, copy.deepcopy(rng.choice(values)))
    elif roll < 0.85:
        _random_edit(items[at], rng)
    elif roll < 0.92:
        items.append(copy.deepcopy(items[at]))
    elif roll < 0.97:
        del items[at]
    else:
        items[at] = copy.deepcopy(rng.choice(SCRATCH))


# -- the independent reading ---------------------------------------------------------------------


def _quantity(value: Any) -> int | None:
    """A plainly whole quantity (an integer, or ASCII digits), else None: no claim."""
    if type(value) is int and 0 <= value <= 99_999:
        return value
    if isinstance(value, str) and _QUANTITY.fullmatch(value):
        return int(value)
    return None


def _asked(container: Any) -> int | None:
    """``nvidia.com/gpu`` a container asks for: its request, else its limit."""
    if not isinstance(container, dict):
        return None
    resources = container.get("resources")
    if resources is None:
        return 0
    if not isinstance(resources, dict):
        return None
    found: dict[str, int] = {}
    for part in ("limits", "requests"):  # a request overrides the limit
        table = resources.get(part)
        if table is None:
            continue
        if not isinstance(table, dict) or not set(table) <= PLAIN_RESOURCES:
            return None
        if GPU in table:
            count = _quantity(table[GPU])
            if count is None:
                return None
            found[part] = count
    return found.get("requests", found.get("limits", 0))


def plain_gpus(spec: Any) -> int | None:
    """The pod's GPUs by the documented rule (the containers' sum or the largest init
    container's, whichever is more), or None where the reference makes no claim."""
    if not isinstance(spec, dict):
        return None
    containers, inits = spec.get("containers"), spec.get("initContainers")
    if not isinstance(containers, list) or not isinstance(inits, list | None):
        return None
    total = 0
    for container in containers:
        asked = _asked(container)
        if asked is None:
            return None
        total += asked
    for container in inits or ():
        asked = _asked(container)
        if asked is None:
            return None
        total = max(total, asked)
    return total


def _pending(obj: Any, namespaces: frozenset[str] | None) -> tuple[str, int, Obj] | None:
    """(namespace/name, GPUs, labels) of a pod plainly pending, unschedulable, of a counted
    namespace and asking for 1 to 1,024 GPUs; None: not, or no claim."""
    if not isinstance(obj, dict):
        return None
    meta, spec, status = obj.get("metadata"), obj.get("spec"), obj.get("status")
    if not (isinstance(meta, dict) and isinstance(spec, dict) and isinstance(status, dict)):
        return None
    namespace, name = meta.get("namespace"), meta.get("name")
    if not (isinstance(namespace, str) and isinstance(name, str)):
        return None
    if namespaces is not None and namespace not in namespaces:
        return None
    if meta.get("deletionTimestamp") is not None or spec.get("nodeName") is not None:
        return None
    if spec.get("schedulingGates"):  # never both gated and tried, as the API keeps pods
        return None
    if status.get("phase") not in (None, "Pending") or status.get("nominatedNodeName") is not None:
        return None
    conditions = status.get("conditions")
    if not isinstance(conditions, list) or not all(isinstance(c, dict) for c in conditions):
        return None
    scheduled = [c for c in conditions if c.get("type") == "PodScheduled"]
    if not scheduled or (scheduled[0].get("status"), scheduled[0].get("reason")) != (
        "False",
        "Unschedulable",
    ):
        return None
    gpus = plain_gpus(spec)
    if gpus is None or not 1 <= gpus <= MAX_GPUS_PER_NODE:
        return None
    labels = meta.get("labels")
    return f"{namespace}/{name}", gpus, labels if isinstance(labels, dict) else {}


def _gang(namespace: str, labels: Obj, annotations: Any, rules: PodRules) -> str | bool | None:
    """The pod's gang (``namespace/group``) by the labels the settings name; None: none; True:
    not plainly known."""
    for key in rules.group_labels:
        if key in labels:
            value = labels[key]
            if isinstance(value, str) and value:
                return f"{namespace}/{value}"
            return True
    in_annotations = isinstance(annotations, dict) and JOB_INDEX in annotations
    if rules.indexed_jobs_as_gangs and (JOB_INDEX in labels or in_annotations):
        return True
    return None


def _one_line(line: Any, what: str) -> str | None:
    if not isinstance(line, str):
        return f"{what} is {type(line).__name__}, not a line"
    if "\n" in line or "\r" in line:
        return f"{what} spans several lines: {line[:200]!r}"
    if len(line) > LONGEST_LINE:
        return f"{what} is {len(line):,} characters long: {line[:100]!r}..."
    return None


def _group_problem(group: Any) -> str | None:
    jobs, nodes, gpus = group.jobs, group.nodes, group.gpus_per_job
    if not (type(jobs) is int and jobs >= 1):
        return f"a group of {jobs!r} jobs"
    if not (type(nodes) is int and 1 <= nodes <= MAX_JOB_NODES) or gpus % nodes:
        return f"a job of {gpus} GPUs over {nodes} nodes"
    if not 1 <= gpus // nodes <= MAX_GPUS_PER_NODE:
        return f"a job of {gpus} GPUs over {nodes} nodes"
    if not math.isfinite(group.oldest_submit_time):
        return f"submitted at {group.oldest_submit_time}"
    interval = group.checkpoint_interval_s
    if interval is not None and not (math.isfinite(interval) and 0 < interval <= MAX_CHECKPOINT_S):
        return f"checkpoints every {interval} s"
    memory = group.min_gpu_memory_gib
    if memory is not None and not (math.isfinite(memory) and memory > 0):
        return f"needs {memory} GiB per GPU"
    if not all(isinstance(m, str) and m for m in group.gpu_models):
        return f"GPU models {group.gpu_models!r:.100}"
    if not 1 <= len(group.oldest_jobs) <= min(jobs, 8):
        return f"{jobs} jobs named by {len(group.oldest_jobs)} ids"
    return None


def _plain_node(obj: Any) -> tuple[str, int, bool, str | None] | None:
    """(name, GPUs, managed, providerID) of a node that plainly reads; None: no claim."""
    if not isinstance(obj, dict):
        return None
    meta, spec, status = obj.get("metadata"), obj.get("spec", {}), obj.get("status", {})
    if not (isinstance(meta, dict) and isinstance(spec, dict) and isinstance(status, dict)):
        return None
    name, labels = meta.get("name"), meta.get("labels", {})
    if not (isinstance(name, str) and name and isinstance(labels, dict)):
        return None
    if not all(isinstance(v, str) and v.isascii() for v in labels.values()):
        return None
    allocatable = status.get("allocatable", {})
    if not isinstance(allocatable, dict) or not set(allocatable) <= PLAIN_RESOURCES | {"pods"}:
        return None
    gpus = _quantity(allocatable.get(GPU, 0))
    conditions, taints = status.get("conditions", []), spec.get("taints", [])
    if gpus is None or gpus > MAX_GPUS_PER_NODE:
        return None
    if not all(isinstance(c, dict) for c in (conditions if isinstance(conditions, list) else [5])):
        return None
    if not all(isinstance(t, dict) for t in (taints if isinstance(taints, list) else [5])):
        return None
    provider = spec.get("providerID")
    if provider is not None and not isinstance(provider, str):
        return None
    return name, gpus, labels.get(MANAGED) == "true", provider


def _instance(name: str, provider: str | None) -> str:
    """The documented key of our node: the providerID's last part, else the node's name."""
    if provider and "://" in provider:
        parts = [p for p in provider.split("://", 1)[1].split("/") if p]
        if parts:
            return parts[-1]
    return name


# -- the boundary --------------------------------------------------------------------------------


class KubernetesBoundary:
    name = "Kubernetes pods and nodes (the API server's JSON)"

    def seeds(self) -> Sequence[tuple[int, list[Obj], list[Obj]]]:
        return [
            (variant, copy.deepcopy(pods), copy.deepcopy(nodes))
            for variant in range(len(VARIANTS))
            for pods, nodes in SEEDS
        ]

    def generate(self, rng: random.Random) -> tuple[int, list[Any], list[Any]]:
        return self._generate(rng)

    def _generate(self, rng: random.Random) -> tuple[int, list[Any], list[Any]]:
        variant = rng.randrange(len(VARIANTS))
        pods, nodes = copy.deepcopy(rng.choice(SEEDS))
        if rng.random() < 0.3:  # a second scenario's pods beside the first's
            pods += copy.deepcopy(rng.choice(SEEDS)[0])
        for _ in range(rng.randint(1, 6)):
            if rng.random() < 0.8:
                _mutate(pods, POD_FIELDS, rng)
            else:
                _mutate(nodes, NODE_FIELDS, rng)
        return variant, pods, nodes

    def check(self, data: object) -> Outcome:
        assert isinstance(data, tuple)
        variant, pods, nodes = data
        rules = RULES[variant]
        fits: Callable[[Pod], str | None] | None = _unmet if VARIANTS[variant][1] else None
        reading = pending_demand(pods, rules, fits, NOW)
        wrong = self._check_demand(reading, pods, rules)
        if wrong:
            return Outcome.wrong(wrong)
        try:
            found = Nodes.read(nodes, rules)
        except BadNodeError as exc:
            if broken := _one_line(str(exc), "the node error"):
                return Outcome.wrong(broken)
            wrong = self._check_bound(pods, rules)
            return Outcome.wrong(wrong) if wrong else Outcome.rejected(str(exc))
        wrong = self._check_nodes(found, nodes, pods, rules) or self._check_bound(pods, rules)
        return Outcome.wrong(wrong) if wrong else Outcome.accepted()

    def _check_demand(self, reading: Any, pods: list[Any], rules: PodRules) -> str | None:
        if set(reading.problems) != set(PROBLEMS):
            return f"problems of kinds {sorted(reading.problems)}"
        for kind, lines in reading.problems.items():
            for line in lines:
                if broken := _one_line(line, f"a {kind} line"):
                    return broken
        for group in reading.groups:
            if problem := _group_problem(group):
                return f"read as demand: {problem}"
        jobs = sum(g.jobs for g in reading.groups)
        if jobs > len(pods) or reading.pending > len(pods):
            return f"{jobs} jobs ({reading.pending} pods) from {len(pods)} pods"
        too_large = " ".join(reading.problems[TOO_LARGE])
        singles, gangs, unsure, gpus = 0, set(), 0, 0
        ids = [_pending(obj, rules.namespaces) for obj in pods]
        counts = _ids(pods)
        for obj, found in zip(pods, ids, strict=True):
            if found is None:
                continue
            pod_id, asked, labels = found
            namespace = pod_id.split("/", 1)[0]
            gang = _gang(namespace, labels, obj["metadata"].get("annotations"), rules)
            if gang is True:
                unsure += 1
                continue
            if isinstance(gang, str):
                if f"pod group {gang}:" not in too_large:
                    gangs.add(gang)
                    gpus += asked
                continue
            singles += 1
            gpus += asked
            if counts.get(pod_id) == 1 and (why := _planned(obj, pod_id, reading.groups, rules)):
                return why
        least = singles + len(gangs) or (1 if unsure else 0)
        if jobs < least:
            return (
                f"{jobs} jobs read where {singles} pending pods and {len(gangs)} gangs wait: "
                f"a pending GPU pod went missing"
            )
        total = sum(g.gpus for g in reading.groups)
        if total < gpus:
            return f"{total} GPUs read where pending pods ask for {gpus}"
        return None

    def _check_nodes(
        self, found: Nodes, nodes: list[Any], pods: list[Any], rules: PodRules
    ) -> str | None:
        for line in found.bad:
            if broken := _one_line(line, "a node line"):
                return broken
        names = [n[0] for n in map(_plain_node, nodes) if n is not None]
        for obj in nodes:
            plain = _plain_node(obj)
            if plain is None or names.count(plain[0]) != 1 or _names(nodes).count(plain[0]) != 1:
                continue
            name, gpus, managed, provider = plain
            read = found.by_name.get(name)
            if read is None:
                return f"node {name[:40]!r} read plainly by the rules was left out"
            if read.gpus != gpus or read.managed != managed:
                return f"node {name[:40]!r}: {read.gpus} GPUs, managed {read.managed}"
            if managed and read.key != _instance(name, provider):
                return f"node {name[:40]!r} of provider {provider!r:.60} keyed {read.key[:60]!r}"
        for read in found.by_name.values():
            if not (0 <= read.gpus <= MAX_GPUS_PER_NODE and read.name and read.key):
                return f"node {read.name[:40]!r} with {read.gpus} GPUs, key {read.key[:40]!r}"
        allocation = Allocation.of(pods, rules)
        for why in allocation.unreadable.values():
            if broken := _one_line(why, "a bound pod line"):
                return broken
        held: dict[str, int] = {}
        for obj in pods:
            if not isinstance(obj, dict) or not isinstance(obj.get("spec"), dict):
                continue
            on, status = obj["spec"].get("nodeName"), obj.get("status")
            if not isinstance(on, str) or not on or not isinstance(status, dict):
                continue
            if status.get("phase") not in ("Running", "Pending", None):
                continue
            asked = plain_gpus(obj["spec"])
            if asked:
                held[on] = held.get(on, 0) + asked
        for read in found.by_name.values():
            used = allocation.on(read)
            if used < 0:
                return f"node {read.name[:40]!r}: {used} GPUs allocated"
            if read.name in allocation.unreadable:
                if used < max(read.gpus, 1):
                    return f"node {read.name[:40]!r} with an unreadable pod counts {used} GPUs"
            elif used < held.get(read.name, 0):
                return f"node {read.name[:40]!r}: {used} GPUs allocated, its pods hold {held}"
        reading, empty = node_reading(found, allocation, {}, NOW)
        for onprem in reading.onprem:
            if not 0 <= onprem.gpus_allocated <= onprem.gpus <= MAX_GPUS_PER_NODE:
                return f"on-prem node {onprem.name[:40]!r}: {onprem.gpus_allocated}/{onprem.gpus}"
        for key, usage in reading.cloud.items():
            if usage.gpus_allocated < 0 or (usage.empty_since is not None) != (key in empty):
                return f"cloud node {key[:40]!r}: {usage}"
        by_node, bad = running_jobs(pods, found, rules)
        for line in bad:
            if broken := _one_line(line, "a running pod line"):
                return broken
        for jobs in by_node.values():
            for job in jobs:
                if job.gpus < 1 or job.nodes < 1 or not math.isfinite(job.started_at):
                    return f"running job {job}"
        return None

    def _check_bound(self, pods: list[Any], rules: PodRules) -> str | None:
        """What a drain reads of a node's pods: every pod, unreadable ones named in a line."""
        found, bad = workload(pods, rules)
        for line in bad:
            if broken := _one_line(line, "a drained pod line"):
                return broken
        if len(found) + len(bad) > len(pods):
            return f"{len(found)} pods and {len(bad)} unreadable from {len(pods)}"
        return None

    def close(self) -> None:
        """Nothing to release."""


def _names(nodes: list[Any]) -> list[Any]:
    """Every node's name as far as it reads (a name twice: the later node wins, no claim)."""
    found = []
    for obj in nodes:
        meta = obj.get("metadata") if isinstance(obj, dict) else None
        found.append(meta.get("name") if isinstance(meta, dict) else None)
    return found


def _ids(pods: list[Any]) -> dict[str, int]:
    """How many pods (or gangs) each ``namespace/name`` may name, as far as the ids read:
    a job's id names one pod only where it is counted once here."""
    counts: dict[str, int] = {}
    for obj in pods:
        meta = obj.get("metadata") if isinstance(obj, dict) else None
        if not isinstance(meta, dict):
            continue
        namespace, name, labels = meta.get("namespace"), meta.get("name"), meta.get("labels")
        if not (isinstance(namespace, str) and isinstance(name, str)):
            continue
        names = [name] if len(name) <= 253 and len(namespace) <= 63 else []
        if isinstance(labels, dict):
            names += [v for v in labels.values() if isinstance(v, str)]
            names += [f"job/{v}" for v in labels.values() if isinstance(v, str)]
        for each in names:
            counts[f"{namespace}/{each}"] = counts.get(f"{namespace}/{each}", 0) + 1
    return counts


def _planned(obj: Obj, pod_id: str, groups: Sequence[Any], rules: PodRules) -> str | None:
    """A single pending pod's group keeps the documented rules: off spot without the
    toleration, high priority with a high class."""
    spec = obj["spec"]
    for group in groups:
        if pod_id not in group.oldest_jobs or group.gpu_models == (UNREADABLE_MODEL,):
            continue
        if spec.get("tolerations") is None and group.checkpoint_interval_s is not None:
            return f"pod {pod_id[:60]} lacks the spot toleration, planned with checkpoints"
        named = spec.get("priorityClassName")
        if isinstance(named, str) and named in rules.high_classes and not group.high_priority:
            return f"pod {pod_id[:60]} of a high-priority class planned as low priority"
    return None


# -- the same through the API: list pods and list nodes over real HTTP ---------------------------

TOKEN_ENV = "GPU_AUTOSCALER_FUZZ_K8S_TOKEN"
LISTS = {"pods": "/api/v1/pods", "nodes": "/api/v1/nodes"}
STATUS_BODY = json.dumps(
    {"kind": "Status", "status": "Failure", "message": "pods is forbidden:\nno", "code": 403}
).encode()
# fmt: off
ANSWERS: list[tuple[int, bytes]] = [
    (200, b""), (200, b"null"), (200, b"[]"), (200, b"{}"), (200, b"not json"),
    (200, b'{"items": 5, "metadata": {}}'), (200, b'{"items": [], "metadata": 5}'),
    (200, b'{"items": [], "metadata": {"resourceVersion": 5}}'),
    (200, b'{"items": [], "metadata": {"resourceVersion": "' + b"9" * 70_000 + b'"}}'),
    (200, b"[" * 100_000 + b"]" * 100_000),
    (200, b'{"items": [' + b"[" * 3000 + b"]" * 3000 + b"]}"),
    (200, b'{"items": [1e999], "metadata": {}}'), (200, b'{"items": [NaN], "metadata": {}}'),
    (200, b"\xff\xfe{}"), (200, b'{"items": [], "metadata": {}}' + b" " * 4_000_000),
    (500, b"oops"), (403, STATUS_BODY), (401, b""), (404, b"not found"), (429, b"{}"),
    (200, b'{"items": [{"metadata": "x"}], "metadata": {}}'),
]
# fmt: on


def _list_body(items: list[Any], rng: random.Random) -> bytes:
    document: Obj = {"kind": "List", "apiVersion": "v1", "metadata": {"resourceVersion": "7"}}
    document["items"] = items
    if rng.random() < 0.05:
        del document[rng.choice(["metadata", "items"])]
    return json.dumps(document).encode()


class KubernetesApiBoundary:
    """``KubernetesSource.read`` and ``read_nodes`` against a real HTTP server answering the
    fuzzed ``list pods`` and ``list nodes``: any answer ends in a reading that keeps the rules or
    in the source's one-line ``SourceError`` naming the call."""

    name = "Kubernetes list pods / list nodes over HTTP"

    def __init__(self) -> None:
        self._objects = KubernetesBoundary()
        self._server: AnswerServer | None = None
        self._source: KubernetesSource | None = None
        self._ticks = itertools.count(1)

    def seeds(self) -> Sequence[tuple[int, bytes, int, bytes]]:
        rng = random.Random(0)
        return [
            (200, _list_body(pods, rng), 200, _list_body(nodes, rng))
            for _, pods, nodes in self._objects.seeds()[: len(SEEDS)]
        ]

    def generate(self, rng: random.Random) -> tuple[int, bytes, int, bytes]:
        return self._generate(rng)

    def _generate(self, rng: random.Random) -> tuple[int, bytes, int, bytes]:
        _, pods, nodes = self._objects._generate(rng)
        answers = [(200, _list_body(pods, rng)), (200, _list_body(nodes, rng))]
        for which in range(2):
            roll = rng.random()
            if roll < 0.15:
                status, body = answers[which]
                text = body.decode()
                for _ in range(rng.randint(1, 3)):
                    text = mutate_text(text, rng)
                answers[which] = (status, text.encode("utf-8", "surrogatepass"))
            elif roll < 0.3:
                answers[which] = rng.choice(ANSWERS)
        return answers[0][0], answers[0][1], answers[1][0], answers[1][1]

    def _ready(self) -> tuple[AnswerServer, KubernetesSource]:
        if self._server is None or self._source is None:
            self._server = AnswerServer()
            os.environ[TOKEN_ENV] = "fuzz-token"
            settings = KubernetesSettings(
                api_url=self._server.url(""), token_env=TOKEN_ENV, request_timeout_s=10.0
            )
            self._source = KubernetesSource(settings, "fuzz")
        return self._server, self._source

    def check(self, data: object) -> Outcome:
        assert isinstance(data, tuple)
        pods_status, pods_body, nodes_status, nodes_body = data
        server, source = self._ready()
        server.answer(LISTS["pods"], pods_body, pods_status)
        server.answer(LISTS["nodes"], nodes_body, nodes_status)
        now = NOW + next(self._ticks)  # a new tick: the pods are listed afresh
        logging.disable(logging.WARNING)  # the source's warning lines: checked below instead
        try:
            return self._read(source, now)
        finally:
            logging.disable(logging.NOTSET)

    def _read(self, source: KubernetesSource, now: float) -> Outcome:
        refused: list[str] = []
        try:
            groups = source.read(now)
        except SourceError as exc:
            if broken := _one_line(str(exc), "the error") or _names_call(str(exc), "list pods"):
                return Outcome.wrong(broken)
            refused.append(str(exc))
        else:
            for group in groups:
                if problem := _group_problem(group):
                    return Outcome.wrong(f"read as demand: {problem}")
        try:
            reading = source.read_nodes(now)
        except SourceError as exc:
            said = str(exc)
            if broken := _one_line(said, "the error") or (
                _names_call(said, "list nodes") and _names_call(said, "list pods")
            ):
                return Outcome.wrong(broken)
            refused.append(said)
        else:
            for onprem in reading.onprem:
                if not 0 <= onprem.gpus_allocated <= onprem.gpus <= MAX_GPUS_PER_NODE:
                    return Outcome.wrong(f"on-prem node {onprem.name[:40]!r}")
            for key, usage in reading.cloud.items():
                if usage.gpus_allocated < 0:
                    return Outcome.wrong(f"cloud node {key[:40]!r}: {usage}")
        for line in source.problems:
            if broken := _one_line(line, "a problem line"):
                return Outcome.wrong(broken)
        return Outcome.rejected(refused[0]) if refused else Outcome.accepted()

    def close(self) -> None:
        if self._source is not None:
            self._source.close()
        if self._server is not None:
            self._server.close()


def _names_call(message: str, call: str) -> str | None:
    return None if f": {call}" in message else f"the error does not name {call}: {message[:200]}"


BOUNDARIES = [KubernetesBoundary(), KubernetesApiBoundary()]
