"""Reading the EventBridge events AWS delivers to the interruption queue, the way Karpenter's and
the node termination handler's queue modes do: spot interruption warnings, rebalance
recommendations, instance state changes and AWS Health scheduled changes.

Pure functions of the message body; no SDK.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from autoscaler.model import NoticeKind

SPOT_WARNING = "EC2 Spot Instance Interruption Warning"
REBALANCE = "EC2 Instance Rebalance Recommendation"
STATE_CHANGE = "EC2 Instance State-change Notification"
HEALTH = "AWS Health Event"
SPOT_NOTICE_S = 120.0
# States in which an instance is going away whoever asked for it.
LEAVING_STATES = frozenset({"shutting-down", "terminated", "stopping", "stopped"})


class MalformedEventError(ValueError):
    """A queue message that is not an event we can read."""


@dataclass(frozen=True)
class Event:
    instance_ids: tuple[str, ...]
    kind: NoticeKind
    at: float
    deadline: float | None
    detail_type: str


def _time(value: Any, what: str) -> float:
    if not isinstance(value, str):
        raise MalformedEventError(f"{what} is not a time")
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        raise MalformedEventError(f"{what} {value!r} is not an ISO-8601 time") from None


def parse_event(body: str) -> Event | None:
    """The event in one message, or None for an event that asks nothing of us (a state change to
    running, a Health event that is not a scheduled change). Raises ``MalformedEventError``."""
    try:
        message = json.loads(body)
    except json.JSONDecodeError as exc:
        raise MalformedEventError(f"not JSON: {exc.msg}") from None
    if not isinstance(message, dict):
        raise MalformedEventError("not a JSON object")
    detail_type = message.get("detail-type")
    detail = message.get("detail")
    if not isinstance(detail_type, str) or not isinstance(detail, dict):
        raise MalformedEventError("no detail-type and detail")
    at = _time(message.get("time"), "time")
    if detail_type == SPOT_WARNING:
        return Event(
            (_instance(detail),), NoticeKind.TERMINATE, at, at + SPOT_NOTICE_S, detail_type
        )
    if detail_type == REBALANCE:
        return Event((_instance(detail),), NoticeKind.REBALANCE, at, None, detail_type)
    if detail_type == STATE_CHANGE:
        state = detail.get("state")
        if not isinstance(state, str):
            raise MalformedEventError("state change without a state")
        if state not in LEAVING_STATES:
            return None
        return Event((_instance(detail),), NoticeKind.TERMINATE, at, at, detail_type)
    if detail_type == HEALTH:
        if detail.get("eventTypeCategory") != "scheduledChange":
            return None
        entities = detail.get("affectedEntities")
        if not isinstance(entities, list):
            raise MalformedEventError("health event without affectedEntities")
        ids = tuple(
            e["entityValue"]
            for e in entities
            if isinstance(e, dict) and str(e.get("entityValue", "")).startswith("i-")
        )
        start = detail.get("startTime")
        deadline = _time(start, "startTime") if start is not None else at
        return Event(ids, NoticeKind.TERMINATE, at, deadline, detail_type) if ids else None
    raise MalformedEventError(f"unexpected detail-type {detail_type!r}")


def _instance(detail: dict[str, Any]) -> str:
    instance = detail.get("instance-id")
    if not isinstance(instance, str) or not instance.startswith("i-"):
        raise MalformedEventError("no instance-id")
    return instance
