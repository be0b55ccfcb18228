"""Whether a pending pod's node selector and required node affinity can be met by a node of any
pool this source joins to the cluster.

Cluster Autoscaler answers this by simulating the scheduler against a template node per node
group; a pod that no template fits never triggers a scale-up ("pod didn't trigger scale-up").
We know what our nodes carry because we wrote the join: the pool's own labels
(``gpu-autoscaler.io/…``), the join's ``extra_labels``, and the well-known labels a kubelet
sets from what the pool is (instance type, zone, ``kubernetes.io/os=linux``). Labels others put
on a node (GPU feature discovery's ``nvidia.com/…``, node feature discovery, the cloud's own, a
hostname) are open: any value may be there. Any other key (``team=ml``) no node of ours
carries, so a pod that requires it can never run on capacity the controller buys: it is demand
that cannot be met, said with the requirement that fails, not a reason to launch nodes it will
never use.

A pool whose boot script is the operator's own (its ``user_data``, or ``join_user_data`` off)
may carry any label: while one such pool joins the cluster, no pod is judged unmet here.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from autoscaler.model import Pool

Requirement = tuple[str, str, tuple[str, ...]]  # label key, operator, values
_INTEGER = re.compile(r"-?[0-9]{1,18}\Z")
KEY_SHOWN = 120  # a label key is at most 317 characters (a 253 prefix, '/', a 63 name)

# Set on nodes by others than the join (kubelet, GPU and node feature discovery, the clouds'
# controllers and managed pools): any value may be there.
OPEN_PREFIXES = (
    "kubernetes.io/",
    "k8s.io/",
    "beta.kubernetes.io/",
    "node.kubernetes.io/",
    "topology.kubernetes.io/",
    "failure-domain.beta.kubernetes.io/",
    "node-role.kubernetes.io/",
    "nvidia.com/",
    "feature.node.kubernetes.io/",
    "eks.amazonaws.com/",
    "cloud.google.com/",
    "kubernetes.azure.com/",
    "topology.gke.io/",
    "topology.ebs.csi.aws.com/",
    "topology.disk.csi.azure.com/",
)
INSTANCE_TYPE_KEYS = ("node.kubernetes.io/instance-type", "beta.kubernetes.io/instance-type")
ZONE_KEYS = ("topology.kubernetes.io/zone", "failure-domain.beta.kubernetes.io/zone")
OS_KEYS = ("kubernetes.io/os", "beta.kubernetes.io/os")


@dataclass(frozen=True)
class NodeNeeds:
    """What a pod asks of its node's labels: every ``selector`` pair, and all the requirements
    of at least one of ``terms`` (none: any node)."""

    selector: tuple[tuple[str, str], ...] = ()
    terms: tuple[tuple[Requirement, ...], ...] = ()

    def __bool__(self) -> bool:
        return bool(self.selector or self.terms)


@dataclass(frozen=True)
class PoolLabels:
    """The labels a node of one pool carries: a key's values (None: any value may be there),
    and whether keys not named may be there too (a pool whose join is not ours)."""

    pool: str
    values: Mapping[str, frozenset[str] | None]
    any_key: bool = False

    @classmethod
    def of(cls, pool: Pool, own: Mapping[str, str], extra: Mapping[str, str]) -> PoolLabels:
        """``own``: the labels the join gives the pool's nodes; ``extra``: the join's
        ``extra_labels``."""
        values: dict[str, frozenset[str] | None] = {k: frozenset({v}) for k, v in extra.items()}
        values.update({k: frozenset({v}) for k, v in own.items()})
        for key in INSTANCE_TYPE_KEYS:
            values[key] = frozenset({pool.instance_type})
        if pool.zone:
            for key in ZONE_KEYS:
                values[key] = frozenset({pool.zone})
        for key in OS_KEYS:
            values[key] = frozenset({"linux"})
        return cls(pool.name, values)

    @classmethod
    def unknown(cls, pool: Pool) -> PoolLabels:
        return cls(pool.name, {}, any_key=True)

    def _possible(self, key: str) -> tuple[bool, frozenset[str] | None]:
        """(whether the key may be on the node, its values or None for any)."""
        if key in self.values:
            return True, self.values[key]
        if self.any_key or key.startswith(OPEN_PREFIXES):
            return True, None
        return False, frozenset()

    def admits(self, requirement: Requirement) -> bool:
        """Whether some node of the pool may meet ``requirement`` (may: open keys always do)."""
        key, operator, wanted = requirement
        present, values = self._possible(key)
        fixed = present and values is not None and key in self.values
        if operator == "In":
            return present and (values is None or bool(values & set(wanted)))
        if operator == "NotIn":
            return not fixed or values is None or bool(values - set(wanted))
        if operator == "Exists":
            return present
        if operator == "DoesNotExist":
            return not fixed
        if operator in ("Gt", "Lt"):
            if not present or len(wanted) != 1 or not _integer(wanted[0]):
                return False
            if values is None:
                return True
            bound = int(wanted[0])
            return any(
                _integer(v) and (int(v) > bound if operator == "Gt" else int(v) < bound)
                for v in values
            )
        return False  # the API server refuses any other operator

    def meets(self, needs: NodeNeeds) -> Requirement | None:
        """None when a node of the pool may meet ``needs``; else the first requirement that
        fails (of the selector, or of the first term)."""
        for key, value in needs.selector:
            requirement = (key, "In", (value,))
            if not self.admits(requirement):
                return requirement
        first: Requirement | None = None
        for term in needs.terms:
            failing = next((r for r in term if not self.admits(r)), None)
            if failing is None:
                return None
            first = first or failing
        return first


def _integer(text: str) -> bool:
    """What the scheduler reads as a Gt/Lt bound: ASCII digits, a sign at most."""
    return _INTEGER.match(text) is not None


def describe(requirement: Requirement) -> str:
    key, operator, values = requirement
    key = key[:KEY_SHOWN] + ("…" if len(key) > KEY_SHOWN else "")
    shown = ",".join(v[:63] for v in values[:4]) + (",…" if len(values) > 4 else "")
    if operator == "In" and len(values) == 1:
        return f"{key}={shown}"
    if operator in ("Exists", "DoesNotExist"):
        return f"{key} {operator}"
    return f"{key} {operator} ({shown})"


def unmet(needs: NodeNeeds, pools: Sequence[PoolLabels]) -> str | None:
    """Why no pool's node can meet ``needs`` (one line), or None when one may (or when no pool
    joins the cluster at all: nothing is known to compare with)."""
    if not needs or not pools:
        return None
    failing: list[Requirement] = []
    for pool in pools:
        found = pool.meets(needs)
        if found is None:
            return None
        failing.append(found)
    return f"a node with {describe(failing[0])}"
