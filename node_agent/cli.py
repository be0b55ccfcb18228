"""The node agent's command line: ``gpu-autoscaler-agent`` (this module's ``main``) and
``gpu-autoscaler agent`` (the controller's CLI borrows ``add_arguments`` and ``run``) take the
same arguments and behave the same. Stdlib only at import time, so the CLI starts fast and
without the agent's optional packages.

Bad input ends in one line on stderr and exit status 2, never a traceback (``--debug`` shows one
for bugs), as in the controller's CLI.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

URL_SHORTHANDS = ("aws", "gcp", "azure")
"""The built-in watchers' ``--<name>-metadata-url``: shorthands for ``--metadata-url NAME=URL``."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--listen",
        default="0.0.0.0:9400",
        metavar="HOST:PORT",
        help="where /metrics is served (default 0.0.0.0:9400, dcgm-exporter's port; 0 = any)",
    )
    parser.add_argument(
        "--hostname",
        default=None,
        help="the node's name as the scheduler knows it (default: the cloud's instance id or "
        "name from metadata, else this machine's hostname)",
    )
    parser.add_argument(
        "--cloud",
        default="auto",
        metavar="auto|none|NAME",
        help="which cloud's interruption notices to watch: an installed metadata watcher's name "
        "(aws, gcp, azure built in), none, or auto (default: probe every installed watcher's "
        "metadata server)",
    )
    parser.add_argument(
        "--controller-url",
        default=None,
        help="the controller's notice inbox, e.g. https://controller:9401 (default: notices "
        "only run the local hooks)",
    )
    token = parser.add_mutually_exclusive_group()
    token.add_argument("--token-file", type=Path, default=None, help="file holding the token")
    token.add_argument(
        "--token-env",
        default="GPU_AUTOSCALER_TOKEN",
        help="environment variable holding the token (default GPU_AUTOSCALER_TOKEN)",
    )
    parser.add_argument(
        "--ca-file", type=Path, default=None, help="CA bundle for an https controller URL"
    )
    parser.add_argument(
        "--hook-command",
        default=None,
        help="command run on each notice, with GPU_AUTOSCALER_NOTICE_{KIND,DEADLINE,"
        "SECONDS_LEFT,INSTANCE_ID,SOURCE} in its environment",
    )
    parser.add_argument(
        "--hook-timeout", type=float, default=25.0, help="seconds before the hook is killed"
    )
    parser.add_argument("--signal", default=None, help="signal sent on each notice, e.g. USR1")
    parser.add_argument(
        "--signal-pid-file", type=Path, default=None, help="file holding the pid to signal"
    )
    parser.add_argument(
        "--signal-process-group",
        action="store_true",
        help="signal the whole process group of that pid",
    )
    parser.add_argument(
        "--azure-ack",
        default="after-hooks",
        choices=["after-hooks", "never"],
        help="acknowledge a Preempt event once the notice was delivered and the hook returned "
        "(default), or never (Azure then goes ahead at NotBefore)",
    )
    parser.add_argument(
        "--metadata-url",
        action="append",
        default=None,
        metavar="NAME=URL",
        help="a watcher's metadata base URL, e.g. aws=http://127.0.0.1:8111 (repeatable; "
        "default: each watcher's own, the cloud's link-local address)",
    )
    for cloud in URL_SHORTHANDS:
        parser.add_argument(
            f"--{cloud}-metadata-url",
            default=None,
            metavar="URL",
            help=f"the same as --metadata-url {cloud}=URL",
        )
    parser.add_argument(
        "--aws-poll-seconds", type=float, default=5.0, help="IMDS poll period (AWS suggests 5)"
    )
    parser.add_argument(
        "--azure-poll-seconds", type=float, default=1.0, help="Scheduled Events poll period"
    )
    parser.add_argument(
        "--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"]
    )
    parser.add_argument(
        "--log-format",
        default="text",
        choices=["json", "text"],
        help="plain lines (default, for journald and a terminal), or one JSON event per line "
        "in the controller's shape, for a log collector",
    )


def run(args: argparse.Namespace) -> int:
    from node_agent.main import options_from_arguments, run_agent

    return run_agent(options_from_arguments(args))


def main(argv: Sequence[str] | None = None) -> int:
    """``gpu-autoscaler-agent``: the agent alone, for a node that runs nothing else of ours."""
    parser = argparse.ArgumentParser(
        prog="gpu-autoscaler-agent",
        description="The node agent: GPU metrics in dcgm-exporter's names, and the cloud's "
        "interruption notices read on the node, forwarded to the controller.",
    )
    parser.add_argument("--debug", action="store_true", help="show tracebacks of unexpected errors")
    from autoscaler.model.version import VersionAction

    parser.add_argument("--version", action=VersionAction)
    add_arguments(parser)
    args = parser.parse_args(argv)
    from autoscaler.model.exits import run_command

    return run_command(lambda: run(args), debug=args.debug)
