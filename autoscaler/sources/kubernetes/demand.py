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
* ``too-large``: more GPUs on one node, or more pods at once, than any node or job can hold.

A checkpoint annotation that cannot be read (``bad-checkpoint-annotation``) leaves the pod as
demand that can be met, as one that does not checkpoint (kept off spot): a typo in an
annotation costs the pod spot's discount, not its GPUs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from autoscaler.model import DemandGroup
from autoscaler.sources.kubernetes.pods import (
    BadPodError,
    Pod,
    PodRules,
    Times,
    ident,
    one_line,
    read_pod,
    requested,
    unschedulable_status,
)
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
PROBLEMS = (UNREADABLE, UNKNOWN_RESOURCE, UNMET_SELECTOR, TOO_LARGE, BAD_CHECKPOINT)

Unmet = Callable[[Pod], str | None]


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
    pods: Iterable[Any], rules: PodRules, unmet: Unmet | None = None, now: float = 0.0
) -> Reading:
    """Fold the pods of one list into demand groups; ``unmet`` says why no pool's node can
    meet a pod's node selector (None: one may); ``now`` is when an unreadable pod was made
    when its own time cannot be read."""
    reading = Reading()
    times = Times()
    counts: dict[GroupKey, int] = {}
    oldest: dict[GroupKey, OldestJobs] = {}
    gangs: dict[str, _Gang] = {}
    bound_members: dict[str, int] = {}

    def add(key: GroupKey, job_id: str, created: float) -> None:
        reading.pending += 1
        if key in counts:
            counts[key] += 1
            oldest[key].offer(created, job_id)
        else:
            counts[key] = 1
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
        if pod.other_resource:
            reading.said(UNKNOWN_RESOURCE, f"pod {pod.id} asks for {pod.other_resource}")
        elif unmet is not None and (why := unmet(pod)) is not None:
            reading.said(UNMET_SELECTOR, f"pod {pod.id} needs {why}, which no pool's nodes carry")
            pod = replace(pod, gpu_models=(one_line(why, MODEL_SHOWN),))
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
        add(_key(pod, gpus, 1, rules.fold_classes), pod.id, pod.created)
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
    reading.groups = groups_from_counts(
        counts,
        {k: v.submitted() for k, v in oldest.items()},
        {k: v.ids() for k, v in oldest.items()},
    )
    return reading


def _key(pod: Pod, gpus: int, nodes: int, fold_classes: bool) -> GroupKey:
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
    )


def describe(lines: list[str], shown: int = 3) -> str:
    """Up to ``shown`` of the lines, and how many more."""
    more = len(lines) - shown
    return "; ".join(lines[:shown]) + (f" (and {more} more)" if more > 0 else "")
