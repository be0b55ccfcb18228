"""``gpu-autoscaler plan``: one real tick that records instead of acting."""

from __future__ import annotations

import argparse
from pathlib import Path

from autoscaler.cli.base import Subcommands


def add(commands: Subcommands) -> None:
    plan = commands.add_parser(
        "plan",
        help="read the real queue, telemetry and clouds and print what the controller would do "
        "now and what it would cost per hour, changing nothing",
    )
    plan.add_argument("--config", type=Path, required=True)
    plan.add_argument("--json", action="store_true", help="print the plan as JSON")
    plan.set_defaults(run=_plan)


def _plan(args: argparse.Namespace) -> int:
    from autoscaler.app.planmode import run

    return run(args)
