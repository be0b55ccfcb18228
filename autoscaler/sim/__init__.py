"""The simulator: replays a job trace with real prices and spot availability through the real
controller. ``replay`` is the few-lines entry point for testing a policy offline."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from autoscaler.sim.engine import Prepared, SimResult, prepare, simulate
from autoscaler.sim.scenario import LoadedScenario, PolicySpec, default_scenario_path, load_scenario
from autoscaler.spi.policy import Policy

__all__ = [
    "LoadedScenario",
    "Prepared",
    "SimResult",
    "default_scenario_path",
    "load_scenario",
    "prepare",
    "replay",
    "simulate",
]


def replay(
    scenario: str | Path | LoadedScenario | Prepared,
    policy: str | Policy,
    params: dict[str, Any] | None = None,
    checkpoint_aware: bool | None = None,
) -> SimResult:
    """Replay ``scenario`` with one policy: an installed policy's name (with ``params``), or a
    policy object you built yourself; ``checkpoint_aware`` overrides the scenario's setting."""
    if isinstance(scenario, Prepared):
        prepared = scenario
    else:
        loaded = scenario if isinstance(scenario, LoadedScenario) else load_scenario(scenario)
        prepared = prepare(loaded)
    if isinstance(policy, str):
        spec = PolicySpec(name=policy, params=params or {})
        return simulate(prepared, spec, checkpoint_aware=checkpoint_aware)
    spec = PolicySpec(name=type(policy).__name__, params=params or {})
    return simulate(prepared, spec, policy=policy, checkpoint_aware=checkpoint_aware)
