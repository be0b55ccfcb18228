"""A cluster's moving parts on top of the API emulator (``k8s_api_emulator``): objects as the
real API holds them, a tiny scheduler, the kubelet's start and finish of a pod, and a Job
controller that recreates a Job's deleted pod.

The scheduler binds what the real one would for the fields the ``kubernetes`` source reads:
extended resources against allocatable minus what bound pods request, ``nodeSelector``, required
node affinity (``In``, ``NotIn``, ``Exists``, ``DoesNotExist``), ``NoSchedule``/``NoExecute``
taints against tolerations, cordoned and not-Ready nodes, and the coscheduling plugin's pod
groups all or nothing. A pod it cannot place gets the condition the real one writes:
``PodScheduled=False``, reason ``Unschedulable``.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from k8s_api_emulator import K8sApi, rfc3339

GPU = "nvidia.com/gpu"
SPOT_TAINT_KEY = "gpu-autoscaler.io/spot"
POD_GROUP = "scheduling.x-k8s.io/pod-group"
TERMINAL = ("Succeeded", "Failed")

Obj = dict[str, Any]


def spot_toleration() -> Obj:
    return {"key": SPOT_TAINT_KEY, "operator": "Equal", "value": "true", "effect": "NoSchedule"}


def pod(
    name: str,
    namespace: str = "default",
    gpus: int | str = 0,
    *,
    resource: str = GPU,
    labels: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
    node_selector: Mapping[str, str] | None = None,
    affinity: Obj | None = None,
    tolerations: Sequence[Obj] = (),
    priority_class: str | None = None,
    priority: int | None = None,
    owner: Obj | None = None,
    created: float | None = None,
    containers: int = 1,
    limits_only: bool = False,
    init_gpus: int | None = None,
) -> Obj:
    """A pod as the API holds it after creation: ``Pending``, not yet tried by the scheduler.
    ``gpus`` go on the first container (``containers`` of them), as requests and limits."""
    requests = {resource: str(gpus)} if gpus else {}
    resources: Obj = {"limits": dict(requests)}
    if not limits_only:
        resources["requests"] = {"cpu": "1", **requests}
    spec: Obj = {
        "containers": [
            {"name": f"c{i}", "image": "trainer:1", "resources": resources if i == 0 else {}}
            for i in range(containers)
        ],
        "restartPolicy": "Never",
        "schedulerName": "default-scheduler",
        "terminationGracePeriodSeconds": 30,
    }
    if init_gpus is not None:
        spec["initContainers"] = [
            {
                "name": "init",
                "image": "setup:1",
                "resources": {"limits": {resource: str(init_gpus)}},
            }
        ]
    if node_selector:
        spec["nodeSelector"] = dict(node_selector)
    if affinity:
        spec["affinity"] = affinity
    if tolerations:
        spec["tolerations"] = list(tolerations)
    if priority_class is not None:
        spec["priorityClassName"] = priority_class
    if priority is not None:
        spec["priority"] = priority
    meta: Obj = {"name": name, "namespace": namespace, "labels": dict(labels or {})}
    if annotations:
        meta["annotations"] = dict(annotations)
    if owner:
        meta["ownerReferences"] = [owner]
    if created is not None:
        meta["creationTimestamp"] = rfc3339(created)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta,
        "spec": spec,
        "status": {"phase": "Pending", "qosClass": "Burstable"},
    }


def node(
    name: str,
    gpus: int = 0,
    *,
    resource: str = GPU,
    labels: Mapping[str, str] | None = None,
    taints: Sequence[Obj] = (),
    provider_id: str | None = None,
    unschedulable: bool = False,
    ready: bool = True,
) -> Obj:
    capacity = {"cpu": "96", "memory": "1000Gi", "pods": "110"}
    if gpus:
        capacity[resource] = str(gpus)
    spec: Obj = {}
    if provider_id:
        spec["providerID"] = provider_id
    if taints:
        spec["taints"] = list(taints)
    if unschedulable:
        spec["unschedulable"] = True
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {"kubernetes.io/hostname": name, **dict(labels or {})},
        },
        "spec": spec,
        "status": {
            "capacity": capacity,
            "allocatable": dict(capacity),
            "conditions": [
                {"type": "Ready", "status": "True" if ready else "False", "reason": "KubeletReady"}
            ],
        },
    }


def spot_taint() -> Obj:
    return {"key": SPOT_TAINT_KEY, "value": "true", "effect": "NoSchedule"}


def pdb(
    name: str,
    namespace: str,
    match_labels: Mapping[str, str],
    *,
    min_available: int | str | None = None,
    max_unavailable: int | str | None = None,
) -> Obj:
    spec: Obj = {"selector": {"matchLabels": dict(match_labels)}}
    if min_available is not None:
        spec["minAvailable"] = min_available
    if max_unavailable is not None:
        spec["maxUnavailable"] = max_unavailable
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }


def daemonset_owner(name: str = "nvidia-device-plugin") -> Obj:
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "name": name,
        "uid": secrets.token_hex(8),
        "controller": True,
    }


# -- the kubelet ---------------------------------------------------------------------------------


def bind(api: K8sApi, name: str, namespace: str, node_name: str) -> Obj:
    """The scheduler's binding and the kubelet's start: on the node, Running and Ready."""

    def start(p: Obj) -> None:
        p["spec"]["nodeName"] = node_name
        p["status"] = {
            "phase": "Running",
            "startTime": rfc3339(),
            "qosClass": p.get("status", {}).get("qosClass", "Burstable"),
            "conditions": [
                {"type": "PodScheduled", "status": "True"},
                {"type": "Initialized", "status": "True"},
                {"type": "ContainersReady", "status": "True"},
                {"type": "Ready", "status": "True"},
            ],
        }

    return api.mutate("pods", name, start, namespace)


def finish(api: K8sApi, name: str, namespace: str = "default", phase: str = "Succeeded") -> Obj:
    """The pod's containers exited: Succeeded (or Failed), no longer Ready."""

    def done(p: Obj) -> None:
        p["status"]["phase"] = phase
        for condition in p["status"].get("conditions", []):
            if condition["type"] in ("Ready", "ContainersReady"):
                condition["status"] = "False"
                condition["reason"] = "PodCompleted"

    return api.mutate("pods", name, done, namespace)


# -- the scheduler -------------------------------------------------------------------------------


def _requests(p: Obj) -> dict[str, int]:
    """Extended resources a pod asks for (requests, else limits; the larger of the containers'
    sum and any init container's), as whole numbers."""
    spec = p["spec"]

    def of(container: Obj) -> dict[str, int]:
        resources = container.get("resources") or {}
        found = {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
        return {k: int(v) for k, v in found.items() if "/" in k}

    total: dict[str, int] = {}
    for container in spec.get("containers") or []:
        for key, value in of(container).items():
            total[key] = total.get(key, 0) + value
    for container in spec.get("initContainers") or []:
        for key, value in of(container).items():
            total[key] = max(total.get(key, 0), value)
    return total


def _tolerates(tolerations: Iterable[Obj], taint: Obj) -> bool:
    for toleration in tolerations:
        effect = toleration.get("effect")
        if effect and effect != taint.get("effect"):
            continue
        key = toleration.get("key")
        if toleration.get("operator") == "Exists":
            if not key or key == taint["key"]:
                return True
        elif key == taint["key"] and toleration.get("value", "") == taint.get("value", ""):
            return True
    return False


def _affinity_ok(p: Obj, labels: Mapping[str, str]) -> bool:
    required = ((p["spec"].get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    ) or {}
    terms = required.get("nodeSelectorTerms") or []
    if not terms:
        return True
    for term in terms:
        ok = True
        for expression in term.get("matchExpressions") or []:
            key, op, values = expression["key"], expression["operator"], expression.get("values")
            if op == "In":
                ok = ok and labels.get(key) in (values or [])
            elif op == "NotIn":
                ok = ok and labels.get(key) not in (values or [])
            elif op == "Exists":
                ok = ok and key in labels
            elif op == "DoesNotExist":
                ok = ok and key not in labels
            else:
                ok = False
        if ok:
            return True
    return False


def _why_not(p: Obj, n: Obj, free: Mapping[str, int]) -> str | None:
    """Why pod ``p`` does not fit node ``n`` now, or None when it does."""
    spec, labels = n.get("spec") or {}, n["metadata"].get("labels") or {}
    tolerations = p["spec"].get("tolerations") or []
    if spec.get("unschedulable"):
        return "node(s) were unschedulable"
    ready = any(
        c["type"] == "Ready" and c["status"] == "True" for c in n["status"].get("conditions", [])
    )
    if not ready:
        return "node(s) were not ready"
    for taint in spec.get("taints") or []:
        if taint.get("effect") in ("NoSchedule", "NoExecute") and not _tolerates(
            tolerations, taint
        ):
            return f"node(s) had untolerated taint {{{taint['key']}: {taint.get('value', '')}}}"
    for key, value in (p["spec"].get("nodeSelector") or {}).items():
        if labels.get(key) != value:
            return "node(s) didn't match Pod's node affinity/selector"
    if not _affinity_ok(p, labels):
        return "node(s) didn't match Pod's node affinity/selector"
    for resource, wanted in _requests(p).items():
        if free.get(resource, 0) < wanted:
            return f"Insufficient {resource}"
    return None


def _free(api: K8sApi) -> dict[str, dict[str, int]]:
    free: dict[str, dict[str, int]] = {}
    for n in api.items("nodes"):
        allocatable = n["status"].get("allocatable") or {}
        free[n["metadata"]["name"]] = {k: int(v) for k, v in allocatable.items() if "/" in k}
    for p in api.items("pods"):
        where = p["spec"].get("nodeName")
        if where in free and p["status"].get("phase") not in TERMINAL:
            for resource, used in _requests(p).items():
                free[where][resource] = free[where].get(resource, 0) - used
    return free


def _unschedulable(api: K8sApi, p: Obj, message: str) -> None:
    condition = {
        "type": "PodScheduled",
        "status": "False",
        "reason": "Unschedulable",
        "message": message,
    }
    current = [c for c in p["status"].get("conditions", []) if c["type"] == "PodScheduled"]
    if current and {k: current[0].get(k) for k in condition} == condition:
        return

    def mark(q: Obj) -> None:
        others = [c for c in q["status"].get("conditions", []) if c["type"] != "PodScheduled"]
        q["status"]["conditions"] = [*others, {**condition, "lastTransitionTime": rfc3339()}]

    api.mutate("pods", p["metadata"]["name"], mark, p["metadata"]["namespace"])


def schedule(api: K8sApi) -> list[str]:
    """One scheduling pass over every pending pod (higher priority first, then oldest): binds
    each that fits a node (first fit by node name; a pod group all or nothing) and marks the
    rest Unschedulable. Returns ``namespace/name`` of the pods bound."""
    nodes = {n["metadata"]["name"]: n for n in api.items("nodes")}
    free = _free(api)
    pending = [
        p
        for p in api.items("pods")
        if p["status"].get("phase") == "Pending"
        and not p["spec"].get("nodeName")
        and not p["metadata"].get("deletionTimestamp")
    ]
    pending.sort(
        key=lambda p: (-(p["spec"].get("priority") or 0), p["metadata"]["creationTimestamp"])
    )
    units: dict[str, list[Obj]] = {}
    for p in pending:
        group = (p["metadata"].get("labels") or {}).get(POD_GROUP)
        key = f"{p['metadata']['namespace']}/{group}" if group else _ident(p)
        units.setdefault(key, []).append(p)
    bound: list[str] = []
    for members in units.values():
        trial = {name: dict(values) for name, values in free.items()}
        placed: list[tuple[Obj, str]] = []
        reasons: dict[str, int] = {}
        for p in members:
            target = None
            for name in sorted(nodes):
                why = _why_not(p, nodes[name], trial[name])
                if why is None:
                    target = name
                    break
                reasons[why] = reasons.get(why, 0) + 1
            if target is None:
                break
            for resource, used in _requests(p).items():
                trial[target][resource] = trial[target].get(resource, 0) - used
            placed.append((p, target))
        if len(placed) == len(members):
            free = trial
            for p, target in placed:
                bind(api, p["metadata"]["name"], p["metadata"]["namespace"], target)
                bound.append(_ident(p))
            continue
        said = ", ".join(f"{count} {why}" for why, count in sorted(reasons.items()))
        message = f"0/{len(nodes)} nodes are available: {said or 'no nodes'}."
        for p in members:
            _unschedulable(api, p, message)
    return bound


def _ident(p: Obj) -> str:
    return f"{p['metadata']['namespace']}/{p['metadata']['name']}"


# -- the Job controller --------------------------------------------------------------------------


class JobController:
    """Creates a Job's pods and, when one is deleted before it finished, a new one in its place
    (same template and completion index, a new name), as the real Job controller does."""

    def __init__(self, api: K8sApi) -> None:
        self.api = api
        self.recreated: list[str] = []
        api.on_pod_deleted.append(self._pod_deleted)

    def add_job(
        self,
        name: str,
        template: Obj,
        *,
        namespace: str = "default",
        parallelism: int = 1,
        indexed: bool = False,
    ) -> Obj:
        spec: Obj = {"parallelism": parallelism, "completions": parallelism}
        if indexed:
            spec["completionMode"] = "Indexed"
        job = self.api.put(
            "jobs",
            {
                "apiVersion": "batch/v1",
                "kind": "Job",
                "metadata": {"name": name, "namespace": namespace},
                "spec": spec,
                "template": template,
            },
        )
        for index in range(parallelism):
            self._create_pod(job, index)
        return job

    def _create_pod(self, job: Obj, index: int) -> Obj:
        meta = job["metadata"]
        created = pod(f"{meta['name']}-{index}-{secrets.token_hex(3)[:5]}", meta["namespace"])
        template = job["template"]
        created["spec"] = {**created["spec"], **template.get("spec", {})}
        labels = {
            **(template.get("metadata", {}).get("labels") or {}),
            "job-name": meta["name"],
            "batch.kubernetes.io/job-name": meta["name"],
            "controller-uid": meta["uid"],
        }
        annotations = dict(template.get("metadata", {}).get("annotations") or {})
        if job["spec"].get("completionMode") == "Indexed":
            labels["batch.kubernetes.io/job-completion-index"] = str(index)
            annotations["batch.kubernetes.io/job-completion-index"] = str(index)
        created["metadata"]["labels"] = labels
        created["metadata"]["annotations"] = annotations
        created["metadata"]["ownerReferences"] = [
            {
                "apiVersion": "batch/v1",
                "kind": "Job",
                "name": meta["name"],
                "uid": meta["uid"],
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ]
        return self.api.put("pods", created)

    def _pod_deleted(self, gone: Obj) -> None:
        owners = gone["metadata"].get("ownerReferences") or []
        owner = next((o for o in owners if o.get("kind") == "Job" and o.get("controller")), None)
        if owner is None or gone["status"].get("phase") in TERMINAL:
            return
        job = self.api.get("jobs", owner["name"], gone["metadata"]["namespace"])
        if job is None or job["metadata"]["uid"] != owner["uid"]:
            return
        index = int(
            (gone["metadata"].get("annotations") or {}).get(
                "batch.kubernetes.io/job-completion-index", "0"
            )
        )
        made = self._create_pod(job, index)
        self.recreated.append(f"{made['metadata']['namespace']}/{made['metadata']['name']}")


def wait_for(condition: Any, timeout_s: float, interval_s: float = 0.05) -> bool:
    """Poll ``condition`` until true or ``timeout_s`` passes; returns whether it became true."""
    give_up = time.monotonic() + timeout_s
    while time.monotonic() < give_up:
        if condition():
            return True
        time.sleep(interval_s)
    return bool(condition())


def tried(p: Obj, message: str = "0/0 nodes are available.") -> Obj:
    """``p`` as the scheduler leaves a pod it found no node for (before it is stored)."""
    p["status"]["conditions"] = [
        {
            "type": "PodScheduled",
            "status": "False",
            "reason": "Unschedulable",
            "message": message,
            "lastTransitionTime": rfc3339(),
        }
    ]
    return p
