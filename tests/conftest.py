from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

pytest_plugins = [
    "aws_support",
    "aws_placement",
    "gcp_emulator",
    "azure_emulator",
    "slurm_cluster",
    "redis_server",
    "prometheus_server",
    "metadata_servers",
    "exporter_server",
    "k8s_api_emulator",
    "postgres_server",
]
