"""``gpu-autoscaler plan``: one read-only tick against the real queue, telemetry and clouds.

An operator wants to see what the controller would do, and what it would cost, before letting
it act, or beside one that already runs. So this builds the controller from the same config by
the same assembly (``build_controller`` in plan mode) and runs one real tick — observe, the
policy, the controller's rules, the guard and act — with an executor that records every change
instead of making it (``autoscaler.app.recording``): there is no copy of act's walk to drift.
No notice inbox, metrics server, journal or leader lock is started. Interruption notices are
not read either: taking a message off the AWS interruption queue hides it from the running
controller, and GCP and Azure notices come from the node agents.

A failed source or listing does not end the run: the plan says which one failed and that its
demand or supply is unknown, and exits 0, since a degraded plan still shows most of the picture;
``complete`` in the JSON (``DEGRADED`` in the text) tells scripts.
"""

from __future__ import annotations

import argparse
import json
import logging
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

from pydantic import Field

from autoscaler.app.assembly import Mode, build_controller, build_file_parts
from autoscaler.app.preview import LaunchPreview, Preview, Value, preview
from autoscaler.model.clock import Clock, SystemClock
from autoscaler.model.config import ControllerConfig, load_config
from autoscaler.model.errors import InputError
from autoscaler.model.logs import configure
from autoscaler.model.records import TickReport
from autoscaler.model.secrets import (
    register_environment_secrets,
    scrub,
    scrub_strings,
    scrubbed_error,
)
from autoscaler.tick.budget import hours_to_month_end
from autoscaler.tick.intents import Intents
from autoscaler.tick.observe import Observation

NOTES = (
    "read-only: nothing was launched, terminated, tagged, drained or requeued",
    "interruption notices were not read (the running controller owns the AWS queue; GCP and "
    "Azure notices come from node agents)",
    "cool-downs and the capacity cache start empty, as in a controller that has just started",
)


class SourceState(Value):
    kind: str
    name: str
    ok: bool


class DemandSummary(Value):
    known: bool
    jobs: int
    gpus: int
    failed_sources: tuple[str, ...]


class PlanReport(Preview):
    """The plan as printed: what was read, what the controller would do, what it would cost."""

    fleet_id: str
    policy: str
    at: float
    complete: bool
    held: str | None
    reason: str
    demand: DemandSummary
    onprem_gpus: int
    onprem_gpus_free: int
    unlisted_providers: tuple[str, ...]
    sources: tuple[SourceState, ...]
    problems: tuple[str, ...]
    hours_left_in_month: float
    month_end_run_cost: float | None = Field(
        description="the fleet after this plan, run to the month's end at today's prices; "
        "this month's spend so far (in the journal) comes on top"
    )
    monthly_cap: float | None = None
    calls: tuple[tuple[str, ...], ...] = Field(
        (),
        description="what act called, in order, against the recording executor: the calls the "
        "live controller would make this tick when every first choice is fulfilled",
    )
    notes: tuple[str, ...] = NOTES


def run(args: argparse.Namespace) -> int:
    """Prints the plan with every secret the process knows scrubbed out: a source's error can
    carry its token back (a server echoing the bearer header), and so can an ``InputError`` or
    a warning logged on stderr."""
    if not logging.getLogger().handlers:  # a process that routes its logs keeps its routing
        configure("WARNING", json_lines=False)  # what observe logs on stderr is scrubbed too
    try:
        report = make_report(args.config)
    except InputError as exc:
        raise scrubbed_error(exc) from None
    if args.json:
        print(
            json.dumps(scrub_strings(report.model_dump(mode="json")), indent=2, ensure_ascii=False)
        )
    else:
        print(scrub(render(report)))
    return 0


def make_report(path: Path, clock: Clock | None = None) -> PlanReport:
    """One real tick, recorded, from the config at ``path``; bad config raises ``InputError``
    before anything is read. Every ``*_env`` field's variable is read and its value registered
    as a secret first (a name that is a pasted secret is refused unechoed)."""
    where = str(path)
    config = load_config(path)
    register_environment_secrets()
    parts = build_file_parts(config, where)
    try:
        assembled = build_controller(
            config, Mode.PLAN, parts.policy, clock or SystemClock(), parts.plugged()
        )
        controller = assembled.controller
        try:
            tick = controller.tick()
        finally:
            controller.close()
        observation, intents = controller.last_observation, controller.last_intents
        assert observation is not None and intents is not None  # set by every tick
    finally:
        parts.close(quiet=True)
    calls = tuple(assembled.recorded.calls) if assembled.recorded is not None else ()
    return _report(config, tick, observation, intents, calls)


def _report(
    config: ControllerConfig,
    tick: TickReport,
    observation: Observation,
    intents: Intents,
    calls: tuple[tuple[str, ...], ...] = (),
) -> PlanReport:
    view = tick.view
    hours = hours_to_month_end(view.now)
    held = f"{tick.held}; the fleet would be held" if tick.held else None
    shown = preview(view, intents, observation.failed_providers)
    demand = view.demand
    problems = tuple(observation.errors) + ((held,) if held else ())
    return PlanReport(
        **dict(shown),
        fleet_id=config.fleet_id,
        policy=config.policy.name,
        at=view.now,
        complete=not problems and shown.cost_complete,
        held=held,
        reason=tick.plan.reason,
        demand=DemandSummary(
            known=demand.known,
            jobs=demand.jobs,
            gpus=demand.gpus,
            failed_sources=demand.failed_sources,
        ),
        onprem_gpus=view.onprem_gpus,
        onprem_gpus_free=view.onprem_gpus_free,
        unlisted_providers=tuple(sorted(observation.failed_providers)),
        sources=tuple(
            SourceState(kind=kind, name=name, ok=ok)
            for (kind, name), ok in sorted(observation.source_status.items())
        ),
        problems=problems,
        hours_left_in_month=round(hours, 3),
        month_end_run_cost=round(shown.cost_per_hour_after * hours, 2)
        if shown.cost_complete
        else None,
        monthly_cap=config.limits.max_cost_per_month,
        calls=calls,
    )


# -- text ------------------------------------------------------------------------------------


def render(report: PlanReport) -> str:
    when = datetime.fromtimestamp(report.at, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    state = "" if report.complete else "  DEGRADED: see problems below"
    lines = [
        f"plan for fleet {report.fleet_id!r}, policy {report.policy!r}, at {when}{state}",
        *(f"note: {note}" for note in report.notes),
        "",
        _demand_line(report),
        f"on-prem: {report.onprem_gpus_free} of {report.onprem_gpus} GPU(s) free",
    ]
    if report.held:
        lines.append(f"HELD: {report.held}")
    lines += ["", *_pool_table(report), "", _month_line(report), ""]
    lines += _section("launches", [_launch_line(launch) for launch in report.launches])
    lines += _section(
        "drains",
        [
            f"{d.instance_id} in {d.pool}: {d.reason}" + (" (jobs move now)" if d.move_jobs else "")
            for d in report.drains
        ],
    )
    lines += _section(
        "orphans collected (tagged ours, pool not configured; not priced, not in the totals)",
        [f"{o.instance_id} in {o.pool} ({o.state})" for o in report.orphans],
    )
    lines += _section(
        "clamped by the guard",
        [
            f"{c.rule}" + (f" {c.pool}" if c.pool else "") + f": {c.requested} -> {c.allowed}: "
            f"{c.detail}"
            for c in report.clamps
        ],
    )
    if report.problems:
        lines += _section("problems", list(report.problems))
    return "\n".join(lines).rstrip() + "\n"


def _month_line(report: PlanReport) -> str:
    """The projection the guard holds under ``limits.max_cost_per_month``, as far as plan mode
    can tell it: it reads no journal, so this month's spend so far is added by the reader."""
    run = _money(report.month_end_run_cost)
    line = (
        f"projected month-end: {run} for this fleet to the month's end "
        f"({report.hours_left_in_month:,.0f} h left), plus this month's spend so far (journal)"
    )
    if report.monthly_cap is not None:
        line += f"; limits.max_cost_per_month is ${report.monthly_cap:,.2f}"
    return line


def _demand_line(report: PlanReport) -> str:
    demand = report.demand
    if not demand.known:
        failed = ", ".join(demand.failed_sources)
        return (
            f"demand: UNKNOWN (queue source(s) {failed} failed); "
            f"{demand.jobs} pending job(s), {demand.gpus} GPU(s) from the others"
        )
    return f"demand: {demand.jobs} pending job(s), {demand.gpus} GPU(s)"


def _pool_table(report: PlanReport) -> list[str]:
    header = (
        "pool", "provider", "market", "$/h each", "now", "launch", "drain", "after",
        "$/h now", "$/h after",
    )  # fmt: skip
    rows = [header]
    for c in report.pools:
        rows.append(
            (
                c.pool,
                c.provider,
                c.market,
                _money(c.price_per_hour),
                _count(c.instances_now),
                f"+{c.launches}",
                f"-{c.drains}",
                _count(c.instances_after),
                _money(c.cost_per_hour_now),
                _money(c.cost_per_hour_after),
            )
        )
    known_now = [c.instances_now for c in report.pools]
    known_after = [c.instances_after for c in report.pools]
    mark = "" if report.cost_complete else " (lower bound)"
    rows.append(
        (
            "total",
            "",
            "",
            "",
            _count(_sum(known_now)),
            f"+{sum(c.launches for c in report.pools)}",
            f"-{sum(c.drains for c in report.pools)}",
            _count(_sum(known_after)),
            _money(report.cost_per_hour_now) + mark,
            _money(report.cost_per_hour_after) + mark,
        )
    )
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    return [
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in rows
    ]


def _launch_line(launch: LaunchPreview) -> str:
    if launch.skipped is not None:
        return f"{launch.pool}: {launch.count} asked, none tried: {launch.skipped}"
    walked = ", then ".join(f"{a.pool} {a.granted} of {a.wanted}" for a in launch.attempts)
    tried = {a.pool for a in launch.attempts}
    spare = [f for f in launch.fallbacks if f not in tried]
    tail = f"; on a capacity failure: {', '.join(spare)}" if spare else ""
    why = f" ({launch.reason})" if launch.reason else ""
    return f"{launch.pool}: {launch.count} asked{why}: {walked}{tail}"


def _section(title: str, items: Sequence[str]) -> list[str]:
    if not items:
        return [f"{title}: none"]
    return [f"{title}:", *(f"  {item}" for item in items)]


def _money(value: float | None) -> str:
    return "unknown" if value is None else f"${value:,.4f}"


def _count(value: int | None) -> str:
    return "unknown" if value is None else str(value)


def _sum(values: Sequence[int | None]) -> int | None:
    return None if any(v is None for v in values) else sum(v for v in values if v is not None)
