"""Small replays of teams and priority classes through the real controller in the simulator:
a trace written row by row, one spot-free price and no spot availability, and each job's
waits told apart by the trace's ``user_group`` (the scenario's ``teams: {from_user_group:
true}``)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from test_sim_engine import TRACE_HEADER

from autoscaler.sim import SimResult, replay

PRICES = (
    "timestamp,cloud,region,zone,instance_type,price_per_hour,on_demand_price_per_hour\n"
    "2024-01-01T00:00:00Z,aws,r1,,small,1.0,3.0\n"
)
NO_AVAILABILITY = (
    "trace_id,kind,nodes_tracked,cloud,zone,instance_type,start_date,gap_seconds,"
    "start_tick,end_tick_exclusive,start_elapsed_s,duration_s,available_instances\n"
)


def row(
    job_id: str,
    submit: int,
    duration: int,
    gpus: int,
    group: str,
    preemptible: int,
    cls: str | None = None,
) -> str:
    """A trace row of ``group`` (the team, by ``from_user_group``); ``cls`` its priority class
    (LS when it cannot be preempted, BE when it can, unless given)."""
    priority = cls if cls is not None else ("BE" if preemptible else "LS")
    return (
        f"{job_id},{submit},{submit},{duration},{gpus},1.0,4,Succeeded,0,{group},{priority},"
        f"{preemptible},,none,\n"
    )


def onprem(nodes: Sequence[int]) -> str:
    """The scenario's ``onprem`` entries, one node of each size."""
    return "".join(f"  - {{name: n{i}, gpus: {g}}}\n" for i, g in enumerate(nodes))


def replayed(tmp_path: Path, scenario: str, rows: Sequence[str]) -> SimResult:
    """Writes the scenario beside its trace, prices and availability, and replays it with the
    default policy."""
    (tmp_path / "trace.csv").write_text(TRACE_HEADER + "".join(rows))
    (tmp_path / "prices.csv").write_text(PRICES)
    (tmp_path / "avail.csv").write_text(NO_AVAILABILITY)
    (tmp_path / "scenario.yaml").write_text(scenario)
    return replay(tmp_path / "scenario.yaml", "cost-aware")


def waits_of(result: SimResult, group: str) -> list[float]:
    return [w for w, t in zip(result.waits_s, result.wait_teams, strict=True) if t == group]


OD_POOL = (
    "{name: od, market: on-demand, provider: aws, region: r1, instance_type: small, "
    "gpus_per_instance: 1, boot_seconds: 60}"
)
NO_CLOUD = "{max_instances: 0, scale_down_cooldown_s: 0}"


def scenario(
    name: str,
    nodes: Sequence[int],
    teams: str,
    *,
    window_s: int = 30_000,
    limits: str = NO_CLOUD,
    pool: str = OD_POOL,
    market: str = "",
) -> str:
    """A scenario of one-GPU cloud pools (none bought by default: ``NO_CLOUD``), on-prem nodes
    of ``nodes`` GPUs, jobs that may be preempted checkpointing every 600 s for 20 s, and the
    controller's ``teams`` (YAML, indented under it)."""
    indented = "".join(f"    {line}\n" for line in teams.strip().splitlines())
    return (
        f'name: {name}\nseed: 1\nstart: "2024-01-01T00:00:00Z"\nwait_target_s: 120\n'
        f"trace: {{file: trace.csv, window_start_s: 0, window_end_s: {window_s}}}\n"
        "checkpointing:\n  - {match: {preemptible: true}, interval_s: 600, duration_s: 20}\n"
        "teams: {from_user_group: true}\n"
        f"onprem:\n{onprem(nodes)}"
        f"controller:\n  fleet_id: {name}\n  tick_seconds: 60\n  teams:\n{indented}"
        f"  limits: {limits}\n  pools:\n    - {pool}\n"
        "policies:\n  - name: cost-aware\n"
        f"market:\n  price_files: [prices.csv]\n  availability_file: avail.csv\n{market}"
    )
