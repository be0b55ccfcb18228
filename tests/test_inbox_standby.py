"""Two replicas behind one Service: both are Ready (so a PodDisruptionBudget of one lets a drain
take either), the standby's inbox refuses with 503, and the node agent's retry reaches the
leader through a Service that picks a replica per connection."""

from __future__ import annotations

import itertools
import socket
import threading
import time
from collections.abc import Iterator

import pytest
from fakes import pool, rig
from test_inbox import TOKEN, notice, post
from test_runner_leader import ScriptedLock
from waits import bound

from autoscaler.app.runner import Runner
from autoscaler.model import NoticeKind
from autoscaler.model.clock import ManualClock
from autoscaler.ops.inbox import InboxServer, NoticeInbox
from autoscaler.spi.wakeups import Wakeups
from node_agent.forward import Delivery, Forwarder
from node_agent.metadata import AgentNotice, NoticeMetrics


class Leadership:
    def __init__(self, held: bool) -> None:
        self.held = held

    def __call__(self) -> bool:
        return self.held


def started(leads: Leadership) -> InboxServer:
    server = InboxServer(NoticeInbox(ManualClock(500.0)), TOKEN)
    server.start(Wakeups(lambda: None, leads=leads))
    return server


@pytest.fixture
def pair() -> Iterator[tuple[InboxServer, InboxServer]]:
    standby, leader = started(Leadership(False)), started(Leadership(True))
    yield standby, leader
    standby.close()
    leader.close()


def test_a_standby_refuses_notices_and_checkpoints_until_it_leads() -> None:
    leads = Leadership(False)
    server = started(leads)
    try:
        status, payload = post(server.port, notice(kind="terminate"))
        assert status == 503 and "standby" in payload["error"]
        checkpoint = b'{"job_id": "7", "duration_s": 3.0}'
        assert post(server.port, checkpoint, path="/v1/checkpoints")[0] == 503
        assert server.inbox.take() == [] and server.checkpoints.reports == 0
        assert post(server.port, notice(), token="wrong")[0] == 401, "the token comes first"
        leads.held = True
        assert post(server.port, notice(kind="terminate"))[0] == 202
        assert [n.instance_id for n in server.inbox.take()] == ["i-0abc"]
    finally:
        server.close()


class RoundRobinService:
    """kube-proxy's part: each new connection goes to the next endpoint (IPVS's round robin;
    iptables mode picks at random, which a retry also gets past)."""

    def __init__(self, ports: list[int]) -> None:
        self._ports = itertools.cycle(ports)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self.connections: list[int] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            port = next(self._ports)
            self.connections.append(port)
            upstream = socket.create_connection(("127.0.0.1", port))
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=_pipe, args=(a, b), daemon=True).start()

    def close(self) -> None:
        self._listener.close()


def _pipe(source: socket.socket, sink: socket.socket) -> None:
    try:
        while data := source.recv(65536):
            sink.sendall(data)
        sink.shutdown(socket.SHUT_WR)
    except OSError:
        pass


def test_the_agents_retry_reaches_the_leader_behind_a_service(
    pair: tuple[InboxServer, InboxServer],
) -> None:
    standby, leader = pair
    service = RoundRobinService([standby.port, leader.port])  # the standby answers first
    try:
        forwarder = Forwarder(
            f"http://127.0.0.1:{service.port}", TOKEN, NoticeMetrics(), give_up_s=bound(30)
        )
        sent = AgentNotice(
            instance_id="i-0lead",
            kind=NoticeKind.TERMINATE,
            deadline=620.0,
            source="aws-imds",
            event_key="e1",
        )
        assert forwarder.send(sent) is Delivery.DELIVERED
        assert service.connections[:2] == [standby.port, leader.port]
        assert standby.inbox.take() == []
        assert [n.instance_id for n in leader.inbox.take()] == ["i-0lead"]
    finally:
        service.close()


def test_the_run_loop_tells_its_inbox_whether_it_leads() -> None:
    lock = ScriptedLock()
    t = rig([pool("a")], {"a": 1.0}, fence=lock.check)
    t.controller.config = t.controller.config.model_copy(update={"tick_seconds": 0.05})
    inbox = InboxServer(NoticeInbox(ManualClock(500.0)), TOKEN)
    runner = Runner(t.controller, {}, background=[inbox], lock=lock)
    loop = threading.Thread(target=runner.run, daemon=True)
    loop.start()
    try:
        deadline = time.monotonic() + bound(30)
        status = 0
        while status != 503 and time.monotonic() < deadline:
            status = post(inbox.port, notice(kind="terminate"))[0] if inbox.port else 0
            time.sleep(0.02)
        assert status == 503, "a standby's inbox refuses"
        lock.token = 4
        while status != 202 and time.monotonic() < deadline:
            status = post(inbox.port, notice(kind="terminate"))[0]
            time.sleep(0.02)
        assert status == 202, "the same inbox accepts once its replica leads"
    finally:
        runner.stop()
        loop.join(bound(30))
