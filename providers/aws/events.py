"""Reading the EventBridge events AWS delivers to the interruption queue, the way Karpenter's and
the node termination handler's queue modes do: spot interruption warnings, rebalance
recommendations, instance state changes and AWS Health scheduled changes.

Pure functions of the message body; no SDK. Bodies are read strictly (``autoscaler.model.notices``):
at most ``MAX_BODY`` bytes, nesting bounded by the JSON parser, fields of the type AWS sends
(an instance id is a string, never a number), instance ids bounded, and, given ``now``, an event
time and a deadline that a clock can reach. Anything else is a ``MalformedEventError`` naming the
field, never another exception.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from autoscaler.model import NoticeKind
from autoscaler.model.notices import (
    TIME_MAX_CHARS,
    deadline_problem,
    id_problem,
    parse_time,
    stamp_problem,
)

SPOT_WARNING = "EC2 Spot Instance Interruption Warning"
REBALANCE = "EC2 Instance Rebalance Recommendation"
STATE_CHANGE = "EC2 Instance State-change Notification"
HEALTH = "AWS Health Event"
SPOT_NOTICE_S = 120.0
# States in which an instance is going away whoever asked for it.
LEAVING_STATES = frozenset({"shutting-down", "terminated", "stopping", "stopped"})
# SQS takes messages of up to 1 MiB; an EventBridge event is a few KiB.
MAX_BODY = 1024 * 1024
MAX_ENTITIES = 1000


_M = TypeVar("_M", bound=BaseModel)


class MalformedEventError(ValueError):
    """A queue message that is not an event we can read."""


@dataclass(frozen=True)
class Event:
    instance_ids: tuple[str, ...]
    kind: NoticeKind
    at: float
    deadline: float | None
    detail_type: str


class _Strict(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True, frozen=True)


class _Envelope(_Strict):
    detail_type: str = Field(alias="detail-type", max_length=256)
    time: str = Field(max_length=TIME_MAX_CHARS)
    detail: dict[str, Any]


class _InstanceDetail(_Strict):
    instance_id: str = Field(alias="instance-id", max_length=1024)
    state: str | None = Field(None, max_length=64)


class _HealthDetail(_Strict):
    event_type_category: str | None = Field(None, alias="eventTypeCategory", max_length=128)
    start_time: str | None = Field(None, alias="startTime", max_length=TIME_MAX_CHARS)
    affected_entities: list[Any] | None = Field(
        None, alias="affectedEntities", max_length=MAX_ENTITIES
    )


def parse_event(body: str | bytes, now: float | None = None) -> Event | None:
    """The event in one message, or None for an event that asks nothing of us (a state change to
    running, a Health event that is not a scheduled change). With ``now``, the event's time and
    deadline must be ones a clock can reach. Raises ``MalformedEventError``."""
    if len(body) > MAX_BODY:
        raise MalformedEventError(f"body: over {MAX_BODY} bytes")
    envelope = _validate(_Envelope, body, json=True)
    at = _time(envelope.time, "time")
    if now is not None and (problem := stamp_problem(at, now)) is not None:
        raise MalformedEventError(f"time: {problem}")
    detail_type = envelope.detail_type
    if detail_type == SPOT_WARNING:
        ids = (_instance(envelope.detail),)
        return Event(ids, NoticeKind.TERMINATE, at, at + SPOT_NOTICE_S, detail_type)
    if detail_type == REBALANCE:
        return Event((_instance(envelope.detail),), NoticeKind.REBALANCE, at, None, detail_type)
    if detail_type == STATE_CHANGE:
        state = _validate(_InstanceDetail, envelope.detail).state
        if state is None:
            raise MalformedEventError("detail.state: a state change without a state")
        if state not in LEAVING_STATES:
            return None
        return Event((_instance(envelope.detail),), NoticeKind.TERMINATE, at, at, detail_type)
    if detail_type == HEALTH:
        return _health(_validate(_HealthDetail, envelope.detail), at, now)
    raise MalformedEventError(f"detail-type: unexpected {detail_type[:80]!r}")


def _health(detail: _HealthDetail, at: float, now: float | None) -> Event | None:
    if detail.event_type_category != "scheduledChange":
        return None
    if detail.affected_entities is None:
        raise MalformedEventError("detail.affectedEntities: a health event without it")
    ids: list[str] = []
    for entity in detail.affected_entities:
        # Entities that are not instances (volumes, hosts) concern someone else.
        value = entity.get("entityValue") if isinstance(entity, dict) else None
        if isinstance(value, str) and value.startswith("i-") and id_problem(value) is None:
            ids.append(value)
    deadline = _time(detail.start_time, "startTime") if detail.start_time is not None else at
    if now is not None and (problem := deadline_problem(deadline, now)) is not None:
        raise MalformedEventError(f"detail.startTime: {problem}")
    return Event(tuple(ids), NoticeKind.TERMINATE, at, deadline, HEALTH) if ids else None


def _validate(model: type[_M], data: Any, json: bool = False) -> _M:
    try:
        return model.model_validate_json(data) if json else model.model_validate(data)
    except ValidationError as exc:
        first = exc.errors(include_url=False, include_input=False)[0]
        where = ".".join(str(part) for part in first["loc"])
        prefix = "" if json else "detail."
        raise MalformedEventError(f"{prefix}{where or 'body'}: {first['msg']}") from None


def _time(value: str, what: str) -> float:
    try:
        return parse_time(value)
    except ValueError as exc:
        raise MalformedEventError(f"{what}: {exc}") from None


def _instance(detail: dict[str, Any]) -> str:
    instance = _validate(_InstanceDetail, detail).instance_id
    problem = id_problem(instance)
    if problem is not None or not instance.startswith("i-"):
        raise MalformedEventError(f"detail.instance-id: {problem or 'does not start with i-'}")
    return instance
