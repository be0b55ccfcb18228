"""``gpu-autoscaler run``: the controller, live."""

from __future__ import annotations

import argparse
from pathlib import Path

from autoscaler.cli.base import Subcommands
from autoscaler.model.secrets import register_config_secrets


def add(commands: Subcommands) -> None:
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
