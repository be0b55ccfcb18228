"""Copy (and trim) the real data the demo, tests and benchmarks need from ../shared/data.

Run once by a maintainer when the shipped data changes; the project never reads ../shared at run
time. Trimming keeps only rows the shipped scenario can use; every kept row is unchanged.

    python scripts/copy_shared_data.py ../shared/data autoscaler/data
"""

from __future__ import annotations

import csv
import sys
from pathlib import Path

AVAILABILITY_TRACES = {
    "skypilot-spot-traces/availability/1-node/aws-02-15-2023/us-east-1a_v100_1",
    "skypilot-spot-traces/availability/1-node/aws-02-15-2023/us-east-1c_v100_1",
    "skypilot-spot-traces/availability/1-node/aws-02-15-2023/us-east-1d_v100_1",
    "skypilot-spot-traces/availability/1-node/aws-02-15-2023/us-east-1f_v100_1",
    "skypilot-spot-traces/availability/1-node/aws-02-15-2023/us-east-2a_v100_1",
    "skypilot-spot-traces/availability/1-node/aws-02-15-2023/us-east-2b_v100_1",
    "skypilot-spot-traces/availability/1-node/aws-02-15-2023/us-west-2a_v100_1",
    "skypilot-spot-traces/availability/1-node/aws-02-15-2023/us-west-2b_v100_1",
    "skypilot-spot-traces/availability/1-node/aws-02-15-2023/us-west-2c_v100_1",
    "skypilot-spot-traces/availability/1-node/aws-10-26-2022/us-west-2a_v100_8",
    "skypilot-spot-traces/availability/1-node/aws-10-26-2022/us-west-2b_v100_8",
    "skypilot-spot-traces/availability/16-node/aws-08-27-2023/us-west-2a_v100_1",
    "spothedge-ae/data/GCP1/us-central1-a_a100_40gb_8",
    "spothedge-ae/data/GCP1/us-central1-b_a100_40gb_8",
    "spothedge-ae/data/GCP1/europe-west4-a_a100_40gb_8",
    "spothedge-ae/data/GCP1/us-west1-b_a100_40gb_8",
}
GCP_TYPES = {"a2-highgpu-1g", "a2-highgpu-8g"}
AWS_FAMILIES = ("p3.", "p2.", "g4dn.", "g5.")


def copy_filtered(source: Path, target: Path, keep) -> int:
    target.parent.mkdir(parents=True, exist_ok=True)
    with source.open(newline="") as src, target.open("w", newline="") as dst:
        reader = csv.DictReader(src)
        writer = csv.DictWriter(dst, fieldnames=reader.fieldnames, lineterminator="\n")
        writer.writeheader()
        kept = 0
        for row in reader:
            if keep(row):
                writer.writerow(row)
                kept += 1
    return kept


def main(shared: Path, data: Path) -> None:
    counts = {}
    counts["traces/alibaba_gpu_v2023_openb.csv"] = copy_filtered(
        shared / "traces/alibaba_gpu_v2023_openb.csv",
        data / "traces/alibaba_gpu_v2023_openb.csv",
        lambda r: r["num_gpus"] != "0" and r["duration_s"] != "",
    )
    # Serving instances of the apps whose number is a multiple of 5: a demand the shipped
    # scenario's cloud limits can hold (autoscaler/data/README.md).
    counts["traces/alibaba_gpu_v2025_dlrm_serving_gpu_instances.csv"] = copy_filtered(
        shared / "traces/alibaba_gpu_v2025_dlrm_serving_gpu_instances.csv",
        data / "traces/alibaba_gpu_v2025_dlrm_serving_gpu_instances.csv",
        lambda r: int(r["user_group"].removeprefix("app_")) % 5 == 0,
    )
    counts["catalog/gcp_gpu_machine_types.csv"] = copy_filtered(
        shared / "catalog/gcp_gpu_machine_types.csv",
        data / "catalog/gcp_gpu_machine_types.csv",
        lambda r: True,
    )
    counts["prices/gcp_gpu_vm_price_history.csv"] = copy_filtered(
        shared / "prices/gcp_gpu_vm_price_history.csv",
        data / "prices/gcp_gpu_vm_price_history.csv",
        lambda r: r["instance_type"] in GCP_TYPES,
    )
    counts["prices/aws_gpu_spot_price_events_2022-05-31.csv"] = copy_filtered(
        shared / "prices/aws_gpu_spot_price_events_2022-05-31.csv",
        data / "prices/aws_gpu_spot_price_events_2022-05-31.csv",
        lambda r: r["instance_type"].startswith(AWS_FAMILIES),
    )
    counts["prices/aws_gpu_on_demand_price_history_us-east-1.csv"] = copy_filtered(
        shared / "prices/aws_gpu_on_demand_price_history_us-east-1.csv",
        data / "prices/aws_gpu_on_demand_price_history_us-east-1.csv",
        lambda r: True,
    )
    counts["interruptions/spot_availability_preemption_runs.csv"] = copy_filtered(
        shared / "interruptions/spot_availability_preemption_runs.csv",
        data / "interruptions/spot_availability_preemption_runs.csv",
        lambda r: r["trace_id"] in AVAILABILITY_TRACES,
    )
    counts["interruptions/aws_spot_advisor_gpu_interruption_buckets.csv"] = copy_filtered(
        shared / "interruptions/aws_spot_advisor_gpu_interruption_buckets.csv",
        data / "interruptions/aws_spot_advisor_gpu_interruption_buckets.csv",
        lambda r: True,
    )
    counts["catalog/aws_gpu_instance_types.csv"] = copy_filtered(
        shared / "catalog/aws_gpu_instance_types.csv",
        data / "catalog/aws_gpu_instance_types.csv",
        lambda r: True,
    )
    counts["catalog/azure_gpu_vm_sizes.csv"] = copy_filtered(
        shared / "catalog/azure_gpu_vm_sizes.csv",
        data / "catalog/azure_gpu_vm_sizes.csv",
        lambda r: True,
    )
    counts["catalog/alibaba_spot_gpu_cluster_nodes_v2026.csv"] = copy_filtered(
        shared / "catalog/alibaba_spot_gpu_cluster_nodes_v2026.csv",
        data / "catalog/alibaba_spot_gpu_cluster_nodes_v2026.csv",
        lambda r: r["gpu_model"] == "A100-SXM4-80GB" and r["gpu_capacity_num"] == "8",
    )
    for name, kept in counts.items():
        print(f"{kept:6d} rows  {name}")


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
