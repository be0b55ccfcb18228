"""The node agent's ``--log-format json``: the controller's JSON lines (``ts``, ``level``,
``logger``, ``msg``) and the controller's scrubbing, from the agent as a real process under both
of its commands. The plain default is what the other agent tests read."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest
from metadata_servers import ControllerInbox, FakeImds
from test_agent_cli import AgentProcess
from waits import bound

from autoscaler.model import NoticeKind

AGENT_SCRIPT = Path(sys.executable).parent / "gpu-autoscaler-agent"
COMMANDS = {
    "gpu-autoscaler-agent": [str(AGENT_SCRIPT)],
    "gpu-autoscaler agent": [sys.executable, "-m", "autoscaler.cli", "agent"],
}


def events(lines: list[str]) -> list[dict[str, object]]:
    """Every line the agent wrote, each parsed as one JSON object (a line that is not one fails
    the test here, with the line)."""
    parsed = []
    for line in lines:
        try:
            event = json.loads(line)
        except json.JSONDecodeError as exc:
            raise AssertionError(f"not a JSON line: {line!r}") from exc
        assert isinstance(event, dict), line
        parsed.append(event)
    return parsed


@pytest.mark.parametrize("command", COMMANDS.values(), ids=COMMANDS.keys())
def test_json_lines_in_the_controllers_shape_with_the_token_scrubbed(
    command: list[str], aws_imds: FakeImds, controller_inbox: ControllerInbox
) -> None:
    token = controller_inbox.token
    env = {**os.environ, "NODE_TOKEN": token, "PYTHONUNBUFFERED": "1"}
    agent = AgentProcess(
        [
            "--log-format", "json",
            "--cloud", "aws",
            "--aws-metadata-url", aws_imds.url,
            "--aws-poll-seconds", "0.2",
            "--controller-url", controller_inbox.url,
            "--token-env", "NODE_TOKEN",
            "--listen", "127.0.0.1:0",
            # a name no node has, only to put the token into a line the agent writes
            "--hostname", f"node-{token}",
        ],
        env,
        command=command,
    )  # fmt: skip
    try:
        agent.wait_for_line(r'"msg": "agent for node-\*\*\* serving http://127\.0\.0\.1:\d+/')
        aws_imds.set_instance_action("terminate", float(int(time.time()) + 120))
        [notice] = controller_inbox.wait_for(1, timeout_s=30)
        assert notice.kind is NoticeKind.TERMINATE
        agent.wait_for_line(r'"msg": "interruption notice from aws-imds: terminate ')
        agent.process.send_signal(signal.SIGTERM)
        assert agent.process.wait(bound(30)) == 0
        agent.wait_for_line(r'"msg": "agent stopped"')
    finally:
        agent.stop()

    logged = events(agent.lines)
    for event in logged:
        assert {"ts", "level", "logger", "msg"} <= event.keys(), event
        assert str(event["ts"]).endswith("+00:00"), event
    assert all(token not in line for line in agent.lines)
    serving = next(e for e in logged if "serving http://" in str(e["msg"]))
    assert (serving["level"], serving["logger"]) == ("info", "node_agent.main")
    [heard] = [e for e in logged if str(e["msg"]).startswith("interruption notice from aws-imds")]
    assert (heard["level"], heard["logger"]) == ("warning", "node_agent.main")
    assert logged[-1]["msg"] == "agent stopped"


def test_the_log_format_takes_the_controllers_two_values_only(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from node_agent.cli import main

    with pytest.raises(SystemExit) as exited:
        main(["--log-format", "yaml"])
    assert exited.value.code == 2
    assert "--log-format: invalid choice: 'yaml' (choose from" in capsys.readouterr().err
