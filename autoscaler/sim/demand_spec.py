"""What a scenario says of a demand series it replays (``trace.series``): the file, and the one
thing about its jobs the series cannot say, their size. Apart from the replay code
(``demand_series``) so that the scenario model can name it without importing the simulator."""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, Field

from autoscaler.model import Frozen

# The trace reader's limit on one job's GPUs.
MAX_JOB_GPUS = 65_536


def _path(value: str) -> str:
    if not value or len(value) > 4096 or any(ord(c) < 0x20 or ord(c) == 0x7F for c in value):
        raise ValueError("expected a file path without control characters")
    return value


class DemandSeriesSpec(Frozen):
    """A CSV of pending and running GPUs over time (``time_s``, ``pending_gpus``,
    ``running_gpus``; ``gpu-autoscaler trace import`` writes one from Prometheus or a CSV).
    Jobs are inferred from it as each of ``job_gpus`` GPUs on one node (docs/trace-import.md)."""

    file: Annotated[str, AfterValidator(_path)]
    job_gpus: int = Field(1, ge=1, le=MAX_JOB_GPUS)
