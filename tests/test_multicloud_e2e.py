"""One fleet on three clouds, end to end through `gpu-autoscaler run`: demand bursts on an SQS
queue (moto), the cheapest cloud (Azure, on its emulator) runs out of capacity, the fleet fills
from GCP (its emulator) and AWS (moto) in the same tick, then drains to zero when the queue
empties."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import boto3
import yaml
from aws_support import REGION as AWS_REGION
from azure_emulator import POOL_OPTIONS, RESOURCE_GROUP, SUBSCRIPTION, ArmEmulator
from gcp_emulator import IMAGE, PROJECT, ComputeEmulator
from test_aws_e2e import ours, wait_for
from waits import bound


def config(aws: str, gcp: ComputeEmulator, azure: ArmEmulator, work: str, catalog: Path) -> dict:
    shape = {"gpus_per_instance": 1, "market": "spot", "boot_seconds": 0}
    return {
        "fleet_id": "e2e",
        "tick_seconds": 1,
        "policy": {
            "name": "cost-aware",
            "params": {"idle_seconds": 0, "unobserved_nodes": "surplus"},
        },
        "limits": {"scale_down_cooldown_s": 0, "max_instances": 20},
        "capacity_cache_ttl_s": 3600,
        "providers": {
            "aws": {"endpoint_url": aws, "price_catalog": str(catalog)},
            "gcp": {"project": PROJECT, "endpoint": gcp.url, "operation_timeout_s": bound(30)},
            "azure": {
                "subscription_id": SUBSCRIPTION,
                "resource_group": RESOURCE_GROUP,
                "endpoint": azure.url,
                "retail_prices_url": azure.prices_url,
                "polling_interval_s": 0.01,
                "operation_timeout_s": bound(30),
            },
        },
        "sources": [
            {
                "kind": "sqs",
                "name": "work",
                "settings": {
                    "queue_url": work,
                    "region": AWS_REGION,
                    "endpoint_url": aws,
                    "gpus_per_message": 1,
                    "checkpoint_interval_s": 600,
                },
            }
        ],
        "pools": [
            {
                "name": "azure-t4",
                "provider": "azure",
                "region": "eastus",
                "instance_type": "Standard_NC4as_T4_v3",
                "max_instances": 10,
                "options": dict(POOL_OPTIONS),
                **shape,
            },
            {
                "name": "gcp-a100",
                "provider": "gcp",
                "region": "us-central1",
                "zone": "us-central1-a",
                "instance_type": "a2-highgpu-1g",
                "max_instances": 3,
                "options": {"image": IMAGE},
                **shape,
            },
            {
                "name": "aws-a10g",
                "provider": "aws",
                "region": AWS_REGION,
                "zone": f"{AWS_REGION}a",
                "instance_type": "g5.xlarge",
                "max_instances": 10,
                "options": {"instance_types": ["g5.2xlarge"], "launch_template": {"name": "gpu"}},
                **shape,
            },
        ],
    }


def test_one_cloud_runs_dry_the_others_fill_the_fleet_then_it_drains(
    aws: str, gcp: ComputeEmulator, azure_emulator: ArmEmulator, tmp_path: Path
) -> None:
    azure_emulator.reset()
    sqs = boto3.client("sqs", region_name=AWS_REGION, endpoint_url=aws)
    work = sqs.create_queue(QueueName="work")["QueueUrl"]
    catalog = tmp_path / "aws.csv"
    catalog.write_text(
        "InstanceType,AcceleratorName,AcceleratorCount,vCPUs,MemoryGiB,Price,SpotPrice,Region,"
        "AvailabilityZone\ng5.xlarge,A10G,1,4,16,1.006,2.50,us-east-1,\n"
    )
    path = tmp_path / "controller.yaml"
    path.write_text(yaml.safe_dump(config(aws, gcp, azure_emulator, work, catalog)))
    assert (
        subprocess.run(
            [sys.executable, "-m", "autoscaler.cli", "validate", str(path)],
            capture_output=True,
            timeout=bound(120),
            check=False,
        ).returncode
        == 0
    )
    azure_emulator.grant_at_most(2)
    log = tmp_path / "controller.log"
    with log.open("w") as sink:
        process = subprocess.Popen(
            [sys.executable, "-m", "autoscaler.cli", "run", "--config", str(path)],
            stdout=sink,
            stderr=subprocess.STDOUT,
            env=dict(os.environ),
            cwd=tmp_path,  # the default journal lands here
        )

    def counts() -> tuple[int, int, int]:
        return len(azure_emulator.live()), len(gcp.live()), len(ours(aws))

    try:
        for i in range(6):
            sqs.send_message(QueueUrl=work, MessageBody=json.dumps({"job": i}))
        assert wait_for(lambda: sum(counts()) == 6), (counts(), log.read_text()[-3000:])
        assert counts() == (2, 3, 1), "Azure (cheapest) ran dry at 2; GCP to its limit; AWS last"
        first = next(line for line in log.read_text().splitlines() if "launched=" in line)
        assert "launched=6" in first, "all three clouds were used in the same tick"
        sqs.purge_queue(QueueUrl=work)
        assert wait_for(lambda: counts() == (0, 0, 0)), (counts(), log.read_text()[-3000:])
    finally:
        process.send_signal(signal.SIGTERM)
        code = process.wait(timeout=bound(60))
    assert code == 0, log.read_text()[-3000:]
    assert "Traceback" not in log.read_text()
