"""``gpu-autoscaler agent``: the node agent, as its own ``gpu-autoscaler-agent`` runs it."""

from __future__ import annotations

import argparse

from autoscaler.cli.base import Subcommands


def add(commands: Subcommands) -> None:
    from node_agent.cli import add_arguments as add_agent_arguments

    agent = commands.add_parser(
        "agent",
        help="run the node agent: GPU metrics in dcgm-exporter's names, and the cloud's "
        "interruption notices forwarded to the controller",
    )
    add_agent_arguments(agent)
    agent.set_defaults(run=_agent)


def _agent(args: argparse.Namespace) -> int:
    from node_agent.cli import run

    return run(args)
