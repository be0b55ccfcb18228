"""Notices cannot drive ticks (issue 15: 23,281 notices drove 44,840 ticks in about 200 s): a new
notice for an instance the controller owns wakes the loop at once; notices for instances it does
not own, repeats and checkpoint reports wake it at most once per interval, and a request inside
the interval is served when the interval ends, never dropped.

Counted by condition: wake-ups against a stepped clock, and ticks of the real run loop against
the measured length of a flood, never against a guessed duration."""

from __future__ import annotations

import itertools
import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable

from fakes import job, pool, rig
from waits import bound

from autoscaler.app.runner import Runner
from autoscaler.model import NoticeKind
from autoscaler.ops.inbox import InboxServer, NoticeInbox
from autoscaler.spi.wakeups import CHECKPOINT_WAKE_S, MAX_REMEMBERED, NOTICE_WAKE_S, Wakeups

TOKEN = "wake-test-token"


class Stepped:
    """A monotonic clock the test moves."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Timers:
    """The deferred wakes Wakeups arms, fired when the test says their time has come."""

    def __init__(self, clock: Stepped) -> None:
        self.clock = clock
        self.armed: list[tuple[float, Callable[[], None]]] = []

    def __call__(self, delay_s: float, action: Callable[[], None]) -> None:
        self.armed.append((self.clock.now + delay_s, action))

    def fire_due(self) -> int:
        due = [item for item in self.armed if item[0] <= self.clock.now]
        self.armed = [item for item in self.armed if item[0] > self.clock.now]
        for _, action in due:
            action()
        return len(due)


def gate(owned: set[str]) -> tuple[Wakeups, list[float], Stepped, Timers]:
    clock = Stepped()
    timers = Timers(clock)
    woken: list[float] = []
    wakeups = Wakeups(
        lambda: woken.append(clock.now),
        owns=owned.__contains__,
        monotonic=clock,
        schedule=timers,
    )
    return wakeups, woken, clock, timers


def test_a_flood_of_notices_for_other_instances_wakes_at_most_once_per_interval() -> None:
    wakeups, woken, clock, timers = gate({"i-mine"})
    started = clock.now
    for index in range(20_000):
        wakeups.notice(f"i-stranger-{index}", NoticeKind.TERMINATE)
        clock.now += 0.005
        timers.fire_due()
    span = clock.now - started
    assert len(woken) <= 1 + span / NOTICE_WAKE_S
    gaps = [later - earlier for earlier, later in itertools.pairwise(woken)]
    assert all(gap >= NOTICE_WAKE_S for gap in gaps)
    assert wakeups.tally.get("notice-wake", "at-once") == 0


def test_a_new_notice_for_an_owned_instance_wakes_at_once_even_mid_flood() -> None:
    wakeups, woken, _, _ = gate({"i-mine", "i-also-mine"})
    wakeups.notice("i-stranger", NoticeKind.TERMINATE)
    before = len(woken)
    for _ in range(100):
        wakeups.notice("i-stranger", NoticeKind.TERMINATE)
    assert len(woken) == before, "the stranger's repeats are inside the interval"
    assert wakeups.notice("i-mine", NoticeKind.TERMINATE) is True
    assert len(woken) == before + 1
    assert wakeups.notice("i-mine", NoticeKind.REBALANCE) is True, "another kind is news"
    assert wakeups.notice("i-also-mine", NoticeKind.TERMINATE) is True
    assert wakeups.tally.get("notice-wake", "at-once") == 3


def test_repeats_of_an_owned_notice_are_rate_limited_and_served_at_the_interval_end() -> None:
    wakeups, woken, clock, timers = gate({"i-mine"})
    assert wakeups.notice("i-mine", NoticeKind.TERMINATE) is True
    assert wakeups.notice("i-mine", NoticeKind.TERMINATE) is True, "first limited wake"
    for _ in range(50):
        assert wakeups.notice("i-mine", NoticeKind.TERMINATE) is False
    assert len(woken) == 2
    assert len(timers.armed) == 1, "one wake armed for the interval's end, not fifty"
    assert wakeups.due_in() == NOTICE_WAKE_S
    clock.now += NOTICE_WAKE_S
    assert timers.fire_due() == 1
    assert len(woken) == 3, "the deferred repeats got their tick"
    assert wakeups.due_in() is None


def test_a_tick_in_between_serves_the_deferred_request() -> None:
    wakeups, woken, clock, timers = gate(set())
    assert wakeups.notice("i-stranger", NoticeKind.TERMINATE) is True
    assert wakeups.notice("i-stranger", NoticeKind.TERMINATE) is False
    clock.now += 1.0
    wakeups.ticking()
    clock.now += NOTICE_WAKE_S
    timers.fire_due()
    assert len(woken) == 1, "the regular tick served it; no extra wake"


def test_checkpoint_reports_are_coalesced_not_dropped() -> None:
    wakeups, woken, clock, timers = gate(set())
    for _ in range(1000):
        wakeups.checkpoint()
        clock.now += 0.0005
        timers.fire_due()
    assert len(woken) == 1
    clock.now += CHECKPOINT_WAKE_S
    timers.fire_due()
    assert len(woken) == 2, "the reports after the first are served at the interval's end"


def test_what_it_remembers_is_bounded() -> None:
    owned: set[str] = set()
    wakeups, woken, _, _ = gate(owned)
    for index in range(MAX_REMEMBERED + 500):
        owned.add(f"i-{index}")
        wakeups.notice(f"i-{index}", NoticeKind.TERMINATE)
    assert len(woken) == MAX_REMEMBERED + 500, "every new owned instance woke the loop"
    assert len(wakeups._woken_for) <= MAX_REMEMBERED


def post(port: int, instance_id: str) -> int:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/notices",
        data=json.dumps({"instance_id": instance_id}).encode(),
        headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=bound(30)) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code


def test_the_run_loop_is_not_driven_by_a_flood_but_acts_on_a_real_notice_at_once() -> None:
    t = rig([pool("a")], {"a": 1.0})
    t.queue.jobs = [job("x")]
    t.controller.tick()
    t.cloud.boot_all()
    (instance,) = t.cloud.instances
    t.scheduler.running[instance] = 1
    inbox = InboxServer(NoticeInbox(t.clock), TOKEN)
    t.controller.signals.notices = (inbox.inbox,)
    runner = Runner(t.controller, {"fake": t.cloud}, [inbox])
    loop = threading.Thread(target=runner.run, daemon=True)
    loop.start()
    try:
        give_up = time.monotonic() + bound(30)
        while t.controller.ticks < 2 and time.monotonic() < give_up:
            time.sleep(0.01)
        ticks_before = t.controller.ticks
        assert ticks_before >= 2, "the loop ran its first tick (60 s until the next)"

        def flood(worker: int) -> None:
            for index in range(150):
                assert post(inbox.port, f"i-stranger-{worker}-{index % 40}") == 202

        started = time.monotonic()
        workers = [threading.Thread(target=flood, args=(w,)) for w in range(4)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join(bound(120))
        span = time.monotonic() - started
        flood_ticks = t.controller.ticks - ticks_before
        assert runner.wakeups.tally.get("inbox", "202") == 600
        # at most one wake per interval, plus the one deferred to the end of the last interval
        assert flood_ticks <= 2 + span / NOTICE_WAKE_S, (flood_ticks, span)
        assert instance not in t.scheduler.drained

        # the wake deferred to the end of the flood's last interval has been served
        give_up = time.monotonic() + bound(30)
        while runner.wakeups.due_in() is not None and time.monotonic() < give_up:
            time.sleep(0.01)
        assert runner.wakeups.due_in() is None
        settled = t.controller.ticks
        posted = time.monotonic()
        assert post(inbox.port, instance) == 202
        # 30 s, not scaled: generous, and still half the 60 s tick it tells apart
        while instance not in t.scheduler.drained and time.monotonic() - posted < 30:
            time.sleep(0.01)
        assert instance in t.scheduler.drained, "acted on at once, not at the 60 s tick"
        assert t.controller.ticks > settled
        assert runner.wakeups.tally.get("notice-wake", "at-once") == 1
    finally:
        runner.stop()
        loop.join(bound(30))
    assert not loop.is_alive()


def test_the_counts_are_on_the_controllers_metrics() -> None:
    from autoscaler.ops.metrics import Metrics

    metrics = Metrics()
    t = rig([pool("a")], {"a": 1.0}, metrics=metrics)
    inbox = InboxServer(NoticeInbox(t.clock), TOKEN)
    t.controller.signals.notices = (inbox.inbox,)
    runner = Runner(t.controller, {"fake": t.cloud}, [inbox])
    loop = threading.Thread(target=runner.run, daemon=True)
    loop.start()
    try:
        give_up = time.monotonic() + bound(30)
        while t.controller.ticks < 1 and time.monotonic() < give_up:
            time.sleep(0.01)
        assert post(inbox.port, "i-stranger") == 202
        assert post(inbox.port, "i-stranger\nforged") == 400
        registry = metrics.registry

        def count(boundary: str, outcome: str) -> float | None:
            labels = {"boundary": boundary, "outcome": outcome}
            return registry.get_sample_value("gpu_autoscaler_boundary_inputs_total", labels)

        assert count("inbox", "202") == 1 and count("inbox", "400") == 1
        assert count("notice-wake", "limited") == 1, "a stranger's notice: the interval's one"
    finally:
        runner.stop()
        loop.join(bound(30))
