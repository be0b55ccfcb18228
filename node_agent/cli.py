"""``gpu-autoscaler agent``: its arguments and entry point (stdlib only at import time, so the
CLI starts fast and without the agent's optional packages)."""

from __future__ import annotations

import argparse
from pathlib import Path

AWS_METADATA_URL = "http://169.254.169.254"
GCP_METADATA_URL = "http://metadata.google.internal"
AZURE_METADATA_URL = "http://169.254.169.254"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--listen",
        default="0.0.0.0:9400",
        metavar="HOST:PORT",
        help="where /metrics is served (default 0.0.0.0:9400, dcgm-exporter's port; 0 = any)",
    )
    parser.add_argument(
        "--hostname",
        default=None,
        help="the node's name as the scheduler knows it (default: the cloud's instance id or "
        "name from metadata, else this machine's hostname)",
    )
    parser.add_argument(
        "--cloud",
        default="auto",
        choices=["auto", "aws", "gcp", "azure", "none"],
        help="which cloud's interruption notices to watch (default: probe the metadata servers)",
    )
    parser.add_argument(
        "--controller-url",
        default=None,
        help="the controller's notice inbox, e.g. https://controller:9401 (default: notices "
        "only run the local hooks)",
    )
    token = parser.add_mutually_exclusive_group()
    token.add_argument("--token-file", type=Path, default=None, help="file holding the token")
    token.add_argument(
        "--token-env",
        default="GPU_AUTOSCALER_TOKEN",
        help="environment variable holding the token (default GPU_AUTOSCALER_TOKEN)",
    )
    parser.add_argument(
        "--ca-file", type=Path, default=None, help="CA bundle for an https controller URL"
    )
    parser.add_argument(
        "--hook-command",
        default=None,
        help="command run on each notice, with GPU_AUTOSCALER_NOTICE_{KIND,DEADLINE,"
        "SECONDS_LEFT,INSTANCE_ID,SOURCE} in its environment",
    )
    parser.add_argument(
        "--hook-timeout", type=float, default=25.0, help="seconds before the hook is killed"
    )
    parser.add_argument("--signal", default=None, help="signal sent on each notice, e.g. USR1")
    parser.add_argument(
        "--signal-pid-file", type=Path, default=None, help="file holding the pid to signal"
    )
    parser.add_argument(
        "--signal-process-group",
        action="store_true",
        help="signal the whole process group of that pid",
    )
    parser.add_argument(
        "--azure-ack",
        default="after-hooks",
        choices=["after-hooks", "never"],
        help="acknowledge a Preempt event once the notice was delivered and the hook returned "
        "(default), or never (Azure then goes ahead at NotBefore)",
    )
    parser.add_argument("--aws-metadata-url", default=AWS_METADATA_URL)
    parser.add_argument("--gcp-metadata-url", default=GCP_METADATA_URL)
    parser.add_argument("--azure-metadata-url", default=AZURE_METADATA_URL)
    parser.add_argument(
        "--aws-poll-seconds", type=float, default=5.0, help="IMDS poll period (AWS suggests 5)"
    )
    parser.add_argument(
        "--azure-poll-seconds", type=float, default=1.0, help="Scheduled Events poll period"
    )
    parser.add_argument(
        "--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"]
    )


def run(args: argparse.Namespace) -> int:
    from node_agent.main import options_from_arguments, run_agent

    return run_agent(options_from_arguments(args))
