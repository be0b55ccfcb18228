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
* The holds are recorded on the node, in the annotation ``gpu-autoscaler.io/holds``, written in
  the same patch as the taint and under the node's resourceVersion: a controller that restarts
  reads them back (``held_off``), and lifts them as the one before would have. It is a JSON list
  of one entry per hold: ``{"for", "for_uid", "since", "moved": [{"job", "since"}], "bound",
  "gang"}`` (``since`` when the hold began, each moved pod's when it was moved; ``bound`` for a
  hold ``bind`` made; ``gang`` for a pod group's). A hold of one moved pod that ``bind`` did not
  make is written as it was before ``bind`` existed, ``{"job", "for", "for_uid", "since"}``,
  and that form is read as such a hold: annotations written by an older controller read the
  same, and an older controller still reads what on-prem rebalancing writes.

**Binding** (``bind``, for reclaim and preemption). Kubernetes cannot bind a pending pod to a
node, so the room is kept by the hold alone, put on every node being freed for the owner at once,
when the moves are decided and before any pod is asked to checkpoint: the taint keeps each pod
that does not tolerate it off the room that comes free while the movers still checkpoint, and the
owner gets the toleration. Such a hold stands with no moved pod; ``move_off`` adds the pods it
moves for the same owner to it. A gang (a coscheduling or Kueue pod group, an Indexed Job, named
by its group as demand names it) is held for as one owner: every pending pod of the group
tolerates every node held for it, and a pod its Job makes later gets the tolerations at the next
lifting pass. Binding again to the same nodes writes nothing; binding to other nodes ends the
binding on the nodes left out (their moved pods stay held off them until their hold ends; the
owner's toleration of them stays, since a pod's tolerations cannot be taken away).

**Lifting** (each ``apply_placement``): a hold ends once its owner pod is bound (here or
elsewhere), has finished, or is gone (or a namesake stands in its place: another uid), a gang's
once none of its pods waits, or ``MOVE_HOLD_S`` has passed since the hold began (the bind, or
the first move); when a node's last hold ends its taint goes. Only our own taint key
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
from dataclasses import dataclass, replace
from typing import Any

from autoscaler.model.errors import SourceError
from autoscaler.sources.kubernetes.api import ConflictError, KubeApi, Obj
from autoscaler.sources.kubernetes.pods import BadPodError, Pod, PodRules, Times, read_pod
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
# a pod's name (a gang's id, ``namespace/job/<name>``, has a slash in its name part)
_POD_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
_LABEL_VALUE = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
SHOWN = 120
HOSTNAME = "kubernetes.io/hostname"


@dataclass(frozen=True)
class Moved:
    """The pod ``job`` moved off the node at ``since`` (unix seconds)."""

    job: str
    since: float


@dataclass(frozen=True)
class Hold:
    """Room on a node kept for the pending pod ``for_job`` (of uid ``for_uid``), or for the gang
    ``for_job`` (``gang``; ``for_uid`` empty: its pods are made again under new uids), since
    ``since`` (unix seconds): the pods ``moved`` off it for the owner, and whether ``bind`` made
    it (``bound``: it stands before any pod is moved)."""

    for_job: str
    for_uid: str
    since: float
    moved: tuple[Moved, ...] = ()
    bound: bool = False
    gang: bool = False

    def for_owner(self, owner: Owner) -> bool:
        return self.for_job == owner.id and self.for_uid == owner.uid

    def as_json(self) -> dict[str, Any]:
        if not self.bound and not self.gang and len(self.moved) == 1:
            (only,) = self.moved
            if only.since == self.since:  # the form before bind: older controllers read it
                return {
                    "job": only.job,
                    "for": self.for_job,
                    "for_uid": self.for_uid,
                    "since": self.since,
                }
        entry: dict[str, Any] = {
            "for": self.for_job,
            "for_uid": self.for_uid,
            "since": self.since,
            "moved": [{"job": m.job, "since": m.since} for m in self.moved],
        }
        if self.bound:
            entry["bound"] = True
        if self.gang:
            entry["gang"] = True
        return entry


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
    return [_read_hold(entry, f"entry {index}") for index, entry in enumerate(value)]


def _read_hold(entry: Any, where: str) -> Hold:
    if not isinstance(entry, dict):
        raise BadHoldsError(f"{where} is not an object")
    for_job, uid = entry.get("for"), entry.get("for_uid")
    if not isinstance(for_job, str) or not isinstance(uid, str):
        raise BadHoldsError(f"{where}: for and for_uid must be strings")
    since = _seconds(entry.get("since"), where)
    if "job" in entry:  # one moved pod, the form written before bind
        job = entry["job"]
        if not isinstance(job, str):
            raise BadHoldsError(f"{where}: job must be a string")
        return Hold(for_job, uid, since, (Moved(job, since),))
    moved = entry.get("moved")
    bound, gang = entry.get("bound", False), entry.get("gang", False)
    if not isinstance(moved, list):
        raise BadHoldsError(f"{where}: job or moved (a list) must be there")
    if not isinstance(bound, bool) or not isinstance(gang, bool):
        raise BadHoldsError(f"{where}: bound and gang must be true or false")
    pods: list[Moved] = []
    for index, item in enumerate(moved):
        job = item.get("job") if isinstance(item, dict) else None
        if not isinstance(job, str):
            raise BadHoldsError(f"{where}: moved[{index}] has no job string")
        pods.append(Moved(job, _seconds(item.get("since"), f"{where}: moved[{index}]")))
    if not pods and not bound:
        raise BadHoldsError(f"{where}: neither bound nor any pod moved")
    return Hold(for_job, uid, since, tuple(pods), bound, gang)


def _seconds(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise BadHoldsError(f"{where}: since must be a number (unix seconds)")
    return float(value)


def write_holds(holds: Iterable[Hold]) -> str:
    return json.dumps([h.as_json() for h in holds], separators=(",", ":"))


@dataclass(frozen=True)
class Owner:
    """The pending job room is kept for: one pod (``uid`` its own), or a gang (``uid`` empty)
    whose ``pods`` are its members waiting now; each pod as (namespace, name, uid)."""

    id: str
    uid: str
    gang: bool
    pods: tuple[tuple[str, str, str], ...]
    # the nodes it asks for by name (a pod's kubernetes.io/hostname selector or affinity)
    pinned: str | None = None


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
    """The moves and bindings of one source: writes holds, lists them and lifts them.
    ``move_off`` may run on the controller's worker threads, several at once: node edits are
    serialized here, and retried on a 409 against edits made elsewhere."""

    def __init__(
        self,
        api: KubeApi,
        rules: PodRules,
        where: str,
        node_key: Callable[[Obj], str],
        move_hold_s: float = MOVE_HOLD_S,
        pods: Callable[[], Iterable[Any]] | None = None,
    ) -> None:
        self.api = api
        self.rules = rules
        self.where = where
        self.node_key = node_key
        self.move_hold_s = move_hold_s
        # every unfinished pod object, where a gang's pods are found
        self.pods = pods or (lambda: self.api.list_pods().items)
        self._lock = threading.Lock()

    # -- the owner -------------------------------------------------------------------------------

    def owner(self, owner_id: str, what: str) -> Owner:
        """The pending job ``owner_id`` names, as demand names it: a pod (``namespace/name``)
        or a gang (its group: ``namespace/group``, ``namespace/job/<name>``). Raises
        ``SourceError`` when it is gone or waits no more."""
        namespace, _, name = owner_id.partition("/")
        obj = self.api.read_pod(namespace, name) if _POD_NAME.match(name) else None
        if obj is not None:
            pod = self._read(obj, f"{what}: the pod it makes room for, {owner_id}")
            if pod.gang != owner_id:
                if not _waits(pod):
                    raise SourceError(
                        f"{what}: the pod it makes room for, {owner_id}, waits no more "
                        f"({pod.phase}{' on ' + pod.node if pod.node else ''})"
                    )
                pods = ((pod.namespace, pod.name, pod.uid),)
                return Owner(owner_id, pod.uid, False, pods, _pinned(pod))
        members = self.gangs(namespace).get(owner_id, [])
        if not members:
            raise SourceError(
                f"{what}: the pod it makes room for, {owner_id}, is gone (no pod of that name, "
                "nor a pod group with a pod left)"
            )
        pending = [p for p, _ in members if _waits(p)]
        waiting = tuple((p.namespace, p.name, p.uid) for p in pending)
        if not waiting:
            raise SourceError(
                f"{what}: the pod group it makes room for, {owner_id}, waits no more (its "
                f"{len(members)} pod(s) run or leave)"
            )
        pinned = next((found for p in pending if (found := _pinned(p))), None)
        return Owner(owner_id, "", True, waiting, pinned)

    def gangs(self, namespace: str | None = None) -> dict[str, list[tuple[Pod, list[Any]]]]:
        """Every gang's unfinished pods (of ``namespace`` alone, when given), each with its
        tolerations as listed."""
        found: dict[str, list[tuple[Pod, list[Any]]]] = {}
        for obj in self.pods():
            if not isinstance(obj, dict):
                continue  # not a pod: demand names it, no gang is found through it
            if namespace is not None and _map(obj, "metadata").get("namespace") != namespace:
                continue
            try:
                pod = read_pod(obj, self.rules, Times())
            except BadPodError:
                continue
            if pod.gang is not None:
                found.setdefault(pod.gang, []).append(
                    (pod, _list(_map(obj, "spec"), "tolerations"))
                )
        return found

    def _read(self, obj: Obj, what: str) -> Pod:
        try:
            return read_pod(obj, self.rules, Times())
        except BadPodError as exc:
            raise SourceError(f"{what}: {exc}") from None

    # -- binding ---------------------------------------------------------------------------------

    def bind(self, owner_id: str, nodes: Sequence[str], held: Sequence[HeldNode]) -> None:
        """Hold the nodes named ``nodes`` for the pending ``owner_id`` before any pod is moved
        off them, and give its pods the holds' tolerations; end its binding to any other node
        among ``held``. Raises ``SourceError`` having left no new hold when the owner is not
        pending, or a node cannot be held."""
        what = f"{self.where}: bind {owner_id} to {', '.join(nodes)}"
        owner = self.owner(owner_id, what)
        if owner.pinned is not None:
            raise SourceError(f"{what}: not bound, it asks for nodes of its own ({owner.pinned})")
        now = time.time()
        added: list[str] = []
        tokens: list[str] = []
        try:
            for node in nodes:
                token, changed = self._edit_node(node, what, lambda h: _binding(h, owner, now))
                tokens.append(token)
                if changed:
                    added.append(node)
            self._tolerate_all(owner, tokens, what)
        except SourceError:
            for node in added:
                self._take_back(node, what, lambda h: _unbinding(h, owner))
            raise
        for other in held:
            if other.name in nodes or other.problem is not None:
                continue
            if any(h.bound and h.for_owner(owner) for h in other.holds):
                self._take_back(other.name, what, lambda h: _unbinding(h, owner))

    # -- the move --------------------------------------------------------------------------------

    def move_off(self, job: tuple[str, str], node: str, owner_id: str) -> None:
        """Move the pod ``job`` off the node named ``node`` for the pending ``owner_id``: hold
        the node for the owner (adding the pod to the owner's bound hold there, if one
        stands), then delete the pod. Raises ``SourceError`` having deleted nothing when the
        pod is not one to move, or the owner is not one to wait for."""
        job_id = "/".join(job)
        what = f"{self.where}: move {job_id} off {node}"
        moved = self.api.read_pod(*job)
        if moved is None:
            raise SourceError(f"{what}: the pod is gone")
        uid = self._check_moved(moved, node, what)
        owner = self.owner(owner_id, what)
        pod = Moved(job_id, time.time())
        token, _ = self._edit_node(node, what, lambda held: _moving(held, owner, pod))
        try:
            self._tolerate_all(owner, [token], what)
            self.api.delete_pod(job[0], job[1], uid)
        except SourceError:
            self._take_back(node, what, lambda held: _without(held, job_id))
            raise

    def _check_moved(self, obj: Obj, node: str, what: str) -> str:
        pod = self._read(obj, what)
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

    def _tolerate_all(self, owner: Owner, tokens: Sequence[str], what: str) -> None:
        """Give each of the owner's pods the tolerations of ``tokens``; raises when none of
        them is there any more."""
        kept = [self._tolerate(pod, tokens, what) for pod in owner.pods]
        if not any(kept):
            raise SourceError(f"{what}: the pod it makes room for, {owner.id}, is gone")

    def _tolerate(self, pod: tuple[str, str, str], tokens: Sequence[str], what: str) -> bool:
        """Add the holds' tolerations to a pod (kept where it has them); False when the pod
        is gone (or a namesake of another uid stands in its place)."""
        namespace, name, uid = pod
        wanted = [toleration(token) for token in dict.fromkeys(tokens)]
        for _ in range(CONFLICT_TRIES):
            obj = self.api.read_pod(namespace, name)
            if obj is None or _map(obj, "metadata").get("uid", "") != uid:
                return False
            found = _list(_map(obj, "spec"), "tolerations")
            missing = [t for t in wanted if t not in found]
            if not missing:
                return True
            version = _version(obj)
            patch = {
                "metadata": {"resourceVersion": version},
                "spec": {"tolerations": [*found, *missing]},
            }
            try:
                return self.api.change_pod(namespace, name, patch)
            except ConflictError:
                continue
        raise SourceError(f"{what}: the pod {namespace}/{name} kept changing; asked again later")

    def _take_back(
        self, node: str, what: str, change: Callable[[Sequence[Hold]], Sequence[Hold]]
    ) -> None:
        """Undo a hold whose move or bind failed (best effort: a hold left stands until its
        bound)."""
        try:
            self._edit_node(node, what, change)
        except SourceError as exc:
            log.warning("%s: the hold on %s stays until it ends by itself: %s", what, node, exc)

    # -- node edits ------------------------------------------------------------------------------

    def _edit_node(
        self, node: str, what: str, change: Callable[[Sequence[Hold]], Sequence[Hold]]
    ) -> tuple[str, bool]:
        """Rewrite a node's holds by ``change`` (with the taint while any stand, without once
        none does), under the resourceVersion they were read at; returns the taint's value and
        whether the node was written."""
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
                    return token, False
                meta = {**patch.get("metadata", {}), "resourceVersion": _version(obj)}
                try:
                    self.api.change_node(node, {**patch, "metadata": meta})
                except ConflictError:
                    continue
                return token, True
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
        """The pods moved off their nodes whose holds stand (a bound hold no pod was moved for
        yet keeps no pod off: it is not listed)."""
        now = time.time()
        return [
            HeldOff(m.job, node.key, h.for_job, m.since)
            for node in nodes
            for h in node.holds
            if now - h.since <= self.move_hold_s
            for m in h.moved
        ]

    def lift(self, nodes: Sequence[HeldNode]) -> list[str]:
        """End the holds that have done their work or outlived ``move_hold_s``, and give a
        gang's pods made since its hold began the hold's tolerations; returns what failed, one
        line each (the rest is done). A node whose holds cannot be read is left as it is (its
        problem is said by whoever listed it)."""
        failures: list[str] = []
        listed: list[dict[str, list[tuple[Pod, list[Any]]]]] = []

        def gangs() -> dict[str, list[tuple[Pod, list[Any]]]]:
            if not listed:
                listed.append(self.gangs())
            return listed[0]

        standing: dict[str, set[str]] = {}  # each gang's holds that stand: their taints' values
        for node in nodes:
            if node.problem is not None:
                continue
            try:
                ended = frozenset(h for h in node.holds if self._over(h, gangs))
            except SourceError as exc:
                failures.append(str(exc))
                continue
            for h in node.holds:
                if h.gang and h not in ended:
                    standing.setdefault(h.for_job, set()).add(node.token)
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
                    "%s: %s no longer held for %s",
                    self.where,
                    node.name,
                    f"{h.for_job} ({', '.join(m.job for m in h.moved) or 'no pod moved'})",
                )
        failures += self._tolerate_gangs(standing, gangs)
        return failures

    def _tolerate_gangs(
        self,
        standing: Mapping[str, set[str]],
        gangs: Callable[[], Mapping[str, list[tuple[Pod, list[Any]]]]],
    ) -> list[str]:
        """A gang's pod made after its holds began (its Job made it again) lacks their
        tolerations: give them to it."""
        failures: list[str] = []
        for gang, tokens in standing.items():
            wanted = [toleration(token) for token in sorted(tokens)]
            for pod, found in gangs().get(gang, []):
                if not _waits(pod) or all(t in found for t in wanted):
                    continue
                what = f"{self.where}: hold for {gang}"
                try:
                    self._tolerate((pod.namespace, pod.name, pod.uid), sorted(tokens), what)
                except SourceError as exc:
                    failures.append(str(exc))
        return failures

    def _over(
        self, hold: Hold, gangs: Callable[[], Mapping[str, list[tuple[Pod, list[Any]]]]]
    ) -> bool:
        if time.time() - hold.since > self.move_hold_s:
            return True
        if hold.gang:
            return not any(_waits(pod) for pod, _ in gangs().get(hold.for_job, []))
        namespace, _, name = hold.for_job.partition("/")
        obj = self.api.read_pod(namespace, name) if _POD_NAME.match(name) else None
        if obj is None:
            return True
        meta = _map(obj, "metadata")
        if meta.get("uid") != hold.for_uid:
            return True
        spec = _map(obj, "spec")
        status = _map(obj, "status")
        return bool(spec.get("nodeName")) or status.get("phase") in ("Succeeded", "Failed")


def _pinned(pod: Pod) -> str | None:
    """What names the nodes ``pod`` asks for by name, if it does: a pod that chose its nodes
    is not bound to others (as the Slurm adapter binds no job with a node list of its own)."""
    for key, value in pod.needs.selector:
        if key == HOSTNAME:
            return f"nodeSelector {key}={value}"
    for term in pod.needs.terms:
        for key, operator, values in term:
            if key == HOSTNAME and operator == "In":
                return f"node affinity {key} in {', '.join(values)}"
    return None


def _waits(pod: Pod) -> bool:
    """Still pending: not bound, not finished, not being deleted."""
    return not (pod.node or pod.finished or pod.terminating)


def _binding(held: Sequence[Hold], owner: Owner, now: float) -> list[Hold]:
    """``held`` with a bound hold for ``owner`` (unchanged when one stands)."""
    if any(h.bound and h.for_owner(owner) for h in held):
        return list(held)
    return [*held, Hold(owner.id, owner.uid, now, (), bound=True, gang=owner.gang)]


def _unbinding(held: Sequence[Hold], owner: Owner) -> list[Hold]:
    """``held`` without ``owner``'s binding: its bound hold ends, or, where pods were moved
    for it, stays as a plain hold keeping them off."""
    kept: list[Hold] = []
    for h in held:
        if h.bound and h.for_owner(owner):
            if h.moved:
                kept.append(replace(h, bound=False))
            continue
        kept.append(h)
    return kept


def _moving(held: Sequence[Hold], owner: Owner, pod: Moved) -> list[Hold]:
    """``held`` with ``pod`` moved for ``owner``: added to the owner's bound hold where one
    stands, else a hold of its own."""
    kept = _without(held, pod.job)
    for index, h in enumerate(kept):
        if h.bound and h.for_owner(owner):
            kept[index] = replace(h, moved=(*h.moved, pod))
            return kept
    return [*kept, Hold(owner.id, owner.uid, pod.since, (pod,), gang=owner.gang)]


def _without(held: Sequence[Hold], job_id: str) -> list[Hold]:
    """``held`` without the pod ``job_id`` (a hold left with no pod ends, unless bound)."""
    kept: list[Hold] = []
    for h in held:
        moved = tuple(m for m in h.moved if m.job != job_id)
        if moved or h.bound:
            kept.append(replace(h, moved=moved) if moved != h.moved else h)
    return kept


def _map(obj: Mapping[str, Any], key: str) -> dict[str, Any]:
    value = obj.get(key)
    return value if isinstance(value, dict) else {}


def _list(obj: Mapping[str, Any], key: str) -> list[Any]:
    value = obj.get(key)
    return value if isinstance(value, list) else []


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
