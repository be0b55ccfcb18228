"""What a person expects of any command line: ``--version`` on both programs, and shell completion
that completes (run in a real bash against the script ``gpu-autoscaler completion bash``
prints)."""

from __future__ import annotations

import importlib.metadata
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from waits import bound

ROOT = Path(__file__).resolve().parent.parent
CLI = [sys.executable, "-m", "autoscaler.cli"]
AGENT = [sys.executable, "-m", "node_agent"]
VERSION = importlib.metadata.version("hybrid-gpu-autoscaler")


def run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv, cwd=ROOT, capture_output=True, text=True, check=False, timeout=bound(300)
    )


@pytest.mark.parametrize(
    ("argv", "prog"),
    [(CLI, "gpu-autoscaler"), (AGENT, "gpu-autoscaler-agent")],
)
def test_version_prints_the_installed_version(argv: list[str], prog: str) -> None:
    done = run([*argv, "--version"])
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"{prog} {VERSION}\n"
    assert done.stderr == ""


BASH_PROBE = r"""
source "$1"
complete_with() {
    COMP_WORDS=("$@"); COMP_CWORD=$(( ${#COMP_WORDS[@]} - 1 ))
    COMP_LINE="${COMP_WORDS[*]}"; COMP_POINT=${#COMP_LINE}; COMPREPLY=()
    "$function" gpu-autoscaler "${COMP_WORDS[-1]}" "${COMP_WORDS[-2]}"
    printf '%s\n' "${COMPREPLY[*]}"
}
function=$(complete -p gpu-autoscaler | sed -E 's/.*-F ([^ ]+).*/\1/')
cd "$2"
complete_with gpu-autoscaler ""
complete_with gpu-autoscaler pl
complete_with gpu-autoscaler run --log-f
complete_with gpu-autoscaler run --log-format ""
complete_with gpu-autoscaler agent --clou
complete_with gpu-autoscaler run --config con
"""


def test_bash_completion_completes_commands_options_choices_and_files(tmp_path: Path) -> None:
    done = run([*CLI, "completion", "bash"])
    assert done.returncode == 0, done.stderr
    script = tmp_path / "gpu-autoscaler.bash"
    script.write_text(done.stdout)
    (tmp_path / "config.yaml").write_text("fleet_id: x\n")
    bash = shutil.which("bash")
    assert bash is not None
    probe = subprocess.run(
        [bash, "-c", BASH_PROBE, "probe", str(script), str(tmp_path)],
        capture_output=True,
        text=True,
        check=False,
        timeout=bound(60),
    )
    assert probe.returncode == 0, probe.stderr
    commands, plan, log_format, formats, cloud, config = probe.stdout.splitlines()
    assert set(commands.split()) >= {"validate", "run", "plan", "agent", "report", "completion"}
    assert plan == "plan"
    assert log_format == "--log-format"
    assert formats.split() == ["json", "text"]
    assert cloud == "--cloud", "the agent's options complete under gpu-autoscaler agent"
    assert config == "config.yaml", "--config completes file names"


def test_zsh_completion_names_every_command_and_option() -> None:
    done = run([*CLI, "completion", "zsh"])
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("#compdef gpu-autoscaler\n")
    for word in ("validate", "run", "plan", "report", "--config", "--log-format", "--dry-start"):
        assert word in done.stdout


def test_an_unknown_shell_is_one_line_and_exit_2() -> None:
    done = run([*CLI, "completion", "fish"])
    assert done.returncode == 2
    assert "invalid choice: 'fish'" in done.stderr
