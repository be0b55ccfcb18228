"""What every command module shares."""

from __future__ import annotations

import argparse
from typing import TypeAlias

Subcommands: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"
