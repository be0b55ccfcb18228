"""Turn replays into the report: summaries, ratios to the lower bound, stated assumptions."""

from __future__ import annotations

import math
from collections.abc import Sequence

from autoscaler.fleet.attribution import IDLE
from autoscaler.report.model import (
    CheckpointComparison,
    CheckpointSide,
    Fragmentation,
    GpuHours,
    Percentiles,
    PolicyResult,
    PolicyTimeline,
    PoolCost,
    PoolRow,
    Report,
    Series,
    StaticPools,
    StaticTeam,
    TeamResult,
    WindowInfo,
)
from autoscaler.sim.engine import Prepared, SimResult, Timeline
from autoscaler.sim.hostable import check_hostable
from autoscaler.sim.lowerbound_result import LowerBoundResult
from autoscaler.sim.scheduler import ONPREM_PLACE
from autoscaler.sim.static_pools import TeamReplay

HOUR = 3600.0
DEFAULT_POLICY = "cost-aware"
MAX_POINTS = 1500


def percentiles(values: Sequence[float]) -> Percentiles:
    """Nearest-rank percentiles (the value at or below which p % of the values lie)."""
    if not values:
        return Percentiles(p50=0.0, p95=0.0, p99=0.0, max=0.0)
    ordered = sorted(values)

    def rank(p: float) -> float:
        return ordered[max(0, math.ceil(p * len(ordered)) - 1)]

    return Percentiles(p50=rank(0.50), p95=rank(0.95), p99=rank(0.99), max=ordered[-1])


def _series(times: Sequence[float], values: Sequence[float]) -> Series:
    step = max(1, math.ceil(len(times) / MAX_POINTS))
    picked = range(0, len(times), step)
    return Series(
        t_hours=[round(times[i] / HOUR, 4) for i in picked],
        values=[round(values[i], 4) for i in picked],
    )


def _wait_by_hour(result: SimResult, prepared: Prepared) -> Series:
    jobs = [j for j in prepared.selection.jobs if not j.carried]
    buckets: dict[int, list[float]] = {}
    for job, wait in zip(jobs, result.waits_s, strict=True):
        buckets.setdefault(int(job.submit // HOUR), []).append(wait)
    hours = sorted(buckets)
    return Series(
        t_hours=[float(h) for h in hours], values=[percentiles(buckets[h]).p95 for h in hours]
    )


def _timeline(result: SimResult, prepared: Prepared) -> PolicyTimeline:
    line: Timeline = result.timeline
    return PolicyTimeline(
        cost=_series(line.t, line.cost),
        cost_per_hour=_series(line.t, line.cost_per_hour),
        pending_gpus=_series(line.t, line.pending_gpus),
        running_gpus=_series(line.t, line.running_gpus),
        cloud_gpus=_series(line.t, line.cloud_gpus),
        onprem_busy_gpus=_series(line.t, line.onprem_busy_gpus),
        wait_p95_by_hour=_wait_by_hour(result, prepared),
    )


def onprem_idle_hours(result: SimResult) -> float | None:
    """On-prem GPU-hours allocated while their node read idle, as the replay's scheduler counted
    them (``Accounting.onprem_idle_gpu_s``)."""
    return round(result.onprem_idle_gpu_s / HOUR, 2)


def policy_result(
    result: SimResult, prepared: Prepared, bounds: Sequence[LowerBoundResult]
) -> PolicyResult:
    allocated_cloud = (
        result.allocated_gpu_s.get("spot", 0.0) + result.allocated_gpu_s.get("on-demand", 0.0)
    ) / HOUR
    cloud_paid = result.cloud_paid_gpu_s / HOUR
    useful = result.useful_gpu_s / HOUR
    onprem_capacity = result.onprem_gpus * result.horizon_s / HOUR
    ratios: dict[str, float | None] = {}
    for bound in bounds:
        key = f"W={bound.max_wait_s:g}s"
        ratios[key] = result.cost / bound.cost if bound.cost else None
    return PolicyResult(
        policy=result.policy,
        label=result.label,
        params=result.params,
        cost=round(result.cost, 2),
        cost_by_pool=[
            PoolCost(
                pool=p,
                cost=round(c, 2),
                instance_hours=round(result.instance_hours_by_pool.get(p, 0.0), 2),
            )
            for p, c in result.cost_by_pool.items()
            if c > 0 or result.instance_hours_by_pool.get(p)
        ],
        cost_per_useful_gpu_hour=round(result.cost / useful, 4) if useful else None,
        wait_s=percentiles(result.waits_s),
        jobs_total=result.jobs_total,
        jobs_finished=result.jobs_finished,
        jobs_never_started=result.jobs_never_started,
        gpu_hours=GpuHours(
            useful=round(useful, 2),
            allocated_onprem=round(result.allocated_gpu_s.get("onprem", 0.0) / HOUR, 2),
            allocated_cloud=round(allocated_cloud, 2),
            cloud_paid=round(cloud_paid, 2),
            cloud_idle=round(max(0.0, cloud_paid - allocated_cloud), 2),
            lost=round(result.lost_gpu_s / HOUR, 2),
            checkpointing=round(result.checkpoint_gpu_s / HOUR, 2),
            onprem_allocated_idle=onprem_idle_hours(result),
        ),
        onprem_utilisation=round(
            result.allocated_gpu_s.get("onprem", 0.0) / HOUR / onprem_capacity, 4
        )
        if onprem_capacity
        else 0.0,
        interruptions=result.interruptions,
        checkpoints=result.checkpoints,
        requeues=result.requeues,
        migrations=result.migrations,
        instances_launched=result.launched,
        capacity_failures=result.capacity_failures,
        held_ticks=result.held_ticks,
        clamps=dict(sorted(result.clamps.items())),
        ratio_to_lower_bound=ratios,
        ticks=result.ticks,
        replay_wall_s=round(result.wall_s, 2),
        tick_ms=percentiles(result.tick_ms),
        timeline=_timeline(result, prepared),
        teams=team_results(result, prepared),
        fragmentation=fragmentation(result),
    )


def fragmentation(result: SimResult) -> Fragmentation | None:
    """The mean stranded and free GPUs over the sampled ticks, where GPUs may be shared."""
    if not result.shares_gpus or not result.frag_ticks:
        return None
    ticks = result.frag_ticks
    return Fragmentation(
        stranded_gpus=round(result.stranded_gpu_ticks / ticks, 3),
        free_gpus=round(result.free_gpu_ticks / ticks, 3),
        ticks=ticks,
    )


def team_results(result: SimResult, prepared: Prepared) -> list[TeamResult]:
    """Each team's waits, GPU-hours and cost, where the scenario names teams."""
    scenario = prepared.loaded.scenario
    if scenario.teams is None:
        return []
    config = scenario.controller.teams
    waits: dict[str, list[float]] = {}
    for team, wait in zip(result.wait_teams, result.waits_s, strict=True):
        waits.setdefault(team, []).append(wait)
    billed = result.team_bill
    rows = []
    for team in sorted(set(waits) | set(billed.teams), key=lambda t: (t == IDLE, t)):
        onprem = billed.team_gpu_s(team, ONPREM_PLACE)
        spec = config.teams.get(team) if config is not None else None
        guaranteed = spec is not None and spec.guaranteed_gpus > 0
        rows.append(
            TeamResult(
                team=team,
                jobs=len(waits.get(team, [])),
                wait_s=percentiles(waits[team]) if team in waits else None,
                gpu_hours_onprem=round(onprem / HOUR, 2),
                gpu_hours_cloud=round((billed.team_gpu_s(team) - onprem) / HOUR, 2),
                cost_cents=billed.team_cents(team),
                guaranteed_gpus=spec.guaranteed_gpus if spec is not None else None,
                short_gpu_hours=round(result.team_short_gpu_s.get(team, 0.0) / HOUR, 2)
                if guaranteed
                else None,
                short_share=round(result.team_short_ticks.get(team, 0) / result.sampled_ticks, 4)
                if guaranteed and result.sampled_ticks
                else None,
                late_gpu_hours=round(result.team_late_gpu_s.get(team, 0.0) / HOUR, 2)
                if guaranteed
                else None,
                late_share=round(result.team_late_ticks.get(team, 0) / result.sampled_ticks, 4)
                if guaranteed and result.sampled_ticks
                else None,
            )
        )
    return rows


def _sharing_lines(prepared: Prepared) -> list[str]:
    scenario = prepared.loaded.scenario
    if not scenario.shares_gpus:
        return []
    sharing = scenario.gpu_sharing
    where = [
        f"pool {pool.name}: {found.describe()}"
        for pool in scenario.controller.pools
        if (found := scenario.sharing_of(pool)) is not None
    ]
    for node in scenario.onprem:
        found = sharing.for_node(node)
        if found is not None:
            where.append(f"on-prem {node.name}: {found.describe()}")
    return [
        "GPU sharing: " + "; ".join(where) + ". A one-GPU job whose trace gpu_fraction is below 1 "
        "takes a slice of one shared GPU (time-slicing: its fraction rounded up to whole "
        "replicas; MIG: the smallest listed profile that covers it, counted in sevenths of "
        "compute, the profiles' memory and placement rules not modelled, the layout following "
        "demand), best fit onto a partly used GPU; its GPU-hours are its slice's. Pending "
        "fractional jobs reach the controller as their slices summed and rounded up to whole "
        "GPUs when every pool shares, else one GPU each."
    ]


def assumptions(prepared: Prepared) -> list[str]:
    scenario = prepared.loaded.scenario
    lines = []
    if scenario.checkpointing:
        for rule in scenario.checkpointing:
            lines.append("Checkpointing: " + rule.describe() + " (first matching rule wins).")
        lines.append(
            "Checkpointing: jobs no rule matches do not checkpoint; an interrupted job "
            "keeps the work up to its last finished checkpoint."
        )
    else:
        lines.append("Checkpointing: no job checkpoints (the scenario states no rule).")
    if scenario.high_priority is not None:
        shown = scenario.high_priority.model_dump(exclude_none=True)
        lines.append(f"High priority: jobs matching {shown}.")
    lines.extend(_sharing_lines(prepared))
    lines.append(
        "Each job takes whole GPUs on one node (a GPU-sharing pod takes a whole GPU"
        + (" where GPUs are not shared" if prepared.loaded.scenario.shares_gpus else "")
        + "), or, when the trace gives num_nodes or the job is larger than any node of the "
        "scenario, the same GPUs on each of several nodes at once, started together and "
        "requeued whole when one is taken away; only GPUs of a model the job accepts (trace "
        "gpu_model) run it. Its trace GPU fraction is used as its measured GPU utilisation."
    )
    lines.append(
        "On-prem allocated idle: GPU-hours on-prem GPUs were allocated to jobs while every job "
        f"on their node was below the {scenario.idle_util_pct:g} % idle threshold by its trace "
        "GPU fraction (the share of a GPU the job asked for, standing in for its measured "
        "utilisation, which the trace does not record); a node with one busy job is busy."
    )
    lines.append(
        "Jobs still running when the window opens enter at its start with the work they "
        "had left, and are left out of the wait statistics."
    )
    lines.append(
        "Queue wait is the total time a job spent pending (first wait plus waits after "
        "requeues); a job still pending at the end counts the time until then."
    )
    boots = sorted({p.boot_seconds for p in scenario.controller.pools})
    lines.append(
        "Cloud nodes take " + "/".join(f"{b:g}" for b in boots) + " s from launch to "
        "joining the scheduler and are billed from launch, per second, at the price of "
        "each moment."
    )
    leads = ", ".join(f"{k} {v:g} s" for k, v in sorted(scenario.notice_lead_s.items()))
    lines.append(f"Interruption notice lead time: {leads}.")
    lines.append(
        "Prices: the latest observation at or before each moment of the replay, reading "
        f"the histories as if the replay started at {scenario.start}; zonal prices without "
        "a chosen zone are the median of the zones."
    )
    lines.append(
        "Spot availability: a 1-node trace at 0 means no capacity (launches fail, "
        "running instances are interrupted); at 1, unlimited up to the pool's limit. A "
        "multi-node trace caps the pool at its count. Short traces loop."
    )
    lines.append(
        "On-prem GPUs cost nothing in the report; cloud cost is what the instances were billed."
    )
    lines.append(
        "Where a policy keeps some jobs off spot and the controller judges each job (the "
        "default), a job submitted between ticks may start on on-prem nodes only until the "
        "next tick judges it, as Slurm's spot and on-demand twin partitions hold it live; the "
        "peers' users declare a job's place when they submit it, so their jobs are placed on "
        "arrival."
    )
    lines.extend(f"Demand series: {note}." for note in prepared.selection.notes)
    return lines


def _pool_rows(prepared: Prepared) -> list[PoolRow]:
    rows = []
    for pool in prepared.loaded.scenario.controller.pools:
        market = prepared.markets[pool.name]
        if market.availability is not None:
            model = f"availability trace {market.availability.trace_id}"
        elif market.interruption_rate_per_hour:
            model = f"{market.interruption_rate_per_hour:.5f}/instance-hour"
        else:
            model = "none" if not pool.is_spot else "none given"
        rows.append(
            PoolRow(
                name=pool.name,
                provider=pool.provider,
                region=pool.region,
                zone=pool.zone,
                instance_type=pool.instance_type,
                gpus=pool.gpus_per_instance,
                market=str(pool.market),
                price_per_hour_at_start=round(market.price.at(0.0), 4),
                interruptions=model,
            )
        )
    return rows


def _p95_text(policy: PolicyResult) -> str:
    """A journal's row knows no queue wait; it reads as unknown, never as zero."""
    return "unknown" if policy.wait_s is None else f"{policy.wait_s.p95:.0f} s"


def _findings(
    policies: Sequence[PolicyResult], default: str, bounds: Sequence[LowerBoundResult]
) -> list[str]:
    chosen = next((p for p in policies if p.policy == default), None)
    if chosen is None:
        return []
    lines = []
    for other in policies:
        if other is chosen:
            continue
        ratio = chosen.cost / other.cost if other.cost else math.inf
        lines.append(
            f"{chosen.label} costs {ratio:.2f}x {other.label} "
            f"(${chosen.cost:,.0f} vs ${other.cost:,.0f}) "
            f"at p95 wait {_p95_text(chosen)} vs {_p95_text(other)}."
        )
    for bound in bounds:
        if bound.cost:
            lines.append(
                f"{chosen.label} costs {chosen.cost / bound.cost:.2f}x the offline lower bound "
                f"for a {bound.max_wait_s:g} s maximum wait (${bound.cost:,.0f})."
            )
    idle = chosen.gpu_hours.onprem_allocated_idle
    allocated = chosen.gpu_hours.allocated_onprem
    if idle and allocated:
        lines.append(
            f"Under {chosen.label}, on-prem GPUs were allocated to jobs on nodes that read idle "
            f"for {idle:,.1f} GPU-h ({idle / allocated:.1%} of on-prem GPU-hours allocated): "
            "held, and unused."
        )
    return lines


def _side(result: SimResult, aware: bool) -> CheckpointSide:
    return CheckpointSide(
        checkpoint_aware=aware,
        gpu_hours_lost=round(result.lost_gpu_s / HOUR, 2),
        cost=round(result.cost, 2),
        wait_p95_s=percentiles(result.waits_s).p95,
        requeues=result.requeues,
        interruptions=result.interruptions,
    )


def checkpoint_comparison(
    prepared: Prepared, results: Sequence[SimResult], other: SimResult | None
) -> CheckpointComparison | None:
    """Pair ``other`` (a replay with checkpoint awareness flipped) with the same policy's run."""
    if other is None:
        return None
    run = next((r for r in results if r.policy == other.policy), None)
    if run is None:
        return None
    configured = prepared.loaded.scenario.controller.interruptions.checkpoint_aware
    aware, unaware = (run, other) if configured else (other, run)
    return CheckpointComparison(
        policy=run.policy,
        label=run.label,
        aware=_side(aware, True),
        unaware=_side(unaware, False),
    )


def _checkpoint_finding(comparison: CheckpointComparison) -> str:
    aware, unaware = comparison.aware, comparison.unaware
    return (
        f"Checkpoint awareness ({comparison.label}, same trace): "
        f"{aware.gpu_hours_lost:,.1f} GPU-h of work lost with it, "
        f"{unaware.gpu_hours_lost:,.1f} GPU-h without "
        f"(${aware.cost:,.0f} vs ${unaware.cost:,.0f}, "
        f"p95 wait {aware.wait_p95_s:.0f} s vs {unaware.wait_p95_s:.0f} s)."
    )


def static_pools(results: Sequence[SimResult], replays: Sequence[TeamReplay]) -> StaticPools | None:
    """Each team served by static pools (``replays``, of one policy) beside the same policy's
    shared replay among ``results``; its cost there is the team's share of the bill."""
    if not replays:
        return None
    policy = replays[0].result.policy
    shared = next((r for r in results if r.policy == policy), None)
    if shared is None:
        return None
    waits: dict[str, list[float]] = {}
    for team, wait in zip(shared.wait_teams, shared.waits_s, strict=True):
        waits.setdefault(team, []).append(wait)
    rows = []
    for replay in replays:
        alone = replay.result
        rows.append(
            StaticTeam(
                team=replay.team,
                onprem_gpus=replay.onprem_gpus,
                jobs=len(alone.waits_s),
                static_cost=round(alone.cost, 2),
                static_wait_s=percentiles(alone.waits_s) if alone.waits_s else None,
                shared_cost=shared.team_bill.team_cents(replay.team) / 100,
                shared_wait_s=percentiles(waits[replay.team]) if waits.get(replay.team) else None,
            )
        )
    return StaticPools(policy=policy, teams=rows, shared_total=round(shared.cost, 2))


def build_report(
    prepared: Prepared,
    results: Sequence[SimResult],
    bounds: Sequence[LowerBoundResult],
    flipped: SimResult | None = None,
    static: Sequence[TeamReplay] = (),
) -> Report:
    """``flipped`` is one policy replayed with checkpoint awareness flipped, for the
    comparison of work lost with and without it; ``static`` one policy replayed on static
    per-team pools (``autoscaler.sim.static_pools``)."""
    loaded = prepared.loaded
    scenario = loaded.scenario
    selection = prepared.selection
    policies = [policy_result(r, prepared, bounds) for r in results]
    default = (
        DEFAULT_POLICY if any(p.policy == DEFAULT_POLICY for p in policies) else policies[0].policy
    )
    comparison = checkpoint_comparison(prepared, results, flipped)
    submitted = (
        sum(j.gpus * min(j.duration, selection.horizon_s - j.submit) for j in selection.jobs) / HOUR
    )
    unhostable = check_hostable(prepared)
    return Report(
        scenario=scenario.name,
        description=scenario.description,
        source=loaded.source,
        seed=scenario.seed,
        start=scenario.start,
        wait_target_s=scenario.wait_target_s,
        onprem_gpus=sum(n.gpus * n.count for n in scenario.onprem),
        window=WindowInfo(
            trace=selection.source,
            start_s=selection.window_start_s,
            end_s=selection.window_end_s,
            days=round(selection.horizon_s / 86400, 3),
            jobs=len(selection.jobs),
            carried_jobs=sum(1 for j in selection.jobs if j.carried),
            gpu_hours_submitted=round(submitted, 2),
            skipped=selection.skipped,
            unhostable_jobs=unhostable.jobs,
            unhostable_gpu_hours=unhostable.gpu_hours,
            unhostable_examples=unhostable.examples,
        ),
        assumptions=assumptions(prepared),
        pools=_pool_rows(prepared),
        lower_bounds=list(bounds),
        policies=policies,
        default_policy=default,
        findings=([unhostable.describe() + "."] if unhostable.jobs else [])
        + _findings(policies, default, bounds)
        + ([_checkpoint_finding(comparison)] if comparison is not None else []),
        checkpoint_comparison=comparison,
        static_pools=static_pools(results, static),
    )
