"""The notice inbox over a real socket: what an agent's post gets back, what reaches the next
tick, and that the shared token never reaches a log."""

from __future__ import annotations

import datetime
import http.client
import ipaddress
import json
import logging
import ssl
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from waits import bound

from autoscaler.app.assembly import build_inbox
from autoscaler.model import NoticeKind
from autoscaler.model.clock import ManualClock
from autoscaler.model.config import ControllerConfig
from autoscaler.model.errors import InputError
from autoscaler.ops.inbox import MAX_BODY, InboxServer, NoticeInbox

TOKEN = "s3cret-token-value"


@pytest.fixture
def server() -> Iterator[InboxServer]:
    inbox = InboxServer(NoticeInbox(ManualClock(500.0)), TOKEN)
    woken = threading.Event()
    inbox.start(woken.set)
    inbox.woken = woken  # type: ignore[attr-defined]
    yield inbox
    inbox.close()


def post(
    port: int,
    body: bytes,
    token: str | None = TOKEN,
    path: str = "/v1/notices",
    tls: ssl.SSLContext | None = None,
) -> tuple[int, dict[str, str]]:
    if tls is None:
        connection: http.client.HTTPConnection = http.client.HTTPConnection(
            "127.0.0.1", port, timeout=bound(30)
        )
    else:
        connection = http.client.HTTPSConnection("127.0.0.1", port, timeout=bound(30), context=tls)
    headers = {"Content-Type": "application/json"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    connection.request("POST", path, body, headers)
    response = connection.getresponse()
    payload = json.loads(response.read() or b"{}")
    connection.close()
    return response.status, payload


def notice(instance_id: str = "i-0abc", **extra: object) -> bytes:
    return json.dumps({"instance_id": instance_id, "source": "aws-imds", **extra}).encode()


def test_an_accepted_notice_wakes_the_loop_and_reaches_the_next_tick(
    server: InboxServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    status, payload = post(server.port, notice(deadline=620.0, kind="terminate"))
    assert (status, payload) == (202, {"accepted": "i-0abc"})
    assert server.woken.wait(bound(30))  # type: ignore[attr-defined]
    (taken,) = server.inbox.take()
    assert (taken.instance_id, taken.kind, taken.deadline, taken.received_at) == (
        "i-0abc",
        NoticeKind.TERMINATE,
        620.0,
        500.0,
    )
    assert server.inbox.take() == [], "a notice is taken once"
    assert TOKEN not in caplog.text


@pytest.mark.parametrize("token", [None, "wrong", TOKEN + "x", ""])
def test_a_wrong_or_missing_token_is_refused_and_never_logged(
    server: InboxServer, caplog: pytest.LogCaptureFixture, token: str | None
) -> None:
    caplog.set_level(logging.DEBUG)
    status, _ = post(server.port, notice(), token=token)
    assert status == 401
    assert server.inbox.take() == []
    assert server.inbox.rejected == 1
    assert TOKEN not in caplog.text


@pytest.mark.parametrize(
    "body",
    [b"not json", b"{}", json.dumps({"instance_id": "i-1", "kind": "explode"}).encode()],
)
def test_a_body_that_is_not_a_notice_is_refused(server: InboxServer, body: bytes) -> None:
    status, payload = post(server.port, body)
    assert status == 400 and payload["error"]
    assert server.inbox.take() == []


def test_an_oversized_body_and_an_unknown_path_are_refused(server: InboxServer) -> None:
    assert post(server.port, b"x" * (MAX_BODY + 1))[0] == 413
    assert post(server.port, notice(), path="/v1/other")[0] == 404
    assert server.inbox.take() == []


def self_signed(directory: Path) -> tuple[Path, Path]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = directory / "inbox.crt", directory / "inbox.key"
    cert_path.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path


def config(**inbox: object) -> ControllerConfig:
    return ControllerConfig.model_validate({"fleet_id": "f", "inbox": inbox})


def test_tls_inbox_built_from_config_accepts_a_verified_agent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cert, key = self_signed(tmp_path)
    monkeypatch.setenv("INBOX_TOKEN", TOKEN)
    built = build_inbox(
        config(
            listen={"host": "127.0.0.1", "port": 0},
            token_env="INBOX_TOKEN",
            tls_cert=str(cert),
            tls_key=str(key),
        ),
        ManualClock(1.0),
    )
    assert built is not None
    built.start()
    try:
        client = ssl.create_default_context(cafile=str(cert))
        assert post(built.port, notice("vm-7"), tls=client)[0] == 202
        assert [n.instance_id for n in built.inbox.take()] == ["vm-7"]
        with pytest.raises(ssl.SSLError):
            post(built.port, notice("vm-8"), tls=ssl.create_default_context())
        plain = http.client.HTTPConnection("127.0.0.1", built.port, timeout=2)
        with pytest.raises((ConnectionError, http.client.HTTPException, OSError)):
            plain.request("POST", "/v1/notices", notice("vm-9"))
            plain.getresponse()
        assert built.inbox.take() == []
    finally:
        built.close()


def test_the_token_can_come_from_a_file(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    built = build_inbox(
        config(listen={"host": "127.0.0.1", "port": 0}, token_file=str(token_file)),
        ManualClock(1.0),
    )
    assert built is not None
    built.start()
    try:
        assert post(built.port, notice())[0] == 202
    finally:
        built.close()


def test_an_inbox_without_a_token_does_not_start(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NO_SUCH_TOKEN", raising=False)
    with pytest.raises(InputError, match=r"inbox\.token_env: .*NO_SUCH_TOKEN is empty"):
        build_inbox(config(token_env="NO_SUCH_TOKEN"), ManualClock(1.0), where="c.yaml")


def test_half_a_tls_pair_or_a_bad_certificate_is_one_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(ValueError, match="tls_cert and tls_key go together"):
        config(tls_cert="x.crt")
    monkeypatch.setenv("INBOX_TOKEN", TOKEN)
    bogus = tmp_path / "bogus.pem"
    bogus.write_text("not a certificate")
    with pytest.raises(InputError, match=r"inbox\.tls_cert: cannot load the TLS certificate"):
        build_inbox(
            config(token_env="INBOX_TOKEN", tls_cert=str(bogus), tls_key=str(bogus)),
            ManualClock(1.0),
        )


def test_a_checkpoint_report_lands_in_the_ledger(server: InboxServer) -> None:
    body = json.dumps({"job_id": "4242", "duration_s": 12.5, "node": "i-0abc"}).encode()
    assert post(server.port, body, path="/v1/checkpoints") == (202, {"accepted": "4242"})
    stamped = json.dumps({"job_id": "4242", "duration_s": 3.0, "at": 450.0}).encode()
    assert post(server.port, stamped, path="/v1/checkpoints")[0] == 202
    assert server.checkpoints.last("4242") == 500.0, "the later of the two reports"
    assert server.checkpoints.expected_duration("4242") == 12.5
    assert server.inbox.take() == [], "a checkpoint is not a notice"


@pytest.mark.parametrize(
    ("body", "token", "status"),
    [
        (b'{"job_id": "1", "duration_s": 1}', "wrong", 401),
        (b'{"duration_s": 1}', TOKEN, 400),
        (b'{"job_id": "1", "duration_s": -4}', TOKEN, 400),
    ],
)
def test_a_bad_checkpoint_report_is_refused(
    server: InboxServer, body: bytes, token: str, status: int
) -> None:
    assert post(server.port, body, token=token, path="/v1/checkpoints")[0] == status
    assert server.checkpoints.known() == set()
