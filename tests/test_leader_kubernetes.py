"""The Kubernetes Lease leader lock, through the official client over HTTP against the emulator.

Most tests drive the locks' monotonic clocks by hand, so "a whole lease since the standby last
saw a change" is exact rather than slept for; one test runs on the real clock end to end.
"""

from __future__ import annotations

import itertools
import logging
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from k8s_api_emulator import K8sApi
from waits import bound

from autoscaler.model.errors import InputError
from autoscaler.model.records import LeadershipLost
from autoscaler.ops.leader import LeaderLock
from autoscaler.ops.leader.kubernetes import KubernetesLeaseLock

NS = "gpu-autoscaler"
LEASES = itertools.count()


class FakeMonotonic:
    """A monotonic clock that moves only when told to (shared by the locks of a test)."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def shifted(clock: FakeMonotonic, offset: float) -> Callable[[], float]:
    return lambda: clock() + offset


Factory = Callable[..., KubernetesLeaseLock]


@pytest.fixture
def clock() -> FakeMonotonic:
    return FakeMonotonic()


@pytest.fixture
def make_lock(k8s_api: K8sApi, clock: FakeMonotonic) -> Iterator[Factory]:
    made: list[KubernetesLeaseLock] = []

    def make(identity: str, **kwargs: object) -> KubernetesLeaseLock:
        settings: dict[str, object] = {
            "namespace": NS,
            "identity": identity,
            "lease_seconds": 1.0,
            "api_url": k8s_api.url,
            "token": k8s_api.token,
            "monotonic": clock,
            # The lease runs on the fake clock; the HTTP calls run on the real one, where a busy
            # machine may take longer than half the 1 s lease to answer. No test here is about
            # a slow API server, so the wait for an answer is generous.
            "request_timeout_s": bound(30.0),
        }
        settings.update(kwargs)
        name = str(settings.pop("name", "controller"))
        lock = KubernetesLeaseLock(name, **settings)  # type: ignore[arg-type]
        made.append(lock)
        return lock

    yield make
    for lock in made:
        lock.close()


def holds(lock: KubernetesLeaseLock, token: int) -> bool:
    try:
        lock.check(token)
    except LeadershipLost:
        return False
    return True


def test_the_first_replica_creates_the_lease_and_leads(k8s_api: K8sApi, make_lock: Factory) -> None:
    a, b = make_lock("replica-a"), make_lock("replica-b")
    assert isinstance(a, LeaderLock)

    assert a.acquire() == 1
    assert b.acquire() is None

    lease = k8s_api.lease(NS, "controller")
    assert lease is not None
    spec = lease["spec"]
    assert spec["holderIdentity"] == "replica-a"
    assert spec["leaseTransitions"] == 1
    assert spec["leaseDurationSeconds"] == 1
    assert spec["acquireTime"].endswith("Z") and spec["renewTime"].endswith("Z")
    assert [(r.method, r.status) for r in k8s_api.requests[:2]] == [("GET", 404), ("POST", 201)]
    assert holds(a, 1) and not holds(b, 1)


def test_renewals_keep_the_lease_past_its_duration(
    k8s_api: K8sApi, make_lock: Factory, clock: FakeMonotonic
) -> None:
    a, b = make_lock("replica-a"), make_lock("replica-b")
    assert a.acquire() == 1
    first = k8s_api.lease(NS, "controller")
    assert first is not None
    for _ in range(8):  # four leases' worth of time, renewed every half lease
        clock.advance(0.5)
        assert a.acquire() == 1
        assert b.acquire() is None
        a.check(1)
    last = k8s_api.lease(NS, "controller")
    assert last is not None
    assert last["spec"]["acquireTime"] == first["spec"]["acquireTime"]
    assert last["spec"]["renewTime"] != first["spec"]["renewTime"]
    assert last["spec"]["leaseTransitions"] == 1
    assert int(last["metadata"]["resourceVersion"]) > int(first["metadata"]["resourceVersion"])


def test_a_standby_takes_over_after_a_whole_lease_of_its_own_observation(
    k8s_api: K8sApi, make_lock: Factory, clock: FakeMonotonic
) -> None:
    a, b = make_lock("replica-a"), make_lock("replica-b")
    assert a.acquire() == 1
    clock.advance(0.5)
    assert b.acquire() is None  # b first sees a's lease here; a now stops renewing (paused)

    clock.advance(0.2)  # past a's renew deadline (2/3 of the lease): a stops acting
    with pytest.raises(LeadershipLost, match="not renewed"):
        a.check(1)
    clock.advance(0.79)  # 0.99 s after b saw the last change: the lease still stands
    assert b.acquire() is None
    clock.advance(0.02)
    assert b.acquire() == 2
    b.check(2)

    lease = k8s_api.lease(NS, "controller")
    assert lease is not None
    assert lease["spec"]["holderIdentity"] == "replica-b"
    assert lease["spec"]["leaseTransitions"] == 2

    # the former leader wakes up: its token is dead and the lease is b's
    with pytest.raises(LeadershipLost):
        a.check(1)
    assert a.acquire() is None
    with pytest.raises(LeadershipLost):
        a.check(2)
    b.check(2)


def test_expiry_is_judged_by_observation_not_by_the_holders_renew_time(
    k8s_api: K8sApi, make_lock: Factory, clock: FakeMonotonic
) -> None:
    a = make_lock("replica-a")
    assert a.acquire() == 1
    clock.advance(60)  # a is long gone
    # and the record says so by the wall clock (or the holder's clock is skewed): no matter
    k8s_api.leases[(NS, "controller")]["spec"]["renewTime"] = "2001-01-01T00:00:00.000000Z"

    late = make_lock("replica-late")
    assert late.acquire() is None  # first sight of the lease: wait a whole lease from now
    clock.advance(0.99)
    assert late.acquire() is None
    clock.advance(0.02)
    assert late.acquire() == 2


def test_release_hands_over_at_once_and_is_idempotent(
    k8s_api: K8sApi, make_lock: Factory, clock: FakeMonotonic
) -> None:
    a, b = make_lock("replica-a"), make_lock("replica-b")
    assert a.acquire() == 1
    assert b.acquire() is None

    a.release()
    with pytest.raises(LeadershipLost):
        a.check(1)
    lease = k8s_api.lease(NS, "controller")
    assert lease is not None
    assert lease["spec"].get("holderIdentity", "") == ""
    assert lease["spec"]["leaseTransitions"] == 1

    puts = len(k8s_api.served("PUT"))
    a.release()
    assert len(k8s_api.served("PUT")) == puts

    assert b.acquire() == 2  # no wait: an empty holder is free
    assert a.acquire() is None


def test_of_two_racing_standbys_exactly_one_write_lands(
    k8s_api: K8sApi, make_lock: Factory, clock: FakeMonotonic
) -> None:
    a, b, c = make_lock("replica-a"), make_lock("replica-b"), make_lock("replica-c")
    assert a.acquire() == 1
    assert b.acquire() is None
    assert c.acquire() is None
    clock.advance(1.0)  # a is gone; both standbys now see the lease expired

    won: list[int | None] = []
    # c reads and writes between b's read and b's write, as a faster replica would
    k8s_api.before_next("PUT", lambda: won.append(c.acquire()))
    assert b.acquire() is None
    assert won == [2]
    assert 409 in [r.status for r in k8s_api.served("PUT")]
    c.check(2)
    assert not holds(b, 2)
    assert k8s_api.lease(NS, "controller")["spec"]["holderIdentity"] == "replica-c"  # type: ignore[index]


def test_an_api_outage_keeps_the_leader_only_until_its_renew_deadline(
    k8s_api: K8sApi, make_lock: Factory, clock: FakeMonotonic, caplog: pytest.LogCaptureFixture
) -> None:
    a, b = make_lock("replica-a"), make_lock("replica-b")
    assert a.acquire() == 1
    k8s_api.fail(503)
    caplog.set_level(logging.WARNING, logger="autoscaler.ops.leader.kubernetes")

    clock.advance(0.3)
    assert a.acquire() is None
    assert b.acquire() is None
    a.check(1)  # a blip does not end a leadership before its deadline
    clock.advance(0.4)
    with pytest.raises(LeadershipLost):
        a.check(1)

    assert "HTTP 503" in caplog.text
    assert k8s_api.token not in caplog.text
    assert all(len(r.getMessage().splitlines()) == 1 for r in caplog.records)

    k8s_api.heal()
    assert a.acquire() == 1  # nobody took it meanwhile: renewed under the same token
    a.check(1)


def test_refused_connections_and_a_wrong_token_are_not_leadership(
    k8s_api: K8sApi, make_lock: Factory, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="autoscaler.ops.leader.kubernetes")
    wrong = make_lock("replica-wrong", token="not-the-token-0123456789")
    assert wrong.acquire() is None
    assert not holds(wrong, 1)
    assert k8s_api.served()[-1].status == 401

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{probe.getsockname()[1]}"
    refused = make_lock("replica-refused", api_url=closed)
    assert refused.acquire() is None
    assert not holds(refused, 1)

    assert "HTTP 401" in caplog.text
    assert "not-the-token-0123456789" not in caplog.text
    assert k8s_api.token not in caplog.text


def test_check_asks_nothing_of_the_api_server(k8s_api: K8sApi, make_lock: Factory) -> None:
    a = make_lock("replica-a")
    assert a.acquire() == 1
    served = len(k8s_api.requests)
    for _ in range(100):
        a.check(1)
    with pytest.raises(LeadershipLost, match="stale"):
        a.check(0)
    assert len(k8s_api.requests) == served


def test_the_service_account_gives_namespace_and_token(
    k8s_api: K8sApi, make_lock: Factory, tmp_path: Path
) -> None:
    (tmp_path / "namespace").write_text("ml-platform\n")
    (tmp_path / "token").write_text(k8s_api.token)
    lock = make_lock("replica-a", namespace=None, token=None, token_path=tmp_path / "token")
    assert lock.namespace == "ml-platform"
    assert lock.acquire() == 1
    assert k8s_api.lease("ml-platform", "controller") is not None


def test_bad_settings_are_input_errors(
    k8s_api: K8sApi, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def make(**kwargs: object) -> None:
        settings: dict[str, object] = {"namespace": NS, "api_url": k8s_api.url}
        settings.update(kwargs)
        name = str(settings.pop("name", "controller"))
        KubernetesLeaseLock(name, **settings).close()  # type: ignore[arg-type]

    cases: list[tuple[dict[str, object], str]] = [
        ({"name": "Not_A_Name"}, "name"),
        ({"lease_seconds": 0}, "lease_seconds"),
        ({"lease_seconds": 10, "renew_deadline_s": 10}, "renew_deadline_s"),
        ({"namespace": None, "token_path": tmp_path / "token"}, "namespace"),
    ]
    for kwargs, field in cases:
        with pytest.raises(InputError) as caught:
            make(**kwargs)
        assert caught.value.field == field

    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(InputError) as caught:
        make(api_url=None, token_path=tmp_path / "token", ca_path=tmp_path / "ca.crt")
    assert caught.value.field == "api_url"


def test_on_the_real_clock_a_standby_takes_over_a_stopped_leader(
    k8s_api: K8sApi, make_lock: Factory
) -> None:
    a = make_lock("replica-a", monotonic=time.monotonic)
    b = make_lock("replica-b", monotonic=time.monotonic)
    assert a.acquire() == 1
    assert b.acquire() is None
    stopped = time.monotonic()  # a stops renewing now; b saw its last write after this
    token = None
    while token is None and time.monotonic() - stopped < bound(30):
        time.sleep(0.05)
        token = b.acquire()
    taken = time.monotonic()
    assert token == 2
    assert taken - stopped >= 1.0  # never before a whole lease
    with pytest.raises(LeadershipLost):
        a.check(1)
    assert a.acquire() is None


STEP = st.one_of(
    st.tuples(st.just("acquire"), st.integers(0, 2)),
    st.tuples(st.just("acquire"), st.integers(0, 2)),
    st.tuples(st.just("release"), st.integers(0, 2)),
    st.tuples(st.just("advance"), st.sampled_from([0.1, 0.25, 0.34, 0.5, 0.67, 1.0, 1.5])),
)


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    replicas=st.integers(2, 3),
    offsets=st.lists(st.floats(-1e6, 1e6), min_size=3, max_size=3),
    steps=st.lists(STEP, min_size=6, max_size=30),
)
def test_no_two_replicas_ever_pass_check_at_once_and_tokens_only_grow(
    k8s_api: K8sApi,
    replicas: int,
    offsets: list[float],
    steps: list[tuple[str, float]],
) -> None:
    clock = FakeMonotonic()
    name = f"prop-{next(LEASES)}"
    locks = [
        KubernetesLeaseLock(
            name,
            namespace=NS,
            identity=f"replica-{i}",
            lease_seconds=1.0,
            api_url=k8s_api.url,
            token=k8s_api.token,
            # each replica's monotonic clock has its own origin, at the same rate
            monotonic=shifted(clock, offsets[i]),
        )
        for i in range(replicas)
    ]
    latest: list[int | None] = [None] * replicas
    issued: list[tuple[int, int]] = []  # (token, replica), in the order acquire gave them
    try:
        for action, arg in steps:
            # a replica that is not called is paused: missing calls are the pauses
            i = int(arg) % replicas
            if action == "advance":
                clock.advance(arg)
            elif action == "release":
                locks[i].release()
            elif (token := locks[i].acquire()) is not None:
                if issued:
                    top, by = max(issued)
                    assert token >= top, f"token went back from {top} to {token}"
                    assert by == i or token > top, "a new leader reused a token"
                issued.append((token, i))
                latest[i] = token
            passing = [
                j for j, token in enumerate(latest) if token is not None and holds(locks[j], token)
            ]
            assert len(passing) <= 1, f"replicas {passing} both pass check at once"
    finally:
        for lock in locks:
            lock.close()
