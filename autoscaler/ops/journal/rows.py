"""The journal's rows as they are read back, each column typed with the limits of what the
controller writes.

The journal is a file (or a database) that anything can reach between two reads: a disk error,
a careless ``sqlite3`` session, a restore from the wrong backup. SQLite keeps whatever it is
given in any column, so text can sit in a number's column, and PostgreSQL keeps ``NaN`` and
``Infinity``. A row read back is therefore parsed, never trusted: numbers must be numbers,
finite, and in a range the controller could have written (a time between 1970 and 2100, no
negative dollars or counts), text must be text of a bounded length, JSON must parse within
pydantic's depth limit. Anything else is a ``RowError`` naming the table, the row and the
column, which the controller turns into a ``JournalError`` and the report into an
``InputError``: one line, never a figure made of garbage.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any, NamedTuple, TypeVar

from pydantic import (
    BeforeValidator,
    ConfigDict,
    Field,
    Json,
    TypeAdapter,
    ValidationError,
    with_config,
)
from typing_extensions import TypedDict

from autoscaler.ops.journal.schema import SCHEMA_VERSION

# 2100-01-01T00:00:00Z: no controller running now writes a time past it, and every time before
# it fits a datetime; before 1970 is a clock no one runs.
EARLIEST_TIME = 0.0
LATEST_TIME = 4_102_444_800.0
MAX_COUNT = 1_000_000_000  # instances, GPUs, jobs: far above any fleet
MAX_USD = 1e12
MAX_HOURS = 1e12
MAX_SECONDS = 1e12
MAX_ID = 2**63 - 1  # BIGINT
MAX_NAME = 1024  # a pool, provider, kind, outcome, instance or request id
MAX_DETAIL = 65_536
MAX_JSON = 4 * 1024 * 1024
MAX_IDS = 100_000


def _sqlite_bool(value: Any) -> Any:
    """SQLite keeps a boolean as 0 or 1; PostgreSQL as a boolean."""
    if type(value) is int and value in (0, 1):
        return bool(value)
    return value


def _json_text(value: Any) -> Any:
    """JSON columns hold text; its length is bounded before it is parsed."""
    if isinstance(value, str) and len(value) > MAX_JSON:
        raise ValueError(f"JSON text longer than {MAX_JSON} characters")
    return value


Time = Annotated[float, Field(strict=True, allow_inf_nan=False, ge=EARLIEST_TIME, lt=LATEST_TIME)]
Seconds = Annotated[float, Field(strict=True, allow_inf_nan=False, ge=0.0, le=MAX_SECONDS)]
Usd = Annotated[float, Field(strict=True, allow_inf_nan=False, ge=0.0, le=MAX_USD)]
Hours = Annotated[float, Field(strict=True, allow_inf_nan=False, ge=0.0, le=MAX_HOURS)]
Count = Annotated[int, Field(strict=True, ge=0, le=MAX_COUNT)]
Serial = Annotated[int, Field(strict=True, ge=0, le=MAX_ID)]
Name = Annotated[str, Field(strict=True, max_length=MAX_NAME)]
Detail = Annotated[str, Field(strict=True, max_length=MAX_DETAIL)]
Month = Annotated[str, Field(strict=True, pattern=r"^[0-9]{4}-(0[1-9]|1[0-2])$")]
Day = Annotated[
    str, Field(strict=True, pattern=r"^[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])$")
]
Flag = Annotated[bool, BeforeValidator(_sqlite_bool), Field(strict=True)]
InstanceIds = Annotated[
    Json[Annotated[list[Name], Field(max_length=MAX_IDS)]], BeforeValidator(_json_text)
]


@with_config(ConfigDict(extra="allow"))
class Clamp(TypedDict):
    """A guard's clamp as a tick records it (``pool``, ``requested``, ``allowed`` beside)."""

    rule: Name


Clamps = Annotated[
    Json[Annotated[list[Clamp], Field(max_length=MAX_IDS)]], BeforeValidator(_json_text)
]
Plan = Annotated[Json[dict[str, Any]], BeforeValidator(_json_text)]


class RowError(ValueError):
    """A row the controller could not have written; the message is one line."""


# -- the rows each reader asks for (columns in SELECT order) ----------------------------------


class TicksRow(NamedTuple):
    id: Serial
    incarnation: Name
    tick: Serial
    token: Serial
    at: Time
    duration_s: Seconds
    outcome: Name
    held: Detail | None
    demand_known: Flag
    pending_gpus: Count
    instances: Count
    cost_per_hour: Usd
    plan: Plan
    clamps: Clamps
    onprem_idle_gpu_s: Seconds | None


class TickFigures(NamedTuple):
    """What the report reads of a tick (the plan can be large, and it does not need it).
    ``onprem_idle_gpu_s`` is NULL in a tick that could not know it, and in every tick of a
    journal older than schema version 2 (read as NULL there, see ``tick_figure_columns``)."""

    id: Serial
    at: Time
    duration_s: Seconds
    outcome: Name
    pending_gpus: Count
    cost_per_hour: Usd
    clamps: Clamps
    onprem_idle_gpu_s: Seconds | None


class ActionsRow(NamedTuple):
    id: Serial
    tick: Serial
    token: Serial
    at: Time
    kind: Name
    pool: Name | None
    requested: Count
    done: Count
    outcome: Name
    detail: Detail
    request_id: Name | None
    instance_ids: InstanceIds
    job_id: Name | None
    lost_gpu_s: Seconds | None


class ActionFigures(NamedTuple):
    """What the report reads of an action."""

    id: Serial
    at: Time
    kind: Name
    pool: Name | None
    done: Count
    outcome: Name
    lost_gpu_s: Seconds | None


class CostsRow(NamedTuple):
    instance_id: Name
    month: Month
    provider: Name
    pool: Name
    gpus: Count
    first_at: Time
    last_at: Time
    usd: Usd
    gpu_hours: Hours


class TeamCostsRow(NamedTuple):
    """An instance-month's cost with whom the instance was bought for (schema version 4; NULL:
    no team, or a row written before it): what the teams' month spend is summed from."""

    instance_id: Name
    month: Month
    provider: Name
    pool: Name
    gpus: Count
    first_at: Time
    last_at: Time
    usd: Usd
    gpu_hours: Hours
    team: Name | None


class IdleRow(NamedTuple):
    """GPU-seconds on-prem GPUs were allocated on a node that read idle, summed per node and
    day (UTC) over the span ``first_at`` to ``last_at`` of the ticks that counted them."""

    node: Name
    day: Day
    first_at: Time
    last_at: Time
    gpu_s: Seconds


class TeamUsageRow(NamedTuple):
    """A team's GPU-milliseconds and micro-dollars at one place (a pool, or on-prem) on one day
    (UTC), summed over the ticks from ``first_at`` to ``last_at`` (schema version 3 on)."""

    team: Name
    pool: Name
    day: Day
    first_at: Time
    last_at: Time
    gpu_ms: Serial
    usd_micros: Serial


class CostUnitsRow(NamedTuple):
    """An instance-month's accrued dollars and GPU-time in whole units (NULL: accrued before
    schema version 3 only): what the teams' lines in ``team_usage`` add up to."""

    instance_id: Name
    month: Month
    pool: Name
    first_at: Time
    last_at: Time
    usd_micros: Serial | None
    gpu_ms: Serial | None


class CallsRow(NamedTuple):
    request_id: Name
    kind: Name
    provider: Name
    pool: Name | None
    n: Count  # the column ``count`` (a tuple has a method of that name)
    token: Serial
    incarnation: Name
    started_at: Time
    finished_at: Time | None
    outcome: Name
    instance_ids: InstanceIds
    detail: Detail


class MonthCost(NamedTuple):
    instance_id: Name
    usd: Usd


class Time1(NamedTuple):
    at: Time | None


class Serial1(NamedTuple):
    value: Serial


def insane_time(column: str) -> str:
    """A condition true of a time that is not a finite number in range: text or a blob in
    SQLite, NaN or infinity in either. A period's filter selects such rows too, so that
    parsing refuses them instead of a comparison leaving them out unseen."""
    return f"NOT ({column} BETWEEN {EARLIEST_TIME!r} AND {LATEST_TIME!r})"


def columns(row: type[tuple[Any, ...]]) -> str:
    """The SELECT list for a row type."""
    fields: tuple[str, ...] = row._fields  # type: ignore[attr-defined]
    return ", ".join("count" if name == "n" else name for name in fields)


def tick_figure_columns(version: int) -> str:
    """``TickFigures``' SELECT list for a journal of ``version``: one written before version 2
    has no on-prem idle column, and its ticks read as not knowing the figure."""
    names = columns(TickFigures)
    if version >= 2:
        return names
    return names.replace("onprem_idle_gpu_s", "NULL AS onprem_idle_gpu_s")


R = TypeVar("R", bound=tuple[Any, ...])
_ADAPTERS: dict[type, TypeAdapter[Any]] = {}


def parse_rows(row: type[R], table: str, rows: Sequence[Sequence[Any]]) -> list[R]:
    """``rows`` as ``row``s, or a ``RowError`` naming the first bad one's table, key and
    column, and what was expected."""
    adapter = _ADAPTERS.get(row)
    if adapter is None:
        adapter = _ADAPTERS[row] = TypeAdapter(list[row])  # type: ignore[valid-type]
    try:
        parsed: list[R] = adapter.validate_python([tuple(r) for r in rows])
    except ValidationError as exc:
        raise RowError(_describe(exc, row, table, rows)) from None
    for item in parsed:
        _check_order(item, table)
    return parsed


def _describe(exc: ValidationError, row: type, table: str, rows: Sequence[Sequence[Any]]) -> str:
    error = exc.errors(include_url=False)[0]
    loc = error["loc"]
    index = int(loc[0]) if loc and isinstance(loc[0], int) else 0
    fields: tuple[str, ...] = row._fields  # type: ignore[attr-defined]
    column_index = int(loc[1]) if len(loc) > 1 and isinstance(loc[1], int) else None
    column = fields[column_index] if column_index is not None else "?"
    value = rows[index][column_index] if column_index is not None else None
    return (
        f"{table} row {_key(rows[index], fields)}: {column}: {error['msg']} (found {_shown(value)})"
    )


def _key(raw: Sequence[Any], fields: tuple[str, ...]) -> str:
    for key in ("id", "request_id", "instance_id", "node", "team"):
        if key in fields:
            return f"{key} {_shown(raw[fields.index(key)])}"
    return "?"


def _shown(value: Any) -> str:
    """A value for a one-line message: its repr, cut short (it may be 70,000 characters)."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _check_order(item: Any, table: str) -> None:
    first, last = getattr(item, "first_at", None), getattr(item, "last_at", None)
    if first is not None and last is not None and first > last:
        fields: tuple[str, ...] = item._fields
        raise RowError(
            f"{table} row {_key(item, fields)}: first_at {first!r} is after last_at {last!r}"
        )


def schema_version(value: Any) -> int:
    """``journal_meta``'s schema_version: a whole number this version of the code can read."""
    if not (isinstance(value, str) and value.isascii() and value.isdigit() and len(value) < 10):
        raise RowError(f"journal_meta schema_version is {_shown(value)}, not a version number")
    version = int(value)
    if version < 1:
        raise RowError(f"journal_meta schema_version is {version}, not a version number")
    if version > SCHEMA_VERSION:
        raise RowError(
            f"the journal's schema version {version} is newer than this version of "
            f"gpu-autoscaler reads ({SCHEMA_VERSION}); upgrade gpu-autoscaler"
        )
    return version
