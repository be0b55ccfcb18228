"""The records every step passes on: what the guard clamped, what act did, what a tick came to,
and the one exception that stops a replica acting. They live with the model so that the journal,
the metrics and the report read them without importing the steps that make them."""

from __future__ import annotations

from dataclasses import dataclass, field

from autoscaler.model.domain import FleetView, Plan
from autoscaler.model.shapes import Unhostable


@dataclass(frozen=True)
class Clamp:
    rule: str
    pool: str | None
    requested: int
    allowed: int
    detail: str


@dataclass(frozen=True)
class ActionRecord:
    kind: str
    pool: str | None
    requested: int
    done: int
    outcome: str
    detail: str = ""
    request_id: str | None = None
    instance_ids: tuple[str, ...] = ()
    fallback_from: str | None = None
    job_id: str | None = None
    lost_gpu_s: float | None = None


@dataclass
class TickReport:
    tick: int
    now: float
    view: FleetView
    plan: Plan
    held: str | None
    clamps: list[Clamp]
    actions: list[ActionRecord]
    errors: list[str] = field(default_factory=list)
    duration_s: float = 0.0
    month_spend: float | None = None
    accrued: dict[str, float] = field(default_factory=dict)
    failing_sources: list[str] = field(default_factory=list)
    unhostable: list[Unhostable] = field(default_factory=list)


class LeadershipLost(RuntimeError):  # noqa: N818 - a state, named as the callers say it
    """The lock is no longer ours (or its fencing token is stale): stop acting at once."""
