"""Slurm's GPU sharding (``gres/shard``, Slurm 22.05 and later) read as fractions of a GPU.

A site shares GPUs by giving nodes shards beside their GPUs (``GresTypes=gpu,shard``, a node's
``Gres=gpu:4,shard:32``, ``gres.conf`` ``Name=shard Count=8 File=/dev/nvidia0`` per GPU) and jobs
ask ``--gres=shard:N``: N of one GPU's shards, all on one GPU (22.05 gives a job no shards of two
GPUs on one node). A GPU with a shard in use is not given to a whole-GPU job, and a whole GPU in
use gives no shards, so:

* a node's GPUs allocated are its whole GPUs in use and the GPUs with a shard in use; the GPUs'
  worth held (``NodeUsage.gpus_held``) counts each shard as its share of a GPU. Slurm 22.05's
  ``GresUsed`` prints, for shards, how many GPUs carry one (``shard:a100:3(IDX:0-2)`` for 18
  shards on three GPUs), so the shards held are summed from the running jobs' ``gres_detail``;
* a running shard job holds one GPU of its node, as the simulator counts a fractional job
  (``RunningJob.gpus`` is 1: the GPU it sits on, which no whole-GPU job can have meanwhile);
* a pending shard job can only run where there are shards: on a cloud pool that shares its GPUs
  by time-slicing, whose nodes join with ``replicas`` shards per GPU (``slurm_join``). Its demand
  is N shards of such a pool's GPU, folded with the other pending fractions into whole GPUs by
  ``autoscaler.model.sharing.whole_gpus``, the simulator's own fold. A shard job no pool can
  host (no pool shares, or none has N shards per GPU) is demand that cannot be met: it counts
  one GPU of a shape no pool offers, its reason written where the shape's model goes, so the
  controller reports it unhostable instead of buying a node it could not run on.

MIG instances are not shards: Slurm (21.08 and later, `gres.html#MIG_Management`) treats each
as a GPU of its own, with ``AutoDetect=nvml`` in ``gres.conf`` and a gres *type* per profile in
``slurm.conf`` that must be a substring of the profile NVML reports (``nvidia_a100_3g.20gb``):
``Gres=gpu:a100:1,gpu:a100_3g.20gb:2``, or ``gpu:1g.10gb:7``. A job asks
``--gres=gpu:1g.10gb:1``: one instance, 1/7 of a GPU's compute. So a gpu gres type that ends
in a MIG profile (``mig_type``) is read as a slice: pending, c/7 of a GPU per instance, folded
against the pools that cut their GPUs in that profile (``mig_demand``), or demand no pool can
host when none does; running, a GPU with its instances' share of it.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from fractions import Fraction
from typing import NamedTuple

from autoscaler.model.sharing import MIG_COMPUTE_SLICES, GpuSharing, SharingMode, mig_compute

SHARD = "shard"
_COUNT = re.compile(r"[0-9]{1,20}")
_TYPE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]{0,127}")
_INDEX_RANGE = re.compile(r"([0-9]{1,6})(?:-([0-9]{1,6}))?")
INT_MAX = 2**64 - 1


# Why a pending shard job cannot be hosted, as its shape's model says it (jobs alike but for
# their shards stay one group of unhostable demand).
NO_SHARDS = "gres/shard: no pool's nodes have shards (no pool shares its GPUs by time-slicing)"
TOO_MANY_SHARDS = "gres/shard: more shards of one GPU than any pool's GPUs have (at most {most})"
NO_MIG = "gres/gpu:{profile}: no pool's GPUs are cut in MIG {profile} instances"
# a gres type naming a MIG profile, after the GPU's own type if any (``a100_3g.20gb``)
_MIG_TYPE = re.compile(r"(?:(.+?)[_-])?([1-7]g\.[0-9]{1,4}gb(?:\+me)?)")


class ShardSyntaxError(ValueError):
    """A shard entry of a gres string that is not one Slurm prints."""


def gres_items(text: str) -> list[str]:
    """A gres string's entries, split at the commas outside parentheses (``gpu:a100:2(IDX:0,2)``
    keeps its index list)."""
    items: list[str] = []
    depth = 0
    start = 0
    for index, char in enumerate(text):
        if char == "(":
            depth += 1
        elif char == ")":
            depth = max(0, depth - 1)
        elif char == "," and depth == 0:
            items.append(text[start:index])
            start = index + 1
    items.append(text[start:])
    return [item.strip() for item in items if item.strip()]


def parse_shards(text: str) -> tuple[int, int | None]:
    """The shards a gres or TRES string names (``gres:shard:2``, ``shard:a100:32``,
    ``shard:a100:3(IDX:0-2)``) and how many GPUs its index list names (None: no list, or
    ``IDX:N/A``). Raises ``ShardSyntaxError`` for a shard entry whose count is not ASCII digits
    within 64 bits, whose type is not a name, or whose index list is not one."""
    total = 0
    gpus: set[int] | None = None
    for item in gres_items(text):
        entry = item[5:] if item.startswith(("gres:", "gres/")) else item
        head, paren, tail = entry.partition("(")
        parts = head.split(":")
        if parts[0] != SHARD:
            continue
        if len(parts) == 1:
            count, kind = "1", None
        elif len(parts) == 2:
            count, kind = parts[1], None
        elif len(parts) == 3:
            count, kind = parts[2], parts[1]
        else:
            raise ShardSyntaxError(f"{item[:80]!r} is not a shard count")
        if not _COUNT.fullmatch(count) or int(count) > INT_MAX:
            raise ShardSyntaxError(f"{item[:80]!r} is not a shard count")
        if kind is not None and not _TYPE.fullmatch(kind):
            raise ShardSyntaxError(f"{item[:80]!r} has no gres type name")
        total += int(count)
        if paren:
            found = _indices(tail, item)
            if found is not None:
                gpus = (gpus or set()) | found
    return total, None if gpus is None else len(gpus)


def _indices(tail: str, item: str) -> set[int] | None:
    """``IDX:0-2,5)`` as {0, 1, 2, 5}; ``IDX:N/A)`` as None."""
    if not tail.endswith(")") or not tail.startswith("IDX:"):
        raise ShardSyntaxError(f"{item[:80]!r} has no index list Slurm prints")
    listed = tail[4:-1]
    if listed == "N/A":
        return None
    found: set[int] = set()
    for part in listed.split(","):
        match = _INDEX_RANGE.fullmatch(part)
        if match is None:
            raise ShardSyntaxError(f"{item[:80]!r} has no index list Slurm prints")
        first = int(match[1])
        last = first if match[2] is None else int(match[2])
        if last < first or last - first > 4096:
            raise ShardSyntaxError(f"{item[:80]!r} has no index list Slurm prints")
        found.update(range(first, last + 1))
    return found


def shard_pools(sharings: Sequence[GpuSharing | None]) -> tuple[GpuSharing, ...]:
    """The sharings of the pools whose GPUs Slurm jobs can have a slice of: those that share
    by time-slicing, whose nodes have shards (the join script gives them ``replicas`` per GPU),
    and those cut in MIG instances, which Slurm names as gres types of their own (``mig_type``).
    A pool that does not share has neither."""
    return tuple(
        s
        for s in sharings
        if s is not None and (s.mode is SharingMode.MIG or (s.replicas and s.replicas > 1))
    )


def shard_demand(
    shards: int, nodes: int, pools: tuple[GpuSharing, ...] | None
) -> tuple[Fraction | None, str | None]:
    """What a pending job asking ``shards`` of one GPU on each of ``nodes`` nodes is, given the
    time-slicing pools that join Slurm (None: the pools are not known): (the exact fraction of a
    GPU handed to the fold, None for a whole GPU per node), or why no pool can host it.

    The fraction is N over the fewest shards per GPU any such pool has, the largest share of a
    GPU the job can take on any of them (a buyer does not know which pool it gets); N at least
    that many is a whole GPU. A job over several nodes counts a GPU per node, as a multi-GPU job
    of the trace is never fractional."""
    if pools is None:
        return None, None
    replicas = [p.replicas for p in pools if p.mode is SharingMode.TIME_SLICING and p.replicas]
    if not replicas:
        return None, NO_SHARDS
    if shards > max(replicas):
        return None, TOO_MANY_SHARDS.format(most=max(replicas))
    if nodes > 1:
        return None, None
    return Fraction(shards, min(replicas)), None


def held(whole: int, shards_held: int, shards: int, gpus: int) -> float:
    """The GPUs' worth a node's jobs hold: its whole GPUs in use and each shard as its share of
    a GPU (``shards`` over ``gpus``)."""
    if shards <= 0 or gpus <= 0:
        return float(whole)
    return float(whole + Fraction(shards_held * gpus, shards))


def mig_type(gres_type: str) -> tuple[str, str | None] | None:
    """The MIG profile a gpu gres type names and the GPU type before it (``a100_1g.10gb``:
    ``('1g.10gb', 'a100')``; ``1g.10gb``: ``('1g.10gb', None)``); None for a whole GPU's type."""
    found = _MIG_TYPE.fullmatch(gres_type)
    if found is None or mig_compute(found[2]) is None:
        return None
    return found[2], found[1]


def mig_entries(text: str) -> tuple[list[tuple[str, int]], int]:
    """The MIG instances a gres or TRES string names, as (profile, count), and its GPUs of a
    type that is not MIG's (``gres:gpu:a100:1,gres:gpu:1g.10gb:2``: ``[('1g.10gb', 2)], 1``).
    The string has been read by the GPU parser already, which refuses counts that are not
    ones; what it would refuse counts nothing here."""
    instances: list[tuple[str, int]] = []
    whole = 0
    for item in gres_items(text):
        entry = item[5:] if item.startswith(("gres:", "gres/")) else item
        parts = entry.split("(", 1)[0].split(":")
        if parts[0] != "gpu" or len(parts) > 3:
            continue
        if len(parts) == 1:
            kind, count = None, "1"
        elif len(parts) == 2:
            number = _COUNT.fullmatch(parts[1]) is not None
            kind, count = (None, parts[1]) if number else (parts[1], "1")
        else:
            kind, count = parts[1], parts[2]
        if not _COUNT.fullmatch(count):
            continue
        found = mig_type(kind) if kind else None
        if found is None:
            whole += int(count)
        else:
            instances.append((found[0], int(count)))
    return instances, whole


class SliceDemand(NamedTuple):
    """What a pending job asking MIG instances is: ``gpus`` per node (1 for a slice), the share
    of a GPU each of its ``pieces`` instances is (None: whole GPUs), the sharings of the pools
    that can host it, and why none can (None: some can, or the pools are not known)."""

    gpus: int
    fraction: Fraction | None
    pieces: int
    hosts: tuple[GpuSharing, ...]
    unmet: str | None


def mig_demand(
    profile: str, instances: int, nodes: int, pools: tuple[GpuSharing, ...] | None
) -> SliceDemand:
    """A pending job asking ``instances`` MIG instances of ``profile`` on each of ``nodes``
    nodes, given the pools that share and join Slurm (None: not known, and each instance
    counts a GPU, as Slurm counts it). A slice of the pools that list the profile: c/7 of a
    GPU per instance, folded with the group's other slices; as many whole GPUs as its
    instances' compute covers when that is a GPU or more, or over several nodes; one GPU of a
    shape no pool offers, with its reason, when no pool lists the profile."""
    if pools is None:
        return SliceDemand(instances, None, 1, (), None)
    hosts = tuple(p for p in pools if p.mode is SharingMode.MIG and profile in p.profiles)
    if not hosts:
        return SliceDemand(1, None, 1, (), NO_MIG.format(profile=profile))
    compute = mig_compute(profile) or MIG_COMPUTE_SLICES
    if nodes > 1 or instances * compute >= MIG_COMPUTE_SLICES:
        gpus = math.ceil(Fraction(instances * compute, MIG_COMPUTE_SLICES))
        return SliceDemand(gpus, None, 1, hosts, None)
    return SliceDemand(1, Fraction(compute, MIG_COMPUTE_SLICES), instances, hosts, None)


def mig_share(instances: Sequence[tuple[str, int]]) -> Fraction:
    """The share of a GPU's compute MIG instances are, (profile, count) each."""
    sevenths = sum(n * (mig_compute(p) or MIG_COMPUTE_SLICES) for p, n in instances)
    return Fraction(sevenths, MIG_COMPUTE_SLICES)
