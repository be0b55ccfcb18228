"""Nodes and what runs on them: GPU nodes with their allocatable GPUs and the GPUs their bound pods
request, our cloud nodes matched to their instances by ``spec.providerID``, and the GPU pods
running on each node as the jobs an interruption puts at risk.

A node the join script started carries ``gpu-autoscaler.io/managed=true``; its instance id is
the last part of its providerID (``aws:///us-east-1a/i-0abc`` → ``i-0abc``, ``gce://p/z/name``
→ ``name``, ``azure:///…/virtualMachines/name`` → ``name``), else its name (a kubeadm node is
named by its instance id). Every other node with GPUs is on-prem.

Allocation errs towards busy: a bound pod whose resources cannot be read makes its node count
as fully allocated, so a node running work the reader did not understand is never taken for
empty and scaled down under it. A managed node that cannot be read fails the reading (its
instance would otherwise look unregistered and be replaced); another node that cannot be read
is left out and named.

Shared GPUs (time-slicing, MIG; ``autoscaler.sources.kubernetes.slices`` says how the GPU
operator advertises them) count as the GPUs they are: a node's ``gpus`` is its physical GPUs,
not its replicas or MIG instances; its allocated GPUs are as many as its bound pods' slices could
sit on (every replica on a GPU of its own, at most the node's), so a node holding slices is
never taken for emptier than it is; and a cloud node also says the GPUs' worth its pods' slices
add up to (``NodeUsage.gpus_held``), which consolidation judges an underused node by.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from autoscaler.model import OnPremNode
from autoscaler.sources.kubernetes.pods import (
    GPU_MEMORY_LABEL,
    BadPodError,
    Pod,
    PodRules,
    Times,
    as_count,
    as_list,
    as_mapping,
    as_strings,
    gpu_memory_gib,
    ident,
    one_line,
    read_pod,
    resource_totals,
    shown,
)
from autoscaler.sources.kubernetes.slices import (
    NodeSharing,
    is_slice_resource,
    node_sharing,
    product_model,
)
from autoscaler.sources.kubernetes_join import (
    GPU_MODEL_LABEL,
    MANAGED_LABEL,
    MARKET_LABEL,
    POOL_LABEL,
)
from autoscaler.spi.job_shape import MAX_GPUS_PER_NODE
from autoscaler.spi.sources import NodeReading, NodeUsage, RunningJob


class BadNodeError(Exception):
    """A field of one node we cannot read."""


@dataclass(frozen=True)
class Node:
    """One node, reduced to what the controller plans with. ``key`` is what the controller calls
    it: the instance id for ours, the node's name otherwise."""

    name: str
    key: str
    managed: bool
    gpus: int
    gpu_model: str | None
    gpu_memory_gib: float | None
    schedulable: bool
    cordoned: bool
    labels: Mapping[str, str] = field(default_factory=dict)
    taints: tuple[Mapping[str, Any], ...] = ()
    resource_version: str = ""
    sharing: NodeSharing = field(default_factory=lambda: NodeSharing(0))

    @property
    def market(self) -> str | None:
        return self.labels.get(MARKET_LABEL)

    @property
    def pool(self) -> str | None:
        return self.labels.get(POOL_LABEL)


def instance_id(provider_id: str) -> str | None:
    """The instance id in a node's providerID: its last path segment. Azure's names are
    case-insensitive and its cloud provider has written them in either case (the Azure
    provider names its VMs in lower case), so an ``azure://`` one is compared in lower case."""
    scheme, sep, path = provider_id.partition("://")
    if not sep:
        return None
    parts = [p for p in path.split("/") if p]
    if not parts:
        return None
    return parts[-1].lower() if scheme.lower() == "azure" else parts[-1]


def read_node(obj: Any, rules: PodRules) -> Node:
    """One node's facts; ``BadNodeError`` for a field that cannot be read."""
    try:
        if not isinstance(obj, dict):
            raise BadPodError(f"is {shown(obj)}, not an object")
        meta = as_mapping(obj.get("metadata"), "metadata")
        spec = as_mapping(obj.get("spec"), "spec")
        status = as_mapping(obj.get("status"), "status")
        name = meta.get("name")
        if not isinstance(name, str) or not name:
            raise BadPodError("metadata has no name")
        labels = as_strings(meta.get("labels"), "metadata.labels")
        allocatable = as_mapping(status.get("allocatable"), "status.allocatable")
        extended = {
            r: as_count(q, f"status.allocatable {r}")
            for r, q in allocatable.items()
            if r in rules.gpu_resources or is_slice_resource(r)
        }
        sharing = node_sharing(labels, extended, rules.gpu_resources)
        gpus = sharing.gpus
        if gpus > MAX_GPUS_PER_NODE:
            raise BadPodError(f"status.allocatable: {gpus:,} GPUs on one node")
        provider = spec.get("providerID")
        if provider is not None and not isinstance(provider, str):
            raise BadPodError(f"spec.providerID {shown(provider)} is not a string")
        managed = labels.get(MANAGED_LABEL) == "true"
        key = (instance_id(provider) if provider else None) or name
        cordoned = spec.get("unschedulable") is True
        ready = any(
            as_mapping(c, "a status condition").get("type") == "Ready"
            and as_mapping(c, "a status condition").get("status") == "True"
            for c in as_list(status.get("conditions"), "status.conditions")
        )
        taints = tuple(as_mapping(t, "a taint") for t in as_list(spec.get("taints"), "spec.taints"))
    except BadPodError as exc:
        raise BadNodeError(str(exc)) from None
    return Node(
        name=name,
        key=key if managed else name,
        managed=managed,
        gpus=gpus,
        gpu_model=_node_model(labels, rules),
        gpu_memory_gib=gpu_memory_gib(labels.get(GPU_MEMORY_LABEL)),
        schedulable=ready and not cordoned,
        cordoned=cordoned,
        labels=labels,
        taints=taints,
        resource_version=str(meta.get("resourceVersion") or ""),
        sharing=sharing,
    )


def _node_model(labels: Mapping[str, str], rules: PodRules) -> str | None:
    for key in (*rules.model_labels, GPU_MODEL_LABEL):
        value = labels.get(key)
        if value:
            # a shared GPU's product says how it is shared (``-SHARED``, ``-MIG-1g.5gb``)
            return rules.gpu_models.get(value) or rules.gpu_models.get(
                product_model(value), product_model(value)
            )
    for key in rules.instance_type_labels:
        value = labels.get(key)
        if value and value in rules.instance_type_models:
            return rules.instance_type_models[value]
    return None


def node_name(obj: Any) -> str:
    meta = obj.get("metadata") if isinstance(obj, dict) else None
    name = meta.get("name") if isinstance(meta, dict) else None
    return name[:253] if isinstance(name, str) else "?"


@dataclass
class Nodes:
    """A tick's nodes: each by its name, and the problems met reading them."""

    by_name: dict[str, Node] = field(default_factory=dict)
    bad: list[str] = field(default_factory=list)

    @classmethod
    def read(cls, items: Iterable[Any], rules: PodRules) -> Nodes:
        """Raises ``BadNodeError`` naming a managed node that cannot be read."""
        nodes = cls()
        for obj in items:
            try:
                found = read_node(obj, rules)
            except BadNodeError as exc:
                meta = obj.get("metadata") if isinstance(obj, dict) else None
                labels = meta.get("labels") if isinstance(meta, dict) else None
                line = one_line(f"node {node_name(obj)}: {exc}")
                if isinstance(labels, dict) and labels.get(MANAGED_LABEL) == "true":
                    raise BadNodeError(line) from None
                nodes.bad.append(line)
                continue
            nodes.by_name[found.name] = found
        return nodes

    def by_key(self, key: str) -> Node | None:
        """The node the controller calls ``key`` (an instance id or a node name)."""
        found = self.by_name.get(key)
        if found is not None and found.key == key:
            return found
        return next((n for n in self.by_name.values() if n.key == key), found)


def gpu_units(spec: Mapping[str, Any], rules: PodRules) -> dict[str, int]:
    """The units of each GPU resource a pod asks (the counted ones and the slices of shared
    GPUs), as the scheduler sums them (``resource_totals``)."""
    totals = resource_totals(spec, lambda r: r in rules.gpu_resources or is_slice_resource(r))
    return {r: n for r, n in totals.items() if n}


@dataclass
class Allocation:
    """The GPU resources the bound, unfinished pods request of each node (resource -> units);
    nodes with a pod that could not be read count as fully allocated."""

    units: dict[str, dict[str, int]] = field(default_factory=dict)
    unreadable: dict[str, str] = field(default_factory=dict)

    @classmethod
    def of(cls, pods: Iterable[Any], rules: PodRules) -> Allocation:
        found = cls()
        for obj in pods:
            spec = obj.get("spec") if isinstance(obj, dict) else None
            if not isinstance(spec, dict):
                continue
            node = spec.get("nodeName")
            if not node or not isinstance(node, str):
                continue
            status = obj.get("status")
            if isinstance(status, dict) and status.get("phase") in ("Succeeded", "Failed"):
                continue
            try:
                asked = gpu_units(spec, rules)
            except BadPodError as exc:
                found.unreadable.setdefault(node, one_line(f"pod {ident(obj)}: {exc}"))
                continue
            if asked:
                mine = found.units.setdefault(node, {})
                for resource, units in asked.items():
                    mine[resource] = mine.get(resource, 0) + units
        return found

    def held(self, node: Node) -> tuple[int, Fraction]:
        """(GPUs allocated, GPUs' worth held) on ``node``: a whole GPU per counted unit where
        GPUs are not shared; where they are, the GPUs the slices could sit on and what they add
        up to."""
        if node.name in self.unreadable:
            return max(node.gpus, 1), Fraction(max(node.gpus, 1))
        asked = self.units.get(node.name, {})
        if not node.sharing.shared:
            used = sum(asked.values())
            return used, Fraction(used)
        worth, pieces = node.sharing.held(asked)
        return pieces, worth

    def on(self, node: Node) -> int:
        return self.held(node)[0]


def node_reading(
    nodes: Nodes, allocation: Allocation, empty_since: Mapping[str, float], now: float
) -> tuple[NodeReading, dict[str, float]]:
    """On-prem GPU nodes and our cloud nodes' usage; the cloud nodes empty since when (kept
    across ticks by the caller: the first tick a node was seen empty)."""
    onprem: list[OnPremNode] = []
    cloud: dict[str, NodeUsage] = {}
    still_empty: dict[str, float] = {}
    for node in nodes.by_name.values():
        used, worth = allocation.held(node)
        if node.managed:
            since = None
            if used == 0:
                since = still_empty[node.key] = empty_since.get(node.key, now)
            cloud[node.key] = NodeUsage(
                gpus_allocated=used,
                empty_since=since,
                gpus_held=float(worth) if node.sharing.shared else None,
            )
        elif node.gpus > 0:
            onprem.append(
                OnPremNode.model_construct(
                    name=node.name,
                    gpus=node.gpus,
                    gpu_model=node.gpu_model,
                    gpu_memory_gib=node.gpu_memory_gib,
                    gpus_allocated=min(used, node.gpus),
                    gpu_util_pct=None,
                    idle_since=None,
                    schedulable=node.schedulable,
                )
            )
    return NodeReading(onprem=tuple(onprem), cloud=cloud), still_empty


def running_jobs(
    pods: Iterable[Any], nodes: Nodes, rules: PodRules
) -> tuple[dict[str, list[RunningJob]], list[str]]:
    """The GPU pods running (or starting) on each node, keyed as the controller names nodes;
    a pod that cannot be read is named in the problems. A gang's pods are each a job of the
    gang's size in nodes."""
    times = Times()
    found: list[tuple[Pod, dict[str, int]]] = []
    bad: list[str] = []
    for obj in pods:
        spec = obj.get("spec") if isinstance(obj, dict) else None
        if not isinstance(spec, dict) or not spec.get("nodeName"):
            continue
        try:
            pod = read_pod(obj, rules, times)
            units = gpu_units(spec, rules)
        except BadPodError as exc:
            bad.append(one_line(f"pod {ident(obj)}: {exc}"))
            continue
        if units and not pod.finished and not pod.daemon:
            found.append((pod, units))
    sizes: dict[str, int] = {}
    for pod, _ in found:
        if pod.gang:
            sizes[pod.gang] = sizes.get(pod.gang, 0) + 1
    by_node: dict[str, list[RunningJob]] = {}
    for pod, units in found:
        assert pod.node is not None
        known = nodes.by_name.get(pod.node)
        key = known.key if known is not None else pod.node
        gpus, share = _held_by(pod, units, known)
        by_node.setdefault(key, []).append(
            RunningJob(
                id=pod.id,
                node=key,
                gpus=gpus,
                gpu_share=share,
                started_at=pod.started if pod.started is not None else pod.created,
                checkpoint_interval_s=pod.checkpointing.interval_s,
                checkpoint_duration_s=pod.checkpointing.duration_s,
                checkpoint_signal=pod.checkpointing.signal,
                nodes=sizes.get(pod.gang, 1) if pod.gang else 1,
                high_priority=pod.high_priority,
                gpu_models=pod.gpu_models,
                min_gpu_memory_gib=pod.min_gpu_memory_gib,
                team=pod.team,
                priority_class=pod.priority_class,
                submitted_at=pod.created,
            )
        )
    return by_node, bad


def _held_by(pod: Pod, units: Mapping[str, int], node: Node | None) -> tuple[int, float | None]:
    """(``RunningJob.gpus``, ``gpu_share``) of a bound pod: on a node of shared GPUs, a pod
    holding less than a GPU's worth of slices is a job of 1 GPU holding that share (as the
    simulator reports a fractional job); more, the GPUs its slices add up to, rounded up."""
    if node is None or not node.sharing.shared:
        return max(pod.gpus, 1), None
    worth, _ = node.sharing.held(units)
    if worth < 1:
        return 1, float(worth)
    return math.ceil(worth), None


def workload(pods: Sequence[Any], rules: PodRules) -> tuple[list[Pod], list[str]]:
    """The pods a drain moves off a node: unfinished, not a DaemonSet's or a mirror pod; a pod
    that cannot be read is still one (by name), so the node is not let go under it."""
    times = Times()
    found: list[Pod] = []
    bad: list[str] = []
    for obj in pods:
        try:
            pod = read_pod(obj, rules, times)
        except BadPodError as exc:
            bad.append(one_line(f"pod {ident(obj)}: {exc}"))
            continue
        if not pod.finished and not pod.daemon:
            found.append(pod)
    return found, bad
