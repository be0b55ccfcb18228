"""The node agent finds its per-cloud metadata watchers through the entry-point group
``gpu_autoscaler.metadata_watchers``: the three built in, registered in our pyproject, and a
third-party watcher package (``tests/plugins/``: a module and its dist-info, on ``sys.path`` as
pip would have installed them) with no change to the agent. A name that is not installed, does
not load or is not a watcher ends in one line naming the option and the installed names."""

from __future__ import annotations

import logging
import os
import signal
import socket
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from metadata_servers import ControllerInbox, FakeAcmeMetadata
from test_agent_cli import AgentProcess
from waits import bound

from autoscaler.cli import main as gpu_autoscaler
from autoscaler.model import NoticeKind
from autoscaler.model.errors import InputError
from node_agent.cli import main as gpu_autoscaler_agent
from node_agent.main import detect_cloud
from node_agent.metadata_aws import AwsWatcher
from node_agent.metadata_azure import AzureWatcher
from node_agent.metadata_gcp import GcpWatcher
from node_agent.watchers import WATCHER_GROUP, installed_names, watcher_class

ROOT = Path(__file__).resolve().parent.parent
PLUGINS = Path(__file__).resolve().parent / "plugins"
AGENT_SCRIPT = Path(sys.executable).parent / "gpu-autoscaler-agent"
BUILT_IN = "installed: aws, azure, gcp (or auto, none)"
WITH_ACME = "installed: acme, acme-missing, acme-odd, aws, azure, gcp (or auto, none)"

Cli = Callable[[list[str]], int]
CLIS: dict[str, Cli] = {
    "gpu-autoscaler agent": lambda args: gpu_autoscaler(["agent", *args]),
    "gpu-autoscaler-agent": gpu_autoscaler_agent,
}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def acme_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    """The third-party watcher package, installed for this test only (sys.path is restored
    after it, so other tests see the built-in watchers alone)."""
    monkeypatch.syspath_prepend(str(PLUGINS))


def test_the_built_in_watchers_are_found_through_the_entry_point_group() -> None:
    assert WATCHER_GROUP == "gpu_autoscaler.metadata_watchers"
    assert installed_names() == ["aws", "azure", "gcp"]
    assert watcher_class("aws") is AwsWatcher
    assert watcher_class("gcp") is GcpWatcher
    assert watcher_class("azure") is AzureWatcher
    assert AwsWatcher.default_metadata_url == "http://169.254.169.254"
    assert GcpWatcher.default_metadata_url == "http://metadata.google.internal"
    assert AzureWatcher.default_metadata_url == "http://169.254.169.254"


@pytest.mark.parametrize("cli", CLIS.values(), ids=CLIS.keys())
def test_an_unknown_cloud_ends_in_one_line_naming_the_option_and_the_installed_watchers(
    cli: Cli, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli(["--cloud", "oci"]) == 2
    err = capsys.readouterr().err
    assert err == f"error: --cloud: no metadata watcher named 'oci' is installed; {BUILT_IN}\n"


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--metadata-url", "aws"], "--metadata-url: 'aws' is not NAME=http(s)://HOST[:PORT]"),
        (["--metadata-url", "aws=ftp://x"], "--metadata-url: 'aws=ftp://x' is not NAME=http(s)"),
        (
            ["--metadata-url", "oci=http://127.0.0.1:1"],
            "--metadata-url: no metadata watcher named 'oci' is installed; installed: aws, azure, "
            "gcp",
        ),
        (
            ["--metadata-url", "aws=http://a", "--metadata-url", "aws=http://b"],
            "--metadata-url: aws is given twice",
        ),
        (
            ["--metadata-url", "aws=http://a", "--aws-metadata-url", "http://b"],
            "--aws-metadata-url: aws is also given by --metadata-url",
        ),
    ],
)
@pytest.mark.parametrize("cli", CLIS.values(), ids=CLIS.keys())
def test_bad_metadata_urls_end_in_one_line_and_status_2(
    cli: Cli, args: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli(["--cloud", "none", *args]) == 2
    err = capsys.readouterr().err
    assert says in err
    assert err.count("\n") == 1, err


@pytest.mark.usefixtures("acme_installed")
def test_a_third_party_watcher_is_found_and_probed_like_the_built_in_ones(
    acme_metadata: FakeAcmeMetadata, caplog: pytest.LogCaptureFixture
) -> None:
    assert installed_names() == ["acme", "acme-missing", "acme-odd", "aws", "azure", "gcp"]
    acme = watcher_class("acme")
    assert (getattr(acme, "__module__", ""), getattr(acme, "__qualname__", "")) == (
        "acme_watcher",
        "AcmeWatcher",
    )
    assert acme.probe(acme_metadata.url, 2.0)

    caplog.set_level(logging.WARNING, logger="node_agent")
    nowhere = f"http://127.0.0.1:{free_port()}"
    urls = {"acme": acme_metadata.url, "aws": nowhere, "gcp": nowhere, "azure": nowhere}
    assert detect_cloud(urls, timeout_s=0.5) == "acme"
    # the two broken registrations are left out of the probe, one line each, and the rest works
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [
        "--cloud auto: the metadata watcher 'acme-missing' failed to load: ModuleNotFoundError: "
        "No module named 'acme_watcher_not_installed'; not probing it",
        f"--cloud auto: 'acme-odd' is registered in {WATCHER_GROUP} but is not a metadata "
        "watcher: it needs a default_metadata_url, probe(base_url, timeout_s) and "
        "from_context(context); not probing it",
    ]
    assert detect_cloud(urls | {"acme": nowhere}, timeout_s=0.5) == "none"


@pytest.mark.usefixtures("acme_installed")
@pytest.mark.parametrize(
    ("cloud", "says"),
    [
        ("oci", f"--cloud: no metadata watcher named 'oci' is installed; {WITH_ACME}"),
        (
            "acme-missing",
            "--cloud: the metadata watcher 'acme-missing' failed to load: ModuleNotFoundError: "
            "No module named 'acme_watcher_not_installed'",
        ),
        (
            "acme-odd",
            f"--cloud: 'acme-odd' is registered in {WATCHER_GROUP} but is not a metadata watcher",
        ),
    ],
)
def test_a_watcher_that_is_not_there_or_broken_ends_in_one_line_and_status_2(
    cloud: str, says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert gpu_autoscaler_agent(["--cloud", cloud]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: " + says), err
    assert err.count("\n") == 1, err


def test_watcher_class_raises_input_error_for_the_option_it_is_told() -> None:
    with pytest.raises(InputError, match=r"^--metadata-url: no metadata watcher named 'x'"):
        watcher_class("x", option="--metadata-url")


class AgentScript(AgentProcess):
    """``gpu-autoscaler-agent`` as ops run it; its stderr read on a thread."""

    def __init__(self, args: list[str], env: dict[str, str]) -> None:
        super().__init__(args, env, command=[str(AGENT_SCRIPT)])

    def metrics(self, port: int) -> str:
        with urllib.request.urlopen(
            f"http://127.0.0.1:{port}/metrics", timeout=bound(30)
        ) as response:
            return str(response.read().decode())


@pytest.fixture
def agent_script() -> Iterator[list[AgentScript]]:
    started: list[AgentScript] = []
    yield started
    for agent in started:
        if agent.process.poll() is None:
            os.kill(agent.process.pid, signal.SIGKILL)
            agent.process.wait()


def test_gpu_autoscaler_agent_detects_a_third_party_cloud_and_forwards_its_notice(
    agent_script: list[AgentScript],
    acme_metadata: FakeAcmeMetadata,
    controller_inbox: ControllerInbox,
) -> None:
    nowhere = f"http://127.0.0.1:{free_port()}"
    env = {
        **os.environ,
        "PYTHONPATH": str(PLUGINS),
        "NODE_TOKEN": controller_inbox.token,
        "PYTHONUNBUFFERED": "1",
    }
    agent = AgentScript(
        [
            "--metadata-url", f"acme={acme_metadata.url}",
            "--aws-metadata-url", nowhere,
            "--gcp-metadata-url", nowhere,
            "--azure-metadata-url", nowhere,
            "--controller-url", controller_inbox.url,
            "--token-env", "NODE_TOKEN",
            "--listen", "127.0.0.1:0",
        ],
        env,
    )  # fmt: skip
    agent_script.append(agent)
    agent.wait_for_line(r"cloud detected from the metadata servers: acme$")
    port = int(agent.wait_for_line(r"agent for acme-node-7 serving http://[^:]+:(\d+)/").group(1))
    agent.wait_for_line(r"watching acme metadata for interruption notices")
    assert 'Hostname="acme-node-7"' in agent.metrics(port)

    deadline = float(int(time.time()) + 60)
    acme_metadata.interrupt("acme-event-1", deadline)
    [notice] = controller_inbox.wait_for(1)
    assert (notice.instance_id, notice.kind, notice.deadline) == (
        "acme-node-7",
        NoticeKind.TERMINATE,
        deadline,
    )
    exposition = agent.metrics(port)
    assert 'gpu_autoscaler_agent_notices_total{cloud="acme",kind="terminate"} 1.0' in exposition

    agent.process.send_signal(signal.SIGTERM)
    assert agent.process.wait(bound(60)) == 0
    agent.wait_for_line(r"agent stopped")
    assert any("'acme-missing' failed to load" in line for line in agent.lines)
    assert all(controller_inbox.token not in line for line in agent.lines)
