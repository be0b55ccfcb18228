"""A report never shows an absolute path of the machine that wrote it: shipped files from the
package, a trace beside its scenario relative to it, anything else by its file name."""

from __future__ import annotations

import json
import os
from pathlib import Path

from test_report_render import sample_report

import autoscaler
from autoscaler.report.model import JournalFacts, Report
from autoscaler.report.render_paths import shown_path, with_shown_paths
from autoscaler.report.write import publishable, write_report
from autoscaler.sim.scenario import default_scenario_path

PACKAGE_ROOT = os.path.realpath(Path(autoscaler.__file__).parent)


def test_a_shipped_file_is_shown_from_the_package() -> None:
    shipped = default_scenario_path()
    assert shown_path(str(shipped)) == "autoscaler/data/scenarios/alibaba-openb-busy-25d.yaml"


def test_a_trace_beside_its_scenario_is_shown_as_the_scenario_names_it(tmp_path: Path) -> None:
    trace = tmp_path / "site" / "traces" / "jobs.csv"
    assert shown_path(str(trace), tmp_path / "site") == "traces/jobs.csv"


def test_any_other_absolute_path_is_shown_by_its_file_name(tmp_path: Path) -> None:
    cached = tmp_path / "cache" / "synthetic-bursty-6000j.csv"
    assert shown_path(str(cached), tmp_path / "elsewhere") == "synthetic-bursty-6000j.csv"
    assert shown_path(str(cached)) == "synthetic-bursty-6000j.csv"


def test_a_relative_path_is_kept_as_typed() -> None:
    assert shown_path("scenarios/mine.yaml") == "scenarios/mine.yaml"
    assert shown_path("../up/mine.yaml", Path("/anywhere")) == "../up/mine.yaml"
    assert shown_path("") == ""


def _absolute_report(tmp_path: Path) -> Report:
    report = sample_report()
    trace = tmp_path / "gpu-autoscaler-cache" / "synthetic-bursty-6000j-10d-seed1.csv"
    return report.model_copy(
        update={
            "source": str(default_scenario_path()),
            "window": report.window.model_copy(update={"trace": str(trace)}),
        }
    )


def test_written_files_hold_no_absolute_path(tmp_path: Path) -> None:
    written = write_report(_absolute_report(tmp_path), tmp_path / "out")
    for path in written:
        text = path.read_text(encoding="utf-8")
        assert str(tmp_path) not in text, path.name
        assert PACKAGE_ROOT not in text, path.name
    markdown = (tmp_path / "out" / "report.md").read_text(encoding="utf-8")
    assert "- Scenario file: autoscaler/data/scenarios/alibaba-openb-busy-25d.yaml" in markdown
    assert "- Trace: synthetic-bursty-6000j-10d-seed1.csv" in markdown
    raw = json.loads((tmp_path / "out" / "report.json").read_text(encoding="utf-8"))
    assert raw["source"] == "autoscaler/data/scenarios/alibaba-openb-busy-25d.yaml"
    assert raw["window"]["trace"] == "synthetic-bursty-6000j-10d-seed1.csv"


def test_publishing_twice_changes_nothing_more(tmp_path: Path) -> None:
    once = publishable(_absolute_report(tmp_path))
    assert publishable(once) == once


def _journal_report(where: str) -> Report:
    report = sample_report()
    facts = JournalFacts(
        where=where,
        since=None,
        until=None,
        first_tick=None,
        last_tick=None,
        ticks_by_outcome={},
        instances_billed=0,
        cost_by_provider={},
        actions={},
        instances_launched=0,
        instances_terminated=0,
        interruptions=0,
        lost_gpu_hours=0.0,
        budget_capped_hours={},
        cloud_calls_cut_short=0,
    )
    return report.model_copy(
        update={
            "kind": "journal",
            "journal": facts,
            "scenario": where,
            "source": where,
            "window": report.window.model_copy(update={"trace": f"journal {where}"}),
        }
    )


def test_a_journal_file_is_shown_by_its_name(tmp_path: Path) -> None:
    shown = with_shown_paths(_journal_report(str(tmp_path / "state" / "journal.db")))
    assert shown.journal is not None and shown.journal.where == "journal.db"
    assert (shown.scenario, shown.source, shown.window.trace) == (
        "journal.db",
        "journal.db",
        "journal journal.db",
    )


def test_a_postgres_journal_keeps_its_address() -> None:
    where = "postgresql://db.internal:5432/autoscaler"
    assert with_shown_paths(_journal_report(where)) == _journal_report(where)
