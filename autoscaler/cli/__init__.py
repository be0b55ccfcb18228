"""``gpu-autoscaler``: run, plan and check a hybrid GPU fleet, and report what it would cost.

Commands: validate a config, export its JSON Schema, list installed policies, run the
controller, plan, run the node agent, write a dry-run cost report, sweep a grid of them, import a
trace, print shell completion.

Bad input ends in one line on stderr that names the file, line or field, and exit status 2;
never a traceback (``--debug`` shows one for bugs). Each command is its own module here, with an
``add(commands)`` that declares its arguments and the function that runs it.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from autoscaler.cli import (
    agent,
    completion,
    plan,
    policies,
    report,
    run,
    schema,
    sweep,
    trace,
    validate,
)
from autoscaler.model.exits import EXIT_BAD_INPUT, run_command
from autoscaler.model.version import VersionAction

COMMANDS = (validate, schema, policies, run, plan, agent, report, sweep, trace, completion)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "command", None):
        parser.print_help()
        return EXIT_BAD_INPUT
    return run_command(lambda: int(args.run(args)), debug=args.debug)


def build_parser() -> argparse.ArgumentParser:
    """Every command's arguments (also what `completion` turns into a shell script)."""
    parser = argparse.ArgumentParser(
        prog="gpu-autoscaler", description=(__doc__ or "").splitlines()[0].replace("``", "")
    )
    parser.add_argument("--debug", action="store_true", help="show tracebacks of unexpected errors")
    parser.add_argument("--version", action=VersionAction)
    commands = parser.add_subparsers(dest="command")
    for command in COMMANDS:
        command.add(commands)
    return parser


if __name__ == "__main__":
    sys.exit(main())
