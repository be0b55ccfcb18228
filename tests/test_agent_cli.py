"""``gpu-autoscaler agent`` as ops run it: a real process against a fake IMDS and a real
controller inbox; bad arguments end in one line and exit status 2."""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from metadata_servers import ControllerInbox, FakeImds
from waits import bound

from autoscaler.cli import main
from autoscaler.model import NoticeKind

ROOT = Path(__file__).resolve().parent.parent
GPU_HERE = Path("/dev/nvidiactl").exists()
"""CI has no GPU, where the agent must serve ``gpu_autoscaler_agent_nvml_up 0``; on a GPU machine
it serves 1."""


class AgentProcess:
    """The agent's stderr is read on a thread, so a test can wait for a line without blocking."""

    def __init__(
        self, args: list[str], env: dict[str, str], command: list[str] | None = None
    ) -> None:
        self.process = subprocess.Popen(
            [*(command or [sys.executable, "-m", "autoscaler.cli", "agent"]), *args],
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: list[str] = []
        self._queue: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            self._queue.put(line.rstrip("\n"))

    def wait_for_line(self, pattern: str, timeout_s: float = 60.0) -> re.Match[str]:
        """The first line matching ``pattern``; ``timeout_s`` is a ceiling scaled by the knob."""
        give_up = time.monotonic() + bound(timeout_s)
        for line in self.lines:
            if found := re.search(pattern, line):
                return found
        while time.monotonic() < give_up:
            try:
                line = self._queue.get(timeout=0.1)
            except queue.Empty:
                continue
            self.lines.append(line)
            if found := re.search(pattern, line):
                return found
        raise AssertionError(f"no line matching {pattern!r} in:\n" + "\n".join(self.lines))

    def stop(self) -> None:
        if self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGKILL)
            self.process.wait()


@pytest.fixture
def agent_env(controller_inbox: ControllerInbox) -> dict[str, str]:
    return {**os.environ, "NODE_TOKEN": controller_inbox.token, "PYTHONUNBUFFERED": "1"}


@pytest.fixture
def started() -> Iterator[list[AgentProcess]]:
    processes: list[AgentProcess] = []
    yield processes
    for process in processes:
        process.stop()


def test_the_agent_forwards_an_aws_notice_serves_nvml_up_0_and_stops_on_sigterm(
    started: list[AgentProcess],
    aws_imds: FakeImds,
    controller_inbox: ControllerInbox,
    agent_env: dict[str, str],
) -> None:
    agent = AgentProcess(
        [
            "--cloud", "aws",
            "--aws-metadata-url", aws_imds.url,
            "--aws-poll-seconds", "0.2",
            "--controller-url", controller_inbox.url,
            "--token-env", "NODE_TOKEN",
            "--listen", "127.0.0.1:0",
        ],
        agent_env,
    )  # fmt: skip
    started.append(agent)
    port = int(agent.wait_for_line(r"serving http://127\.0\.0\.1:(\d+)/metrics").group(1))
    if not GPU_HERE:
        agent.wait_for_line(r"no GPU")
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=bound(30)) as response:
        exposition = response.read().decode()
    nvml_up = rf"^gpu_autoscaler_agent_nvml_up {1.0 if GPU_HERE else 0.0}$"
    assert re.search(nvml_up, exposition, re.MULTILINE)
    assert not re.search(r"^up[ {]", exposition, re.MULTILINE), "Prometheus writes up itself"
    assert 'Hostname="i-0123456789abcdef0"' in exposition

    deadline = float(int(time.time()) + 120)
    aws_imds.set_instance_action("terminate", deadline)
    [notice] = controller_inbox.wait_for(1)
    assert (notice.instance_id, notice.kind, notice.deadline) == (
        "i-0123456789abcdef0",
        NoticeKind.TERMINATE,
        deadline,
    )
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=bound(30)) as response:
        exposition = response.read().decode()
    assert 'gpu_autoscaler_agent_notices_total{cloud="aws",kind="terminate"} 1.0' in exposition

    agent.process.send_signal(signal.SIGTERM)
    assert agent.process.wait(bound(60)) == 0
    agent.wait_for_line(r"agent stopped")
    assert all(controller_inbox.token not in line for line in agent.lines)


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--listen", "nonsense"], "--listen: 'nonsense' is not HOST:PORT"),
        (["--signal", "NOPE", "--signal-pid-file", "x"], "--signal: 'NOPE' is not a signal"),
        (["--signal", "USR1"], "--signal: needs --signal-pid-file"),
        (["--aws-poll-seconds", "0"], "--aws-poll-seconds: must be a positive"),
        (
            ["--controller-url", "http://c:1", "--token-env", "NO_SUCH_TOKEN_VAR_X"],
            "NO_SUCH_TOKEN_VAR_X holding the token is not set",
        ),
        (["--controller-url", "ftp://c", "--token-file", __file__], "is not an http(s) URL"),
        (["--controller-url", "http://c:1", "--token-file", "/nonexistent/t"], "cannot read"),
    ],
)
def test_bad_arguments_end_in_one_line_and_status_2(
    args: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["agent", "--cloud", "none", *args]) == 2
    err = capsys.readouterr().err
    assert says in err
    assert err.count("\n") == 1, err


def test_a_port_in_use_ends_in_one_line_and_status_2(
    started: list[AgentProcess], agent_env: dict[str, str]
) -> None:
    first = AgentProcess(["--cloud", "none", "--listen", "127.0.0.1:0"], agent_env)
    started.append(first)
    port = first.wait_for_line(r"serving http://127\.0\.0\.1:(\d+)/metrics").group(1)
    second = AgentProcess(["--cloud", "none", "--listen", f"127.0.0.1:{port}"], agent_env)
    started.append(second)
    assert second.process.wait(bound(60)) == 2
    second.wait_for_line(r"^error: --listen: cannot serve GPU metrics on 127\.0\.0\.1:" + port)
