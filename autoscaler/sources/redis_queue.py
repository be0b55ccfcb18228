"""A Redis list or stream as a queue source: every waiting item is a job of ``gpus_per_item`` GPUs.

Three ways to count, as KEDA's Redis scalers do:

* ``list``: ``LLEN`` of a work list (producers ``LPUSH``, workers ``BRPOP``);
* ``stream``: ``XLEN`` of a stream whose workers delete (``XDEL``) or trim what they finished;
* ``pending``: a consumer group's backlog, which is the entries delivered but not yet
  acknowledged (they hold their GPUs) plus the group's lag, the entries not yet delivered at all
  (they are waiting work too, so leaving them out would read a flood of new work as zero).

Stream entry IDs made by ``XADD *`` start with their millisecond timestamp, so a stream's oldest
waiting entry says how long work has waited; a list carries no such time and reads as "now".

The password never travels in the URL or the settings: ``password_env`` names an environment
variable holding it, and it is scrubbed from every error this source raises.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from enum import StrEnum
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, PositiveFloat, PositiveInt, model_validator

from autoscaler.inputfile import validate_settings
from autoscaler.model import DemandGroup
from autoscaler.sources import SourceError

if TYPE_CHECKING:
    import redis


class RedisMode(StrEnum):
    LIST = "list"
    STREAM = "stream"
    PENDING = "pending"


class RedisQueueSettings(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

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
    password_env: str | None = Field(
        None, min_length=1, description="NAME of the environment variable holding the password"
    )
    socket_timeout_s: PositiveFloat = 2.0

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
    def __init__(self, settings: RedisQueueSettings, name: str) -> None:
        self.settings = settings
        self.name = name
        self._client: redis.Redis | None = None
        self._password: str | None = None

    @classmethod
    def from_config(cls, settings: Mapping[str, Any], name: str) -> RedisQueueSource:
        parsed = validate_settings(RedisQueueSettings, dict(settings), field=f"sources.{name}")
        return cls(parsed, name)

    def read(self, now: float) -> Sequence[DemandGroup]:
        try:
            items, oldest = self._count(self._connect())
        except SourceError:
            raise
        except Exception as exc:
            raise self._failure(self._explain(exc)) from None
        if items == 0:
            return []
        return [
            DemandGroup(
                gpus_per_job=self.settings.gpus_per_item,
                jobs=items,
                checkpoint_interval_s=self.settings.checkpoint_interval_s,
                high_priority=self.settings.high_priority,
                partition=self.settings.partition,
                oldest_submit_time=now if oldest is None else min(oldest, now),
            )
        ]

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
        password = os.environ.get(variable)
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

    def _failure(self, what: str) -> SourceError:
        where = urlsplit(self.settings.url)
        place = f"{where.hostname or where.path}{':' + str(where.port) if where.port else ''}"
        return SourceError(
            f"redis source {self.name!r} (key {self.settings.key!r} at {place}): {what}"
        )


def _entry_ids(entries: Sequence[tuple[Any, Any]] | None) -> list[str]:
    return [str(entry_id) for entry_id, _ in entries or ()]


def _oldest_time(entries: Sequence[tuple[Any, Any]] | None) -> float | None:
    ids = _entry_ids(entries)
    return _entry_time(ids[0]) if ids else None


def _entry_time(entry_id: str) -> float | None:
    """The submit time an auto-generated stream ID carries (its millisecond part)."""
    millis, _, _ = entry_id.partition("-")
    return int(millis) / 1000.0 if millis.isdigit() else None
