"""The PostgreSQL leader lock against a real PostgreSQL: one leader at a time, growing fencing
tokens, hand-over on release, on SIGKILL (the session's socket closes) and on a pause (the lease
runs out and the standby ends the stale session), and a paused former leader that fails check."""

from __future__ import annotations

import logging
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from postgres_server import PostgresServer, free_port
from waits import bound

from autoscaler.model.errors import InputError
from autoscaler.model.records import LeadershipLost
from autoscaler.ops.leader import LeaderLock
from autoscaler.ops.leader.postgres import PostgresLeaderLock

ROOT = Path(__file__).resolve().parent.parent

# A replica in its own process: takes the lock, renews it from a thread every tenth of a lease,
# and answers "check" on stdin with the result of check(token) for the token it took.
HOLDER = """
import os, sys, threading, time
from autoscaler.ops.leader import LeadershipLost
from autoscaler.ops.leader.postgres import PostgresLeaderLock

lease = float(sys.argv[1])
lock = PostgresLeaderLock(os.environ["LEADER_DSN"], identity="holder", lease_seconds=lease)
printing = threading.Lock()

def say(*words):
    with printing:
        print(*words, flush=True)

while (token := lock.acquire()) is None:
    time.sleep(0.05)
say("token", token)

def renew():
    while True:
        time.sleep(lease / 10)
        now = lock.acquire()
        if now != token:
            say("renewed", now)
            return

threading.Thread(target=renew, daemon=True).start()
for line in sys.stdin:
    try:
        lock.check(token)
        say("held")
    except LeadershipLost:
        say("lost")
"""


class Holder:
    """The holder subprocess, read line by line with a deadline so a hang fails the test."""

    def __init__(self, dsn: str, lease_seconds: float) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-c", HOLDER, str(lease_seconds)],
            cwd=ROOT,
            env={**os.environ, "LEADER_DSN": dsn, "PYTHONPATH": str(ROOT)},
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        # select() on the pipe would miss lines already in the reader's buffer: read in a thread.
        self.lines: queue.Queue[str] = queue.Queue()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.put(line.strip())

    def line(self, within_s: float = 60.0) -> str:
        """The holder's next line; ``within_s`` is a ceiling scaled by the wait knob."""
        within_s = bound(within_s)
        try:
            return self.lines.get(timeout=within_s)
        except queue.Empty:
            raise AssertionError(f"the holder subprocess said nothing in {within_s}s") from None

    def token(self) -> int:
        word, token = self.line().split()
        assert word == "token"
        return int(token)

    def ask(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write("check\n")
        self.process.stdin.flush()

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(timeout=bound(30))
        self.reader.join(timeout=bound(30))
        for stream in (self.process.stdin, self.process.stdout):
            if stream is not None:
                stream.close()


@pytest.fixture
def holders() -> Iterator[list[Holder]]:
    started: list[Holder] = []
    yield started
    for holder in started:
        holder.stop()


@pytest.fixture
def locks() -> Iterator[list[PostgresLeaderLock]]:
    made: list[PostgresLeaderLock] = []
    yield made
    for lock in made:
        lock.release()


def until(what: str, attempt: object, within_s: float) -> object:
    """Call ``attempt`` until it returns something other than None, or fail after ``within_s``
    (a ceiling scaled by the wait knob)."""
    assert callable(attempt)
    within_s = bound(within_s)
    deadline = time.monotonic() + within_s
    while (result := attempt()) is None:
        assert time.monotonic() < deadline, f"{what} within {within_s}s"
        time.sleep(0.05)
    return result


def test_one_of_two_wins_and_tokens_grow_with_each_change_of_leader(
    postgres_dsn: str, locks: list[PostgresLeaderLock]
) -> None:
    a = PostgresLeaderLock(postgres_dsn, identity="a", lease_seconds=30)
    b = PostgresLeaderLock(postgres_dsn, identity="b", lease_seconds=30)
    locks += [a, b]
    assert isinstance(a, LeaderLock)

    first = a.acquire()
    assert first is not None
    assert b.acquire() is None
    assert a.acquire() == first, "renewing keeps the token"
    a.check(first)
    with pytest.raises(LeadershipLost):
        b.check(first)

    a.release()
    second = b.acquire()
    assert second is not None and second > first, "release hands over at once"
    assert a.acquire() is None
    with pytest.raises(LeadershipLost):
        a.check(first)
    b.check(second)

    b.release()
    b.release()  # idempotent
    third = a.acquire()
    assert third is not None and third > second
    a.check(third)


def test_check_with_a_wrong_token_raises(
    postgres_dsn: str, locks: list[PostgresLeaderLock]
) -> None:
    lock = PostgresLeaderLock(postgres_dsn, identity="a", lease_seconds=30)
    locks.append(lock)
    with pytest.raises(LeadershipLost):
        lock.check(1)  # never acquired
    token = lock.acquire()
    assert token is not None
    for wrong in (token - 1, token + 1, 0):
        with pytest.raises(LeadershipLost):
            lock.check(wrong)
    lock.check(token)


def test_many_replicas_starting_at_once_on_an_empty_database_elect_exactly_one(
    postgres_dsn: str, locks: list[PostgresLeaderLock]
) -> None:
    replicas = [
        PostgresLeaderLock(postgres_dsn, identity=f"r{index}", lease_seconds=30)
        for index in range(6)
    ]
    locks += replicas
    start = threading.Barrier(len(replicas))
    tokens: dict[str, int | None] = {}

    def run(lock: PostgresLeaderLock) -> None:
        start.wait()
        tokens[lock.identity] = lock.acquire()

    threads = [threading.Thread(target=run, args=(lock,)) for lock in replicas]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    winners = {identity: token for identity, token in tokens.items() if token is not None}
    assert list(winners.values()) == [1], tokens


def test_a_holder_killed_with_sigkill_is_replaced_at_once_not_after_its_lease(
    postgres_dsn: str, holders: list[Holder], locks: list[PostgresLeaderLock]
) -> None:
    # far longer than the test may wait (both scale with the wait knob): the hand-over cannot be
    # the lease running out
    lease = bound(60.0)
    holder = Holder(postgres_dsn, lease)
    holders.append(holder)
    old = holder.token()
    standby = PostgresLeaderLock(postgres_dsn, identity="standby", lease_seconds=lease)
    locks.append(standby)
    assert standby.acquire() is None

    holder.process.send_signal(signal.SIGKILL)
    new = until("the standby takes over after SIGKILL", standby.acquire, within_s=30.0)
    assert isinstance(new, int) and new > old
    standby.check(new)


def test_a_paused_holder_is_ended_after_its_lease_and_fails_check_when_it_resumes(
    postgres_dsn: str, holders: list[Holder], locks: list[PostgresLeaderLock]
) -> None:
    lease = 1.5
    holder = Holder(postgres_dsn, lease)
    holders.append(holder)
    old = holder.token()
    holder.ask()
    assert holder.line() == "held"
    standby = PostgresLeaderLock(postgres_dsn, identity="standby", lease_seconds=lease)
    locks.append(standby)

    holder.process.send_signal(signal.SIGSTOP)
    paused_at = time.monotonic()
    assert standby.acquire() is None, "a lease still running is respected"
    new = until("the standby takes over from the paused holder", standby.acquire, 2 * lease + 30)
    waited = time.monotonic() - paused_at
    assert isinstance(new, int) and new > old
    # It renewed at most a tenth of a lease before the pause, so the lease had most of it to run.
    assert waited >= 0.5 * lease, f"took over after {waited:.2f}s, lease {lease}s"
    standby.check(new)

    with renewing(standby, lease):  # the new leader keeps its lease, as its controller would
        holder.process.send_signal(signal.SIGCONT)
        holder.ask()
        answers = [holder.line()]
        while answers[-1] not in ("held", "lost"):
            answers.append(holder.line())
        assert answers[-1] == "lost", answers
        assert "renewed None" in answers or holder.line() == "renewed None"
        standby.check(new)
    assert standby.acquire() == new


@contextmanager
def renewing(lock: PostgresLeaderLock, lease: float) -> Iterator[None]:
    stop = threading.Event()

    def renew() -> None:
        while not stop.wait(lease / 10):
            lock.acquire()

    thread = threading.Thread(target=renew)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def test_losing_the_session_loses_leadership_and_the_next_acquire_reconnects(
    postgres_dsn: str, locks: list[PostgresLeaderLock]
) -> None:
    lock = PostgresLeaderLock(postgres_dsn, identity="victim", lease_seconds=30)
    locks.append(lock)
    token = lock.acquire()
    assert token is not None
    with psycopg.connect(postgres_dsn, autocommit=True) as other:
        ended = other.execute(
            "SELECT pg_terminate_backend(pid, 5000) FROM pg_stat_activity"
            " WHERE application_name = 'gpu-autoscaler leader victim'"
        ).fetchall()
    assert ended == [(True,)]
    with pytest.raises(LeadershipLost):
        lock.check(token)
    again = lock.acquire()
    assert again is not None and again > token
    lock.check(again)


def test_an_unreachable_database_means_standing_by_and_the_password_is_never_logged(
    postgres: PostgresServer, caplog: pytest.LogCaptureFixture
) -> None:
    password = "Sup3r-secret-pw-77"
    dsn = f"postgresql://autoscaler:{password}@127.0.0.1:{free_port()}/nothing"
    lock = PostgresLeaderLock(dsn, identity="lonely", lease_seconds=2)
    with caplog.at_level(logging.DEBUG, logger="autoscaler.ops.leader.postgres"):
        assert lock.acquire() is None
        with pytest.raises(LeadershipLost):
            lock.check(1)
        lock.release()
        wrong = PostgresLeaderLock(
            postgres.dsn.replace(postgres.password, password), lease_seconds=2
        )
        assert wrong.acquire() is None
    assert "cannot reach PostgreSQL at 127.0.0.1" in caplog.text
    assert password not in caplog.text
    assert password not in repr(lock)


@pytest.mark.parametrize(
    ("arguments", "field"),
    [
        ({"dsn": "postgresql://u:pw-in-here@[broken", "name": "x"}, "dsn"),
        ({"dsn": "host=h password=pw-in-here port", "name": "x"}, "dsn"),
        ({"dsn": "postgresql://u@h/db", "name": ""}, "name"),
        ({"dsn": "postgresql://u@h/db", "name": "x", "lease_seconds": 0.0}, "lease_seconds"),
        (
            {"dsn": "postgresql://u@h/db", "name": "x", "lease_seconds": float("nan")},
            "lease_seconds",
        ),
    ],
)
def test_bad_settings_are_input_errors_that_never_echo_the_password(
    arguments: dict[str, object], field: str
) -> None:
    with pytest.raises(InputError) as caught:
        PostgresLeaderLock(**arguments)  # type: ignore[arg-type]
    assert caught.value.field == field
    assert "pw-in-here" not in str(caught.value)


OPERATION = st.tuples(st.sampled_from(["acquire", "release", "kill"]), st.integers(0, 2))


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(replicas=st.integers(2, 3), operations=st.lists(OPERATION, min_size=1, max_size=20))
def test_no_interleaving_of_acquire_release_and_kill_yields_two_leaders(
    postgres_dsn: str, replicas: int, operations: list[tuple[str, int]]
) -> None:
    """A model of who should lead is checked after every step: acquire returns a token exactly
    when no one else leads, a new token exceeds every earlier one, and among every token ever
    handed out at most one passes check, the newest, held by the model's leader."""
    locks = [
        PostgresLeaderLock(postgres_dsn, identity=f"p{index}", lease_seconds=30)
        for index in range(replicas)
    ]
    leader: int | None = None
    handed_out: list[tuple[int, int]] = []  # (lock index, token)
    try:
        with psycopg.connect(postgres_dsn, autocommit=True) as other:
            for action, chosen in operations:
                index = chosen % replicas
                lock = locks[index]
                if action == "acquire":
                    token = lock.acquire()
                    if leader in (None, index):
                        assert token is not None
                        newest = max((seen for _, seen in handed_out), default=0)
                        mine = [seen for who, seen in handed_out if who == index]
                        assert token > newest or (leader == index and token == mine[-1])
                        handed_out.append((index, token))
                        leader = index
                    else:
                        assert token is None
                elif action == "release":
                    lock.release()
                    leader = None if leader == index else leader
                else:  # the replica's session dies, as when its process is killed
                    other.execute(
                        "SELECT pg_terminate_backend(pid, 5000) FROM pg_stat_activity"
                        " WHERE application_name = %s",
                        [f"gpu-autoscaler leader {lock.identity}"],
                    )
                    leader = None if leader == index else leader
                passing = [
                    (who, seen) for who, seen in set(handed_out) if _passes(locks[who], seen)
                ]
                assert len(passing) <= 1, passing
                if leader is None:
                    assert passing == []
                else:
                    assert passing == [(leader, max(seen for _, seen in handed_out))]
    finally:
        for lock in locks:
            lock.release()


def _passes(lock: PostgresLeaderLock, token: int) -> bool:
    try:
        lock.check(token)
    except LeadershipLost:
        return False
    return True
