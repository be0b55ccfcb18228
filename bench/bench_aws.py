"""AWS provider figures against a local moto server (real boto3 over HTTP).

1. Notice latency: from an interruption warning landing on the SQS queue to the controller's tick
   that acts on it (the watcher wakes the run loop), over N warnings; the SQS long-poll wait is
   not counted because a long poll returns as soon as a message arrives.
2. Listing 5,000 tagged instances and diffing them against the plan: the provider's paginated
   listing, the instance table's sync, and a whole tick (observe, decide, guard, act).

    .venv/bin/python bench/bench_aws.py [--instances 5000] [--notices 20]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

import boto3
from botocore.awsrequest import AWSResponse
from moto.server import ThreadedMotoServer

from autoscaler.clock import SystemClock
from autoscaler.config import ControllerConfig, Limits
from autoscaler.controller import Controller
from autoscaler.lifecycle import InstanceTable
from autoscaler.model import DemandGroup, Pool
from autoscaler.retry import RetryPolicy
from autoscaler.runner import Runner
from policies.cost_aware import CostAwareParams, CostAwarePolicy
from providers.aws import AwsProvider

REGION = "us-east-1"
FLEET = "bench"


class StaticQueue:
    name = "static"

    def __init__(self, jobs: int) -> None:
        self.jobs = jobs

    def read(self, now: float) -> list[DemandGroup]:
        if not self.jobs:
            return []
        return [
            DemandGroup(
                gpus_per_job=1, jobs=self.jobs, checkpoint_interval_s=1800.0, oldest_submit_time=now
            )
        ]


def pool() -> Pool:
    return Pool(
        name="g5",
        provider="aws",
        region=REGION,
        zone="us-east-1a",
        instance_type="g5.xlarge",
        gpus_per_instance=1,
        market="spot",  # type: ignore[arg-type]
        boot_seconds=0,
        options={"instance_types": ["g5.2xlarge"], "launch_template": {"name": "gpu"}},
    )


def notice_latency(url: str, count: int) -> list[float]:
    sqs = boto3.client("sqs", region_name=REGION, endpoint_url=url)
    queue = sqs.create_queue(QueueName="bench-notices")["QueueUrl"]
    provider = AwsProvider.from_config(
        {"endpoint_url": url, "interruption_queue_url": queue, "queue_wait_s": 20}, [pool()], FLEET
    )
    config = ControllerConfig(
        fleet_id=FLEET, tick_seconds=3600, pools=(pool(),), limits=Limits(scale_down_cooldown_s=0)
    )
    queue_source = StaticQueue(count)
    controller = Controller(
        config,
        CostAwarePolicy(CostAwareParams(unobserved_nodes="surplus")),
        {"aws": provider},
        SystemClock(),
        [queue_source],
        retry=RetryPolicy(attempts=2),
    )
    acted: dict[str, float] = {}
    original = controller.tick

    def tick() -> Any:
        report = original()
        for action in report.actions:
            if action.kind == "interruption":
                for instance in action.instance_ids:
                    acted.setdefault(instance, time.perf_counter())
        return report

    controller.tick = tick  # type: ignore[method-assign]
    runner = Runner(controller, {"aws": provider})
    thread = threading.Thread(target=runner.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while len(provider.list_instances(FLEET)) < count and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(0.5)
    latencies = []
    for instance in provider.list_instances(FLEET)[:count]:
        sent = time.perf_counter()
        sqs.send_message(
            QueueUrl=queue,
            MessageBody=json.dumps(
                {
                    "version": "0",
                    "id": instance.id,
                    "detail-type": "EC2 Spot Instance Interruption Warning",
                    "source": "aws.ec2",
                    "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                    "region": REGION,
                    "resources": [],
                    "detail": {"instance-id": instance.id, "instance-action": "terminate"},
                }
            ),
        )
        while instance.id not in acted and time.perf_counter() - sent < 30:
            time.sleep(0.005)
        latencies.append(acted.get(instance.id, float("inf")) - sent)
    runner.stop()
    thread.join(timeout=30)
    return latencies


def listing(url: str, instances: int) -> dict[str, float]:
    ec2 = boto3.client("ec2", region_name=REGION, endpoint_url=url)
    tags = [
        {
            "ResourceType": "instance",
            "Tags": [
                {"Key": "gpu-autoscaler/fleet", "Value": FLEET + "-list"},
                {"Key": "gpu-autoscaler/pool", "Value": "g5"},
                {"Key": "gpu-autoscaler/request", "Value": "bulk"},
            ],
        }
    ]
    made = 0
    while made < instances:
        batch = min(500, instances - made)
        ec2.run_instances(
            ImageId="ami-12c6146b",
            MinCount=batch,
            MaxCount=batch,
            InstanceType="g5.xlarge",
            TagSpecifications=tags,
        )
        made += batch
    provider = AwsProvider.from_config(
        {"endpoint_url": url, "read_timeout_s": 600}, [pool()], FLEET + "-list"
    )
    client = provider.client("ec2", REGION)
    pages: list[bytes] = []

    def keep(http_response: Any, **_: Any) -> None:
        pages.append(http_response.content)

    client.meta.events.register("after-call.ec2.DescribeInstances", keep)
    started = time.perf_counter()
    provider.list_instances(FLEET + "-list")
    moto_s = time.perf_counter() - started
    client.meta.events.unregister("after-call.ec2.DescribeInstances", keep)
    # Replay moto's own responses, so the figure is ours (HTTP parsing, mapping, diffing) and
    # not moto's filter evaluation, which is far slower than EC2's.
    replay = iter(pages * 10)

    def answer(request: Any, **_: Any) -> AWSResponse:
        return AWSResponse(request.url, 200, {}, _Raw(next(replay)))

    client.meta.events.register("before-send.ec2.DescribeInstances", answer)
    started = time.perf_counter()
    listed = provider.list_instances(FLEET + "-list")
    list_s = time.perf_counter() - started
    table = InstanceTable()
    started = time.perf_counter()
    table.sync([("aws", i) for i in listed], time.time(), {"aws"})
    sync_s = time.perf_counter() - started
    config = ControllerConfig(fleet_id=FLEET + "-list", pools=(pool(),))
    controller = Controller(
        config,
        CostAwarePolicy(),
        {"aws": provider},
        SystemClock(),
        [StaticQueue(instances)],
        retry=RetryPolicy(attempts=1),
    )
    ticks = []
    for _ in range(3):
        started = time.perf_counter()
        controller.tick()
        ticks.append(time.perf_counter() - started)
    return {
        "instances": float(len(listed)),
        "moto_list_s": moto_s,
        "list_s": list_s,
        "sync_s": sync_s,
        "tick_s_median": statistics.median(ticks),
    }


class _Raw:
    def __init__(self, body: bytes) -> None:
        self.body = body

    def stream(self, **_: Any) -> Any:
        yield self.body


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--instances", type=int, default=5000)
    parser.add_argument("--notices", type=int, default=20)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "bench")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "bench")
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    url = f"http://{host}:{port}"
    boto3.client("ec2", region_name=REGION, endpoint_url=url).create_launch_template(
        LaunchTemplateName="gpu", LaunchTemplateData={"ImageId": "ami-12c6146b"}
    )
    try:
        latencies = notice_latency(url, args.notices)
        median = statistics.median(latencies)
        print(
            f"notice -> action: median {median * 1000:.0f} ms, max {max(latencies) * 1000:.0f} "
            f"ms over {len(latencies)} warnings (target: median <= 1 s)",
            flush=True,
        )
        figures = listing(url, args.instances)
    finally:
        server.stop()
    print(
        f"listing {figures['instances']:.0f} tagged instances: {figures['list_s'] * 1000:.0f} ms "
        f"(parsing EC2's XML pages and mapping them); table sync "
        f"{figures['sync_s'] * 1000:.0f} ms; whole tick {figures['tick_s_median'] * 1000:.0f} ms "
        "(target: listing and diffing <= 500 ms)"
    )
    print(f"(moto itself took {figures['moto_list_s']:.1f} s to filter and serve those pages)")
    if args.json:
        args.json.write_text(json.dumps({"notice_median_s": median, **figures}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
