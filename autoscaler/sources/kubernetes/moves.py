"""Moving a pod off a node to make room there for a pending pod (``MovesJobsOff``), and keeping
that room for it: the Kubernetes side of reclaim, preemption and on-prem rebalancing.

**The move.** The pod is deleted under its uid precondition, as ``requeue`` does, and its
controller (a Job) makes a new one in its place. A bare pod or a DaemonSet's is never moved:
nothing would bring it back, or it would come back on the same node.

**The hold.** Kubernetes has no per-pod "not on this node" that can be set on a pod its Job has
not made yet, so the room is kept on the node's side: before the pod is deleted, the node gets
the taint ``gpu-autoscaler.io/held-for=<node token>:NoSchedule`` and the pod the room is for
(the owner) a matching toleration. The recreated pod, and every other pending pod, stay off the
node; the owner may land there. Running pods are not touched (``NoSchedule`` never evicts).

* One taint per node, whatever the number of holds on it: the API server refuses two taints
  with one key and effect (its node validation: "taints must be unique by key and effect
  pair"), and a pod must tolerate *every* ``NoSchedule`` taint of a node, so a
  taint per owner would keep each owner off the node the other's hold is on. Its value is a
  token of the node (its name where that is a valid label value, else a hash), so an owner's
  toleration opens this node only, not every node held.
* The toleration is added to the owner pod's ``spec.tolerations``: a pod's spec is immutable
  but for a few fields, and ``spec.tolerations`` takes additions (never removals or changes,
  ``tolerationSeconds`` aside): the API server's pod update validation, in its words "pod
  updates may not change fields other than ... ``spec.tolerations`` (only additions to existing
  tolerations)" (https://kubernetes.io/docs/concepts/workloads/pods/#pod-update-and-replacement:
  "For spec.tolerations, you can only add new entries"). Tolerations have no patch merge
  key, so the whole list is written, under the resourceVersion it was read at.
* The holds are recorded on the node, in the annotation ``gpu-autoscaler.io/holds`` (a JSON
  list of ``{"job", "for", "for_uid", "since"}``), written in the same patch as the taint and
  under the node's resourceVersion: a controller that restarts reads them back (``held_off``),
  and lifts them as the one before would have.

**Lifting** (each ``apply_placement``): a hold ends once its owner pod is bound (here or
elsewhere), has finished, or is gone (or a namesake stands in its place: another uid), or
``MOVE_HOLD_S`` has passed; when a node's last hold ends its taint goes. Only our own taint key
is ever touched. An annotation that cannot be read (edited by hand), or our taint on a node
with no annotation, is a problem named in one warning line: its holds are not listed and the
taint is left for the operator to lift, since nothing says whom it is for.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from autoscaler.model.errors import SourceError
from autoscaler.sources.kubernetes.api import ConflictError, KubeApi, Obj
from autoscaler.sources.kubernetes.pods import BadPodError, PodRules, Times, read_pod
from autoscaler.spi.sources import HeldOff

log = logging.getLogger(__name__)

HOLD_TAINT_KEY = "gpu-autoscaler.io/held-for"
HOLDS_ANNOTATION = "gpu-autoscaler.io/holds"
EFFECT = "NoSchedule"
# The longest a node's room is kept for a pod that has not started (the Slurm adapter's
# ``move_hold_s`` default): past it, the room is anyone's again.
MOVE_HOLD_S = 1800.0
# How often a write refused for a change made meanwhile (409) is read again and retried.
CONFLICT_TRIES = 5
_LABEL_VALUE = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
SHOWN = 120


@dataclass(frozen=True)
class Hold:
    """``job`` was moved off the node for the pod ``for_job`` (of uid ``for_uid``) at ``since``
    (unix seconds)."""

    job: str
    for_job: str
    for_uid: str
    since: float

    def as_json(self) -> dict[str, Any]:
        return {"job": self.job, "for": self.for_job, "for_uid": self.for_uid, "since": self.since}


class BadHoldsError(ValueError):
    """The holds annotation is not the JSON this module writes."""


def read_holds(text: str) -> list[Hold]:
    """The holds an annotation records; ``BadHoldsError`` saying what is wrong otherwise."""
    try:
        value = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise BadHoldsError(f"not JSON ({type(exc).__name__})") from None
    if not isinstance(value, list):
        raise BadHoldsError("not a JSON list")
    holds: list[Hold] = []
    for index, entry in enumerate(value):
        if not isinstance(entry, dict):
            raise BadHoldsError(f"entry {index} is not an object")
        job, for_job, uid, since = (entry.get(k) for k in ("job", "for", "for_uid", "since"))
        if not isinstance(job, str) or not isinstance(for_job, str) or not isinstance(uid, str):
            raise BadHoldsError(f"entry {index}: job, for and for_uid must be strings")
        if isinstance(since, bool) or not isinstance(since, int | float):
            raise BadHoldsError(f"entry {index}: since must be a number (unix seconds)")
        holds.append(Hold(job, for_job, uid, float(since)))
    return holds


def write_holds(holds: Iterable[Hold]) -> str:
    return json.dumps([h.as_json() for h in holds], separators=(",", ":"))


def hold_token(node: str) -> str:
    """The hold taint's value on ``node``: its name where that is a valid label value (what an
    operator reads), else a hash of it."""
    if _LABEL_VALUE.match(node):
        return node
    return "node-" + hashlib.sha256(node.encode()).hexdigest()[:32]


def toleration(token: str) -> dict[str, str]:
    return {"key": HOLD_TAINT_KEY, "operator": "Equal", "value": token, "effect": EFFECT}


def _ours(taint: Mapping[str, Any]) -> bool:
    return taint.get("key") == HOLD_TAINT_KEY and taint.get("effect") == EFFECT


@dataclass(frozen=True)
class HeldNode:
    """A node with our holds annotation or our taint, as read."""

    name: str
    key: str  # what the controller calls the node
    resource_version: str
    holds: tuple[Hold, ...]
    taints: tuple[Mapping[str, Any], ...]
    problem: str | None  # why its holds cannot be read, when they cannot

    @classmethod
    def of(cls, obj: Obj, key: str) -> HeldNode | None:
        """None for a node that is none of ours."""
        meta = _map(obj, "metadata")
        spec = _map(obj, "spec")
        name = str(meta.get("name") or "")
        annotations = _map(meta, "annotations")
        raw_taints = _list(spec, "taints")
        taints = tuple(t for t in raw_taints if isinstance(t, dict))
        text = annotations.get(HOLDS_ANNOTATION)
        tainted = any(_ours(t) for t in taints)
        if text is None and not tainted:
            return None
        holds: tuple[Hold, ...] = ()
        problem = None
        if text is None:
            problem = (
                f"node {name}: taint {HOLD_TAINT_KEY} without the annotation "
                f"{HOLDS_ANNOTATION}: nobody is known to be waiting for it, so it is left "
                f"for an operator to remove (kubectl taint nodes {name} {HOLD_TAINT_KEY}-)"
            )
        elif not isinstance(text, str):
            problem = f"node {name}: annotation {HOLDS_ANNOTATION} is not a string"
        else:
            try:
                holds = tuple(read_holds(text))
            except BadHoldsError as exc:
                problem = (
                    f"node {name}: annotation {HOLDS_ANNOTATION} cannot be read ({exc}): its "
                    f"holds are not listed nor lifted and the taint {HOLD_TAINT_KEY} is left "
                    f"as it is; fix or remove both by hand"
                )
        return cls(name, key, str(meta.get("resourceVersion") or ""), holds, taints, problem)

    @property
    def token(self) -> str:
        """The value of our taint here (what an owner's toleration must match)."""
        for taint in self.taints:
            if _ours(taint) and isinstance(taint.get("value"), str):
                return str(taint["value"])
        return hold_token(self.name)


class Mover:
    """The moves of one source: writes holds, lists them and lifts them. ``move_off`` may run
    on the controller's worker threads, several at once: node edits are serialized here, and
    retried on a 409 against edits made elsewhere."""

    def __init__(
        self,
        api: KubeApi,
        rules: PodRules,
        where: str,
        node_key: Callable[[Obj], str],
        move_hold_s: float = MOVE_HOLD_S,
    ) -> None:
        self.api = api
        self.rules = rules
        self.where = where
        self.node_key = node_key
        self.move_hold_s = move_hold_s
        self._lock = threading.Lock()

    # -- the move --------------------------------------------------------------------------------

    def move_off(self, job: tuple[str, str], node: str, owner: tuple[str, str]) -> None:
        """Move the pod ``job`` off the node named ``node`` for the pending pod ``owner``: hold
        the node for the owner, then delete the pod. Raises ``SourceError`` having deleted
        nothing when the pod is not one to move, or the owner is not one to wait for."""
        job_id, owner_id = "/".join(job), "/".join(owner)
        what = f"{self.where}: move {job_id} off {node}"
        moved = self.api.read_pod(*job)
        if moved is None:
            raise SourceError(f"{what}: the pod is gone")
        uid = self._check_moved(moved, node, what)
        found = self.api.read_pod(*owner)
        if found is None:
            raise SourceError(f"{what}: the pod it makes room for, {owner_id}, is gone")
        owner_uid = self._check_owner(found, owner_id, what)
        hold = Hold(job_id, owner_id, owner_uid, time.time())
        token = self._edit_node(node, what, lambda held: _with(held, hold))
        try:
            if not self._tolerate(owner, owner_uid, token, what):
                raise SourceError(f"{what}: the pod it makes room for, {owner_id}, is gone")
            self.api.delete_pod(job[0], job[1], uid)
        except SourceError:
            self._undo(node, job_id, what)
            raise

    def _check_moved(self, obj: Obj, node: str, what: str) -> str:
        try:
            pod = read_pod(obj, self.rules, Times())
        except BadPodError as exc:
            raise SourceError(f"{what}: {exc}") from None
        if pod.node != node:
            raise SourceError(f"{what}: it runs on {pod.node or 'no node'}")
        if pod.finished or pod.terminating:
            raise SourceError(f"{what}: it is leaving already ({pod.phase})")
        if pod.owner_kind is None:
            raise SourceError(f"{what}: not moved, it is a bare pod: no controller makes it again")
        if pod.daemon:
            raise SourceError(
                f"{what}: not moved, it is a {pod.owner_kind or 'mirror'}'s pod: it would come "
                "back on the same node"
            )
        return pod.uid

    def _check_owner(self, obj: Obj, owner_id: str, what: str) -> str:
        try:
            pod = read_pod(obj, self.rules, Times())
        except BadPodError as exc:
            raise SourceError(f"{what}: the pod it makes room for, {owner_id}: {exc}") from None
        if pod.node or pod.finished:
            raise SourceError(
                f"{what}: the pod it makes room for, {owner_id}, waits no more ({pod.phase}"
                f"{' on ' + pod.node if pod.node else ''})"
            )
        return pod.uid

    def _tolerate(self, owner: tuple[str, str], uid: str, token: str, what: str) -> bool:
        """Add the hold's toleration to the owner pod (kept if it has it); False when the pod
        is gone (or a namesake of another ``uid`` stands in its place)."""
        wanted = toleration(token)
        for _ in range(CONFLICT_TRIES):
            obj = self.api.read_pod(owner[0], owner[1])
            if obj is None or _map(obj, "metadata").get("uid", "") != uid:
                return False
            spec = _map(obj, "spec")
            found = _list(spec, "tolerations")
            if wanted in found:
                return True
            version = _version(obj)
            patch = {
                "metadata": {"resourceVersion": version},
                "spec": {"tolerations": [*found, wanted]},
            }
            try:
                return self.api.change_pod(owner[0], owner[1], patch)
            except ConflictError:
                continue
        raise SourceError(f"{what}: the pod it makes room for kept changing; asked again later")

    def _undo(self, node: str, job_id: str, what: str) -> None:
        """Take back a hold whose move failed (best effort: a hold left stands until its bound)."""
        try:
            self._edit_node(node, what, lambda held: [h for h in held if h.job != job_id])
        except SourceError as exc:
            log.warning("%s: the hold stays until it ends by itself: %s", what, exc)

    # -- node edits ------------------------------------------------------------------------------

    def _edit_node(
        self, node: str, what: str, change: Callable[[Sequence[Hold]], Sequence[Hold]]
    ) -> str:
        """Rewrite a node's holds by ``change`` (with the taint while any stand, without once
        none does), under the resourceVersion they were read at; returns the taint's value."""
        with self._lock:
            for _ in range(CONFLICT_TRIES):
                obj = self._read_node(node, what)
                held = HeldNode.of(obj, node)
                if held is not None and held.problem is not None:
                    raise SourceError(f"{self.where}: {held.problem}")
                before = held.holds if held is not None else ()
                after = tuple(change(before))
                token = held.token if held is not None else hold_token(node)
                patch = node_patch(obj, held is not None, before, after, token)
                if patch is None:
                    return token
                meta = {**patch.get("metadata", {}), "resourceVersion": _version(obj)}
                try:
                    self.api.change_node(node, {**patch, "metadata": meta})
                except ConflictError:
                    continue
                return token
        raise SourceError(f"{what}: the node kept changing; asked again later")

    def _read_node(self, node: str, what: str) -> Obj:
        items = self.api.list_nodes(field_selector=f"metadata.name={node}").items
        if not items or not isinstance(items[0], dict):
            raise SourceError(f"{what}: node {node} is gone")
        return items[0]

    # -- listing and lifting ---------------------------------------------------------------------

    def held_nodes(self, items: Iterable[Any]) -> list[HeldNode]:
        """The nodes with our annotation or taint among ``items`` (node objects)."""
        found = []
        for obj in items:
            if not isinstance(obj, dict):
                continue
            held = HeldNode.of(obj, self.node_key(obj))
            if held is not None:
                found.append(held)
        return found

    def held_off(self, nodes: Sequence[HeldNode]) -> list[HeldOff]:
        now = time.time()
        return [
            HeldOff(h.job, node.key, h.for_job, h.since)
            for node in nodes
            for h in node.holds
            if now - h.since <= self.move_hold_s
        ]

    def lift(self, nodes: Sequence[HeldNode]) -> list[str]:
        """End the holds that have done their work or outlived ``move_hold_s``; returns what
        failed, one line each (the rest is done). A node whose holds cannot be read is left as
        it is (its problem is said by whoever listed it)."""
        failures: list[str] = []
        for node in nodes:
            if node.problem is not None:
                continue
            try:
                ended = frozenset(h for h in node.holds if self._over(h))
            except SourceError as exc:
                failures.append(str(exc))
                continue
            if node.holds and not ended:
                continue

            def kept(held: Sequence[Hold], ended: frozenset[Hold] = ended) -> list[Hold]:
                return [h for h in held if h not in ended]

            try:
                self._edit_node(node.name, f"{self.where}: lift holds on {node.name}", kept)
            except SourceError as exc:
                failures.append(str(exc))
                continue
            for h in ended:
                log.info(
                    "%s: %s no longer held off %s (for %s)", self.where, h.job, node.name, h.for_job
                )
        return failures

    def _over(self, hold: Hold) -> bool:
        if time.time() - hold.since > self.move_hold_s:
            return True
        namespace, _, name = hold.for_job.partition("/")
        obj = self.api.read_pod(namespace, name)
        if obj is None:
            return True
        meta = _map(obj, "metadata")
        if meta.get("uid") != hold.for_uid:
            return True
        spec = _map(obj, "spec")
        status = _map(obj, "status")
        return bool(spec.get("nodeName")) or status.get("phase") in ("Succeeded", "Failed")


def _map(obj: Mapping[str, Any], key: str) -> dict[str, Any]:
    value = obj.get(key)
    return value if isinstance(value, dict) else {}


def _list(obj: Mapping[str, Any], key: str) -> list[Any]:
    value = obj.get(key)
    return value if isinstance(value, list) else []


def _with(held: Sequence[Hold], hold: Hold) -> list[Hold]:
    return [*(h for h in held if h.job != hold.job), hold]


def _version(obj: Obj) -> str:
    meta = _map(obj, "metadata")
    return str(meta.get("resourceVersion") or "")


def node_patch(
    obj: Obj, annotated: bool, before: Sequence[Hold], after: Sequence[Hold], token: str
) -> dict[str, Any] | None:
    """The patch taking a node from ``before`` to ``after``: the annotation (removed with the
    last hold) and our taint (present exactly while a hold stands); None when nothing changes."""
    spec = _map(obj, "spec")
    raw = _list(spec, "taints")
    taints = [t for t in raw if isinstance(t, dict)]
    tainted = any(_ours(t) for t in taints)
    patch: dict[str, Any] = {}
    if after and list(after) != list(before):
        patch["metadata"] = {"annotations": {HOLDS_ANNOTATION: write_holds(after)}}
    elif not after and annotated:
        patch["metadata"] = {"annotations": {HOLDS_ANNOTATION: None}}
    if after and not tainted:
        ours = {"key": HOLD_TAINT_KEY, "value": token, "effect": EFFECT}
        patch["spec"] = {"taints": [*taints, ours]}
    elif not after and tainted:
        patch["spec"] = {"taints": [t for t in taints if not _ours(t)]}
    return patch or None
