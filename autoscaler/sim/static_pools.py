"""What static per-team pools would have cost: the baseline a shared fleet is judged against.

Before a fleet is shared, each team owns a slice of it: its on-prem GPUs are its own whether it
uses them or not, and it bursts to the cloud for itself alone. Replaying that on the same trace
means replaying each team's jobs by themselves, on the on-prem GPUs that would be its slice,
with the same cloud pools, markets and policy; the costs add up to what static pools cost.

The slice: each team its guaranteed GPUs first (the largest guarantee first), then the GPUs
nobody is guaranteed shared by the teams' weights (largest remainder), all cut from the shared
fleet's nodes in order, so a team may get part of a node (as a Slurm partition of whole nodes
could not: the baseline is kind to static pools, never harsh). A team whose jobs name no team in
the config (``unassigned``) gets the unassigned terms' guarantee and weight.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from autoscaler.fleet.attribution import apportion
from autoscaler.model.teams import UNASSIGNED, TeamsConfig
from autoscaler.sim.engine import Prepared, SimResult
from autoscaler.sim.scenario import LoadedScenario, OnPremNodeSpec
from autoscaler.sim.trace import TraceJob, TraceSelection


@dataclass(frozen=True)
class TeamSlice:
    team: str
    gpus: int
    nodes: tuple[OnPremNodeSpec, ...]


def slices(
    fleet: Sequence[OnPremNodeSpec], teams: TeamsConfig, names: Sequence[str]
) -> list[TeamSlice]:
    """The on-prem fleet cut into one slice per team of ``names``."""
    total = sum(node.gpus * node.count for node in fleet)
    specs = {name: teams.spec(None if name == UNASSIGNED else name) for name in names}
    share = {name: min(spec.guaranteed_gpus, total) for name, spec in specs.items()}
    left = max(0, total - sum(share.values()))
    extra = apportion(left, {name: spec.weight for name, spec in specs.items()})
    order = sorted(names, key=lambda n: (-share[n], n))
    gpus = {name: share[name] + extra.get(name, 0) for name in order}
    over = sum(gpus.values()) - total  # guarantees beyond the fleet: the last teams get less
    for name in reversed(order):
        cut = min(over, gpus[name])
        gpus[name] -= cut
        over -= cut
    cursor = _gpus(fleet)
    return [TeamSlice(name, gpus[name], _take(cursor, gpus[name], name)) for name in order]


def _gpus(fleet: Sequence[OnPremNodeSpec]) -> Iterator[tuple[str, OnPremNodeSpec]]:
    """Every on-prem GPU, node by node: (the node's own name, its spec)."""
    for spec in fleet:
        for copy in range(spec.count):
            name = spec.name if spec.count == 1 else f"{spec.name}-{copy}"
            for _ in range(spec.gpus):
                yield name, spec


def _take(
    cursor: Iterator[tuple[str, OnPremNodeSpec]], gpus: int, team: str
) -> tuple[OnPremNodeSpec, ...]:
    counts: dict[str, tuple[OnPremNodeSpec, int]] = {}
    for _ in range(gpus):
        name, spec = next(cursor)
        kept = counts.get(name)
        counts[name] = (spec, (kept[1] if kept else 0) + 1)
    return tuple(
        OnPremNodeSpec(
            name=f"{team[:60]}-{name}"[:128],
            gpus=n,
            gpu_model=spec.gpu_model,
            gpu_sharing=spec.gpu_sharing,  # a node's own sharing goes with its slice
        )
        for name, (spec, n) in counts.items()
    )


@dataclass(frozen=True)
class TeamReplay:
    team: str
    onprem_gpus: int
    result: SimResult


def replay_static_pools(
    prepared: Prepared, run: Callable[[Prepared], SimResult]
) -> list[TeamReplay]:
    """Each team's jobs replayed alone on its slice (``run`` replays one prepared scenario
    with the policy being judged); none when the scenario names no teams."""
    scenario = prepared.loaded.scenario
    if scenario.teams is None:
        return []
    config = scenario.controller.teams or TeamsConfig()
    by_team: dict[str, list[int]] = {}
    for index, job in enumerate(prepared.selection.jobs):
        by_team.setdefault(job.team or UNASSIGNED, []).append(index)
    replays = []
    for cut in slices(scenario.onprem, config, sorted(by_team)):
        jobs = [prepared.selection.jobs[i] for i in by_team[cut.team]]
        alone = _prepared(prepared, cut.nodes, jobs)
        replays.append(TeamReplay(cut.team, cut.gpus, run(alone)))
    return replays


def _prepared(
    prepared: Prepared, nodes: tuple[OnPremNodeSpec, ...], jobs: list[TraceJob]
) -> Prepared:
    loaded = prepared.loaded
    scenario = loaded.scenario.model_copy(update={"onprem": nodes})
    selection = prepared.selection
    alone = TraceSelection(
        selection.source,
        jobs,
        selection.window_start_s,
        selection.window_end_s,
        dict(selection.skipped),
        selection.notes,
    )
    return Prepared(
        LoadedScenario(scenario, loaded.base, loaded.source, loaded.document),
        alone,
        dict(prepared.markets),
    )
