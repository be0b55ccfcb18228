"""`gpu-autoscaler run` end to end against moto: an SQS work queue is the demand, the AWS
provider buys and gives back tagged spot instances, and an interruption warning on the
EventBridge queue is acted on in the tick it arrives, with a replacement requested at once."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import boto3
from aws_support import REGION
from waits import bound

from autoscaler.spi.provider import FLEET_TAG

CONFIG = """\
fleet_id: e2e
tick_seconds: 1
policy: {{name: cost-aware, params: {{idle_seconds: 0, unobserved_nodes: surplus}}}}
limits: {{scale_down_cooldown_s: 0, max_instances: 10}}
providers:
  aws: {{endpoint_url: "{url}", interruption_queue_url: "{notices}", queue_wait_s: 1}}
sources:
  - kind: sqs
    name: work
    settings: {{queue_url: "{work}", region: {region}, endpoint_url: "{url}",
               gpus_per_message: 1, checkpoint_interval_s: 600}}
pools:
  - {{name: g5-a, provider: aws, region: {region}, zone: {region}a, instance_type: g5.xlarge,
     gpus_per_instance: 1, market: spot, boot_seconds: 0,
     options: {{instance_types: [g5.2xlarge], launch_template: {{name: gpu}}}}}}
  - {{name: g5-b, provider: aws, region: {region}, zone: {region}b, instance_type: g5.xlarge,
     gpus_per_instance: 1, market: spot, boot_seconds: 0,
     options: {{instance_types: [g5.2xlarge], launch_template: {{name: gpu}}}}}}
"""


def wait_for(condition: Callable[[], bool], timeout: float = 60.0) -> bool:
    """Poll ``condition``; ``timeout`` is a ceiling scaled by the wait knob."""
    deadline = time.monotonic() + bound(timeout)
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.3)
    return False


def ours(url: str) -> list[dict[str, Any]]:
    client = boto3.client("ec2", region_name=REGION, endpoint_url=url)
    pages = client.describe_instances(
        Filters=[
            {"Name": f"tag:{FLEET_TAG}", "Values": ["e2e"]},
            {"Name": "instance-state-name", "Values": ["pending", "running"]},
        ]
    )["Reservations"]
    return [i for r in pages for i in r["Instances"]]


def test_run_scales_with_the_queue_and_acts_on_a_warning(aws: str, tmp_path: Path) -> None:
    sqs = boto3.client("sqs", region_name=REGION, endpoint_url=aws)
    work = sqs.create_queue(QueueName="work")["QueueUrl"]
    notices = sqs.create_queue(QueueName="notices")["QueueUrl"]
    config = tmp_path / "controller.yaml"
    config.write_text(CONFIG.format(url=aws, work=work, notices=notices, region=REGION))
    log = tmp_path / "controller.log"
    with log.open("w") as sink:
        process = subprocess.Popen(
            [sys.executable, "-m", "autoscaler.cli", "run", "--config", str(config)],
            stdout=sink,
            stderr=subprocess.STDOUT,
            env=dict(os.environ),
            cwd=tmp_path,  # the default journal lands here
        )
    try:
        for i in range(3):
            sqs.send_message(QueueUrl=work, MessageBody=json.dumps({"job": i}))
        assert wait_for(lambda: len(ours(aws)) == 3), log.read_text()[-3000:]
        victim = ours(aws)[0]["InstanceId"]
        warned_at = datetime.now(UTC) - timedelta(seconds=300)
        sqs.send_message(
            QueueUrl=notices,
            MessageBody=json.dumps(
                {
                    "version": "0",
                    "id": "w1",
                    "detail-type": "EC2 Spot Instance Interruption Warning",
                    "source": "aws.ec2",
                    "time": warned_at.strftime("%Y-%m-%dT%H:%M:%SZ"),
                    "region": REGION,
                    "resources": [],
                    "detail": {"instance-id": victim, "instance-action": "terminate"},
                }
            ),
        )

        def acted() -> bool:
            return any(
                "notices=1" in line and "launched=1" in line
                for line in log.read_text().splitlines()
            )

        assert wait_for(acted), log.read_text()[-3000:]
        assert wait_for(lambda: victim not in {i["InstanceId"] for i in ours(aws)}), (
            "the warned instance, still listed past its deadline, is terminated by us"
        )
        assert wait_for(lambda: len(ours(aws)) == 3), log.read_text()[-3000:]
        sqs.purge_queue(QueueUrl=work)
        assert wait_for(lambda: ours(aws) == []), log.read_text()[-3000:]
        waiting = sqs.get_queue_attributes(QueueUrl=notices, AttributeNames=["All"])["Attributes"]
        assert int(waiting["ApproximateNumberOfMessages"]) == 0
        assert int(waiting["ApproximateNumberOfMessagesNotVisible"]) == 0, "acknowledged"
    finally:
        process.send_signal(signal.SIGTERM)
        code = process.wait(timeout=bound(60))
    assert code == 0, log.read_text()[-3000:]
    text = log.read_text()
    assert "controller stopped after" in text and "Traceback" not in text
    assert "testing-secret" not in text
