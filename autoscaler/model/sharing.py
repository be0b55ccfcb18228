"""How a node's GPUs may be shared between jobs that each ask for a fraction of one.

Two ways exist on NVIDIA GPUs, and each hands out whole *slices* of a GPU, never a float:

- ``time-slicing``: the device plugin (GPU operator ``sharing.timeSlicing.resources[].replicas``)
  advertises each GPU as ``replicas`` units; a pod asks for units and the GPU is shared in time,
  without memory or fault isolation. A job wanting a fraction ``f`` of a GPU takes
  ``ceil(f * replicas)`` of its ``replicas`` units.
- ``mig``: Multi-Instance GPU cuts an A100/H100/H200 into instances named ``<c>g.<m>gb``
  (A100-40GB: 1g.5gb, 1g.10gb, 2g.10gb, 3g.20gb, 4g.20gb, 7g.40gb), ``c`` of the GPU's 7
  compute slices each. A job wanting ``f`` takes the smallest listed profile whose compute share
  ``c / 7`` is at least ``f``.

Slices are integers (units of ``replicas``, or sevenths), so "no GPU holds more than one GPU's
worth" is an exact integer comparison. A job whose fraction no listed profile covers takes a
whole GPU, as it would on a GPU that is not shared.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from enum import StrEnum
from fractions import Fraction
from typing import Annotated

from pydantic import AfterValidator, Field, model_validator

from autoscaler.model.frozen import Frozen

MIG_COMPUTE_SLICES = 7
MAX_REPLICAS = 64
_MIG_PROFILE = re.compile(r"^([1-7])g\.([1-9][0-9]{0,3})gb(\+me)?$")
_MIG_COMPUTE = frozenset({1, 2, 3, 4, 7})


class SharingMode(StrEnum):
    TIME_SLICING = "time-slicing"
    MIG = "mig"


def _mig_profile(name: str) -> str:
    found = _MIG_PROFILE.match(name)
    if found is None or int(found.group(1)) not in _MIG_COMPUTE:
        raise ValueError(
            f"expected a MIG profile name such as 1g.5gb, 2g.10gb, 3g.20gb, 4g.20gb or 7g.40gb "
            f"(1, 2, 3, 4 or 7 compute slices), got {name[:40]!r}"
        )
    return name


MigProfile = Annotated[str, AfterValidator(_mig_profile)]


def mig_compute(profile: str) -> int | None:
    """The sevenths of a GPU an instance of a MIG profile is (``3g.20gb``: 3); None for a name
    that is not a MIG profile's."""
    found = _MIG_PROFILE.match(profile)
    if found is None or int(found.group(1)) not in _MIG_COMPUTE:
        return None
    return int(found.group(1))


Share = float | Fraction  # of one GPU: a trace's decimal, or a live source's exact k/N


def exact(fraction: Share) -> Fraction:
    """The fraction as the decimal the trace wrote (0.3 is 3/10, not 0.299999...), so that
    ``ceil(0.3 * 10)`` is 3 slices and not 4; an exact one (a live source's 5 of 6 replicas)
    as it is."""
    if isinstance(fraction, Fraction):
        return fraction
    return Fraction(repr(fraction))


class GpuSharing(Frozen):
    """A node's (or a pool's instances') GPUs may be shared: ``{mode: time-slicing, replicas: N}``
    or ``{mode: mig, profiles: [1g.5gb, 2g.10gb, ...]}``."""

    mode: SharingMode
    replicas: int | None = Field(None, ge=2, le=MAX_REPLICAS)
    profiles: tuple[MigProfile, ...] = Field((), max_length=16)

    @model_validator(mode="after")
    def _shape_fits_mode(self) -> GpuSharing:
        if self.mode is SharingMode.TIME_SLICING:
            if self.replicas is None:
                raise ValueError("time-slicing needs replicas: how many units each GPU is cut in")
            if self.profiles:
                raise ValueError("profiles are MIG's; time-slicing takes replicas only")
        else:
            if not self.profiles:
                raise ValueError("mig needs profiles: the MIG profiles jobs may be given")
            if self.replicas is not None:
                raise ValueError("replicas are time-slicing's; mig takes profiles only")
        return self

    @property
    def units(self) -> int:
        """Slices in one GPU."""
        if self.mode is SharingMode.TIME_SLICING:
            assert self.replicas is not None
            return self.replicas
        return MIG_COMPUTE_SLICES

    def slices_for(self, fraction: Share) -> int | None:
        """The slices a job asking ``fraction`` of a GPU takes; None when it needs a whole GPU
        (a fraction of 1 or more, or one no MIG profile covers)."""
        wanted = exact(fraction)
        if wanted <= 0 or wanted >= 1:
            return None
        if self.mode is SharingMode.TIME_SLICING:
            slices = max(1, math.ceil(wanted * self.units))
            return slices if slices < self.units else None
        covering = [c for c in self.compute_slices() if Fraction(c, MIG_COMPUTE_SLICES) >= wanted]
        if not covering or min(covering) >= MIG_COMPUTE_SLICES:
            return None
        return min(covering)

    def profile_for(self, fraction: Share) -> str | None:
        """The MIG profile a job asking ``fraction`` is given (the smallest that covers it; of
        two with the same compute, the one listed first); None for time-slicing or a whole GPU."""
        if self.mode is not SharingMode.MIG:
            return None
        slices = self.slices_for(fraction)
        if slices is None:
            return None
        return next(p for p in self.profiles if int(p.split("g.", 1)[0]) == slices)

    def compute_slices(self) -> tuple[int, ...]:
        return tuple(sorted({int(p.split("g.", 1)[0]) for p in self.profiles}))

    def describe(self) -> str:
        if self.mode is SharingMode.TIME_SLICING:
            return f"time-slicing, {self.replicas} replicas per GPU"
        return "MIG " + ", ".join(self.profiles)


def worst_slice(fraction: Share, pool_sharings: Sequence[GpuSharing | None]) -> Fraction | None:
    """The largest slice, in GPUs, any of these pools would give a job asking ``fraction`` of a
    GPU; None when some pool would give it a whole GPU (one that does not share, or whose
    slices do not cover the fraction) or there is no pool."""
    if not pool_sharings:
        return None
    worst = Fraction(0)
    for sharing in pool_sharings:
        if sharing is None:
            return None
        slices = sharing.slices_for(fraction)
        if slices is None:
            return None
        worst = max(worst, Fraction(slices, sharing.units))
    return worst


def whole_gpus(
    counts: Sequence[tuple[Share | None, int]], pool_sharings: Sequence[GpuSharing | None]
) -> int:
    """The whole GPUs pending one-GPU jobs need, given as (fraction asked, jobs), when buying for
    them from pools that share their GPUs as ``pool_sharings`` say (None: a pool that does not).

    Where every pool shares, the jobs' slices are summed and rounded up once, each slice as the
    pool that packs that fraction least well would cut it (the buyer does not know which pool
    it will be). Where some pool does not share, or there is no pool, each job counts one GPU,
    as without sharing: that pool would give each a whole GPU, and buying for fewer would leave
    them waiting. Whole-GPU jobs (fraction None) count as they are. The simulator's scheduler
    and the live sources tell the controller this same figure.
    """
    if all(f is None for f, _ in counts) or not any(s is not None for s in pool_sharings):
        return sum(n for _, n in counts)
    folds = all(s is not None for s in pool_sharings)
    whole = 0
    sliced = Fraction(0)
    for fraction, jobs in counts:
        worst = worst_slice(fraction, pool_sharings) if folds and fraction is not None else None
        if worst is None:
            whole += jobs
        else:
            sliced += worst * jobs
    return whole + math.ceil(sliced)


def folded_gpus(whole: int, asks: Sequence[tuple[Share, int, Sequence[GpuSharing]]]) -> int:
    """The whole GPUs one group of pending one-GPU jobs needs: ``whole`` jobs of a GPU each, and
    for each (fraction asked, jobs, the sharings of the pools that can host that slice) the
    jobs' slices, each as the host that cuts it coarsest would, summed with the others' and
    rounded up once. A slice with no host, or one a host would give a whole GPU, counts one GPU
    a job.

    Unlike ``whole_gpus`` (the simulator's fold, where a fractional job may run on any pool),
    a live source's slice job runs only where its slice exists (its group's ``gpu_sharing``
    keeps the others from being bought for it), so a pool that does not share, or shares
    another way, neither rounds its slices up to whole GPUs nor is counted at all."""
    sliced = Fraction(0)
    for fraction, jobs, hosts in asks:
        worst = worst_slice(fraction, hosts)
        if worst is None:
            whole += jobs
        else:
            sliced += worst * jobs
    return whole + math.ceil(sliced)
