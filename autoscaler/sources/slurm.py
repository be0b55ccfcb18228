"""Slurm as the controller's queue, node source and workload scheduler, through its commands.

The commands (``squeue``/``sinfo --json``, ``scontrol``, ``scancel``) are the interface every
Slurm site has and keeps stable across upgrades; slurmrestd is optional and cannot update nodes
in 22.05. Each runs with a list of arguments (no shell) and a timeout, and anything that goes
wrong becomes one ``SourceError`` line naming the command.

Cloud nodes are dynamic Slurm nodes named by their instance id and carrying ``cloud_feature``
and their market, pool and GPU model (``join-cloud-node.sh`` starts them), so what the cloud
lists and what Slurm runs meet on one name. Placement is Slurm's own doing: node weights, spot
nodes in partitions of their own that only jobs allowed on spot are put in, and exclusions that
keep a job moved off an on-prem node away from it, and node lists that bind the job room is
being made for to that room (``slurm_placement``). See docs/slurm.md for
the slurm.conf lines and the ``--comment`` convention. With ``join_user_data`` the adapter also
renders each cloud pool's boot script (``join_user_data``), which the providers put on the
instances they launch.
"""

from __future__ import annotations

import logging
import os
import re
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    field_validator,
    model_validator,
)
from tenacity import Retrying, retry_if_exception, stop_after_delay, wait_fixed

from autoscaler.model import DemandGroup, OnPremUse, Placement, Pool
from autoscaler.model.errors import SourceError
from autoscaler.model.inputfile import validate_settings
from autoscaler.sources.class_names import ClassNames
from autoscaler.sources.slurm_join import environment_problem, gres_type, user_data
from autoscaler.sources.slurm_json import (
    ACTIVE_STATES,
    NODE_LIMIT_REASON,
    DemandRules,
    NodeGpus,
    NodeRules,
    QueuedJob,
    active_jobs_on,
    cloud_node_weights,
    demand_groups,
    fold,
    iter_pending,
    load_jobs,
    one_line,
    onprem_nodes,
    queue_facts,
    read_nodes,
    read_queue,
    read_running_jobs,
    shards_by_node,
)
from autoscaler.sources.slurm_placement import (
    Binding,
    Hold,
    HoldStep,
    QueueIndex,
    Step,
    binding_steps,
    exclusions,
    hold_steps,
    partition_plan,
    requeued_order,
)
from autoscaler.sources.slurm_shards import held, shard_pools
from autoscaler.sources.team_names import TeamNames
from autoscaler.spi.sources import HeldOff, NodeReading, NodeUsage, RunningJob

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
_PARTITION = re.compile(r"^[A-Za-z0-9_.-]+$")
_GRES_TYPE = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
# What ``scontrol update`` says of a job that started or ended since the queue was read: the
# next tick reads it again, so these are not failures.
_GONE_BY_NOW = ("no longer pending", "invalid job id", "already completed")
# What it says, beside those, of the pending tasks of an array it did update (``7_1-2: No
# error``) when another task of the array has started: exit status 1, but no failure.
_UPDATED = ": no error"

log = logging.getLogger(__name__)
_QUOTED_NODE_LIMIT = f'"{NODE_LIMIT_REASON}"'.encode()
REQUEUE_RELEASE_S = 10.0
# A requeued job may start again two seconds from now, not at once: slurmd refuses, for good, a
# job whose new credential is dated no later than the second its last run's was revoked in
# ("Job credential revoked"), which is what a restart on the same node within that second is.
RELEASED = "starttime=now+2"
# How old the queue ``read`` left may be for ``apply_placement`` to use it: the same tick's.
QUEUE_REUSE_S = 30.0
DEFAULT_CRED_EXPIRE_S = 120.0
CREDENTIAL_MARGIN_S = 5.0
_CRED_EXPIRE = re.compile(r"^AuthInfo\s*=.*\bcred_expire=([0-9]{1,6})\b", re.MULTILINE)
_WEIGHT_PARTITION = re.compile(r"^PriorityWeightPartition\s*=\s*([0-9]{1,10})\b", re.MULTILINE)
# How often the managed partitions' PriorityTier and PriorityJobFactor are checked (a
# reconfigure may change them; one command).
ORDER_CHECK_S = 300.0
DRAIN_BATCH = 200
JOB_BATCH = 200


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
    team_from: Literal["account", "wckey", "qos", "partition", "none"] = Field(
        "account",
        description="the job field that names the team its demand is counted under (the "
        "config's teams): account (sbatch --account, how Slurm itself shares a cluster), wckey, "
        "qos or partition; none: no teams",
    )
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
    spot_partitions: dict[str, str] = Field(
        default_factory=dict,
        description="base partition -> its spot twin, the partition the spot cloud nodes are in "
        "(gpu: gpu-spot): pending GPU jobs of the base partition are put in the twin only while "
        "the placement lets them run on spot (docs/slurm.md)",
    )
    on_demand_partitions: dict[str, str] = Field(
        default_factory=dict,
        description="base partition -> its on-demand twin, the partition the on-demand cloud "
        "nodes are in (gpu: gpu-od), one for every base of spot_partitions: the base then holds "
        "on-prem nodes only, and each judged job's partitions are written in the placement's "
        "order (gpu,gpu-spot,gpu-od); unset, on-demand nodes share the base (docs/slurm.md)",
    )
    placement_jobs_per_tick: PositiveInt = Field(
        5000, description="the most pending jobs whose partitions one tick changes"
    )
    move_hold_s: float = Field(
        1800.0,
        gt=0,
        le=86_400,
        description="the longest a job moved off a node is kept off it while the job it made "
        "room for has not started",
    )
    join_user_data: bool = Field(
        False,
        description="render the boot script of every pool that joins the scheduler (join-cloud-"
        "node.sh with the pool's market, name and GPU model written in): the providers put it on "
        "the instances they launch as user data, startup-script or custom data (docs/slurm.md)",
    )
    join_gpu_types: dict[str, str] = Field(
        default_factory=dict,
        description="pool -> the gres type its nodes' GPUs join under (a100); a pool not listed "
        "takes the type whose gpu_models entry names its gpu_model, else none (gres gpu:N)",
    )
    join_environment: dict[str, str] = Field(
        default_factory=dict,
        description="more of the join script's environment, for every pool's nodes: "
        "GPU_AUTOSCALER_SLURMD_ARGS (--conf-server slurmctld:6817), GPU_AUTOSCALER_NODE_CONF "
        "(CPUs=... RealMemory=...), GPU_AUTOSCALER_FEATURES (the site's own features)",
    )

    @field_validator("spot_partitions")
    @classmethod
    def _twins(cls, value: dict[str, str]) -> dict[str, str]:
        for base, twin in value.items():
            for name in (base, twin):
                if not _PARTITION.fullmatch(name):
                    raise ValueError(f"{name!r} is not a partition name")
            if twin in value:
                raise ValueError(f"{twin!r} is both a base partition and a spot twin")
        return value

    @field_validator("on_demand_partitions")
    @classmethod
    def _on_demand_names(cls, value: dict[str, str]) -> dict[str, str]:
        for name in (*value, *value.values()):
            if not _PARTITION.fullmatch(name):
                raise ValueError(f"{name!r} is not a partition name")
        return value

    @model_validator(mode="after")
    def _on_demand_twins(self) -> SlurmSettings:
        """Every base has an on-demand twin or none has: the layout (on-demand nodes in the base
        or in a partition of their own) is the cluster's, and the cloud nodes' weight is one."""
        on_demand, spot = self.on_demand_partitions, self.spot_partitions
        if not on_demand:
            return self
        strangers = sorted(set(on_demand) - set(spot))
        if strangers:
            raise ValueError(
                f"on_demand_partitions: {strangers[0]!r} is not a base partition of "
                f"spot_partitions ({', '.join(sorted(spot)) or 'none'})"
            )
        missing = sorted(set(spot) - set(on_demand))
        if missing:
            raise ValueError(
                f"on_demand_partitions: base partition {missing[0]!r} has no on-demand twin: "
                "name one for every base of spot_partitions, or none"
            )
        taken = {*spot, *spot.values()}
        for base, twin in on_demand.items():
            if twin in taken:
                raise ValueError(
                    f"on_demand_partitions: {base}: {twin!r} is already a base partition or a "
                    "spot twin"
                )
        return self

    @field_validator("join_gpu_types")
    @classmethod
    def _gres_types(cls, value: dict[str, str]) -> dict[str, str]:
        for pool, kind in value.items():
            if not _GRES_TYPE.match(kind):
                raise ValueError(
                    f"{pool}: {kind[:40]!r} is not a gres type name (letters, digits and _.-)"
                )
        return value

    @field_validator("join_environment")
    @classmethod
    def _join_environment(cls, value: dict[str, str]) -> dict[str, str]:
        for name, text in value.items():
            problem = environment_problem(name, text)
            if problem is not None:
                raise ValueError(problem)
        return value

    @model_validator(mode="after")
    def _join_settings_need_join(self) -> SlurmSettings:
        if not self.join_user_data and (self.join_gpu_types or self.join_environment):
            raise ValueError(
                "join_gpu_types and join_environment shape the boot script that join_user_data "
                "renders: set join_user_data: true, or remove them"
            )
        return self

    @field_validator("bin_dir", "slurm_conf")
    @classmethod
    def _absolute(cls, value: str | None) -> str | None:
        if value is not None and not Path(value).is_absolute():
            raise ValueError("must be an absolute path")
        return value


class _BusyError(SourceError):
    """``scontrol delete`` refused because the node still has jobs finishing."""


class SlurmAdapter:
    """Queue source (``read``), node source (``read_nodes``), workload scheduler, checkpointing
    scheduler (``running_jobs``, ``signal``, ``requeue``) and mover of jobs off on-prem nodes
    (``move_off``, ``bind``)."""

    Settings = SlurmSettings  # what its ``settings`` hold (``gpu-autoscaler schema``)

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
            team_field=None if settings.team_from == "none" else settings.team_from,
            team_names=TeamNames(f"slurm source {name!r}: squeue --json", settings.team_from),
            class_names=ClassNames(f"slurm source {name!r}: squeue --json", "qos"),
        )
        self.node_rules = NodeRules(
            settings.cloud_feature,
            dict(settings.gpu_models),
            dict(settings.feature_gpu_models),
            dict(settings.feature_gpu_memory_gib),
        )
        self._empty_since: dict[str, float] = {}
        # each node's shards and GPUs as the last ``sinfo`` said (None: not read yet)
        self._node_shards: dict[str, tuple[int, int]] | None = None
        # by moved job and node: a job moved off several nodes has a hold for each
        self._holds: dict[tuple[str, str], Hold] = {}
        # by the job room is being made for: its binding to the nodes freed for it (``bind``)
        self._bindings: dict[str, Binding] = {}
        # move_off and bind may run on the controller's worker threads while a tick reads them.
        self._holds_lock = threading.Lock()
        # held while a job's exclusions or node list are decided and written, so that a move
        # or bind and a tick never write one job's list from two different readings
        self._writing = threading.Lock()
        self._credential: float | None = None
        self._weight_partition: int | None = None
        self._order_checked: tuple[float, str | None] | None = None
        self._placement: Placement | None = None
        self._queue: tuple[float, frozenset[str], list[QueuedJob]] | None = None
        self._bases = frozenset(settings.spot_partitions)
        self._env = dict(os.environ)
        if settings.slurm_conf:
            self._env["SLURM_CONF"] = settings.slurm_conf

    @classmethod
    def from_config(cls, settings: Mapping[str, Any], name: str) -> SlurmAdapter:
        parsed = validate_settings(SlurmSettings, dict(settings), field=f"sources.{name}")
        return cls(parsed, name)

    def join_user_data(self, pool: Pool) -> str | None:
        """The boot script of an instance of ``pool``, when ``join_user_data`` asks for it: the
        join script with the pool's market, name, GPU model and gres type and the site's
        ``join_environment`` written in (``slurm_join.user_data``)."""
        settings = self.settings
        if not settings.join_user_data:
            return None
        return user_data(
            pool,
            settings.cloud_feature,
            gres_type(pool, settings.join_gpu_types, settings.gpu_models),
            settings.join_environment,
        )

    def know_pools(self, pools: Sequence[Pool]) -> None:
        """The config's pools (``KnowsPools``): those that join Slurm and share their GPUs by
        time-slicing have shards (the join script gives their nodes ``replicas`` per GPU), which
        pending ``gres/shard`` jobs are folded into; with none, a shard job is demand no pool
        can host (``slurm_shards``)."""
        hosts = shard_pools([p.gpu_sharing for p in pools if p.joins_scheduler])
        self.rules = replace(self.rules, shard_pools=hosts)

    def _call(self, *args: str) -> subprocess.CompletedProcess[bytes]:
        """Run a command; only a command that could not run (missing, not executable, no answer
        in time) raises here."""
        command = args[0]
        program = str(Path(self.settings.bin_dir) / command) if self.settings.bin_dir else command
        try:
            return subprocess.run(
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
            shown = " ".join(args[:3])
            raise SourceError(
                f"{shown}: no answer within {self.settings.command_timeout_s:g}s"
            ) from None

    def _run(self, *args: str) -> bytes:
        done = self._call(*args)
        shown = " ".join(args[:3])
        if done.returncode != 0:
            text = (
                done.stderr.decode(errors="replace").strip()
                or done.stdout.decode(errors="replace").strip()
            )
            last = text.splitlines()[-1] if text else "no message"
            failure = _BusyError if "busy" in text.lower() else SourceError
            raise failure(f"{shown}: exit status {done.returncode}: {last}")
        return done.stdout

    def fold_priority_classes(self) -> None:
        """Fold demand per QOS from now on (``FoldsPriorityClasses``)."""
        self.rules = replace(self.rules, fold_classes=True)

    def read(self, now: float) -> Sequence[DemandGroup]:
        """Pending demand. Partition limits are read (one more command) only in a tick where some
        job waits for ``PartitionNodeLimit``: a multi-node job needing more nodes than its
        partition has today waits for that reason, and is demand when the partition's limits
        let it grow (cloud nodes joining) to hold the job."""
        text = self._run("squeue", "--json")
        rules = self.rules
        if NODE_LIMIT_REASON not in rules.ignored_reasons and _QUOTED_NODE_LIMIT in text:
            rules = replace(rules, partition_nodes=self._partition_nodes())
        if not (self.settings.spot_partitions or self._holds or self._bindings):
            return demand_groups(text, rules)
        jobs = load_jobs(text)
        groups = fold(iter_pending(jobs, rules), rules.shard_pools)
        ids = self._hold_ids()
        facts = queue_facts(jobs, self.rules, self._bases, ids)
        self._queue = (time.monotonic(), ids, facts)
        return groups

    def _partition_nodes(self) -> dict[str, tuple[int, int | None]]:
        """Each partition's MinNodes and MaxNodes (None: UNLIMITED) from ``scontrol show
        partition --oneliner``."""
        limits: dict[str, tuple[int, int | None]] = {}
        for name, fields in self._partitions_shown().items():
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

    def _partitions_shown(self) -> dict[str, dict[str, str]]:
        """Each partition's fields as ``scontrol show partition --oneliner`` gives them."""
        text = self._run("scontrol", "show", "partition", "--oneliner").decode(errors="replace")
        shown: dict[str, dict[str, str]] = {}
        for line in text.splitlines():
            fields = dict(token.partition("=")[::2] for token in line.split())
            name = fields.get("PartitionName")
            if name:
                shown[name] = fields
        return shown

    def read_nodes(self, now: float) -> NodeReading:
        """On-prem nodes and what runs on cloud nodes. A cloud node with shards (a pool that
        shares its GPUs) also says the GPUs' worth its jobs hold (``gpus_held``): the shards
        held are read from the running jobs (one ``squeue``, only while some such node has a
        shard in use), since Slurm 22.05's ``GresUsed`` says only how many GPUs carry one."""
        nodes = self._sinfo()
        cloud: dict[str, NodeUsage] = {}
        empty_since: dict[str, float] = {}
        sharing = frozenset(n.name for n in nodes if n.cloud and n.shard_gpus)
        shards_held = shards_by_node(self._run("squeue", "--json"), sharing) if sharing else {}
        for node in nodes:
            if not node.cloud:
                continue
            since = None
            if node.gpus_allocated == 0:
                since = empty_since[node.name] = self._empty_since.get(node.name, now)
            cloud[node.name] = NodeUsage(
                gpus_allocated=node.gpus_allocated,
                empty_since=since,
                gpus_held=held(
                    node.gpus_allocated - node.shard_gpus,
                    shards_held.get(node.name, 0),
                    node.shards,
                    node.gpus,
                )
                if node.shards
                else None,
            )
        self._empty_since = empty_since
        return NodeReading(onprem=onprem_nodes(nodes), cloud=cloud)

    def _sinfo(self) -> list[NodeGpus]:
        nodes = read_nodes(self._run("sinfo", "--json"), self.node_rules, self.rules.partitions)
        self._node_shards = {n.name: (n.shards, n.gpus) for n in nodes if n.shards}
        return nodes

    def running_jobs_by_node(self) -> dict[str, list[RunningJob]]:
        """Every node's running jobs from one ``squeue``: what the controller reads when several
        nodes are interrupted in the same tick. A shard job's share of a GPU is its shards over
        its node's shards per GPU, as the last ``sinfo`` gave them (read now when none has and
        some job holds shards)."""
        text = self._run("squeue", "--json")
        if self._node_shards is None and b"shard" in text:
            self._sinfo()
        return read_running_jobs(text, self.rules, self._node_shards)

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
        """Requeue the job and shorten the two-minute hold (its begin time) Slurm puts on a
        requeued job to two seconds once it is pending again, so it can restart on the
        replacement capacity as soon as there is room, and counts as demand meanwhile; the two
        seconds keep it from starting again on the node it left within the second its last run
        ended there, which slurmd would refuse for good."""
        job = _check_job(job_id)
        self._run("scontrol", "requeue", job)
        state, partitions = self._settled(job)
        if state != "PENDING":
            return
        try:
            self._run("scontrol", "update", f"jobid={job}", RELEASED, *self._reorder(partitions))
        except SourceError as exc:
            log.warning("job %s requeued, but it keeps Slurm's hold: %s", job, exc)

    def _settled(self, job: str) -> tuple[str, str]:
        """The state and partitions of a job just requeued, once it has stopped completing (or
        the wait is over)."""
        give_up = time.monotonic() + REQUEUE_RELEASE_S
        state, partitions = "COMPLETING", ""
        while time.monotonic() < give_up:
            line = self._run("squeue", "-h", "-j", job, "-o", "%T|%P").decode(errors="replace")
            state, _, partitions = line.strip().partition("|")
            if state != "COMPLETING":
                break
            time.sleep(0.1)
        return state, partitions

    def _reorder(self, partitions: str) -> tuple[str, ...]:
        """The assignment that puts a requeued job's partitions back in the placement's order
        (Slurm moved the one it ran in to the front), in the same update that releases it, so
        it cannot start anywhere before; none when the order is right or not the controller's."""
        placement = self._placement
        if placement is None or not self.settings.on_demand_partitions:
            return ()
        order = requeued_order(
            tuple(partitions.split(",")),
            placement,
            self.settings.spot_partitions,
            self.settings.on_demand_partitions,
        )
        return (f"partition={','.join(order)}",) if order else ()

    def move_off(self, job_id: str, node: str, for_job: str) -> None:
        """Requeue a job running on ``node`` and keep it off that node (its ``ExcNodeList``, with
        its own exclusions kept) until ``for_job`` has started there, has started elsewhere or
        has left the queue, or ``move_hold_s`` has passed, and in any case until Slurm's job
        credential lifetime (``cred_expire``) has passed since the requeue: a job that starts
        again sooner on the node it left is killed there for good. ``apply_placement`` lifts
        the hold. A job moved off several nodes in turn has a hold for each, and stays off every
        node whose hold stands (``slurm_placement.exclusions``).

        The exclusion is set in the same ``scontrol update`` that lifts the begin-time hold
        Slurm puts on a requeued job, so the job cannot start anywhere before it is in place; a
        job still completing after the wait gets both on the next tick, still inside that hold.
        A job that is not running on ``node``, or that may run only there (``--nodelist``), is
        not requeued: it would wait for nothing."""
        job, target = _check_job(job_id), _check_job(for_job)
        _check_node(node)
        what = f"move job {job} off {node}"
        line = self._run("squeue", "-h", "-j", job, "-o", "%T|%N|%x|%n").decode(errors="replace")
        fields = line.strip().split("|")
        if len(fields) != 4:
            raise SourceError(f"{what}: it is not in the queue")
        state, nodes, excluded, required = fields
        if state not in ACTIVE_STATES:
            raise SourceError(f"{what}: it is {state[:40]}, not running")
        if node not in self._hostnames(nodes):
            raise SourceError(f"{what}: it runs on {nodes[:80] or 'no node'}")
        if required and node in self._hostnames(required):
            raise SourceError(f"{what}: it asked for that node (--nodelist {required[:80]})")
        credential_s = self._credential_s()
        own = self._own_exclusions(job, excluded)
        self._run("scontrol", "requeue", job)
        requeued = time.monotonic()
        hold = Hold(
            job_id=job,
            node=node,
            for_job=target,
            since=time.time(),
            not_before=requeued + credential_s + CREDENTIAL_MARGIN_S,
            until=requeued + max(self.settings.move_hold_s, credential_s + CREDENTIAL_MARGIN_S),
            excluded=own,
        )
        with self._holds_lock:
            self._holds[(job, node)] = hold
        state, partitions = self._settled(job)
        if state == "PENDING":
            failure = self._write_exclusions(job, self._reorder(partitions))
            if failure:
                log.warning(
                    "job %s requeued off %s; its exclusion is retried: %s", job, node, failure
                )

    def _own_exclusions(self, job: str, shown: str) -> str:
        """The job's own ``ExcNodeList``: as its holds keep it when it has some (what Slurm
        shows then has their nodes in it), else as Slurm shows it."""
        with self._holds_lock:
            kept = [h.excluded for (moved, _), h in self._holds.items() if moved == job]
        return kept[0] if kept else shown

    def bind(self, for_job: str, nodes: Sequence[str]) -> None:
        """Bind the pending ``for_job`` to ``nodes`` (its ``ReqNodeList``, all of them in one
        ``scontrol update``; ``slurm_placement.Binding``) until it has started, has left the
        queue, or ``move_hold_s`` has passed since; ``apply_placement`` gives its own (empty)
        list back then. Binding again to the same nodes runs no command and keeps the bound;
        other nodes replace the binding and start its bound afresh. A job that is not pending,
        that asked for nodes itself (``--nodelist``), that asks fewer nodes than ``nodes``
        (Slurm would keep it waiting for nodes it never takes), or that a standing hold keeps off
        one of ``nodes`` (its ``ExcNodeList`` names it) is refused, unchanged."""
        job = _check_job(for_job)
        wanted = tuple(dict.fromkeys(nodes))
        for node in wanted:
            _check_node(node)
        if not wanted:
            raise SourceError(f"bind job {job}: no nodes to bind it to")
        with self._writing:
            self._bind(job, wanted)

    def _bind(self, job: str, wanted: tuple[str, ...]) -> None:
        """``bind``'s decision and write, under ``_writing``."""
        with self._holds_lock:
            current = self._bindings.get(job)
        if current is not None and not current.over and set(current.nodes) == set(wanted):
            return
        what = f"bind job {job} to {','.join(wanted)[:80]}"
        kept_off = sorted(
            {h.node for h in self._holds_now() if h.job_id == job and not h.over} & set(wanted)
        )
        if kept_off:
            # its ExcNodeList names them: bound there too, it could start nowhere
            raise SourceError(f"{what}: it is held off {','.join(kept_off)[:80]}")
        line = self._run("squeue", "-h", "-j", job, "-o", "%T|%n|%D").decode(errors="replace")
        fields = line.strip().split("|")
        if len(fields) != 3:
            raise SourceError(f"{what}: it is not in the queue")
        state, required, count = fields
        if state != "PENDING":
            raise SourceError(f"{what}: it is {state[:40]}, not pending")
        ours = current is not None and set(self._hostnames(required)) == set(current.nodes)
        if required and not ours:
            raise SourceError(f"{what}: it asked for nodes of its own (--nodelist {required[:80]})")
        if count.isdigit() and len(wanted) > int(count):
            raise SourceError(f"{what}: it asks {count} node(s), not {len(wanted)}")
        self._run("scontrol", "update", f"jobid={job}", f"reqnodelist={','.join(wanted)}")
        now = time.monotonic()
        binding = Binding(job, wanted, now, now + self.settings.move_hold_s, applied=True)
        with self._holds_lock:
            self._bindings[job] = binding
        log.info("job %s bound to %s", job, binding.node_list)

    def bound_to(self, job_id: str) -> tuple[str, ...] | None:
        """The nodes ``job_id`` is bound to while its binding stands, else None."""
        with self._holds_lock:
            binding = self._bindings.get(job_id)
        return binding.nodes if binding is not None and not binding.over else None

    def _apply_binding(self, binding: Binding) -> None:
        with self._writing:
            if not self._is_current(binding):
                return
            failure = self._update_jobs((binding.for_job,), f"reqnodelist={binding.node_list}")
        if failure:
            log.warning(
                "job %s not bound to %s; retried next tick: %s",
                binding.for_job,
                binding.node_list,
                failure,
            )
            return
        binding.applied = True

    def _unbind(self, binding: Binding, why: str) -> str | None:
        """Give the job its own (empty) ``ReqNodeList`` back, unless a bind replaced the
        binding since the tick read it."""
        with self._writing:
            if not self._is_current(binding):
                return None
            failure = self._update_jobs((binding.for_job,), "reqnodelist=")
        if failure is None:
            self._forget_binding(binding)
            log.info("job %s no longer bound to %s: %s", binding.for_job, binding.node_list, why)
        return failure

    def _is_current(self, binding: Binding) -> bool:
        with self._holds_lock:
            return self._bindings.get(binding.for_job) is binding

    def _forget_binding(self, binding: Binding) -> None:
        with self._holds_lock:
            if self._bindings.get(binding.for_job) is binding:
                del self._bindings[binding.for_job]

    def _credential_s(self) -> float:
        """Slurm's job credential lifetime (``AuthInfo`` ``cred_expire``, 120 s unless set),
        read once: how long a requeued job must stay off the node it left."""
        if self._credential is None:
            text = self._run("scontrol", "show", "config").decode(errors="replace")
            found = _CRED_EXPIRE.search(text)
            self._credential = float(found.group(1)) if found else DEFAULT_CRED_EXPIRE_S
        return self._credential

    def held_off(self) -> list[HeldOff]:
        return [
            HeldOff(h.job_id, h.node, h.for_job, h.since) for h in self._holds_now() if not h.over
        ]

    def _holds_now(self) -> list[Hold]:
        with self._holds_lock:
            return list(self._holds.values())

    def _forget_hold(self, hold: Hold) -> None:
        with self._holds_lock:
            if self._holds.get((hold.job_id, hold.node)) is hold:
                del self._holds[(hold.job_id, hold.node)]

    def _write_exclusions(
        self, job: str, reorder: tuple[str, ...] = (), whys: Mapping[str, str] | None = None
    ) -> str | None:
        """Write the ``ExcNodeList`` the job's holds want (``exclusions``: its own list and the
        nodes of the holds that stand), lifting Slurm's begin-time hold too while one of them is
        not in place yet; then the holds that were over are gone (``whys`` by node says why)
        and the others are in place. None when done, else the failure."""
        with self._writing:
            return self._write_held(job, reorder, whys or {})

    def _write_held(
        self, job: str, reorder: tuple[str, ...], whys: Mapping[str, str]
    ) -> str | None:
        """``_write_exclusions``' reading and write, under ``_writing``."""
        with self._holds_lock:
            holds = [h for (moved, _), h in self._holds.items() if moved == job]
        if not holds:
            return None
        assignments = [f"excnodelist={exclusions(holds)}"]
        if not all(h.applied for h in holds):
            assignments.append(RELEASED)
        failure = self._update_jobs((job,), *assignments, *reorder)
        if failure:
            return failure
        for hold in holds:
            if hold.over:
                self._forget_hold(hold)
                why = whys.get(hold.node, "its work was done")
                log.info("hold of job %s off %s lifted: %s", job, hold.node, why)
            else:
                hold.applied = True
        return None

    def _hostnames(self, expression: str) -> list[str]:
        """Node names of a Slurm host list (``gpu-[01-03],gpu-x``); expanded by ``scontrol``
        only when it has a range."""
        if not expression:
            return []
        if "[" not in expression:
            return expression.split(",")
        text = self._run("scontrol", "show", "hostnames", expression).decode(errors="replace")
        return text.split()

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
        """Put the policy's placement into Slurm's own terms, changing only what differs.

        * Node weights (lower is used first): cloud nodes last while spot-safe work should use
          on-prem first, first otherwise; with ``on_demand_partitions`` always last (the order
          of judged jobs is their partitions', and a partition that mixes on-prem and cloud
          nodes serves on-prem first, as work kept off spot wants).
        * With ``spot_partitions``, the spot twins of pending GPU jobs' partitions: in for jobs
          the placement lets run on spot, out for jobs that must stay off it; with
          ``on_demand_partitions`` also the on-demand twins, and every judged job's partitions
          in the placement's tier order (``autoscaler.sources.slurm_placement``), after a check
          that Slurm will try them in that order (``_order_problem``).
        * Holds of jobs moved off a node (``move_off``) that have done their work are lifted,
          and bindings (``bind``) whose job started, left or waited past the bound end.

        Each part is done even when another failed; the first failure is raised after."""
        self._placement = placement
        failures: list[str] = []
        try:
            self._apply_weights(placement)
        except SourceError as exc:
            failures.append(str(exc))
        if self.settings.on_demand_partitions:
            try:
                problem = self._order_problem()
            except SourceError as exc:
                problem = str(exc)
            if problem:
                failures.append(problem)
        if self.settings.spot_partitions or self._holds or self._bindings:
            try:
                failures += self._apply_queue(placement)
            except SourceError as exc:
                failures.append(str(exc))
        if failures:
            more = f" (and {len(failures) - 1} more)" if len(failures) > 1 else ""
            raise SourceError(f"{failures[0]}{more}")

    def _apply_weights(self, placement: Placement) -> None:
        wanted = (
            self.settings.cloud_weight_last
            if placement.spot_safe_onprem is OnPremUse.FIRST or self.settings.on_demand_partitions
            else self.settings.cloud_weight_first
        )
        weights = cloud_node_weights(self._run("sinfo", "--json"), self.settings.cloud_feature)
        stale = sorted(name for name, weight in weights.items() if weight != wanted)
        if stale:
            self._run("scontrol", "update", f"nodename={','.join(stale)}", f"weight={wanted}")

    def _order_problem(self) -> str | None:
        """Why Slurm would not try judged jobs' partitions in the order written, or None: a
        managed partition it does not have, or managed partitions that differ in PriorityTier
        (tried first, whatever the list's order) or, while ``PriorityWeightPartition`` is set,
        in PriorityJobFactor (a job's priority in each partition, tried before the order).
        Read at most every ``ORDER_CHECK_S`` seconds; the answer stands in between."""
        now = time.monotonic()
        if self._order_checked is not None and now - self._order_checked[0] < ORDER_CHECK_S:
            return self._order_checked[1]
        settings = self.settings
        managed = sorted(
            {
                *settings.spot_partitions,
                *settings.spot_partitions.values(),
                *settings.on_demand_partitions.values(),
            }
        )
        shown = self._partitions_shown()
        problem = None
        missing = [name for name in managed if name not in shown]
        if missing:
            problem = (
                f"placement: Slurm has no partition {', '.join(missing)} (spot_partitions, "
                "on_demand_partitions): jobs cannot be put there"
            )
        else:
            keys = ["PriorityTier"]
            if self._partition_weight() > 0:
                keys.append("PriorityJobFactor")
            for key in keys:
                values = {name: shown[name].get(key, "") for name in managed}
                if len(set(values.values())) > 1:
                    listed = ", ".join(f"{n} {v}" for n, v in values.items())
                    problem = (
                        f"placement: the partitions differ in {key} ({listed}): Slurm tries a "
                        f"job's partitions by {key} before the order the controller writes; "
                        f"give them one {key} (docs/slurm.md)"
                    )
                    break
        self._order_checked = (now, problem)
        return problem

    def _partition_weight(self) -> int:
        """Slurm's ``PriorityWeightPartition`` (0 unless set), read once."""
        if self._weight_partition is None:
            text = self._run("scontrol", "show", "config").decode(errors="replace")
            found = _WEIGHT_PARTITION.search(text)
            self._weight_partition = int(found.group(1)) if found else 0
        return self._weight_partition

    def _apply_queue(self, placement: Placement) -> list[str]:
        """Spot twins and holds from one ``squeue``; at most one ``scontrol`` per changed job,
        and one per group of jobs given the same partitions."""
        queue = self._fresh_queue()
        failures: list[str] = []
        index = QueueIndex.of(queue)
        now = time.monotonic()
        steps = hold_steps(self._holds_now(), index, now)
        failures += self._apply_holds(steps)
        with self._holds_lock:
            bindings = list(self._bindings.values())
        for bound in binding_steps(bindings, index, now):
            if bound.step is Step.DROP:
                self._forget_binding(bound.binding)
            elif bound.step is Step.APPLY:
                self._apply_binding(bound.binding)
            elif bound.step is Step.RESTORE:
                failure = self._unbind(bound.binding, bound.why)
                if failure:
                    failures.append(failure)
        if not self.settings.spot_partitions:
            return failures
        touched = frozenset(
            step.hold.job_id for step in steps if step.step in (Step.APPLY, Step.RESTORE)
        )
        plan = partition_plan(
            queue,
            placement,
            self.settings.spot_partitions,
            self.settings.placement_jobs_per_tick,
            skip=touched,
            on_demand=self.settings.on_demand_partitions,
        )
        if plan.deferred:
            log.info(
                "placement: %d job(s) change partitions this tick, %d next tick",
                plan.jobs,
                plan.deferred,
            )
        for update in plan.updates:
            for start in range(0, len(update.job_ids), JOB_BATCH):
                batch = update.job_ids[start : start + JOB_BATCH]
                failure = self._update_jobs(batch, f"partition={update.partitions}")
                if failure:
                    failures.append(failure)
        return failures

    def _apply_holds(self, steps: Sequence[HoldStep]) -> list[str]:
        """Carry out this tick's hold steps: one ``scontrol update`` per moved job whose holds
        changed (one applied, one over), with every hold of that job in it. A failed restore is
        a failure of the tick; a failed exclusion is retried next tick."""
        failures: list[str] = []
        changed: dict[str, list[HoldStep]] = {}
        for step in steps:
            if step.step is Step.DROP:
                self._forget_hold(step.hold)
                log.info(
                    "hold of job %s off %s ends: %s", step.hold.job_id, step.hold.node, step.why
                )
            elif step.step in (Step.APPLY, Step.RESTORE):
                changed.setdefault(step.hold.job_id, []).append(step)
        for job, mine in changed.items():
            whys = {s.hold.node: s.why for s in mine if s.step is Step.RESTORE}
            failure = self._write_exclusions(job, whys=whys)
            if failure and whys:
                failures.append(failure)
            elif failure:
                log.warning("job %s: its exclusion is retried next tick: %s", job, failure)
        return failures

    def _fresh_queue(self) -> list[QueuedJob]:
        """The queue as this tick's ``read`` found it (one ``squeue`` serves demand and
        placement), or read now when no recent read left it. Jobs submitted since wait for the
        next tick, which only delays their use of spot; jobs started since refuse the update
        harmlessly."""
        kept, self._queue = self._queue, None
        ids = self._hold_ids()
        if kept is not None and time.monotonic() - kept[0] <= QUEUE_REUSE_S and ids <= kept[1]:
            return kept[2]
        return read_queue(self._run("squeue", "--json"), self.rules, self._bases, ids)

    def _hold_ids(self) -> frozenset[str]:
        """The jobs the holds need to see: each moved job and the job it made room for."""
        with self._holds_lock:
            bound = set(self._bindings)
        return frozenset(i for h in self._holds_now() for i in (h.job_id, h.for_job)) | bound

    def _update_jobs(self, job_ids: Sequence[str], *assignments: str) -> str | None:
        """``scontrol update jobid=<ids> ...``; None when every job was updated or has started
        or ended since the queue was read (the next tick sees it as it is), else the first
        failure."""
        done = self._call("scontrol", "update", f"jobid={','.join(job_ids)}", *assignments)
        if done.returncode == 0:
            return None
        said = (done.stderr or done.stdout).decode(errors="replace").splitlines()
        real = [
            line
            for line in said
            if not any(g in line.lower() for g in _GONE_BY_NOW)
            and not line.lower().rstrip().endswith(_UPDATED)
        ]
        if said and not real:
            return None
        first = one_line(real[0]) if real else "no message"
        return (
            f"scontrol update jobid={job_ids[0]}{',...' if len(job_ids) > 1 else ''} "
            f"{' '.join(assignments)[:120]}: exit status {done.returncode}: {first}"
        )


def _check_node(node: str) -> None:
    if not _NODE_NAME.fullmatch(node):
        raise SourceError(f"scontrol: {node!r} is not a node name")


def _check_job(job_id: str) -> str:
    if not re.fullmatch(r"\d+(_\d+)?", job_id):
        raise SourceError(f"scontrol: {job_id!r} is not a job id")
    return job_id
