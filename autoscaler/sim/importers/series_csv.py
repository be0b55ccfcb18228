"""A CSV of pending and running GPUs over time (a dashboard's export), in whatever columns it
has, as the demand series CSV the simulator replays: a time column (epoch seconds, or ISO 8601
times; UTC unless they say otherwise), a pending-GPUs column and a running-GPUs column, named
by the caller. Rows must be in time order, one per time."""

from __future__ import annotations

import re
from pathlib import Path

from autoscaler.model.csvfile import EARLIEST, LATEST, read_rows
from autoscaler.model.errors import InputError
from autoscaler.sim.demand_series import MAX_SERIES_GPUS

_NUMBER = re.compile(r"^[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]{1,4})?$")


def read_demand_csv(
    path: Path, time: str, pending: str, running: str
) -> list[tuple[float, float, float]]:
    """(epoch seconds, pending GPUs, running GPUs) per row, checked."""
    if len({time, pending, running}) != 3:
        raise InputError(str(path), "the time, pending and running columns must be three columns")
    samples: list[tuple[float, float, float]] = []
    for row in read_rows(path, (time, pending, running)):
        raw = row.text(time)
        if _NUMBER.match(raw):
            t = row.number(time, minimum=EARLIEST, maximum=LATEST)
        else:
            t = row.timestamp(time)
        if samples and t <= samples[-1][0]:
            raise row.error(time, "expected a time after the previous row's (rows in time order)")
        samples.append(
            (
                t,
                row.number(pending, minimum=0, maximum=MAX_SERIES_GPUS),
                row.number(running, minimum=0, maximum=MAX_SERIES_GPUS),
            )
        )
    if len(samples) < 2:
        raise InputError(str(path), "a demand series needs at least two rows")
    return samples
