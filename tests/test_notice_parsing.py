"""What the clouds send, read strictly (issue 15): EventBridge events, and the metadata answers
the node agent reads. Deadlines no clock could reach are refused, a deeply nested body is one
error line (never a RecursionError), a real AWS Health event is read with its RFC 1123 start
time, and on the node one bad answer never hides a good notice beside it: an Azure event that
is not a Preempt scheduled for this VM never becomes a notice."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from email.utils import formatdate
from pathlib import Path
from typing import Any

import pytest
from metadata_servers import ControllerInbox, FakeAzureImds, FakeGcpMetadata, FakeImds
from waits import bound

from autoscaler.model import NoticeKind
from autoscaler.model.errors import SourceError
from node_agent.forward import Forwarder
from node_agent.hooks import LocalHooks
from node_agent.main import NoticeDispatch
from node_agent.metadata import MAX_ANSWER, AgentNotice, NoticeMetrics
from node_agent.metadata_aws import AwsWatcher
from node_agent.metadata_azure import AzureWatcher, parse_document, preempts
from node_agent.metadata_gcp import GcpWatcher
from providers.aws.events import MalformedEventError, parse_event

DATA = Path(__file__).parent / "data" / "notices"
NOW = 1_795_255_200.0  # the time the seeds in tests/data/notices are written around


def seed(name: str) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((DATA / name).read_text())
    return loaded


def spot(**changes: Any) -> str:
    event = seed("eventbridge-spot-interruption-warning.json")
    event.update(changes)
    return json.dumps(event)


def test_the_real_shapes_are_read() -> None:
    warning = parse_event(spot(), NOW)
    assert warning is not None
    assert (warning.instance_ids, warning.kind, warning.deadline) == (
        ("i-1234567890abcdef0",),
        NoticeKind.TERMINATE,
        NOW + 120,
    )
    health = parse_event((DATA / "eventbridge-health-scheduled-change.json").read_text(), NOW)
    assert health is not None and health.instance_ids == ("i-12345678",)
    assert health.deadline == 1796483409.0, "Sat, 05 Dec 2026 15:10:09 GMT, as AWS Health writes it"
    leaving = parse_event((DATA / "eventbridge-state-change.json").read_text(), NOW)
    assert leaving is not None and leaving.deadline == NOW


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        ('{"detail": ' + "[" * 100_000 + "]" * 100_000 + "}", "recursion limit"),
        (spot(time="9999-12-31T23:59:59Z"), "in the future"),
        (spot(time="1969-07-20T20:17:40Z"), "days before now"),
        (spot(time="NaN"), "not an ISO 8601"),
        (spot(time="2026-11-21T10:00:00"), "no time zone"),
        (spot(time=1795255200), "valid string"),
        (spot(detail={"instance-id": 12345}), "instance-id: Input should be a valid string"),
        (spot(detail={"instance-id": "i-" + "a" * 40_000}), "instance-id"),
        (spot(detail={"instance-id": "i-1\nforged"}), "instance-id: has characters"),
        (spot(detail=[]), "detail: Input should be an object"),
        ("[1, 2]", "body: Input should be an object"),
        ("", "body: Invalid JSON"),
    ],
)
def test_an_event_no_clock_could_reach_or_of_the_wrong_shape_is_one_error_line(
    body: str, reason: str
) -> None:
    with pytest.raises(MalformedEventError) as raised:
        parse_event(body, NOW)
    message = str(raised.value)
    assert reason in message and "\n" not in message and len(message) < 300


def test_a_health_event_starting_in_year_9999_is_refused() -> None:
    event = seed("eventbridge-health-scheduled-change.json")
    event["detail"]["startTime"] = "Fri, 31 Dec 9999 23:59:59 GMT"
    with pytest.raises(MalformedEventError, match=r"detail\.startTime: is more than 366 days"):
        parse_event(json.dumps(event), NOW)
    event["detail"]["startTime"] = "Mon, 1 Jan 0001 00:00:00 GMT"  # email.utils reads 2001
    with pytest.raises(MalformedEventError, match="startTime"):
        parse_event(json.dumps(event), NOW)


def azure_document(*events: dict[str, Any]) -> bytes:
    return json.dumps({"DocumentIncarnation": 3, "Events": list(events)}).encode()


def preempt(**changes: Any) -> dict[str, Any]:
    event = seed("azure-scheduled-events.json")["Events"][0]
    event.update(changes)
    return event


def test_an_azure_answer_that_is_not_a_notice_never_becomes_one() -> None:
    not_notices = [
        preempt(EventId="OTHER-VM", Resources=["vm-gpu-4"]),
        preempt(EventId="STARTED", EventStatus="Started", NotBefore=""),
        preempt(EventId="LOWER", EventType="preempt"),
        preempt(EventId="FREEZE", EventType="Freeze"),
    ]
    malformed = [
        preempt(EventId="NO-NOT-BEFORE", NotBefore=""),
        preempt(EventId="Y9999", NotBefore="Fri, 31 Dec 9999 23:59:59 GMT"),
        preempt(EventId="Y1970", NotBefore="Thu, 01 Jan 1970 00:00:00 GMT"),
        preempt(EventId="RES-STRING", Resources="vm-gpu-3"),
        preempt(EventId=7),
        {"EventType": None},
        "not an event",
    ]
    good = preempt(EventId="GOOD")
    document = parse_document(azure_document(*not_notices, *malformed, good))
    found, problems = preempts(document, "vm-gpu-3", NOW)
    assert found == [("GOOD", NOW + 30)]
    assert len(problems) == len(malformed)
    assert all("\n" not in p and p.startswith("azure scheduled events: ") for p in problems)


@pytest.mark.parametrize(
    "body",
    [
        b'{"DocumentIncarnation": "3", "Events": []}',
        b'{"DocumentIncarnation": true, "Events": []}',
        b'{"DocumentIncarnation": 3, "Events": {}}',
        azure_document(*([preempt()] * 1001)),
        b"[" * 50_000,
    ],
)
def test_a_scheduled_events_document_of_the_wrong_shape_is_one_error(body: bytes) -> None:
    with pytest.raises(SourceError, match=r"^azure scheduled events: ") as raised:
        parse_document(body)
    assert "\n" not in str(raised.value)


@pytest.fixture
def running() -> Iterator[Callable[[Any], None]]:
    stop = threading.Event()
    threads: list[threading.Thread] = []

    def start(watcher: Any) -> None:
        thread = threading.Thread(target=watcher.run, args=(stop,), daemon=True)
        thread.start()
        threads.append(thread)

    yield start
    stop.set()
    for thread in threads:
        thread.join(bound(30))


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


def dispatch(controller: ControllerInbox, metrics: NoticeMetrics) -> NoticeDispatch:
    forwarder = Forwarder(controller.url, controller.token, metrics, give_up_s=bound(30))
    return NoticeDispatch(forwarder, LocalHooks())


def test_a_malformed_azure_event_never_hides_the_preempt_beside_it(
    running: Callable[[Any], None],
    azure_metadata: FakeAzureImds,
    controller_inbox: ControllerInbox,
) -> None:
    metrics = NoticeMetrics()
    watcher = AzureWatcher(
        azure_metadata.url, dispatch(controller_inbox, metrics), metrics, poll_s=0.05, timeout_s=0.5
    )
    azure_metadata.raw_events.append(
        {
            "EventId": "BROKEN",
            "EventType": "Preempt",
            "Resources": "vm-gpu-3",
            "EventStatus": "Scheduled",
            "NotBefore": formatdate(time.time() + 30, usegmt=True),
        }
    )
    running(watcher)
    event = azure_metadata.add_event("Preempt")
    [notice] = controller_inbox.wait_for(1)
    assert notice.instance_id == "vm-gpu-3" and notice.deadline == float(int(event.not_before))
    assert wait_until(lambda: errors(metrics, "azure") >= 1), "the broken one is counted"
    assert wait_until(lambda: len(azure_metadata.acknowledged) == 1)


def test_a_broken_rebalance_answer_never_hides_the_instance_action(
    running: Callable[[Any], None], aws_imds: FakeImds, controller_inbox: ControllerInbox
) -> None:
    metrics = NoticeMetrics()
    watcher = AwsWatcher(
        aws_imds.url,
        dispatch(controller_inbox, metrics),
        metrics,
        poll_s=0.05,
        timeout_s=0.5,
        max_backoff_s=0.2,
    )
    aws_imds.rebalance = {"noticeTime": "9999-12-31T23:59:59Z"}
    aws_imds.set_instance_action("terminate", time.time() + 120)
    running(watcher)
    [notice] = controller_inbox.wait_for(1)
    assert notice.kind is NoticeKind.TERMINATE
    assert wait_until(lambda: errors(metrics, "aws") >= 1)


def test_an_instance_action_no_clock_could_reach_is_refused(aws_imds: FakeImds) -> None:
    handled: list[AgentNotice] = []
    watcher = AwsWatcher(
        aws_imds.url, lambda n: handled.append(n) or True, NoticeMetrics(), timeout_s=0.5
    )
    aws_imds.instance_action = {"action": "terminate", "time": "9999-12-31T23:59:59Z"}
    with pytest.raises(SourceError, match="instance-action: the time is more than 366 days"):
        watcher.poll()
    aws_imds.instance_action = {"action": "terminate", "time": "1969-07-20T20:17:40Z"}
    with pytest.raises(SourceError, match="days before now"):
        watcher.poll()
    assert handled == []


def test_a_metadata_answer_is_bounded_and_its_names_checked(
    gcp_metadata: FakeGcpMetadata,
) -> None:
    gcp_metadata.set("instance/name", "x" * (MAX_ANSWER + 10))
    watcher = GcpWatcher(gcp_metadata.url, lambda notice: True, NoticeMetrics(), timeout_s=0.5)
    with pytest.raises(SourceError, match=f"the answer is over {MAX_ANSWER} bytes"):
        watcher.instance_name()
    gcp_metadata.set("instance/name", "gpu spot\nforged")
    with pytest.raises(SourceError, match="instance name has characters outside"):
        watcher.instance_name()


def test_a_gcp_preemption_stamped_in_year_9999_is_due_now(gcp: Any) -> None:
    """A preemption record with a garbled time is still a notice (the VM is gone), due now,
    never a deadline no clock could reach."""
    from test_gcp import FLEET, START, gcp_pool
    from test_gcp import provider as gcp_provider_for

    from autoscaler.model.clock import ManualClock

    pool = gcp_pool()
    clock = ManualClock(START)
    gcp_provider = gcp_provider_for(gcp, [pool], clock)
    (victim,) = (i.id for i in gcp_provider.launch(pool, 1, "req-9999", FLEET).instances)
    gcp_provider.list_instances(FLEET)
    clock.advance(60)
    operation = gcp.preempt(victim)
    operation["insertTime"] = operation["endTime"] = "9999-12-31T23:59:59Z"
    gcp_provider.list_instances(FLEET)
    (notice,) = gcp_provider.poll_notices()
    assert (notice.instance_id, notice.deadline) == (victim, START + 60)
