"""How every command line of the project ends: a user's mistake is one line and exit 2, an
interrupt exit 130, anything else one line naming it a bug and exit 1 (``--debug`` shows the
traceback). Shared by ``gpu-autoscaler`` and ``gpu-autoscaler-agent`` so both say it alike."""

from __future__ import annotations

import sys
from collections.abc import Callable

from autoscaler.model.errors import InputError, describe
from autoscaler.model.secrets import scrub

EXIT_BAD_INPUT = 2
EXIT_INTERRUPTED = 130


def run_command(command: Callable[[], int], *, debug: bool = False) -> int:
    try:
        return int(command())
    except InputError as exc:
        # one line whatever the message carries (a value quoted from a file may hold newlines)
        print("error: " + " ".join(scrub(str(exc)).split()), file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as exc:
        if debug:
            raise
        print(
            f"error: {scrub(describe(exc))} (this is a bug; run with --debug for details)",
            file=sys.stderr,
        )
        return 1
