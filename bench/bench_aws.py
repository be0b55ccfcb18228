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
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

import boto3
from botocore.awsrequest import AWSResponse
from moto.server import ThreadedMotoServer

from autoscaler.app.runner import Runner
from autoscaler.fleet.instances import InstanceTable
from autoscaler.model import DemandGroup, Instance, Pool
from autoscaler.model.clock import SystemClock
from autoscaler.model.config import ControllerConfig, Limits
from autoscaler.spi.provider import FLEET_TAG, LAUNCHED_AT_TAG, POOL_TAG, REQUEST_TAG
from autoscaler.tick.controller import Controller
from autoscaler.tick.retry import RetryPolicy
from policies.cost_aware import CostAwareParams, CostAwarePolicy
from providers.aws import AwsProvider
from providers.aws.instances import LISTED_STATES

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


def listing(url: str, instances: int, repeats: int, compare: bool) -> dict[str, float]:
    ec2 = boto3.client("ec2", region_name=REGION, endpoint_url=url)
    tags = [
        {
            "ResourceType": "instance",
            "Tags": [
                {"Key": FLEET_TAG, "Value": FLEET + "-list"},
                {"Key": POOL_TAG, "Value": "g5"},
                {"Key": REQUEST_TAG, "Value": "bulk"},
                {"Key": LAUNCHED_AT_TAG, "Value": f"{time.time():.3f}"},
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
    replay = Replay()

    def fresh() -> AwsProvider:
        made = AwsProvider.from_config(
            {"endpoint_url": url, "read_timeout_s": 600}, [pool()], FLEET + "-list"
        )
        replay.attach(made.client("ec2", REGION))
        return made

    provider = fresh()
    started = time.perf_counter()
    provider.list_instances(FLEET + "-list")  # a first listing: every instance's tags are new
    provider.list_instances(FLEET + "-list")  # a steady one: only the fleet tag
    before: list[float] = []
    everything = [{"Name": "instance-state-name", "Values": list(LISTED_STATES)}]
    ours = provider.instances
    if compare:
        sum(1 for _ in ours.describe(REGION, everything))
    moto_s = time.perf_counter() - started
    replay.replaying = True
    if compare:
        for _ in range(repeats):
            started = time.perf_counter()
            [ours.instance(raw, REGION) for raw in ours.describe(REGION, everything)]
            before.append(time.perf_counter() - started)
    steady: list[tuple[float, float, float]] = []
    first: list[tuple[float, float, float]] = []
    listed: list[Instance] = []
    for runs, provider_of in ((first, fresh), (steady, lambda: provider)):
        for _ in range(repeats):
            lister = provider_of()
            cpu, started = time.process_time(), time.perf_counter()
            listed = lister.list_instances(FLEET + "-list")
            list_s, list_cpu = time.perf_counter() - started, time.process_time() - cpu
            table = InstanceTable()
            started = time.perf_counter()
            table.sync([("aws", i) for i in listed], time.time(), {"aws"})
            runs.append((list_s, list_cpu, time.perf_counter() - started))
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
    figures = {
        "instances": float(len(listed)),
        "repeats": float(repeats),
        "moto_list_s": moto_s,
        "describe_instances_list_s": statistics.median(before) if before else float("nan"),
        "tick_s_median": statistics.median(ticks),
        **{f"pages_{op}": float(n) for op, n in replay.pages_served().items()},
    }
    for name, runs in (("first", first), ("steady", steady)):
        figures[f"{name}_list_s"] = statistics.median(r[0] for r in runs)
        figures[f"{name}_list_cpu_s"] = statistics.median(r[1] for r in runs)
        figures[f"{name}_sync_s"] = statistics.median(r[2] for r in runs)
        figures[f"{name}_list_and_sync_s"] = statistics.median(r[0] + r[2] for r in runs)
        figures[f"{name}_list_and_sync_s_best"] = min(r[0] + r[2] for r in runs)
    return figures


class Replay:
    """Records moto's answers per operation and request, then serves them again, so the figure
    is ours (HTTP parsing, mapping, diffing) and not moto's filter evaluation, which is far slower
    than EC2's. moto answers DescribeTags and DescribeInstanceStatus in one page whatever
    MaxResults says; EC2 pages them by 1,000, so the replay serves them so, following the
    NextToken the client sends."""

    def __init__(self) -> None:
        self.replaying = False
        self._asked: list[tuple[tuple[str, str], str | None]] = []
        self._answers: dict[tuple[str, str], dict[str | None, bytes]] = {}
        self._pages: dict[tuple[str, str], dict[str | None, bytes]] = {}
        self.served: dict[str, int] = {}

    def attach(self, client: Any) -> None:
        client.meta.events.register("before-send.ec2", self._send)
        client.meta.events.register("after-call.ec2", self._keep)

    def pages_served(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for (operation, _), pages in self._pages.items():
            counts[operation] = counts.get(operation, 0) + len(pages)
        return counts

    @staticmethod
    def _key(request: Any, event_name: str) -> tuple[tuple[str, str], str | None]:
        body = request.body.decode() if isinstance(request.body, bytes) else str(request.body)
        form = parse_qs(body)
        token = form.pop("NextToken", [None])[0]
        form.pop("MaxResults", None)
        return (event_name.rsplit(".", 1)[-1], json.dumps(form, sort_keys=True)), token

    def _send(self, request: Any, event_name: str, **_: Any) -> AWSResponse | None:
        key, token = self._key(request, event_name)
        if not self.replaying:
            self._asked.append((key, token))
            return None
        if key not in self._answers:
            return None  # not part of the listing (a launch, prices): moto answers
        if key not in self._pages:
            self._pages[key] = _paged(self._answers[key])
        return AWSResponse(request.url, 200, {}, _Raw(self._pages[key][token]))

    def _keep(self, http_response: Any, **_: Any) -> None:
        if not self.replaying and self._asked:
            key, token = self._asked[-1]
            self._answers.setdefault(key, {}).setdefault(token, http_response.content)


def _paged(answers: dict[str | None, bytes], size: int = 1000) -> dict[str | None, bytes]:
    """Recorded answers keyed by the NextToken that asks for each (None: the first page). A
    single answer listing more than ``size`` items is cut into EC2's pages of ``size``, as moto
    does not page DescribeTags or DescribeInstanceStatus."""
    if list(answers) != [None]:
        return answers
    root = ET.fromstring(answers[None])
    namespace = root.tag[: root.tag.index("}") + 1] if root.tag.startswith("{") else ""
    ET.register_namespace("", namespace.strip("{}"))
    listing = next(
        (child for child in root if child.tag.endswith(("tagSet", "instanceStatusSet"))), None
    )
    if listing is None or len(listing) <= size:
        return answers
    items = list(listing)
    pages: dict[str | None, bytes] = {}
    for start in range(0, len(items), size):
        for item in list(listing):
            listing.remove(item)
        listing.extend(items[start : start + size])
        for stale in root.findall(f"{namespace}nextToken"):
            root.remove(stale)
        if start + size < len(items):
            ET.SubElement(root, f"{namespace}nextToken").text = str(start + size)
        pages[str(start) if start else None] = ET.tostring(
            root, xml_declaration=True, encoding="utf-8"
        )
    return pages


class _Raw:
    def __init__(self, body: bytes) -> None:
        self.body = body

    def stream(self, **_: Any) -> Any:
        yield self.body


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--instances", type=int, default=5000)
    parser.add_argument("--notices", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=5, help="listings timed (median shown)")
    parser.add_argument(
        "--compare",
        action="store_true",
        help="also time the DescribeInstances listing (moto needs about a minute to serve it)",
    )
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
        figures = listing(url, args.instances, args.repeats, args.compare)
    finally:
        server.stop()
    for name, what in (
        ("first", "a provider's first listing, every instance new (all four tags)"),
        ("steady", "a steady listing (the fleet tag, tags of new instances)"),
    ):
        print(
            f"listing {figures['instances']:.0f} tagged instances, {what}: "
            f"{figures[name + '_list_s'] * 1000:.0f} ms wall, "
            f"{figures[name + '_list_cpu_s'] * 1000:.0f} ms CPU; table sync "
            f"{figures[name + '_sync_s'] * 1000:.0f} ms; listing and diffing "
            f"{figures[name + '_list_and_sync_s'] * 1000:.0f} ms (best "
            f"{figures[name + '_list_and_sync_s_best'] * 1000:.0f} ms; medians of "
            f"{figures['repeats']:.0f}; target <= 500 ms)"
        )
    print(
        "pages: "
        + ", ".join(f"{k[6:]} {v:.0f}" for k, v in figures.items() if k.startswith("pages_"))
        + f"; whole tick {figures['tick_s_median'] * 1000:.0f} ms"
    )
    if args.compare:
        print(
            "the same instances through DescribeInstances: "
            f"{figures['describe_instances_list_s'] * 1000:.0f} ms"
        )
    print(f"(moto itself took {figures['moto_list_s']:.1f} s to filter and serve those pages)")
    if args.json:
        args.json.write_text(json.dumps({"notice_median_s": median, **figures}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
