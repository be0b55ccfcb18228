"""Put the report on disk without ever leaving a half-written file behind.

A report folder is often kept next to earlier runs or served as is, so a crash, a full disk or a
rendering bug must leave either the previous file or the new one, never a truncated mix: every
string is rendered first, and each file goes to a temporary name in the same folder and is
renamed into place only once it is fully on disk.

What leaves the process is checked first (``publishable``): a figure that is not a finite number
(NaN, infinity, from a damaged journal or a degenerate scenario) stops the write with one line
naming where it is, never ``$nan`` in a report; and every string is scrubbed of the secrets the
process knows, in the model, before JSON or HTML escaping could hide one from a text search.
Paths are shown relative to the package or the scenario, or by their file name: a report is
shared, and an absolute path of the machine that wrote it means nothing to its reader.
"""

from __future__ import annotations

import contextlib
import math
import os
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from autoscaler.model.errors import InputError
from autoscaler.model.secrets import SECRETS, scrub_strings
from autoscaler.report.model import Report
from autoscaler.report.render import render_html, render_markdown
from autoscaler.report.render_paths import with_shown_paths

# mkstemp creates files only the owner can read; a report is meant to be shared and served.
FILE_MODE = 0o644


def _render_all(report: Report) -> list[tuple[str, str]]:
    return [
        ("report.json", report.model_dump_json(indent=2) + "\n"),
        ("report.md", render_markdown(report)),
        ("report.html", render_html(report)),
    ]


def check_out_dir(out_dir: Path) -> None:
    """Checked before rendering so that a wrong path fails fast, with nothing yet touched."""
    if out_dir.exists() and not out_dir.is_dir():
        raise InputError(str(out_dir), "exists and is not a directory; pass a folder for --out")


def _make_directory(out_dir: Path) -> None:
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(str(out_dir), f"cannot create the folder: {_reason(exc)}") from exc


def _reason(exc: OSError) -> str:
    return exc.strerror or str(exc)


def _fsync_directory(directory: Path) -> None:
    """Makes the rename itself durable where the platform allows opening a folder."""
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _write_atomic(target: Path, text: str) -> None:
    fd, temp_name = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    temp = Path(temp_name)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        temp.chmod(FILE_MODE)
        os.replace(temp, target)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise


def _write_one(out_dir: Path, name: str, text: str) -> Path:
    target = out_dir / name
    try:
        _write_atomic(target, text)
    except OSError as exc:
        raise InputError(str(out_dir), f"cannot write {name}: {_reason(exc)}") from exc
    return target


def write_files(out_dir: Path, contents: list[tuple[str, str]]) -> list[Path]:
    """Write each (name, text) into ``out_dir``, each renamed into place only once fully
    written, with every secret the process has registered cut out; returns their paths. A bad folder
    is one clear error before anything is written."""
    check_out_dir(out_dir)
    _make_directory(out_dir)
    written = [_write_one(out_dir, name, SECRETS.scrub_values(text)) for name, text in contents]
    _fsync_directory(out_dir)
    return written


def write_report(report: Report, out_dir: Path) -> list[Path]:
    """Write report.json, report.md and report.html into ``out_dir``; returns their paths."""
    check_out_dir(out_dir)
    return write_files(out_dir, _render_all(publishable(report)))


def publishable(report: Report) -> Report:
    """The report as it may leave the process: every figure finite, every string scrubbed, every
    path shown as a reader can use it (``render_paths``), never as an absolute path of this
    machine. A figure that is not a finite number is an ``InputError`` naming its place."""
    data = report.model_dump(mode="python")
    refuse_non_finite(data, report.source, "report")
    return with_shown_paths(Report.model_validate(scrub_strings(data)))


def refuse_non_finite(data: Any, source: str, what: str) -> None:
    """An ``InputError`` naming the first figure of ``data`` (plain data) that is not finite."""
    for place, value in _numbers(data, ""):
        if not math.isfinite(value):
            raise InputError(
                source,
                f"the {what}'s {place} is {value!r}, not a finite number; no {what} was written",
            )


def _numbers(value: Any, place: str) -> Iterator[tuple[str, float]]:
    """(place, number) of every float in plain data (a report is a few levels deep)."""
    if isinstance(value, float):
        yield place, value
    elif isinstance(value, Mapping):
        for key, item in value.items():
            yield from _numbers(item, f"{place}.{key}" if place else str(key))
    elif isinstance(value, list | tuple):
        for index, item in enumerate(value):
            yield from _numbers(item, f"{place}[{index}]")
