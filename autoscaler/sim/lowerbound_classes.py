"""Which jobs the lower bound prices alike: shape classes, their cloud price and on-prem share.

A job can run only where one node of its shape fits (``NodeShape.accepts``, the one definition of
"fits" the controller and the simulator use too). Jobs whose shapes fit the same pools and the
same on-prem nodes are interchangeable for the bound, so they form one *class*; each class gets
its own cloud price (the cheapest per-GPU price among the pools that can host it) and the on-prem
*groups* it may draw from. docs/lower-bound.md says why each step keeps the bound a bound.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import numpy.typing as npt

from autoscaler.model import NodeShape, OnPremNode, Pool
from autoscaler.model.gpus import memory_gib
from autoscaler.model.shapes import NodeOffer, can_host, offers_of, onprem_kinds
from autoscaler.sim.cloud import PoolMarketModel
from autoscaler.sim.series import StepSeries

HOUR = 3600.0

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


class ShapedJob(Protocol):
    """What the bound reads of a replayed job (``TraceJob`` is one).

    ``nodes``, ``gpu_models`` and ``min_gpu_memory_gib`` are read with defaults (one node, any
    model, any memory) so that jobs from traces that do not carry them still count.
    """

    @property
    def submit(self) -> float: ...

    @property
    def duration(self) -> float: ...

    @property
    def gpus(self) -> int: ...


class OnPremKind(Protocol):
    """One kind of on-prem node (``OnPremNodeSpec`` is one)."""

    @property
    def gpus(self) -> int: ...

    @property
    def gpu_model(self) -> str | None: ...

    @property
    def count(self) -> int: ...


@dataclass(frozen=True)
class BoundClass:
    """Jobs the bound treats alike: one cloud price series and the on-prem groups they may use.

    ``price`` is $ per GPU-hour at each moment, ``inf`` where no pool that can host the class is
    on offer; ``onprem`` indexes ``BoundProblem.onprem_gpus``.
    """

    price: StepSeries
    onprem: tuple[int, ...] = (0,)
    label: str = ""


@dataclass(frozen=True)
class BoundProblem:
    """Everything the bound needs, as arrays: one row per job, ``cls`` indexing ``classes``.

    ``onprem_gpus`` is each on-prem group's GPU count; a group is shared by every class that
    lists it. Excluded jobs (no shape can ever host them) are only counted here.
    """

    submit: FloatArray
    duration: FloatArray
    gpus: FloatArray
    cls: IntArray
    classes: tuple[BoundClass, ...]
    onprem_gpus: tuple[float, ...]
    horizon_s: float
    excluded_jobs: int = 0
    excluded_gpu_hours: float = 0.0


def job_shape(job: ShapedJob) -> NodeShape:
    """What one node of the job must offer: its GPUs split evenly over its nodes."""
    nodes = max(1, int(getattr(job, "nodes", 1) or 1))
    models = tuple(getattr(job, "gpu_models", ()) or ())
    memory = getattr(job, "min_gpu_memory_gib", None)
    return NodeShape.model_construct(
        gpus=max(1, job.gpus // nodes), gpu_models=models, min_gpu_memory_gib=memory
    )


def _changes(follow: Callable[[float], float], horizon_s: float) -> list[float]:
    """The change points in (0, horizon) of a series given by its ``next_change``.

    A looping series computes its next change with ``divmod``, which can round back onto the
    moment it was asked about; stepping past it keeps the walk from stalling there.
    """
    found: list[float] = []
    t = 0.0
    while True:
        following = follow(t)
        probe = t
        while following <= t:
            probe = max(math.nextafter(probe, math.inf), probe + 1e-9 * abs(probe))
            following = follow(probe)
        if following >= horizon_s:
            return found
        found.append(following)
        t = following


@dataclass(frozen=True)
class OfferTable:
    """Each pool's $ per GPU-hour at every moment any pool's price or availability changes,
    ``inf`` while the pool has no capacity: computed once, then read per class."""

    times: FloatArray
    per_gpu: FloatArray  # len(times) × len(pools)

    @classmethod
    def build(
        cls, markets: Mapping[str, PoolMarketModel], pools: Sequence[Pool], horizon_s: float
    ) -> OfferTable:
        changes = {0.0}
        for pool in pools:
            market = markets[pool.name]
            followers = [market.price.next_change]
            if market.availability is not None:
                followers.append(market.availability.next_change)
            for follow in followers:
                changes.update(_changes(follow, horizon_s))
        times = np.array(sorted(changes), dtype=np.float64)
        per_gpu = np.full((len(times), len(pools)), math.inf)
        for column, pool in enumerate(pools):
            market = markets[pool.name]
            for row, t in enumerate(times.tolist()):
                if market.capacity(t) > 0:
                    per_gpu[row, column] = market.price.at(t) / pool.gpus_per_instance
        return cls(times, per_gpu)

    def cheapest(self, columns: Sequence[int]) -> StepSeries:
        """The cheapest of these pools at each moment (``inf`` where none is on offer)."""
        if not columns:
            return StepSeries([0.0], [math.inf])
        values = np.min(self.per_gpu[:, list(columns)], axis=1)
        keep = np.ones(len(values), dtype=bool)
        keep[1:] = values[1:] != values[:-1]
        return StepSeries(self.times[keep].tolist(), values[keep].tolist())


def cheapest_gpu_price(
    markets: Mapping[str, PoolMarketModel], pools: Sequence[Pool], horizon_s: float
) -> StepSeries:
    """$ per GPU-hour of the cheapest pool on offer at each moment of [0, horizon].

    A pool counts only while its availability trace gives it capacity; how much capacity does not
    matter, because the bound may buy any amount at the cheapest price (a relaxation). ``inf``
    where nothing is on offer, so the bound knows the cloud cannot be used then.
    """
    return OfferTable.build(markets, pools, horizon_s).cheapest(range(len(pools)))


def _never_offered(price: StepSeries, horizon_s: float) -> bool:
    return all(
        math.isinf(v) for t, v in zip(price.times, price.values, strict=True) if t < horizon_s
    )


def onprem_memory(kind: OnPremKind) -> float | None:
    """GPU memory of an on-prem node kind: as given, else as its model's name says (the
    simulator's on-prem nodes take it the same way)."""
    given = getattr(kind, "gpu_memory_gib", None)
    return float(given) if given is not None else memory_gib(kind.gpu_model)


def _offers(onprem: Sequence[OnPremKind], pools: Sequence[Pool]) -> list[NodeOffer]:
    """The fleet as ``autoscaler.model.shapes`` sees it, so "can ever run" means the same here as in
    ``validate``, the report's note and the controller's unhostable-jobs metric."""
    nodes = [
        OnPremNode(
            name=f"onprem-{i}-{n}",
            gpus=kind.gpus,
            gpu_model=kind.gpu_model,
            gpu_memory_gib=onprem_memory(kind),
        )
        for i, kind in enumerate(onprem)
        for n in range(kind.count)
    ]
    return offers_of(pools, onprem_kinds(nodes))


def _where_it_fits(
    shape: NodeShape,
    nodes: int,
    onprem: Sequence[OnPremKind],
    pools: Sequence[Pool],
    offers: Sequence[NodeOffer],
) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """(pools, on-prem kinds) one node of the job fits, or None if the job can never run.

    A job runs only where one offer holds all its nodes at once (``shapes.can_host``). Its GPUs
    may be priced at any pool its node shape fits (a gang that mixed pools would pay at least
    that), and may use on-prem kinds it fits only if there are at least ``nodes`` such on-prem
    nodes in all: a gang runs on on-prem nodes only all together.
    """
    if not can_host(shape, nodes, offers):
        return None
    hosts = tuple(i for i, p in enumerate(pools) if p.can_host(shape))
    kinds = tuple(
        i
        for i, kind in enumerate(onprem)
        if shape.accepts(kind.gpus, kind.gpu_model, onprem_memory(kind))
    )
    if sum(onprem[i].count for i in kinds) < nodes:
        kinds = ()
    return hosts, kinds


def _gpu_hours_in(job: ShapedJob, horizon_s: float) -> float:
    return job.gpus * min(max(0.0, job.duration), max(0.0, horizon_s - job.submit)) / HOUR


def build_problem(
    jobs: Sequence[ShapedJob],
    onprem: Sequence[OnPremKind],
    pools: Sequence[Pool],
    markets: Mapping[str, PoolMarketModel],
    horizon_s: float,
) -> BoundProblem:
    """Jobs grouped into classes by where they fit; jobs that can never run counted, not bounded.

    On-prem node kinds that serve the same classes are merged into one group: the bound never
    tells them apart, and fewer groups keep the LP small.
    """
    offers = _offers(onprem, pools)
    shapes: dict[tuple[int, tuple[str, ...], float | None, int], int] = {}
    class_keys: dict[tuple[tuple[int, ...], tuple[int, ...]], int] = {}
    labels: list[list[str]] = []
    job_class: list[int] = []
    kept: list[int] = []
    excluded = 0
    excluded_hours = 0.0
    for index, job in enumerate(jobs):
        shape = job_shape(job)
        nodes = max(1, int(getattr(job, "nodes", 1) or 1))
        key = (shape.gpus, shape.gpu_models, shape.min_gpu_memory_gib, nodes)
        if key not in shapes:
            pair = _where_it_fits(shape, nodes, onprem, pools, offers)
            if pair is None:
                shapes[key] = -1
            else:
                if pair not in class_keys:
                    class_keys[pair] = len(class_keys)
                    labels.append([])
                described = shape.describe() if nodes == 1 else f"{nodes} × {shape.describe()}"
                labels[class_keys[pair]].append(described)
                shapes[key] = class_keys[pair]
        found = shapes[key]
        if found < 0:
            excluded += 1
            excluded_hours += _gpu_hours_in(job, horizon_s)
            continue
        kept.append(index)
        job_class.append(found)

    table = OfferTable.build(markets, pools, horizon_s)
    pairs = sorted(class_keys, key=class_keys.__getitem__)
    prices = [table.cheapest(hosts) for hosts, _ in pairs]
    # A class whose pools are never on offer and that no on-prem node fits can never run.
    unrunnable = {
        c
        for c, (_, kinds) in enumerate(pairs)
        if not kinds and _never_offered(prices[c], horizon_s)
    }
    # Merge on-prem node kinds by the set of classes they serve.
    served: dict[int, set[int]] = {}
    for c, (_, kinds) in enumerate(pairs):
        if c in unrunnable:
            continue
        for kind in kinds:
            served.setdefault(kind, set()).add(c)
    groups: dict[frozenset[int], int] = {}
    group_gpus: list[float] = []
    node_group: dict[int, int] = {}
    for node in sorted(served):
        who = frozenset(served[node])
        if who not in groups:
            groups[who] = len(groups)
            group_gpus.append(0.0)
        node_group[node] = groups[who]
        group_gpus[groups[who]] += float(onprem[node].gpus * onprem[node].count)
    runnable = [c for c in range(len(pairs)) if c not in unrunnable]
    renumber = {c: i for i, c in enumerate(runnable)}
    classes = tuple(
        BoundClass(
            price=prices[c],
            onprem=tuple(sorted({node_group[n] for n in pairs[c][1]})),
            label="; ".join(labels[c]),
        )
        for c in runnable
    )
    submit: list[float] = []
    duration: list[float] = []
    gpus: list[float] = []
    cls: list[int] = []
    for index, c in zip(kept, job_class, strict=True):
        job = jobs[index]
        if c in unrunnable:
            excluded += 1
            excluded_hours += _gpu_hours_in(job, horizon_s)
            continue
        submit.append(job.submit)
        duration.append(job.duration)
        gpus.append(float(job.gpus))
        cls.append(renumber[c])
    return BoundProblem(
        submit=np.array(submit, dtype=np.float64),
        duration=np.array(duration, dtype=np.float64),
        gpus=np.array(gpus, dtype=np.float64),
        cls=np.array(cls, dtype=np.int64),
        classes=classes,
        onprem_gpus=tuple(group_gpus),
        horizon_s=horizon_s,
        excluded_jobs=excluded,
        excluded_gpu_hours=excluded_hours,
    )
