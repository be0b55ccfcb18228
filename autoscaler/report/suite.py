"""The evaluation suite: many scenarios, the same policies with the same parameters, one table.

A policy tuned on one scenario can look good there for reasons that do not carry over. The suite
replays every scenario it lists (real traces in several windows and fleet sizes, and generated
families that exaggerate bursts, day/night swings, gangs, long jobs and pinned models) with one
fixed list of policies, and judges each policy against what no schedule can beat (the offline
lower bound at the scenario's wait target) and against the cheapest other policy ("best peer").
Medians over scenarios, not a favourite scenario, are the headline. docs/evaluation.md describes
the shipped suite.

The suite file (paths relative to it)::

    name: evaluation
    default_policy: cost-aware          # the policy under judgement; every other one is a peer
    policies:                           # run in every scenario, overriding the scenarios' lists
      - name: cost-aware
      - name: cheapest-spot
    scenarios:
      - file: alibaba-openb-busy-25d.yaml
      - file: synthetic-bursty.yaml
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from pydantic import Field, NonNegativeFloat

from autoscaler.model import Frozen
from autoscaler.model.errors import InputError
from autoscaler.model.inputfile import LocatedDocument, read_yaml, validate_document
from autoscaler.model.progress import Progress
from autoscaler.report.build import DEFAULT_POLICY, policy_result
from autoscaler.report.model import PolicyResult
from autoscaler.report.render_paths import shown_path
from autoscaler.sim.engine import Prepared, prepare, simulate
from autoscaler.sim.lowerbound_result import LowerBoundResult
from autoscaler.sim.scenario import LoadedScenario, PolicySpec, load_scenario
from autoscaler.spi.policy import build_policy, policy_class

HOUR = 3600.0
DASH = "—"

# ---------------------------------------------------------------- the suite file


class SuiteEntry(Frozen):
    """One scenario of the suite: a scenario file, relative to the suite file."""

    file: str = Field(min_length=1)


class SuiteFile(Frozen):
    name: str = Field(min_length=1)
    description: str = ""
    default_policy: str = DEFAULT_POLICY
    policies: tuple[PolicySpec, ...] | None = Field(None, min_length=1)
    peer_wait_slack_s: NonNegativeFloat = 5.0
    scenarios: tuple[SuiteEntry, ...] = Field(min_length=1)


@dataclass(frozen=True)
class LoadedSuite:
    """A validated suite: its scenarios loaded, and the policies each one runs (index, spec)."""

    suite: SuiteFile
    source: str
    scenarios: tuple[LoadedScenario, ...]
    policies: tuple[tuple[tuple[int, PolicySpec], ...], ...]

    def only_scenarios(self, wanted: Sequence[str]) -> LoadedSuite:
        """The suite cut to the scenarios named (by scenario name or file name without .yaml)."""
        keep = [
            i
            for i, loaded in enumerate(self.scenarios)
            if loaded.scenario.name in wanted or Path(loaded.source).stem in wanted
        ]
        known = {s.scenario.name for s in self.scenarios} | {
            Path(s.source).stem for s in self.scenarios
        }
        unknown = sorted(set(wanted) - known)
        if unknown:
            raise InputError(
                self.source,
                f"no scenario named {', '.join(unknown)} in the suite; it has: "
                + ", ".join(s.scenario.name for s in self.scenarios),
                field="scenarios",
            )
        return LoadedSuite(
            self.suite,
            self.source,
            tuple(self.scenarios[i] for i in keep),
            tuple(self.policies[i] for i in keep),
        )


def _check_policy(spec: PolicySpec, where: str, field: str) -> None:
    """Fail before hours of replays, naming the suite or scenario line, not a bare 'config'."""
    try:
        cls = policy_class(spec.name)
    except InputError as exc:
        raise InputError(where, exc.message, field=f"{field}.name") from None
    build_policy(cls, spec.params, where=where, field_prefix=f"{field}.params")


def _check_suite_policies(
    policies: Sequence[PolicySpec], default_policy: str, document: LocatedDocument
) -> None:
    titles: list[str] = []
    for i, spec in enumerate(policies):
        where = document.where(("policies", i))
        _check_policy(spec, where, f"policies[{i}]")
        if spec.title in titles:
            raise InputError(
                where,
                f"a second policy titled {spec.title!r}; give one a label to tell them apart",
                field=f"policies[{i}]",
            )
        titles.append(spec.title)
    if default_policy not in titles:
        loc = ("default_policy",) if "default_policy" in document.data else ("policies",)
        raise InputError(
            document.where(loc),
            f"the default policy {default_policy!r} is not among the policies: "
            + ", ".join(titles),
            field="default_policy",
        )


def _load_entry(document: LocatedDocument, base: Path, index: int) -> LoadedScenario:
    entry = document.data["scenarios"][index]
    loc = ("scenarios", index, "file")
    path = Path(entry["file"])
    path = path if path.is_absolute() else base / path
    if not path.is_file():
        raise InputError(
            document.where(loc), f"no such scenario file: {path}", field=f"scenarios[{index}].file"
        )
    return load_scenario(path)


def load_suite(path: Path | str, only_policies: Sequence[str] | None = None) -> LoadedSuite:
    """Read and check the whole suite (every scenario and policy) before anything is replayed.

    ``only_policies`` (titles or names) keeps just those of the policies that would run."""
    path = Path(path)
    document = read_yaml(path)
    suite = validate_document(SuiteFile, document)
    source = str(path)
    base = path.resolve().parent
    if suite.policies is not None:
        _check_suite_policies(suite.policies, suite.default_policy, document)
    scenarios: list[LoadedScenario] = []
    runs: list[tuple[tuple[int, PolicySpec], ...]] = []
    seen: dict[str, int] = {}
    for i in range(len(suite.scenarios)):
        loaded = _load_entry(document, base, i)
        where, field = document.where(("scenarios", i, "file")), f"scenarios[{i}].file"
        name = loaded.scenario.name
        if name in seen:
            raise InputError(
                where,
                f"scenario {name!r} is already scenarios[{seen[name]}]; list each scenario once",
                field=field,
            )
        seen[name] = i
        if suite.policies is not None:
            specs = tuple(enumerate(suite.policies))
        else:
            specs = tuple(enumerate(loaded.scenario.policies))
            for k, spec in specs:
                _check_policy(spec, loaded.source, f"policies[{k}]")
            if suite.default_policy not in {s.title for _, s in specs}:
                raise InputError(
                    where,
                    f"scenario {name!r} does not run the suite's default_policy "
                    f"{suite.default_policy!r}; add it there or give the suite a policies list",
                    field=field,
                )
        if only_policies:
            specs = tuple(
                (k, s) for k, s in specs if s.title in only_policies or s.name in only_policies
            )
        scenarios.append(loaded)
        runs.append(specs)
    if only_policies:
        ran = {s.title for specs in runs for _, s in specs} | {
            s.name for specs in runs for _, s in specs
        }
        unknown = sorted(set(only_policies) - ran)
        if unknown:
            raise InputError(
                "--policy",
                f"{', '.join(unknown)} is not among the suite's policies",
            )
    return LoadedSuite(suite, source, tuple(scenarios), tuple(runs))


# ---------------------------------------------------------------- what the suite reports


class SuiteRow(Frozen):
    """One policy in one scenario. Ratios are None where their denominator is zero or unknown."""

    policy: str
    name: str
    default: bool
    cost: float
    wait_p50_s: float
    wait_p95_s: float
    gpu_hours_lost: float
    cloud_paid_gpu_hours: float
    # cloud GPU-hours paid but not allocated to a job (booting, idle, packing waste) / paid
    cloud_idle_share: float | None
    instances_launched: int
    jobs_total: int
    jobs_never_started: int
    ratio_to_lower_bound: float | None
    ratio_to_best_peer: float | None
    replay_wall_s: float
    # the process's CPU time for the replay: on a busy machine, wall time says little
    replay_cpu_s: float


class ScenarioResult(Frozen):
    scenario: str
    source: str
    description: str
    days: float
    jobs: int
    onprem_gpus: int
    wait_target_s: float
    lower_bound: LowerBoundResult | None
    default_policy: str | None
    best_peer: str | None
    # best peer's cost / the default's: above 1 the default is cheaper
    peer_over_default: float | None
    default_wait_p95_s: float | None
    peer_wait_p95_s: float | None
    # the best peer's p95 wait is at most the default's plus the suite's slack
    peer_wait_within_slack: bool | None
    prepare_s: float
    rows: list[SuiteRow]


class PolicyMedians(Frozen):
    """One policy's medians over the scenarios it ran in (None where no scenario had a value)."""

    policy: str
    scenarios: int
    ratio_to_lower_bound: float | None
    ratio_to_best_peer: float | None
    wait_p95_s: float | None
    cloud_idle_share: float | None
    gpu_hours_lost: float | None
    cheapest_in: int


class SuiteReport(Frozen):
    suite: str
    description: str
    source: str
    default_policy: str
    policies: list[str]
    peer_wait_slack_s: float
    lower_bound: bool
    scenarios: list[ScenarioResult]
    medians: list[PolicyMedians]
    # the headline: median over scenarios of (best peer's cost / default's cost)
    median_peer_over_default: float | None
    wall_s: float


# ---------------------------------------------------------------- the arithmetic


def _ratio(numerator: float, denominator: float | None) -> float | None:
    if denominator is None or denominator <= 0 or not math.isfinite(denominator):
        return None
    return round(numerator / denominator, 4)


def best_peer(rows: Sequence[SuiteRow]) -> SuiteRow | None:
    """The cheapest policy that is not the default (the first listed on a tie)."""
    peers = [r for r in rows if not r.default]
    return min(peers, key=lambda r: r.cost) if peers else None


def median_or_none(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return round(statistics.median(known), 4) if known else None


def _idle_share(policy: PolicyResult) -> float | None:
    hours = policy.gpu_hours
    if not hours.cloud_paid or hours.cloud_idle is None:
        return None
    return round(hours.cloud_idle / hours.cloud_paid, 4)


def _row(
    policy: PolicyResult, default: bool, bound: LowerBoundResult | None, cpu_s: float
) -> SuiteRow:
    wait = policy.wait_s
    return SuiteRow(
        policy=policy.label,
        name=policy.policy,
        default=default,
        cost=policy.cost,
        wait_p50_s=wait.p50 if wait is not None else 0.0,
        wait_p95_s=wait.p95 if wait is not None else 0.0,
        gpu_hours_lost=policy.gpu_hours.lost,
        cloud_paid_gpu_hours=policy.gpu_hours.cloud_paid,
        cloud_idle_share=_idle_share(policy),
        instances_launched=policy.instances_launched,
        jobs_total=policy.jobs_total or 0,
        jobs_never_started=policy.jobs_never_started or 0,
        ratio_to_lower_bound=_ratio(policy.cost, bound.cost if bound is not None else None),
        ratio_to_best_peer=None,
        replay_wall_s=policy.replay_wall_s or 0.0,
        replay_cpu_s=round(cpu_s, 2),
    )


def scenario_result(
    loaded: LoadedScenario,
    prepared: Prepared,
    policies: Sequence[PolicyResult],
    bound: LowerBoundResult | None,
    default_policy: str,
    slack_s: float,
    prepare_s: float,
    cpu_s: Sequence[float] | None = None,
) -> ScenarioResult:
    """One scenario's rows, its best peer and how the default compares with it. ``cpu_s`` is
    each replay's CPU time, in the order of ``policies``."""
    titles = [p.label for p in policies]
    default = default_policy if default_policy in titles else (titles[0] if titles else None)
    cpu = list(cpu_s) if cpu_s is not None else [0.0] * len(policies)
    rows = [_row(p, p.label == default, bound, c) for p, c in zip(policies, cpu, strict=True)]
    peer = best_peer(rows)
    chosen = next((r for r in rows if r.default), None)
    if peer is not None:
        rows = [
            r.model_copy(update={"ratio_to_best_peer": _ratio(r.cost, peer.cost)}) for r in rows
        ]
    scenario = loaded.scenario
    selection = prepared.selection
    return ScenarioResult(
        scenario=scenario.name,
        source=loaded.source,
        description=scenario.description,
        days=round(selection.horizon_s / 86_400, 3),
        jobs=len(selection.jobs),
        onprem_gpus=sum(n.gpus * n.count for n in scenario.onprem),
        wait_target_s=scenario.wait_target_s,
        lower_bound=bound,
        default_policy=default,
        best_peer=peer.policy if peer is not None else None,
        peer_over_default=_ratio(peer.cost, chosen.cost)
        if peer is not None and chosen is not None
        else None,
        default_wait_p95_s=chosen.wait_p95_s if chosen is not None else None,
        peer_wait_p95_s=peer.wait_p95_s if peer is not None else None,
        peer_wait_within_slack=peer.wait_p95_s <= chosen.wait_p95_s + slack_s
        if peer is not None and chosen is not None
        else None,
        prepare_s=round(prepare_s, 2),
        rows=rows,
    )


def policy_medians(scenarios: Sequence[ScenarioResult]) -> list[PolicyMedians]:
    order: list[str] = []
    for result in scenarios:
        order.extend(r.policy for r in result.rows if r.policy not in order)
    medians = []
    for title in order:
        rows = [r for s in scenarios for r in s.rows if r.policy == title]
        cheapest = sum(
            1
            for s in scenarios
            if s.rows
            and any(r.policy == title for r in s.rows)
            and min(s.rows, key=lambda r: r.cost).policy == title
        )
        medians.append(
            PolicyMedians(
                policy=title,
                scenarios=len(rows),
                ratio_to_lower_bound=median_or_none([r.ratio_to_lower_bound for r in rows]),
                ratio_to_best_peer=median_or_none([r.ratio_to_best_peer for r in rows]),
                wait_p95_s=median_or_none([r.wait_p95_s for r in rows]),
                cloud_idle_share=median_or_none([r.cloud_idle_share for r in rows]),
                gpu_hours_lost=median_or_none([r.gpu_hours_lost for r in rows]),
                cheapest_in=cheapest,
            )
        )
    return medians


# ---------------------------------------------------------------- running it


def _bound_at_target(
    bounds: Sequence[LowerBoundResult], target_s: float
) -> LowerBoundResult | None:
    """The bound the suite judges by, without its accrual curve: the suite's tables use the
    total only, and a curve of up to 1,500 points per scenario would swell suite.json."""
    at = [b for b in bounds if b.max_wait_s == target_s]
    chosen = at[0] if at else (bounds[-1] if bounds else None)
    if chosen is None:
        return None
    return chosen.model_copy(update={"accrual_t_hours": [], "accrual_cost": []})


def run_suite(
    loaded: LoadedSuite,
    *,
    lower_bound: bool = True,
    progress: Callable[[str], None] | None = None,
    show_progress: bool = False,
) -> SuiteReport:
    """Replay every scenario with its policies; the suite's medians over the results.

    ``progress`` gets a line as each step ends; ``show_progress`` shows each step while it runs
    (a bar on a terminal, a line every ~10 s in a log: ``autoscaler.model.progress``)."""
    from autoscaler.sim.lowerbound import compute_lower_bounds

    say = progress or (lambda _line: None)
    started = time.perf_counter()
    suite = loaded.suite
    results: list[ScenarioResult] = []
    total = len(loaded.scenarios)
    for number, (scenario, specs) in enumerate(
        zip(loaded.scenarios, loaded.policies, strict=True), start=1
    ):
        name = scenario.scenario.name
        began = time.perf_counter()
        desc = f"[{number}/{total}] reading scenario {name}"
        with scenario.locating(), Progress(desc, enabled=show_progress):
            prepared = prepare(scenario)
        scenario.check_replay_length(prepared.horizon_s)
        prepare_s = time.perf_counter() - began
        say(
            f"[{number}/{total}] {name}: {len(prepared.selection.jobs):,} jobs over "
            f"{prepared.horizon_s / 86_400:.1f} days (prepared in {prepare_s:.1f} s)"
        )
        replays = []
        cpu_s = []
        hours = prepared.horizon_s / 3600
        for index, spec in specs:
            cpu = time.process_time()
            desc = f"[{number}/{total}] {name}: replay {spec.title}"
            with Progress(desc, hours, "h", enabled=show_progress) as bar:
                replay = simulate(prepared, spec, index, lambda t: bar.update_to(t / 3600))
            cpu_s.append(time.process_time() - cpu)
            replays.append(replay)
            say(f"    {spec.title}: replayed in {replay.wall_s:.1f} s ({cpu_s[-1]:.1f} s CPU)")
        bound = None
        if lower_bound and scenario.scenario.lower_bound.enabled:
            began = time.perf_counter()
            bound = _bound_at_target(
                compute_lower_bounds(
                    prepared,
                    progress=show_progress,
                    label=f"[{number}/{total}] {name}: lower bound",
                ),
                scenario.scenario.wait_target_s,
            )
            say(f"    lower bound: {time.perf_counter() - began:.1f} s")
        bounds = [bound] if bound is not None else []
        policies = [policy_result(r, prepared, bounds) for r in replays]
        results.append(
            scenario_result(
                scenario,
                prepared,
                policies,
                bound,
                suite.default_policy,
                suite.peer_wait_slack_s,
                prepare_s,
                cpu_s,
            )
        )
    titles: list[str] = []
    for specs in loaded.policies:
        titles.extend(s.title for _, s in specs if s.title not in titles)
    return SuiteReport(
        suite=suite.name,
        description=suite.description,
        source=loaded.source,
        default_policy=suite.default_policy,
        policies=titles,
        peer_wait_slack_s=suite.peer_wait_slack_s,
        lower_bound=lower_bound,
        scenarios=results,
        medians=policy_medians(results),
        median_peer_over_default=median_or_none([r.peer_over_default for r in results]),
        wall_s=round(time.perf_counter() - started, 2),
    )


# ---------------------------------------------------------------- the table


def _usd(value: float) -> str:
    return f"${value:,.0f}" if abs(value) >= 100 else f"${value:,.2f}"


def _x(value: float | None) -> str:
    return DASH if value is None else f"{value:.2f}x"


def _s(value: float | None) -> str:
    return DASH if value is None else f"{value:,.0f} s"


def _pct(value: float | None) -> str:
    return DASH if value is None else f"{value * 100:.0f} %"


def _num(value: float | None, digits: int = 1) -> str:
    return DASH if value is None else f"{value:,.{digits}f}"


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """A Markdown table; every column but the first is right-aligned (they are figures)."""
    cells = [list(header), *[list(r) for r in rows]]
    widths = [max(len(row[c]) for row in cells) for c in range(len(header))]

    def line(row: Sequence[str]) -> str:
        padded = [
            row[c].ljust(widths[c]) if c == 0 else row[c].rjust(widths[c]) for c in range(len(row))
        ]
        return "| " + " | ".join(padded) + " |"

    rule = (
        "|"
        + "|".join("-" * (w + 2) if c == 0 else "-" * (w + 1) + ":" for c, w in enumerate(widths))
        + "|"
    )
    return [line(cells[0]), rule, *(line(r) for r in cells[1:])]


def _scenario_heading(result: ScenarioResult) -> str:
    bound = result.lower_bound
    if bound is None:
        bound_text = "no lower bound"
    elif bound.cost is None:
        bound_text = f"lower bound unknown ({bound.status})"
    else:
        bound_text = f"lower bound {_usd(bound.cost)} at a {bound.max_wait_s:g} s wait"
    return (
        f"### {result.scenario}: {result.days:g} day{'' if result.days == 1 else 's'}, "
        f"{result.jobs:,} jobs, {result.onprem_gpus} on-prem GPUs; {bound_text}"
    )


def _peer_line(result: ScenarioResult) -> str:
    if result.best_peer is None or result.default_policy is None:
        return "No peer ran beside the default."
    costs = {r.policy: r.cost for r in result.rows}
    relative = (
        f"costing {_x(result.peer_over_default)} the default {result.default_policy}"
        if result.peer_over_default is not None
        else f"costing {_usd(costs[result.best_peer])} against the default "
        f"{result.default_policy}'s {_usd(costs[result.default_policy])}"
    )
    verdict = (
        "at a p95 wait within the slack of the default's"
        if result.peer_wait_within_slack
        else "but at a longer p95 wait than the default's (beyond the slack)"
    )
    return (
        f"Best peer: {result.best_peer}, {relative}, {verdict}: p95 wait "
        f"{_s(result.peer_wait_p95_s)} vs {_s(result.default_wait_p95_s)}."
    )


def render_markdown(report: SuiteReport, show_wall: bool = False) -> str:
    """The suite as Markdown: per-scenario tables, a summary, the medians. Deterministic unless
    ``show_wall`` (replay wall times) is asked for, so suite.md can be diffed between runs."""
    out = [f"# Evaluation suite: {report.suite}", ""]
    if report.description:
        out += [report.description.strip(), ""]
    policies = ", ".join(
        f"{p} (default)" if p == report.default_policy else p for p in report.policies
    )
    out += [
        f"Policies, with the same parameters in every scenario: {policies}.",
        "Best peer: the cheapest policy other than the default. x bound: cost / the offline "
        "lower bound at the scenario's wait target (docs/lower-bound.md). Cloud idle: paid cloud "
        "GPU-hours not allocated to a job / paid cloud GPU-hours.",
        "",
        "## Per scenario",
        "",
    ]
    header = [
        "policy",
        "cost",
        "p50 wait",
        "p95 wait",
        "GPU-h lost",
        "cloud idle",
        "launched",
        "never started",
        "x bound",
        "x best peer",
    ]
    if show_wall:
        header += ["replay s", "CPU s"]
    for result in report.scenarios:
        out += [_scenario_heading(result), ""]
        rows = []
        for r in result.rows:
            row = [
                f"{r.policy} (default)" if r.default else r.policy,
                _usd(r.cost),
                _s(r.wait_p50_s),
                _s(r.wait_p95_s),
                _num(r.gpu_hours_lost),
                _pct(r.cloud_idle_share),
                f"{r.instances_launched:,}",
                f"{r.jobs_never_started:,}",
                _x(r.ratio_to_lower_bound),
                _x(r.ratio_to_best_peer),
            ]
            if show_wall:
                row += [f"{r.replay_wall_s:.1f}", f"{r.replay_cpu_s:.1f}"]
            rows.append(row)
        out += [*_table(header, rows), "", _peer_line(result), ""]
    out += ["## Summary", ""]
    summary_rows = []
    for result in report.scenarios:
        chosen = next((r for r in result.rows if r.default), None)
        peer = next((r for r in result.rows if r.policy == result.best_peer), None)
        summary_rows.append(
            [
                result.scenario,
                _usd(chosen.cost) if chosen else DASH,
                result.best_peer or DASH,
                _usd(peer.cost) if peer else DASH,
                _x(result.peer_over_default),
                _s(result.default_wait_p95_s),
                _s(result.peer_wait_p95_s),
                _x(chosen.ratio_to_lower_bound) if chosen else DASH,
            ]
        )
    out += _table(
        [
            "scenario",
            "default cost",
            "best peer",
            "peer cost",
            "peer / default",
            "default p95",
            "peer p95",
            "default x bound",
        ],
        summary_rows,
    )
    count = len(report.scenarios)
    out += ["", f"## Medians over {count} scenario{'s' if count != 1 else ''}", ""]
    out += _table(
        ["policy", "x bound", "x best peer", "p95 wait", "cloud idle", "GPU-h lost", "cheapest in"],
        [
            [
                f"{m.policy} (default)" if m.policy == report.default_policy else m.policy,
                _x(m.ratio_to_lower_bound),
                _x(m.ratio_to_best_peer),
                _s(m.wait_p95_s),
                _pct(m.cloud_idle_share),
                _num(m.gpu_hours_lost),
                f"{m.cheapest_in} of {m.scenarios}",
            ]
            for m in report.medians
        ],
    )
    out += [
        "",
        f"Median over scenarios of best peer's cost / {report.default_policy}'s cost: "
        f"{_x(report.median_peer_over_default)} (above 1: the default is cheaper than the "
        "best peer).",
    ]
    if show_wall:
        out.append(f"Suite wall time: {report.wall_s:,.0f} s.")
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------- files and the command


def with_shown_paths(report: SuiteReport) -> SuiteReport:
    """The suite report with its paths as a reader can use them, never as absolute paths of
    this machine (``autoscaler.report.render_paths``): the suite file as typed (a shipped one
    from the package, another absolute one by its name), each scenario relative to the suite's
    folder, as the suite file names it (a shipped one from the package; one outside the
    folder by its name)."""
    folder = Path(os.path.abspath(report.source)).parent
    return report.model_copy(
        update={
            "source": shown_path(report.source),
            "scenarios": [
                s.model_copy(update={"source": shown_path(s.source, folder)})
                for s in report.scenarios
            ],
        }
    )


def write_suite(report: SuiteReport, out_dir: Path) -> list[Path]:
    """suite.json and suite.md, each renamed into place only once fully written, and only
    when every figure is a finite number. The paths written are shown as ``with_shown_paths``
    says; an error still names the suite file as the person typed it."""
    # report.write brings the HTML report's matplotlib: imported here, not with the module, so
    # that validate can read a suite file on an install without the report extra.
    from autoscaler.report.write import refuse_non_finite, write_files

    typed = report.source
    report = with_shown_paths(report)
    refuse_non_finite(report.model_dump(mode="python"), typed, "suite report")
    return write_files(
        out_dir,
        [
            ("suite.json", report.model_dump_json(indent=2) + "\n"),
            ("suite.md", render_markdown(report)),
        ],
    )


def run_suite_command(args: argparse.Namespace) -> int:
    """``gpu-autoscaler report --suite FILE``: the flags of a single report do not apply."""
    given = [
        flag
        for flag, value in (
            ("--scenario", args.scenario),
            ("--journal", args.journal),
            ("--journal-postgres-env", args.journal_postgres_env),
            ("--since", args.since),
            ("--until", args.until),
            ("--compare-scenario", args.compare_scenario),
        )
        if value
    ]
    if given:
        raise InputError("--suite", f"{', '.join(given)} cannot be combined with --suite")
    loaded = load_suite(args.suite, only_policies=args.policy)
    from autoscaler.report.write import check_out_dir

    check_out_dir(args.out)

    def progress(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    report = run_suite(
        loaded,
        lower_bound=not args.no_lower_bound,
        progress=None if args.no_progress else progress,
        show_progress=not args.no_progress,
    )
    written = write_suite(report, args.out)
    print(render_markdown(report))
    print("written: " + ", ".join(str(p) for p in written))
    return 0
