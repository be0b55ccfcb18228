"""How many ticks a flood of notices drives (issue 15: 23,281 notices drove 44,840 ticks in about
200 s), and how fast a genuine notice is still acted on in the middle of it.

A real inbox beside a real run loop (``Runner`` over the tests' rig controller, a 60 s tick):
``--workers`` threads post notices over HTTP for ``--seconds``, for instances the controller does
not own and repeats of ones it has been told about; halfway through, one new notice for an
instance it owns. Prints the notices accepted, the ticks they drove, the documented bound (one
extra tick per ``NOTICE_WAKE_S``), and how long the owned instance's notice took to be drained.

    .venv/bin/python bench/bench_notice_flood.py                   # 20 s, 8 workers
    .venv/bin/python bench/bench_notice_flood.py --seconds 200     # the issue's length
"""

from __future__ import annotations

import argparse
import http.client
import json
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from fakes import job, pool, rig  # noqa: E402

from autoscaler.app.runner import Runner  # noqa: E402
from autoscaler.ops.inbox import InboxServer, NoticeInbox  # noqa: E402
from autoscaler.spi.wakeups import NOTICE_WAKE_S  # noqa: E402

TOKEN = "bench-flood-token"


def post(port: int, instance_id: str) -> int:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    body = json.dumps({"instance_id": instance_id, "source": "bench"})
    headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
    connection.request("POST", "/v1/notices", body, headers)
    status = connection.getresponse().status
    connection.close()
    return status


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--workers", type=int, default=8)
    args = parser.parse_args()

    t = rig([pool("a")], {"a": 1.0})
    t.queue.jobs = [job("x")]
    t.controller.tick()
    t.cloud.boot_all()
    (owned,) = t.cloud.instances
    t.scheduler.running[owned] = 1
    server = InboxServer(NoticeInbox(t.clock), TOKEN)
    t.controller.signals.notices = (server.inbox,)
    runner = Runner(t.controller, {"fake": t.cloud}, [server])
    loop = threading.Thread(target=runner.run, daemon=True)
    loop.start()
    while t.controller.ticks < 2:
        time.sleep(0.01)

    stop = threading.Event()
    accepted = [0] * args.workers

    def flood(worker: int) -> None:
        index = 0
        while not stop.is_set():
            name = f"i-stranger-{worker}-{index}" if index % 2 else f"i-repeat-{worker}"
            if post(server.port, name) == 202:
                accepted[worker] += 1
            index += 1

    ticks_before = t.controller.ticks
    started = time.monotonic()
    workers = [threading.Thread(target=flood, args=(w,)) for w in range(args.workers)]
    for worker in workers:
        worker.start()
    time.sleep(args.seconds / 2)
    posted = time.monotonic()
    assert post(server.port, owned) == 202
    while owned not in t.scheduler.drained:
        time.sleep(0.001)
    acted_s = time.monotonic() - posted
    time.sleep(args.seconds / 2)
    stop.set()
    for worker in workers:
        worker.join()
    span = time.monotonic() - started
    ticks = t.controller.ticks - ticks_before
    runner.stop()
    loop.join(10)

    notices = sum(accepted) + 1
    bound = 2 + 1 + span / NOTICE_WAKE_S
    print(f"notices accepted      {notices:,} in {span:.1f} s ({notices / span:,.0f}/s)")
    rule = f"1 at once + 1 per {NOTICE_WAKE_S:g} s"
    print(f"ticks driven          {ticks} (bound: {rule} = {bound:.0f})")
    print(f"owned notice drained  {acted_s * 1000:.0f} ms after its post, mid-flood")
    return 0 if ticks <= bound else 1


if __name__ == "__main__":
    raise SystemExit(main())
