"""suite.json shows no absolute path of the machine that wrote it: the suite file as typed (a
shipped one from the package, another absolute one by its name), each scenario relative to the
suite's folder as the suite file names it; an error still names the suite file as typed. The
suite keeps the bound's total, not its accrual curve."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from test_sim_engine import job_row, small_scenario

from autoscaler.model.errors import InputError
from autoscaler.report.suite import (
    SuiteReport,
    load_suite,
    run_suite,
    with_shown_paths,
    write_suite,
)
from autoscaler.sim.scenario import default_scenario_path

JOBS = [job_row(f"j{i}", i * 1800, 2400, preemptible=1) for i in range(4)]


def scenario_in(folder: Path, name: str) -> Path:
    folder.mkdir(parents=True)
    path = small_scenario(folder, jobs=JOBS)
    path.write_text(path.read_text().replace("name: small", f"name: {name}", 1))
    return path


def small_suite(tmp_path: Path) -> tuple[Path, Path]:
    """A suite naming one scenario by a relative path, one by an absolute path inside its
    folder, and one outside it; and that outside scenario."""
    site = tmp_path / "site"
    inside = scenario_in(site / "real", "relative")
    absolute = scenario_in(site / "deep" / "er", "absolute")
    outside = scenario_in(tmp_path / "elsewhere", "outside")
    suite = site / "suite.yaml"
    suite.write_text(
        "name: paths\npolicies: [{name: cost-aware}]\nscenarios:\n"
        f"  - file: {inside.relative_to(site)}\n  - file: {absolute}\n  - file: {outside}\n"
    )
    return suite, outside


def test_suite_json_names_the_suite_as_typed_and_scenarios_beside_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    suite, outside = small_suite(tmp_path)
    report = run_suite(load_suite(suite))
    assert report.scenarios[0].source == str(suite.parent / "real" / "scenario.yaml")
    assert report.scenarios[0].lower_bound is not None
    assert report.scenarios[0].lower_bound.cost is not None
    assert report.scenarios[0].lower_bound.accrual_cost == [], "the suite keeps the total only"
    write_suite(report, tmp_path / "out")
    text = (tmp_path / "out" / "suite.json").read_text()
    assert str(tmp_path) not in text
    raw = json.loads(text)
    assert raw["source"] == "suite.yaml"  # typed absolute: its name
    assert [s["source"] for s in raw["scenarios"]] == [
        "real/scenario.yaml",
        "deep/er/scenario.yaml",
        outside.name,
    ]
    assert raw["scenarios"][0]["lower_bound"]["accrual_t_hours"] == []

    # typed relative to the current folder: kept as typed, scenarios still beside the suite
    monkeypatch.chdir(tmp_path)
    typed = with_shown_paths(report.model_copy(update={"source": "site/suite.yaml"}))
    assert typed.source == "site/suite.yaml"
    assert [s.source for s in typed.scenarios][:2] == [
        "real/scenario.yaml",
        "deep/er/scenario.yaml",
    ]


def test_a_shipped_suite_is_shown_from_the_package() -> None:
    shipped = default_scenario_path().parent / "suite.yaml"
    report = SuiteReport(
        suite="s",
        description="",
        source=str(shipped),
        default_policy="cost-aware",
        policies=[],
        peer_wait_slack_s=5.0,
        lower_bound=False,
        scenarios=[],
        medians=[],
        median_peer_over_default=None,
        wall_s=0.0,
    )
    assert with_shown_paths(report).source == "autoscaler/data/scenarios/suite.yaml"


def test_a_suite_that_cannot_be_written_names_the_suite_file_as_typed(tmp_path: Path) -> None:
    suite, _ = small_suite(tmp_path)
    report = run_suite(load_suite(suite), lower_bound=False)
    (result, *rest) = report.scenarios
    broken = report.model_copy(
        update={
            "scenarios": [
                result.model_copy(update={"days": math.inf}),
                *rest,
            ]
        }
    )
    with pytest.raises(InputError) as caught:
        write_suite(broken, tmp_path / "out")
    assert str(caught.value).startswith(str(suite))
    assert "scenarios[0].days" in str(caught.value)
