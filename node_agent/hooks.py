"""Tells the node's own workloads about a notice at once, without waiting for the controller:
a signal to the process named in a pid file (or its whole process group), and a hook command.

The controller decides checkpoints fleet-wide, but the node hears first and the window can be
30 s: a job that checkpoints on SIGUSR1 can start right away. The hook command gets the notice in
environment variables and is bounded by a timeout, so a stuck hook cannot hold the agent (or, on
Azure, the acknowledgement) past the deadline.
"""

from __future__ import annotations

import logging
import os
import shlex
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from autoscaler.model.errors import InputError
from node_agent.metadata import AgentNotice

log = logging.getLogger(__name__)
MAX_LOGGED_LINES = 20


def parse_signal(name: str) -> signal.Signals:
    """``USR1``, ``SIGUSR1`` or ``10``."""
    text = name.strip().upper()
    if text.isdigit():
        try:
            return signal.Signals(int(text))
        except ValueError:
            pass
    else:
        try:
            return signal.Signals[text if text.startswith("SIG") else "SIG" + text]
        except KeyError:
            pass
    raise InputError("--signal", f"{name!r} is not a signal name or number (e.g. USR1)")


def notice_environment(notice: AgentNotice) -> dict[str, str]:
    deadline = "" if notice.deadline is None else f"{notice.deadline:.0f}"
    seconds_left = (
        "" if notice.deadline is None else f"{max(0.0, notice.deadline - time.time()):.0f}"
    )
    return {
        "GPU_AUTOSCALER_NOTICE_KIND": notice.kind.value,
        "GPU_AUTOSCALER_NOTICE_DEADLINE": deadline,
        "GPU_AUTOSCALER_NOTICE_SECONDS_LEFT": seconds_left,
        "GPU_AUTOSCALER_NOTICE_INSTANCE_ID": notice.instance_id,
        "GPU_AUTOSCALER_NOTICE_SOURCE": notice.source,
    }


@dataclass(frozen=True)
class LocalHooks:
    command: str | None = None
    workload_signal: signal.Signals | None = None
    pid_file: Path | None = None
    process_group: bool = False
    timeout_s: float = 25.0

    def __post_init__(self) -> None:
        if self.workload_signal is not None and self.pid_file is None:
            raise InputError("--signal", "needs --signal-pid-file naming the process to signal")
        if self.command is not None:
            try:
                argv = shlex.split(self.command)
            except ValueError as exc:
                raise InputError("--hook-command", f"cannot split it into words ({exc})") from None
            if not argv:
                raise InputError("--hook-command", "is empty")

    def run(self, notice: AgentNotice) -> None:
        """Signal first (instant), then the command; failures are logged, never raised, since
        the notice must still reach the controller."""
        if self.workload_signal is not None:
            self._send_signal(self.workload_signal)
        if self.command is not None:
            self._run_command(self.command, notice)

    def _send_signal(self, sig: signal.Signals) -> None:
        assert self.pid_file is not None
        try:
            pid = int(self.pid_file.read_text().strip())
        except (OSError, ValueError) as exc:
            log.error("cannot signal the workload: %s does not hold a pid (%s)", self.pid_file, exc)
            return
        try:
            if self.process_group:
                os.killpg(os.getpgid(pid), sig)
            else:
                os.kill(pid, sig)
        except OSError as exc:
            log.error("cannot send %s to pid %d: %s", sig.name, pid, exc.strerror)
            return
        target = "the process group of pid" if self.process_group else "pid"
        log.info("sent %s to %s %d", sig.name, target, pid)

    def _run_command(self, command: str, notice: AgentNotice) -> None:
        started = time.monotonic()
        try:
            done = subprocess.run(
                shlex.split(command),
                env={**os.environ, **notice_environment(notice)},
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=self.timeout_s,
                check=False,
            )
        except subprocess.TimeoutExpired:
            log.error("the hook command did not finish within %g s and was killed", self.timeout_s)
            return
        except OSError as exc:
            log.error("cannot run the hook command: %s", exc)
            return
        for line in (done.stdout + done.stderr).splitlines()[:MAX_LOGGED_LINES]:
            log.info("hook: %s", line)
        took = time.monotonic() - started
        if done.returncode != 0:
            log.error("the hook command exited with status %d after %.1f s", done.returncode, took)
        else:
            log.info("the hook command finished in %.1f s", took)
