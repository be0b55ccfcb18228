"""Which jobs no capacity of the fleet can ever host, and why.

A job asking for a GPU model no pool offers, more GPUs per node than any instance has, or more
nodes at once than a pool may launch, waits forever whatever the policy does. It is never put on
other GPUs; it is named instead: by the live controller in its log and its metrics every tick it
is pending, and by ``validate`` and ``report`` before a replay starts.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from autoscaler.model import DemandGroup, NodeShape, OnPremNode, Pool


@dataclass(frozen=True)
class NodeOffer:
    """One kind of node the fleet has or can buy: its GPUs, and how many of it one job may get
    at once (None: no limit)."""

    gpus: int
    gpu_model: str | None
    gpu_memory_gib: float | None
    at_most: int | None
    name: str


OnPremKinds = Mapping[tuple[int, str | None, float | None], int]


def onprem_kinds(onprem: Iterable[OnPremNode]) -> OnPremKinds:
    """On-prem nodes counted by what they have (GPUs, model, memory per GPU)."""
    counted: dict[tuple[int, str | None, float | None], int] = {}
    for node in onprem:
        key = (node.gpus, node.gpu_model, node.gpu_memory_gib)
        counted[key] = counted.get(key, 0) + 1
    return counted


def offers_of(pools: Iterable[Pool], onprem: OnPremKinds) -> list[NodeOffer]:
    """Every pool as an offer, and each kind of on-prem node with how many there are."""
    offers = [
        NodeOffer(p.gpus_per_instance, p.gpu_model, p.gpu_memory_gib, p.max_instances, p.name)
        for p in pools
    ]
    for (gpus, model, memory), count in onprem.items():
        offers.append(NodeOffer(gpus, model, memory, count, f"on-prem {gpus}x{model or 'GPU'}"))
    return offers


def can_host(shape: NodeShape, nodes: int, offers: Sequence[NodeOffer]) -> bool:
    """Some offer holds every node of the job at once."""
    return any(
        shape.accepts(o.gpus, o.gpu_model, o.gpu_memory_gib)
        and (o.at_most is None or o.at_most >= nodes)
        for o in offers
    )


def why_not(shape: NodeShape, nodes: int, offers: Sequence[NodeOffer]) -> str:
    """One line saying what the job asks for and what stands closest to it."""
    wanted = f"{nodes} node(s) of {shape.describe()}"
    fitting = [o for o in offers if shape.accepts(o.gpus, o.gpu_model, o.gpu_memory_gib)]
    if fitting:
        most = max((o.at_most or 0) for o in fitting)
        return f"needs {wanted} at once; the fitting capacity allows at most {most} at once"
    if not offers:
        return f"needs {wanted}; no capacity is configured"
    return f"needs {wanted}; no pool or on-prem node has such GPUs"


@dataclass(frozen=True)
class Unhostable:
    """Pending jobs of one shape that no capacity can host."""

    shape: NodeShape
    nodes: int
    jobs: int
    reason: str

    @property
    def label(self) -> str:
        return f"{self.nodes}x{self.shape.describe()}"


def unhostable_groups(
    groups: Iterable[DemandGroup], offers: Sequence[NodeOffer]
) -> list[Unhostable]:
    """The pending demand no offer can ever host, folded by shape."""
    found: dict[tuple[NodeShape, int], int] = {}
    verdicts: dict[tuple[NodeShape, int], bool] = {}
    for group in groups:
        shape = group.shape
        fits = verdicts.get((shape, group.nodes))
        if fits is None:
            fits = verdicts[(shape, group.nodes)] = can_host(shape, group.nodes, offers)
        if not fits:
            key = (shape, group.nodes)
            found[key] = found.get(key, 0) + group.jobs
    return [
        Unhostable(shape, nodes, jobs, why_not(shape, nodes, offers))
        for (shape, nodes), jobs in sorted(found.items(), key=lambda kv: (-kv[1], str(kv[0])))
    ]
