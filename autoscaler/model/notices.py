"""What every notice boundary accepts: the node agents' inbox, the EventBridge messages of the
AWS interruption queue, and the metadata answers the agent reads on the node. One place, so the
inbox and the queue cannot disagree on what a notice is.

* An instance name is 1 to 256 characters of ``A-Z a-z 0-9 _ . : / @ -`` (AWS ``i-...``, GCP and
  Azure VM names, scale-set ``name_3``): bounded, printable, one token, so it is cheap to log,
  store and compare, and cannot forge a log line.
* A deadline is a number a clock can reach: finite, and no more than ``DEADLINE_PAST_S`` before
  now (a notice that old is junk, not a late one: SQS keeps a message 14 days at most) nor more
  than ``DEADLINE_AHEAD_S`` after (AWS Health announces changes weeks ahead; nothing announces
  one a year out).
* A time a cloud stamped an event with is in the same window, and not more than
  ``CLOCK_SKEW_S`` in the future.
"""

from __future__ import annotations

import math
import re
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Annotated

from pydantic import StringConstraints

ID_MAX_CHARS = 256
ID_CHARS = r"A-Za-z0-9_.:/@-"
ID_PATTERN = rf"^[A-Za-z0-9_][{ID_CHARS}]*$"
SOURCE_MAX_CHARS = 64
TIME_MAX_CHARS = 64
DEADLINE_PAST_S = 14 * 86_400.0
DEADLINE_AHEAD_S = 366 * 86_400.0
CLOCK_SKEW_S = 300.0

InstanceName = Annotated[
    str, StringConstraints(min_length=1, max_length=ID_MAX_CHARS, pattern=ID_PATTERN)
]
SourceName = Annotated[
    str, StringConstraints(min_length=1, max_length=SOURCE_MAX_CHARS, pattern=ID_PATTERN)
]

_ID = re.compile(ID_PATTERN)
# RFC 1123 as the clouds write it; a four-digit year (email.utils reads "0001" as 2001).
_RFC1123 = re.compile(
    r"^(?:[A-Z][a-z]{2}, )?[0-9]{1,2} [A-Z][a-z]{2} [1-9][0-9]{3} "
    r"[0-9]{2}:[0-9]{2}(?::[0-9]{2})? (?:GMT|UTC|UT|[+-][0-9]{4})$"
)


def id_problem(value: object) -> str | None:
    """Why ``value`` is not an instance name, or None when it is one."""
    if not isinstance(value, str):
        return "is not a string"
    if not 1 <= len(value) <= ID_MAX_CHARS:
        return f"has {len(value)} characters, expected 1 to {ID_MAX_CHARS}"
    if not _ID.match(value) or not value.isascii():
        return f"has characters outside {ID_CHARS}"
    return None


def deadline_problem(value: float, now: float) -> str | None:
    """Why ``value`` cannot be a deadline at ``now``, or None when it can."""
    if not math.isfinite(value):
        return "is not a finite number"
    if value < now - DEADLINE_PAST_S:
        return f"is more than {DEADLINE_PAST_S / 86_400:.0f} days before now"
    if value > now + DEADLINE_AHEAD_S:
        return f"is more than {DEADLINE_AHEAD_S / 86_400:.0f} days after now"
    return None


def stamp_problem(value: float, now: float) -> str | None:
    """Why ``value`` cannot be when a cloud stamped an event it sends us now, or None."""
    if math.isfinite(value) and value > now + CLOCK_SKEW_S:
        return f"is more than {CLOCK_SKEW_S:.0f} s in the future"
    return deadline_problem(value, now)


def parse_time(value: object) -> float:
    """Seconds since the epoch of a time with a zone, as the clouds write them: ISO 8601
    (``2026-11-21T10:00:00Z``, EventBridge's ``time``) or RFC 1123 (``Sat, 21 Nov 2026 10:00:00
    GMT``, AWS Health's ``startTime``, Azure's ``NotBefore``). Raises ``ValueError`` with a
    one-line reason that does not echo a long input."""
    if not isinstance(value, str):
        raise ValueError("is not a string")
    if len(value) > TIME_MAX_CHARS:
        raise ValueError(f"has {len(value)} characters, not a time")
    moment: datetime | None
    try:
        moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        moment = None
        if _RFC1123.match(value):
            try:
                moment = parsedate_to_datetime(value)
            except (TypeError, ValueError, IndexError, OverflowError):
                moment = None
    if moment is None:
        raise ValueError(f"{value!r} is not an ISO 8601 or RFC 1123 time")
    if moment.tzinfo is None:
        raise ValueError(f"{value!r} has no time zone")
    return (moment - datetime(1970, 1, 1, tzinfo=UTC)).total_seconds()
