"""Two controller replicas against moto, sharing a journal and a leader lock in a real
PostgreSQL: only one acts; when the leader is killed mid-tick the standby takes over within two
lease periods and nothing is done twice; a leader paused past its lease and then resumed finds its
fencing token stale and acts no more."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import boto3
import psycopg
from aws_support import REGION, all_instances, eventually, instance_tags, live
from waits import bound

from autoscaler.spi.provider import FLEET_TAG, REQUEST_TAG

LEASE_S = 1.5
TICK_S = 0.3
CONFIG = """\
fleet_id: ha
tick_seconds: {tick}
policy: {{name: cost-aware, params: {{idle_seconds: 0, unobserved_nodes: surplus}}}}
limits: {{scale_down_cooldown_s: 0, max_instances: 20}}
journal: {{postgres_dsn_env: HA_JOURNAL_DSN}}
leader: {{kind: postgres, name: ha-test, lease_seconds: {lease}}}
providers:
  aws: {{endpoint_url: "{url}"}}
sources:
  - kind: sqs
    name: work
    settings: {{queue_url: "{work}", region: {region}, endpoint_url: "{url}",
               gpus_per_message: 1, checkpoint_interval_s: 600}}
pools:
  - {{name: g5-a, provider: aws, region: {region}, zone: {region}a, instance_type: g5.xlarge,
     gpus_per_instance: 1, market: spot, boot_seconds: 0,
     options: {{instance_types: [g5.2xlarge], launch_template: {{name: gpu}}}}}}
"""


def ours(url: str) -> list[dict[str, Any]]:
    return [i for i in all_instances(url) if instance_tags(i).get(FLEET_TAG) == "ha"]


class Replica:
    def __init__(self, name: str, config: Path, dsn: str, folder: Path) -> None:
        self.log = folder / f"{name}.log"
        with self.log.open("wb") as sink:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "autoscaler.cli", "run", "--config", str(config)],
                stdout=sink,
                stderr=subprocess.STDOUT,
                cwd=folder,
                env={**os.environ, "HA_JOURNAL_DSN": dsn},
            )

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def events(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.text().splitlines() if line.startswith("{")]

    def leads(self) -> bool:
        led = [e for e in self.events() if e["msg"].startswith(("leading as", "not the leader"))]
        return bool(led) and led[-1]["msg"].startswith("leading as")

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGCONT)
            self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout=bound(60))


def test_one_leader_acts_a_killed_leader_is_replaced_and_a_paused_one_is_fenced(
    aws: str, postgres_dsn: str, tmp_path: Path
) -> None:
    sqs = boto3.client("sqs", region_name=REGION, endpoint_url=aws)
    work = sqs.create_queue(QueueName="work")["QueueUrl"]

    def demand(jobs: int) -> None:
        for n in range(jobs):
            sqs.send_message(QueueUrl=work, MessageBody=json.dumps({"job": n}))

    config = tmp_path / "controller.yaml"
    config.write_text(CONFIG.format(tick=TICK_S, lease=LEASE_S, url=aws, work=work, region=REGION))
    demand(2)
    a = Replica("a", config, postgres_dsn, tmp_path)
    b = Replica("b", config, postgres_dsn, tmp_path)
    replicas = [a, b]
    try:
        assert eventually(lambda: a.leads() or b.leads()), a.text()[-2000:] + b.text()[-2000:]
        assert eventually(lambda: len(live(ours(aws))) == 2)
        time.sleep(1.0)
        assert sum(r.leads() for r in replicas) == 1, "exactly one leader"
        leader, standby = (a, b) if a.leads() else (b, a)
        assert len(ours(aws)) == 2, "the standby launched nothing"

        demand(2)
        time.sleep(TICK_S * 0.5)
        leader.process.send_signal(signal.SIGKILL)
        killed_at = time.monotonic()
        leader.process.wait(timeout=bound(60))
        assert eventually(standby.leads), standby.text()[-2000:]
        takeover_s = time.monotonic() - killed_at
        # How fast is a figure, not an assertion: on a busy machine a takeover inside the
        # generous bound above is still correct; the test prints the figure.
        print(f"takeover after SIGKILL: {takeover_s:.2f}s (lease {LEASE_S}s)")
        assert eventually(lambda: len(live(ours(aws))) == 4), standby.text()[-2000:]
        time.sleep(1.0)
        assert len(ours(aws)) == 4, "nothing launched twice across the change of leader"

        c = Replica("c", config, postgres_dsn, tmp_path)
        replicas.append(c)
        time.sleep(1.0)
        assert not c.leads()
        standby.process.send_signal(signal.SIGSTOP)
        paused_at = time.monotonic()
        assert eventually(c.leads), c.text()[-2000:]
        paused_takeover_s = time.monotonic() - paused_at
        print(f"takeover after SIGSTOP: {paused_takeover_s:.2f}s (lease {LEASE_S}s)")
        demand(1)
        assert eventually(lambda: len(live(ours(aws))) == 5), c.text()[-2000:]
        standby.process.send_signal(signal.SIGCONT)
        assert eventually(lambda: "leadership lost" in standby.text() or not standby.leads())
        time.sleep(1.5)
        assert len(ours(aws)) == 5, "the resumed former leader acted no more"
        assert not standby.leads() and c.leads()
    finally:
        codes = [r.stop() for r in replicas if r is not None]
    assert codes.count(0) >= 2, "the live replicas stop cleanly on SIGTERM"

    with psycopg.connect(postgres_dsn) as db:
        calls = db.execute(
            "SELECT request_id, token, count, outcome, finished_at FROM cloud_calls "
            "ORDER BY started_at"
        ).fetchall()
        (leader_token,) = db.execute(
            "SELECT token FROM gpu_autoscaler_leader WHERE name = 'ha-test'"
        ).fetchone()
    by_request: dict[str, int] = {}
    for instance in ours(aws):
        request = instance_tags(instance)[REQUEST_TAG]
        by_request[request] = by_request.get(request, 0) + 1
    counts = {row[0]: row[2] for row in calls}
    for request, made in by_request.items():
        assert made <= counts[request], f"{request} launched more than once"
    tokens = [row[1] for row in calls]
    assert leader_token == 3, "three leaders, three fencing tokens"
    assert tokens == sorted(tokens), "no call under a token older than one already used"
    assert all(row[4] is not None for row in calls)
