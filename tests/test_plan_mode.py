"""`gpu-autoscaler plan` end to end: the real CLI in a subprocess reads a Redis queue, moto (behind
a recording proxy) and the GCP and Azure emulators, prints what the controller would do and what
it would cost, and changes nothing: no mutating request reaches any cloud, and every instance,
tag, queue message and pending job is as it was."""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
import yaml
from aws_support import REGION as AWS_REGION
from azure_emulator import POOL_OPTIONS, RESOURCE_GROUP, SUBSCRIPTION, ArmEmulator
from gcp_emulator import IMAGE, PROJECT, ComputeEmulator
from recording_proxy import RecordingProxy
from redis_server import RedisServer, free_port
from waits import bound

from autoscaler.spi.provider import FLEET_TAG, LAUNCHED_AT_TAG, POOL_TAG, REQUEST_TAG
from providers.azure.instances import azure_tags
from providers.gcp.instances import labels_for

CLI = str(Path(sys.executable).parent / "gpu-autoscaler")
FLEET = "plan"
AMI = "ami-12c6146b"
READS = ("Describe", "Get", "List")
SHAPE = {"gpus_per_instance": 1, "market": "spot", "boot_seconds": 0}
AWS_POOL = {
    "name": "aws-a10g",
    "provider": "aws",
    "region": AWS_REGION,
    "zone": f"{AWS_REGION}a",
    "instance_type": "g5.xlarge",
    "max_instances": 10,
    "options": {"launch_template": {"name": "gpu"}},
    **SHAPE,
}
AZURE_POOL = {
    "name": "azure-t4",
    "provider": "azure",
    "region": "eastus",
    "instance_type": "Standard_NC4as_T4_v3",
    "max_instances": 4,
    "options": dict(POOL_OPTIONS),
    **SHAPE,
}


@pytest.fixture
def proxy(aws: str) -> Iterator[RecordingProxy]:
    """moto (clean, credentials set) behind a recording proxy the CLI is pointed at."""
    recorder = RecordingProxy(aws)
    recorder.start()
    yield recorder
    recorder.stop()


def tags(pool: str, launched_at: float, fleet: str = FLEET) -> dict[str, str]:
    return {
        FLEET_TAG: fleet,
        POOL_TAG: pool,
        REQUEST_TAG: f"earlier-{uuid.uuid4().hex[:8]}",
        LAUNCHED_AT_TAG: str(launched_at),
    }


def aws_instance(url: str, instance_tags: dict[str, str] | None) -> str:
    ec2 = boto3.client("ec2", region_name=AWS_REGION, endpoint_url=url)
    extra: dict[str, Any] = {}
    if instance_tags:
        extra["TagSpecifications"] = [
            {
                "ResourceType": "instance",
                "Tags": [{"Key": k, "Value": v} for k, v in instance_tags.items()],
            }
        ]
    done = ec2.run_instances(
        ImageId=AMI,
        InstanceType="g5.xlarge",
        MinCount=1,
        MaxCount=1,
        Placement={"AvailabilityZone": f"{AWS_REGION}a"},
        **extra,
    )
    return str(done["Instances"][0]["InstanceId"])


def aws_state(url: str) -> list[tuple[str, str, tuple[tuple[str, str], ...]]]:
    ec2 = boto3.client("ec2", region_name=AWS_REGION, endpoint_url=url)
    return sorted(
        (
            i["InstanceId"],
            i["State"]["Name"],
            tuple(sorted((t["Key"], t["Value"]) for t in i.get("Tags", []))),
        )
        for r in ec2.describe_instances()["Reservations"]
        for i in r["Instances"]
    )


def gcp_state(gcp: ComputeEmulator) -> str:
    return json.dumps(sorted(gcp.instances.values(), key=str), sort_keys=True, default=str)


def catalog(path: Path, row: str) -> str:
    path.write_text(
        "InstanceType,AcceleratorName,AcceleratorCount,vCPUs,MemoryGiB,Price,SpotPrice,Region,"
        f"AvailabilityZone\n{row}\n"
    )
    return str(path)


def azure_settings(emulator: ArmEmulator, tmp_path: Path) -> dict[str, Any]:
    return {
        "subscription_id": SUBSCRIPTION,
        "resource_group": RESOURCE_GROUP,
        "endpoint": emulator.url,
        "retail_prices_url": None,
        "price_catalog": catalog(
            tmp_path / "azure.csv", "Standard_NC4as_T4_v3,T4,1,4,28,0.526,0.30,eastus,"
        ),
    }


def queue(server: RedisServer, jobs: int) -> str:
    key = f"plan-{uuid.uuid4().hex}"
    if jobs:
        server.client().rpush(key, *[f"job-{i}" for i in range(jobs)])
    return key


def redis_source(url: str, key: str) -> dict[str, Any]:
    return {
        "kind": "redis",
        "name": "work",
        "settings": {"url": url, "key": key, "gpus_per_item": 1, "checkpoint_interval_s": 600},
    }


def plan(config: dict[str, Any], tmp_path: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    path = tmp_path / f"controller-{uuid.uuid4().hex[:6]}.yaml"
    path.write_text(yaml.safe_dump(config))
    return subprocess.run(
        [CLI, "plan", "--config", str(path), *flags],
        capture_output=True,
        text=True,
        check=False,
        timeout=bound(120),
        env=dict(os.environ),
    )


def lines_after(text: str, title: str) -> list[str]:
    """The indented lines of one section of the text plan."""
    lines = text.splitlines()
    start = lines.index(f"{title}:") + 1
    found = []
    for line in lines[start:]:
        if not line.startswith("  "):
            break
        found.append(line.strip())
    return found


def table_row(text: str, first: str) -> list[str]:
    return next(line.split() for line in text.splitlines() if line.split()[:1] == [first])


def test_plan_reads_three_clouds_and_a_queue_prints_the_tick_and_changes_nothing(
    proxy: RecordingProxy,
    gcp: ComputeEmulator,
    azure_emulator: ArmEmulator,
    redis_server: RedisServer,
    tmp_path: Path,
) -> None:
    azure_emulator.reset()
    moto = proxy.upstream_url
    an_hour_ago = time.time() - 3600
    kept = [aws_instance(moto, tags("aws-a10g", an_hour_ago)) for _ in range(2)]
    orphan = aws_instance(moto, tags("retired-a10g", an_hour_ago))
    aws_instance(moto, None)
    aws_instance(moto, tags("aws-a10g", an_hour_ago, fleet="someone-else"))
    gcp.add_instance(
        "us-central1-a", "gcp-ours", labels_for(tags("gcp-a100", an_hour_ago)), spot=True
    )
    gcp.add_instance("us-central1-a", "gcp-stranger", {"team": "research"}, spot=True)
    azure_emulator.add_vm("azure-ours", azure_tags(tags("azure-t4", an_hour_ago)), priority="Spot")
    azure_emulator.add_vm("azure-stranger", {"team": "research"}, priority="Spot")
    sqs = boto3.client("sqs", region_name=AWS_REGION, endpoint_url=moto)
    notices = sqs.create_queue(QueueName="notices")["QueueUrl"]
    sqs.send_message(QueueUrl=notices, MessageBody=json.dumps({"detail-type": "warning"}))
    key = queue(redis_server, 12)
    config = {
        "fleet_id": FLEET,
        "policy": {"name": "cost-aware"},
        "limits": {"max_launches_per_tick": 6},
        "providers": {
            "aws": {
                "endpoint_url": proxy.url,
                "interruption_queue_url": notices.replace(moto, proxy.url),
                "price_catalog": catalog(
                    tmp_path / "aws.csv", "g5.xlarge,A10G,1,4,16,1.006,0.50,us-east-1,"
                ),
            },
            "gcp": {
                "project": PROJECT,
                "endpoint": gcp.url,
                "price_catalog": catalog(
                    tmp_path / "gcp.csv", "a2-highgpu-1g,A100,1,12,85,3.67,1.20,us-central1,"
                ),
            },
            "azure": azure_settings(azure_emulator, tmp_path),
        },
        "sources": [redis_source(redis_server.url, key)],
        "pools": [
            AWS_POOL,
            {
                "name": "gcp-a100",
                "provider": "gcp",
                "region": "us-central1",
                "zone": "us-central1-a",
                "instance_type": "a2-highgpu-1g",
                "max_instances": 3,
                "options": {"image": IMAGE},
                **SHAPE,
            },
            AZURE_POOL,
        ],
    }
    before = (aws_state(moto), gcp_state(gcp))
    azure_before = [
        (vm.name, vm.state, json.dumps(vm.body, sort_keys=True)) for vm in azure_emulator.all_vms()
    ]

    text = plan(config, tmp_path)
    shown = plan(config, tmp_path, "--json")

    assert text.returncode == 0, text.stderr
    assert shown.returncode == 0, shown.stderr
    assert "Traceback" not in text.stderr + shown.stderr
    report = json.loads(shown.stdout)
    assert report["complete"] is True, report["problems"]
    assert report["demand"] == {"known": True, "jobs": 12, "gpus": 12, "failed_sources": []}
    # 12 jobs; 4 GPUs are up (2 AWS, 1 GCP, 1 Azure; the orphan is being collected, so it is
    # no supply); Azure is cheapest but holds 4 at most, so 3 there and 5 on AWS. Launches go in
    # pool order: AWS takes 5 of the 6 the tick may launch, Azure 1 of its 3, and the two GPUs
    # left over walk Azure's fallbacks, which the launch rate refuses.
    launches = {launch["pool"]: launch for launch in report["launches"]}
    assert [(a["pool"], a["wanted"], a["granted"]) for a in launches["aws-a10g"]["attempts"]] == [
        ("aws-a10g", 5, 5)
    ]
    assert launches["aws-a10g"]["fallbacks"] == ["azure-t4", "gcp-a100"]
    assert [(a["pool"], a["wanted"], a["granted"]) for a in launches["azure-t4"]["attempts"]] == [
        ("azure-t4", 3, 1),
        ("aws-a10g", 2, 0),
        ("gcp-a100", 2, 0),
    ]
    assert [(c["rule"], c["pool"], c["requested"], c["allowed"]) for c in report["clamps"]] == [
        ("launch_rate", "azure-t4", 3, 1),
        ("launch_rate", "aws-a10g", 2, 0),
        ("launch_rate", "gcp-a100", 2, 0),
    ]
    assert report["drains"] == []
    assert [(o["instance_id"], o["pool"]) for o in report["orphans"]] == [(orphan, "retired-a10g")]
    # plan is the real tick: act ran against the recording executor and asked for exactly this
    launched = [(c[1], int(c[2])) for c in report["calls"] if c[0] == "launch"]
    assert launched == [("aws-a10g", 5), ("azure-t4", 1)]
    assert [c[1:] for c in report["calls"] if c[0] == "terminate"] == [[orphan]]
    pools = {p["pool"]: p for p in report["pools"]}
    assert {n: (p["instances_now"], p["instances_after"]) for n, p in pools.items()} == {
        "aws-a10g": (2, 7),
        "gcp-a100": (1, 1),
        "azure-t4": (1, 2),
    }
    assert report["cost_per_hour_now"] == pytest.approx(2 * 0.50 + 1.20 + 0.30)
    assert report["cost_per_hour_after"] == pytest.approx(7 * 0.50 + 1.20 + 2 * 0.30)
    left = (month_end(report["at"]) - report["at"]) / 3600
    assert report["hours_left_in_month"] == pytest.approx(left, abs=0.01)
    assert report["month_end_run_cost"] == pytest.approx((7 * 0.50 + 1.20 + 2 * 0.30) * left, 0.01)
    assert {s["name"]: s["ok"] for s in report["sources"]} == {
        "aws": True,
        "gcp": True,
        "azure": True,
        "work": True,
    }

    out = text.stdout
    assert "demand: 12 pending job(s), 12 GPU(s)" in out
    assert "projected month-end: $" in out and "plus this month's spend so far" in out
    assert table_row(out, "aws-a10g")[3:] == ["$0.5000", "2", "+5", "-0", "7", "$1.0000", "$3.5000"]
    assert table_row(out, "azure-t4")[3:] == ["$0.3000", "1", "+1", "-0", "2", "$0.3000", "$0.6000"]
    assert table_row(out, "total")[1:] == ["4", "+6", "-0", "10", "$2.5000", "$5.3000"]
    assert lines_after(out, "launches") == [
        "aws-a10g: 5 asked (host pending jobs of 1 GPU(s)): aws-a10g 5 of 5; "
        "on a capacity failure: azure-t4, gcp-a100",
        "azure-t4: 3 asked (host pending jobs of 1 GPU(s)): azure-t4 1 of 3, "
        "then aws-a10g 0 of 2, then gcp-a100 0 of 2",
    ]
    assert lines_after(
        out, "orphans collected (tagged ours, pool not configured; not priced, not in the totals)"
    ) == [f"{orphan} in retired-a10g (running)"]
    assert "launch_rate azure-t4: 3 -> 1: limits.max_launches_per_tick reached" in out
    assert "interruption notices were not read" in out
    assert not set(kept) & set(out.split()), "kept instances are neither drained nor collected"

    operations = proxy.operations()
    assert "DescribeTags" in operations, "the AWS listing went through the proxy"
    assert [op for op in operations if not op.startswith(READS)] == [], operations
    assert not {"ReceiveMessage", "DeleteMessage", "ChangeMessageVisibility"} & set(operations)
    assert gcp.requests and {method for method, _ in gcp.requests} == {"GET"}, gcp.requests
    assert azure_emulator.requests
    assert {method for method, _ in azure_emulator.requests} == {"GET"}, azure_emulator.requests
    assert (aws_state(moto), gcp_state(gcp)) == before
    assert [
        (vm.name, vm.state, json.dumps(vm.body, sort_keys=True)) for vm in azure_emulator.all_vms()
    ] == azure_before
    waiting = sqs.get_queue_attributes(QueueUrl=notices, AttributeNames=["All"])["Attributes"]
    assert (
        waiting["ApproximateNumberOfMessages"],
        waiting["ApproximateNumberOfMessagesNotVisible"],
    ) == ("1", "0")
    assert redis_server.client().llen(key) == 12


def month_end(at: float) -> float:
    """The start of the next calendar month (UTC) after ``at``, in epoch seconds."""
    now = datetime.datetime.fromtimestamp(at, datetime.UTC)
    year, month = (now.year + 1, 1) if now.month == 12 else (now.year, now.month + 1)
    return datetime.datetime(year, month, 1, tzinfo=datetime.UTC).timestamp()


def aws_only(proxy: RecordingProxy, tmp_path: Path, source: dict[str, Any]) -> dict[str, Any]:
    return {
        "fleet_id": FLEET,
        "policy": {
            "name": "cost-aware",
            "params": {"idle_seconds": 0, "unobserved_nodes": "surplus"},
        },
        "limits": {"scale_down_cooldown_s": 0, "max_drains_per_tick": 1},
        "providers": {
            "aws": {
                "endpoint_url": proxy.url,
                "price_catalog": catalog(
                    tmp_path / "aws.csv", "g5.xlarge,A10G,1,4,16,1.006,0.50,us-east-1,"
                ),
            }
        },
        "sources": [source],
        "pools": [AWS_POOL],
    }


def test_nodes_the_queue_no_longer_needs_are_planned_for_draining_within_the_drain_limit(
    proxy: RecordingProxy, redis_server: RedisServer, tmp_path: Path
) -> None:
    moto = proxy.upstream_url
    ids = [aws_instance(moto, tags("aws-a10g", time.time() - 3600)) for _ in range(3)]
    before = aws_state(moto)
    config = aws_only(proxy, tmp_path, redis_source(redis_server.url, queue(redis_server, 1)))

    done = plan(config, tmp_path, "--json")

    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["complete"] is True, report["problems"]
    assert report["launches"] == []
    (drain,) = report["drains"]
    assert drain["instance_id"] in ids
    assert drain["reason"] == "GPUs idle by measured utilisation"
    assert [(c["rule"], c["requested"], c["allowed"]) for c in report["clamps"]] == [
        ("drain_rate", 1, 0)
    ], "one job keeps one node; of the two left, the drain limit lets one go this tick"
    (pool,) = report["pools"]
    assert (pool["instances_now"], pool["drains"], pool["instances_after"]) == (3, 1, 2)
    assert (report["cost_per_hour_now"], report["cost_per_hour_after"]) == pytest.approx(
        (1.50, 1.00)
    )
    assert [op for op in proxy.operations() if not op.startswith(READS)] == []
    assert aws_state(moto) == before


def test_a_failed_queue_source_makes_demand_unknown_and_holds_every_drain(
    proxy: RecordingProxy, tmp_path: Path
) -> None:
    moto = proxy.upstream_url
    for _ in range(2):
        aws_instance(moto, tags("aws-a10g", time.time() - 3600))
    dead = f"redis://127.0.0.1:{free_port()}/0"
    config = aws_only(proxy, tmp_path, redis_source(dead, "work"))

    text = plan(config, tmp_path)
    shown = plan(config, tmp_path, "--json")

    assert (text.returncode, shown.returncode) == (0, 0), text.stderr + shown.stderr
    report = json.loads(shown.stdout)
    assert report["complete"] is False
    assert report["demand"]["known"] is False
    assert report["demand"]["failed_sources"] == ["work"]
    assert report["drains"] == []
    assert [(c["rule"], c["allowed"]) for c in report["clamps"]] == [("demand_unknown", 0)] * 2
    assert any(p.startswith("queue source work:") for p in report["problems"])
    assert {s["name"]: s["ok"] for s in report["sources"]} == {"aws": True, "work": False}
    assert "DEGRADED" in text.stdout.splitlines()[0]
    assert "demand: UNKNOWN (queue source(s) work failed)" in text.stdout
    assert "Traceback" not in text.stdout + text.stderr
    assert [op for op in proxy.operations() if not op.startswith(READS)] == []


def test_a_cloud_that_cannot_be_listed_leaves_its_supply_and_cost_unknown(
    redis_server: RedisServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    nothing = f"http://127.0.0.1:{free_port()}"
    config = {
        "fleet_id": FLEET,
        "providers": {"aws": {"endpoint_url": nothing, "connect_timeout_s": 1}},
        "sources": [redis_source(redis_server.url, queue(redis_server, 2))],
        "pools": [AWS_POOL],
    }
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing-secret")
    monkeypatch.setenv("AWS_DEFAULT_REGION", AWS_REGION)

    done = plan(config, tmp_path)

    assert done.returncode == 0, done.stderr
    assert "DEGRADED" in done.stdout.splitlines()[0]
    assert table_row(done.stdout, "aws-a10g")[4] == "unknown", "never zero"
    assert any(
        line.startswith("  provider aws: listing failed") for line in done.stdout.splitlines()
    )


def test_a_bad_config_is_one_line_and_exit_2_before_any_cloud_is_asked(
    proxy: RecordingProxy, tmp_path: Path
) -> None:
    config = aws_only(proxy, tmp_path, {"kind": "redis", "settings": {}})
    config["pools"] = [{**AWS_POOL, "gpus_per_instance": 0}]

    done = plan(config, tmp_path)

    assert done.returncode == 2
    assert done.stdout == ""
    (line,) = done.stderr.splitlines()
    assert line.startswith("error: ") and "gpus_per_instance" in line, line
    assert proxy.operations() == []


def test_a_vm_whose_create_failed_is_left_for_the_running_controller_to_delete(
    azure_emulator: ArmEmulator, redis_server: RedisServer, tmp_path: Path
) -> None:
    azure_emulator.reset()
    azure_emulator.add_vm(
        "azure-failed", azure_tags(tags("azure-t4", time.time())), state="Failed", priority="Spot"
    )
    failed = azure_emulator.vm("azure-failed")
    assert failed is not None
    with azure_emulator.lock:
        failed.error = ("AllocationFailed", "Allocation failed.")  # not running: holds nothing
    config = {
        "fleet_id": FLEET,
        "providers": {"azure": azure_settings(azure_emulator, tmp_path)},
        "sources": [redis_source(redis_server.url, queue(redis_server, 0))],
        "pools": [AZURE_POOL],
    }

    done = plan(config, tmp_path, "--json")

    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["complete"] is True
    assert azure_emulator.count("GET", "/instanceView$") == 1, "the listing looked at it"
    assert {method for method, _ in azure_emulator.requests} == {"GET"}, azure_emulator.requests
    assert azure_emulator.vm("azure-failed") is failed and failed.state == "Failed"
