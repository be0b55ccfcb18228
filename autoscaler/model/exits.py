"""How every command line of the project ends: a user's mistake is one line and exit 2, an
interrupt exit 130, anything else one line naming it a bug and exit 1 (``--debug`` shows the
traceback). Shared by ``gpu-autoscaler`` and ``gpu-autoscaler-agent`` so both say it alike.

Two endings are a person's doing without being an ``InputError``: a package of an extra this
install lacks (one line naming the extra, exit 2: ``autoscaler.model.optional``), and output piped
into a reader that stopped early (``| head``): that is no error at all, so it ends quietly, with
the status a shell gives a program SIGPIPE ended (141), as ``yes | head`` does.
"""

from __future__ import annotations

import os
import select
import signal
import sys
from collections.abc import Callable

from autoscaler.model.errors import InputError, describe
from autoscaler.model.optional import missing_extra_message
from autoscaler.model.secrets import scrub

EXIT_BAD_INPUT = 2
EXIT_INTERRUPTED = 130
EXIT_BROKEN_PIPE = 128 + int(signal.SIGPIPE)


def run_command(command: Callable[[], int], *, debug: bool = False) -> int:
    try:
        code = int(command())
        # what is still buffered goes now, so a reader that left is seen here, not at exit
        sys.stdout.flush()
        return code
    except InputError as exc:
        return _one_line(str(exc), EXIT_BAD_INPUT)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        if not _stdout_reader_gone():
            if debug:
                raise
            return _bug(sys.exc_info()[1])
        _silence_stdout()
        return EXIT_BROKEN_PIPE
    except ModuleNotFoundError as exc:
        message = missing_extra_message(exc)
        if message is None:
            if debug:
                raise
            return _bug(exc)
        return _one_line(message, EXIT_BAD_INPUT)
    except Exception as exc:
        if debug:
            raise
        return _bug(exc)


def _one_line(message: str, code: int) -> int:
    # one line whatever the message carries (a value quoted from a file may hold newlines)
    print("error: " + " ".join(scrub(message).split()), file=sys.stderr)
    return code


def _bug(exc: BaseException | None) -> int:
    print(
        f"error: {scrub(describe(exc))} (this is a bug; run with --debug for details)",
        file=sys.stderr,
    )
    return 1


def _stdout_reader_gone() -> bool:
    """Whether the broken pipe is standard output's (its reader closed it), rather than a socket
    or a child's pipe of the command's own, which would be a bug to report. A pipe whose reader
    is gone polls as an error; where poll cannot say, the broken pipe is taken to be stdout's."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):
        return False
    if not hasattr(select, "poll"):
        return True
    poller = select.poll()
    poller.register(fd, 0)
    try:
        return any(events & select.POLLERR for _, events in poller.poll(0))
    except OSError:
        return True


def _silence_stdout() -> None:
    """Point stdout at /dev/null, so the interpreter's flush at exit has nowhere left to fail
    (Python's documented way of ending after a broken pipe)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (AttributeError, OSError, ValueError):
        pass
