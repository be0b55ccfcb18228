"""One node's shared GPUs: which slices of which GPU each job holds, in whole slices.

A node whose GPUs may be shared (``GpuSharing``) keeps, per GPU, the slices in use out of
``units`` (time-slicing replicas, or MIG's 7 compute slices). A job asking for a fraction of a
GPU takes its slices on one GPU, the partly used GPU it fills most tightly first (best fit), so
that whole GPUs stay free for jobs that need whole GPUs; a whole-GPU job takes GPUs with nothing
on them. Every count is an integer, so no GPU ever holds more than one GPU's worth: ``place``
refuses what does not fit rather than rounding.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction

from autoscaler.model.sharing import GpuSharing


@dataclass(frozen=True, slots=True)
class Slot:
    """Where a fractional job would go on a node: the GPU, and the slices it would leave free
    there (fewer is a tighter fit), and whether that GPU is already partly used."""

    gpu: int
    left: Fraction
    partial: bool

    def better_than(self, other: Slot | None) -> bool:
        if other is None:
            return True
        return (not self.partial, self.left) < (not other.partial, other.left)


@dataclass(slots=True)
class SharedGpus:
    sharing: GpuSharing
    gpus: int
    used: list[int] = field(default_factory=list)
    # by job key: the (GPU, slices) it holds
    held: dict[int, list[tuple[int, int]]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.used:
            self.used = [0] * self.gpus

    @property
    def units(self) -> int:
        return self.sharing.units

    def free_gpus(self) -> int:
        """GPUs with nothing on them: what a whole-GPU job can take."""
        return sum(1 for u in self.used if u == 0)

    def has_partial(self) -> bool:
        return any(0 < u < self.units for u in self.used)

    def slot(self, slices: int) -> Slot | None:
        """The GPU a job of ``slices`` fits most tightly: a partly used GPU leaving the fewest
        slices free, else the first empty GPU; None when no GPU has room."""
        best: Slot | None = None
        for gpu, used in enumerate(self.used):
            if used + slices > self.units:
                continue
            found = Slot(gpu, Fraction(self.units - used - slices, self.units), used > 0)
            if found.better_than(best):
                best = found
        return best

    def place(self, key: int, slices: int) -> int:
        """Put ``slices`` of job ``key`` on its best GPU; returns the GPU."""
        found = self.slot(slices)
        if found is None:
            raise ValueError(f"no GPU has {slices} of {self.units} slices free")
        self.used[found.gpu] += slices
        self.held.setdefault(key, []).append((found.gpu, slices))
        return found.gpu

    def place_whole(self, key: int, gpus: int) -> list[int]:
        """Give job ``key`` ``gpus`` GPUs with nothing on them."""
        empty = [gpu for gpu, used in enumerate(self.used) if used == 0][:gpus]
        if len(empty) < gpus:
            raise ValueError(f"{gpus} whole GPUs asked, {len(empty)} free")
        for gpu in empty:
            self.used[gpu] = self.units
            self.held.setdefault(key, []).append((gpu, self.units))
        return empty

    def release(self, key: int) -> None:
        for gpu, slices in self.held.pop(key, []):
            self.used[gpu] -= slices

    def stranded(self) -> Fraction:
        """Free slices on partly used GPUs, in GPUs: room only another fractional job can use."""
        units = self.units
        return Fraction(sum(units - u for u in self.used if 0 < u < units), units)

    def held_gpus(self) -> Fraction:
        return Fraction(sum(self.used), self.units)
