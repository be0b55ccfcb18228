"""Node agent notice latency, per cloud: from the metadata endpoint announcing an interruption
to the controller's inbox holding the notice (the moment the inbox wakes the run loop).

Real HTTP end to end on loopback: the fake metadata servers from ``tests/metadata_servers.py``
speak each cloud's shapes, the agent's watcher and forwarder run as in production, and the
controller side is the real ``InboxServer``. Announcements land at a random phase of the poll,
so the end-to-end figure includes the wait for the next poll (AWS: 5 s period, Azure: 1 s; GCP
uses a hanging GET and has no poll wait). "agent" is the part the agent itself adds: from the
watcher reading the notice to the inbox holding it.

    .venv/bin/python bench/bench_agent_notice.py [--notices 10] [--aws-poll-seconds 5]
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import statistics
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from metadata_servers import FakeAzureImds, FakeGcpMetadata, FakeImds  # noqa: E402

from autoscaler.model.clock import SystemClock  # noqa: E402
from autoscaler.ops.inbox import InboxServer, NoticeInbox  # noqa: E402
from node_agent.forward import Forwarder  # noqa: E402
from node_agent.hooks import LocalHooks  # noqa: E402
from node_agent.main import NoticeDispatch  # noqa: E402
from node_agent.metadata import AgentNotice, NoticeMetrics  # noqa: E402
from node_agent.metadata_aws import AwsWatcher  # noqa: E402
from node_agent.metadata_azure import AzureWatcher  # noqa: E402
from node_agent.metadata_gcp import GcpWatcher  # noqa: E402

TOKEN = "bench-token"


class Controller:
    """The inbox, with the monotonic time each notice was accepted."""

    def __init__(self) -> None:
        self.inbox = NoticeInbox(SystemClock())
        self.server = InboxServer(self.inbox, TOKEN)
        self.arrivals: list[float] = []
        self.arrived = threading.Event()
        self.server.start(self._arrived)
        self.url = f"http://127.0.0.1:{self.server.port}"

    def _arrived(self) -> None:
        self.arrivals.append(time.monotonic())
        self.arrived.set()

    def wait(self, timeout_s: float = 30.0) -> float:
        if not self.arrived.wait(timeout_s):
            raise SystemExit("a notice did not arrive within 30 s")
        self.arrived.clear()
        self.inbox.take()
        return self.arrivals[-1]


class Timed:
    """The dispatch, noting when the watcher handed it each notice."""

    def __init__(self, controller: Controller) -> None:
        self.seen: list[float] = []
        metrics = NoticeMetrics()
        self.dispatch = NoticeDispatch(Forwarder(controller.url, TOKEN, metrics), LocalHooks())

    def __call__(self, notice: AgentNotice) -> bool:
        self.seen.append(time.monotonic())
        return self.dispatch(notice)


def measure(
    notices: int,
    phase_s: float,
    announce: Callable[[int], None],
    controller: Controller,
    timed: Timed,
    before: Callable[[int], None] = lambda trial: None,
) -> tuple[list[float], list[float]]:
    total, agent = [], []
    for trial in range(notices):
        before(trial)
        time.sleep(random.uniform(0.05, phase_s))
        started = time.monotonic()
        announce(trial)
        arrived = controller.wait()
        total.append(arrived - started)
        agent.append(arrived - timed.seen[-1])
    return total, agent


def bench_aws(
    notices: int, poll_s: float, controller: Controller
) -> tuple[list[float], list[float]]:
    fake = FakeImds()
    timed = Timed(controller)
    stop = threading.Event()
    watcher = AwsWatcher(fake.url, timed, NoticeMetrics(), poll_s=poll_s)
    threading.Thread(target=watcher.run, args=(stop,), daemon=True).start()
    base = time.time() + 120

    def announce(trial: int) -> None:
        fake.set_instance_action("terminate", base + trial)

    try:
        return measure(notices, poll_s, announce, controller, timed)
    finally:
        stop.set()
        fake.close()


def bench_gcp(notices: int, controller: Controller) -> tuple[list[float], list[float]]:
    fake = FakeGcpMetadata()
    timed = Timed(controller)
    stops: list[threading.Event] = []

    def before(trial: int) -> None:
        """A fresh watcher per preemption (a VM is preempted once), hanging before it lands."""
        if stops:
            stops[-1].set()
            fake.set("instance/preempted", "FALSE")
        stop = threading.Event()
        stops.append(stop)
        hanging = sum("wait_for_change" in path for _, path in fake.requests)
        watcher = GcpWatcher(fake.url, timed, NoticeMetrics(), hang_s=30)
        threading.Thread(target=watcher.run, args=(stop,), daemon=True).start()
        while sum("wait_for_change" in path for _, path in fake.requests) < hanging + 2:
            time.sleep(0.005)

    try:
        return measure(
            notices,
            0.2,
            lambda trial: fake.set("instance/preempted", "TRUE"),
            controller,
            timed,
            before,
        )
    finally:
        for stop in stops:
            stop.set()
        fake.close()


def bench_azure(
    notices: int, poll_s: float, controller: Controller
) -> tuple[list[float], list[float]]:
    fake = FakeAzureImds()
    timed = Timed(controller)
    stop = threading.Event()
    watcher = AzureWatcher(fake.url, timed, NoticeMetrics(), poll_s=poll_s)
    threading.Thread(target=watcher.run, args=(stop,), daemon=True).start()

    def announce(trial: int) -> None:
        fake.add_event("Preempt")

    try:
        return measure(notices, poll_s, announce, controller, timed)
    finally:
        stop.set()
        fake.close()


def summary(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    p95 = ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]
    return {"median_ms": statistics.median(ordered) * 1000, "p95_ms": p95 * 1000}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--notices", type=int, default=10, help="notices per cloud")
    parser.add_argument("--aws-poll-seconds", type=float, default=5.0)
    parser.add_argument("--azure-poll-seconds", type=float, default=1.0)
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)
    controller = Controller()
    runs: dict[str, Callable[[], tuple[list[float], list[float]]]] = {
        "aws": lambda: bench_aws(args.notices, args.aws_poll_seconds, controller),
        "gcp": lambda: bench_gcp(args.notices, controller),
        "azure": lambda: bench_azure(args.notices, args.azure_poll_seconds, controller),
    }
    windows = {"aws": 120, "gcp": 30, "azure": 30}
    figures: dict[str, dict[str, object]] = {}
    print(
        f"{'cloud':<6} {'window':>7} {'announce→inbox median':>22} {'p95':>9} "
        f"{'agent median':>13} {'p95':>9}"
    )
    for cloud, run in runs.items():
        total, agent = run()
        end_to_end, own = summary(total), summary(agent)
        figures[cloud] = {"notices": len(total), "end_to_end": end_to_end, "agent": own}
        print(
            f"{cloud:<6} {windows[cloud]:>6}s {end_to_end['median_ms']:>19.1f} ms "
            f"{end_to_end['p95_ms']:>6.1f} ms {own['median_ms']:>10.1f} ms {own['p95_ms']:>6.1f} ms"
        )
    controller.server.close()
    if args.json is not None:
        args.json.write_text(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
