"""What one pod says, read from the JSON the API server sent: the GPUs it asks for, the GPU model
its node selector or required node affinity names, whether it is high priority, tolerates the
spot taint, declares checkpoints, belongs to a gang, and what owns it.

A pod is a user's object: a field of the wrong type (a hand-written manifest through a webhook,
an annotation that is not a number) is that pod's problem, so reading it raises ``BadPodError``
with one line, which the caller counts and names in a warning, and the other pods still count.
A checkpoint annotation that cannot be read is milder still: the pod counts, as one that does
not checkpoint (kept off spot), and the line says so.
"""

from __future__ import annotations

import math
import re
import signal
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from autoscaler.sources.class_names import ClassNames
from autoscaler.sources.kubernetes.fit import NodeNeeds, Requirement
from autoscaler.sources.kubernetes.settings import KubernetesSettings
from autoscaler.sources.team_names import TeamNames

Obj = Mapping[str, Any]

MAX_CHECKPOINT_S = 30 * 86_400.0
DEFAULT_SIGNAL = "USR1"
SIGNALS = frozenset(
    s.name.removeprefix("SIG") for s in signal.Signals if s not in (signal.SIGKILL, signal.SIGSTOP)
)
GPU_MEMORY_LABEL = "nvidia.com/gpu.memory"  # GPU feature discovery: MiB per GPU
MIRROR = "kubernetes.io/config.mirror"
JOB_NAME_LABELS = ("batch.kubernetes.io/job-name", "job-name")
JOB_INDEX = "batch.kubernetes.io/job-completion-index"
TERMINAL = frozenset({"Succeeded", "Failed"})
SHOWN = 80
_COUNT = re.compile(r"^[0-9]{1,9}$")
_MIB = re.compile(r"[0-9]{1,9}\Z")  # MiB per GPU: ASCII digits, under a petabyte
_UNPRINTABLE = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")
LINE_MAX = 500


class BadPodError(Exception):
    """A field of one pod we cannot read; the message names it."""


@dataclass(frozen=True)
class PodRules:
    """How pods are read, from the settings (built once)."""

    gpu_resources: tuple[str, ...]
    gpu_models: Mapping[str, str]
    instance_type_models: Mapping[str, str]
    model_labels: tuple[str, ...]
    instance_type_labels: tuple[str, ...]
    high_classes: frozenset[str]
    high_min: int | None
    spot_key: str
    checkpoint_keys: tuple[str, str, str]
    group_labels: tuple[str, ...]
    min_available_keys: tuple[str, ...]
    indexed_jobs_as_gangs: bool
    namespaces: frozenset[str] | None = None
    team_label: str | None = None  # None: the namespace names the team
    team_names: TeamNames = field(
        default_factory=lambda: TeamNames("kubernetes", "namespace"), compare=False
    )
    class_names: ClassNames = field(
        default_factory=lambda: ClassNames("kubernetes", "spec.priorityClassName"), compare=False
    )
    fold_classes: bool = False  # whether demand folds per priority class (FoldsPriorityClasses)

    @classmethod
    def of(cls, settings: KubernetesSettings, where: str = "kubernetes") -> PodRules:
        return cls(
            gpu_resources=settings.gpu_resources,
            gpu_models=dict(settings.gpu_models),
            instance_type_models=dict(settings.instance_type_gpu_models),
            model_labels=tuple(settings.gpu_model_labels),
            instance_type_labels=tuple(settings.instance_type_labels),
            high_classes=frozenset(settings.high_priority_classes),
            high_min=settings.high_priority_min,
            spot_key=settings.spot_toleration_key,
            checkpoint_keys=(
                settings.annotation("checkpoint_interval"),
                settings.annotation("checkpoint_duration"),
                settings.annotation("checkpoint_signal"),
            ),
            group_labels=tuple(settings.pod_group_labels),
            min_available_keys=tuple(settings.min_available_keys),
            indexed_jobs_as_gangs=settings.indexed_jobs_as_gangs,
            namespaces=frozenset(settings.namespaces) if settings.namespaces else None,
            team_label=settings.team_label,
            team_names=TeamNames(
                where,
                f"label {settings.team_label}" if settings.team_label else "namespace",
            ),
            class_names=ClassNames(where, "spec.priorityClassName"),
        )


@dataclass(frozen=True)
class Checkpointing:
    """What a pod's annotations declare; ``signal`` None: it cannot be asked to checkpoint."""

    interval_s: float | None = None
    duration_s: float | None = None
    signal: str | None = None
    problem: str | None = None


@dataclass(frozen=True)
class Pod:
    """One pod, reduced to what demand, nodes and the actions read."""

    namespace: str
    name: str
    uid: str
    phase: str
    node: str | None
    terminating: bool
    unschedulable: bool
    gpus: int
    created: float
    started: float | None = None
    other_resource: str | None = None  # a GPU-like resource no setting counts, when gpus == 0
    other_gpus: int = 0
    gpu_models: tuple[str, ...] = ()
    min_gpu_memory_gib: float | None = None
    high_priority: bool = False
    tolerates_spot: bool = False
    checkpointing: Checkpointing = field(default_factory=Checkpointing)
    gang: str | None = None
    gang_size: int | None = None
    owner_kind: str | None = None
    mirror: bool = False
    needs: NodeNeeds = field(default_factory=NodeNeeds)
    team: str | None = None
    priority_class: str | None = None  # spec.priorityClassName

    @property
    def id(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def finished(self) -> bool:
        return self.phase in TERMINAL

    @property
    def daemon(self) -> bool:
        """Left in place by a drain, as ``kubectl drain --ignore-daemonsets`` leaves it."""
        return self.owner_kind == "DaemonSet" or self.mirror

    @property
    def spot_safe_interval(self) -> float | None:
        """The interval demand is planned with: none unless the pod may also run on spot."""
        return self.checkpointing.interval_s if self.tolerates_spot else None


class Times:
    """RFC 3339 times read once each: a tick's pods share a few thousand distinct seconds."""

    def __init__(self) -> None:
        self._seen: dict[str, float] = {}

    def __call__(self, text: Any, name: str) -> float:
        if not isinstance(text, str):
            raise BadPodError(f"{name} {shown(text)} is not a time")
        found = self._seen.get(text)
        if found is None:
            try:
                moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
            except ValueError:
                raise BadPodError(f"{name} {shown(text)} is not an RFC 3339 time") from None
            if moment.tzinfo is None:
                raise BadPodError(f"{name} {shown(text)} has no time zone")
            found = self._seen[text] = moment.timestamp()
        return found


def one_line(text: str, limit: int = LINE_MAX) -> str:
    """``text`` fit for one line of a log or a metric's reason: control characters and line
    breaks shown as ``?`` (a name the API server would refuse, but a problem line must hold
    whatever came), cut at ``limit`` characters."""
    cleaned = _UNPRINTABLE.sub("?", text)
    return cleaned if len(cleaned) <= limit else cleaned[: limit - 3] + "..."


def shown(value: Any) -> str:
    """A value as one short line for a warning, whatever it holds."""
    if isinstance(value, str):
        text = repr(value[: SHOWN + 1])
        return text if len(value) <= SHOWN else text[:-1] + "..." + text[-1]
    if isinstance(value, bool | int | float) or value is None:
        return repr(value)[:SHOWN]
    return f"a JSON {'object' if isinstance(value, dict) else type(value).__name__}"


def ident(obj: Any) -> str:
    """``namespace/name`` of a pod for a message, whatever its metadata holds."""
    meta = obj.get("metadata") if isinstance(obj, dict) else None
    if not isinstance(meta, dict):
        return "?"
    namespace, name = meta.get("namespace"), meta.get("name")
    if isinstance(namespace, str) and isinstance(name, str):
        return f"{namespace[:63]}/{name[:253]}"
    return "?"


def as_mapping(value: Any, name: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise BadPodError(f"{name} is {shown(value)}, not an object")
    return value


def as_list(value: Any, name: str) -> Sequence[Any]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise BadPodError(f"{name} is {shown(value)}, not a list")
    return value


def as_strings(value: Any, name: str) -> Mapping[str, str]:
    found = as_mapping(value, name)
    for key, text in found.items():
        if not isinstance(text, str):
            raise BadPodError(f"{name}[{shown(key)}] is {shown(text)}, not a string")
    return found


def as_count(value: Any, name: str) -> int:
    """An extended resource's quantity: a whole number (the API refuses fractions of one)."""
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 10**9:
        return value
    if isinstance(value, str) and _COUNT.match(value):
        return int(value)
    raise BadPodError(f"{name} {shown(value)} is not a whole number")


def _gpu_like(resource: str) -> bool:
    """An extended resource that names a GPU without being one we count (``amd.com/gpu``,
    ``nvidia.com/mig-1g.10gb`` when MIG is not configured)."""
    lowered = resource.lower()
    return "/" in lowered and ("gpu" in lowered or lowered.startswith("nvidia.com/"))


def resource_totals(spec: Obj, wanted: Callable[[str], bool]) -> dict[str, int]:
    """The units of each ``wanted`` resource a pod asks, as the scheduler sums them: requests,
    else limits (the API copies limits to requests for extended resources); the containers'
    sum or the largest init container's, whichever is more."""
    totals: dict[str, int] = {}
    for kind, combine in (("containers", False), ("initContainers", True)):
        for index, container in enumerate(as_list(spec.get(kind), f"spec.{kind}")):
            where = f"spec.{kind}[{index}].resources"
            resources = as_mapping(
                as_mapping(container, f"spec.{kind}[{index}]").get("resources"), where
            )
            asked = {
                **as_mapping(resources.get("limits"), f"{where}.limits"),
                **as_mapping(resources.get("requests"), f"{where}.requests"),
            }
            for resource, quantity in asked.items():
                if wanted(resource):
                    count = as_count(quantity, f"{where} {resource}")
                    previous = totals.get(resource, 0)
                    totals[resource] = max(previous, count) if combine else previous + count
    return totals


def requested(spec: Obj, rules: PodRules) -> tuple[int, str | None, int]:
    """(GPUs of the counted resources, a GPU-like resource nobody counts, its quantity) the pod
    asks for (``resource_totals``)."""
    totals = resource_totals(spec, lambda r: r in rules.gpu_resources or _gpu_like(r))
    gpus = sum(totals.get(r, 0) for r in rules.gpu_resources)
    if gpus:
        return gpus, None, 0
    others = sorted((r, n) for r, n in totals.items() if n and r not in rules.gpu_resources)
    if others:
        return 0, others[0][0], others[0][1]
    return 0, None, 0


def _model(key: str, value: str, rules: PodRules) -> str | None:
    if key in rules.model_labels:
        return rules.gpu_models.get(value, value)
    if key in rules.instance_type_labels:
        return rules.instance_type_models.get(value, value)
    return None


def wanted_gpus(needs: NodeNeeds, rules: PodRules) -> tuple[tuple[str, ...], float | None]:
    """The GPU models a pod's node must have (any when empty) and the least GPU memory, from its
    ``nodeSelector`` and else its required node affinity (any of its terms)."""
    selector = dict(needs.selector)
    memory = gpu_memory_gib(selector.get(GPU_MEMORY_LABEL))
    for key, value in needs.selector:
        model = _model(key, value, rules)
        if model:
            return (model,), memory
    models: set[str] = set()
    for term in needs.terms:
        narrowed: set[str] | None = None
        for label, operator, values in term:
            if label == GPU_MEMORY_LABEL and operator == "Gt" and len(values) == 1:
                floor = gpu_memory_gib(str(int(values[0]) + 1)) if _MIB.match(values[0]) else None
                memory = max(memory or 0.0, floor or 0.0) or None
            if operator != "In":
                continue
            mapped = {m for v in values if (m := _model(label, v, rules))}
            if mapped:
                narrowed = mapped if narrowed is None else narrowed & mapped
        if narrowed is None:
            return (), memory  # a term that admits any model: the pod accepts any
        models |= narrowed
    return tuple(sorted(models)), memory


def node_needs(spec: Obj) -> NodeNeeds:
    """The pod's ``nodeSelector`` and the terms of its required node affinity, as the
    scheduler reads them (``matchFields`` name a node, which any pool's node may be)."""
    selector = as_strings(spec.get("nodeSelector"), "spec.nodeSelector")
    affinity = as_mapping(spec.get("affinity"), "spec.affinity")
    node_affinity = as_mapping(affinity.get("nodeAffinity"), "spec.affinity.nodeAffinity")
    required = as_mapping(
        node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution"),
        "nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution",
    )
    terms: list[tuple[Requirement, ...]] = []
    for index, term in enumerate(as_list(required.get("nodeSelectorTerms"), "nodeSelectorTerms")):
        found: list[Requirement] = []
        expressions = as_mapping(term, f"nodeSelectorTerms[{index}]").get("matchExpressions")
        for expression in as_list(expressions, f"nodeSelectorTerms[{index}].matchExpressions"):
            read = as_mapping(expression, "a matchExpression")
            key, operator = read.get("key"), read.get("operator")
            values = as_list(read.get("values"), "a matchExpression's values")
            if not (isinstance(key, str) and isinstance(operator, str)) or not all(
                isinstance(v, str) for v in values
            ):
                raise BadPodError(f"nodeSelectorTerms[{index}]: a matchExpression is malformed")
            found.append((key, operator, tuple(values)))
        terms.append(tuple(found))
    return NodeNeeds(tuple(sorted(selector.items())), tuple(terms))


def gpu_memory_gib(text: str | None) -> float | None:
    """GiB per GPU from GPU feature discovery's ``nvidia.com/gpu.memory`` (MiB)."""
    if text and _MIB.match(text) and int(text) > 0:
        return int(text) / 1024
    return None


def tolerates(tolerations: Sequence[Any], key: str) -> bool:
    """Whether the tolerations let a pod onto a node tainted ``key=true:NoSchedule``."""
    for index, item in enumerate(tolerations):
        toleration = as_mapping(item, f"spec.tolerations[{index}]")
        effect = toleration.get("effect")
        if effect not in (None, "", "NoSchedule"):
            continue
        operator = toleration.get("operator") or "Equal"
        found = toleration.get("key")
        if operator == "Exists" and (not found or found == key):
            return True
        if operator == "Equal" and found == key and toleration.get("value", "") == "true":
            return True
    return False


def checkpointing(annotations: Mapping[str, str], keys: tuple[str, str, str]) -> Checkpointing:
    """The checkpoint declaration in a pod's annotations: the Slurm comment's keys (interval and
    duration in seconds, the signal a sidecar delivers), with its defaults: an interval without a
    signal is asked with USR1, ``none`` cannot be asked. A value that cannot be read counts as
    not declared, and ``problem`` says which."""
    interval_key, duration_key, signal_key = keys
    problems: list[str] = []

    def seconds(key: str, least: float, inclusive: bool) -> float | None:
        text = annotations.get(key)
        if text is None:
            return None
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        ok = math.isfinite(value) and (value >= least if inclusive else value > least)
        if not ok or value > MAX_CHECKPOINT_S:
            problems.append(f"{key} {shown(text)} is not a number of seconds up to 30 days")
            return None
        return value

    interval = seconds(interval_key, 0.0, inclusive=False)
    duration = seconds(duration_key, 0.0, inclusive=True)
    text = annotations.get(signal_key)
    if text is None:
        asked_by = DEFAULT_SIGNAL if interval is not None else None
    else:
        name = text.upper().removeprefix("SIG")
        asked_by = name if name in SIGNALS else None
        if asked_by is None and text.lower() != "none":
            problems.append(f"{signal_key} {shown(text)} is not a signal name")
    problem = "; ".join(problems) or None
    if interval is None and asked_by is None:
        return Checkpointing(problem=problem)
    return Checkpointing(interval, duration, asked_by, problem)


def _high(spec: Obj, rules: PodRules) -> bool:
    priority = spec.get("priority")
    if priority is not None and (not isinstance(priority, int) or isinstance(priority, bool)):
        raise BadPodError(f"spec.priority {shown(priority)} is not an integer")
    if rules.high_min is not None and priority is not None and priority >= rules.high_min:
        return True
    name = spec.get("priorityClassName")
    if name is not None and not isinstance(name, str):
        raise BadPodError(f"spec.priorityClassName {shown(name)} is not a string")
    return name in rules.high_classes


def _gang(
    namespace: str, labels: Mapping[str, str], annotations: Mapping[str, str], rules: PodRules
) -> tuple[str | None, int | None]:
    for key in rules.group_labels:
        group = labels.get(key)
        if group:
            size = None
            for size_key in rules.min_available_keys:
                text = labels.get(size_key) or annotations.get(size_key)
                if text is not None:
                    if not _COUNT.match(text) or int(text) < 1:
                        raise BadPodError(f"{size_key} {shown(text)} is not a pod count")
                    size = int(text)
                    break
            return f"{namespace}/{group}", size
    if rules.indexed_jobs_as_gangs and (JOB_INDEX in labels or JOB_INDEX in annotations):
        job = next((labels[k] for k in JOB_NAME_LABELS if labels.get(k)), None)
        if job:
            return f"{namespace}/job/{job}", None
    return None, None


def _owner(meta: Obj) -> str | None:
    for index, item in enumerate(as_list(meta.get("ownerReferences"), "metadata.ownerReferences")):
        owner = as_mapping(item, f"metadata.ownerReferences[{index}]")
        if owner.get("controller") is True:
            kind = owner.get("kind")
            return kind if isinstance(kind, str) else "?"
    return None


def unschedulable_status(status: Obj) -> bool:
    for item in as_list(status.get("conditions"), "status.conditions"):
        condition = as_mapping(item, "a status condition")
        if condition.get("type") == "PodScheduled":
            return condition.get("status") == "False" and condition.get("reason") == "Unschedulable"
    return False


def read_pod(obj: Any, rules: PodRules, times: Times) -> Pod:
    """One pod's facts; ``BadPodError`` for a field that cannot be read."""
    if not isinstance(obj, dict):
        raise BadPodError(f"is {shown(obj)}, not an object")
    meta = as_mapping(obj.get("metadata"), "metadata")
    spec = as_mapping(obj.get("spec"), "spec")
    status = as_mapping(obj.get("status"), "status")
    namespace, name, uid = meta.get("namespace"), meta.get("name"), meta.get("uid", "")
    if not isinstance(namespace, str) or not isinstance(name, str) or not isinstance(uid, str):
        raise BadPodError("metadata has no namespace and name")
    labels = as_strings(meta.get("labels"), "metadata.labels")
    annotations = as_strings(meta.get("annotations"), "metadata.annotations")
    phase = status.get("phase") or "Pending"
    node = spec.get("nodeName") or None
    if not isinstance(phase, str) or not (node is None or isinstance(node, str)):
        raise BadPodError("status.phase or spec.nodeName is not a string")
    gpus, other, other_gpus = requested(spec, rules)
    needs = NodeNeeds()
    if gpus:
        needs = node_needs(spec)
        models, memory = wanted_gpus(needs, rules)
    else:  # no GPU counted: a GPU-like resource nobody counts is a model no pool offers
        models, memory = ((other,) if other else ()), None
    started = status.get("startTime")
    gang, size = _gang(namespace, labels, annotations, rules)
    return Pod(
        namespace=namespace,
        name=name,
        uid=uid,
        phase=phase,
        node=node,
        terminating=bool(meta.get("deletionTimestamp")),
        # a pod nominated to a node waits for the pods it preempts there to leave, not for one
        unschedulable=node is None
        and phase == "Pending"
        and not status.get("nominatedNodeName")
        and unschedulable_status(status),
        gpus=gpus,
        created=times(meta.get("creationTimestamp"), "metadata.creationTimestamp"),
        started=times(started, "status.startTime") if started else None,
        other_resource=other,
        other_gpus=other_gpus,
        gpu_models=models,
        min_gpu_memory_gib=memory,
        high_priority=_high(spec, rules),
        tolerates_spot=tolerates(
            as_list(spec.get("tolerations"), "spec.tolerations"), rules.spot_key
        ),
        checkpointing=checkpointing(annotations, rules.checkpoint_keys),
        gang=gang,
        gang_size=size,
        owner_kind=_owner(meta),
        needs=needs,
        mirror=MIRROR in annotations,
        team=rules.team_names(labels.get(rules.team_label) if rules.team_label else namespace),
        priority_class=rules.class_names(spec.get("priorityClassName")),
    )
