"""``gpu-autoscaler policies``: the installed policies and their params."""

from __future__ import annotations

import argparse
from enum import Enum

from pydantic import BaseModel

from autoscaler.cli.base import Subcommands
from autoscaler.model.errors import InputError


def add(commands: Subcommands) -> None:
    policies = commands.add_parser("policies", help="list the installed policies and their params")
    policies.set_defaults(run=_policies)


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
