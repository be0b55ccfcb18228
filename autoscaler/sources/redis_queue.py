"""A Redis list or stream as a queue source: every waiting item is a job of ``gpus_per_item`` GPUs
(of the settings' shape: nodes, GPU models, GPU memory), or of the shape the item states.

Three ways to count, as KEDA's Redis scalers do:

* ``list``: ``LLEN`` of a work list (producers ``LPUSH``, workers ``BRPOP``);
* ``stream``: ``XLEN`` of a stream whose workers delete (``XDEL``) or trim what they finished;
* ``pending``: a consumer group's backlog, which is the entries delivered but not yet
  acknowledged (they hold their GPUs) plus the group's lag, the entries not yet delivered at all
  (they are waiting work too, so leaving them out would read a flood of new work as zero).

Stream entry IDs made by ``XADD *`` start with their millisecond timestamp, so a stream's oldest
waiting entry says how long work has waited; a list carries no such time and reads as "now".

With ``item_shapes``, the waiting items are read too (``LRANGE``/``XRANGE``, which take nothing
from the workers), and an item that is a JSON object, or a stream entry, with shape fields
(``autoscaler.spi.job_shape``) is a job of that shape. Reading costs a round trip per
thousand items, so at most ``max_items_read`` are read a tick (the oldest); the rest count with
the settings' shape. An item whose shape fields are wrong is left out of demand and logged: a
shape we cannot read cannot be launched for, and one bad producer must not hide everyone's work.

The password never travels in the URL or the settings: ``password_env`` names an environment
variable holding it, and it is scrubbed from every error this source raises.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from enum import StrEnum
from typing import TYPE_CHECKING, Any, NamedTuple
from urllib.parse import urlsplit

from pydantic import Field, PositiveFloat, PositiveInt, model_validator

from autoscaler.model import DemandGroup, Name
from autoscaler.model.errors import SourceError
from autoscaler.model.inputfile import validate_settings
from autoscaler.model.optional import require_extra
from autoscaler.model.secrets import read_secret_env
from autoscaler.spi.job_shape import (
    BadShapeError,
    JobShape,
    ShapeReader,
    ShapeSettings,
    json_item_fields,
)
from autoscaler.spi.sources import GroupKey, groups_from_counts

if TYPE_CHECKING:
    import redis


class RedisMode(StrEnum):
    LIST = "list"
    STREAM = "stream"
    PENDING = "pending"


log = logging.getLogger(__name__)
PAGE = 1000
SHOWN_MALFORMED = 3


class RedisQueueSettings(ShapeSettings):
    gpus_field = "gpus_per_item"

    url: str = Field(
        pattern=r"^(redis|rediss|unix)://",
        description="redis://host:port/db, rediss:// for TLS, or unix:///path?db=0; no password",
    )
    key: str = Field(min_length=1)
    mode: RedisMode = RedisMode.LIST
    group: str | None = Field(None, min_length=1, description="consumer group (mode pending)")
    gpus_per_item: PositiveInt = 1
    checkpoint_interval_s: float | None = Field(
        None, gt=0, description="how often the work behind an item checkpoints; unset: never"
    )
    high_priority: bool = False
    partition: str | None = Field(None, description="the partition label the demand carries")
    team: Name | None = Field(
        None,
        description="the team this key's work is counted under (the config's teams): a key "
        "is one team's queue, since a list or stream says nothing of whose its items are; "
        "unset: no team",
    )
    password_env: str | None = Field(
        None, min_length=1, description="NAME of the environment variable holding the password"
    )
    socket_timeout_s: PositiveFloat = 2.0
    item_shapes: bool = Field(
        False, description="read each waiting item's own shape fields (JSON object, entry fields)"
    )
    max_items_read: PositiveInt = Field(
        10_000, le=1_000_000, description="items whose shape is read per tick; the rest: settings'"
    )

    @model_validator(mode="after")
    def _group_matches_mode(self) -> RedisQueueSettings:
        if self.mode is RedisMode.PENDING and self.group is None:
            raise ValueError("mode 'pending' counts a consumer group's backlog: set 'group'")
        if self.mode is not RedisMode.PENDING and self.group is not None:
            raise ValueError(f"'group' is used only by mode 'pending', not {self.mode.value!r}")
        if urlsplit(self.url).password is not None:
            raise ValueError("url must not carry a password: name its variable in password_env")
        return self


class RedisQueueSource:
    Settings = RedisQueueSettings  # what its ``settings`` hold (``gpu-autoscaler schema``)

    def __init__(self, settings: RedisQueueSettings, name: str) -> None:
        self.settings = settings
        self.name = name
        self._client: redis.Redis | None = None
        self._password: str | None = None
        self._default = settings.job_shape()
        self._shapes = ShapeReader(self._default)
        self.malformed_items = 0
        self._last_complaint = ""

    @classmethod
    def from_config(cls, settings: Mapping[str, Any], name: str) -> RedisQueueSource:
        parsed = validate_settings(RedisQueueSettings, dict(settings), field=f"sources.{name}")
        # said at the start, not as a failing read on every tick
        require_extra("the redis source", "redis", ("redis",), field=f"sources.{name}")
        return cls(parsed, name)

    def read(self, now: float) -> Sequence[DemandGroup]:
        try:
            client = self._connect()
            if self.settings.item_shapes:
                return self._read_shapes(client, now)
            items, oldest = self._count(client)
        except SourceError:
            raise
        except Exception as exc:
            raise self._failure(self._explain(exc)) from None
        if items == 0:
            return []
        return self._groups({self._default: items}, {self._default: oldest}, now)

    def _groups(
        self, counts: Mapping[JobShape, int], oldest: Mapping[JobShape, float | None], now: float
    ) -> list[DemandGroup]:
        settings = self.settings
        keyed: dict[GroupKey, int] = {}
        since: dict[GroupKey, float] = {}
        for shape, count in counts.items():
            if count <= 0:
                continue
            key = GroupKey(
                shape.gpus,
                settings.checkpoint_interval_s,
                settings.high_priority,
                shape.gpu_models,
                settings.partition,
                shape.nodes,
                shape.min_gpu_memory_gib,
                settings.team,
            )
            keyed[key] = count
            first = oldest.get(shape)
            since[key] = now if first is None else min(first, now)
        return groups_from_counts(keyed, since)

    def _read_shapes(self, client: redis.Redis, now: float) -> list[DemandGroup]:
        """Demand by the shapes the waiting items state (the oldest ``max_items_read``); items
        not read count with the settings' shape, malformed ones not at all."""
        total, items, first = self._waiting_items(client)
        counts: dict[JobShape, int] = {}
        oldest: dict[JobShape, float | None] = {}
        malformed: list[str] = []
        for item in items:
            try:
                shape = self._default if item.fields is None else self._shapes.shape(item.fields)
            except BadShapeError as exc:
                malformed.append(f"{item.where}: {exc}")
                continue
            counts[shape] = counts.get(shape, 0) + 1
            oldest[shape] = _earlier(oldest.get(shape), item.submitted)
        unread = max(0, total - len(items))
        if unread:
            counts[self._default] = counts.get(self._default, 0) + unread
            oldest[self._default] = _earlier(oldest.get(self._default), first)
        self._report_malformed(malformed)
        return self._groups(counts, oldest, now)

    def _report_malformed(self, malformed: list[str]) -> None:
        """Malformed items are counted in ``malformed_items`` every read, and logged when what is
        malformed changes (not every tick for the same items)."""
        self.malformed_items = len(malformed)
        complaint = "; ".join(malformed[:SHOWN_MALFORMED])
        if malformed and complaint != self._last_complaint:
            more = len(malformed) - SHOWN_MALFORMED
            log.warning(
                "%s: %d item(s) with a shape that cannot be read, left out of demand: %s%s",
                self._where(),
                len(malformed),
                complaint,
                f" (and {more} more)" if more > 0 else "",
            )
        self._last_complaint = complaint

    def _waiting_items(self, client: redis.Redis) -> tuple[int, list[_Item], float | None]:
        """How many items wait, the oldest of them with their fields, and the oldest submit time
        of all; one transaction for a list or a stream, so count and items agree."""
        key, most = self.settings.key, self.settings.max_items_read
        if self.settings.mode is RedisMode.LIST:
            pipe = client.pipeline(transaction=True)
            pipe.llen(key)
            pipe.lrange(key, -most, -1)
            length, raw = pipe.execute()
            items = [
                _Item(f"list item {index - len(raw)}", json_item_fields(str(value)), None)
                for index, value in enumerate(raw)
            ]
            return int(length), items, None
        if self.settings.mode is RedisMode.STREAM:
            pipe = client.pipeline(transaction=True)
            pipe.xlen(key)
            pipe.xrange(key, "-", "+", count=most)
            length, entries = pipe.execute()
            items = _entry_items(entries)
            return int(length), items, items[0].submitted if items else None
        total, first = self._backlog(client)
        return total, self._backlog_items(client, most), first

    def _backlog_items(self, client: redis.Redis, most: int) -> list[_Item]:
        """The consumer group's pending entries (oldest first), then its undelivered ones. A
        pending entry deleted from the stream has no fields left and is not among them."""
        key, group = self.settings.key, self.settings.group
        assert group is not None
        pending = client.xpending_range(key, group, min="-", max="+", count=most)
        pipe = client.pipeline(transaction=False)
        for entry in pending:
            entry_id = str(entry["message_id"])
            pipe.xrange(key, entry_id, entry_id, count=1)
        items = [item for found in pipe.execute() for item in _entry_items(found)]
        left = most - len(pending)
        info = next((g for g in client.xinfo_groups(key) if g.get("name") == group), None)
        after = f"({info['last-delivered-id']}" if info else None
        while left > 0 and after is not None:
            entries = client.xrange(key, after, "+", count=min(PAGE, left)) or []
            items.extend(_entry_items(entries))
            left -= len(entries)
            after = f"({entries[-1][0]!s}" if len(entries) == PAGE else None
        return items

    def _connect(self) -> redis.Redis:
        if self._client is None:
            import redis
            from redis.backoff import NoBackoff
            from redis.retry import Retry

            self._password = self._read_password()
            timeout = self.settings.socket_timeout_s
            self._client = redis.Redis.from_url(
                self.settings.url,
                password=self._password,
                socket_timeout=timeout,
                socket_connect_timeout=timeout,
                decode_responses=True,
                retry=Retry(NoBackoff(), 1, supported_errors=(redis.ConnectionError,)),
            )
        return self._client

    def _read_password(self) -> str | None:
        variable = self.settings.password_env
        if variable is None:
            return None
        password = read_secret_env(variable, self._where(), "password_env")
        if not password:
            raise self._failure(f"environment variable {variable} (password_env) is not set")
        return password

    def _count(self, client: redis.Redis) -> tuple[int, float | None]:
        """Waiting items and the submit time of the oldest, when the entries carry one."""
        key = self.settings.key
        if self.settings.mode is RedisMode.LIST:
            return int(client.llen(key)), None
        if self.settings.mode is RedisMode.STREAM:
            pipe = client.pipeline(transaction=False)
            pipe.xlen(key)
            pipe.xrange(key, "-", "+", count=1)
            length, first = pipe.execute()
            return int(length), _oldest_time(first)
        return self._backlog(client)

    def _backlog(self, client: redis.Redis) -> tuple[int, float | None]:
        key, group = self.settings.key, self.settings.group
        assert group is not None
        info = next((g for g in client.xinfo_groups(key) if g.get("name") == group), None)
        if info is None:
            raise self._failure(f"consumer group {group!r} does not exist")
        pending = int(info["pending"])
        last_delivered = str(info["last-delivered-id"])
        lag = info.get("lag")
        if lag is None:
            lag = self._undelivered(client, last_delivered)
        oldest: float | None = None
        if pending:
            summary = client.xpending(key, group)
            if summary.get("min"):
                oldest = _entry_time(str(summary["min"]))
        if oldest is None and int(lag):
            oldest = _oldest_time(client.xrange(key, f"({last_delivered}", "+", count=1))
        return pending + int(lag), oldest

    def _undelivered(self, client: redis.Redis, last_delivered: str) -> int:
        """Redis reports no lag after entries were deleted from the middle of a stream; count the
        entries after the group's last delivered one instead, a page at a time."""
        counted, start = 0, f"({last_delivered}"
        while True:
            page = _entry_ids(client.xrange(self.settings.key, start, "+", count=1000))
            counted += len(page)
            if len(page) < 1000:
                return counted
            start = f"({page[-1]}"

    def _explain(self, exc: Exception) -> str:
        import redis

        text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        auth_failed = isinstance(exc, redis.AuthenticationError) or (
            isinstance(exc, redis.ResponseError) and "NOAUTH" in text
        )
        if auth_failed and self._password is None:
            return "authentication required: name the password's variable in password_env"
        if auth_failed or isinstance(exc, redis.exceptions.NoPermissionError):
            return f"authentication failed ({self._scrub(text)})"
        if isinstance(exc, redis.TimeoutError):
            return f"timed out after {self.settings.socket_timeout_s:g}s ({self._scrub(text)})"
        if isinstance(exc, redis.ConnectionError):
            return f"cannot connect ({self._scrub(text)})"
        if isinstance(exc, redis.ResponseError) and "WRONGTYPE" in text:
            return f"key holds a {self._kind()}, not a {self._expected_kind()} (WRONGTYPE)"
        if isinstance(exc, redis.ResponseError) and text == "no such key":
            return f"no such key (mode {self.settings.mode.value} needs an existing stream)"
        return f"{type(exc).__name__}: {self._scrub(text)}"

    def _kind(self) -> str:
        try:
            return str(self._connect().type(self.settings.key))
        except Exception:
            return "value of another type"

    def _expected_kind(self) -> str:
        return "list" if self.settings.mode is RedisMode.LIST else "stream"

    def _scrub(self, text: str) -> str:
        return text.replace(self._password, "***") if self._password else text

    def _where(self) -> str:
        where = urlsplit(self.settings.url)
        place = f"{where.hostname or where.path}{':' + str(where.port) if where.port else ''}"
        return f"redis source {self.name!r} (key {self.settings.key!r} at {place})"

    def _failure(self, what: str) -> SourceError:
        return SourceError(f"{self._where()}: {what}")


class _Item(NamedTuple):
    """A waiting item as read for its shape: where it is (for a log line), its fields (None: a
    payload without shape fields), and its submit time when its ID carries one."""

    where: str
    fields: Mapping[str, Any] | None
    submitted: float | None


def _entry_items(entries: Sequence[tuple[Any, Any]] | None) -> list[_Item]:
    return [
        _Item(f"entry {entry_id}", fields or None, _entry_time(str(entry_id)))
        for entry_id, fields in entries or ()
    ]


def _earlier(a: float | None, b: float | None) -> float | None:
    if a is None:
        return b
    return a if b is None else min(a, b)


def _entry_ids(entries: Sequence[tuple[Any, Any]] | None) -> list[str]:
    return [str(entry_id) for entry_id, _ in entries or ()]


def _oldest_time(entries: Sequence[tuple[Any, Any]] | None) -> float | None:
    ids = _entry_ids(entries)
    return _entry_time(ids[0]) if ids else None


def _entry_time(entry_id: str) -> float | None:
    """The submit time an auto-generated stream ID carries (its millisecond part)."""
    millis, _, _ = entry_id.partition("-")
    return int(millis) / 1000.0 if millis.isdigit() else None
