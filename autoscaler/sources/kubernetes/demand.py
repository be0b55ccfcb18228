"""Pending GPU pods folded into demand groups, the shape the Slurm source gives.

A pod is demand when the scheduler tried it and found no node (``PodScheduled=False``, reason
``Unschedulable``) and it asks for GPUs of a counted resource: a pod created since the
scheduler's last pass, one gated by ``schedulingGates`` and one being deleted are not, as for
Cluster Autoscaler. Each pod is one job of its GPUs on one node; the pending pods of a gang (a
coscheduling pod group, an Indexed Job) are one job of a node each, all at once, with the
largest pod's GPUs on every node.

A pod may be planned on spot when it declares a checkpoint interval, is not high priority and
tolerates the spot taint: the taint is what keeps it off spot nodes, so a pod without the
toleration is planned as one that must stay off spot, whatever it declares.

Demand that cannot be met is counted, never read as no demand: the controller reports it as
unhostable (``gpu_autoscaler_unhostable_jobs``) and buys nothing for it, and the reading names
each pod with its reason (``Reading.problems``, by kind, for the source's warning line and
``gpu_autoscaler_source_problems``):

* ``unknown-gpu-resource``: a GPU-like resource no setting counts (``amd.com/gpu``); its model
  is the resource's name, which no pool offers;
* ``unmet-node-selector``: a node selector or required affinity no pool's nodes can meet
  (``autoscaler.sources.kubernetes.fit``); its model says the requirement;
* ``unreadable``: a pod whose fields cannot be read, unless what can be read shows it is not
  pending GPU demand; one job of its GPUs when they can be read, else of one GPU;
* ``too-large``: more GPUs on one node, or more pods at once, than any node or job can hold;
* ``unshared-gpu-slice``: a slice of a shared GPU (``autoscaler.sources.kubernetes.slices``)
  that no pool's ``gpu_sharing`` and no on-prem node offers (a MIG profile nobody cuts, a
  time-sliced GPU where nothing is time-sliced); its model says the slice.

A pending pod asking a slice of a shared GPU is a job of one GPU whose share of it (k of N
replicas, a MIG instance's c/7) is folded with the other slices of its group into whole GPUs
(``autoscaler.model.sharing.folded_gpus``) against the pools that can host it: their slices
summed and rounded up once, each as the host that cuts it coarsest would. A pool that does not
share, or shares another way, is not folded against: only pools that share the slice's way are
bought for it (below), so it would never be given one of theirs. A time-slicing pod that does not
select its replicas (``nvidia.com/gpu.shared: 1`` alone) is counted against the fewest replicas
any pool or node that time-slices cuts a GPU in: the largest share it may take. A slice pod's
group says how the GPUs it asks must be shared (``DemandGroup.gpu_sharing``, the slice's mode),
so it is never one group with whole-GPU pods, and the policy and the guard buy for it only
pools whose ``gpu_sharing`` is of that mode (``NodeShape.shares_like``).

A checkpoint annotation that cannot be read (``bad-checkpoint-annotation``) leaves the pod as
demand that can be met, as one that does not checkpoint (kept off spot): a typo in an
annotation costs the pod spot's discount, not its GPUs.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from fractions import Fraction
from typing import Any

from autoscaler.model import DemandGroup
from autoscaler.model.sharing import GpuSharing, SharingMode, folded_gpus
from autoscaler.sources.kubernetes.fit import NodeNeeds
from autoscaler.sources.kubernetes.pods import (
    BadPodError,
    Pod,
    PodRules,
    Times,
    ident,
    node_needs,
    one_line,
    read_pod,
    requested,
    unschedulable_status,
    wanted_gpus,
)
from autoscaler.sources.kubernetes.slices import Slice, pod_slice, product_model
from autoscaler.spi.job_shape import MAX_GPUS_PER_NODE, MAX_JOB_NODES
from autoscaler.spi.sources import GroupKey, OldestJobs, groups_from_counts

UNREADABLE_MODEL = "an unreadable pod"
MODEL_SHOWN = 200  # the unmet requirement as a shape's model: a metric label, kept short

# what can be wrong with a pending pod, as the metric's ``problem`` label says it
UNREADABLE = "unreadable"
UNKNOWN_RESOURCE = "unknown-gpu-resource"
UNMET_SELECTOR = "unmet-node-selector"
TOO_LARGE = "too-large"
BAD_CHECKPOINT = "bad-checkpoint-annotation"
UNSHARED_SLICE = "unshared-gpu-slice"
PROBLEMS = (UNREADABLE, UNKNOWN_RESOURCE, UNMET_SELECTOR, TOO_LARGE, BAD_CHECKPOINT, UNSHARED_SLICE)
# counted from the first reading that meets one: a cluster whose GPUs nobody shares (nor asks
# a slice of) keeps the counts it always had
COUNTED_ONCE_SEEN = frozenset({UNSHARED_SLICE})

Unmet = Callable[[Pod], str | None]


@dataclass(frozen=True)
class Sharing:
    """Where slices of shared GPUs can be had: every pool joining the cluster's
    ``gpu_sharing`` (None where its GPUs are not shared; ``pools`` None: the pools are not
    known, and no slice is judged unmet), and, asked only when no pool offers a slice, how
    the on-prem nodes share theirs."""

    pools: Sequence[GpuSharing | None] | None = None
    onprem: Callable[[], Sequence[GpuSharing]] = lambda: ()

    def hosts(self, wanted: Slice) -> list[GpuSharing] | None:
        """The sharings that offer ``wanted``: the pools' that do, else the on-prem nodes';
        None when nothing is known to judge by."""
        if self.pools is None:
            return None
        found = [s for s in self.pools if s is not None and wanted.hosted_by(s)]
        return found or [s for s in self.onprem() if wanted.hosted_by(s)]


@dataclass
class Reading:
    """Demand groups, and the pods read with a problem, one line each, by kind."""

    groups: list[DemandGroup] = field(default_factory=list)
    problems: dict[str, list[str]] = field(default_factory=lambda: {k: [] for k in PROBLEMS})
    pending: int = 0

    def said(self, kind: str, line: str) -> None:
        self.problems[kind].append(one_line(line))


@dataclass
class _Gang:
    members: list[Pod] = field(default_factory=list)
    running: int = 0


def _maybe_pending(obj: Any) -> bool:
    """A cheap look before the full read: only pods not bound to a node can be demand."""
    if not isinstance(obj, dict):
        return True  # read fully, to be named as bad
    spec, status = obj.get("spec"), obj.get("status")
    if isinstance(spec, dict) and spec.get("nodeName"):
        return False
    return not (isinstance(status, dict) and status.get("phase") not in (None, "Pending"))


def _gang_of(obj: Any, rules: PodRules) -> str | None:
    """The gang a bound pod belongs to, read from its labels alone (running members)."""
    meta = obj.get("metadata") if isinstance(obj, dict) else None
    labels = meta.get("labels") if isinstance(meta, dict) else None
    namespace = meta.get("namespace") if isinstance(meta, dict) else None
    if not isinstance(labels, dict) or not isinstance(namespace, str):
        return None
    for key in rules.group_labels:
        group = labels.get(key)
        if isinstance(group, str) and group:
            return f"{namespace}/{group}"
    return None


def _unreadable_gpus(obj: Any, rules: PodRules) -> int | None:
    """The GPUs an unreadable pod may wait for: None when what can be read shows it is not
    pending GPU demand (scheduled, not marked unschedulable, no GPU asked, another namespace);
    one when its resources themselves cannot be read."""
    meta = obj.get("metadata") if isinstance(obj, dict) else None
    spec = obj.get("spec") if isinstance(obj, dict) else None
    status = obj.get("status") if isinstance(obj, dict) else None
    namespace = meta.get("namespace") if isinstance(meta, dict) else None
    others = rules.namespaces is not None and isinstance(namespace, str)
    if others and namespace not in (rules.namespaces or ()):
        return None
    try:
        if isinstance(status, dict) and not unschedulable_status(status):
            return None
    except BadPodError:
        pass
    try:
        gpus, _, other = requested(spec if isinstance(spec, dict) else {}, rules)
    except BadPodError:
        return 1
    return (gpus or other) or None


def _created(obj: Any, times: Times, now: float) -> float:
    meta = obj.get("metadata") if isinstance(obj, dict) else None
    try:
        return times(meta.get("creationTimestamp") if isinstance(meta, dict) else None, "")
    except BadPodError:
        return now


def pending_demand(
    pods: Iterable[Any],
    rules: PodRules,
    unmet: Unmet | None = None,
    now: float = 0.0,
    sharing: Sharing | None = None,
) -> Reading:
    """Fold the pods of one list into demand groups; ``unmet`` says why no pool's node can
    meet a pod's node selector (None: one may); ``now`` is when an unreadable pod was made
    when its own time cannot be read; ``sharing``: the pools' and nodes' shared GPUs, which
    pods asking slices of one are folded against."""
    sharing = sharing or Sharing()
    reading = Reading()
    times = Times()
    counts: dict[GroupKey, int] = {}
    # per group, the slices asked: (share of a GPU, the sharings that can host it) -> pods
    slices: dict[GroupKey, Counter[tuple[Fraction, tuple[GpuSharing, ...]]]] = {}
    oldest: dict[GroupKey, OldestJobs] = {}
    gangs: dict[str, _Gang] = {}
    bound_members: dict[str, int] = {}

    def add(key: GroupKey, job_id: str, created: float, whole: bool = True) -> None:
        reading.pending += 1
        counts[key] = counts.get(key, 0) + (1 if whole else 0)
        if key in oldest:
            oldest[key].offer(created, job_id)
        else:
            oldest[key] = OldestJobs(created, job_id)

    for obj in pods:
        if not _maybe_pending(obj):
            if rules.group_labels:
                member_of = _gang_of(obj, rules)
                if member_of:
                    bound_members[member_of] = bound_members.get(member_of, 0) + 1
            continue
        try:
            pod = read_pod(obj, rules, times)
        except BadPodError as exc:
            waiting = _unreadable_gpus(obj, rules)
            if waiting is not None and waiting <= MAX_GPUS_PER_NODE:
                reading.said(UNREADABLE, f"pod {ident(obj)}: {exc}")
                key = GroupKey(waiting, None, False, (UNREADABLE_MODEL,), None, 1, None)
                add(key, ident(obj), _created(obj, times, now))
            continue
        if not pod.unschedulable or pod.terminating:
            continue
        if rules.namespaces is not None and pod.namespace not in rules.namespaces:
            continue
        gpus = pod.gpus or pod.other_gpus
        if not gpus:
            continue
        share: Fraction | None = None  # of one GPU, for a pod asking a slice of a shared one
        shared: SharingMode | None = None  # how the GPUs it asks a slice of must be shared
        hosts: tuple[GpuSharing, ...] = ()  # the sharings that can give it its slice
        if not pod.gang and (found := _slice_of(obj, pod, rules)) is not None:
            wanted, pod = found
            shared = wanted.mode
            share, hosts, pod = _share(pod, wanted, sharing, reading)
            if share >= 1:
                gpus, share = math.ceil(share), None
                pod = replace(pod, gpus=gpus)
        if pod.other_resource:
            reading.said(UNKNOWN_RESOURCE, f"pod {pod.id} asks for {pod.other_resource}")
        elif unmet is not None and (why := unmet(pod)) is not None:
            reading.said(UNMET_SELECTOR, f"pod {pod.id} needs {why}, which no pool's nodes carry")
            pod = replace(pod, gpu_models=(one_line(why, MODEL_SHOWN),))
            gpus, share = max(1, gpus if share is None else 1), None
        if gpus > MAX_GPUS_PER_NODE:
            reading.said(TOO_LARGE, f"pod {pod.id}: asks {gpus:,} GPUs of one node")
            continue
        if pod.checkpointing.problem:
            reading.said(
                BAD_CHECKPOINT,
                f"pod {pod.id} counts as not checkpointing: {pod.checkpointing.problem}",
            )
        if pod.gang:
            gangs.setdefault(pod.gang, _Gang()).members.append(pod)
            continue
        if share is not None:
            key = _key(pod, 1, 1, rules.fold_classes, shared)
            slices.setdefault(key, Counter())[(share, hosts)] += 1
            add(key, pod.id, pod.created, whole=False)
            continue
        add(_key(pod, gpus, 1, rules.fold_classes, shared), pod.id, pod.created)
    for name, gang in gangs.items():
        gang.running = bound_members.get(name, 0)
        nodes = len(gang.members)
        size = max((m.gang_size or 0) for m in gang.members)
        if size:
            nodes = max(nodes, size - gang.running)
        if nodes > MAX_JOB_NODES:
            reading.said(TOO_LARGE, f"pod group {name}: {nodes:,} pods at once")
            continue
        first = min(gang.members, key=lambda m: (m.created, m.id))
        per_node = max(m.gpus or m.other_gpus for m in gang.members)
        intervals = [m.spot_safe_interval for m in gang.members]
        key = GroupKey(
            per_node * nodes,
            None if any(i is None for i in intervals) else min(i for i in intervals if i),
            any(m.high_priority for m in gang.members),
            first.gpu_models,
            None,
            nodes,
            first.min_gpu_memory_gib,
            first.team,  # a gang's team and class are its first member's
            first.priority_class if rules.fold_classes else None,
        )
        add(key, name, first.created)
        reading.pending += len(gang.members) - 1
    for key, shares in slices.items():
        asked = [(share, n, hosts) for (share, hosts), n in shares.items()]
        counts[key] = folded_gpus(counts[key], asked)
    reading.groups = groups_from_counts(
        counts,
        {k: v.submitted() for k, v in oldest.items()},
        {k: v.ids() for k, v in oldest.items()},
    )
    return reading


def _slice_of(obj: Any, pod: Pod, rules: PodRules) -> tuple[Slice, Pod] | None:
    """The slice of a shared GPU the pod asks, and the pod with the GPU model its node
    selector names as the pools name it (a shared GPU's product says how it is shared:
    ``A100-SXM4-40GB-MIG-1g.5gb``); None when it asks whole GPUs."""
    needs = pod.needs
    if not pod.gpus:
        spec = obj.get("spec") if isinstance(obj, dict) else None
        try:
            needs = node_needs(spec) if isinstance(spec, dict) else NodeNeeds()
        except BadPodError:
            needs = NodeNeeds()
    wanted = pod_slice(pod.gpus, pod.other_resource, pod.other_gpus, needs)
    if wanted is None:
        return None
    models, memory = wanted_gpus(needs, rules)
    models = tuple(rules.gpu_models.get(product_model(m), product_model(m)) for m in models)
    return wanted, replace(
        pod, gpu_models=models, min_gpu_memory_gib=memory, needs=needs, other_resource=None
    )


def _share(
    pod: Pod, wanted: Slice, sharing: Sharing, reading: Reading
) -> tuple[Fraction, tuple[GpuSharing, ...], Pod]:
    """The share of one GPU the pod's slice is, against the GPUs that offer it, those GPUs'
    sharings (what its slice is folded against), and the pod. Where none does, a whole GPU of
    a model no pool offers (said as ``unshared-gpu-slice``): demand that cannot be met, never
    none; where nothing is known to judge by, a time-slicing pod's replicas are unknown and it
    counts a whole GPU, and no slice is folded (no hosts: a GPU each)."""
    hosts = sharing.hosts(wanted)
    if hosts is not None and not hosts:
        reading.said(
            UNSHARED_SLICE,
            f"pod {pod.id} asks a slice of {wanted.describe()}, which no pool's gpu_sharing "
            "and no on-prem node offers",
        )
        return (
            Fraction(1),
            (),
            replace(pod, gpu_models=(one_line(f"a slice of {wanted.describe()}", MODEL_SHOWN),)),
        )
    replicas = [s.replicas for s in hosts or () if s.mode is SharingMode.TIME_SLICING]
    share = wanted.share(min((r for r in replicas if r), default=None))
    return (share if share is not None else Fraction(1)), tuple(hosts or ()), pod


def _key(
    pod: Pod, gpus: int, nodes: int, fold_classes: bool, shared: SharingMode | None = None
) -> GroupKey:
    """The pod's group; ``shared`` for a pod asking a slice (also one counted whole, as a slice
    of at least a GPU or one nothing offers): such a pod runs only on GPUs shared that way, so
    its group is never one with whole-GPU pods, and only pools that share so are bought for
    it."""
    return GroupKey(
        gpus * nodes,
        pod.spot_safe_interval,
        pod.high_priority,
        pod.gpu_models,
        None,
        nodes,
        pod.min_gpu_memory_gib,
        pod.team,
        pod.priority_class if fold_classes else None,
        shared,
    )


def describe(lines: list[str], shown: int = 3) -> str:
    """Up to ``shown`` of the lines, and how many more."""
    more = len(lines) - shown
    return "; ".join(lines[:shown]) + (f" (and {more} more)" if more > 0 else "")
