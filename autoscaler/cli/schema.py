"""``gpu-autoscaler schema``: the controller config's JSON Schema, for editors.

Every installed provider's settings and pool options, every source kind's settings and every
policy's params are in it as their own sub-schemas (``autoscaler.app.schema``), so an editor
running yaml-language-server completes and checks them; see docs/configuration.md.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from autoscaler.cli.base import Subcommands
from autoscaler.model.errors import InputError


def add(commands: Subcommands) -> None:
    schema = commands.add_parser(
        "schema",
        help="print the controller config's JSON Schema (with the installed plugins' settings), "
        "for an editor's YAML language server",
    )
    schema.add_argument(
        "--out", type=Path, default=None, help="write the schema to this file (default: stdout)"
    )
    schema.set_defaults(run=_schema)


def _schema(args: argparse.Namespace) -> int:
    from autoscaler.app.schema import config_schema

    text = json.dumps(config_schema(), indent=2, ensure_ascii=False) + "\n"
    if args.out is None:
        sys.stdout.write(text)
        return 0
    try:
        args.out.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise InputError(str(args.out), f"cannot write the schema: {exc.strerror}") from None
    print(f"{args.out}: the controller config's JSON Schema", file=sys.stderr)
    return 0
