"""On-prem GPUs that jobs hold and do not use: allocated by the scheduler, idle by measured
utilisation. The waste an allocation-based view never shows (a notebook left open, a job waiting
on its data loader), read from what observe already put in the view, for the metrics and the
journal alike, so that both count the same GPUs.

A node is idle when its ``idle_since`` is set: every GPU's latest reading is below
``telemetry.idle_util_pct``, the threshold the controller drains idle cloud nodes by. A node
without a reading (no telemetry for it, a stale or unreadable exporter, a node source that
failed) is *unmeasured*: never idle, never counted, and never a zero.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import NamedTuple

from autoscaler.model import OnPremNode

NODE_SOURCE_KIND = "nodes"


class IdleNode(NamedTuple):
    """One on-prem node with GPUs allocated while it reads idle, as one tick saw it."""

    node: str
    gpus: int  # GPUs the scheduler has allocated on it
    idle_since: float  # since when every GPU on it has read idle


def measured(node: OnPremNode) -> bool:
    """Telemetry gave the node a utilisation this tick (a NaN is no reading)."""
    return node.gpu_util_pct is not None and math.isfinite(node.gpu_util_pct)


def idle_allocated_gpus(node: OnPremNode) -> int | None:
    """GPUs allocated on the node while it reads idle; None while unmeasured (not idle)."""
    if not measured(node):
        return None
    since = node.idle_since
    if since is None or not math.isfinite(since):
        return 0
    return node.gpus_allocated


def idle_nodes(nodes: Iterable[OnPremNode]) -> tuple[IdleNode, ...]:
    """The measured-idle nodes with allocated GPUs, by name."""
    found = []
    for node in nodes:
        gpus = idle_allocated_gpus(node)
        if gpus and node.idle_since is not None:
            found.append(IdleNode(node.name, gpus, node.idle_since))
    return tuple(sorted(found))


def nodes_unknown(failing_sources: Sequence[str]) -> bool:
    """The node source failed this tick: the view's on-prem list is empty, not the fleet."""
    return any(s.split("/", 1)[0] == NODE_SOURCE_KIND for s in failing_sources)


def onprem_idle(
    nodes: Sequence[OnPremNode], failing_sources: Sequence[str]
) -> tuple[IdleNode, ...] | None:
    """What a tick records: the idle-allocated nodes, or None when the tick cannot know (the
    node source failed, or on-prem GPUs are allocated and no node has a reading at all)."""
    if nodes_unknown(failing_sources):
        return None
    if not any(measured(n) for n in nodes) and any(n.gpus_allocated for n in nodes):
        return None
    return idle_nodes(nodes)


def idle_gpu_seconds(node: IdleNode, at: float, previous: float | None) -> float:
    """The node's allocated-idle GPU-seconds over the interval since the previous tick: its
    allocated GPUs over the part of the interval it has read idle. The interval before the
    first tick a process records is not known, so it counts nothing (never a guess)."""
    if previous is None:
        return 0.0
    return node.gpus * max(0.0, at - max(node.idle_since, previous))
