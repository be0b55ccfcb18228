"""``gpu-autoscaler validate --config FILE`` (or ``validate FILE``): a controller config, a
scenario or a suite, checked as the commands that read them check them. A controller config is
built as ``run`` builds it from the file (``run --dry-start`` answers the same)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from autoscaler.cli.base import Subcommands
from autoscaler.model.errors import InputError

if TYPE_CHECKING:
    from autoscaler.model import Pool
    from autoscaler.model.config import ControllerConfig


def add(commands: Subcommands) -> None:
    validate = commands.add_parser(
        "validate", help="check a controller config, a scenario or a suite file"
    )
    validate.add_argument(
        "file", type=Path, nargs="?", help="the file (or give it with --config, as run takes it)"
    )
    validate.add_argument("--config", type=Path, default=None, help="the file to check")
    validate.set_defaults(run=_validate)


def _file(args: argparse.Namespace) -> Path:
    """The one file to check, given positionally or with ``--config``."""
    if args.file is not None and args.config is not None and args.file != args.config:
        raise InputError(
            "validate", f"two files given ({args.file} and --config {args.config}): give one"
        )
    path: Path | None = args.config if args.config is not None else args.file
    if path is None:
        raise InputError("validate", "give the file to check: validate --config FILE")
    return path


def _validate(args: argparse.Namespace) -> int:
    """A scenario (it has a ``controller``) is checked as ``report`` reads it; a controller
    config is built as ``run`` and ``plan`` build it (``autoscaler.app.assembly.check_config``)."""
    from autoscaler.app.assembly import check_config
    from autoscaler.model.config import config_from_document
    from autoscaler.model.inputfile import read_yaml, relocate
    from autoscaler.spi.policy import load_policy

    file = _file(args)
    document = read_yaml(file)
    if isinstance(document.data, dict) and "scenarios" in document.data:
        return _validate_suite(file)
    if isinstance(document.data, dict) and "controller" in document.data:
        from autoscaler.sim.engine import prepare
        from autoscaler.sim.hostable import check_hostable
        from autoscaler.sim.scenario import load_scenario

        loaded = load_scenario(file)
        for index, spec in enumerate(loaded.scenario.policies):
            try:
                load_policy(
                    spec.name,
                    spec.params,
                    where=str(file),
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
        _warn_unknown_models(file, "controller.pools", scenario.controller.pools)
        unhostable = check_hostable(prepared)
        if unhostable.jobs:
            print(f"{file}: trace: {unhostable.describe()}", file=sys.stderr)
            return 2
        print(
            f"{file}: ok: scenario {scenario.name!r}, {len(prepared.selection.jobs)} jobs, "
            f"{len(scenario.controller.pools)} pools, {len(scenario.policies)} policies"
        )
        return 0
    config = config_from_document(document)
    check_config(config, where=str(file))
    return report_controller_config(file, config)


def report_controller_config(file: Path, config: ControllerConfig) -> int:
    """What ``validate`` and ``run --dry-start`` say of a controller config they built: its
    warnings on stderr, then one ok line."""
    _warn_unknown_models(file, "pools", config.pools)
    print(
        f"{file}: ok: fleet {config.fleet_id!r}, {len(config.pools)} pools, "
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
