"""Shared GPUs as the NVIDIA GPU operator advertises them to Kubernetes, and the slice of one a
pod asks for.

What the operator's device plugin and GPU feature discovery (GFD) publish, per the GPU
operator's docs ("Time-Slicing GPUs in Kubernetes", "Multi-Process Service in Kubernetes",
"GPU Operator with MIG") and the k8s-device-plugin / gpu-feature-discovery READMEs:

- **Time-slicing** (``sharing.timeSlicing.resources: [{name: nvidia.com/gpu, replicas: N}]``):
  the node's allocatable ``nvidia.com/gpu`` is GPUs x N, or, with ``renameByDefault: true``,
  ``nvidia.com/gpu`` is 0 and ``nvidia.com/gpu.shared`` is GPUs x N. GFD labels the node
  ``nvidia.com/gpu.replicas=N``, ``nvidia.com/gpu.sharing-strategy=time-slicing`` (``mps`` for
  MPS, ``none`` unshared), ``nvidia.com/gpu.count`` = the physical GPUs, and, without the
  rename, ``nvidia.com/gpu.product=<model>-SHARED``. A pod takes k of the N replicas of a GPU
  (``failRequestsGreaterThanOne`` keeps k at 1): k/N of it.
- **MIG** (the GPU operator's ``mig.strategy``, GFD's ``nvidia.com/mig.strategy`` label, the
  MIG manager's ``nvidia.com/mig.config`` label naming the layout applied): ``mixed`` advertises
  each profile as ``nvidia.com/mig-<c>g.<m>gb`` (with ``nvidia.com/mig-<profile>.count``
  labels) beside ``nvidia.com/gpu`` for GPUs not cut; ``single`` advertises the instances as
  ``nvidia.com/gpu`` and labels ``nvidia.com/gpu.product=<model>-MIG-<profile>``. An instance
  of profile ``<c>g`` is ``c`` of the GPU's 7 compute slices: c/7 of it.

A pod asks for a slice when it asks ``nvidia.com/gpu.shared`` or ``nvidia.com/mig-<profile>``
(unless the settings' ``extra_gpu_resources`` count that resource as whole GPUs, as before), or
``nvidia.com/gpu`` with a node selector (or every term of its required node affinity) on
``nvidia.com/gpu.replicas``, ``nvidia.com/gpu.sharing-strategy`` (time-slicing, mps) or a
``-SHARED`` / ``-MIG-<profile>`` product: what the operator's docs tell users to select shared
GPUs by. A plain ``nvidia.com/gpu: 1`` without such a selector is a whole GPU, whatever nodes
share: the scheduler may put it on a whole GPU, and buying for less would leave it waiting.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from fractions import Fraction

from autoscaler.model.sharing import MIG_COMPUTE_SLICES, GpuSharing, SharingMode
from autoscaler.sources.kubernetes.fit import NodeNeeds

GPU = "nvidia.com/gpu"
SHARED_RESOURCE = "nvidia.com/gpu.shared"
MIG_RESOURCE_PREFIX = "nvidia.com/mig-"
REPLICAS_LABEL = "nvidia.com/gpu.replicas"
SHARING_LABEL = "nvidia.com/gpu.sharing-strategy"
GPU_COUNT_LABEL = "nvidia.com/gpu.count"
PRODUCT_LABEL = "nvidia.com/gpu.product"
MIG_STRATEGY_LABEL = "nvidia.com/mig.strategy"
MIG_CONFIG_LABEL = "nvidia.com/mig.config"
SHARED_SUFFIX = "-SHARED"
TIME_SHARED = frozenset({"time-slicing", "mps"})
_PROFILE = re.compile(r"([1-7])g\.[0-9]{1,4}gb(\+me)?")
_MIG_PRODUCT = re.compile(r"-MIG-([1-7]g\.[0-9]{1,4}gb(?:\+me)?)")
_COUNT = re.compile(r"[0-9]{1,6}\Z")
# instances of one profile a GPU holds at most (A100/H100 MIG): 7 x 1g, 3 x 2g, 2 x 3g, 1 x 4g/7g
INSTANCES_PER_GPU = {1: 7, 2: 3, 3: 2, 4: 1, 7: 1}


def mig_profile(resource: str) -> str | None:
    """``1g.10gb`` of ``nvidia.com/mig-1g.10gb``; None for any other resource."""
    if not resource.startswith(MIG_RESOURCE_PREFIX):
        return None
    profile = resource.removeprefix(MIG_RESOURCE_PREFIX)
    found = _PROFILE.fullmatch(profile)
    return profile if found is not None and int(found.group(1)) in INSTANCES_PER_GPU else None


def is_slice_resource(resource: str) -> bool:
    """Whether ``resource`` is a slice of a shared GPU: ``nvidia.com/gpu.shared`` or a MIG
    profile's ``nvidia.com/mig-<profile>``."""
    return resource == SHARED_RESOURCE or mig_profile(resource) is not None


def compute_of(profile: str) -> int:
    """The sevenths of a GPU a profile's instance is (``3g.40gb``: 3)."""
    return int(profile.split("g.", 1)[0])


def product_model(product: str) -> str:
    """The GPU model in a product label, without what sharing appends to it
    (``A100-SXM4-40GB-MIG-1g.5gb-SHARED`` is ``A100-SXM4-40GB``)."""
    found = _MIG_PRODUCT.search(product)
    if found is not None:
        product = product[: found.start()]
    return product.removesuffix(SHARED_SUFFIX)


def _count(text: str | None) -> int | None:
    return int(text) if text is not None and _COUNT.match(text) else None


@dataclass(frozen=True)
class NodeSharing:
    """How a node's GPUs are shared, read from its labels and allocatable resources: its
    physical ``gpus``, and the share of one GPU a unit of each GPU resource is (a replica's
    1/N, a MIG instance's c/7, a whole GPU's 1). ``shared``: whether any unit is a slice."""

    gpus: int
    shares: Mapping[str, Fraction] = field(default_factory=dict)
    replicas: int | None = None  # time-slicing: the units each GPU is advertised as
    profiles: tuple[str, ...] = ()  # MIG: the profiles advertised

    @property
    def shared(self) -> bool:
        return any(share < 1 for share in self.shares.values())

    def as_gpu_sharing(self) -> GpuSharing | None:
        """The node's sharing as a pool states one; None where it is not shared or is shared
        in a way a pool cannot state (more replicas than ``GpuSharing`` takes)."""
        try:
            if self.replicas is not None:
                return GpuSharing(mode=SharingMode.TIME_SLICING, replicas=self.replicas)
            if self.profiles:
                return GpuSharing(mode=SharingMode.MIG, profiles=self.profiles)
        except ValueError:
            return None
        return None

    def held(self, asked: Mapping[str, int]) -> tuple[Fraction, int]:
        """(GPUs' worth held, GPUs with a slice or more on them at most) by bound pods asking
        ``asked`` (resource -> units) in all. Which GPU the device plugin gave each replica is
        not published, so the GPUs taken count as many as could carry one: a node is never
        taken for emptier than it may be."""
        worth = Fraction(0)
        pieces = 0
        for resource, units in asked.items():
            share = self.shares.get(resource, Fraction(1))
            if units > 0:
                worth += share * units
                pieces += units
        return min(worth, Fraction(self.gpus)), min(pieces, self.gpus)


def node_sharing(
    labels: Mapping[str, str], allocatable: Mapping[str, int], counted: tuple[str, ...]
) -> NodeSharing:
    """A node's physical GPUs and how they are shared. ``allocatable``: its extended resources
    as counts; ``counted``: the resources the settings count as whole GPUs."""
    replicas = _count(labels.get(REPLICAS_LABEL))
    strategy = labels.get(SHARING_LABEL)
    physical = _count(labels.get(GPU_COUNT_LABEL))
    whole = allocatable.get(GPU, 0)
    extra = sum(n for r, n in allocatable.items() if r in counted and r != GPU)
    if SHARED_RESOURCE in counted:
        return NodeSharing(whole + extra)  # the settings count its replicas as whole GPUs
    if replicas is not None and replicas > 1 and strategy in (None, *TIME_SHARED):
        advertised = whole + allocatable.get(SHARED_RESOURCE, 0)
        gpus = physical if physical else math.ceil(advertised / replicas)
        slice_ = Fraction(1, replicas)
        return NodeSharing(gpus + extra, {GPU: slice_, SHARED_RESOURCE: slice_}, replicas=replicas)
    if labels.get(MIG_STRATEGY_LABEL) == "single":
        found = _MIG_PRODUCT.search(labels.get(PRODUCT_LABEL, ""))
        if found is not None and whole:
            profile = found.group(1)
            compute = compute_of(profile)
            cut = math.ceil(whole / INSTANCES_PER_GPU[compute])
            return NodeSharing(
                cut + extra,
                {GPU: Fraction(compute, MIG_COMPUTE_SLICES)},
                profiles=(profile,),
            )
    mig = {
        r: profile
        for r, n in allocatable.items()
        if n > 0 and r not in counted and (profile := mig_profile(r)) is not None
    }
    if mig:
        cut = sum(
            math.ceil(allocatable[r] / INSTANCES_PER_GPU[compute_of(p)]) for r, p in mig.items()
        )
        # GFD's gpu.count is every physical GPU, cut or not, under the mixed strategy
        gpus = max(physical or 0, whole + cut)
        shares = {r: Fraction(compute_of(p), MIG_COMPUTE_SLICES) for r, p in mig.items()}
        return NodeSharing(gpus + extra, shares, profiles=tuple(sorted(mig.values())))
    return NodeSharing(whole + extra)


@dataclass(frozen=True)
class Slice:
    """A pod's ask of a shared GPU: ``share`` of one GPU (None: the replicas it is counted
    against are not known from the pod, and come from the pools and nodes that time-slice),
    how it is shared, the MIG profile for MIG."""

    mode: SharingMode
    units: int  # replicas or MIG instances asked
    replicas: int | None = None
    profile: str | None = None

    def share(self, replicas: int | None = None) -> Fraction | None:
        """Of one GPU; for time-slicing against ``replicas`` when the pod did not say."""
        if self.mode is SharingMode.MIG:
            assert self.profile is not None
            return Fraction(self.units * compute_of(self.profile), MIG_COMPUTE_SLICES)
        known = self.replicas or replicas
        return Fraction(self.units, known) if known else None

    def hosted_by(self, sharing: GpuSharing | None) -> bool:
        """Whether GPUs shared this way can give the pod its slice."""
        if sharing is None or sharing.mode is not self.mode:
            return False
        if self.mode is SharingMode.MIG:
            return self.profile in sharing.profiles
        return self.replicas is None or sharing.replicas == self.replicas

    def describe(self) -> str:
        if self.mode is SharingMode.MIG:
            return f"a GPU cut in MIG {self.profile} instances"
        if self.replicas:
            return f"a GPU time-sliced in {self.replicas} replicas"
        return "a time-sliced GPU"


def _selected(needs: NodeNeeds, key: str) -> str | None:
    """The one value ``needs`` pins ``key`` to: its node selector's, else the value every term
    of its required node affinity asks ``In`` alone."""
    for found, value in needs.selector:
        if found == key:
            return value
    values: set[str] = set()
    for term in needs.terms:
        pinned = [v[0] for k, op, v in term if k == key and op == "In" and len(v) == 1]
        if not pinned:
            return None
        values.add(pinned[0])
    return values.pop() if len(values) == 1 else None


def pod_slice(gpus: int, other: str | None, other_units: int, needs: NodeNeeds) -> Slice | None:
    """The slice a pod asks: ``gpus`` of the counted GPU resources, or ``other_units`` of a GPU
    resource nobody counts (``other``); None when it asks whole GPUs (or nothing shared)."""
    if other is not None and not gpus:
        if other == SHARED_RESOURCE:
            replicas = _count(_selected(needs, REPLICAS_LABEL))
            return Slice(SharingMode.TIME_SLICING, other_units, replicas or None)
        profile = mig_profile(other)
        if profile is not None:
            return Slice(SharingMode.MIG, other_units, profile=profile)
        return None
    if not gpus:
        return None
    product = _selected(needs, PRODUCT_LABEL) or ""
    mig = _MIG_PRODUCT.search(product)
    if mig is not None:
        return Slice(SharingMode.MIG, gpus, profile=mig.group(1))
    replicas = _count(_selected(needs, REPLICAS_LABEL))
    if replicas is not None and replicas > 1:
        return Slice(SharingMode.TIME_SLICING, gpus, replicas)
    if _selected(needs, SHARING_LABEL) in TIME_SHARED or product.endswith(SHARED_SUFFIX):
        return Slice(SharingMode.TIME_SLICING, gpus, None)
    return None
