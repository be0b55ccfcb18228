"""Before a replay: which of the scenario's jobs no configured capacity can ever host.

Such a job would wait the whole replay under every policy and say nothing; ``validate`` refuses
the scenario naming the first few, and ``report`` says how many before it replays (they stay
pending in the replay, as they would live, and the lower bound leaves them out).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from autoscaler.model import OnPremNode
from autoscaler.model.gpus import memory_gib
from autoscaler.model.shapes import NodeOffer, can_host, offers_of, onprem_kinds, why_not
from autoscaler.sim.engine import Prepared
from autoscaler.sim.scenario import Scenario

HOUR = 3600.0
SHOWN = 3


@dataclass(frozen=True)
class HostCheck:
    jobs: int = 0
    gpu_hours: float = 0.0
    examples: list[str] = field(default_factory=list)

    def describe(self) -> str:
        return (
            f"{self.jobs} job(s) ({self.gpu_hours:,.1f} GPU-hours) can never run: no "
            "configured pool or on-prem node can host them; first: " + "; ".join(self.examples)
        )


def scenario_offers(scenario: Scenario) -> list[NodeOffer]:
    onprem = [
        OnPremNode(
            name=f"{spec.name}-{i}",
            gpus=spec.gpus,
            gpu_model=spec.gpu_model,
            gpu_memory_gib=memory_gib(spec.gpu_model),
        )
        for spec in scenario.onprem
        for i in range(spec.count)
    ]
    return offers_of(scenario.controller.pools, onprem_kinds(onprem))


def check_hostable(prepared: Prepared) -> HostCheck:
    offers = scenario_offers(prepared.loaded.scenario)
    horizon = prepared.horizon_s
    jobs = 0
    gpu_hours = 0.0
    examples: list[str] = []
    verdicts: dict[tuple[object, ...], bool] = {}
    for job in prepared.selection.jobs:
        shape = job.shape
        key = (shape, job.nodes)
        fits = verdicts.get(key)
        if fits is None:
            fits = verdicts[key] = can_host(shape, job.nodes, offers)
        if fits:
            continue
        jobs += 1
        gpu_hours += job.gpus * min(job.duration, max(0.0, horizon - job.submit)) / HOUR
        if len(examples) < SHOWN:
            examples.append(f"job {job.id} {why_not(shape, job.nodes, offers)}")
    return HostCheck(jobs, round(gpu_hours, 2), examples)
