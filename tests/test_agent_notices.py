"""The node agent's interruption notices, end to end over real HTTP: each cloud's fake metadata
server announces, the watcher reads it, the forwarder posts it to a real controller inbox, and
the local hooks run."""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from email.utils import formatdate
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from metadata_servers import ControllerInbox, FakeAzureImds, FakeGcpMetadata, FakeImds
from waits import bound

from autoscaler.model import NoticeKind
from autoscaler.model.errors import InputError, SourceError
from node_agent.forward import Delivery, Forwarder
from node_agent.hooks import LocalHooks, parse_signal
from node_agent.main import NoticeDispatch, detect_cloud
from node_agent.metadata import AgentNotice, NoticeMetrics, PollLoop, Watcher
from node_agent.metadata_aws import AwsWatcher
from node_agent.metadata_azure import AzureAck, AzureWatcher, ScheduledEvent, parse_not_before
from node_agent.metadata_gcp import GcpWatcher


def errors(metrics: NoticeMetrics, cloud: str) -> float:
    value = metrics.registry.get_sample_value(
        "gpu_autoscaler_agent_metadata_errors_total", {"cloud": cloud}
    )
    return value or 0.0


def wait_until(condition: Callable[[], bool], timeout_s: float = 60.0) -> bool:
    """Poll ``condition``; ``timeout_s`` is a ceiling scaled by the wait knob."""
    give_up = time.monotonic() + bound(timeout_s)
    while time.monotonic() < give_up:
        if condition():
            return True
        time.sleep(0.01)
    return condition()


def forwarder(
    controller: ControllerInbox, metrics: NoticeMetrics, token: str | None = None
) -> Forwarder:
    return Forwarder(controller.url, token or controller.token, metrics, give_up_s=bound(30))


@pytest.fixture
def running() -> Iterator[Callable[[Watcher], None]]:
    """Runs watchers on threads and stops them at the end of the test."""
    stop = threading.Event()
    threads: list[threading.Thread] = []

    def start(watcher: Watcher) -> None:
        thread = threading.Thread(target=watcher.run, args=(stop,), daemon=True)
        thread.start()
        threads.append(thread)

    yield start
    stop.set()
    for thread in threads:
        thread.join(bound(30))


def aws_watcher(
    fake: FakeImds, handle: Callable[[AgentNotice], bool], metrics: NoticeMetrics
) -> AwsWatcher:
    return AwsWatcher(fake.url, handle, metrics, poll_s=0.05, timeout_s=0.5, max_backoff_s=0.2)


def test_an_aws_spot_interruption_reaches_the_controller_once_with_its_deadline(
    running: Callable[[Watcher], None],
    aws_imds: FakeImds,
    controller_inbox: ControllerInbox,
) -> None:
    metrics = NoticeMetrics()
    dispatch = NoticeDispatch(forwarder(controller_inbox, metrics), LocalHooks())
    running(aws_watcher(aws_imds, dispatch, metrics))
    assert wait_until(lambda: aws_imds.token_puts >= 1)
    aws_imds.revoke_tokens()
    deadline = float(int(time.time()) + 120)
    aws_imds.set_instance_action("terminate", deadline)

    [notice] = controller_inbox.wait_for(1)
    assert notice.instance_id == "i-0123456789abcdef0"
    assert notice.kind is NoticeKind.TERMINATE
    assert notice.deadline == deadline
    assert aws_imds.token_puts >= 2, "a revoked token is replaced on the 401"

    polls = len(aws_imds.requests)
    assert wait_until(lambda: len(aws_imds.requests) > polls + 10)
    assert len(controller_inbox.wait_for(2, timeout_s=0.2)) == 1, "forwarded once"

    aws_imds.rebalance = {"noticeTime": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    notices = controller_inbox.wait_for(2)
    assert notices[1].kind is NoticeKind.REBALANCE
    assert notices[1].deadline is None


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    st.lists(
        st.one_of(
            st.none(),
            st.tuples(
                st.sampled_from(["terminate", "stop", "hibernate"]),
                st.integers(min_value=1_700_000_000, max_value=1_700_000_005),
            ),
        ),
        max_size=8,
    )
)
def test_each_distinct_aws_instance_action_is_handled_exactly_once(
    aws_imds: FakeImds, documents: list[tuple[str, int] | None]
) -> None:
    handled: list[str] = []

    def handle(notice: AgentNotice) -> bool:
        handled.append(notice.event_key)
        return True

    watcher = AwsWatcher(
        aws_imds.url, handle, NoticeMetrics(), poll_s=0.05, timeout_s=0.5, clock=lambda: 1.7e9
    )
    expected: list[str] = []
    for document in documents:
        aws_imds.instance_action = None
        if document is not None:
            aws_imds.set_instance_action(*document)
            assert aws_imds.instance_action is not None
            key = f"instance-action:{document[0]}:{aws_imds.instance_action['time']}"
            if key not in expected:
                expected.append(key)
        watcher.poll()
    assert handled == expected


@pytest.mark.parametrize("fault", ["malformed", "error", "hang", "garbage"])
def test_a_broken_imds_answer_is_logged_counted_and_outlived(
    running: Callable[[Watcher], None],
    aws_imds: FakeImds,
    controller_inbox: ControllerInbox,
    caplog: pytest.LogCaptureFixture,
    fault: str,
) -> None:
    metrics = NoticeMetrics()
    dispatch = NoticeDispatch(forwarder(controller_inbox, metrics), LocalHooks())
    aws_imds.fault = fault  # type: ignore[assignment]
    aws_imds.hang_s = 1.0
    with caplog.at_level(logging.INFO):
        running(aws_watcher(aws_imds, dispatch, metrics))
        assert wait_until(lambda: errors(metrics, "aws") >= 2)
        aws_imds.fault = None
        aws_imds.set_instance_action("terminate", time.time() + 120)
        [notice] = controller_inbox.wait_for(1)
    assert notice.instance_id == aws_imds.instance_id
    problems = [
        r.getMessage()
        for r in caplog.records
        if r.name == "node_agent.metadata" and r.levelno == logging.WARNING
    ]
    assert problems, "the failure is logged"
    assert all("\n" not in line and "aws metadata" in line for line in problems)
    assert len(problems) <= 2, "a lasting failure is logged once, not every poll"
    assert any("answers again" in r.getMessage() for r in caplog.records)


def test_a_gcp_preemption_arrives_within_seconds_with_a_30_second_deadline(
    running: Callable[[Watcher], None],
    gcp_metadata: FakeGcpMetadata,
    controller_inbox: ControllerInbox,
) -> None:
    metrics = NoticeMetrics()
    dispatch = NoticeDispatch(forwarder(controller_inbox, metrics), LocalHooks())
    running(GcpWatcher(gcp_metadata.url, dispatch, metrics, hang_s=5, timeout_s=0.5))
    assert wait_until(lambda: sum("wait_for_change" in p for _, p in gcp_metadata.requests) >= 2)
    announced = time.time()
    gcp_metadata.set("instance/preempted", "TRUE")

    [notice] = controller_inbox.wait_for(1)
    assert notice.instance_id == "gpu-spot-7"
    assert notice.kind is NoticeKind.TERMINATE
    assert notice.received_at - announced < 3.0, "a hanging GET answers at once, no polling"
    assert notice.deadline is not None
    assert 29.0 <= notice.deadline - announced <= 33.0

    gcp_metadata.set("instance/maintenance-event", "TERMINATE_ON_HOST_MAINTENANCE")
    notices = controller_inbox.wait_for(2)
    assert notices[1].kind is NoticeKind.REBALANCE


def test_a_malformed_gcp_answer_is_counted_and_the_hanging_get_recovers(
    running: Callable[[Watcher], None],
    gcp_metadata: FakeGcpMetadata,
    controller_inbox: ControllerInbox,
    caplog: pytest.LogCaptureFixture,
) -> None:
    metrics = NoticeMetrics()
    dispatch = NoticeDispatch(forwarder(controller_inbox, metrics), LocalHooks())
    gcp_metadata.fault = "malformed"
    watcher = GcpWatcher(gcp_metadata.url, dispatch, metrics, hang_s=1, timeout_s=0.5, retry_s=0.05)
    with caplog.at_level(logging.WARNING):
        running(watcher)
        assert wait_until(lambda: errors(metrics, "gcp") >= 1)
    assert "gcp metadata: instance/preempted is 'MAYBE'" in caplog.text
    gcp_metadata.fault = None
    gcp_metadata.set("instance/preempted", "TRUE")
    [notice] = controller_inbox.wait_for(1)
    assert notice.kind is NoticeKind.TERMINATE


def test_a_gcp_answer_that_hangs_past_the_timeout_is_an_error_not_a_stall(
    gcp_metadata: FakeGcpMetadata,
) -> None:
    metrics = NoticeMetrics()
    gcp_metadata.fault = "hang"
    watcher = GcpWatcher(gcp_metadata.url, lambda notice: True, metrics, timeout_s=0.3)
    with pytest.raises(SourceError, match=r"gcp metadata: instance/preempted: no answer within"):
        watcher.get("instance/preempted", watcher.timeout_s)


def azure_watcher(
    fake: FakeAzureImds,
    handle: Callable[[AgentNotice], bool],
    metrics: NoticeMetrics,
    ack: AzureAck = AzureAck.AFTER_HOOKS,
) -> AzureWatcher:
    return AzureWatcher(fake.url, handle, metrics, ack=ack, poll_s=0.05, timeout_s=0.5)


def test_an_azure_preempt_arrives_and_is_acknowledged_only_after_delivery(
    running: Callable[[Watcher], None],
    azure_metadata: FakeAzureImds,
    controller_inbox: ControllerInbox,
    tmp_path: Path,
) -> None:
    metrics = NoticeMetrics()
    marker = tmp_path / "hook-ran"
    hooks = LocalHooks(command=f"{sys.executable} -c \"open('{marker}', 'w').write('x')\"")
    dispatch = NoticeDispatch(forwarder(controller_inbox, metrics), hooks)
    running(azure_watcher(azure_metadata, dispatch, metrics))
    azure_metadata.add_event("Freeze")
    azure_metadata.add_event("Preempt", resources=["some-other-vm"])
    not_before = float(int(time.time()) + 30)
    announced = time.time()
    event = azure_metadata.add_event("Preempt", not_before=not_before)

    [notice] = controller_inbox.wait_for(1)
    assert notice.instance_id == "vm-gpu-3"
    assert notice.kind is NoticeKind.TERMINATE
    assert notice.deadline == not_before
    assert notice.received_at - announced < 3.0
    assert wait_until(lambda: len(azure_metadata.acknowledged) == 1)
    [ack] = azure_metadata.acknowledged
    assert ack.event_id == event.event_id
    assert ack.at >= notice.received_at, "acknowledged after the controller had it"
    assert marker.exists(), "and after the hook ran"
    assert event.status == "Started"
    assert len(controller_inbox.wait_for(2, timeout_s=0.3)) == 1


def test_azure_does_not_acknowledge_what_the_controller_refused_or_when_told_never(
    running: Callable[[Watcher], None],
    azure_metadata: FakeAzureImds,
    controller_inbox: ControllerInbox,
) -> None:
    metrics = NoticeMetrics()
    refused = NoticeDispatch(forwarder(controller_inbox, metrics, token="wrong"), LocalHooks())
    running(azure_watcher(azure_metadata, refused, metrics))
    azure_metadata.add_event("Preempt")
    assert wait_until(lambda: controller_inbox.inbox.rejected == 1)

    delivered = NoticeDispatch(forwarder(controller_inbox, metrics), LocalHooks())
    running(azure_watcher(azure_metadata, delivered, metrics, ack=AzureAck.NEVER))
    assert len(controller_inbox.wait_for(1)) == 1
    time.sleep(0.3)
    assert azure_metadata.acknowledged == []
    assert azure_metadata.events[0].status == "Scheduled"


def test_a_malformed_scheduled_events_document_is_one_clear_error(
    azure_metadata: FakeAzureImds,
) -> None:
    metrics = NoticeMetrics()
    watcher = azure_watcher(azure_metadata, lambda notice: True, metrics)
    azure_metadata.fault = "malformed"
    with pytest.raises(SourceError, match=r"^azure scheduled events: .*JSON") as raised:
        watcher.poll()
    assert "\n" not in str(raised.value)
    azure_metadata.fault = "error"
    assert watcher.loop.once(watcher.poll) > 0
    assert errors(metrics, "azure") == 1
    azure_metadata.fault = None
    watcher.poll()


@given(st.integers(min_value=0, max_value=4_102_444_800))
def test_azure_not_before_times_read_back_to_the_second(moment: int) -> None:
    event = ScheduledEvent.model_validate(
        {
            "EventId": "E",
            "EventType": "Preempt",
            "Resources": ["vm"],
            "EventStatus": "Scheduled",
            "NotBefore": formatdate(moment, usegmt=True),
        }
    )
    assert parse_not_before(event) == moment


def test_a_wrong_token_is_refused_once_with_a_clear_line_and_never_logged(
    controller_inbox: ControllerInbox, caplog: pytest.LogCaptureFixture
) -> None:
    metrics = NoticeMetrics()
    secret = "not-the-token-" + os.urandom(4).hex()
    notice = AgentNotice(
        instance_id="i-1", kind=NoticeKind.TERMINATE, deadline=None, source="test", event_key="k"
    )
    with caplog.at_level(logging.DEBUG):
        outcome = forwarder(controller_inbox, metrics, token=secret).send(notice)
    assert outcome is Delivery.REFUSED
    assert controller_inbox.inbox.rejected == 1, "no retry on 401"
    assert "the controller refused the token" in caplog.text
    assert secret not in caplog.text
    assert controller_inbox.token not in caplog.text
    failures = metrics.registry.get_sample_value(
        "gpu_autoscaler_agent_forward_failures_total", {"reason": "unauthorised"}
    )
    assert failures == 1


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_an_unreachable_controller_is_retried_briefly_then_reported(
    caplog: pytest.LogCaptureFixture,
) -> None:
    metrics = NoticeMetrics()
    unreachable = Forwarder(f"http://127.0.0.1:{free_port()}", "t", metrics, give_up_s=0.5)
    notice = AgentNotice(
        instance_id="i-1", kind=NoticeKind.TERMINATE, deadline=None, source="test", event_key="k"
    )
    started = time.monotonic()
    assert unreachable.send(notice) is Delivery.FAILED
    assert time.monotonic() - started < 5.0
    assert "could not deliver the terminate notice for i-1" in caplog.text


def test_notices_go_over_tls_to_a_controller_with_a_private_ca(tmp_path: Path) -> None:
    import ssl

    from autoscaler.model.clock import SystemClock
    from autoscaler.ops.inbox import InboxServer, NoticeInbox

    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
            "-keyout",
            str(key),
            "-out",
            str(cert),
        ],
        check=True,
        capture_output=True,
    )
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    inbox = NoticeInbox(SystemClock())
    server = InboxServer(inbox, "tls-token", tls=context)
    server.start()
    try:
        url = f"https://127.0.0.1:{server.port}"
        notice = AgentNotice(
            instance_id="i-tls",
            kind=NoticeKind.TERMINATE,
            deadline=time.time() + 120,
            source="t",
            event_key="k",
        )
        trusted = Forwarder(url, "tls-token", NoticeMetrics(), ca_file=cert, give_up_s=1.0)
        assert trusted.send(notice) is Delivery.DELIVERED
        untrusted = Forwarder(url, "tls-token", NoticeMetrics(), give_up_s=1.0)
        assert untrusted.send(notice) is Delivery.REFUSED
        assert [n.instance_id for n in inbox.take()] == ["i-tls"]
    finally:
        server.close()


def test_the_hook_command_gets_the_notice_in_its_environment(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    script = (
        "import os; print(' '.join(os.environ[k] for k in ("
        "'GPU_AUTOSCALER_NOTICE_KIND', 'GPU_AUTOSCALER_NOTICE_DEADLINE', "
        "'GPU_AUTOSCALER_NOTICE_INSTANCE_ID', 'GPU_AUTOSCALER_NOTICE_SOURCE')))"
    )
    hooks = LocalHooks(command=f'{sys.executable} -c "{script}"')
    notice = AgentNotice(
        instance_id="i-9",
        kind=NoticeKind.TERMINATE,
        deadline=1_900_000_000.0,
        source="aws-imds",
        event_key="k",
    )
    with caplog.at_level(logging.INFO):
        hooks.run(notice)
    assert "hook: terminate 1900000000 i-9 aws-imds" in caplog.text


def test_a_stuck_hook_is_killed_at_its_timeout(caplog: pytest.LogCaptureFixture) -> None:
    hooks = LocalHooks(command=f"{sys.executable} -c 'import time; time.sleep(30)'", timeout_s=0.3)
    notice = AgentNotice(
        instance_id="i-9", kind=NoticeKind.REBALANCE, deadline=None, source="t", event_key="k"
    )
    started = time.monotonic()
    hooks.run(notice)
    assert time.monotonic() - started < 5.0
    assert "did not finish within 0.3 s" in caplog.text


def test_the_workload_gets_its_signal(tmp_path: Path) -> None:
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import signal, sys, time\n"
            "signal.signal(signal.SIGUSR1, lambda *a: (print('checkpointing', flush=True), "
            "sys.exit(0)))\n"
            "print('ready', flush=True)\n"
            "time.sleep(30)\n"
            "sys.exit(3)\n",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "ready"
        pid_file = tmp_path / "job.pid"
        pid_file.write_text(f"{child.pid}\n")
        hooks = LocalHooks(workload_signal=parse_signal("USR1"), pid_file=pid_file)
        notice = AgentNotice(
            instance_id="i-9", kind=NoticeKind.TERMINATE, deadline=None, source="t", event_key="k"
        )
        hooks.run(notice)
        assert child.wait(bound(60)) == 0
        assert child.stdout.read().strip() == "checkpointing"
    finally:
        if child.poll() is None:
            os.kill(child.pid, signal.SIGKILL)
            child.wait()


def test_signal_names_are_checked() -> None:
    assert parse_signal("usr1") is signal.SIGUSR1
    assert parse_signal("SIGTERM") is signal.SIGTERM
    assert parse_signal(str(int(signal.SIGUSR2))) is signal.SIGUSR2
    with pytest.raises(InputError, match="not a signal"):
        parse_signal("SIGNOPE")
    with pytest.raises(InputError, match="--signal-pid-file"):
        LocalHooks(workload_signal=signal.SIGUSR1)


def test_the_cloud_is_found_by_whichever_metadata_server_answers(
    aws_imds: FakeImds, gcp_metadata: FakeGcpMetadata, azure_metadata: FakeAzureImds
) -> None:
    nowhere = f"http://127.0.0.1:{free_port()}"
    real = {"aws": aws_imds.url, "gcp": gcp_metadata.url, "azure": azure_metadata.url}
    for cloud in ("aws", "gcp", "azure"):
        urls = dict.fromkeys(real, nowhere) | {cloud: real[cloud]}
        assert detect_cloud(urls, timeout_s=0.5) == cloud
    crossed = {"aws": gcp_metadata.url, "gcp": azure_metadata.url, "azure": aws_imds.url}
    assert detect_cloud(crossed, timeout_s=0.5) == "none"
    assert detect_cloud(dict.fromkeys(real, nowhere), timeout_s=0.5) == "none"


def test_a_bug_in_a_watcher_step_is_counted_and_outlived(caplog: pytest.LogCaptureFixture) -> None:
    metrics = NoticeMetrics()
    loop = PollLoop("aws", metrics, interval_s=1.0, max_backoff_s=4.0)

    def broken() -> None:
        raise RuntimeError("boom\nsecond line")

    assert [loop.once(broken) for _ in range(4)] == [1.0, 2.0, 4.0, 4.0]
    assert errors(metrics, "aws") == 4
    assert "aws metadata watcher: unexpected RuntimeError: boom (will retry)" in caplog.text
    assert "second line" not in caplog.text
    assert loop.once(lambda: None) == 1.0
