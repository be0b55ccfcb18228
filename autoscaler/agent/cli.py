"""``gpu-autoscaler agent``: its arguments and entry point (stdlib only at import time, so the
CLI starts fast and without the agent's optional packages)."""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Filled in by the agent work."""


def run(args: argparse.Namespace) -> int:
    raise NotImplementedError("the node agent is being built")
