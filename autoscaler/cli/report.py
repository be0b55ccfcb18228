"""``gpu-autoscaler report`` (and its older name ``simulate``): the dry-run cost report from a
scenario, a suite or a journal."""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from autoscaler.cli.base import Subcommands
from autoscaler.model.errors import InputError

if TYPE_CHECKING:
    from autoscaler.sim.scenario import LoadedScenario


ALIAS_NOTE = (
    "simulate is the same command under its older name, kept as an alias so scripts that call "
    "it keep working; new scripts use report."
)


def add(commands: Subcommands) -> None:
    report = commands.add_parser(
        "report",
        aliases=["simulate"],
        help="replay a scenario through policies and write the dry-run cost report "
        "(simulate: its older name, the same command)",
        description="Replay a scenario (or a suite, or report a journal's real spend) and write "
        f"the dry-run cost report. {ALIAS_NOTE}",
    )
    report.add_argument(
        "--scenario",
        type=Path,
        default=None,
        help="scenario file (default: the shipped Alibaba openb scenario)",
    )
    report.add_argument(
        "--out",
        type=Path,
        default=Path("report"),
        help="folder for report.json, report.md and report.html",
    )
    report.add_argument(
        "--policy",
        action="append",
        default=None,
        help="compare only these policies from the scenario (repeatable)",
    )
    report.add_argument(
        "--suite",
        type=Path,
        default=None,
        metavar="FILE",
        help="replay every scenario of this suite file with the same policies and write "
        "suite.json and suite.md (see docs/evaluation.md)",
    )
    report.add_argument("--no-lower-bound", action="store_true", help="skip the offline bound")
    report.add_argument(
        "--no-checkpoint-comparison",
        action="store_true",
        help="skip replaying the default policy with checkpoint awareness flipped",
    )
    report.add_argument(
        "--no-progress",
        action="store_true",
        help="no progress: by default a bar on a terminal, else one line on stderr every "
        "GPU_AUTOSCALER_PROGRESS_INTERVAL_S seconds (default 10) and one as each step ends",
    )
    report.add_argument(
        "--journal",
        type=Path,
        default=None,
        metavar="FILE",
        help="report real spend from this SQLite journal instead of replaying a scenario",
    )
    report.add_argument(
        "--journal-postgres-env",
        default=None,
        metavar="VAR",
        help="report real spend from the PostgreSQL journal whose DSN this variable holds",
    )
    report.add_argument("--since", default=None, help="journal period start (ISO, UTC)")
    report.add_argument("--until", default=None, help="journal period end (ISO, UTC)")
    report.add_argument(
        "--compare-scenario",
        type=Path,
        default=None,
        metavar="FILE",
        help="with --journal: put this scenario's replay of the policy beside the real spend",
    )
    report.add_argument(
        "--config",
        type=Path,
        default=None,
        metavar="FILE",
        help="with --journal: the controller's config, to set each team's quota use beside its "
        "guarantee (the journal does not hold the config)",
    )
    report.set_defaults(run=_report)


def _report(args: argparse.Namespace) -> int:
    from autoscaler.model.extras import require_report_extra

    require_report_extra("gpu-autoscaler report")
    if args.suite is not None:
        from autoscaler.report.suite import run_suite_command

        return run_suite_command(args)
    if args.journal is not None or args.journal_postgres_env is not None:
        from autoscaler.report.journal import run_journal_report

        policies = args.policy or []
        if len(policies) > 1:
            raise InputError("--policy", "name one policy to compare a journal with")
        return run_journal_report(
            args.journal,
            args.journal_postgres_env,
            args.since,
            args.until,
            args.out,
            args.compare_scenario,
            policies[0] if policies else None,
            show_progress=not args.no_progress,
            config_path=args.config,
        )
    if args.since or args.until or args.compare_scenario or args.config:
        raise InputError(
            "report",
            "--since, --until, --compare-scenario and --config go with a journal (--journal)",
        )
    from autoscaler.sim.scenario import default_scenario_path, load_scenario

    loaded = load_scenario(args.scenario or default_scenario_path())
    with loaded.locating():
        return _replay_report(args, loaded)


def _replay_report(args: argparse.Namespace, loaded: LoadedScenario) -> int:
    from autoscaler.model.progress import Progress
    from autoscaler.report.build import DEFAULT_POLICY, build_report
    from autoscaler.report.render import summary_markdown
    from autoscaler.report.write import write_report
    from autoscaler.sim.engine import Prepared, SimResult, prepare, simulate
    from autoscaler.sim.hostable import check_hostable
    from autoscaler.sim.lowerbound import compute_lower_bounds
    from autoscaler.sim.static_pools import TeamReplay, replay_static_pools

    scenario = loaded.scenario
    specs = list(enumerate(scenario.policies))
    if args.policy:
        wanted = set(args.policy)
        unknown = (
            wanted - {s.name for s in scenario.policies} - {s.title for s in scenario.policies}
        )
        if unknown:
            raise InputError(
                loaded.source,
                f"--policy {', '.join(sorted(unknown))} is not among the "
                "scenario's policies: " + ", ".join(s.title for s in scenario.policies),
                field="policies",
            )
        specs = [(i, s) for i, s in specs if s.name in wanted or s.title in wanted]
    show = not args.no_progress
    with Progress(f"reading scenario {loaded.scenario.name}", enabled=show):
        prepared = prepare(loaded)
    loaded.check_replay_length(prepared.horizon_s)
    unhostable = check_hostable(prepared)
    if unhostable.jobs:
        print(
            f"{note_source(loaded.source, args.scenario)}: note: {unhostable.describe()}. "
            "They stay pending in every replay and the lower bound leaves them out.",
            file=sys.stderr,
        )
    compared = next(
        ((i, s) for i, s in specs if s.name == DEFAULT_POLICY), specs[0] if specs else None
    )
    compare = compared is not None and not args.no_checkpoint_comparison
    bound = not args.no_lower_bound and scenario.lower_bound.enabled
    steps = len(specs) + compare + bound  # numbered, so a log says how much is left
    hours = prepared.horizon_s / 3600
    results = []
    for step, (index, spec) in enumerate(specs, start=1):
        desc = f"[{step}/{steps}] replay {spec.title}"
        with Progress(desc, hours, "h", enabled=show) as bar:
            results.append(simulate(prepared, spec, index, lambda t: bar.update_to(t / 3600)))
    flipped = None
    if compared is not None and compare:
        index, spec = compared
        aware = not scenario.controller.interruptions.checkpoint_aware
        desc = (
            f"[{len(specs) + 1}/{steps}] replay {spec.title} "
            f"{'with' if aware else 'without'} checkpoint awareness"
        )
        with Progress(desc, hours, "h", enabled=show) as bar:
            flipped = simulate(
                prepared,
                spec,
                index,
                lambda t: bar.update_to(t / 3600),
                checkpoint_aware=aware,
            )
    bounds = (
        compute_lower_bounds(prepared, progress=show, label=f"[{steps}/{steps}] lower bound")
        if bound
        else []
    )
    static: list[TeamReplay] = []
    if compared is not None and scenario.teams is not None:
        index, spec = compared

        def alone(team_prepared: Prepared) -> SimResult:
            return simulate(team_prepared, spec, index)

        with Progress(f"replay {spec.title} on static per-team pools", enabled=show):
            static = replay_static_pools(prepared, alone)
    report = build_report(prepared, results, bounds, flipped, static)
    where = _non_finite(report.model_dump())
    if where is not None:  # validated inputs never lead here: a bug, and no report is written
        raise ArithmeticError(f"the report's figure {where} is not a finite number")
    written = write_report(report, args.out)
    print(summary_markdown(report))
    print("\nwritten: " + ", ".join(str(p) for p in written))
    return 0


def note_source(source: str, typed: Path | None) -> str:
    """The scenario as a note on stderr names it: the shipped default by its place in the package
    (``autoscaler/data/scenarios/...``), not this machine's site-packages; a person's own file
    as they typed it, so that they can open it."""
    if typed is not None:
        return source
    from autoscaler.report.render_paths import shown_path

    return shown_path(source)


def _non_finite(value: object, at: str = "") -> str | None:
    """Where the first NaN or infinite figure of a dumped report is, or None."""
    if isinstance(value, float) and not math.isfinite(value):
        return at or "(top level)"
    if isinstance(value, dict):
        items: list[tuple[str, object]] = [
            (f"{at}.{k}" if at else str(k), v) for k, v in value.items()
        ]
    elif isinstance(value, (list, tuple)):
        items = [(f"{at}[{i}]", v) for i, v in enumerate(value)]
    else:
        return None
    for where, inner in items:
        found = _non_finite(inner, where)
        if found is not None:
            return found
    return None
