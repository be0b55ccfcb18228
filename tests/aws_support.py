"""A real moto server for the AWS tests, and faults injected the way AWS would send them: an
HTTP error with EC2's XML body, through botocore's event hooks on the real clients."""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import boto3
import pytest
import requests
from botocore.awsrequest import AWSResponse
from botocore.exceptions import ReadTimeoutError
from moto.server import ThreadedMotoServer
from waits import bound

REGION = "us-east-1"


@pytest.fixture(scope="session")
def moto_url() -> Iterator[str]:
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture
def aws(moto_url: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """A clean moto with credentials in the standard chain (the environment), as a user has."""
    requests.post(f"{moto_url}/moto-api/reset", timeout=bound(30))
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing-secret")
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
    for variable in ("AWS_PROFILE", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(variable, raising=False)
    ec2 = boto3.client("ec2", region_name=REGION, endpoint_url=moto_url)
    ec2.create_launch_template(
        LaunchTemplateName="gpu", LaunchTemplateData={"ImageId": "ami-12c6146b"}
    )
    return moto_url


class _Body:
    def __init__(self, body: bytes) -> None:
        self.body = body

    def stream(self, **_: Any) -> Iterator[bytes]:
        yield self.body


def ec2_error(url: str, status: int, code: str, message: str = "injected") -> AWSResponse:
    body = (
        '<?xml version="1.0" encoding="UTF-8"?><Response><Errors><Error>'
        f"<Code>{code}</Code><Message>{message}</Message></Error></Errors>"
        "<RequestID>test</RequestID></Response>"
    ).encode()
    return AWSResponse(url, status, {}, _Body(body))


@dataclass
class Faults:
    """Planned or random faults for one operation of one client, answered before the request
    leaves (so AWS never sees it, as with a real error response)."""

    planned: list[str] = field(default_factory=list)
    chance: float = 0.0
    choices: tuple[str, ...] = ()
    rng: random.Random = field(default_factory=lambda: random.Random(0))
    injected: list[str] = field(default_factory=list)

    def __call__(self, request: Any, **_: Any) -> AWSResponse | None:
        fault = None
        if self.planned:
            fault = self.planned.pop(0)
        elif self.chance and self.rng.random() < self.chance:
            fault = self.rng.choice(self.choices)
        if fault is None or fault == "ok":
            return None
        self.injected.append(fault)
        if fault == "timeout":
            raise ReadTimeoutError(endpoint_url=request.url)
        status, code = FAULTS[fault]
        return ec2_error(request.url, status, code)


FAULTS: dict[str, tuple[int, str]] = {
    "throttle": (503, "RequestLimitExceeded"),
    "capacity": (500, "InsufficientInstanceCapacity"),
    "quota": (400, "VcpuLimitExceeded"),
    "auth": (401, "AuthFailure"),
    "server": (500, "InternalError"),
    "bad": (400, "InvalidParameterValue"),
}


def inject(client: Any, operation: str, faults: Faults) -> Callable[[], None]:
    event = f"before-send.ec2.{operation}"
    client.meta.events.register(event, faults)
    return lambda: client.meta.events.unregister(event, faults)


def all_instances(url: str) -> list[dict[str, Any]]:
    """Every instance moto holds in the test region, in any state."""
    ec2 = boto3.client("ec2", region_name=REGION, endpoint_url=url)
    return [i for r in ec2.describe_instances()["Reservations"] for i in r["Instances"]]


def live(instances: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [i for i in instances if i["State"]["Name"] in ("pending", "running")]


def instance_tags(instance: dict[str, Any]) -> dict[str, str]:
    return {t["Key"]: t["Value"] for t in instance.get("Tags", [])}


def eventually(condition: Callable[[], bool], timeout: float = 60.0) -> bool:
    """Poll ``condition`` until it holds or ``timeout`` (a ceiling scaled by the wait knob)
    passes; the caller asserts."""
    deadline = time.monotonic() + bound(timeout)
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.02)
    return False
