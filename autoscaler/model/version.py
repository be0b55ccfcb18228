"""``--version`` for both command lines: the installed distribution's version, read from its
metadata when asked (not at start, so ``--help`` and every command stay as quick as they were)."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

DISTRIBUTION = "hybrid-gpu-autoscaler"


def package_version() -> str:
    """The version pip installed; a source tree run without installing says so rather than
    guessing one."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(DISTRIBUTION)
    except PackageNotFoundError:
        return "unknown (not installed: pip install -e .)"


class VersionAction(argparse.Action):
    """Prints ``PROG VERSION`` and exits 0, like argparse's own ``version`` action, with the
    version looked up only when the option is given."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
        kwargs.setdefault("help", "print the version and exit")
        super().__init__(option_strings, dest=argparse.SUPPRESS, nargs=0, **kwargs)

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        print(f"{parser.prog} {package_version()}")
        parser.exit()
