"""The run loop with its background services on real sockets: an agent's notice posted to the
inbox wakes the loop at once (long before the next tick is due), the node is drained, and the
metrics endpoint shows it."""

from __future__ import annotations

import json
import threading
import time
import urllib.request

from fakes import job, pool, rig
from waits import bound

from autoscaler.app.runner import Runner
from autoscaler.ops.health import Readiness, StatusServer
from autoscaler.ops.inbox import InboxServer, NoticeInbox
from autoscaler.ops.metrics import Metrics

TOKEN = "agent-shared-token"


def test_a_posted_notice_wakes_the_loop_and_the_node_is_drained() -> None:
    t = rig([pool("a")], {"a": 1.0})
    t.queue.jobs = [job("x")]
    t.controller.tick()
    t.cloud.boot_all()
    (instance,) = t.cloud.instances
    t.scheduler.running[instance] = 1

    inbox = InboxServer(NoticeInbox(t.clock), TOKEN)
    metrics = Metrics()
    metrics_server = StatusServer(metrics.registry, Readiness(60.0), "127.0.0.1", 0)
    t.controller.signals.notices = (inbox.inbox,)
    t.controller.metrics = metrics
    runner = Runner(t.controller, {"fake": t.cloud}, [inbox, metrics_server])
    ticks_before = t.controller.ticks
    loop = threading.Thread(target=runner.run, daemon=True)
    loop.start()
    try:
        deadline = time.monotonic() + bound(30)
        while t.controller.ticks < ticks_before + 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert t.controller.ticks == ticks_before + 1, "the loop ran its first tick"
        assert instance not in t.scheduler.drained

        posted = time.monotonic()
        request = urllib.request.Request(
            f"http://127.0.0.1:{inbox.port}/v1/notices",
            data=json.dumps({"instance_id": instance, "deadline": t.clock.now() + 30}).encode(),
            headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"},
            method="POST",
        )
        with urllib.request.urlopen(request, timeout=bound(30)) as response:
            assert response.status == 202
        # 30 s, not scaled: generous on a busy machine and still half the 60 s tick it tells apart
        while instance not in t.scheduler.drained and time.monotonic() - posted < 30:
            time.sleep(0.01)
        assert instance in t.scheduler.drained
        assert time.monotonic() - posted < 30, "woken by the notice, not by the 60 s tick"

        with urllib.request.urlopen(
            f"http://127.0.0.1:{metrics_server.port}/metrics", timeout=bound(30)
        ) as response:
            text = response.read().decode()
        assert 'gpu_autoscaler_ticks_total{outcome="ok"}' in text
        assert "gpu_autoscaler_demand_known 1.0" in text
    finally:
        runner.stop()
        loop.join(bound(30))
    assert not loop.is_alive()
    refused = urllib.request.Request(f"http://127.0.0.1:{inbox.port}/v1/notices", data=b"{}")
    try:
        urllib.request.urlopen(refused, timeout=1)
        raise AssertionError("the inbox still answers after the loop stopped")
    except OSError:
        pass
