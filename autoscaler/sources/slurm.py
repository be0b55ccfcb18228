"""Slurm as the controller's queue, node source and workload scheduler, through its commands.

The commands (``squeue``/``sinfo --json``, ``scontrol``, ``scancel``) are the interface every
Slurm site has and keeps stable across upgrades; slurmrestd is optional and cannot update nodes
in 22.05. Each runs with a list of arguments (no shell) and a timeout, and anything that goes
wrong becomes one ``SourceError`` line naming the command.

Cloud nodes are dynamic Slurm nodes named by their instance id and carrying ``cloud_feature``
(``join-cloud-node.sh`` starts them), so what the cloud lists and what Slurm runs meet on one
name. See docs/slurm.md for the slurm.conf lines and the ``--comment`` convention.
"""

from __future__ import annotations

import logging
import os
import re
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, NonNegativeInt, PositiveFloat, field_validator
from tenacity import Retrying, retry_if_exception, stop_after_delay, wait_fixed

from autoscaler.model import DemandGroup, OnPremUse, Placement
from autoscaler.model.errors import SourceError
from autoscaler.model.inputfile import validate_settings
from autoscaler.sources.slurm_json import (
    NODE_LIMIT_REASON,
    DemandRules,
    NodeGpus,
    NodeRules,
    active_jobs_on,
    cloud_node_weights,
    demand_groups,
    onprem_nodes,
    read_nodes,
    read_running_jobs,
)
from autoscaler.spi.sources import NodeReading, NodeUsage, RunningJob

DEFAULT_IGNORED_REASONS = (
    "Dependency",
    "DependencyNeverSatisfied",
    "BeginTime",
    "JobHeldUser",
    "JobHeldAdmin",
    "JobArrayTaskLimit",
    "PartitionDown",
    "PartitionInactive",
    "PartitionTimeLimit",
    "InvalidAccount",
    "InvalidQOS",
    "AccountNotAllowed",
    "QOSNotAllowed",
    "Reservation",
    "ReqNodeNotAvail, Reserved for maintenance",
    "BadConstraints",
    "FrontEndDown",
    "SystemFailure",
)
DEFAULT_IGNORED_REASON_PREFIXES = ("AssocGrp", "AssocMax", "QOSGrp", "QOSMax", "MaxGRES", "MaxCpu")
_SIGNAL = re.compile(r"^(SIG)?[A-Z0-9]+$")
_NODE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
_NODE_COUNT = re.compile(r"[0-9]{1,10}")

log = logging.getLogger(__name__)
_QUOTED_NODE_LIMIT = f'"{NODE_LIMIT_REASON}"'.encode()
REQUEUE_RELEASE_S = 10.0
DRAIN_BATCH = 200


class SlurmSettings(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    bin_dir: str | None = Field(None, description="where squeue, sinfo, scontrol, scancel are")
    slurm_conf: str | None = Field(None, description="SLURM_CONF for the commands")
    command_timeout_s: float = Field(30.0, gt=0, le=600)
    partitions: list[str] | None = Field(
        None, description="count only jobs and on-prem nodes of these partitions; unset: all"
    )
    cloud_feature: str = Field("gpu-autoscaler", min_length=1, pattern=r"^[A-Za-z0-9_.-]+$")
    checkpoint_interval_key: str = Field("checkpoint_interval", min_length=1)
    checkpoint_duration_key: str = Field("checkpoint_duration", min_length=1)
    checkpoint_signal_key: str = Field("checkpoint_signal", min_length=1)
    high_priority_min: NonNegativeInt | None = Field(
        None, description="a pending job with at least this priority is high priority"
    )
    high_priority_qos: list[str] = Field(default_factory=list)
    ignored_reasons: list[str] = Field(
        default_factory=lambda: list(DEFAULT_IGNORED_REASONS),
        description="pending reasons that more capacity cannot fix",
    )
    ignored_reason_prefixes: list[str] = Field(
        default_factory=lambda: list(DEFAULT_IGNORED_REASON_PREFIXES)
    )
    gpu_models: dict[str, str] = Field(
        default_factory=dict, description="Slurm gres type -> the pools' gpu_model (a100: A100)"
    )
    feature_gpu_models: dict[str, str] = Field(
        default_factory=dict,
        description="node feature -> the pools' gpu_model it names (h100: H100), read from "
        "jobs' --constraint and from nodes whose gres has no type",
    )
    feature_gpu_memory_gib: dict[str, PositiveFloat] = Field(
        default_factory=dict,
        description="node feature -> the GPU memory per GPU it stands for (gpu80g: 80), read "
        "from jobs' --constraint (a minimum) and from nodes' features",
    )
    cloud_weight_last: NonNegativeInt = Field(
        1000, description="cloud node weight while on-prem is preferred (higher is used later)"
    )
    cloud_weight_first: NonNegativeInt = Field(
        0, description="cloud node weight while spot-safe work should fill the cloud first"
    )
    forget_timeout_s: float = Field(
        30.0, gt=0, le=600, description="how long forget waits for a node's jobs to clear"
    )

    @field_validator("bin_dir", "slurm_conf")
    @classmethod
    def _absolute(cls, value: str | None) -> str | None:
        if value is not None and not Path(value).is_absolute():
            raise ValueError("must be an absolute path")
        return value


class _BusyError(SourceError):
    """``scontrol delete`` refused because the node still has jobs finishing."""


class SlurmAdapter:
    """Queue source (``read``), node source (``read_nodes``), workload scheduler and checkpointing
    scheduler (``running_jobs``, ``signal``, ``requeue``)."""

    def __init__(self, settings: SlurmSettings, name: str = "slurm") -> None:
        self.settings = settings
        self.name = name
        self.rules = DemandRules(
            partitions=frozenset(settings.partitions) if settings.partitions else None,
            ignored_reasons=frozenset(settings.ignored_reasons),
            ignored_reason_prefixes=tuple(settings.ignored_reason_prefixes),
            high_priority_min=settings.high_priority_min,
            high_priority_qos=frozenset(settings.high_priority_qos),
            gpu_models=dict(settings.gpu_models),
            checkpoint_keys=(settings.checkpoint_interval_key, settings.checkpoint_duration_key),
            checkpoint_signal_key=settings.checkpoint_signal_key,
            feature_gpu_models=dict(settings.feature_gpu_models),
            feature_gpu_memory_gib=dict(settings.feature_gpu_memory_gib),
        )
        self.node_rules = NodeRules(
            settings.cloud_feature,
            dict(settings.gpu_models),
            dict(settings.feature_gpu_models),
            dict(settings.feature_gpu_memory_gib),
        )
        self._empty_since: dict[str, float] = {}
        self._env = dict(os.environ)
        if settings.slurm_conf:
            self._env["SLURM_CONF"] = settings.slurm_conf

    @classmethod
    def from_config(cls, settings: Mapping[str, Any], name: str) -> SlurmAdapter:
        parsed = validate_settings(SlurmSettings, dict(settings), field=f"sources.{name}")
        return cls(parsed, name)

    def _run(self, *args: str) -> bytes:
        command = args[0]
        program = str(Path(self.settings.bin_dir) / command) if self.settings.bin_dir else command
        shown = " ".join(args[:3])
        try:
            done = subprocess.run(
                [program, *args[1:]],
                env=self._env,
                capture_output=True,
                timeout=self.settings.command_timeout_s,
                check=False,
                stdin=subprocess.DEVNULL,
            )
        except FileNotFoundError:
            raise SourceError(f"{command}: not found ({program})") from None
        except PermissionError:
            raise SourceError(f"{command}: not executable ({program})") from None
        except subprocess.TimeoutExpired:
            raise SourceError(
                f"{shown}: no answer within {self.settings.command_timeout_s:g}s"
            ) from None
        if done.returncode != 0:
            text = (
                done.stderr.decode(errors="replace").strip()
                or done.stdout.decode(errors="replace").strip()
            )
            last = text.splitlines()[-1] if text else "no message"
            failure = _BusyError if "busy" in text.lower() else SourceError
            raise failure(f"{shown}: exit status {done.returncode}: {last}")
        return done.stdout

    def read(self, now: float) -> Sequence[DemandGroup]:
        """Pending demand. Partition limits are read (one more command) only in a tick where some
        job waits for ``PartitionNodeLimit``: a multi-node job needing more nodes than its
        partition has today waits for that reason, and is demand when the partition's limits
        let it grow (cloud nodes joining) to hold the job."""
        text = self._run("squeue", "--json")
        rules = self.rules
        if NODE_LIMIT_REASON not in rules.ignored_reasons and _QUOTED_NODE_LIMIT in text:
            rules = replace(rules, partition_nodes=self._partition_nodes())
        return demand_groups(text, rules)

    def _partition_nodes(self) -> dict[str, tuple[int, int | None]]:
        """Each partition's MinNodes and MaxNodes (None: UNLIMITED) from ``scontrol show
        partition --oneliner``."""
        text = self._run("scontrol", "show", "partition", "--oneliner").decode(errors="replace")
        limits: dict[str, tuple[int, int | None]] = {}
        for line in text.splitlines():
            fields = dict(token.partition("=")[::2] for token in line.split())
            name = fields.get("PartitionName")
            if not name:
                continue
            least, most = fields.get("MinNodes", "0"), fields.get("MaxNodes", "UNLIMITED")
            if not _NODE_COUNT.fullmatch(least) or not (
                _NODE_COUNT.fullmatch(most) or most == "UNLIMITED"
            ):
                raise SourceError(
                    f"scontrol show partition: partition {name[:80]}: MinNodes={least[:20]} "
                    f"MaxNodes={most[:20]} are not node counts"
                )
            limits[name] = (int(least), None if most == "UNLIMITED" else int(most))
        return limits

    def read_nodes(self, now: float) -> NodeReading:
        nodes = self._sinfo()
        cloud: dict[str, NodeUsage] = {}
        empty_since: dict[str, float] = {}
        for node in nodes:
            if not node.cloud:
                continue
            since = None
            if node.gpus_allocated == 0:
                since = empty_since[node.name] = self._empty_since.get(node.name, now)
            cloud[node.name] = NodeUsage(gpus_allocated=node.gpus_allocated, empty_since=since)
        self._empty_since = empty_since
        return NodeReading(onprem=onprem_nodes(nodes), cloud=cloud)

    def _sinfo(self) -> list[NodeGpus]:
        return read_nodes(self._run("sinfo", "--json"), self.node_rules, self.rules.partitions)

    def running_jobs_by_node(self) -> dict[str, list[RunningJob]]:
        """Every node's running jobs from one ``squeue``: what the controller reads when several
        nodes are interrupted in the same tick."""
        return read_running_jobs(self._run("squeue", "--json"), self.rules)

    def running_jobs(self, node: str) -> list[RunningJob]:
        _check_node(node)
        return self.running_jobs_by_node().get(node, [])

    def _jobs_on(self, node: str) -> list[str]:
        return active_jobs_on(self._run("squeue", "--json"), node)

    def drain(self, node: str, reason: str) -> int:
        _check_node(node)
        self._run("scontrol", "update", f"nodename={node}", "state=drain", f"reason={reason}")
        return len(self._jobs_on(node))

    def drain_many(self, nodes: Sequence[str], reason: str) -> None:
        """Drain many nodes in a few commands: a zone-wide reclaim is hundreds of nodes, and their
        jobs' checkpoint signals must not wait behind hundreds of ``scontrol`` calls."""
        for node in nodes:
            _check_node(node)
        for start in range(0, len(nodes), DRAIN_BATCH):
            batch = ",".join(nodes[start : start + DRAIN_BATCH])
            self._run("scontrol", "update", f"nodename={batch}", "state=drain", f"reason={reason}")

    def resume(self, node: str) -> None:
        _check_node(node)
        self._run("scontrol", "update", f"nodename={node}", "state=resume")

    def evict(self, node: str, reason: str) -> int:
        """Requeue every job on the node; a job that refuses (``--no-requeue``) is named in the
        error after the others were requeued, since the node is going away either way."""
        _check_node(node)
        requeued = 0
        refused: list[str] = []
        for job_id in self._jobs_on(node):
            try:
                self._run("scontrol", "requeue", job_id)
                requeued += 1
            except SourceError as exc:
                refused.append(f"job {job_id}: {exc}")
        if refused:
            raise SourceError(
                f"evict {node} ({reason}): requeued {requeued}, could not requeue "
                f"{len(refused)}: {refused[0]}"
            )
        return requeued

    def requeue(self, job_id: str) -> None:
        """Requeue the job and lift the two-minute hold (its begin time) Slurm puts on a requeued
        job once it is pending again, so it can restart on the replacement capacity as soon as
        there is room, and counts as demand meanwhile."""
        job = _check_job(job_id)
        self._run("scontrol", "requeue", job)
        give_up = time.monotonic() + REQUEUE_RELEASE_S
        state = "COMPLETING"
        while time.monotonic() < give_up:
            state = self._run("squeue", "-h", "-j", job, "-o", "%T").decode(errors="replace")
            state = state.strip()
            if state != "COMPLETING":
                break
            time.sleep(0.1)
        if state != "PENDING":
            return
        try:
            self._run("scontrol", "update", f"jobid={job}", "starttime=now")
        except SourceError as exc:
            log.warning("job %s requeued, but it keeps Slurm's hold: %s", job, exc)

    def signal(self, job_id: str, signal: str) -> None:
        """Signal the batch script (where a job's checkpoint trap lives), not every step."""
        if not _SIGNAL.fullmatch(signal):
            raise SourceError(f"scancel: {signal!r} is not a signal name")
        self._run("scancel", f"--signal={signal}", "--batch", _check_job(job_id))

    def forget(self, node: str) -> None:
        """Remove a dynamic cloud node whose instance is gone: mark it down (its jobs are
        requeued), then delete it once Slurm has let go of them. A node Slurm does not know is
        already forgotten."""
        _check_node(node)
        try:
            self._run(
                "scontrol", "update", f"nodename={node}", "state=down", "reason=instance gone"
            )
        except SourceError as exc:
            if "invalid node name" in str(exc).lower():
                return
            raise
        for attempt in Retrying(
            retry=retry_if_exception(lambda exc: isinstance(exc, _BusyError)),
            stop=stop_after_delay(self.settings.forget_timeout_s),
            wait=wait_fixed(0.5),
            reraise=True,
        ):
            with attempt:
                self._run("scontrol", "delete", f"nodename={node}")

    def apply_placement(self, placement: Placement) -> None:
        """Order on-prem and cloud nodes by Slurm node weight (lower is used first): cloud last
        while spot-safe work should use on-prem first, cloud first otherwise. Keeping protected
        jobs off cloud nodes is the partition layout's job (docs/slurm.md): changing users' pending
        jobs every tick is not something an autoscaler should do behind their back."""
        wanted = (
            self.settings.cloud_weight_last
            if placement.spot_safe_onprem is OnPremUse.FIRST
            else self.settings.cloud_weight_first
        )
        weights = cloud_node_weights(self._run("sinfo", "--json"), self.settings.cloud_feature)
        stale = sorted(name for name, weight in weights.items() if weight != wanted)
        if stale:
            self._run("scontrol", "update", f"nodename={','.join(stale)}", f"weight={wanted}")


def _check_node(node: str) -> None:
    if not _NODE_NAME.fullmatch(node):
        raise SourceError(f"scontrol: {node!r} is not a node name")


def _check_job(job_id: str) -> str:
    if not re.fullmatch(r"\d+(_\d+)?", job_id):
        raise SourceError(f"scontrol: {job_id!r} is not a job id")
    return job_id
