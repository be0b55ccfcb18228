"""The notice boundaries of issue 15's table, fuzzed.

* ``InboxBoundary`` — the node agents' notice inbox over HTTP. Most inputs go through the inbox's
  real request handling over memory (``autoscaler.ops.http_in.respond``: the same code a socket
  runs); a share is sent over raw TCP to a real inbox served beside a real run loop (``Runner``
  over the test rig's controller), which also checks that notices never drive ticks beyond the
  documented rate limit.
* ``CloudNoticesBoundary`` — what the clouds answer: EventBridge bodies (``parse_event``), IMDS
  instance-action and rebalance documents, Azure Scheduled Events documents, GCP metadata
  values, and, for a share, a batch of ten SQS messages on moto's real SQS of which nine are
  malformed: the good warning must come out of the same receive.

Each ``check`` runs the real code and judges what it accepted against an independent reading of
the documented rule (``autoscaler.model.notices``, restated here): instance names of 1 to 256
characters of ``A-Za-z0-9_.:/@-``; deadlines finite, no more than 14 days before the clock's now
and no more than 366 days after; an input built to be refused must be refused, one built to be
good must be taken.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import random
import re
import socket
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from harness import Boundary, Outcome, mutate_text

from autoscaler.model import InterruptionNotice
from autoscaler.model.clock import ManualClock
from autoscaler.model.errors import SourceError
from autoscaler.ops.http_in import HttpLimits, respond
from autoscaler.ops.inbox import InboxServer, NoticeBody, NoticeInbox
from autoscaler.spi.wakeups import CHECKPOINT_WAKE_S, NOTICE_WAKE_S
from node_agent.metadata import AgentNotice, NoticeMetrics
from node_agent.metadata_aws import instance_action, parse_document, rebalance
from node_agent.metadata_azure import parse_document as parse_azure
from node_agent.metadata_azure import preempts
from node_agent.metadata_gcp import GcpWatcher
from providers.aws.events import MalformedEventError, parse_event

NOW = 1_795_255_200.0  # 2026-11-21T10:00:00Z: the seeds' time
DATA = Path(__file__).resolve().parent.parent / "data" / "notices"
TOKEN = "fuzz-inbox-token"
DAY = 86_400.0
PAST_S, AHEAD_S, SKEW_S = 14 * DAY, 366 * DAY, 300.0
_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:/@-]{0,255}")
STATUSES = {202, 400, 401, 404, 405, 408, 411, 413, 414, 415, 417, 431, 503, 505}
Expect = Literal["accept", "reject", "any"]


def name_ok(value: object) -> bool:
    return isinstance(value, str) and _NAME.fullmatch(value) is not None


def deadline_ok(value: object) -> bool:
    return (
        isinstance(value, float | int)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and NOW - PAST_S <= value <= NOW + AHEAD_S
    )


def seed_text(name: str) -> str:
    return (DATA / name).read_text()


# -- the inbox ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class HttpCase:
    raw: bytes
    expect: Expect
    tcp: bool

    def __repr__(self) -> str:
        return f"HttpCase(expect={self.expect}, tcp={self.tcp}, raw={self.raw[:300]!r})"


def http_request(
    body: bytes,
    *,
    path: str = "/v1/notices",
    token: str = TOKEN,
    version: str = "HTTP/1.1",
    content_type: str | None = "application/json",
    length: bytes | None = None,
    extra: Sequence[tuple[str, str]] = (),
    scheme: str = "Bearer",
) -> bytes:
    lines = [f"POST {path} {version}"]
    if version == "HTTP/1.1":
        lines.append("Host: controller:8443")
    lines.append(f"Authorization: {scheme} {token}")
    if content_type is not None:
        lines.append(f"Content-Type: {content_type}")
    head = "\r\n".join(lines + [f"{name}: {value}" for name, value in extra]).encode("latin-1")
    size = str(len(body)).encode() if length is None else length
    return head + b"\r\nContent-Length: " + size + b"\r\n\r\n" + body


def valid_name(rng: random.Random, owned: str | None = None) -> str:
    if owned is not None and rng.random() < 0.1:
        return owned
    alphabet = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.:/@-"
    size = rng.choice([1, 2, 8, 19, 63, 255, 256])
    return rng.choice("abc0_") + "".join(rng.choice(alphabet) for _ in range(size - 1))


def valid_body(rng: random.Random, owned: str | None) -> tuple[str, bytes]:
    if rng.random() < 0.25:
        body: dict[str, Any] = {"job_id": rng.choice(["4242", "4242_7", "77+1", "job-a"])}
        if rng.random() < 0.7:
            body["duration_s"] = rng.choice([0, 0.5, 12.5, 3600])
        if rng.random() < 0.5:
            body["at"] = NOW - rng.uniform(0, 3 * DAY)
        if rng.random() < 0.5:
            body["node"] = valid_name(rng)
        return "/v1/checkpoints", json.dumps(body).encode()
    notice: dict[str, Any] = {"instance_id": valid_name(rng, owned)}
    if rng.random() < 0.8:
        notice["kind"] = rng.choice(["terminate", "rebalance"])
    if rng.random() < 0.8:
        notice["deadline"] = rng.choice(
            [None, NOW + 120, NOW + 30, NOW - 60, NOW + 100 * DAY, NOW - 13 * DAY, int(NOW)]
        )
    if rng.random() < 0.8:
        notice["source"] = rng.choice(["aws-imds", "gcp-metadata", "azure-scheduled-events"])
    if rng.random() < 0.1:
        notice["extra"] = {"ignored": [1, 2, 3]}
    return "/v1/notices", json.dumps(notice).encode()


def valid_request(rng: random.Random, owned: str | None) -> bytes:
    path, body = valid_body(rng, owned)
    version = rng.choice(["HTTP/1.1", "HTTP/1.1", "HTTP/1.0"])
    content_type = rng.choice(
        ["application/json", None, "application/json; charset=utf-8", "Application/JSON"]
    )
    extra = rng.choice([(), (("User-Agent", "gpu-autoscaler-agent/0.1"),), (("X-A", "b"),)])
    scheme = rng.choice(["Bearer", "bearer"])
    return http_request(
        body, path=path, version=version, content_type=content_type, extra=extra, scheme=scheme
    )


HOSTILE_LENGTHS = [b"abc", b"1e3", b"0x40", "٣٣".encode(), "１２".encode(), b"-1", b"+5", b"1 2"]
HOSTILE_DEADLINES = [
    "NaN",
    "Infinity",
    "-Infinity",
    "1e999",
    "-1e999",
    "253402300799",
    "-14182940",
    "0",
    "true",
    "false",
    '"1795255320"',
    "[1795255320]",
    "{}",
    "1" * 400,
]


def hostile_framing(rng: random.Random) -> bytes:
    notice = json.dumps({"instance_id": "i-0abc", "deadline": NOW + 120}).encode()
    choice = rng.randrange(16)
    if choice == 0:
        return http_request(notice, length=rng.choice(HOSTILE_LENGTHS))
    if choice == 1:
        return http_request(b"x" * 200_000, length=b"-1")
    if choice == 2:
        return http_request(notice + b" " * 70_000)
    if choice == 3:
        return http_request(notice, extra=(("Transfer-Encoding", "chunked"),))
    if choice == 4:
        return http_request(notice, extra=(("Content-Length", "5"),))
    if choice == 5:
        return http_request(notice, content_type=rng.choice(["text/plain", "application/xml"]))
    if choice == 6:
        return http_request(notice, extra=[(f"X-{i}", "y") for i in range(rng.choice([33, 200]))])
    if choice == 7:
        return http_request(notice, extra=(("X-Big", "y" * rng.choice([9000, 70_000])),))
    if choice == 8:
        return http_request(notice, path="/" + "a" * rng.choice([2000, 70_000]))
    if choice == 9:
        return http_request(notice, version=rng.choice(["HTTP/2.0", "HTTP/0.9", "HTTP/1.1x"]))
    if choice == 10:
        token = rng.choice(["", "x", TOKEN[:-1], TOKEN + "x", TOKEN.upper(), "é" + TOKEN])
        return http_request(notice, token=token)
    if choice == 11:
        return http_request(notice).replace(b"Host: controller:8443\r\n", b"")
    if choice == 12:
        return http_request(notice, extra=((" folded", "x"),))
    if choice == 13:
        return http_request(notice).replace(b"POST", rng.choice([b"GET", b"PUT", b"P OST"]))
    if choice == 14:
        return http_request(notice)[: rng.randrange(1, 60)]
    return rng.choice([b"\x16\x03\x01\x02\x00", b"SSH-2.0-x\r\n\r\n", b"GET\r\n\r\n"])


def hostile_body(rng: random.Random) -> bytes:
    choice = rng.randrange(7)
    if choice == 0:
        return (
            '{"instance_id": "i-1", "deadline": ' + rng.choice(HOSTILE_DEADLINES) + "}"
        ).encode()
    if choice == 1:
        name = rng.choice(["i-" + "a" * 40_000, "", "i 1", "i-1\nforged", "é", "i-\u202e1", 7])
        return json.dumps({"instance_id": name}).encode()
    if choice == 2:
        return json.dumps({"instance_id": "i-1", "kind": rng.choice(["explode", 1, None])}).encode()
    if choice == 3:
        depth = rng.choice([300, 5000, 30_000])
        return ('{"instance_id": "i-1", "x": ' + "[" * depth + "]" * depth + "}").encode()
    if choice == 4:
        return json.dumps({"instance_id": "i-1", "source": "s" * 65}).encode()
    if choice == 5:
        return rng.choice([b"", b"null", b"[]", b'"i-1"', b"\xff\xfe", b"{", b"\x00"])
    field = rng.choice(
        [
            '"duration_s": true',
            '"duration_s": "12"',
            '"duration_s": -1',
            '"duration_s": NaN',
            '"at": 1e999',
            '"at": 253402300799',
        ]
    )
    return ('{"job_id": "1", ' + field + "}").encode()


def parse_answer(answer: bytes) -> tuple[int, dict[str, Any]]:
    """The final answer (after any 100 Continue); raises ValueError when there is none."""
    while answer.startswith(b"HTTP/1.1 100 "):
        answer = answer.split(b"\r\n\r\n", 1)[1]
    head, separator, body = answer.partition(b"\r\n\r\n")
    if not separator:
        raise ValueError(f"not an HTTP answer: {answer[:80]!r}")
    status = int(head.split(b" ", 2)[1])
    lengths = [line for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:")]
    if len(lengths) != 1 or int(lengths[0].split(b":")[1]) != len(body):
        raise ValueError("the answer's Content-Length does not match its body")
    return status, json.loads(body)


class RecordingInbox(NoticeInbox):
    """The real inbox, remembering what it accepted so the check can judge it after a tick has
    taken it."""

    def __init__(self, clock: ManualClock) -> None:
        super().__init__(clock)
        self.accepted: list[InterruptionNotice] = []

    def post(self, body: NoticeBody) -> InterruptionNotice | None:
        notice = super().post(body)
        if notice is not None:
            self.accepted.append(notice)
        return notice


class _Live:
    """A real inbox served beside a real run loop, as ``gpu-autoscaler run`` serves it."""

    def __init__(self) -> None:
        from fakes import job, pool, rig

        from autoscaler.app.runner import Runner

        self.rig = rig([pool("a")], {"a": 1.0})
        self.rig.clock.advance(NOW - self.rig.clock.now())
        self.rig.queue.jobs = [job("x")]
        self.rig.controller.tick()
        self.rig.cloud.boot_all()
        (self.owned,) = self.rig.cloud.instances
        self.inbox = RecordingInbox(self.rig.clock)
        self.server = InboxServer(self.inbox, TOKEN, checkpoints=None)
        self.rig.controller.signals.notices = (self.inbox,)
        self.runner = Runner(self.rig.controller, {"fake": self.rig.cloud}, [self.server])
        self.loop = threading.Thread(target=self.runner.run, daemon=True)
        self.loop.start()
        give_up = time.monotonic() + 30
        while self.rig.controller.ticks < 2 and time.monotonic() < give_up:
            time.sleep(0.01)
        self.started = time.monotonic()
        self.ticks_at_start = self.rig.controller.ticks

    def exchange(self, raw: bytes) -> bytes:
        with socket.create_connection(("127.0.0.1", self.server.port), timeout=30) as connection:
            try:
                connection.sendall(raw)
                connection.shutdown(socket.SHUT_WR)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the server answered and closed before taking everything: read it
            answer = b""
            try:
                while chunk := connection.recv(65536):
                    answer += chunk
            except ConnectionResetError:
                pass
        return answer

    def ticks_within_bound(self) -> str | None:
        elapsed = time.monotonic() - self.started
        tally = self.runner.wakeups.tally
        at_once = tally.get("notice-wake", "at-once")
        period = self.rig.controller.config.tick_seconds
        bound = (
            3
            + at_once
            + 2 * elapsed / NOTICE_WAKE_S
            + 2 * elapsed / CHECKPOINT_WAKE_S
            + elapsed / period
        )
        ticks = self.rig.controller.ticks - self.ticks_at_start
        if ticks > bound:
            return f"{ticks} ticks in {elapsed:.1f} s with {at_once} owned new notices"
        return None

    def close(self) -> None:
        self.runner.stop()
        self.loop.join(15)


class InboxBoundary:
    name = "notice inbox over HTTP (a real gpu-autoscaler run, raw TCP)"
    tcp_share = 0.15

    def __init__(self) -> None:
        self._memory: InboxServer | None = None
        self._live: _Live | None = None
        self.limits = HttpLimits()

    @property
    def memory(self) -> InboxServer:
        if self._memory is None:
            self._memory = InboxServer(NoticeInbox(ManualClock(NOW)), TOKEN)
        return self._memory

    @property
    def live(self) -> _Live:
        if self._live is None:
            self._live = _Live()
        return self._live

    def seeds(self) -> Sequence[object]:
        notice = seed_text("inbox-notice.json").strip().encode()
        checkpoint = seed_text("inbox-checkpoint.json").strip().encode()
        return [
            HttpCase(http_request(notice), "accept", False),
            HttpCase(http_request(checkpoint, path="/v1/checkpoints"), "accept", False),
            HttpCase(http_request(b'{"instance_id": "vm-7"}'), "accept", True),
        ]

    def generate(self, rng: random.Random) -> object:
        tcp = rng.random() < self.tcp_share
        owned = self.live.owned if tcp and self._live is not None else None
        choice = rng.random()
        if choice < 0.15:
            return HttpCase(valid_request(rng, owned), "accept", tcp)
        if choice < 0.4:
            return HttpCase(hostile_framing(rng), "reject", tcp)
        if choice < 0.6:
            path = rng.choice(["/v1/notices", "/v1/checkpoints"])
            return HttpCase(http_request(hostile_body(rng), path=path), "reject", tcp)
        seed = rng.choice(self.seeds())
        assert isinstance(seed, HttpCase)
        head, _, body = seed.raw.partition(b"\r\n\r\n")
        if rng.random() < 0.5:
            mutated = mutate_text(body.decode(), rng).encode("utf-8", errors="surrogatepass")
            return HttpCase(http_request(mutated, path=_path(head)), "any", tcp)
        raw = mutate_text(seed.raw.decode("latin-1"), rng)
        return HttpCase(raw.encode("utf-8", errors="surrogatepass"), "any", tcp)

    def check(self, data: object) -> Outcome:
        assert isinstance(data, HttpCase)
        if data.tcp:
            live = self.live
            before = len(live.inbox.accepted)
            answer = live.exchange(data.raw)
        else:
            server = self.memory
            answer = respond(data.raw, server.handle, self.limits)
        if not answer:
            if data.raw.strip(b"\r\n"):
                return Outcome.wrong("a request got no HTTP answer")
            return Outcome.rejected("an empty connection, closed")
        try:
            status, payload = parse_answer(answer)
        except ValueError as exc:
            return Outcome.wrong(f"a malformed answer: {exc}")
        if status == 500:
            raise RuntimeError(f"the inbox answered 500: {payload}")
        if status not in STATUSES:
            return Outcome.wrong(f"status {status} is not one the inbox documents")
        if status != 202:
            error = payload.get("error")
            if not isinstance(error, str) or not error or "\n" in error or len(error) > 400:
                return Outcome.wrong(f"status {status} without a one-line JSON reason")
            if data.expect == "accept":
                return Outcome.wrong(f"a good request was refused: {status} {error}")
            return Outcome.rejected(f"{status} {error}")
        if data.expect == "reject":
            return Outcome.wrong("a request built to be refused was accepted")
        if data.tcp:
            taken = live.inbox.accepted[before:]
            problem = live.ticks_within_bound()
            if problem is not None:
                return Outcome.wrong(f"notices drove ticks past the rate limit: {problem}")
        else:
            taken = self.memory.inbox.take()
        return _judge_accepted(payload, taken)

    def close(self) -> None:
        if self._live is not None:
            self._live.close()
        if self._memory is not None:
            self._memory.close()


def _path(head: bytes) -> str:
    parts = head.split(b" ")
    return parts[1].decode("latin-1") if len(parts) > 1 else "/v1/notices"


def _judge_accepted(payload: dict[str, Any], taken: list[InterruptionNotice]) -> Outcome:
    accepted = payload.get("accepted")
    if not isinstance(accepted, str):
        return Outcome.wrong(f"a 202 without what it accepted: {payload}")
    notices = [n for n in taken if n.instance_id == accepted]
    if not notices:
        # a checkpoint report (its job id) or a repeat of a notice already waiting
        return Outcome.accepted("checkpoint or repeat")
    for notice in notices:
        if not name_ok(notice.instance_id):
            return Outcome.wrong(f"an instance name outside the rule: {notice.instance_id!r:.80}")
        if notice.deadline is not None and not deadline_ok(notice.deadline):
            return Outcome.wrong(f"a deadline no clock could reach: {notice.deadline!r}")
    return Outcome.accepted()


# -- what the clouds answer ---------------------------------------------------------------------

CloudKind = Literal["eventbridge", "imds-action", "imds-rebalance", "azure", "gcp", "sqs-batch"]
AZURE_VM = "vm-gpu-3"
AWS_INSTANCE = "i-0123456789abcdef0"
EVENT_SEEDS = (
    "eventbridge-spot-interruption-warning.json",
    "eventbridge-rebalance-recommendation.json",
    "eventbridge-state-change.json",
    "eventbridge-health-scheduled-change.json",
)


@dataclass(frozen=True)
class CloudCase:
    kind: CloudKind
    payload: str
    expect: Expect
    batch: tuple[str, ...] = ()
    key: str = ""

    def __repr__(self) -> str:
        return f"CloudCase({self.kind}, expect={self.expect}, payload={self.payload[:300]!r})"


def hostile_events(rng: random.Random) -> str:
    """An EventBridge body built to be refused."""
    event = json.loads(seed_text(rng.choice(EVENT_SEEDS)))
    choice = rng.randrange(10)
    if choice == 0:
        depth = rng.choice([300, 50_000])
        return '{"detail": ' + "[" * depth + "]" * depth + "}"
    if choice == 1:
        event["time"] = rng.choice(
            ["9999-12-31T23:59:59Z", "1969-07-20T20:17:40Z", "NaN", "", "2026-11-21T10:00:00"]
        )
    elif choice == 2:
        event["time"] = rng.choice([1795255200, None, True, ["2026-11-21T10:00:00Z"]])
    elif choice == 3 and "instance-id" in event["detail"]:
        event["detail"]["instance-id"] = rng.choice([12345, None, "i-" + "a" * 40_000, "vol-1"])
    elif choice == 4 and "startTime" in event["detail"]:
        event["detail"]["startTime"] = rng.choice(
            ["Fri, 31 Dec 9999 23:59:59 GMT", "Mon, 1 Jan 0001 00:00:00 GMT", "soon"]
        )
    elif choice == 5:
        event["detail-type"] = rng.choice(["Surprise", "", "EC2 Spot Instance Interruption"])
    elif choice == 6:
        event["detail"] = rng.choice([[], "x", None, 7])
    elif choice == 7:
        return rng.choice(["", "{not json", "[1, 2]", "null", '"x"', "\ufeff{}", "\x00"])
    elif choice == 8:
        event["time"] = "2026-11-21T10:00:00Z" + " " * 100
    else:
        event.pop(rng.choice(["time", "detail", "detail-type"]))
    return json.dumps(event)


def valid_event(rng: random.Random, seed: str | None = None) -> str:
    event = json.loads(seed_text(seed or rng.choice(EVENT_SEEDS)))
    event["time"] = time.strftime(
        "%Y-%m-%dT%H:%M:%SZ", time.gmtime(NOW - rng.choice([0, 5, 3600, 13 * DAY]))
    )
    if "instance-id" in event["detail"]:
        event["detail"]["instance-id"] = "i-" + uuid.UUID(int=rng.getrandbits(128)).hex[:17]
    return json.dumps(event)


def hostile_azure(rng: random.Random) -> str:
    document = json.loads(seed_text("azure-scheduled-events.json"))
    preempt = document["Events"][0]
    choice = rng.randrange(9)
    if choice == 0:
        preempt["NotBefore"] = rng.choice(
            ["Fri, 31 Dec 9999 23:59:59 GMT", "Thu, 01 Jan 1970 00:00:00 GMT", "", "soon"]
        )
    elif choice == 1:
        preempt["Resources"] = rng.choice([AZURE_VM, [AZURE_VM + "x"], [], None, [7]])
    elif choice == 2:
        preempt["EventType"] = rng.choice(["preempt", "Preempt ", "Terminate", None, 7])
    elif choice == 3:
        preempt["EventStatus"] = rng.choice(["Started", "scheduled", "", None])
    elif choice == 4:
        preempt["EventId"] = rng.choice(["", 7, None, "x" * 500, "a b"])
    elif choice == 5:
        document["DocumentIncarnation"] = rng.choice(["2", True, None, 1.5])
    elif choice == 6:
        document["Events"] = rng.choice([preempt, None, "x", [None, 3]])
    elif choice == 7:
        document["Events"] = [preempt] * 1001
    else:
        return rng.choice(['{"DocumentIncarnation": "x", "Events": 3', "", "[]", "<html>"])
    return json.dumps(document)


def sqs_safe(text: str) -> str:
    """What SQS lets a message body hold (XML 1.0 characters), at most 200,000 of them."""
    allowed = (
        c
        for c in text
        if c in "\t\n\r" or "\x20" <= c <= "\ud7ff" or "\ue000" <= c <= "\ufffd" or c > "\uffff"
    )
    return "".join(allowed)[:200_000] or " "


def hostile_imds(rng: random.Random, kind: str) -> str:
    good = "2026-11-21T10:02:00Z"
    if rng.random() < 0.3:
        return rng.choice(["", "[]", "{", "null", "<html>not json", "[" * 5000])
    if kind == "imds-rebalance":
        when = rng.choice(["9999-12-31T23:59:59Z", "1969-07-20T20:17:40Z", 5, None, "NaN", ""])
        return json.dumps({"noticeTime": when})
    if rng.random() < 0.5:
        return json.dumps({"action": rng.choice(["reboot", 1, None, "TERMINATE"]), "time": good})
    when = rng.choice(["9999-12-31T23:59:59Z", "1969-07-20T20:17:40Z", 5, None, "x" * 100])
    return json.dumps({"action": "terminate", "time": when})


class _Sqs:
    """moto's SQS server, started once for the boundary."""

    def __init__(self) -> None:
        import boto3
        from moto.server import ThreadedMotoServer

        # the watcher's one line per malformed message is the behaviour under test, not output
        logging.getLogger("providers.aws.notices").setLevel(logging.ERROR)
        logging.getLogger("werkzeug").setLevel(logging.ERROR)

        os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
        os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing-secret")
        self.server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        self.server.start()
        host, port = self.server.get_host_and_port()
        self.client = boto3.client(
            "sqs", region_name="us-east-1", endpoint_url=f"http://{host}:{port}"
        )

    def close(self) -> None:
        self.server.stop()


class CloudNoticesBoundary:
    name = "cloud metadata answers, EventBridge/SQS messages"
    sqs_share = 0.03

    def __init__(self) -> None:
        self._sqs: _Sqs | None = None
        self.gcp_handled: list[AgentNotice] = []
        self.gcp = GcpWatcher(
            "http://127.0.0.1:9", self._gcp_notice, NoticeMetrics(), clock=lambda: NOW
        )
        self.gcp._name = "gpu-spot-7"

    def _gcp_notice(self, notice: AgentNotice) -> bool:
        self.gcp_handled.append(notice)
        return True

    def seeds(self) -> Sequence[object]:
        seeds: list[CloudCase] = [
            CloudCase("eventbridge", seed_text(n), "accept") for n in EVENT_SEEDS
        ]
        seeds += [
            CloudCase("imds-action", seed_text("imds-instance-action.json"), "accept"),
            CloudCase("imds-rebalance", seed_text("imds-rebalance.json"), "accept"),
            CloudCase("azure", seed_text("azure-scheduled-events.json"), "accept"),
            CloudCase("gcp", "TRUE", "accept", key="preempted"),
            CloudCase("gcp", "TERMINATE_ON_HOST_MAINTENANCE", "accept", key="maintenance-event"),
        ]
        return seeds

    def generate(self, rng: random.Random) -> object:
        if rng.random() < self.sqs_share:
            bad = tuple(sqs_safe(hostile_events(rng)) for _ in range(9))
            good = valid_event(rng, "eventbridge-spot-interruption-warning.json")
            return CloudCase("sqs-batch", good, "accept", bad)
        choice = rng.random()
        kind: CloudKind = rng.choice(
            ["eventbridge", "eventbridge", "imds-action", "imds-rebalance", "azure", "gcp"]
        )
        if kind == "eventbridge":
            if choice < 0.2:
                return CloudCase(kind, valid_event(rng), "accept")
            if choice < 0.5:
                return CloudCase(kind, hostile_events(rng), "reject")
        if kind == "azure" and choice < 0.4:
            return CloudCase(kind, hostile_azure(rng), "reject")
        if kind in ("imds-action", "imds-rebalance") and choice < 0.4:
            return CloudCase(kind, hostile_imds(rng, kind), "reject")
        if kind == "gcp":
            key = rng.choice(["preempted", "maintenance-event"])
            value = rng.choice(
                ["TRUE", "FALSE", "NONE", "MIGRATE_ON_HOST_MAINTENANCE", "MAYBE", "true", "", "x"]
            )
            value = mutate_text(value, rng) if choice < 0.5 else value
            return CloudCase(kind, value, "any", key=key)
        seed = rng.choice([s for s in self.seeds() if isinstance(s, CloudCase) and s.kind == kind])
        assert isinstance(seed, CloudCase)
        return dataclasses.replace(seed, payload=mutate_text(seed.payload, rng), expect="any")

    def check(self, data: object) -> Outcome:
        assert isinstance(data, CloudCase)
        if data.kind == "eventbridge":
            return self._eventbridge(data)
        if data.kind in ("imds-action", "imds-rebalance"):
            return self._imds(data)
        if data.kind == "azure":
            return self._azure(data)
        if data.kind == "gcp":
            return self._gcp(data)
        return self._sqs_batch(data)

    def _eventbridge(self, data: CloudCase) -> Outcome:
        try:
            event = parse_event(data.payload, NOW)
        except MalformedEventError as exc:
            if data.expect == "accept":
                return Outcome.wrong(f"a good event was refused: {exc}")
            return Outcome.rejected(str(exc))
        if data.expect == "reject":
            return Outcome.wrong(f"an event built to be refused was read: {event}")
        if event is None:
            return Outcome.accepted("asks nothing of us")
        if not event.instance_ids or not all(
            name_ok(i) and i.startswith("i-") for i in event.instance_ids
        ):
            return Outcome.wrong(f"instance ids outside the rule: {event.instance_ids!r:.100}")
        if not (NOW - PAST_S <= event.at <= NOW + SKEW_S):
            return Outcome.wrong(f"an event time no clock could reach: {event.at!r}")
        if event.deadline is not None and not deadline_ok(event.deadline):
            return Outcome.wrong(f"a deadline no clock could reach: {event.deadline!r}")
        return Outcome.accepted()

    def _imds(self, data: CloudCase) -> Outcome:
        read = instance_action if data.kind == "imds-action" else rebalance
        try:
            document = parse_document(data.kind, data.payload.encode("utf-8", "surrogatepass"))
            notice = read(document, AWS_INSTANCE, NOW)
        except SourceError as exc:
            if data.expect == "accept":
                return Outcome.wrong(f"a good document was refused: {exc}")
            return Outcome.rejected(str(exc))
        if notice.deadline is not None and not deadline_ok(notice.deadline):
            return Outcome.wrong(f"a deadline no clock could reach: {notice.deadline!r}")
        if data.kind == "imds-action":
            # read as the watcher reads it: bytes, so a UTF-8 BOM is allowed the same way
            action = json.loads(data.payload.encode("utf-8", "surrogatepass")).get("action")
            if action not in ("terminate", "stop", "hibernate") or notice.deadline is None:
                return Outcome.wrong(f"action {action!r:.40} became a notice")
        return Outcome.accepted()

    def _azure(self, data: CloudCase) -> Outcome:
        try:
            document = parse_azure(data.payload.encode("utf-8", "surrogatepass"))
        except SourceError as exc:
            if data.expect == "accept":
                return Outcome.wrong(f"a good document was refused: {exc}")
            return Outcome.rejected(str(exc))
        found, problems = preempts(document, AZURE_VM, NOW)
        if found:
            try:
                events = json.loads(data.payload)["Events"]
            except (ValueError, KeyError, TypeError, RecursionError):
                return Outcome.wrong("notices from a document json cannot read")
            for event_id, deadline in found:
                if not any(_is_notice(e, event_id) for e in events) or not deadline_ok(deadline):
                    return Outcome.wrong(f"event {event_id!r:.60} is not a notice, yet became one")
        if data.expect == "accept" and (problems or len(found) != 1):
            return Outcome.wrong(f"the good document gave {found} and {problems[:1]}")
        if data.expect == "reject" and found and not problems:
            return Outcome.wrong(f"a document built to be refused gave {found}")
        if problems and not found:
            return Outcome.rejected(problems[0])
        return Outcome.accepted(f"{len(found)} notice(s), {len(problems)} event(s) refused")

    def _gcp(self, data: CloudCase) -> Outcome:
        self.gcp_handled.clear()
        self.gcp._seen = type(self.gcp._seen)()
        preempted = data.key == "preempted"
        notice_value = "TRUE" if preempted else "TERMINATE_ON_HOST_MAINTENANCE"
        try:
            if preempted:
                self.gcp.on_preempted(data.payload, "etag")
            else:
                self.gcp.on_maintenance(data.payload, "etag")
        except SourceError as exc:
            if data.expect == "accept":
                return Outcome.wrong(f"a good value was refused: {exc}")
            return Outcome.rejected(str(exc))
        if bool(self.gcp_handled) != (data.payload == notice_value):
            return Outcome.wrong(f"{data.key} {data.payload!r:.40} read as {self.gcp_handled}")
        for notice in self.gcp_handled:
            if notice.deadline is not None and not deadline_ok(notice.deadline):
                return Outcome.wrong(f"a deadline no clock could reach: {notice.deadline!r}")
        return Outcome.accepted()

    def _sqs_batch(self, data: CloudCase) -> Outcome:
        from providers.aws.notices import NoticeWatcher

        if self._sqs is None:
            self._sqs = _Sqs()
        client = self._sqs.client
        queue = client.create_queue(QueueName=f"fuzz-{uuid.uuid4().hex[:12]}")["QueueUrl"]
        try:
            bodies = [*data.batch]
            bodies.insert(len(bodies) // 2, data.payload)
            entries = [{"Id": str(i), "MessageBody": b} for i, b in enumerate(bodies)]
            sent = client.send_message_batch(QueueUrl=queue, Entries=entries)
            if len(sent.get("Successful", [])) != 10:
                raise RuntimeError(f"moto refused part of the batch: {sent.get('Failed')}")
            watcher = NoticeWatcher(client, queue, ManualClock(NOW), lambda _: "p", wait_s=0)
            seen = 0
            for _ in range(5):
                seen += watcher.poll_once()
                if seen >= 10:
                    break
            good = json.loads(data.payload)["detail"].get("instance-id")
            taken = watcher.take()
            if good is not None and good not in {n.instance_id for n in taken}:
                return Outcome.wrong("the good warning in the batch was lost")
            if watcher.malformed != 9:
                return Outcome.wrong(f"{watcher.malformed} of 9 malformed messages counted")
            return Outcome.accepted()
        finally:
            client.delete_queue(QueueUrl=queue)

    def close(self) -> None:
        if self._sqs is not None:
            self._sqs.close()


def _is_notice(event: object, event_id: str) -> bool:
    """The documented rule, read independently: a Preempt scheduled for this VM."""
    return (
        isinstance(event, dict)
        and event.get("EventId") == event_id
        and event.get("EventType") == "Preempt"
        and isinstance(event.get("Resources"), list)
        and AZURE_VM in event["Resources"]
        and event.get("EventStatus") == "Scheduled"
        and isinstance(event.get("NotBefore"), str)
    )


BOUNDARIES: list[Boundary] = [InboxBoundary(), CloudNoticesBoundary()]
