"""Every error a person can cause ends in one line on stderr and exit 2, naming what to do; output
piped into a reader that stopped early ends quietly. Each case runs the real command as a process:
an extra this install lacks (its packages refused by a meta-path finder, as a lean install would
lack them), a port another process holds, a closed pipe."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from waits import bound

from autoscaler.model.errors import InputError
from autoscaler.model.exits import EXIT_BROKEN_PIPE
from autoscaler.ops.health import Readiness, StatusServer
from autoscaler.ops.metrics import Metrics

ROOT = Path(__file__).resolve().parent.parent
QUICKSTART = ROOT / "examples" / "quickstart"
CONTAINER_CONFIG = ROOT / "examples" / "container" / "config.yaml"
CLI = [sys.executable, "-m", "autoscaler.cli"]
AGENT = [sys.executable, "-m", "node_agent"]
BUFFERED = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
"""Standard output as a user's shell gives it: with PYTHONUNBUFFERED, Python drops what a pipe
did not take of a large write instead of raising (its unbuffered text layer ignores a short
write), so no broken pipe would be seen."""

LACKING = (
    "import sys\n"
    "refused = tuple(sys.argv[1].split(','))\n"
    "class Lacking:\n"
    "    def find_spec(self, name, path=None, target=None):\n"
    "        if name in refused or name.startswith(tuple(r + '.' for r in refused)):\n"
    "            raise ModuleNotFoundError(f'No module named {name!r}', name=name)\n"
    "sys.meta_path.insert(0, Lacking())\n"
    "del sys.argv[1]\n"
    "from autoscaler.cli import main\n"
    "sys.exit(main())\n"
)


def command(
    args: list[str], *, lacking: tuple[str, ...] = (), env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``gpu-autoscaler ARGS`` in a fresh Python, without the packages ``lacking`` names."""
    argv = [sys.executable, "-c", LACKING, ",".join(lacking)] if lacking else CLI
    return subprocess.run(
        [*argv, *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, **(env or {})},
        timeout=bound(300),
    )


def one_line(done: subprocess.CompletedProcess[str]) -> str:
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("error: "), done.stderr
    assert "this is a bug" not in lines[0] and "Traceback" not in done.stderr
    return lines[0]


@pytest.mark.parametrize(
    ("cloud", "lacking", "extra"),
    [
        ("aws", ("boto3", "botocore"), "aws"),
        ("gcp", ("google",), "gcp"),
        ("gcp", ("google.cloud.compute_v1",), "gcp"),
        ("azure", ("azure",), "azure"),
    ],
)
def test_a_missing_cloud_sdk_is_one_line_naming_the_extra(
    cloud: str, lacking: tuple[str, ...], extra: str
) -> None:
    config = QUICKSTART / f"{cloud}.yaml"
    for args in (["validate", str(config)], ["plan", "--config", str(config)]):
        done = command(args, lacking=lacking)
        assert done.returncode == 2, done.stderr
        line = one_line(done)
        assert f"pip install 'hybrid-gpu-autoscaler[{extra}]'" in line
        assert f"{config}:" in line and f"providers.{cloud}" in line, line


def test_run_without_the_sdk_stops_at_the_start_with_the_same_line(tmp_path: Path) -> None:
    done = command(
        ["run", "--config", str(QUICKSTART / "gcp.yaml"), "--ticks", "1"], lacking=("google",)
    )
    assert done.returncode == 2, done.stderr
    assert "pip install 'hybrid-gpu-autoscaler[gcp]'" in one_line(done)


def test_a_missing_redis_client_is_one_line_naming_the_extra() -> None:
    config = QUICKSTART / "gcp.yaml"  # its work queue is a redis source
    done = command(["validate", str(config)], lacking=("redis",))
    assert done.returncode == 2, done.stderr
    line = one_line(done)
    assert "the redis source" in line and "pip install 'hybrid-gpu-autoscaler[redis]'" in line


def test_an_extra_imported_late_is_still_one_line_naming_it() -> None:
    """A lazily imported package that no build-time check covers reaches the command line's one
    ending as ``ModuleNotFoundError``: its name says which extra brings it."""
    done = command(
        ["report", "--journal-postgres-env", "JOURNAL_DSN"],
        lacking=("psycopg",),
        env={"JOURNAL_DSN": "postgresql://reader@127.0.0.1:1/journal"},
    )
    assert done.returncode == 2, done.stderr
    assert "pip install 'hybrid-gpu-autoscaler[postgres]'" in one_line(done)


@pytest.fixture
def taken_port() -> Iterator[int]:
    """A port another process (here: this one) listens on."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        yield int(holder.getsockname()[1])


def controller_config(tmp_path: Path, metrics_port: int, inbox_port: int) -> Path:
    """The container example with its journal, token and ports moved to this test's own."""
    token = tmp_path / "inbox-token"
    token.write_text("a-token-for-this-test-only\n")
    text = CONTAINER_CONFIG.read_text()
    text = text.replace("/var/lib/gpu-autoscaler/journal.db", str(tmp_path / "journal.db"))
    text = text.replace("/run/secrets/gpu-autoscaler/inbox-token", str(token))
    text = text.replace("{host: 0.0.0.0, port: 9108}", f"{{host: 127.0.0.1, port: {metrics_port}}}")
    text = text.replace("{host: 0.0.0.0, port: 8081}", f"{{host: 127.0.0.1, port: {inbox_port}}}")
    config = tmp_path / "config.yaml"
    config.write_text(text)
    return config


def test_a_taken_metrics_port_names_the_port_and_the_setting(
    tmp_path: Path, taken_port: int
) -> None:
    config = controller_config(tmp_path, metrics_port=taken_port, inbox_port=0)
    done = command(["run", "--config", str(config), "--ticks", "1"])
    assert done.returncode == 2, done.stderr
    line = one_line(done)
    assert "metrics.listen" in line and f"127.0.0.1:{taken_port}" in line, line
    assert f"{config}:" in line, "the line names the file and the line of the setting"


def test_a_taken_inbox_port_names_the_port_and_the_setting(tmp_path: Path, taken_port: int) -> None:
    config = controller_config(tmp_path, metrics_port=0, inbox_port=taken_port)
    done = command(["run", "--config", str(config), "--ticks", "1"])
    assert done.returncode == 2, done.stderr
    line = one_line(done)
    assert "inbox.listen" in line and f"127.0.0.1:{taken_port}" in line, line


def test_a_taken_agent_port_names_the_port_and_the_option(taken_port: int) -> None:
    done = subprocess.run(
        [*AGENT, "--cloud", "none", "--listen", f"127.0.0.1:{taken_port}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
        timeout=bound(300),
    )
    assert done.returncode == 2, done.stderr
    line = one_line(done)
    assert line.startswith("error: --listen: ") and f"127.0.0.1:{taken_port}" in line, line
    assert "choose another" in line


def test_a_port_taken_after_the_check_is_still_the_settings_line(taken_port: int) -> None:
    """``run`` checks the port at start; one taken between that check and the server's start
    (another process was quicker) is the same kind of line, not a traceback."""
    server = StatusServer(Metrics().registry, Readiness(60.0), "127.0.0.1", taken_port)
    with pytest.raises(
        InputError, match=rf"^metrics\.listen: cannot listen on 127\.0\.0\.1:{taken_port}"
    ):
        server.start()


def test_output_piped_into_head_ends_quietly() -> None:
    """A real shell pipeline: the schema (about 100 KB, more than a pipe holds) into a reader that
    takes one line and leaves, as ``head -n 1`` does. The shell's ``read`` takes exactly one line
    (``head`` may read 128 KiB at once, and then nothing was left unread)."""
    reader = 'IFS= read -r line; printf "%s\\n" "$line"'
    done = subprocess.run(
        ["bash", "-c", f'set -o pipefail; "$@" schema | {{ {reader}; }}', "pipe", *CLI],
        cwd=ROOT,
        env=BUFFERED,
        capture_output=True,
        text=True,
        check=False,
        timeout=bound(300),
    )
    assert done.stdout == "{\n"
    assert done.stderr == "", done.stderr
    assert done.returncode == EXIT_BROKEN_PIPE


def test_a_reader_that_left_before_the_first_line_ends_quietly() -> None:
    """The reader is gone before the command writes anything (the read end closed first), so the
    broken pipe is certain whatever the machine's speed."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        done = subprocess.run(
            [*CLI, "plan", "--config", str(CONTAINER_CONFIG)],
            cwd=ROOT,
            env=BUFFERED,
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            check=False,
            timeout=bound(300),
        )
    finally:
        os.close(write_end)
    assert done.stderr == "", done.stderr
    assert done.returncode == EXIT_BROKEN_PIPE


def test_a_broken_pipe_that_is_not_stdouts_is_still_a_bug() -> None:
    """Only standard output's reader leaving is quiet: a command's own broken connection is
    reported as the bug it is."""
    code = (
        "import sys\n"
        "from autoscaler.model.exits import run_command\n"
        "def broken() -> int:\n"
        "    raise BrokenPipeError(32, 'Broken pipe')\n"
        "sys.exit(run_command(broken))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=False
    )
    assert done.returncode == 1
    assert "this is a bug" in done.stderr and len(done.stderr.splitlines()) == 1
