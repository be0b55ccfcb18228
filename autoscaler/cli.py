"""``gpu-autoscaler``: validate a config, list installed policies, run a dry-run cost report.

Bad input ends in one line on stderr that names the file, line or field, and exit status 2;
never a traceback (``--debug`` shows one for bugs).
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Sequence
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import BaseModel

from autoscaler.model import Pool
from autoscaler.model.errors import InputError
from autoscaler.model.exits import EXIT_BAD_INPUT, run_command
from autoscaler.model.secrets import register_config_secrets

if TYPE_CHECKING:
    from autoscaler.sim.scenario import LoadedScenario


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if not getattr(args, "command", None):
        parser.print_help()
        return EXIT_BAD_INPUT
    return run_command(lambda: int(args.run(args)), debug=args.debug)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gpu-autoscaler", description=__doc__.splitlines()[0])
    parser.add_argument("--debug", action="store_true", help="show tracebacks of unexpected errors")
    commands = parser.add_subparsers(dest="command")

    validate = commands.add_parser("validate", help="check a controller config or a scenario file")
    validate.add_argument("file", type=Path)
    validate.set_defaults(run=_validate)

    policies = commands.add_parser("policies", help="list the installed policies and their params")
    policies.set_defaults(run=_policies)

    run = commands.add_parser("run", help="run the controller")
    run.add_argument("--config", type=Path, required=True)
    run.add_argument("--ticks", type=int, default=None, help="stop after this many ticks")
    run.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    run.add_argument(
        "--log-format",
        default="json",
        choices=["json", "text"],
        help="one JSON event per line (default), or plain lines for a terminal",
    )
    run.set_defaults(run=_run)

    plan = commands.add_parser(
        "plan",
        help="read the real queue, telemetry and clouds and print what the controller would do "
        "now and what it would cost per hour, changing nothing",
    )
    plan.add_argument("--config", type=Path, required=True)
    plan.add_argument("--json", action="store_true", help="print the plan as JSON")
    plan.set_defaults(run=_plan)

    from node_agent.cli import add_arguments as add_agent_arguments

    agent = commands.add_parser(
        "agent",
        help="run the node agent: GPU metrics in dcgm-exporter's names, and the cloud's "
        "interruption notices forwarded to the controller",
    )
    add_agent_arguments(agent)
    agent.set_defaults(run=_agent)

    for name in ("report", "simulate"):
        report = commands.add_parser(
            name, help="replay a scenario through policies and write the dry-run cost report"
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
        report.add_argument("--no-progress", action="store_true", help="no progress bar")
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
        report.set_defaults(run=_report)
    return parser


def _validate(args: argparse.Namespace) -> int:
    """A scenario (it has a ``controller``) is checked as ``report`` reads it; a controller
    config is built as ``run`` and ``plan`` build it (``autoscaler.app.assembly.check_config``)."""
    from autoscaler.app.assembly import check_config
    from autoscaler.model.config import config_from_document
    from autoscaler.model.inputfile import read_yaml, relocate
    from autoscaler.spi.policy import load_policy

    document = read_yaml(args.file)
    if isinstance(document.data, dict) and "scenarios" in document.data:
        return _validate_suite(args.file)
    if isinstance(document.data, dict) and "controller" in document.data:
        from autoscaler.sim.engine import prepare
        from autoscaler.sim.hostable import check_hostable
        from autoscaler.sim.scenario import load_scenario

        loaded = load_scenario(args.file)
        for index, spec in enumerate(loaded.scenario.policies):
            try:
                load_policy(
                    spec.name,
                    spec.params,
                    where=str(args.file),
                    field_prefix=f"policies[{index}].params",
                )
            except InputError as exc:
                raise relocate(
                    exc, document, (("policy.name", ("policies", index, "name")),)
                ) from None
        with loaded.locating():
            prepared = prepare(loaded)
        loaded.check_replay_length(prepared.horizon_s)
        scenario = loaded.scenario
        _warn_unknown_models(args.file, "controller.pools", scenario.controller.pools)
        unhostable = check_hostable(prepared)
        if unhostable.jobs:
            print(f"{args.file}: trace: {unhostable.describe()}", file=sys.stderr)
            return 2
        print(
            f"{args.file}: ok: scenario {scenario.name!r}, {len(prepared.selection.jobs)} jobs, "
            f"{len(scenario.controller.pools)} pools, {len(scenario.policies)} policies"
        )
        return 0
    config = config_from_document(document)
    check_config(config, where=str(args.file))
    _warn_unknown_models(args.file, "pools", config.pools)
    print(
        f"{args.file}: ok: fleet {config.fleet_id!r}, {len(config.pools)} pools, "
        f"policy {config.policy.name!r}"
    )
    return 0


def _validate_suite(path: Path) -> int:
    """A suite file (it lists ``scenarios``): every scenario and policy checked as
    ``report --suite`` reads them, each trace read to bound its replay and find jobs that no
    pool could ever host, before hours of replays would find them."""
    from autoscaler.report.suite import load_suite
    from autoscaler.sim.engine import prepare
    from autoscaler.sim.hostable import check_hostable

    loaded = load_suite(path)
    jobs = 0
    for scenario in loaded.scenarios:
        with scenario.locating():
            prepared = prepare(scenario)
        scenario.check_replay_length(prepared.horizon_s)
        _warn_unknown_models(
            Path(scenario.source), "controller.pools", scenario.scenario.controller.pools
        )
        unhostable = check_hostable(prepared)
        if unhostable.jobs:
            print(f"{scenario.source}: trace: {unhostable.describe()}", file=sys.stderr)
            return 2
        jobs += len(prepared.selection.jobs)
    policies = {spec.title for specs in loaded.policies for _, spec in specs}
    print(
        f"{path}: ok: suite {loaded.suite.name!r}, {len(loaded.scenarios)} scenarios, "
        f"{jobs:,} jobs, {len(policies)} policies"
    )
    return 0


def _warn_unknown_models(file: Path, field: str, pools: Sequence[Pool]) -> None:
    """A pool whose GPU model neither its config nor the shipped catalog of its cloud gives:
    it can still host jobs that accept any GPU, never one that asks for a model, so say so."""
    for index, pool in enumerate(pools):
        if pool.gpu_model is None:
            print(
                f"{file}: {field}[{index}] ({pool.name}): warning: GPU model unknown "
                f"({pool.instance_type} is not in the shipped {pool.provider} catalog and "
                "gpu_model is not set): jobs that ask for a GPU model are never placed "
                "there; set gpu_model",
                file=sys.stderr,
            )


def _run(args: argparse.Namespace) -> int:
    from autoscaler.app.assembly import (
        Mode,
        Parts,
        build_controller,
        build_inbox,
        build_journal,
        build_lock,
        build_providers,
        build_signals,
        check_listen,
        load_configured_policy,
        read_postgres_dsn,
    )
    from autoscaler.app.runner import Background, Runner
    from autoscaler.model.clock import SystemClock
    from autoscaler.model.config import load_config
    from autoscaler.model.logs import configure
    from autoscaler.ops.health import Readiness, StatusServer
    from autoscaler.ops.metrics import Metrics

    configure(args.log_level, json_lines=args.log_format == "json")
    where = str(args.config)
    config = load_config(args.config)
    register_config_secrets(config, where)
    clock = SystemClock()
    policy = load_configured_policy(config, where)
    dsn = read_postgres_dsn(config, where)
    providers = build_providers(config, where=where)
    wiring = build_signals(config, where=where)
    background: list[Background] = []
    inbox = build_inbox(config, clock, where=where)
    if inbox is not None:
        wiring.signals.notices = (*wiring.signals.notices, inbox.inbox)
        background.append(inbox)
    metrics = Metrics()
    readiness = Readiness(config.tick_seconds)
    if config.metrics is not None:
        listen = config.metrics.listen
        check_listen(config, "metrics.listen", listen.host, listen.port, where)
        background.append(StatusServer(metrics.registry, readiness, listen.host, listen.port))
    journal = build_journal(config, dsn, where)
    lock = build_lock(config, dsn)
    parts = Parts(
        providers,
        wiring.signals,
        wiring.scheduler,
        checkpoints=inbox.checkpoints if inbox is not None else None,
        journal=journal,
        metrics=metrics,
        fence=lock.check,
    )
    controller = build_controller(config, Mode.LIVE, policy, clock, parts).controller
    try:
        return Runner(controller, providers, background, lock, readiness).run(max_ticks=args.ticks)
    finally:
        if journal is not None:
            journal.close()


def _plan(args: argparse.Namespace) -> int:
    from autoscaler.app.planmode import run

    return run(args)


def _agent(args: argparse.Namespace) -> int:
    from node_agent.cli import run

    return run(args)


def _policies(args: argparse.Namespace) -> int:
    from autoscaler.spi.policy import POLICY_GROUP, describe_installed, policy_class

    for entry in describe_installed(POLICY_GROUP):
        try:
            cls = policy_class(entry.name)
        except InputError as exc:
            print(f"{entry.name}  (broken: {exc.message})")
            continue
        summary = (cls.__doc__ or "").strip().splitlines()[0] if cls.__doc__ else ""
        source = entry.distribution or "?"
        print(f"{entry.name}  [{source}: {entry.value}]  {summary}")
        for line in _param_lines(cls.Params):
            print("    " + line)
    return 0


def _param_lines(model: type[BaseModel], prefix: str = "") -> list[str]:
    """One line per parameter, nested models flattened to dotted names as a config writes them."""
    lines = []
    for name, field in model.model_fields.items():
        default = field.get_default(call_default_factory=True)
        if isinstance(default, BaseModel):
            lines.extend(_param_lines(type(default), f"{prefix}{name}."))
            continue
        shown = default.value if isinstance(default, Enum) else default
        about = f"  {field.description}" if field.description else ""
        lines.append(f"{prefix}{name} = {shown!r}{about}")
    return lines


def _report(args: argparse.Namespace) -> int:
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
        )
    if args.since or args.until or args.compare_scenario:
        raise InputError(
            "report", "--since, --until and --compare-scenario go with a journal (--journal)"
        )
    from autoscaler.sim.scenario import default_scenario_path, load_scenario

    loaded = load_scenario(args.scenario or default_scenario_path())
    with loaded.locating():
        return _replay_report(args, loaded)


def _replay_report(args: argparse.Namespace, loaded: LoadedScenario) -> int:
    from tqdm import tqdm

    from autoscaler.report.build import DEFAULT_POLICY, build_report
    from autoscaler.report.render import summary_markdown
    from autoscaler.report.write import write_report
    from autoscaler.sim.engine import prepare, simulate
    from autoscaler.sim.hostable import check_hostable
    from autoscaler.sim.lowerbound import compute_lower_bounds

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
    prepared = prepare(loaded)
    loaded.check_replay_length(prepared.horizon_s)
    unhostable = check_hostable(prepared)
    if unhostable.jobs:
        print(
            f"{loaded.source}: note: {unhostable.describe()}. They stay pending in every "
            "replay and the lower bound leaves them out.",
            file=sys.stderr,
        )
    results = []
    for index, spec in specs:
        with tqdm(
            total=round(prepared.horizon_s / 3600),
            unit="h",
            desc=f"replay {spec.title}",
            disable=True if args.no_progress else None,
            leave=False,
        ) as bar:

            def progress(t: float, bar: tqdm = bar) -> None:  # type: ignore[type-arg]
                bar.update(round(t / 3600) - bar.n)

            results.append(simulate(prepared, spec, index, progress))
    flipped = None
    compared = next(
        ((i, s) for i, s in specs if s.name == DEFAULT_POLICY), specs[0] if specs else None
    )
    if compared is not None and not args.no_checkpoint_comparison:
        index, spec = compared
        flipped = simulate(
            prepared,
            spec,
            index,
            checkpoint_aware=not scenario.controller.interruptions.checkpoint_aware,
        )
    bounds = (
        []
        if args.no_lower_bound or not scenario.lower_bound.enabled
        else compute_lower_bounds(prepared)
    )
    report = build_report(prepared, results, bounds, flipped)
    where = _non_finite(report.model_dump())
    if where is not None:  # validated inputs never lead here: a bug, and no report is written
        raise ArithmeticError(f"the report's figure {where} is not a finite number")
    written = write_report(report, args.out)
    print(summary_markdown(report))
    print("\nwritten: " + ", ".join(str(p) for p in written))
    return 0


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


if __name__ == "__main__":
    sys.exit(main())
