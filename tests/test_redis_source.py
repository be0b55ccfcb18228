"""The Redis queue source against a real redis-server: lists, streams, consumer groups, auth,
and every way Redis can fail turning into one SourceError line."""

from __future__ import annotations

import logging
import uuid
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from redis_server import RedisServer, _started, free_port

from autoscaler.errors import InputError
from autoscaler.model import DemandGroup
from autoscaler.sources import QueueSource, SourceError
from autoscaler.sources.redis_queue import RedisQueueSource

NOW = 1_800_000_000.0


def source(server: RedisServer | str, key: str, **extra: Any) -> RedisQueueSource:
    url = server if isinstance(server, str) else server.url
    return RedisQueueSource.from_config({"url": url, "key": key, **extra}, "work")


def fresh_key() -> str:
    return f"q-{uuid.uuid4().hex}"


def test_a_list_is_items_times_gpus_per_item_waiting_since_now(redis_server: RedisServer) -> None:
    key = fresh_key()
    redis_server.client().rpush(key, *[f"job-{i}" for i in range(5)])
    queue = source(redis_server, key, gpus_per_item=2, checkpoint_interval_s=600, partition="train")
    assert isinstance(queue, QueueSource)
    assert queue.read(NOW) == [
        DemandGroup(
            gpus_per_job=2,
            jobs=5,
            checkpoint_interval_s=600,
            partition="train",
            oldest_submit_time=NOW,
        )
    ]


def test_an_empty_or_absent_list_is_real_zero_demand(redis_server: RedisServer) -> None:
    assert source(redis_server, fresh_key()).read(NOW) == []


def test_a_stream_counts_its_entries_and_ages_from_the_oldest_id(
    redis_server: RedisServer,
) -> None:
    key = fresh_key()
    client = redis_server.client()
    for offset_ms in (0, 1500, 90_000):
        client.xadd(key, {"job": "x"}, id=f"{1_700_000_000_000 + offset_ms}-0")
    (group,) = source(redis_server, key, mode="stream", high_priority=True).read(NOW)
    assert (group.jobs, group.gpus, group.high_priority) == (3, 3, True)
    assert group.oldest_submit_time == 1_700_000_000.0


def test_a_stream_entry_stamped_in_the_future_ages_from_now(redis_server: RedisServer) -> None:
    key = fresh_key()
    redis_server.client().xadd(key, {"job": "x"}, id=f"{int(NOW * 1000) + 60_000}-0")
    (group,) = source(redis_server, key, mode="stream").read(NOW)
    assert group.oldest_submit_time == NOW


def test_a_consumer_groups_backlog_is_pending_plus_lag(redis_server: RedisServer) -> None:
    key = fresh_key()
    client = redis_server.client()
    ids = [client.xadd(key, {"n": i}, id=f"{1_700_000_000_000 + i * 1000}-0") for i in range(5)]
    client.xgroup_create(key, "workers", id="0")
    queue = source(redis_server, key, mode="pending", group="workers", gpus_per_item=4)

    (untouched,) = queue.read(NOW)
    assert (untouched.jobs, untouched.oldest_submit_time) == (5, 1_700_000_000.0)

    client.xreadgroup("workers", "w1", {key: ">"}, count=2)
    (delivered,) = queue.read(NOW)
    assert (delivered.jobs, delivered.gpus) == (5, 20)
    assert delivered.oldest_submit_time == 1_700_000_000.0

    client.xack(key, "workers", ids[0], ids[1])
    (acked,) = queue.read(NOW)
    assert (acked.jobs, acked.oldest_submit_time) == (3, 1_700_000_002.0)

    client.xreadgroup("workers", "w1", {key: ">"})
    client.xack(key, "workers", *ids[2:])
    assert queue.read(NOW) == []


def test_when_redis_cannot_tell_the_lag_the_undelivered_entries_are_counted(
    redis_server: RedisServer,
) -> None:
    key = fresh_key()
    client = redis_server.client()
    ids = [client.xadd(key, {"n": i}, id=f"{1_700_000_000_000 + i}-0") for i in range(2500)]
    client.xgroup_create(key, "late", id=ids[1])
    client.xdel(key, ids[3])
    (group,) = source(redis_server, key, mode="pending", group="late").read(NOW)
    assert group.jobs == 2500 - 2 - 1
    assert group.oldest_submit_time == 1_700_000_000.002


def test_a_missing_consumer_group_fails_naming_it(redis_server: RedisServer) -> None:
    key = fresh_key()
    redis_server.client().xadd(key, {"n": 1})
    with pytest.raises(SourceError) as failure:
        source(redis_server, key, mode="pending", group="nobody").read(NOW)
    message = str(failure.value)
    assert "'work'" in message and key in message and "'nobody' does not exist" in message
    assert "\n" not in message


def test_pending_mode_on_an_absent_stream_fails(redis_server: RedisServer) -> None:
    with pytest.raises(SourceError, match="no such key"):
        source(redis_server, fresh_key(), mode="pending", group="g").read(NOW)


@pytest.mark.parametrize(
    ("mode", "expected"), [("list", "holds a string, not a list"), ("stream", "not a stream")]
)
def test_a_key_of_the_wrong_type_fails_with_wrongtype(
    redis_server: RedisServer, mode: str, expected: str
) -> None:
    key = fresh_key()
    redis_server.client().set(key, "not a queue")
    with pytest.raises(SourceError, match=expected) as failure:
        source(redis_server, key, mode=mode).read(NOW)
    assert "WRONGTYPE" in str(failure.value)


def test_a_port_nothing_listens_on_fails_in_one_line() -> None:
    url = f"redis://127.0.0.1:{free_port()}/0"
    with pytest.raises(SourceError) as failure:
        source(url, "jobs").read(NOW)
    message = str(failure.value)
    assert message.startswith("redis source 'work' (key 'jobs' at 127.0.0.1:")
    assert "cannot connect" in message and "\n" not in message


def test_a_server_that_stops_fails_the_read_and_is_read_again_once_back(tmp_path: Path) -> None:
    server = _started(tmp_path, None)
    try:
        key = fresh_key()
        server.client().rpush(key, "a", "b")
        queue = source(server, key)
        assert queue.read(NOW)[0].jobs == 2
        server.stop()
        with pytest.raises(SourceError, match="cannot connect"):
            queue.read(NOW)
        server.start()
        assert queue.read(NOW) == []
        server.client().rpush(key, "c")
        assert queue.read(NOW)[0].jobs == 1
    finally:
        server.stop()


def test_a_server_that_does_not_answer_in_time_fails_with_a_timeout(
    redis_server: RedisServer,
) -> None:
    queue = source(redis_server, fresh_key(), socket_timeout_s=0.2)
    queue.read(NOW)
    redis_server.client().client_pause(700, all=True)
    with pytest.raises(SourceError, match=r"timed out after 0\.2s"):
        queue.read(NOW)


def test_the_password_comes_from_the_named_variable(
    redis_password_server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert redis_password_server.password is not None
    monkeypatch.setenv("WORK_REDIS_PASSWORD", redis_password_server.password)
    key = fresh_key()
    redis_password_server.client().rpush(key, "a", "b", "c")
    queue = source(redis_password_server, key, password_env="WORK_REDIS_PASSWORD")
    assert queue.read(NOW)[0].jobs == 3


def test_a_wrong_password_fails_without_showing_it(
    redis_password_server: RedisServer,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    wrong = "not-the-Password-77"
    monkeypatch.setenv("WORK_REDIS_PASSWORD", wrong)
    caplog.set_level(logging.DEBUG)
    queue = source(redis_password_server, "jobs", password_env="WORK_REDIS_PASSWORD")
    with pytest.raises(SourceError, match="authentication failed") as failure:
        queue.read(NOW)
    assert wrong not in str(failure.value)
    assert wrong not in caplog.text
    assert redis_password_server.password not in str(failure.value)


def test_no_password_against_a_server_that_wants_one_says_so(
    redis_password_server: RedisServer,
) -> None:
    with pytest.raises(SourceError, match="authentication"):
        source(redis_password_server, "jobs").read(NOW)


def test_an_unset_password_variable_is_named(
    redis_password_server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("NO_SUCH_REDIS_PASSWORD", raising=False)
    queue = source(redis_password_server, "jobs", password_env="NO_SUCH_REDIS_PASSWORD")
    with pytest.raises(SourceError, match=r"NO_SUCH_REDIS_PASSWORD \(password_env\) is not set"):
        queue.read(NOW)


@pytest.mark.parametrize(
    ("extra", "field", "complaint"),
    [
        ({"mode": "pending"}, "sources.work", "set 'group'"),
        ({"mode": "list", "group": "g"}, "sources.work", "only by mode 'pending'"),
        ({"url": "redis://:hunter2@127.0.0.1:6379/0"}, "sources.work", "password_env"),
        ({"url": "http://127.0.0.1:6379"}, "sources.work.url", ""),
        ({"mode": "set"}, "sources.work.mode", ""),
        ({"gpus_per_item": 0}, "sources.work.gpus_per_item", ""),
    ],
)
def test_settings_errors_name_the_field(extra: dict[str, Any], field: str, complaint: str) -> None:
    block = {"url": "redis://127.0.0.1:6379/0", "key": "jobs", **extra}
    with pytest.raises(InputError) as failure:
        RedisQueueSource.from_config(block, "work")
    assert failure.value.field == field
    assert complaint in failure.value.message
    assert "hunter2" not in str(failure.value)


@settings(max_examples=25, deadline=None)
@given(
    pushes=st.lists(st.integers(min_value=0, max_value=40), min_size=1, max_size=4),
    pops=st.integers(min_value=0, max_value=60),
    gpus=st.integers(min_value=1, max_value=8),
)
def test_list_demand_is_always_what_is_left_times_gpus_per_item(
    redis_server: RedisServer, pushes: list[int], pops: int, gpus: int
) -> None:
    key = fresh_key()
    client = redis_server.client()
    for count in pushes:
        if count:
            client.rpush(key, *range(count))
    for _ in range(pops):
        client.lpop(key)
    left = max(0, sum(pushes) - pops)
    groups = source(redis_server, key, gpus_per_item=gpus).read(NOW)
    assert sum(g.gpus for g in groups) == left * gpus
    assert all(g.jobs > 0 for g in groups)
