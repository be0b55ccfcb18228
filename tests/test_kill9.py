"""Kill -9 the controller at random points, over and over, against the moto server: after each
restart the fleet converges on the plan within two ticks, no instance is launched twice or left
untagged, and the journal stays whole with every cut-short call closed.

A hundred runs in all, four shards of twenty-five, each with its own demand sequence. Kills land
while the controller ticks: each run waits for the process to lead, then kills it after a random
share of its first few ticks (the first, which builds the cloud clients, takes most of a
second), so kills fall before, during and after launches and terminations.
"""

from __future__ import annotations

import json
import random
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import boto3
import pytest
from aws_support import REGION, all_instances, eventually, instance_tags, live
from waits import bound

from autoscaler.ops.journal.base import open_sqlite
from autoscaler.spi.provider import FLEET_TAG, REQUEST_TAG

TICK_S = 0.2
RUNS_PER_SHARD = 25
CONFIG = """\
fleet_id: kill9
tick_seconds: {tick}
policy: {{name: cost-aware, params: {{idle_seconds: 0, unobserved_nodes: surplus}}}}
limits: {{scale_down_cooldown_s: 0, max_instances: 10}}
journal: {{sqlite_path: "{journal}"}}
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


def set_depth(sqs: Any, queue: str, depth: int) -> None:
    """Empty the queue by receiving and deleting (SQS allows one purge a minute), then fill it."""
    while True:
        got = sqs.receive_message(QueueUrl=queue, MaxNumberOfMessages=10).get("Messages", [])
        if not got:
            break
        for message in got:
            sqs.delete_message(QueueUrl=queue, ReceiptHandle=message["ReceiptHandle"])
    for n in range(depth):
        sqs.send_message(QueueUrl=queue, MessageBody=json.dumps({"job": n}))


def start(config: Path, log: Path, cwd: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as sink:
        return subprocess.Popen(
            [sys.executable, "-m", "autoscaler.cli", "run", "--config", str(config)],
            stdout=sink,
            stderr=subprocess.STDOUT,
            cwd=cwd,
        )


def ticks_logged(log: Path, since: int) -> int:
    text = log.read_bytes()[since:].decode(errors="replace")
    return sum(1 for line in text.splitlines() if '"msg": "tick=' in line)


@pytest.mark.parametrize("shard", range(4))
def test_kill_9_at_random_points_leaves_no_duplicate_no_orphan_and_a_whole_journal(
    aws: str, tmp_path: Path, shard: int
) -> None:
    rng = random.Random(9000 + shard)
    sqs = boto3.client("sqs", region_name=REGION, endpoint_url=aws)
    work = sqs.create_queue(QueueName=f"work-{shard}")["QueueUrl"]
    journal_path = tmp_path / "journal.db"
    config = tmp_path / "controller.yaml"
    config.write_text(
        CONFIG.format(tick=TICK_S, journal=journal_path, url=aws, work=work, region=REGION)
    )
    log = tmp_path / "controller.log"
    for _ in range(RUNS_PER_SHARD):
        set_depth(sqs, work, rng.randint(0, 6))
        offset = log.stat().st_size if log.exists() else 0
        process = start(config, log, tmp_path)
        try:
            assert eventually(lambda at=offset: b"leading as" in log.read_bytes()[at:]), (
                log.read_text()[-3000:]
            )
            time.sleep(rng.uniform(0, 1.2 + 3 * TICK_S))
        finally:
            process.send_signal(signal.SIGKILL)
            process.wait(timeout=bound(30))

    final = rng.randint(1, 6)
    set_depth(sqs, work, final)
    offset = log.stat().st_size
    process = start(config, log, tmp_path)
    try:
        assert eventually(lambda: ticks_logged(log, offset) >= 2), log.read_text()[-3000:]
        assert len(live(all_instances(aws))) == final, "the fleet matches the plan within two ticks"
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=bound(60)) == 0, log.read_text()[-3000:]

    instances = all_instances(aws)
    assert all(instance_tags(i).get(FLEET_TAG) == "kill9" for i in instances), "nothing untagged"
    with sqlite3.connect(journal_path) as db:
        assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    journal = open_sqlite(journal_path)
    calls = {c.request_id: c for c in journal.calls()}
    assert all(c.finished_at is not None for c in calls.values()), "every cut call closed"
    by_request: dict[str, int] = {}
    for instance in instances:
        request = instance_tags(instance)[REQUEST_TAG]
        by_request[request] = by_request.get(request, 0) + 1
    for request, made in by_request.items():
        assert request in calls, f"{request}: every launch was journaled before it went out"
        assert made <= calls[request].count, f"{request}: launched more than once"
    assert "Traceback" not in log.read_text()
