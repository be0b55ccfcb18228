"""Paths as a report shows them: where a reader can find the file, never where it happened to lie.

A report is shared and kept. An absolute path says nothing to its reader and leaks the machine's
layout (``/home/alice/...``, ``.../site-packages/...``): a file shipped with the package is shown
from the package (``autoscaler/data/scenarios/x.yaml``), the trace beside its scenario relative to
the scenario's folder (as the scenario names it), and any other absolute path by its file name.
A relative path is kept as the person typed it.
"""

from __future__ import annotations

import os
from pathlib import Path, PurePath

import autoscaler
from autoscaler.report.model import JournalFacts, Report, WindowInfo

PACKAGE = "autoscaler"
_PACKAGE_ROOT = Path(os.path.realpath(Path(autoscaler.__file__).parent))


def _inside(path: Path, folder: Path) -> PurePath | None:
    try:
        return path.relative_to(folder)
    except ValueError:
        return None


def shown_path(path: str, beside: Path | None = None) -> str:
    """``path`` as a report shows it; ``beside`` is the folder of the scenario that named it."""
    if not path or not os.path.isabs(path):
        return path
    real = Path(os.path.realpath(path))
    in_package = _inside(real, _PACKAGE_ROOT)
    if in_package is not None:
        return f"{PACKAGE}/{in_package.as_posix()}"
    if beside is not None:
        in_folder = _inside(real, Path(os.path.realpath(beside)))
        if in_folder is not None:
            return in_folder.as_posix()
    return real.name or path


def _shown_journal(report: Report, journal: JournalFacts) -> Report:
    where = journal.where
    shown = shown_path(where)
    if shown == where:
        return report
    return report.model_copy(
        update={
            "scenario": report.scenario.replace(where, shown),
            "source": report.source.replace(where, shown),
            "window": report.window.model_copy(
                update={"trace": report.window.trace.replace(where, shown)}
            ),
            "journal": journal.model_copy(update={"where": shown}),
        }
    )


def with_shown_paths(report: Report) -> Report:
    """The report with every path it shows to people in the form above. Paths are resolved
    against the current folder, as they were when the scenario was read."""
    if report.journal is not None:
        return _shown_journal(report, report.journal)
    scenario_folder = Path(os.path.abspath(report.source)).parent if report.source else None
    window: WindowInfo = report.window.model_copy(
        update={"trace": shown_path(report.window.trace, scenario_folder)}
    )
    return report.model_copy(update={"source": shown_path(report.source), "window": window})
