"""The note on stderr about jobs that can never run names the scenario as a person can find it:
the shipped default by its place in the package, not this machine's site-packages; a person's
own file exactly as they typed it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from test_sim_engine import job_row, small_scenario
from waits import bound

from autoscaler.cli.report import note_source
from autoscaler.sim.scenario import default_scenario_path

NOTE = ": note: 1 job(s) "


def test_the_shipped_default_is_named_from_the_package() -> None:
    shipped = str(default_scenario_path())
    assert os.path.isabs(shipped)
    assert note_source(shipped, None) == "autoscaler/data/scenarios/alibaba-openb-busy-25d.yaml"


def test_a_persons_own_file_is_named_as_typed(tmp_path: Path) -> None:
    mine = str(tmp_path / "site" / "mine.yaml")
    assert note_source(mine, Path(mine)) == mine
    assert note_source("site/mine.yaml", Path("site/mine.yaml")) == "site/mine.yaml"


def test_the_note_names_a_typed_scenario_as_typed(tmp_path: Path) -> None:
    """A job pinned to a GPU model nobody has: noted, then the report runs."""
    (tmp_path / "site").mkdir()
    pinned = job_row("pinned", 0, 600)
    assert pinned.endswith(",,none,")
    jobs = [pinned.removesuffix(",,none,") + ",H100,none,", job_row("free", 0, 600)]
    small_scenario(tmp_path / "site", jobs=jobs)
    command = [sys.executable, "-m", "autoscaler.cli", "report", "--policy", "cost-aware"]
    quick = ["--no-lower-bound", "--no-checkpoint-comparison", "--no-progress"]
    for typed in ("site/scenario.yaml", str(tmp_path / "site" / "scenario.yaml")):
        done = subprocess.run(
            [*command, "--scenario", typed, "--out", str(tmp_path / "out"), *quick],
            capture_output=True,
            text=True,
            check=False,
            cwd=tmp_path,
            timeout=bound(600),
        )
        assert done.returncode == 0, done.stderr
        assert done.stderr.startswith(typed + NOTE), done.stderr
