from __future__ import annotations

import sys
from pathlib import Path

from hypothesis import HealthCheck, settings

sys.path.insert(0, str(Path(__file__).parent))

# The suite must be green on a busy machine: how fast hypothesis draws examples, or how long one
# takes, is not what any test asserts (speed is measured in bench/), so neither fails a test.
settings.register_profile(
    "busy-machine", deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile("busy-machine")

pytest_plugins = [
    "waits",
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
