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


class Usage(NamedTuple):
    """GPU-milliseconds and micro-dollars."""

    gpu_ms: int
    usd_micros: int


def holders(jobs: Iterable[RunningJob]) -> dict[str, float]:
    """GPUs held on one node per team (a job naming no team counts as ``UNASSIGNED``); a job on
    a slice of a shared GPU holds its slice, not the GPU."""
    held: dict[str, float] = {}
    for job in jobs:
        team = job.team or UNASSIGNED
        held[team] = held.get(team, 0.0) + max(0.0, job.gpus_held)
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


def shares_of(gpus: float, held: Holders) -> dict[str, float]:
    """Each line's share of one node (adding up to 1): each team its jobs' GPUs over the
    node's, ``IDLE`` the GPUs no job held; jobs holding more than the node has (a stale
    reading) share all of it and leave nothing idle. Unknown holders: all ``UNKNOWN``."""
    if held is None:
        return {UNKNOWN: 1.0}
    weights = {team: g for team, g in held.items() if g > 0}
    occupied = sum(weights.values())
    idle = max(0.0, float(gpus) - occupied)
    whole = occupied + idle
    if whole <= 0:
        return {IDLE: 1.0}
    result = {team: g / whole for team, g in weights.items()}
    if idle > 0:
        result[IDLE] = result.get(IDLE, 0.0) + idle / whole
    return result


def split(total: int, gpus: float, held: Holders) -> dict[str, int]:
    """``total`` whole units of one node's tick shared by ``shares_of``, every unit given."""
    if total < 0:
        raise ValueError(f"cannot split a negative amount ({total})")
    shares = apportion(total, shares_of(gpus, held))
    return {team: units for team, units in shares.items() if units}


class Splitter:
    """A tick's split over many nodes: each node's amounts are shared out exactly (in floats)
    as they are added, and each place's whole units are given out once, by the largest
    remainder, when the tick is done: the lines of a place add up to the sum of its nodes'
    units, each within one unit of its exact share, at the cost of one apportionment per place
    rather than two per node (a tick bills thousands of instances)."""

    def __init__(self) -> None:
        # place -> its whole units (GPU-ms, micro-$) and the lines' exact shares of each
        self._places: dict[str, _Place] = {}

    def add(self, place: str, amount: Usage, gpus: float, held: Holders) -> None:
        """One node's amounts at ``place``, shared by ``shares_of`` (written out here: a tick
        adds thousands of nodes)."""
        time_units, money_units = amount
        if time_units < 0 or money_units < 0:
            raise ValueError(f"cannot split a negative amount ({amount})")
        found = self._places.get(place)
        if found is None:
            found = self._places[place] = _Place([0, 0], {}, {})
        found.units[0] += time_units
        found.units[1] += money_units
        time, money = found.time, found.money
        if held is None:
            time[UNKNOWN] = time.get(UNKNOWN, 0.0) + time_units
            money[UNKNOWN] = money.get(UNKNOWN, 0.0) + money_units
            return
        occupied = 0.0
        for g in held.values():
            if g > 0:
                occupied += g
        idle = max(0.0, float(gpus) - occupied)
        whole = occupied + idle
        if whole <= 0:
            time[IDLE] = time.get(IDLE, 0.0) + time_units
            money[IDLE] = money.get(IDLE, 0.0) + money_units
            return
        for team, g in held.items():
            if g > 0:
                share = g / whole
                time[team] = time.get(team, 0.0) + time_units * share
                money[team] = money.get(team, 0.0) + money_units * share
        if idle > 0:
            share = idle / whole
            time[IDLE] = time.get(IDLE, 0.0) + time_units * share
            money[IDLE] = money.get(IDLE, 0.0) + money_units * share

    def result(self) -> dict[tuple[str, str], Usage]:
        """Per (line, place): its whole GPU-milliseconds and micro-dollars (zero lines left
        out)."""
        out: dict[tuple[str, str], Usage] = {}
        for place, found in self._places.items():
            time_shares = apportion(found.units[0], found.time)
            money_shares = apportion(found.units[1], found.money)
            for team in sorted(set(time_shares) | set(money_shares)):
                usage = Usage(time_shares.get(team, 0), money_shares.get(team, 0))
                if usage.gpu_ms or usage.usd_micros:
                    out[(team, place)] = usage
        return out


class _Place(NamedTuple):
    units: list[int]
    time: dict[str, float]
    money: dict[str, float]


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


def teams_of(usage: Iterable[tuple[str, str]]) -> list[str]:
    """The teams in ``usage``'s keys, named teams first, then the lines that are not a team."""
    names = {team for team, _place in usage}
    special = [n for n in (UNASSIGNED, IDLE, UNKNOWN) if n in names]
    return sorted(names - set(special)) + special
