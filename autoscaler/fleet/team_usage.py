"""Who pays for what, live: each tick, what each node cost and held split between the teams
whose jobs ran on it, by the GPU share they held there.

The controller's journal accrues, per billed cloud instance and tick, its dollars and GPU-time
since it was last billed, and per on-prem node its GPUs times the time since the last tick. This
splits each such amount between the teams by the GPUs their jobs hold on the node this tick
(a job's GPUs over the node's); what no job holds is ``IDLE``, a job that names no team is
``UNASSIGNED``, and a node whose jobs were not read (no teams in the config, or the scheduler
failed) goes whole to ``UNKNOWN``: never dropped, never guessed.

Amounts are whole units (micro-dollars, GPU-milliseconds) shared by the largest remainder
(``autoscaler.fleet.attribution.apportion``), so every unit is given: the teams' lines add up
to each node's amount, and over every tick to the fleet's journaled total, exactly.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import NamedTuple

from autoscaler.fleet.attribution import IDLE, apportion
from autoscaler.model.teams import UNASSIGNED
from autoscaler.spi.sources import RunningJob

UNKNOWN = "(unknown)"
ONPREM = "on-prem"
MICROS_PER_USD = 1_000_000
MS_PER_S = 1000

# team -> GPUs its jobs hold on one node; None: the node's jobs are not known this tick
Holders = Mapping[str, float] | None


class OnPremHeld(NamedTuple):
    """An on-prem node as a tick saw it: its GPUs and who held them."""

    node: str
    gpus: int
    holders: Holders


class TickHolders(NamedTuple):
    """Who held each node's GPUs this tick: cloud instances by id (absent: held by nobody,
    when ``known``), on-prem nodes with their GPUs."""

    known: bool
    cloud: Mapping[str, Mapping[str, float]]
    onprem: tuple[OnPremHeld, ...]

    def of_instance(self, instance_id: str) -> Holders:
        if not self.known:
            return None
        return self.cloud.get(instance_id, {})


def holders(jobs: Iterable[RunningJob]) -> dict[str, float]:
    """GPUs held on one node per team (a job naming no team counts as ``UNASSIGNED``)."""
    held: dict[str, float] = {}
    for job in jobs:
        team = job.team or UNASSIGNED
        held[team] = held.get(team, 0.0) + max(0.0, float(job.gpus))
    return held


def tick_holders(
    running: Mapping[str, Sequence[RunningJob]] | None,
    onprem: Iterable[tuple[str, int]],
) -> TickHolders:
    """What the journal splits a tick by: ``running`` is observe's every node's running jobs
    (None: not read), ``onprem`` each on-prem node's name and GPUs."""
    if running is None:
        return TickHolders(False, {}, tuple(OnPremHeld(n, g, None) for n, g in onprem))
    by_node = {node: holders(jobs) for node, jobs in running.items()}
    nodes = tuple(OnPremHeld(n, g, by_node.pop(n, {})) for n, g in onprem)
    return TickHolders(True, by_node, nodes)


def split(total: int, gpus: float, held: Holders) -> dict[str, int]:
    """``total`` whole units of one node's tick shared by GPU share: each team its jobs' GPUs
    over the node's, ``IDLE`` the GPUs no job held; jobs holding more than the node has (a
    stale reading) share all of it and leave nothing idle. Unknown holders: all ``UNKNOWN``."""
    if total < 0:
        raise ValueError(f"cannot split a negative amount ({total})")
    if held is None:
        return {UNKNOWN: total} if total else {}
    weights = {team: g for team, g in held.items() if g > 0}
    idle = max(0.0, float(gpus) - sum(weights.values()))
    if idle > 0:
        weights[IDLE] = weights.get(IDLE, 0.0) + idle
    shares = apportion(total, weights)
    return {team: units for team, units in shares.items() if units}


def onprem_gpus_held(held: TickHolders) -> dict[str, float] | None:
    """The on-prem GPUs each team's jobs hold now (None: not known)."""
    if not held.known:
        return None
    total: dict[str, float] = {}
    for node in held.onprem:
        for team, gpus in (node.holders or {}).items():
            total[team] = total.get(team, 0.0) + gpus
    return total


def micros(usd: float) -> int:
    return round(usd * MICROS_PER_USD)


def gpu_ms(gpus: float, seconds: float) -> int:
    return round(gpus * max(0.0, seconds) * MS_PER_S)


class Usage(NamedTuple):
    """GPU-milliseconds and micro-dollars."""

    gpu_ms: int
    usd_micros: int


def add(into: dict[tuple[str, str], Usage], place: str, shares: dict[str, Usage]) -> None:
    """Adds one node's per-team shares at ``place`` (a pool, or ``ONPREM``)."""
    for team, usage in shares.items():
        old = into.get((team, place), Usage(0, 0))
        into[(team, place)] = Usage(old.gpu_ms + usage.gpu_ms, old.usd_micros + usage.usd_micros)


def split_usage(amount: Usage, gpus: float, held: Holders) -> dict[str, Usage]:
    """Both amounts of one node's tick, each split by ``split``."""
    time_shares = split(amount.gpu_ms, gpus, held)
    money_shares = split(amount.usd_micros, gpus, held)
    return {
        team: Usage(time_shares.get(team, 0), money_shares.get(team, 0))
        for team in sorted(set(time_shares) | set(money_shares))
    }


def totals(usage: Mapping[tuple[str, str], Usage]) -> Usage:
    return Usage(sum(u.gpu_ms for u in usage.values()), sum(u.usd_micros for u in usage.values()))


def teams_of(usage: Iterable[tuple[str, str]]) -> list[str]:
    """The teams in ``usage``'s keys, named teams first, then the lines that are not a team."""
    names = {team for team, _place in usage}
    special = [n for n in (UNASSIGNED, IDLE, UNKNOWN) if n in names]
    return sorted(names - set(special)) + special
