"""``report --journal --compare-scenario`` shows its replay as it runs, as every other replay
of ``report`` does: a line every interval in a log and one when it is done, nothing with
--no-progress (see tests/test_progress.py for the terminal's bar)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from test_report_journal import start
from test_sim_engine import job_row, small_scenario

from autoscaler.cli import main
from autoscaler.model.progress import INTERVAL_ENV
from autoscaler.ops.journal.base import open_sqlite
from autoscaler.report.journal import with_prediction
from autoscaler.report.model import Report

JOBS = [job_row(f"j{i}", i * 900, 3000) for i in range(8)]


@pytest.fixture
def journal(tmp_path: Path) -> Path:
    path = tmp_path / "j.db"
    opened = open_sqlite(path)
    try:
        start(opened)
    finally:
        opened.close()
    return path


def test_the_comparison_replay_logs_its_progress_and_no_progress_silences_it(
    journal: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(INTERVAL_ENV, "0.05")
    scenario = small_scenario(tmp_path, jobs=JOBS)
    args = ["report", "--journal", str(journal), "--compare-scenario", str(scenario)]
    assert main([*args, "--out", str(tmp_path / "shown")]) == 0
    err = capsys.readouterr().err
    done = r"replay cost-aware for comparison: done, 24 h in [\d.]+ s"
    assert re.search(rf"^{done}$", err, re.MULTILINE), err

    assert main([*args, "--out", str(tmp_path / "quiet"), "--no-progress"]) == 0
    assert capsys.readouterr().err == ""


def test_with_prediction_is_quiet_unless_asked(
    journal: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    scenario = small_scenario(tmp_path, jobs=JOBS)
    assert main(["report", "--journal", str(journal), "--out", str(tmp_path / "real")]) == 0
    real = Report.model_validate_json((tmp_path / "real" / "report.json").read_text())
    capsys.readouterr()
    quiet = with_prediction(real, scenario, None)
    assert capsys.readouterr().err == ""
    shown = with_prediction(real, scenario, None, show_progress=True)
    assert "replay cost-aware for comparison: done, 24 h in" in capsys.readouterr().err
    assert quiet.policies[1].cost == shown.policies[1].cost
