"""Writing what an import made: the job trace CSV a scenario's ``trace.file`` names, and the
demand series CSV its ``trace.series`` names. Written to a temporary file and renamed, so an
interrupted import never leaves half a trace behind."""

from __future__ import annotations

import csv
import os
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path

from autoscaler.model.errors import InputError
from autoscaler.sim.demand_series import SERIES_COLUMNS
from autoscaler.sim.importers.sacct import TraceRow

TRACE_COLUMNS = (
    "job_id",
    "submit_time_s",
    "start_time_s",
    "duration_s",
    "num_gpus",
    "num_nodes",
    "gpu_model",
    "user_group",
    "priority_class",
    "status",
    "queue_delay_s",
    "censored",
)


def number(value: float) -> str:
    """Every digit kept (``%g`` would round an epoch time to six figures)."""
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def write_trace(rows: Sequence[TraceRow], path: Path, origin: float) -> None:
    """``rows`` with times in seconds from ``origin`` (trace time 0)."""
    first = min((r.submit for r in rows), default=origin)
    if first < origin:
        raise InputError(
            "--origin",
            f"the first job was submitted {origin - first:,.0f} s before the origin; give an "
            "origin at or before the first submission",
        )
    _write(
        path,
        TRACE_COLUMNS,
        (
            (
                r.job_id,
                number(r.submit - origin),
                number(r.start - origin),
                number(r.duration),
                str(r.gpus),
                str(r.nodes),
                r.gpu_model,
                r.user_group,
                r.priority_class,
                r.status,
                number(max(0.0, r.start - r.submit)),
                "right" if r.censored else "none",
            )
            for r in rows
        ),
    )


def write_series(samples: Sequence[tuple[float, float, float]], path: Path) -> None:
    """(time in epoch seconds, pending GPUs, running GPUs) per sample."""
    _write(
        path,
        SERIES_COLUMNS,
        ((number(t), number(p), number(r)) for t, p, r in samples),
    )


def _write(path: Path, header: Sequence[str], rows: Iterable[Sequence[str]]) -> None:
    folder = path.parent if str(path.parent) else Path(".")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", dir=folder)
    except OSError as exc:
        raise InputError(str(path), f"cannot be written: {exc.strerror or exc}") from None
    try:
        with os.fdopen(handle, "w", newline="", encoding="utf-8") as out:
            writer = csv.writer(out, lineterminator="\n")
            writer.writerow(header)
            writer.writerows(rows)
        os.replace(temporary, path)
    except OSError as exc:
        Path(temporary).unlink(missing_ok=True)
        raise InputError(str(path), f"cannot be written: {exc.strerror or exc}") from None
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
