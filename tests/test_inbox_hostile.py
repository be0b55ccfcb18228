"""The notice inbox as a hardened HTTP endpoint (issue 15), over raw TCP: every malformed request
gets a status and a one-line JSON reason (never silence, never a traceback in the log), sizes and
time are bounded, slow clients cannot hold it, and what it accepts is a notice a clock can reach."""

from __future__ import annotations

import hmac
import json
import logging
import select
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from waits import bound

from autoscaler.model.clock import ManualClock
from autoscaler.ops.http_in import HttpLimits
from autoscaler.ops.inbox import MAX_BODY, InboxServer, NoticeInbox

TOKEN = "hostile-test-token"
NOW = 1_700_000_000.0


@pytest.fixture
def server() -> Iterator[InboxServer]:
    inbox = InboxServer(NoticeInbox(ManualClock(NOW)), TOKEN)
    inbox.start()
    yield inbox
    inbox.close()


def exchange(port: int, raw: bytes, timeout_s: float = 30.0) -> bytes:
    """Send ``raw``, close our side, read the whole answer (``timeout_s`` scaled by the knob)."""
    with socket.create_connection(("127.0.0.1", port), timeout=bound(timeout_s)) as connection:
        connection.sendall(raw)
        connection.shutdown(socket.SHUT_WR)
        answer = b""
        while chunk := connection.recv(65536):
            answer += chunk
    return answer


def parsed(answer: bytes) -> tuple[int, dict[str, Any]]:
    head, _, body = answer.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    assert b"Content-Type: application/json" in head
    return status, json.loads(body)


def request(
    body: bytes | str,
    *,
    length: bytes | None = None,
    token: str = TOKEN,
    path: str = "/v1/notices",
    extra: bytes = b"",
) -> bytes:
    data = body.encode() if isinstance(body, str) else body
    size = str(len(data)).encode() if length is None else length
    return (
        f"POST {path} HTTP/1.1\r\nHost: controller\r\nAuthorization: Bearer {token}\r\n"
        "Content-Type: application/json\r\n".encode()
        + b"Content-Length: "
        + size
        + b"\r\n"
        + extra
        + b"\r\n"
        + data
    )


def notice(**fields: Any) -> str:
    return json.dumps({"instance_id": "i-0abc", "deadline": NOW + 120, **fields})


def test_a_well_formed_notice_is_accepted(server: InboxServer) -> None:
    assert parsed(exchange(server.port, request(notice()))) == (202, {"accepted": "i-0abc"})
    [taken] = server.inbox.take()
    assert taken.deadline == NOW + 120


@pytest.mark.parametrize(
    "length",
    [b"abc", b"1e3", b"0x10", "٣".encode(), "１２".encode(), b"-1", b"+5", b"1 2", b"1,1", b""],
)
def test_a_malformed_content_length_is_answered_400_and_logs_no_traceback(
    server: InboxServer, length: bytes, caplog: pytest.LogCaptureFixture, capfd: Any
) -> None:
    with caplog.at_level(logging.DEBUG):
        status, payload = parsed(exchange(server.port, request(notice(), length=length)))
    assert status == 400
    assert payload["error"] == "Content-Length is not a decimal number of bytes"
    assert "Traceback" not in caplog.text + capfd.readouterr().err
    assert server.inbox.take() == []


def test_a_negative_content_length_cannot_smuggle_a_large_body(server: InboxServer) -> None:
    body = notice(padding="x" * 200_000)
    assert parsed(exchange(server.port, request(body, length=b"-1")))[0] == 400
    assert parsed(exchange(server.port, request(body)))[0] == 413
    assert parsed(exchange(server.port, request(b"x" * 10, length=b"99999999999999999999")))[0] == (
        413
    )
    assert server.inbox.take() == []


@pytest.mark.parametrize(
    ("raw", "status"),
    [
        (
            b"POST /v1/notices HTTP/1.1\r\nHost: c\r\nAuthorization: Bearer "
            + TOKEN.encode()
            + b"\r\n\r\n",
            411,
        ),
        (request(notice(), extra=b"Transfer-Encoding: chunked\r\n"), 400),
        (request(notice()).replace(b"Content-Length", b"Transfer-Encoding: chunked\r\nX-Len"), 411),
        (request(notice(), extra=b"Content-Length: 5\r\n"), 400),
        (request(notice()).replace(b"application/json", b"text/plain"), 415),
        (request(notice()).replace(b"application/json", b"application/json; charset=latin-1"), 415),
        (request(notice(), extra=b"".join(b"X-%d: y\r\n" % i for i in range(40))), 431),
        (request(notice(), extra=b"X-Big: " + b"y" * 9000 + b"\r\n"), 431),
        (b"POST /" + b"a" * 5000 + b" HTTP/1.1\r\nHost: c\r\n\r\n", 414),
        (request(notice(), extra=b" folded\r\n"), 400),
        (request(notice(), extra=b"Bad Name: x\r\n"), 400),
        (request(notice(), extra=b"X: a\x00b\r\n"), 400),
        (request(notice()).replace(b"Host: controller\r\n", b""), 400),
        (request(notice()).replace(b"HTTP/1.1", b"HTTP/2.0"), 505),
        (request(notice()).replace(b"HTTP/1.1", b"HTTP/one"), 400),
        (request(notice()).replace(b"POST", b"GET"), 405),
        (request(notice(), path="/v1/other"), 404),
        (request(notice(), extra=b"Expect: coffee\r\n"), 417),
        (b"garbage\r\n\r\n", 400),
        (b"POST /v1/notices HTTP/1.1\r\nHost: c\r\n", 400),
        (request(notice())[:-10], 400),
        (request(notice(), token="wrong"), 401),
        (request(notice()).replace(b"Bearer", b"Basic"), 401),
    ],
)
def test_every_malformed_request_is_answered_with_a_json_reason(
    server: InboxServer, raw: bytes, status: int, caplog: pytest.LogCaptureFixture, capfd: Any
) -> None:
    with caplog.at_level(logging.DEBUG):
        answered, payload = parsed(exchange(server.port, raw))
    assert answered == status, payload
    assert isinstance(payload["error"], str) and payload["error"]
    assert "\n" not in payload["error"]
    assert "Traceback" not in caplog.text + capfd.readouterr().err
    assert server.inbox.take() == []
    assert server.inbox.tally.get("inbox", str(status)) == 1


def test_a_body_announced_with_expect_100_continue_is_taken(server: InboxServer) -> None:
    """curl sends ``Expect: 100-continue`` for larger bodies and waits for the go-ahead."""
    raw = request(notice(), extra=b"Expect: 100-continue\r\n")
    head, _, body = raw.partition(b"\r\n\r\n")
    with socket.create_connection(("127.0.0.1", server.port), timeout=bound(30)) as connection:
        connection.sendall(head + b"\r\n\r\n")
        assert connection.recv(4096) == b"HTTP/1.1 100 Continue\r\n\r\n"
        connection.sendall(body)
        answer = b""
        while chunk := connection.recv(65536):
            answer += chunk
    assert parsed(answer) == (202, {"accepted": "i-0abc"})


@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        ('{"instance_id": "i-1", "deadline": NaN}', "finite number"),
        ('{"instance_id": "i-1", "deadline": Infinity}', "finite number"),
        ('{"instance_id": "i-1", "deadline": 1e999}', "finite number"),
        ('{"instance_id": "i-1", "deadline": 253402300799}', "days after now"),
        ('{"instance_id": "i-1", "deadline": -14182940}', "days before now"),
        ('{"instance_id": "i-1", "deadline": true}', "valid number"),
        ('{"instance_id": "i-1", "deadline": "1700000120"}', "valid number"),
        ('{"instance_id": 7}', "valid string"),
        ('{"instance_id": "i-' + "a" * 40_000 + '"}', "at most 256 characters"),
        ('{"instance_id": "i-1\\nforged log line"}', "match pattern"),
        ('{"instance_id": "i-1", "source": "' + "s" * 100 + '"}', "at most 64 characters"),
        ('{"instance_id": "i-1", "kind": "explode"}', "terminate"),
        ('{"x": ' + "[" * 10_000 + "]" * 10_000 + "}", "recursion limit"),
    ],
)
def test_a_notice_no_clock_could_reach_or_of_the_wrong_types_is_refused(
    server: InboxServer, fields: str, reason: str
) -> None:
    status, payload = parsed(exchange(server.port, request(fields)))
    assert status == 400 and reason in payload["error"], payload
    assert len(payload["error"]) < 300, "the input is never echoed back"
    assert server.inbox.take() == []


@pytest.mark.parametrize(
    "fields",
    [
        '{"job_id": "1", "duration_s": true}',
        '{"job_id": "1", "duration_s": "12"}',
        '{"job_id": "1", "duration_s": NaN}',
        '{"job_id": "1", "duration_s": 1e999}',
        '{"job_id": "1", "at": 253402300799}',
        '{"job_id": "1", "at": NaN}',
        '{"job_id": "' + "j" * 300 + '"}',
        '{"job_id": "1", "node": "n\\u0000"}',
    ],
)
def test_a_checkpoint_report_is_read_as_strictly(server: InboxServer, fields: str) -> None:
    status, _ = parsed(exchange(server.port, request(fields, path="/v1/checkpoints")))
    assert status == 400
    assert server.checkpoints.known() == set()


def test_the_token_is_compared_in_constant_time(
    server: InboxServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    compared: list[tuple[bytes, bytes]] = []
    real = hmac.compare_digest

    def recording(a: bytes, b: bytes) -> bool:
        compared.append((a, b))
        return real(a, b)

    monkeypatch.setattr("autoscaler.ops.inbox.hmac.compare_digest", recording)
    variants = ["", "x", TOKEN[:-1], TOKEN + "x", TOKEN.upper(), " " + TOKEN + "x", "é" + TOKEN]
    for variant in variants:
        assert parsed(exchange(server.port, request(notice(), token=variant)))[0] == 401
    assert parsed(exchange(server.port, request(notice())))[0] == 202
    assert len(compared) == len(variants) + 1, "every token went through compare_digest"


def test_a_repeated_notice_waits_once_and_the_inbox_is_bounded() -> None:
    server = InboxServer(NoticeInbox(ManualClock(NOW), max_pending=3), TOKEN)
    server.start()
    try:
        for _ in range(5):
            assert parsed(exchange(server.port, request(notice())))[0] == 202
        for index in range(2):
            body = notice(instance_id=f"i-{index}")
            assert parsed(exchange(server.port, request(body)))[0] == 202
        status, payload = parsed(exchange(server.port, request(notice(instance_id="i-9"))))
        assert status == 503 and "retry" in payload["error"]
        assert len(server.inbox.take()) == 3
    finally:
        server.close()


def test_slow_clients_are_cut_off_and_never_hold_the_inbox() -> None:
    """Slowloris: clients that dribble their request are answered 408 at the request deadline;
    past the per-peer limit a connection is closed at once; an agent posting meanwhile (once
    the slow ones hold fewer than the limit) is served."""
    limits = HttpLimits(request_s=2.0, max_per_peer=8, max_connections=64)
    server = InboxServer(NoticeInbox(ManualClock(NOW)), TOKEN, limits=limits)
    server.start()
    slow: list[socket.socket] = []
    try:
        for _ in range(6):
            connection = socket.create_connection(("127.0.0.1", server.port), timeout=bound(30))
            connection.sendall(b"POST /v1/notices HTTP/1.1\r\nHo")
            slow.append(connection)
        answers: list[bytes] = []

        def dribble(connection: socket.socket) -> None:
            """A byte every 50 ms, until the server has something to say."""
            try:
                for byte in b"st: c\r\nX-Slow: " + b"y" * 200:
                    if select.select([connection], [], [], 0)[0]:
                        break
                    connection.sendall(bytes([byte]))
                    time.sleep(0.05)
            except OSError:
                pass
            data = b""
            try:
                while chunk := connection.recv(4096):
                    data += chunk
            except OSError:
                pass
            answers.append(data)

        threads = [threading.Thread(target=dribble, args=(c,)) for c in slow]
        for thread in threads:
            thread.start()
        assert parsed(exchange(server.port, request(notice())))[0] == 202, "served meanwhile"
        for thread in threads:
            thread.join(bound(30))
        assert len(answers) == 6
        assert all(parsed(answer)[0] == 408 for answer in answers)

        slots = server._server.slots
        give_up = time.monotonic() + bound(30)
        while slots._count > 0 and time.monotonic() < give_up:
            time.sleep(0.01)  # the slow ones' threads end after their answer's linger
        held = [
            socket.create_connection(("127.0.0.1", server.port), timeout=bound(30))
            for _ in range(8)
        ]
        while slots._count < 8 and time.monotonic() < give_up + bound(30):
            time.sleep(0.01)
        assert slots._count == 8
        extra = socket.create_connection(("127.0.0.1", server.port), timeout=bound(30))
        assert extra.recv(10) == b"", "past the per-peer limit: closed at once, unanswered"
        extra.close()
        for connection in held:
            assert parsed(connection.recv(4096))[0] == 408
            connection.close()
    finally:
        for connection in slow:
            connection.close()
        server.close()


def test_the_body_limit_is_the_documented_one() -> None:
    assert MAX_BODY == HttpLimits().body_bytes == 64 * 1024
