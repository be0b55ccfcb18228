"""Show the dry-run cost report to people: Markdown for a terminal or a repository, one HTML file
for a browser.

Every renderer reads only the :class:`Report`, so ``report.json`` stays the single source of truth
and a report can be rendered again without replaying anything. Both formats are built from the
same section list, so the Markdown and the HTML cannot drift apart in what they state. Output is
deterministic (no generation time, fixed SVG ids) so a report can be diffed and checked in.
"""

from __future__ import annotations

import html
import json
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any

from autoscaler.report.model import (
    CheckpointComparison,
    JournalFacts,
    Percentiles,
    PolicyResult,
    Report,
    StaticPools,
    WindowInfo,
)
from autoscaler.report.plots import Plot, plots
from autoscaler.report.render_format import (
    DASH,
    cheapest_policy,
    num,
    pct,
    ratio,
    secs,
    signed_pct,
    signed_usd,
    usd,
    usd_cents,
)
from autoscaler.sim.lowerbound_result import LowerBoundResult

# ---------------------------------------------------------------- numbers for people


def _wait(wait: Percentiles | None, pick: Callable[[Percentiles], float]) -> str:
    return DASH if wait is None else num(pick(wait))


def _jobs(policy: PolicyResult) -> str:
    if policy.jobs_finished is None or policy.jobs_total is None:
        return DASH
    return f"{policy.jobs_finished:,}/{policy.jobs_total:,}"


def _wait_key_header(key: str) -> str:
    return f"÷ LB {key}"


def _counts(counts: dict[str, int]) -> str:
    """Sorted so that the same report always prints the same line."""
    return ", ".join(f"{name}: {n:,}" for name, n in sorted(counts.items())) or DASH


def _params(params: dict[str, Any]) -> str:
    if not params:
        return "defaults"
    return ", ".join(
        f"{k}={json.dumps(v, sort_keys=True, default=str)}" for k, v in sorted(params.items())
    )


# ---------------------------------------------------------------- the content, format-free


@dataclass(frozen=True)
class Table:
    headers: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    right: tuple[bool, ...]
    """Per column: right-aligned, so columns of numbers line up on their last digit."""
    key: str = ""
    """A stable name for the HTML (``data-table``), so a page can be checked table by table."""


@dataclass(frozen=True)
class Bullets:
    items: tuple[str, ...]


@dataclass(frozen=True)
class Para:
    text: str


@dataclass(frozen=True)
class Sub:
    """A sub-heading within a section."""

    text: str


Block = Table | Bullets | Para | Sub


@dataclass(frozen=True)
class Section:
    title: str
    blocks: tuple[Block, ...]


def _table(
    headers: Sequence[str],
    rows: Sequence[Sequence[str]],
    words: Collection[int] = (0,),
    key: str = "",
) -> Table:
    """Columns listed in ``words`` hold text and stay left-aligned; the rest are numbers."""
    return Table(
        headers=tuple(headers),
        rows=tuple(tuple(r) for r in rows),
        right=tuple(i not in words for i in range(len(headers))),
        key=key,
    )


def _label(report: Report, policy: PolicyResult) -> str:
    return policy.label + (" (default)" if policy.policy == report.default_policy else "")


def _ratio_keys(report: Report) -> list[str]:
    """Read from the policies rather than rebuilt from the bounds, so the columns are exactly the
    ratios the report holds, in the order they were computed."""
    keys: dict[str, None] = {}
    for policy in report.policies:
        keys.update(dict.fromkeys(policy.ratio_to_lower_bound))
    return list(keys)


def _vs_cheapest(policy: PolicyResult, cheapest: PolicyResult) -> str:
    """How much more than the cheapest policy: the one figure that ranks the policies."""
    if policy is cheapest:
        return "cheapest"
    difference = policy.cost - cheapest.cost
    if cheapest.cost > 0:
        return signed_pct(difference / cheapest.cost)
    return signed_usd(difference)


def cost_table(report: Report) -> Table:
    """What each policy cost and how long its jobs waited: the trade-off a reader weighs first.
    Kept apart from :func:`usage_table` so that neither needs more than a page's width."""
    keys = _ratio_keys(report)
    cheapest = cheapest_policy(report.policies) if len(report.policies) > 1 else None
    headers = [
        "Policy",
        "Cost",
        *(["vs cheapest"] if cheapest is not None else []),
        "$/useful GPU-h",
        *(_wait_key_header(k) for k in keys),
        "Wait p50 s",
        "Wait p95 s",
        "Wait p99 s",
        "Jobs finished/total",
    ]
    rows = [
        [
            _label(report, p),
            usd(p.cost),
            *([_vs_cheapest(p, cheapest)] if cheapest is not None else []),
            usd_cents(p.cost_per_useful_gpu_hour),
            *(ratio(p.ratio_to_lower_bound.get(k)) for k in keys),
            _wait(p.wait_s, lambda w: w.p50),
            _wait(p.wait_s, lambda w: w.p95),
            _wait(p.wait_s, lambda w: w.p99),
            _jobs(p),
        ]
        for p in report.policies
    ]
    return _table(headers, rows, key="comparison-cost")


def usage_table(report: Report) -> Table:
    """Where each policy's GPU-hours went and what the cloud took back."""
    headers = [
        "Policy",
        "GPU-h useful",
        "GPU-h cloud paid",
        "GPU-h cloud idle",
        "GPU-h lost",
        "Interruptions",
        "Checkpoints",
        "On-prem util",
        "GPU-h on-prem allocated idle",
    ]
    rows = [
        [
            _label(report, p),
            num(p.gpu_hours.useful, 1),
            num(p.gpu_hours.cloud_paid, 1),
            num(p.gpu_hours.cloud_idle, 1),
            num(p.gpu_hours.lost, 1),
            num(p.interruptions),
            num(p.checkpoints),
            pct(p.onprem_utilisation),
            num(p.gpu_hours.onprem_allocated_idle, 1),
        ]
        for p in report.policies
    ]
    return _table(headers, rows, key="comparison-usage")


def comparison_tables(report: Report) -> tuple[Table, Table]:
    """The comparison in two tables of at most ten columns each: one table of seventeen columns
    did not fit a page and hid its right half behind a scroll bar."""
    return cost_table(report), usage_table(report)


def _comparison_blocks(report: Report) -> tuple[Block, ...]:
    cost, usage = comparison_tables(report)
    return (Sub("Cost and queue wait"), cost, Sub("GPU-hours and interruptions"), usage)


def checkpoint_table(comparison: CheckpointComparison) -> Table:
    headers = [
        "Checkpoint awareness",
        "GPU-h lost",
        "Cost",
        "Wait p95 s",
        "Requeues",
        "Interruptions",
    ]
    rows = [
        [
            f"{comparison.label}: {'with' if side.checkpoint_aware else 'without'}",
            num(side.gpu_hours_lost, 1),
            usd(side.cost),
            num(side.wait_p95_s),
            num(side.requeues),
            num(side.interruptions),
        ]
        for side in (comparison.aware, comparison.unaware)
    ]
    return _table(headers, rows)


def _checkpoint_blocks(report: Report) -> tuple[Block, ...]:
    comparison = report.checkpoint_comparison
    if comparison is None:
        return (Para("Not compared in this run."),)
    return (
        Para(
            f"{comparison.label} replayed twice on the same trace: with checkpoint-aware "
            "interruption handling and scale-down (jobs checkpoint on request before a notice's "
            "deadline or a drain, and underused nodes hand their jobs on), and without (jobs "
            "lose what they ran since their last periodic checkpoint)."
        ),
        checkpoint_table(comparison),
    )


def _bound_cost(bound: LowerBoundResult) -> str:
    return usd(bound.cost) if bound.cost is not None else f"none ({bound.status})"


def lower_bound_table(report: Report) -> Table:
    rows = [
        [
            secs(b.max_wait_s),
            _bound_cost(b),
            b.method,
            b.status,
            secs(b.bin_s),
            f"{b.solve_s:.1f} s",
            _left_out(b),
        ]
        for b in report.lower_bounds
    ]
    headers = ["Max wait W", "Cost", "Method", "Status", "Bin", "Solve time", "Left out"]
    return _table(headers, rows, words=(0, 2, 3, 6))


def _left_out(bound: LowerBoundResult) -> str:
    """Jobs the bound leaves out because nothing configured can ever run them."""
    if not bound.excluded_jobs:
        return "none"
    return f"{bound.excluded_jobs:,} jobs ({bound.excluded_gpu_hours:,.1f} GPU-h)"


def _bound_line(bound: LowerBoundResult) -> str:
    return (
        f"Lower bound W={secs(bound.max_wait_s)}: {_bound_cost(bound)} "
        f"({bound.method}, {bound.status}, solved in {bound.solve_s:.1f} s; "
        f"left out: {_left_out(bound)})"
    )


def _unhostable_text(window: WindowInfo) -> str:
    if window.unhostable_jobs is None:
        return "unknown"
    if not window.unhostable_jobs:
        return "none"
    return (
        f"{window.unhostable_jobs:,} ({window.unhostable_gpu_hours or 0:,.1f} GPU-hours); "
        "first: " + "; ".join(window.unhostable_examples)
    )


def _window_facts(report: Report) -> tuple[str, ...]:
    if report.journal is not None:
        return _journal_window(report.journal)
    w = report.window
    skipped = sum(w.skipped.values())
    skipped_text = f"{skipped:,} ({_counts(w.skipped)})" if skipped else "none"
    return (
        f"Scenario file: {report.source}",
        f"Trace: {w.trace}",
        f"Window: {w.days:g} days (trace time {num(w.start_s)} s to {num(w.end_s)} s); "
        f"prices read as if starting {report.start}",
        f"Jobs: {w.jobs:,}, of which {w.carried_jobs:,} carried in already running; "
        f"{num(w.gpu_hours_submitted, 1)} GPU-hours submitted",
        f"Skipped trace rows: {skipped_text}",
        f"Jobs no configured capacity can ever host (they stay pending): {_unhostable_text(w)}",
        f"On-prem GPUs: {report.onprem_gpus:,}; wait target {secs(report.wait_target_s)}; "
        f"seed {report.seed}",
    )


def _journal_window(facts: JournalFacts) -> tuple[str, ...]:
    asked = f"{facts.since or 'the first record'} to {facts.until or 'the last record'}"
    ticks = f"{facts.first_tick} to {facts.last_tick}" if facts.first_tick is not None else "none"
    return (
        f"Journal: {facts.where}",
        f"Period asked for: {asked}",
        f"Ticks recorded: {ticks}",
        f"Ticks by outcome: {_counts(facts.ticks_by_outcome)}",
        "A dash is a figure the journal cannot know (queue waits, jobs, GPU use); it is "
        "not a zero.",
    )


def journal_facts(facts: JournalFacts) -> tuple[str, ...]:
    capped = ", ".join(
        f"{rule}: {hours:,.2f} h" for rule, hours in sorted(facts.budget_capped_hours.items())
    )
    providers = ", ".join(
        f"{name}: {usd_cents(usd)}" for name, usd in sorted(facts.cost_by_provider.items())
    )
    return (
        f"Cloud cost: {usd_cents(sum(facts.cost_by_provider.values()))} "
        f"({providers or 'no cloud instance billed'})",
        f"Instances billed: {facts.instances_billed:,}; launched: "
        f"{facts.instances_launched:,}; terminated: {facts.instances_terminated:,}",
        f"Interruptions: {facts.interruptions:,}; work lost: {facts.lost_gpu_hours:,.2f} GPU-h",
        f"Scale-up stopped by a budget cap: {capped or 'never'}",
        f"Cloud calls cut short by a stop: {facts.cloud_calls_cut_short:,}",
        _onprem_idle_fact(facts),
    )


def _onprem_idle_fact(facts: JournalFacts) -> str:
    """The on-prem GPUs jobs held and did not use, and where: the waste allocation hides."""
    if facts.onprem_idle_gpu_hours is None:
        return (
            "On-prem GPUs allocated while their node read idle: unknown (no tick in the period "
            "had a utilisation reading for the on-prem nodes)"
        )
    top = ", ".join(f"{n.node} {n.gpu_hours:,.2f}" for n in facts.onprem_idle_top_nodes)
    unknown = (
        f"; {facts.onprem_idle_unknown_ticks:,} tick(s) could not know"
        if facts.onprem_idle_unknown_ticks
        else ""
    )
    return (
        f"On-prem GPUs allocated while their node read idle: "
        f"{facts.onprem_idle_gpu_hours:,.2f} GPU-h"
        + (f" (most: {top} GPU-h)" if top else "")
        + unknown
    )


def journal_actions_table(facts: JournalFacts) -> Table:
    rows = [
        [kind, outcome, num(count)]
        for kind, outcomes in sorted(facts.actions.items())
        for outcome, count in sorted(outcomes.items())
    ]
    return _table(["Action", "Outcome", "Count"], rows, words=(0, 1))


def _journal_blocks(facts: JournalFacts) -> tuple[Block, ...]:
    blocks: list[Block] = [Bullets(journal_facts(facts))]
    if facts.actions:
        blocks += [Sub("Actions by outcome"), journal_actions_table(facts)]
    else:
        blocks.append(Para("No action was journaled in the period."))
    return tuple(blocks)


def _lower_bound_blocks(report: Report) -> tuple[Block, ...]:
    if not report.lower_bounds:
        return (Para("No lower bound was computed for this run."),)
    return (lower_bound_table(report),)


def _findings(report: Report) -> Bullets | Para:
    return Bullets(tuple(report.findings)) if report.findings else Para("No findings.")


def _assumptions(report: Report) -> Bullets | Para:
    if not report.assumptions:
        return Para("The report states no assumptions.")
    return Bullets(tuple(report.assumptions))


def _pool_cost_table(policy: PolicyResult) -> Table:
    # dearest first: the pools worth a look head the table
    paid = sorted((c for c in policy.cost_by_pool if c.cost > 0), key=lambda c: (-c.cost, c.pool))
    rows = [
        [
            c.pool,
            usd(c.cost),
            num(c.instance_hours, 1),
            pct(c.cost / policy.cost) if policy.cost else DASH,
        ]
        for c in paid
    ]
    return _table(["Pool", "Cost", "Instance-hours", "Share"], rows)


def _cost_by_pool_blocks(report: Report) -> tuple[Block, ...]:
    blocks: list[Block] = []
    for policy in report.policies:
        blocks.append(Sub(f"{policy.label} ({policy.policy}: {_params(policy.params)})"))
        if any(c.cost > 0 for c in policy.cost_by_pool):
            blocks.append(_pool_cost_table(policy))
        else:
            blocks.append(Para("No cloud cost."))
    return tuple(blocks)


def gpu_hours_table(report: Report) -> Table:
    headers = [
        "Policy",
        "Useful",
        "On-prem allocated",
        "Cloud allocated",
        "Cloud paid",
        "Cloud idle",
        "Lost",
        "Checkpointing",
        "On-prem allocated idle",
    ]
    rows = []
    for p in report.policies:
        g = p.gpu_hours
        values = (
            g.useful,
            g.allocated_onprem,
            g.allocated_cloud,
            g.cloud_paid,
            g.cloud_idle,
            g.lost,
            g.checkpointing,
            g.onprem_allocated_idle,
        )
        rows.append([p.label, *(num(v, 1) for v in values)])
    return _table(headers, rows)


def team_table(policy: PolicyResult) -> Table:
    """One row a team, idle last, and the total: the teams' costs add up to it to the cent."""
    rows = []
    for t in policy.teams:
        rows.append(
            [
                t.team,
                num(t.jobs, 0) if t.jobs else DASH,
                _wait(t.wait_s, lambda w: w.p50),
                _wait(t.wait_s, lambda w: w.p95),
                num(t.gpu_hours_onprem, 1),
                num(t.gpu_hours_cloud, 1),
                usd(t.cost_cents / 100),
                pct(t.cost_cents / 100 / policy.cost) if policy.cost else DASH,
                DASH if t.guaranteed_gpus is None else num(t.guaranteed_gpus, 0),
                _short(t.short_gpu_hours, t.short_share),
                _short(t.late_gpu_hours, t.late_share),
            ]
        )
    total = sum(t.cost_cents for t in policy.teams)
    rows.append(
        [
            "all",
            num(sum(t.jobs for t in policy.teams), 0),
            _wait(policy.wait_s, lambda w: w.p50),
            _wait(policy.wait_s, lambda w: w.p95),
            num(sum(t.gpu_hours_onprem for t in policy.teams), 1),
            num(sum(t.gpu_hours_cloud for t in policy.teams), 1),
            usd(total / 100),
            DASH,
            DASH,
            DASH,
            DASH,
        ]
    )
    headers = [
        "Team",
        "Jobs",
        "Wait p50",
        "Wait p95",
        "On-prem GPU-h",
        "Cloud GPU-h",
        "Cost",
        "Share",
        "Guaranteed GPUs",
        "Below guarantee GPU-h (ticks)",
        "Beyond the bound GPU-h (ticks)",
    ]
    return _table(headers, rows)


def _short(gpu_hours: float | None, share: float | None) -> str:
    """How far the team fell below its guarantee while it had work waiting."""
    if gpu_hours is None:
        return DASH
    return num(gpu_hours, 1) + (f" ({pct(share)})" if share is not None else "")


def static_pools_table(static: StaticPools) -> Table:
    rows = [
        [
            t.team,
            num(t.onprem_gpus, 0),
            num(t.jobs, 0),
            usd(t.static_cost),
            usd(t.shared_cost),
            _wait(t.static_wait_s, lambda w: w.p95),
            _wait(t.shared_wait_s, lambda w: w.p95),
        ]
        for t in static.teams
    ]
    rows.append(
        [
            "all",
            num(sum(t.onprem_gpus for t in static.teams), 0),
            num(sum(t.jobs for t in static.teams), 0),
            usd(static.static_cost),
            usd(static.shared_total),
            DASH,
            DASH,
        ]
    )
    headers = [
        "Team",
        "Its on-prem GPUs",
        "Jobs",
        "Static pools cost",
        "Shared cost",
        "Static p95 s",
        "Shared p95 s",
    ]
    return _table(headers, rows)


def _static_blocks(static: StaticPools) -> tuple[Block, ...]:
    return (
        Para(
            f"Each team's jobs replayed alone with {static.policy} on its own slice of the "
            "on-prem fleet (its guarantee, then what nobody is guaranteed by weight) and the "
            "same cloud pools: what the fleet cost before it was shared. The shared cost is the "
            "team's share of the shared replay's bill; its total row is the whole bill, idle "
            "time included."
        ),
        static_pools_table(static),
    )


def _team_blocks(report: Report) -> tuple[Block, ...]:
    if report.kind == "journal":
        return _journal_team_blocks(report)
    blocks: list[Block] = [
        Para(
            "Each pool's bill is split between the teams whose jobs held its GPUs, by "
            "GPU-seconds, in whole cents (largest remainder); (idle) is paid time no job held. "
            "The rows add up to the policy's cost. Below guarantee: the on-prem GPU-hours a "
            "team held fewer than its guarantee (or its waiting work, if less) while it had "
            "jobs waiting, and on what share of the ticks. Quotas with borrowing take lent "
            "GPUs back within teams.reclaim_within_s, so some shortfall is by design; beyond "
            "the bound: the same counted only once the team had been short without a break "
            "for longer than that, what the bound did not keep."
        )
    ]
    for policy in report.policies:
        blocks.append(Sub(f"{policy.label} ({policy.policy}: {_params(policy.params)})"))
        blocks.append(team_table(policy))
    return tuple(blocks)


def _journal_team_blocks(report: Report) -> tuple[Block, ...]:
    blocks: list[Block] = [
        Para(
            "Each pool's cost is split between the teams whose jobs held its GPUs tick by "
            "tick, by GPU share, in whole cents; (idle) is paid time no job held, (unknown) "
            "time whose jobs were not read. The rows add up to the cost."
        )
    ]
    for policy in report.policies:
        blocks.append(team_table(policy))
    return tuple(blocks)


def fragmentation_table(report: Report) -> Table:
    rows = []
    for p in report.policies:
        f = p.fragmentation
        if f is None:
            continue
        share = f.stranded_share
        rows.append(
            [
                p.label,
                num(f.stranded_gpus, 2),
                num(f.free_gpus, 2),
                DASH if share is None else pct(share),
            ]
        )
    headers = [
        "Policy",
        "Stranded GPUs (mean)",
        "Free GPUs (mean)",
        "Stranded share of free",
    ]
    return _table(headers, rows)


def _sharing_blocks(report: Report) -> tuple[Block, ...]:
    return (
        Para(
            "Jobs asking for a fraction of a GPU share GPUs where the scenario allows it "
            "(gpu_sharing; see Assumptions). Stranded: free slices on GPUs that are partly used, "
            "in GPUs, which only another fractional job can use; free: those slices and every "
            "GPU with nothing on it, on nodes that take work; both are means over the sampled "
            "ticks. The GPU-hours elsewhere in this report count a fractional job's slice."
        ),
        fragmentation_table(report),
    )


def activity_table(report: Report) -> Table:
    headers = [
        "Policy",
        "Instances launched",
        "Capacity failures",
        "Requeues",
        "Moved to make room",
        "Jobs never started",
        "Held ticks",
        "Guard clamps",
    ]
    rows = [
        [
            p.label,
            num(p.instances_launched),
            num(p.capacity_failures),
            num(p.requeues),
            num(p.migrations),
            num(p.jobs_never_started),
            num(p.held_ticks),
            _counts(p.clamps),
        ]
        for p in report.policies
    ]
    return _table(headers, rows, words=(0, len(headers) - 1))


def pools_table(report: Report) -> Table:
    headers = [
        "Pool",
        "Provider",
        "Region",
        "Zone",
        "Instance type",
        "Market",
        "Interruptions",
        "GPUs",
        "$/h at start",
    ]
    rows = [
        [
            r.name,
            r.provider,
            r.region or DASH,
            r.zone or DASH,
            r.instance_type or DASH,
            r.market or DASH,
            r.interruptions,
            str(r.gpus),
            usd_cents(r.price_per_hour_at_start),
        ]
        for r in report.pools
    ]
    return _table(headers, rows, words=range(7))


def replay_table(report: Report) -> Table:
    headers = ["Policy", "Ticks", "Replay wall s", "Tick ms p50", "Tick ms p95", "Tick ms max"]
    rows = [
        [
            p.label,
            num(p.ticks),
            num(p.replay_wall_s, 2),
            f"{p.tick_ms.p50:,.2f}",
            f"{p.tick_ms.p95:,.2f}",
            f"{p.tick_ms.max:,.2f}",
        ]
        for p in report.policies
    ]
    return _table(headers, rows)


def _lead_sections(report: Report) -> list[Section]:
    """What a reader needs first: what was replayed, how the policies compare, and against what."""
    journal = (
        [Section("What the journal recorded", _journal_blocks(report.journal))]
        if report.journal is not None
        else []
    )
    return [
        Section("Window", (Bullets(_window_facts(report)),)),
        *journal,
        Section("Comparison", _comparison_blocks(report)),
        Section("Lower bounds", _lower_bound_blocks(report)),
        Section("Findings", (_findings(report),)),
        Section("Checkpoint awareness", _checkpoint_blocks(report)),
    ]


def _detail_sections(report: Report) -> list[Section]:
    teams = (
        [Section("Teams", _team_blocks(report))] if any(p.teams for p in report.policies) else []
    )
    if report.static_pools is not None:
        teams.append(Section("Static per-team pools", _static_blocks(report.static_pools)))
    if any(p.fragmentation is not None for p in report.policies):
        teams.append(Section("GPU sharing and fragmentation", _sharing_blocks(report)))
    return [
        *teams,
        Section("Cost by pool", _cost_by_pool_blocks(report)),
        Section("GPU-hours", (gpu_hours_table(report),)),
        Section("Controller activity", (activity_table(report),)),
        Section("Pools", (pools_table(report),)),
        Section("Assumptions", (_assumptions(report),)),
        Section("Replay", (replay_table(report),)),
    ]


def _title(report: Report) -> str:
    if report.kind == "journal":
        return f"Real spend from the journal: {report.scenario}"
    return f"Dry-run cost report: {report.scenario}"


# ---------------------------------------------------------------- Markdown


def _md_text(text: str) -> str:
    return " ".join(text.split())


def _md_cell(text: str) -> str:
    return _md_text(text).replace("|", "\\|")


def _md_table(table: Table) -> str:
    rule = ["---:" if r else ":---" for r in table.right]
    lines = [
        "| " + " | ".join(_md_cell(h) for h in table.headers) + " |",
        "| " + " | ".join(rule) + " |",
    ]
    lines += ["| " + " | ".join(_md_cell(c) for c in row) + " |" for row in table.rows]
    return "\n".join(lines)


def _md_block(block: Block) -> str:
    if isinstance(block, Table):
        return _md_table(block)
    if isinstance(block, Bullets):
        return "\n".join(f"- {_md_text(item)}" for item in block.items)
    if isinstance(block, Sub):
        return f"### {_md_text(block.text)}"
    return _md_text(block.text)


def _md_section(section: Section) -> str:
    return "\n\n".join([f"## {section.title}", *(_md_block(b) for b in section.blocks)])


def render_markdown(report: Report) -> str:
    """The whole report, readable in a terminal and rendered by any Markdown viewer."""
    parts = [f"# {_md_text(_title(report))}"]
    if report.description.strip():
        parts.append(_md_text(report.description))
    parts += [_md_section(s) for s in _lead_sections(report) + _detail_sections(report)]
    return "\n\n".join(parts) + "\n"


def summary_markdown(report: Report) -> str:
    """What the CLI prints after a run: enough to judge the result without opening a file."""
    parts = [f"## {_md_text(_title(report))}"]
    if report.journal is not None:
        parts.append(_md_block(Bullets(journal_facts(report.journal))))
    parts += [_md_table(t) for t in comparison_tables(report)]
    if report.lower_bounds:
        parts.append("\n".join(f"- {_bound_line(b)}" for b in report.lower_bounds))
    if report.checkpoint_comparison is not None:
        parts.append(_md_table(checkpoint_table(report.checkpoint_comparison)))
    parts.append("Findings:\n\n" + _md_block(_findings(report)))
    parts.append("Assumptions:\n\n" + _md_block(_assumptions(report)))
    return "\n\n".join(parts) + "\n"


# ---------------------------------------------------------------- HTML

_CSS = """
body{margin:0;background:#fafafa;color:#1d1d1f;
font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,Helvetica,Arial,sans-serif}
main{max-width:1200px;margin:0 auto;padding:24px 32px 48px}
h1{font-size:1.6em;margin:0 0 .3em}
h2{font-size:1.25em;margin:1.8em 0 .6em;border-bottom:1px solid #ddd;padding-bottom:.2em}
h3{font-size:1.05em;margin:1.2em 0 .4em}
.scroll{overflow-x:auto}
table{border-collapse:collapse;margin:.4em 0 1em;background:#fff}
th,td{border:1px solid #ddd;padding:4px 8px;vertical-align:top}
th{background:#f0f0f3;text-align:left;font-weight:600;vertical-align:bottom}
th.num{text-align:right}
th span{white-space:nowrap}
td.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
tbody tr:nth-child(even){background:#f7f7f9}
figure{margin:1em 0 2em;background:#fff;border:1px solid #ddd;padding:8px}
figure svg{display:block;width:100%;height:auto}
figcaption{color:#555;font-size:.92em;margin-top:4px}
li{margin:.2em 0}
@media (max-width:900px){body{font-size:13px}main{padding:16px 12px 32px}th,td{padding:3px 5px}}
""".strip()


def _esc(text: str) -> str:
    return html.escape(text, quote=True)


def _html_cell(tag: str, text: str, right: bool) -> str:
    cls = ' class="num"' if right else ""
    return f"<{tag}{cls}>{_esc(text)}</{tag}>"


def _html_header(text: str, right: bool) -> str:
    """A header wraps between its words only: a narrow column must not read 'GPU-' over 'h'
    (a hyphen is a place a line may break; a word holding one is kept whole)."""
    cls = ' class="num"' if right else ""
    words = " ".join(
        f"<span>{_esc(word)}</span>" if "-" in word else _esc(word) for word in text.split()
    )
    return f"<th{cls}>{words}</th>"


def _html_table(table: Table) -> str:
    head = "".join(_html_header(h, r) for h, r in zip(table.headers, table.right, strict=True))
    body = "\n".join(
        "<tr>" + "".join(_html_cell("td", c, r) for c, r in zip(row, table.right, strict=True))
        for row in table.rows
    )
    name = f' data-table="{_esc(table.key)}"' if table.key else ""
    return (
        f'<div class="scroll"><table{name}>\n<thead><tr>{head}</tr></thead>\n'
        f"<tbody>\n{body}\n</tbody>\n</table></div>"
    )


def _html_block(block: Block) -> str:
    if isinstance(block, Table):
        return _html_table(block)
    if isinstance(block, Bullets):
        return "<ul>\n" + "\n".join(f"<li>{_esc(i)}</li>" for i in block.items) + "\n</ul>"
    if isinstance(block, Sub):
        return f"<h3>{_esc(block.text)}</h3>"
    return f"<p>{_esc(block.text)}</p>"


def _html_section(title: str, body: Sequence[str]) -> str:
    return "<section>\n" + "\n".join([f"<h2>{_esc(title)}</h2>", *body]) + "\n</section>"


def _html_of(section: Section) -> str:
    return _html_section(section.title, [_html_block(b) for b in section.blocks])


def _figure(plot: Plot) -> str:
    return f"<figure>\n{plot.svg}\n<figcaption>{_esc(plot.caption)}</figcaption>\n</figure>"


def _plots_section(report: Report) -> str:
    return _html_section("Plots", [_figure(p) for p in plots(report)])


def render_html(report: Report) -> str:
    """One file that opens offline anywhere: inline CSS and SVG, no scripts, fonts or links."""
    title = _title(report)
    sections = [
        *(_html_of(s) for s in _lead_sections(report)),
        _plots_section(report),
        *(_html_of(s) for s in _detail_sections(report)),
    ]
    intro = f"<p>{_esc(report.description)}</p>" if report.description.strip() else ""
    return "\n".join(
        [
            "<!DOCTYPE html>",
            '<html lang="en">',
            '<head>\n<meta charset="utf-8">',
            '<meta name="viewport" content="width=device-width, initial-scale=1">',
            f"<title>{_esc(title)}</title>",
            f"<style>\n{_CSS}\n</style>\n</head>",
            "<body>\n<main>",
            f"<h1>{_esc(title)}</h1>",
            intro,
            *sections,
            "</main>\n</body>\n</html>",
            "",
        ]
    )
