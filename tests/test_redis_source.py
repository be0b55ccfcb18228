"""The Redis queue source against a real redis-server: lists, streams, consumer groups, auth,
and every way Redis can fail turning into one SourceError line."""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from redis_server import RedisServer, _started, free_port

from autoscaler.model import DemandGroup
from autoscaler.model.errors import InputError, SourceError
from autoscaler.sources.redis_queue import RedisQueueSource
from autoscaler.spi.sources import QueueSource

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
        ({"gpus_per_item": 6, "nodes": 4}, "sources.work", "multiple of nodes (4)"),
        ({"gpu_models": "A100"}, "sources.work.gpu_models", ""),
        ({"max_items_read": 0}, "sources.work.max_items_read", ""),
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


def _shapes(groups: Sequence[DemandGroup]) -> dict[tuple[Any, ...], int]:
    return {(g.gpus_per_job, g.nodes, g.gpu_models, g.min_gpu_memory_gib): g.jobs for g in groups}


def test_the_settings_give_every_item_its_shape(redis_server: RedisServer) -> None:
    key = fresh_key()
    redis_server.client().rpush(key, *[f"job-{i}" for i in range(4)])
    shaped = source(
        redis_server,
        key,
        gpus_per_item=16,
        nodes=2,
        gpu_models=["H100", "A100-80GB"],
        min_gpu_memory_gib=80,
    )
    (group,) = shaped.read(NOW)
    assert (group.jobs, group.gpus_per_node, group.shape.gpus) == (4, 8, 8)
    assert _shapes([group]) == {(16, 2, ("A100-80GB", "H100"), 80.0): 4}


SHAPED_ITEMS = [
    '{"gpus": 8, "nodes": 2, "gpu_model": "H100"}',
    '{"gpus_per_node": 4, "nodes": 2, "gpu_models": ["h100", "a100"]}',
    '{"min_gpu_memory_gib": 80, "payload": "train.py"}',
    '{"nodes": 3}',
    "job-plain",
    '{"task": "no shape fields"}',
    '"a JSON string"',
    '{"gpus": "lots"}',
    '{"gpus": 6, "nodes": 4}',
    '{"gpu_model": "A100", "gpu_models": ["H100"]}',
]


def test_list_items_carry_their_own_shapes_and_bad_ones_are_left_out(
    redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    key = fresh_key()
    redis_server.client().lpush(key, *SHAPED_ITEMS)
    queue = source(redis_server, key, item_shapes=True, gpus_per_item=2, gpu_models=["A100"])

    with caplog.at_level(logging.WARNING):
        groups = queue.read(NOW)
        assert queue.read(NOW) == groups

    assert _shapes(groups) == {
        (8, 2, ("H100",), None): 1,
        (8, 2, ("a100", "h100"), None): 1,
        (2, 1, ("A100",), 80.0): 1,
        (6, 3, ("A100",), None): 1,
        (2, 1, ("A100",), None): 3,
    }
    assert all(g.oldest_submit_time == NOW for g in groups)
    assert queue.malformed_items == 3
    (warning,) = [r.getMessage() for r in caplog.records if "cannot be read" in r.getMessage()]
    assert warning.startswith(f"redis source 'work' (key '{key}' at 127.0.0.1:")
    assert "3 item(s) with a shape that cannot be read, left out of demand: list item" in warning
    assert "gpus 'lots' is not a whole number" in warning
    assert "gpus 6 is not a multiple of nodes 4" in warning
    assert "gives both gpu_model and gpu_models" in warning
    plain = source(redis_server, key, gpus_per_item=2).read(NOW)
    assert _shapes(plain) == {(2, 1, (), None): len(SHAPED_ITEMS)}, "off: counted as before"


def test_stream_entries_carry_shapes_and_each_shape_ages_from_its_oldest_entry(
    redis_server: RedisServer,
) -> None:
    key = fresh_key()
    client = redis_server.client()
    base = 1_700_000_000_000
    client.xadd(key, {"job": "a"}, id=f"{base}-0")
    client.xadd(key, {"gpus": "8", "nodes": "2", "gpu_models": "a100|h100"}, id=f"{base + 5000}-0")
    client.xadd(key, {"gpus": "8", "nodes": "2", "gpu_models": "h100,a100"}, id=f"{base + 9000}-0")
    client.xadd(key, {"min_gpu_memory_gib": "-4"}, id=f"{base + 9500}-0")

    groups = source(redis_server, key, mode="stream", item_shapes=True).read(NOW)

    by_shape = {(g.gpus_per_job, g.nodes, g.gpu_models): g for g in groups}
    assert set(by_shape) == {(1, 1, ()), (8, 2, ("a100", "h100"))}
    assert (by_shape[(1, 1, ())].jobs, by_shape[(1, 1, ())].oldest_submit_time) == (
        1,
        1_700_000_000.0,
    )
    gang = by_shape[(8, 2, ("a100", "h100"))]
    assert (gang.jobs, gang.oldest_submit_time) == (2, 1_700_000_005.0)


def test_a_consumer_groups_pending_and_undelivered_entries_carry_shapes(
    redis_server: RedisServer,
) -> None:
    key = fresh_key()
    client = redis_server.client()
    shapes = [{"gpus": "4"}, {"gpus": "8", "nodes": "2"}, {"job": "x"}, {"gpu_model": "H100"}]
    ids = [
        client.xadd(key, fields, id=f"{1_700_000_000_000 + i * 1000}-0")
        for i, fields in enumerate(shapes * 3)
    ]
    client.xgroup_create(key, "workers", id="0")
    client.xreadgroup("workers", "w1", {key: ">"}, count=5)
    client.xack(key, "workers", ids[0])
    client.xdel(key, ids[1])
    # pending: 1 (deleted), 2 plain, 3 H100, 4 gpus 4; undelivered: 5 (gpus 8 on 2 nodes) to 11

    groups = source(
        redis_server, key, mode="pending", group="workers", item_shapes=True, max_items_read=7
    ).read(NOW)

    assert sum(g.jobs for g in groups) == 12 - 1
    assert _shapes(groups) == {
        (4, 1, (), None): 1,
        (8, 2, (), None): 1,
        (1, 1, (), None): 2 + 5,
        (1, 1, ("H100",), None): 2,
    }, "pending 2-4 and undelivered 5-7 read (1 was deleted); the other 5 as the settings say"


def test_at_most_max_items_read_are_read_the_rest_have_the_settings_shape(
    redis_server: RedisServer,
) -> None:
    key = fresh_key()
    client = redis_server.client()
    client.lpush(key, *['{"gpus": 4}'] * 2500)
    client.lpush(key, *["plain"] * 10)
    read_some = source(redis_server, key, item_shapes=True, max_items_read=2000)
    assert _shapes(read_some.read(NOW)) == {(4, 1, (), None): 2000, (1, 1, (), None): 510}
    read_all = source(redis_server, key, item_shapes=True, max_items_read=5000)
    assert _shapes(read_all.read(NOW)) == {(4, 1, (), None): 2500, (1, 1, (), None): 10}


item_texts = st.one_of(
    st.sampled_from(SHAPED_ITEMS),
    st.builds(
        lambda gpus, nodes, models: json.dumps(
            {"gpus_per_node": gpus, "nodes": nodes, "gpu_models": models}
        ),
        st.integers(-2, 9),
        st.integers(-1, 5),
        st.lists(st.sampled_from(["a100", "h100", "", 7]), max_size=3),
    ),
    st.text(max_size=20),
)


@settings(max_examples=20, deadline=None)
@given(items=st.lists(item_texts, min_size=1, max_size=30))
def test_every_readable_item_is_counted_once_in_a_valid_group(
    redis_server: RedisServer, items: list[str]
) -> None:
    key = fresh_key()
    redis_server.client().rpush(key, *items)
    queue = source(redis_server, key, item_shapes=True, gpus_per_item=2, nodes=2)
    groups = queue.read(NOW)
    assert sum(g.jobs for g in groups) + queue.malformed_items == len(items)
    for group in groups:
        assert DemandGroup.model_validate(group.model_dump()) == group
        assert group.jobs > 0 and group.gpus_per_node * group.nodes == group.gpus_per_job
