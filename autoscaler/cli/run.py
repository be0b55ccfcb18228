"""``gpu-autoscaler run``: the controller, live; ``run --dry-start`` builds what the config file
decides as ``run`` does and stops before reading anything outside the file."""

from __future__ import annotations

import argparse
from pathlib import Path

from autoscaler.cli.base import Subcommands


def add(commands: Subcommands) -> None:
    run = commands.add_parser("run", help="run the controller")
    run.add_argument("--config", type=Path, required=True)
    run.add_argument("--ticks", type=int, default=None, help="stop after this many ticks")
    run.add_argument(
        "--dry-start",
        action="store_true",
        help="build the policy, sources, providers and controller from the config as run does, "
        "contacting nothing, then stop: exit 0, or exit 2 with the error validate gives",
    )
    run.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    run.add_argument(
        "--log-format",
        default="json",
        choices=["json", "text"],
        help="one JSON event per line (default), or plain lines for a terminal",
    )
    run.set_defaults(run=_run)


def _run(args: argparse.Namespace) -> int:
    """The file's parts first (``build_file_parts``, what ``validate`` checks), then what lives
    outside the file: the journal's DSN and the inbox's token from the environment, the ports,
    the journal and the leader lock. With ``--dry-start`` the first step (and the controller
    over it) is all there is, and it answers as ``validate`` answers."""
    from autoscaler.app.assembly import (
        Mode,
        build_controller,
        build_file_parts,
        build_inbox,
        build_journal,
        build_lock,
        check_config,
        check_listen,
        read_postgres_dsn,
    )
    from autoscaler.app.runner import Background, Runner
    from autoscaler.cli.validate import report_controller_config
    from autoscaler.model.clock import SystemClock
    from autoscaler.model.config import load_config
    from autoscaler.model.logs import configure
    from autoscaler.ops.health import Readiness, StatusServer
    from autoscaler.ops.metrics import Metrics

    configure(args.log_level, json_lines=args.log_format == "json")
    where = str(args.config)
    config = load_config(args.config)
    if args.dry_start:
        check_config(config, where)
        return report_controller_config(args.config, config)
    parts = build_file_parts(config, where)
    journal = None
    try:
        clock = SystemClock()
        dsn = read_postgres_dsn(config, where)
        wiring = parts.wiring
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
        plugged = parts.plugged()
        plugged.checkpoints = inbox.checkpoints if inbox is not None else None
        plugged.journal, plugged.metrics, plugged.fence = journal, metrics, lock.check
        controller = build_controller(config, Mode.LIVE, parts.policy, clock, plugged).controller
    except BaseException:
        parts.close(quiet=True)
        if journal is not None:
            journal.close()
        raise
    try:
        runner = Runner(controller, parts.providers, background, lock, readiness)
        return runner.run(max_ticks=args.ticks)
    finally:
        if journal is not None:
            journal.close()
