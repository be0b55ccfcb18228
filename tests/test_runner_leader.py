"""The run loop under a leader lock: a standby never ticks, a leader acts under its fencing token,
and a lock lost mid-tick stops the tick's actions before the next cloud call."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from fakes import job, pool, rig
from waits import bound

from autoscaler.app.runner import Runner
from autoscaler.model.records import LeadershipLost
from autoscaler.ops.health import Readiness
from autoscaler.ops.journal.base import open_sqlite


class ScriptedLock:
    """A lock whose holder the test decides; ``check`` fails for any token but the current."""

    identity = "test"
    lease_seconds = 0.3

    def __init__(self) -> None:
        self.token: int | None = None
        self.released = False

    def acquire(self) -> int | None:
        return self.token

    def check(self, token: int) -> None:
        if token != self.token:
            raise LeadershipLost(f"token {token} is stale")

    def release(self) -> None:
        self.released = True


def test_a_lock_lost_mid_tick_stops_the_next_cloud_call(tmp_path: Path) -> None:
    lock = ScriptedLock()
    lock.token = 7
    journal = open_sqlite(tmp_path / "j.db")
    t = rig([pool("a"), pool("b")], {"a": 1.0, "b": 2.0}, journal=journal, fence=lock.check)
    t.controller.token = 7
    t.cloud.capacity = {"a": 1}
    launch = t.cloud.launch

    def deposed_after_first(*args, **kwargs):  # type: ignore[no-untyped-def]
        result = launch(*args, **kwargs)
        lock.token = 8  # another replica took over while this call was in flight
        return result

    t.cloud.launch = deposed_after_first  # type: ignore[method-assign]
    t.queue.jobs = [job(f"j{i}") for i in range(3)]
    with pytest.raises(LeadershipLost):
        t.controller.tick()
    assert len(t.cloud.launch_calls) == 1, "the fallback launch never went out"
    assert [c.token for c in journal.calls()] == [7]


def test_a_standby_never_ticks_and_takes_over_when_the_lock_is_free() -> None:
    lock = ScriptedLock()
    t = rig([pool("a")], {"a": 1.0}, fence=lock.check)
    t.controller.config = t.controller.config.model_copy(update={"tick_seconds": 0.05})
    t.queue.jobs = [job("x")]
    readiness = Readiness(0.05)
    runner = Runner(t.controller, {}, lock=lock, readiness=readiness)
    loop = threading.Thread(target=runner.run, daemon=True)
    loop.start()
    try:
        time.sleep(0.5)
        assert t.controller.ticks == 0 and t.cloud.launch_calls == []
        assert readiness.status()[1]["leader"] is False
        lock.token = 3
        deadline = time.monotonic() + bound(30)
        while not t.cloud.launch_calls and time.monotonic() < deadline:
            time.sleep(0.01)
        assert t.cloud.launch_calls, "the new leader acted"
        assert t.controller.token == 3
        # ready once a tick has finished recently: on a busy machine that may take a while
        deadline = time.monotonic() + bound(30)
        ready, detail = readiness.status()
        while not ready and time.monotonic() < deadline:
            time.sleep(0.01)
            ready, detail = readiness.status()
        assert ready, detail
        lock.token = None
        deadline = time.monotonic() + bound(30)
        while readiness.status()[1]["leader"] and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.2)  # a tick in flight when the lock went away ends
        ticks = t.controller.ticks
        time.sleep(0.3)
        assert t.controller.ticks == ticks, "stood down: no more ticks"
        assert readiness.status()[1]["leader"] is False
    finally:
        runner.stop()
        loop.join(bound(30))
    assert not loop.is_alive()
