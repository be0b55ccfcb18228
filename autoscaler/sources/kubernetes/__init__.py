"""Kubernetes as the controller's queue, node source and workload scheduler, through the API.

The roles are the Slurm adapter's (docs/kubernetes.md):

* demand (``read``): pending pods the scheduler found no node for that ask for GPUs, folded
  into demand groups (``demand``);
* nodes (``read_nodes``): on-prem GPU nodes, and our cloud nodes (``gpu-autoscaler.io/managed``)
  by the instance id in their providerID, with the GPUs their pods hold (``nodes``);
* scheduler: ``drain`` cordons a node and evicts the pods that hold no GPU through the Eviction
  API (GPU pods finish, or leave at their checkpoints); ``evict`` (a drain past its timeout)
  evicts the rest, through the Eviction API so a PodDisruptionBudget that refuses keeps the
  node until it allows (``drain_timeout_action: evict``), or by deleting them (``delete``);
  ``apply_placement`` keeps our nodes' spot taint and pool labels as the join gave them (the
  placement itself is the pods' tolerations: nothing is written per pod);
* checkpointing: ``running_jobs`` (GPU pods by node), ``signal`` (the annotation
  ``gpu-autoscaler.io/checkpoint-requested`` a sidecar watches), ``requeue`` (the pod of a Job
  is deleted and its controller makes a new one; a bare pod is not deleted, and said);
* moves (``bind``, ``move_off``, ``held_off``): a pod moved off a node for a pending pod is
  requeued so, and the room kept for the pending one by a taint on the node that only it
  tolerates (put by ``bind`` on every node freed for it before any pod is moved, for reclaim and
  preemption), lifted by ``apply_placement`` once it has started (``moves``);
* the join: ``join_user_data`` renders each pool's boot script (``kubernetes_join``).

With ``watch_cache`` the pods and nodes a reading folds come from a watch-fed cache
(``cache``) instead of a list each tick; drains, requeues and placement still read afresh.
Every API call is in ``autoscaler.sources.kubernetes.api``; an API server that fails or does not
answer makes the reading fail (demand unknown, never zero). A pending pod that cannot be read, or
asks for what no pool can give (a GPU resource nobody counts, a node selector no pool's nodes
meet: ``fit``), is counted as demand that cannot be met; a node or bound pod that cannot be read
is left out. Each is named in one warning line when the set changes, and counted by kind on
``gpu_autoscaler_source_problems`` (``reading_problems``).
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from autoscaler.model import DemandGroup, Placement, Pool
from autoscaler.model.errors import SourceError
from autoscaler.model.inputfile import validate_settings
from autoscaler.model.optional import require_extra
from autoscaler.model.sharing import GpuSharing
from autoscaler.sources import kubernetes_join
from autoscaler.sources.kubernetes.api import KubeApi, Listing
from autoscaler.sources.kubernetes.cache import WatchCache
from autoscaler.sources.kubernetes.demand import (
    COUNTED_ONCE_SEEN,
    UNKNOWN_RESOURCE,
    Sharing,
    describe,
    pending_demand,
)
from autoscaler.sources.kubernetes.fit import NodeNeeds, PoolLabels, unmet
from autoscaler.sources.kubernetes.moves import HeldNode, Mover
from autoscaler.sources.kubernetes.nodes import (
    Allocation,
    BadNodeError,
    Node,
    Nodes,
    node_reading,
    read_node,
    running_jobs,
    workload,
)
from autoscaler.sources.kubernetes.pods import BadPodError, Pod, PodRules, Times, read_pod
from autoscaler.sources.kubernetes.settings import KubernetesSettings
from autoscaler.spi.sources import HeldOff, NodeReading, RunningJob

__all__ = ["KubernetesSettings", "KubernetesSource"]

log = logging.getLogger(__name__)

# How old a pod list one role read may be for another role of the same tick to use it.
REUSE_S = 30.0
_NODE = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,251}[A-Za-z0-9])?$")
_JOB = re.compile(r"^([a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?)/([a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?)$")
# a pod group's name is a label value (or ``job/`` and a Job's name, for an Indexed Job)
_OWNER = re.compile(
    r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?/(job/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,251})?$"
)
_SIGNAL = re.compile(r"^(SIG)?[A-Za-z0-9]{1,16}$")


class KubernetesSource:
    """Queue source, node source, workload scheduler, checkpointing scheduler and mover of pods
    off nodes of one cluster, and the renderer of its cloud nodes' boot script."""

    Settings = KubernetesSettings  # what its ``settings`` hold (``gpu-autoscaler schema``)

    def __init__(
        self, settings: KubernetesSettings, name: str = "kubernetes", api: KubeApi | None = None
    ) -> None:
        self.settings = settings
        self.name = name
        self.where = f"kubernetes source '{name}'"
        self.rules = PodRules.of(settings, f"kubernetes source {name!r}")
        self.api = api or KubeApi(settings, self.where)
        # what the last reading could not read as it is, one line each, and how many
        self._lines: dict[str, tuple[str, ...]] = {}  # each reading's last problems
        self._counts: dict[str, int] = {}  # the last readings' problems by kind
        self._fits: tuple[PoolLabels, ...] = ()  # what each pool joining the cluster carries
        self._unmet: dict[NodeNeeds, str | None] = {}
        # each pool joining the cluster's gpu_sharing (None: not shared; unset: pools unknown)
        self._sharing: tuple[GpuSharing | None, ...] | None = None
        self._rendered: set[str] = set()  # the pools whose join this source rendered
        self._said: dict[str, frozenset[str]] = {}  # what each reading last warned of
        self._pods: tuple[float, float, Listing] | None = None
        self._nodes: Nodes | None = None
        self._empty_since: dict[str, float] = {}
        self._pools: dict[str, Pool] = {}
        self._lock = threading.Lock()
        self._cache: WatchCache | None = None
        self._cache_lock = threading.Lock()  # held while the cache starts and first syncs
        self.mover = Mover(
            self.api,
            self.rules,
            self.where,
            self._node_key,
            settings.move_hold_s,
            lambda: self._pod_list(None).items,
        )

    @classmethod
    def from_config(cls, settings: Mapping[str, Any], name: str) -> KubernetesSource:
        parsed = validate_settings(KubernetesSettings, dict(settings), field=f"sources.{name}")
        # said at the start, not as a failing read on every tick
        require_extra(
            "the kubernetes source", "kubernetes", ("kubernetes",), field=f"sources.{name}"
        )
        return cls(parsed, name)

    def close(self) -> None:
        with self._cache_lock:
            cache, self._cache = self._cache, None
        if cache is not None:
            cache.stop()
        self.api.close()

    # -- reading ---------------------------------------------------------------------------------

    def _pod_list(self, now: float | None) -> Listing:
        """Every unfinished pod: listed once a tick, the same list serving demand and nodes
        (``now`` is the tick's; None lists afresh)."""
        with self._lock:
            kept = self._pods
        if (
            now is not None
            and kept is not None
            and kept[0] == now
            and time.monotonic() - kept[1] <= REUSE_S
        ):
            return kept[2]
        cache = self._watch_cache()
        listing = cache.pods.snapshot(self.where) if cache is not None else self.api.list_pods()
        with self._lock:
            self._pods = (now if now is not None else float("nan"), time.monotonic(), listing)
        return listing

    def _watch_cache(self) -> WatchCache | None:
        """The watch cache with ``watch_cache`` (started by the first reading, which waits
        for its first lists as it would for a list), else None: list every tick."""
        if not self.settings.watch_cache:
            return None
        with self._cache_lock:
            if self._cache is None:
                self._cache = WatchCache(self.api, self.settings.cache_max_failing_s)
                self._cache.start(self.settings.request_timeout_s)
            return self._cache

    def _read_nodes(self) -> Nodes:
        try:
            cache = self._watch_cache()
            listing = (
                cache.nodes.snapshot(self.where) if cache is not None else self.api.list_nodes()
            )
            nodes = Nodes.read(listing.items, self.rules)
        except BadNodeError as exc:
            raise SourceError(f"{self.where}: list nodes: {exc}") from None
        with self._lock:
            self._nodes = nodes
        return nodes

    def fold_priority_classes(self) -> None:
        """Fold demand per pod ``priorityClassName`` from now on (``FoldsPriorityClasses``)."""
        self.rules = replace(self.rules, fold_classes=True)

    def read(self, now: float) -> Sequence[DemandGroup]:
        fits = self._unmet_of if self._fits else None
        sharing = Sharing(self._sharing, self._onprem_sharing)
        reading = pending_demand(self._pod_list(now).items, self.rules, fits, now, sharing)
        lines: list[str] = []
        for kind, found in reading.problems.items():
            if found or kind in self._counts or kind not in COUNTED_ONCE_SEEN:
                self._counts[kind] = len(found)
            if kind == UNKNOWN_RESOURCE and found:
                lines.append(
                    f"{len(found)} pending pod(s) ask for a GPU resource no setting "
                    f"counts (extra_gpu_resources), counted as demand no pool can host: "
                    f"{describe(found)}"
                )
            elif found:
                lines += found
        self._tell(lines, "pending pod(s)")
        return reading.groups

    def read_nodes(self, now: float) -> NodeReading:
        nodes = self._read_nodes()
        allocation = Allocation.of(self._pod_list(now).items, self.rules)
        reading, self._empty_since = node_reading(nodes, allocation, self._empty_since, now)
        problems = list(nodes.bad)
        problems += [f"counted as fully allocated: {why}" for why in allocation.unreadable.values()]
        self._counts["unreadable-node"] = len(nodes.bad)
        self._counts["unreadable-bound-pod"] = len(allocation.unreadable)
        self._tell(problems, "node(s) or bound pod(s)")
        return reading

    @property
    def problems(self) -> tuple[str, ...]:
        """What the last demand and node readings could not take as it is, one line each."""
        return tuple(line for lines in self._lines.values() for line in lines)

    @property
    def skipped(self) -> int:
        return len(self.problems)

    def reading_problems(self) -> Mapping[str, int]:
        """The last readings' problems by kind (``ReportsProblems``): pending pods counted as
        demand that cannot be met, or off spot, and nodes and bound pods left out."""
        return dict(self._counts)

    def _onprem_sharing(self) -> list[GpuSharing]:
        """How on-prem nodes share their GPUs, asked only for a slice no pool offers."""
        nodes = self._nodes if self._nodes is not None else self._read_nodes()
        found = (n.sharing.as_gpu_sharing() for n in nodes.by_name.values() if not n.managed)
        return [s for s in found if s is not None]

    def _unmet_of(self, pod: Pod) -> str | None:
        """Why no pool's node can meet ``pod``'s node selector, or None (remembered per
        selector: a cluster's pending pods share a few)."""
        if pod.needs not in self._unmet:
            if len(self._unmet) > 4096:
                self._unmet.clear()
            self._unmet[pod.needs] = unmet(pod.needs, self._fits)
        return self._unmet[pod.needs]

    def _tell(self, problems: list[str], what: str) -> None:
        """One warning line when a reading's problems change, not every tick; ``skipped`` and
        ``problems`` are the last reading's."""
        self._lines[what] = tuple(problems)
        said = frozenset(problems)
        if problems and said != self._said.get(what):
            log.warning(
                "%s: %d %s not read as they are: %s",
                self.where,
                len(problems),
                what,
                describe(problems),
            )
        self._said[what] = said

    # -- running jobs and checkpoints ------------------------------------------------------------

    def running_jobs_by_node(self) -> dict[str, list[RunningJob]]:
        """Every node's GPU pods from one pod list (and one node list, for the instance ids)."""
        nodes = self._read_nodes()
        found, bad = running_jobs(self._pod_list(None).items, nodes, self.rules)
        if bad:
            log.warning("%s: %d running pod(s) not read: %s", self.where, len(bad), describe(bad))
        return found

    def running_jobs(self, node: str) -> list[RunningJob]:
        return self.running_jobs_by_node().get(_check_node(node, self.where), [])

    def signal(self, job_id: str, signal: str) -> None:
        """Ask a pod to checkpoint: the annotation ``checkpoint-requested`` set to the time now
        (unix seconds), which the pod's sidecar or trainer watches through a downward-API volume
        (docs/kubernetes.md). ``signal`` is the pod's own declaration and not sent: a container's
        signals are the kubelet's, not the API's. A pod gone since is not an error."""
        namespace, name = _check_job(job_id, self.where)
        if not _SIGNAL.match(signal):
            raise SourceError(f"{self.where}: {signal[:40]!r} is not a signal name")
        self.api.change_pod(
            namespace,
            name,
            {
                "metadata": {
                    "annotations": {
                        self.settings.annotation("checkpoint-requested"): str(int(time.time()))
                    }
                }
            },
        )

    def requeue(self, job_id: str) -> None:
        """Delete a pod whose controller (a Job, a ReplicaSet, ...) makes a new one in its place,
        which the scheduler then places where there is room. A bare pod, or a DaemonSet's, is
        not deleted: nothing would bring it back, or it would come back on the same node."""
        namespace, name = _check_job(job_id, self.where)
        obj = self.api.read_pod(namespace, name)
        if obj is None:
            return
        try:
            pod = read_pod(obj, self.rules, Times())
        except BadPodError as exc:
            raise SourceError(f"{self.where}: requeue {job_id}: {exc}") from None
        if pod.owner_kind is None or pod.daemon:
            what = (
                "a bare pod: no controller makes it again"
                if pod.owner_kind is None
                else (f"a {pod.owner_kind}'s pod: it would come back on the same node")
            )
            raise SourceError(f"{self.where}: requeue {job_id}: not deleted, it is {what}")
        self.api.delete_pod(namespace, name, pod.uid or None)

    # -- moves ------------------------------------------------------------------------------------

    def move_off(self, job_id: str, node: str, for_job: str) -> None:
        """Requeue the pod ``job_id`` running on ``node`` (as ``requeue`` does: a bare pod or a
        DaemonSet's is never moved) and keep the room it leaves for the pending ``for_job``, a
        pod or a gang as demand names it (``moves``): within the owner's bound hold when
        ``bind`` made one there, else a hold of its own."""
        job = _check_job(job_id, self.where)
        owner = _check_owner(for_job, self.where)
        found = self._node(node)
        self.mover.move_off(job, found.name, owner)

    def bind(self, for_job: str, nodes: Sequence[str]) -> None:
        """Keep the room being made on ``nodes`` for the pending ``for_job`` (a pod, or a gang
        as demand names it) from now on: Kubernetes cannot bind a pending pod to a node, so
        each node is held for it at once, before any pod is moved off, by the hold taint that
        only the owner's pods tolerate (``moves``). Binding again to the same nodes writes
        nothing; other nodes end the binding to those left out. Raises ``SourceError`` having
        left no new hold when the owner is not pending or a node cannot be held."""
        owner = _check_owner(for_job, self.where)
        if not nodes:
            raise SourceError(f"{self.where}: bind {for_job}: no node named")
        names = list(dict.fromkeys(self._node(node).name for node in nodes))
        held = self.mover.held_nodes(self._node_objects())
        self.mover.bind(owner, names, held)

    def held_off(self) -> list[HeldOff]:
        """The holds recorded on the nodes (so a restarted controller sees them too)."""
        nodes = self.mover.held_nodes(self._node_objects())
        self._tell_holds(nodes)
        return self.mover.held_off(nodes)

    def _node_objects(self) -> list[Any]:
        """Every node object: from the watch cache with ``watch_cache`` (a hold is written
        afresh under the node's resourceVersion whatever it was found by), else a list."""
        cache = self._watch_cache()
        listing = cache.nodes.snapshot(self.where) if cache is not None else self.api.list_nodes()
        return listing.items

    def _tell_holds(self, nodes: Sequence[HeldNode]) -> None:
        bad = [node.problem for node in nodes if node.problem is not None]
        self._counts["unreadable-hold"] = len(bad)
        self._tell(bad, "node hold(s)")

    def _node_key(self, obj: dict[str, Any]) -> str:
        """What the controller calls a node it has the object of (its name if unreadable)."""
        try:
            return read_node(obj, self.rules).key
        except BadNodeError:
            return str((obj.get("metadata") or {}).get("name") or "")

    # -- draining --------------------------------------------------------------------------------

    def _node(self, key: str) -> Node:
        """The node the controller calls ``key``, from the last node list or a fresh one."""
        _check_node(key, self.where)
        with self._lock:
            nodes = self._nodes
        found = nodes.by_key(key) if nodes is not None else None
        if found is None:
            found = self._read_nodes().by_key(key)
        if found is None:
            raise SourceError(f"{self.where}: no node is instance or node {key}")
        return found

    def _current(self, node: Node) -> Node:
        """The node as it is now (the last node list may be a tick old)."""
        listing = self.api.list_nodes(field_selector=f"metadata.name={node.name}")
        try:
            nodes = Nodes.read(listing.items, self.rules)
        except BadNodeError as exc:
            raise SourceError(f"{self.where}: list nodes: {exc}") from None
        found = nodes.by_name.get(node.name)
        if found is None:
            raise SourceError(f"{self.where}: node {node.name} is gone")
        return found

    def drain(self, node: str, reason: str) -> int:
        """Cordon the node and evict the pods on it that hold no GPU nor a slice of one
        (``nvidia.com/gpu.shared``, ``nvidia.com/mig-…``: a slice holder is work on a GPU, left
        to finish or checkpoint like any GPU pod) (through the Eviction API:
        a PodDisruptionBudget that refuses is asked again next tick); returns how many pods
        still run there, GPU pods and pods still terminating included. DaemonSet and mirror
        pods stay, as ``kubectl drain`` leaves them."""
        found = self._current(self._node(node))
        if not found.cordoned:
            self.api.change_node(
                found.name,
                {
                    "metadata": {
                        "annotations": {self.settings.annotation("drain-reason"): reason[:200]}
                    },
                    "spec": {"unschedulable": True},
                },
            )
        pods, bad = workload(self.api.list_pods_on(found.name), self.rules)
        for pod in pods:
            if pod.gpus or pod.other_gpus or pod.terminating:
                continue
            refused = self.api.evict_pod(pod.namespace, pod.name)
            if refused is not None:
                log.info(
                    "%s: drain %s: pod %s stays: %s", self.where, node, pod.id, refused.message
                )
        return len(pods) + len(bad)

    def evict(self, node: str, reason: str) -> int:
        """Move every pod off a node that is going away (its drain timed out): through the
        Eviction API, or by deletion with ``drain_timeout_action: delete``. Raises, after doing
        what it could, while a PodDisruptionBudget refuses or a pod is still terminating, so the
        node is let go only once its pods are gone; returns how many pods it moved."""
        found = self._node(node)
        pods, bad = workload(self.api.list_pods_on(found.name), self.rules)
        moved, waiting, refused = 0, 0, []
        for pod in pods:
            if pod.terminating:
                waiting += 1
            elif self.settings.drain_timeout_action == "delete":
                self.api.delete_pod(pod.namespace, pod.name, pod.uid or None)
                moved += 1
            else:
                answer = self.api.evict_pod(pod.namespace, pod.name)
                if answer is None:
                    moved += 1
                else:
                    refused.append(f"{pod.id}: {answer.message}")
        if moved and not (refused or bad or waiting):
            # an evicted or deleted pod shuts down within its grace period: the node is let go
            # once it is gone, not under it
            left, bad = workload(self.api.list_pods_on(found.name), self.rules)
            waiting = len(left)
        if refused or bad or waiting:
            said = refused[:1] or bad[:1]
            raise SourceError(
                f"{self.where}: evict {node} ({reason}): moved {moved}, "
                f"{len(refused)} refused, {len(bad)} unreadable, {waiting} still terminating; "
                f"asked again next tick{': ' + said[0] if said else ''}"
            )
        return moved

    # -- placement and the join ------------------------------------------------------------------

    def join_user_data(self, pool: Pool) -> str | None:
        """The boot script of an instance of ``pool`` when ``join_user_data`` asks for it; the
        pool is remembered either way, so ``apply_placement`` knows its nodes' labels."""
        self._pools[kubernetes_join.label_value(pool.name)] = pool
        rendered = kubernetes_join.join_user_data(pool, self.settings, self.name)
        if rendered is not None:
            self._rendered.add(pool.name)
        return rendered

    def know_pools(self, pools: Sequence[Pool]) -> None:
        """The config's pools, once their user data is settled (``KnowsPools``): the labels
        the nodes of each that joins the cluster carry, for ``fit``. A pool whose join is
        not ours may carry any label."""
        extra = self.settings.join.extra_labels if self.settings.join is not None else {}
        self._fits = tuple(
            PoolLabels.of(pool, kubernetes_join.node_labels(pool), extra)
            if pool.name in self._rendered
            else PoolLabels.unknown(pool)
            for pool in pools
            if pool.joins_scheduler
        )
        self._sharing = tuple(p.gpu_sharing for p in pools if p.joins_scheduler)
        self._unmet.clear()

    def apply_placement(self, placement: Placement) -> None:
        """Nothing is written per pod: a pod that may run on spot tolerates the spot taint, a
        protected one lacks the toleration, and the scheduler keeps each where it may go. What
        this keeps is the nodes' side: every managed spot node carries the taint and no other
        managed node does, and a node of a pool this source knows carries its pool's labels
        (market, pool, GPU model). A node is patched only where it differs, under the
        resourceVersion it was read at, so a change made meanwhile is not overwritten. Holds of
        pods moved off a node (``move_off``) that have done their work are lifted."""
        failures: list[str] = []
        try:
            held = self.mover.held_nodes(self._node_objects())
            self._tell_holds(held)
            failures += self.mover.lift(held)
        except SourceError as exc:
            failures.append(str(exc))
        listing = self.api.list_nodes(f"{kubernetes_join.MANAGED_LABEL}=true")
        try:
            nodes = Nodes.read(listing.items, self.rules)
        except BadNodeError as exc:
            raise SourceError(f"{self.where}: placement: {exc}") from None
        for node in nodes.by_name.values():
            patch = self._placement_patch(node)
            if not patch:
                continue
            meta = {**patch.get("metadata", {}), "resourceVersion": node.resource_version}
            try:
                self.api.change_node(node.name, {**patch, "metadata": meta})
            except SourceError as exc:
                failures.append(str(exc))
        if failures:
            more = f" (and {len(failures) - 1} more)" if len(failures) > 1 else ""
            raise SourceError(f"{failures[0]}{more}")

    def _placement_patch(self, node: Node) -> dict[str, Any]:
        patch: dict[str, Any] = {}
        pool = self._pools.get(node.pool or "")
        market = pool.market.value if pool is not None else node.market
        if pool is not None:
            wanted = kubernetes_join.node_labels(pool)
            labels = {k: v for k, v in wanted.items() if node.labels.get(k) != v}
            if labels:
                patch["metadata"] = {"labels": labels}
        spot = self.settings.spot_toleration_key
        tainted = any(t.get("key") == spot for t in node.taints)
        if (market == "spot") != tainted:
            kept = [dict(t) for t in node.taints if t.get("key") != spot]
            if market == "spot":
                kept.append({"key": spot, "value": "true", "effect": "NoSchedule"})
            patch["spec"] = {"taints": kept}
        return patch


def _check_node(node: str, where: str) -> str:
    if not _NODE.match(node):
        raise SourceError(f"{where}: {node[:80]!r} is not a node name or instance id")
    return node


def _check_owner(job_id: str, where: str) -> str:
    """A pending job as demand names it: a pod (``namespace/name``) or a gang
    (``namespace/group``, ``namespace/job/<name>``)."""
    if not _OWNER.match(job_id):
        raise SourceError(f"{where}: {job_id[:80]!r} is not a pod nor a pod group (namespace/name)")
    return job_id


def _check_job(job_id: str, where: str) -> tuple[str, str]:
    match = _JOB.match(job_id)
    if match is None:
        raise SourceError(f"{where}: {job_id[:80]!r} is not a pod (namespace/name)")
    return match[1], match[3]
