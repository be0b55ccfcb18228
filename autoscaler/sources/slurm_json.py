"""Reading ``squeue --json`` and ``sinfo --json`` (Slurm 22.05, OpenAPI v0.0.38) into demand and
nodes.

A busy cluster's queue is 100,000 jobs and a quarter of a gigabyte of JSON every tick, so jobs are
read with targeted dictionary access and folded straight into counts; pydantic is kept for the
settings and the few values handed on. The strings that describe a job's shape (``tres_per_node``,
the comment, the array range) repeat across thousands of jobs, so each distinct one is parsed once
per document.

One job whose fields we cannot read fails the whole read rather than being skipped: Slurm validated
every job at submission, so a value we cannot read means our reading of the format is wrong (a new
Slurm release, a plugin's gres syntax) or the output was corrupted on its way to us, and skipping it
would silently undercount demand, which the controller would act on as if it were true. A failed
read leaves demand unknown for the tick, which holds scale-down and is reported with the job and
field named. What "cannot read" covers: a value of the wrong type, an integer outside 64 bits, a
time before 1970 or after 9999, an array range that runs backwards, has a step of 0, an index
beyond Slurm's largest array (4,000,000), ranges out of order or overlapping, non-ASCII digits, a
job id listed twice, and a document nested deeper than the decoder's limit. A job's ``--comment``
is different: it is the user's free text, so a checkpoint hint we cannot read makes that job
non-checkpointable (it stays off spot) instead of failing everyone's demand. So is a request no
capacity could be planned for (a typo of a million nodes): that job is left out and named in a
warning, and the others count.

The same document also says which jobs run where (``read_running_jobs``): what an interruption
notice for a node puts at risk, read once per tick however many nodes are leaving.
"""

from __future__ import annotations

import logging
import math
import re
import signal
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, NamedTuple

import msgspec

from autoscaler.model import DemandGroup, Job, OnPremNode
from autoscaler.model.errors import SourceError
from autoscaler.model.sharing import GpuSharing, SharingMode, folded_gpus
from autoscaler.sources.class_names import ClassNames
from autoscaler.sources.slurm_features import (
    FeatureSyntaxError,
    GpuNeeds,
    gpu_needs,
    node_gpu_facts,
)
from autoscaler.sources.slurm_shards import (
    ShardSyntaxError,
    mig_demand,
    mig_entries,
    mig_share,
    mig_type,
    parse_shards,
    shard_demand,
)
from autoscaler.sources.team_names import TeamNames
from autoscaler.spi.job_shape import MAX_GPUS_PER_NODE, MAX_JOB_NODES
from autoscaler.spi.sources import GroupKey, OldestJobs, RunningJob, groups_from_counts

log = logging.getLogger(__name__)

PENDING = "PENDING"
NODE_LIMIT_REASON = "PartitionNodeLimit"
_UNSET_COUNTS = frozenset({0, 0xFFFFFFFE, 0xFFFFFFFF})
SHOWN_SKIPPED = 3
ACTIVE_STATES = frozenset({"RUNNING", "COMPLETING", "SUSPENDED", "CONFIGURING", "STOPPED"})
UNSCHEDULABLE_STATES = frozenset({"down", "error", "future", "unknown", "drained"})
UNSCHEDULABLE_FLAGS = frozenset(
    {
        "DRAIN",
        "DRAINING",
        "DRAINED",
        "FAIL",
        "FAILING",
        "NOT_RESPONDING",
        "MAINTENANCE",
        "POWERING_DOWN",
        "REBOOT_ISSUED",
        "REBOOT_REQUESTED",
    }
)
_COMMENT_SEPARATORS = re.compile(r"[\s,;]+")
DEFAULT_CHECKPOINT_SIGNAL = "USR1"
_CHECKPOINT_SIGNALS = frozenset(
    s.name.removeprefix("SIG") for s in signal.Signals if s not in (signal.SIGKILL, signal.SIGSTOP)
)
# Slurm's integers are 32 or 64 bits (its unset values are the top of the unsigned range); any
# other integer is not Slurm's.
INT_MIN, INT_MAX = -(2**63), 2**64 - 1
# A Slurm time (epoch seconds) before 1970 or after 9999 is not a time.
MAX_TIME = 253_402_300_799
# Slurm's MaxArraySize is at most 4,000,001: no array index is larger than 4,000,000.
MAX_ARRAY_INDEX = 4_000_000
# A checkpoint interval or duration longer than this is not one a job means.
MAX_CHECKPOINT_S = 30 * 86_400.0
_ARRAY_RANGE = re.compile(r"([0-9]{1,7})(?:-([0-9]{1,7})(?::([0-9]{1,7}))?)?")
_ARRAY_THROTTLE = re.compile(r"[0-9]{1,7}")
_GPU_COUNT = re.compile(r"[0-9]{1,20}")
_GRES_TYPE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]{0,127}")
SHOWN_CHARS = 80
NODE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,254}")


class BadFieldError(Exception):
    """A field of one job or node we cannot read; the caller adds the document and the id."""


@dataclass(frozen=True)
class DemandRules:
    """Which pending jobs are demand, and how a job says it checkpoints, is urgent, and what
    GPUs it needs.

    ``gpu_models`` renames a gres type (``a100``) to the pools' model name; ``feature_gpu_models``
    and ``feature_gpu_memory_gib`` say which node features (``--constraint``) name a GPU model or
    a minimum of GPU memory; other features are not read. ``partition_nodes`` holds each
    partition's (MinNodes, MaxNodes or None for unlimited), read only when a job waits for
    ``PartitionNodeLimit``: such a job is demand when its node count is within those limits
    (the partition is only short of nodes, which cloud nodes joining it fix), and not demand
    otherwise or while the limits are unknown. ``team_field`` is the job field that names its
    team (``account`` by default; None: no team), read through ``team_names``. A job's priority
    class is its QOS, read through ``class_names`` (``teams.priority_classes``): running jobs
    always name it, pending demand folds per class only with ``fold_classes``
    (``FoldsPriorityClasses``), so that without classes demand is folded as before.
    ``shard_pools`` are the pools that join Slurm and share their GPUs (``slurm_shards``): the
    time-slicing ones have shards, and pending ``gres/shard`` jobs are folded into whole GPUs of
    them; the MIG ones have MIG instances as gres types, and a pending job asking instances of a
    profile (``--gres=gpu:1g.10gb:1``) is folded into whole GPUs of those that list it. A slice
    job no pool can host is demand that cannot be met (None: the pools are not known, and each
    shard job counts a GPU, each MIG instance a GPU).
    """

    partitions: frozenset[str] | None = None
    ignored_reasons: frozenset[str] = frozenset()
    ignored_reason_prefixes: tuple[str, ...] = ()
    high_priority_min: int | None = None
    high_priority_qos: frozenset[str] = frozenset()
    gpu_models: Mapping[str, str] = field(default_factory=dict)
    checkpoint_keys: tuple[str, str] = ("checkpoint_interval", "checkpoint_duration")
    checkpoint_signal_key: str = "checkpoint_signal"
    feature_gpu_models: Mapping[str, str] = field(default_factory=dict)
    feature_gpu_memory_gib: Mapping[str, float] = field(default_factory=dict)
    partition_nodes: Mapping[str, tuple[int, int | None]] | None = None
    team_field: str | None = "account"
    team_names: TeamNames = field(
        default_factory=lambda: TeamNames("squeue --json", "account"), compare=False
    )
    class_names: ClassNames = field(
        default_factory=lambda: ClassNames("squeue --json", "qos"), compare=False
    )
    fold_classes: bool = False
    shard_pools: tuple[GpuSharing, ...] | None = None


@dataclass(frozen=True)
class Checkpointing:
    """What a job's comment declares; ``signal`` is what its batch script traps to checkpoint
    now (None: it cannot be asked)."""

    interval_s: float | None
    duration_s: float | None
    signal: str | None = None


@dataclass(frozen=True)
class NodeGpus:
    """One node as ``sinfo`` reports it, reduced to what the controller plans with."""

    name: str
    gpus: int
    gpus_allocated: int
    gpu_model: str | None
    schedulable: bool
    cloud: bool
    gpu_memory_gib: float | None = None
    # Slurm's GPU sharing (``slurm_shards``): the node's shards, and how many of its GPUs carry
    # a shard in use (counted in ``gpus_allocated``: no whole-GPU job can have them).
    shards: int = 0
    shard_gpus: int = 0


def shown(value: Any) -> str:
    """A value as one short line for an error message: a field may hold a megabyte of text, a
    4,000-digit number or a structure nested a thousand deep, none of which may reach a log."""
    if isinstance(value, bool) or value is None:
        return repr(value)
    if isinstance(value, int):
        return repr(value) if INT_MIN <= value <= INT_MAX else "an integer beyond 64 bits"
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, str):
        text = repr(value[: SHOWN_CHARS + 1])
        return text if len(value) <= SHOWN_CHARS else text[:-1] + "..." + text[-1]
    if isinstance(value, dict):
        return "a JSON object"
    if isinstance(value, list):
        return "a JSON list"
    return f"a {type(value).__name__}"


def one_line(text: str, most: int = 2 * SHOWN_CHARS) -> str:
    """Text from outside (an error Slurm printed) as one bounded line."""
    flat = " ".join(text[: most * 4].split())
    return flat if len(flat) <= most else flat[: most - 3] + "..."


def decode_failure(command: str, exc: Exception) -> SourceError:
    """One line for a document the decoder refused: malformed, nested too deep, or a number no
    JSON reader can hold."""
    if isinstance(exc, RecursionError):
        return SourceError(f"{command}: output is nested deeper than the decoder's limit")
    if isinstance(exc, UnicodeError):
        return SourceError(f"{command}: output is not UTF-8 text")
    detail = one_line(str(exc))
    return SourceError(f"{command}: output is not JSON ({detail})")


def load_document(text: str | bytes, command: str, key: str) -> list[Any]:
    """The list under ``key`` of a Slurm JSON document, or one ``SourceError`` line."""
    try:
        document = msgspec.json.decode(text)
    except (msgspec.DecodeError, RecursionError, UnicodeError) as exc:
        raise decode_failure(command, exc) from None
    if not isinstance(document, dict):
        raise SourceError(f"{command}: output is a JSON {_json_kind(document)}, not an object")
    errors = document.get("errors")
    if errors:
        first = errors[0] if isinstance(errors, list) else errors
        detail = first.get("error", first) if isinstance(first, dict) else first
        said = one_line(detail) if isinstance(detail, str) else shown(detail)
        raise SourceError(f"{command}: Slurm reported an error: {said}")
    items = document.get(key)
    if not isinstance(items, list):
        raise SourceError(f"{command}: output has no '{key}' list")
    return items


def _json_kind(value: Any) -> str:
    kinds = {dict: "object", list: "list", str: "str", bool: "bool", int: "int", float: "float"}
    return "null" if value is None else kinds.get(type(value), type(value).__name__)


class _JobFields(msgspec.Struct):
    """A job decoded into only the fields one reader needs: the other hundred or so fields of
    each job are skipped by the decoder without becoming Python objects, which is what makes a
    250 MB document readable within a tick. Types stay open (``Any``) because Slurm releases
    change them (an integer becomes ``{"number": ..., "set": ...}``); the field readers check
    them."""

    def get(self, name: str, default: Any = None) -> Any:
        """``dict.get``'s meaning: ``default`` only when the field is absent, not when null."""
        value = getattr(self, name, msgspec.UNSET)
        return default if value is msgspec.UNSET else value


class SqueueJob(_JobFields):
    """What demand (and what ``drain`` counts) is read from."""

    job_id: Any = msgspec.UNSET
    job_state: Any = msgspec.UNSET
    state_reason: Any = msgspec.UNSET
    partition: Any = msgspec.UNSET
    tres_per_job: Any = msgspec.UNSET
    tres_per_node: Any = msgspec.UNSET
    node_count: Any = msgspec.UNSET
    tres_per_task: Any = msgspec.UNSET
    tasks: Any = msgspec.UNSET
    features: Any = msgspec.UNSET
    comment: Any = msgspec.UNSET
    priority: Any = msgspec.UNSET
    qos: Any = msgspec.UNSET
    array_task_string: Any = msgspec.UNSET
    array_max_tasks: Any = msgspec.UNSET
    submit_time: Any = msgspec.UNSET
    job_resources: Any = msgspec.UNSET
    nodes: Any = msgspec.UNSET
    array_job_id: Any = msgspec.UNSET
    array_task_id: Any = msgspec.UNSET
    account: Any = msgspec.UNSET  # the fields a team may be read from (team_from)
    wckey: Any = msgspec.UNSET


class SqueueRunningJob(_JobFields):
    """What running jobs are read from; a struct of its own so that demand, read every tick,
    does not pay for the allocation fields (a list and a string per job)."""

    job_id: Any = msgspec.UNSET
    job_state: Any = msgspec.UNSET
    job_resources: Any = msgspec.UNSET
    nodes: Any = msgspec.UNSET
    node_count: Any = msgspec.UNSET
    start_time: Any = msgspec.UNSET
    submit_time: Any = msgspec.UNSET
    gres_detail: Any = msgspec.UNSET
    tres_alloc_str: Any = msgspec.UNSET
    tres_per_job: Any = msgspec.UNSET
    tres_per_node: Any = msgspec.UNSET
    tres_per_task: Any = msgspec.UNSET
    tasks: Any = msgspec.UNSET
    comment: Any = msgspec.UNSET
    priority: Any = msgspec.UNSET
    qos: Any = msgspec.UNSET
    features: Any = msgspec.UNSET
    partition: Any = msgspec.UNSET


class SqueuePlacementJob(_JobFields):
    """What placement reads of every job: where it may run (partitions), whether it may run on
    spot (its comment, priority and QOS), whether it asks for GPUs, and where it runs."""

    job_id: Any = msgspec.UNSET
    job_state: Any = msgspec.UNSET
    partition: Any = msgspec.UNSET
    tres_per_job: Any = msgspec.UNSET
    tres_per_node: Any = msgspec.UNSET
    tres_per_task: Any = msgspec.UNSET
    tasks: Any = msgspec.UNSET
    node_count: Any = msgspec.UNSET
    comment: Any = msgspec.UNSET
    priority: Any = msgspec.UNSET
    qos: Any = msgspec.UNSET
    array_job_id: Any = msgspec.UNSET
    array_task_id: Any = msgspec.UNSET
    job_resources: Any = msgspec.UNSET
    nodes: Any = msgspec.UNSET


class _SqueueDocument(msgspec.Struct):
    jobs: list[SqueueJob]
    errors: Any = msgspec.UNSET


class _SqueuePlacementDocument(msgspec.Struct):
    jobs: list[SqueuePlacementJob]
    errors: Any = msgspec.UNSET


class _SqueueRunningDocument(msgspec.Struct):
    jobs: list[SqueueRunningJob]
    errors: Any = msgspec.UNSET


_SQUEUE_DECODER = msgspec.json.Decoder(_SqueueDocument)
_SQUEUE_RUNNING_DECODER = msgspec.json.Decoder(_SqueueRunningDocument)
_SQUEUE_PLACEMENT_DECODER = msgspec.json.Decoder(_SqueuePlacementDocument)
Fields = _JobFields | Mapping[str, Any]


def load_jobs(text: str | bytes) -> list[SqueueJob] | list[Any]:
    """The jobs of ``squeue --json``. A document the fast decoder refuses is read again with the
    standard library, whose result gives the one-line error that names what is wrong."""
    return _decode_jobs(text, _SQUEUE_DECODER)


def load_running_jobs(text: str | bytes) -> list[SqueueRunningJob] | list[Any]:
    return _decode_jobs(text, _SQUEUE_RUNNING_DECODER)


def _decode_jobs(
    text: str | bytes,
    decoder: msgspec.json.Decoder[_SqueueDocument]
    | msgspec.json.Decoder[_SqueueRunningDocument]
    | msgspec.json.Decoder[_SqueuePlacementDocument],
) -> list[Any]:
    try:
        document = decoder.decode(text)
    except (msgspec.DecodeError, RecursionError, UnicodeError):
        return load_document(text, "squeue --json", "jobs")
    if document.errors not in (msgspec.UNSET, None, []):
        return load_document(text, "squeue --json", "jobs")
    return document.jobs


def parse_checkpointing(
    comment: str,
    keys: tuple[str, str] = ("checkpoint_interval", "checkpoint_duration"),
    signal_key: str = "checkpoint_signal",
) -> Checkpointing:
    """``checkpoint_interval=600 checkpoint_duration=30 checkpoint_signal=USR1`` in a job's
    ``--comment`` (seconds; separated by spaces, commas or semicolons).

    A job with an interval and no signal key traps ``USR1``: that is what the convention asked of
    such jobs before the key existed. ``checkpoint_signal=none`` (or a name we cannot read, or one
    no script can trap) means it cannot be asked. A signal without an interval is a job that
    checkpoints only when asked."""
    interval_key, duration_key = keys
    values: dict[str, float] = {}
    signal_text: str | None = None
    for token in _COMMENT_SEPARATORS.split(comment):
        key, sep, raw = token.partition("=")
        if not sep:
            continue
        if key == signal_key:
            signal_text = raw
            continue
        if key not in keys:
            continue
        try:
            value = float(raw)
        except ValueError:
            continue
        if math.isfinite(value):
            values[key] = value
    interval = values.get(interval_key)
    if interval is not None and not 0 < interval <= MAX_CHECKPOINT_S:
        interval = None
    duration = values.get(duration_key)
    if duration is not None and not 0 <= duration <= MAX_CHECKPOINT_S:
        duration = None
    if signal_text is not None:
        asked_by = _signal_name(signal_text)
    else:
        asked_by = DEFAULT_CHECKPOINT_SIGNAL if interval is not None else None
    if interval is None and asked_by is None:
        return Checkpointing(None, None)
    return Checkpointing(interval, duration, asked_by)


def _signal_name(text: str) -> str | None:
    """``USR1``, ``SIGUSR1`` or ``usr1`` as ``USR1``; None for ``none`` and for what is not a
    signal a batch script can trap."""
    name = text.upper().removeprefix("SIG")
    return name if name in _CHECKPOINT_SIGNALS else None


def parse_gpu_gres(text: str) -> tuple[int, str | None]:
    """GPUs and model in a TRES or gres string (``gres:gpu:a100:2,gres:nic:1``); (0, None) when
    it asks for no GPU. Raises ``BadFieldError`` for a GPU entry whose count is not a number of
    ASCII digits within 64 bits (Slurm prints no other; ``int`` would read ``'٣'`` as 3), or
    whose type is not a name (``gpu:²``)."""
    total = 0
    model: str | None = None
    for item in text.split(","):
        entry = item.strip()
        if entry.startswith(("gres:", "gres/")):
            entry = entry[5:]
        parts = entry.split("(", 1)[0].split(":")
        if parts[0] != "gpu":
            continue
        if len(parts) == 1:
            count, found = "1", None
        elif len(parts) == 2:
            number = parts[1].isascii() and parts[1].isdigit()
            count, found = (parts[1], None) if number else ("1", parts[1])
        elif len(parts) == 3:
            count, found = parts[2], parts[1]
        else:
            raise BadFieldError(f"{shown(text)} is not a GPU count")
        if (
            not _GPU_COUNT.fullmatch(count)
            or int(count) > INT_MAX
            or (found is not None and not _GRES_TYPE.fullmatch(found))
        ):
            raise BadFieldError(f"{shown(text)} is not a GPU count")
        total += int(count)
        model = model or found or None
    return total, model


def count_array_tasks(spec: str, throttle: int) -> int:
    """Pending tasks of an array record (``0-99:2%8``, ``1,3,5-7``): at most the throttle can
    start at once, so more than that is not demand capacity can serve this tick.

    Read strictly, as Slurm prints it: ranges in ascending order without overlaps, each first <=
    last with a step >= 1, indices within Slurm's largest array, ASCII digits. Anything else
    (``5-1``, ``9-0:2``, ``1--3``, ``²``) raises ``ValueError``: a count read from it would be a
    guess, or negative."""
    if not spec:
        return 1
    ranges, percent, limit = spec.partition("%")
    count = 0
    previous = -1
    for part in ranges.split(","):
        match = _ARRAY_RANGE.fullmatch(part)
        if match is None:
            raise ValueError(part)
        first = int(match[1])
        last = first if match[2] is None else int(match[2])
        step = 1 if match[3] is None else int(match[3])
        if not previous < first <= last <= MAX_ARRAY_INDEX or step < 1:
            raise ValueError(part)
        count += (last - first) // step + 1
        previous = last
    if percent and not _ARRAY_THROTTLE.fullmatch(limit):
        raise ValueError(limit)
    cap = int(limit) if percent else throttle
    return min(count, cap) if cap > 0 else count


class _Memo:
    """Per-document caches of the repeated strings' meanings."""

    def __init__(self, rules: DemandRules) -> None:
        self.rules = rules
        self.gres: dict[str, tuple[int, str | None]] = {}
        self.shard_gres: dict[str, tuple[int, int | None]] = {}
        self.mig_gres: dict[str, tuple[list[tuple[str, int]], int]] = {}
        self.comments: dict[str, Checkpointing] = {}
        self.arrays: dict[tuple[str, int], int] = {}
        self.partitions: dict[str, bool] = {}
        self.reasons: dict[str, bool] = {}
        self.needs: dict[tuple[str, str | None], GpuNeeds] = {}
        self.reads_features = bool(rules.feature_gpu_models or rules.feature_gpu_memory_gib)
        self.skipped: list[str] = []
        self.unmet: list[str] = []

    def gpus(self, text: str) -> tuple[int, str | None]:
        found = self.gres.get(text)
        if found is None:
            count, model = parse_gpu_gres(text)
            if model is not None and (mig := mig_type(model)) is not None:
                model = mig[1]  # a MIG instance's GPU model is the type before its profile
            found = (count, self.rules.gpu_models.get(model, model) if model else None)
            self.gres[text] = found
        return found

    def migs(self, text: str) -> tuple[list[tuple[str, int]], int]:
        """The MIG instances a gres string names and its other GPUs (``slurm_shards``)."""
        found = self.mig_gres.get(text)
        if found is None:
            found = self.mig_gres[text] = mig_entries(text)
        return found

    def shards(self, text: str) -> tuple[int, int | None]:
        """Shards a gres string names and the GPUs its index list names (``slurm_shards``)."""
        found = self.shard_gres.get(text)
        if found is None:
            try:
                found = self.shard_gres[text] = parse_shards(text)
            except ShardSyntaxError as exc:
                raise BadFieldError(str(exc)) from None
        return found

    def gpu_needs(self, job: Fields, gres_model: str | None) -> GpuNeeds:
        """The models and memory the job's constraint and gres type ask of each node; the
        constraint is read only where the site maps some feature."""
        features = _str_field(job, "features") if self.reads_features else ""
        key = (features, gres_model)
        found = self.needs.get(key)
        if found is None:
            try:
                found = gpu_needs(
                    features,
                    self.rules.feature_gpu_models,
                    self.rules.feature_gpu_memory_gib,
                    gres_model,
                )
            except FeatureSyntaxError as exc:
                raise BadFieldError(f"features {exc}") from None
            self.needs[key] = found
        return found

    def fits_partition(self, partition: str, nodes: int) -> bool:
        """Whether a job waiting for ``PartitionNodeLimit`` is only waiting for nodes to join."""
        limits = self.rules.partition_nodes
        if limits is None:
            return False
        for name in partition.split(","):
            found = limits.get(name)
            if found is not None and found[0] <= nodes and (found[1] is None or nodes <= found[1]):
                return True
        return False

    def checkpointing(self, comment: str) -> Checkpointing:
        found = self.comments.get(comment)
        if found is None:
            found = self.comments[comment] = parse_checkpointing(
                comment, self.rules.checkpoint_keys, self.rules.checkpoint_signal_key
            )
        return found

    def array_tasks(self, spec: str, throttle: int) -> int:
        found = self.arrays.get((spec, throttle))
        if found is None:
            try:
                found = count_array_tasks(spec, throttle)
            except ValueError:
                raise BadFieldError(
                    f"array_task_string {shown(spec)} is not an array range"
                ) from None
            self.arrays[(spec, throttle)] = found
        return found

    def counts_partition(self, partition: str) -> bool:
        found = self.partitions.get(partition)
        if found is None:
            wanted = self.rules.partitions
            found = wanted is None or any(p in wanted for p in partition.split(","))
            self.partitions[partition] = found
        return found

    def is_demand_reason(self, reason: str) -> bool:
        found = self.reasons.get(reason)
        if found is None:
            found = reason not in self.rules.ignored_reasons and not reason.startswith(
                self.rules.ignored_reason_prefixes
            )
            self.reasons[reason] = found
        return found


class PendingJob(NamedTuple):
    """A pending GPU job's shape, before it becomes a ``Job`` or a count in a group (a tuple:
    100,000 of them are made every tick)."""

    id: str
    key: GroupKey
    submit_time: float
    copies: int
    checkpoint_duration_s: float | None
    # the share of a GPU a ``gres/shard`` job asks, or each of its MIG instances, as the shared
    # fold takes it (None: whole GPUs); how many such slices it asks; the pools that cut them
    # (none named: the time-slicing pools of ``fold``'s ``shard_pools``)
    fraction: Fraction | None = None
    pieces: int = 1
    hosts: tuple[GpuSharing, ...] = ()


def _int_field(job: Fields, name: str, default: int | None = None) -> int:
    value = job.get(name, default)
    if isinstance(value, dict):
        value = value.get("number")
    if isinstance(value, bool) or not isinstance(value, int) or not INT_MIN <= value <= INT_MAX:
        raise BadFieldError(f"{name} {shown(value)} is not an integer")
    return value


def _time_field(job: Fields, name: str) -> int:
    """An epoch time Slurm set: 0 (not yet) up to the year 9999."""
    value = _int_field(job, name)
    if not 0 <= value <= MAX_TIME:
        raise BadFieldError(f"{name} {value} is not a time")
    return value


def _job_id(job: Fields) -> int:
    """Slurm's job ids are 32-bit unsigned integers, one per record."""
    value = _int_field(job, "job_id")
    if not 0 <= value < 2**32:
        raise BadFieldError(f"job_id {value} is not a job id")
    return value


def _str_field(job: Fields, name: str) -> str:
    value = job.get(name)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise BadFieldError(f"{name} {shown(value)} is not a string")
    return value


def _is_pending(state: Any) -> bool:
    if isinstance(state, str):
        return state == PENDING
    if isinstance(state, list):
        return PENDING in state
    raise BadFieldError(f"job_state {shown(state)} is not a state")


def _count_field(job: Fields, name: str) -> int:
    """A node or task count: absent, 0 or Slurm's unset values (NO_VAL, INFINITE, or
    ``{"set": false}`` in newer releases) read as 1; negative is not a count."""
    value = job.get(name)
    if value is None or (isinstance(value, dict) and value.get("set") is False):
        return 1
    count = _int_field(job, name, 1)
    if count < 0:
        raise BadFieldError(f"{name} {count} is not a count")
    return 1 if count in _UNSET_COUNTS else count


class _SkippedJobError(Exception):
    """A job whose request no capacity could be planned for (a user's typo of a million nodes):
    left out of demand with its reason, rather than failing everyone's."""


def _job_request(job: Fields, memo: _Memo) -> tuple[int, int, str | None]:
    """GPUs per node, nodes and gres type of a pending job. ``node_count`` is the nodes it needs
    at once (its minimum: ``--nodes=2`` or ``-N 2-4`` read 2). ``--gpus=N`` over several nodes
    need not split evenly; each node is then counted as needing the larger share (``--gpus=3
    -N 2``: 2 per node, 4 in all), since that is the node a pool must offer for the job to fit.
    Tasks are counted on the job's nodes, so ``-n 4 --gpus-per-task=1`` without ``-N`` is one
    node of 4 GPUs, the node Slurm will look for first."""
    nodes = _count_field(job, "node_count")
    if nodes > MAX_JOB_NODES:
        raise _SkippedJobError(f"node_count {nodes} is more than {MAX_JOB_NODES:,} nodes")
    gpus, model = _gres_field(job, "tres_per_job", memo)
    if gpus:
        per_node = -(-gpus // nodes)
    else:
        per_node, model = _gres_field(job, "tres_per_node", memo)
        if not per_node:
            gpus, model = _gres_field(job, "tres_per_task", memo)
            per_node = -(-gpus * _count_field(job, "tasks") // nodes) if gpus else 0
    if per_node > MAX_GPUS_PER_NODE:
        raise _SkippedJobError(
            f"asks {per_node:,} GPUs of each node (more than {MAX_GPUS_PER_NODE})"
        )
    return per_node, nodes, model


def _job_gpus(job: Fields, memo: _Memo) -> tuple[int, str | None]:
    """GPUs the whole job asks for: per job, else per node times nodes, else per task times
    tasks (how ``--gpus``, ``--gres``/``--gpus-per-node`` and ``--gpus-per-task`` land)."""
    for name, multiplier in (("tres_per_job", None), ("tres_per_node", "node_count")):
        gpus, model = _gres_field(job, name, memo)
        if gpus:
            return gpus * (max(1, _int_field(job, multiplier, 1)) if multiplier else 1), model
    gpus, model = _gres_field(job, "tres_per_task", memo)
    if gpus:
        return gpus * max(1, _int_field(job, "tasks", 1)), model
    return 0, None


def _job_shards(job: Fields, memo: _Memo, nodes: int) -> int:
    """Shards of one GPU a job asks of each node (``--gres=shard:N``): per job spread over its
    nodes, else per node, else per task times tasks over its nodes; 0 for a job asking none."""
    shards = _shard_field(job, "tres_per_job", memo)
    if shards:
        return -(-shards // nodes)
    shards = _shard_field(job, "tres_per_node", memo)
    if shards:
        return shards
    shards = _shard_field(job, "tres_per_task", memo)
    return -(-shards * _count_field(job, "tasks") // nodes) if shards else 0


def _job_mig(job: Fields, memo: _Memo) -> str | None:
    """The MIG profile a job asks instances of: the one its GPU request (per job, else per
    node, else per task) names in every GPU entry; None for whole GPUs, or a request that
    mixes them with instances, or instances of several profiles (read as whole GPUs)."""
    for name in ("tres_per_job", "tres_per_node", "tres_per_task"):
        text = _str_field(job, name)
        if not text or "gpu" not in text:
            continue
        instances, whole = memo.migs(text)
        if instances or whole:
            profiles = {profile for profile, _ in instances}
            return profiles.pop() if len(profiles) == 1 and not whole else None
    return None


def _shard_field(job: Fields, name: str, memo: _Memo) -> int:
    text = _str_field(job, name)
    if not text or "shard" not in text:
        return 0
    try:
        return memo.shards(text)[0]
    except BadFieldError as exc:
        raise BadFieldError(f"{name} {exc}") from None


def _gres_field(job: Fields, name: str, memo: _Memo) -> tuple[int, str | None]:
    text = _str_field(job, name)
    if not text:
        return 0, None
    try:
        return memo.gpus(text)
    except BadFieldError as exc:
        raise BadFieldError(f"{name} {exc}") from None


def iter_pending(jobs: list[Any], rules: DemandRules) -> Iterator[PendingJob]:
    """Every pending GPU job that more capacity could start, with its group key."""
    memo = _Memo(rules)
    qos_high = rules.high_priority_qos
    priority_min = rules.high_priority_min
    team_field = rules.team_field
    teams = rules.team_names
    classes = rules.class_names if rules.fold_classes else None
    seen: set[int] = set()
    for job in jobs:
        try:
            if not isinstance(job, _JobFields | dict):
                raise BadFieldError(f"is a JSON {type(job).__name__}, not an object")
            if not _is_pending(job.get("job_state")):
                continue
            reason = _str_field(job, "state_reason")
            if not memo.is_demand_reason(reason):
                continue
            partition = _str_field(job, "partition")
            if not memo.counts_partition(partition):
                continue
            per_node, nodes, model = _job_request(job, memo)
            fraction: Fraction | None = None
            unmet: str | None = None
            shared: SharingMode | None = None  # how the GPUs it asks a slice of are shared
            pieces = 1
            hosts: tuple[GpuSharing, ...] = ()
            asked = ""
            if per_node <= 0:
                shards = _job_shards(job, memo, nodes)
                if shards <= 0:
                    continue
                shared, per_node = SharingMode.TIME_SLICING, 1
                fraction, unmet = shard_demand(shards, nodes, rules.shard_pools)
                asked = f"{shards} shard(s)"
            elif (profile := _job_mig(job, memo)) is not None:
                mig = mig_demand(profile, per_node, nodes, rules.shard_pools)
                asked = f"{per_node} MIG {profile} instance(s)"
                shared, per_node, fraction = SharingMode.MIG, mig.gpus, mig.fraction
                pieces, hosts, unmet = mig.pieces, mig.hosts, mig.unmet
            if reason == NODE_LIMIT_REASON and not memo.fits_partition(partition, nodes):
                continue
            needs = memo.gpu_needs(job, model)
            checkpointing = memo.checkpointing(_str_field(job, "comment"))
            high = (priority_min is not None and _int_field(job, "priority") >= priority_min) or (
                bool(qos_high) and _str_field(job, "qos") in qos_high
            )
            copies = memo.array_tasks(
                _str_field(job, "array_task_string"), _int_field(job, "array_max_tasks", 0)
            )
            submitted = _time_field(job, "submit_time")
            job_id = _job_id(job)
            if job_id in seen:
                raise BadFieldError("is listed twice (the output is corrupted)")
            seen.add(job_id)
            team = teams(job.get(team_field)) if team_field else None
            priority_class = classes(job.get("qos")) if classes is not None else None
        except BadFieldError as exc:
            raise SourceError(f"squeue --json: job {_ident(job)}: {exc}") from None
        except _SkippedJobError as exc:
            memo.skipped.append(f"job {_ident(job)}: {exc}")
            continue
        if unmet is not None:
            memo.unmet.append(f"job {job_id} asks {asked}: {unmet}")
        yield PendingJob(
            str(job_id),
            GroupKey(
                per_node * nodes,
                checkpointing.interval_s,
                high,
                needs.gpu_models if unmet is None else (unmet,),
                partition or None,
                nodes,
                needs.min_gpu_memory_gib,
                team,
                priority_class,
                # a shard or MIG job runs only where GPUs are shared its way: only such pools
                # are bought for it (NodeShape.shares_like); its own group, never whole GPUs'
                shared,
            ),
            float(submitted),
            copies,
            checkpointing.duration_s,
            fraction,
            pieces,
            hosts,
        )
    _warn_left_out(memo.unmet, "pending shard or MIG job(s) no pool can host")
    _warn_left_out(memo.skipped, "pending job(s) not counted as demand")


def _warn_left_out(lines: list[str], what: str) -> None:
    """One warning line for the jobs of a kind that demand leaves out or cannot meet, naming
    the first few."""
    if lines:
        more = len(lines) - SHOWN_SKIPPED
        log.warning(
            "squeue --json: %d %s: %s%s",
            len(lines),
            what,
            "; ".join(lines[:SHOWN_SKIPPED]),
            f" (and {more} more)" if more > 0 else "",
        )


def _ident(job: Any) -> str:
    """The job's id for a message, whatever the record holds there."""
    if not isinstance(job, _JobFields | dict):
        return "?"
    value = job.get("job_id", "?")
    return value if value == "?" else shown(value)


def fold(
    pending: Iterator[PendingJob], shard_pools: tuple[GpuSharing, ...] | None = None
) -> list[DemandGroup]:
    """The same groups ``autoscaler.sources.aggregate`` makes of the jobs, without making them.
    Shard or MIG jobs alike but for their slices are one group (of ``gpu_sharing`` time-slicing
    or MIG, apart from the whole-GPU jobs of their shape, which could not run on a slice), their
    slices summed and rounded up once to whole GPUs of the pools that can host them
    (``sharing.folded_gpus``: each as the host that cuts it coarsest would): a MIG job's, the
    pools that list its profile; a shard job's, the time-slicing ``shard_pools``."""
    shard_hosts = tuple(
        s for s in shard_pools or () if s.mode is SharingMode.TIME_SLICING and s.replicas
    )
    counts: dict[GroupKey, int] = {}
    named: dict[GroupKey, OldestJobs] = {}
    bounds: dict[GroupKey, float] = {}
    sliced: dict[GroupKey, dict[tuple[Fraction, tuple[GpuSharing, ...]], int]] = {}
    sliced_jobs: dict[GroupKey, int] = {}
    for item in pending:
        key = item.key
        submitted = item.submit_time
        if item.fraction is not None:
            fractions = sliced.setdefault(key, {})
            asked = (item.fraction, item.hosts or shard_hosts)
            fractions[asked] = fractions.get(asked, 0) + item.copies * item.pieces
            sliced_jobs[key] = sliced_jobs.get(key, 0) + item.copies
        if key in counts:
            counts[key] += item.copies
            if submitted <= bounds[key]:
                bounds[key] = named[key].offer(submitted, item.id)
        else:
            counts[key] = item.copies
            named[key] = OldestJobs(submitted, item.id)
            bounds[key] = math.inf
    for key, fractions in sliced.items():
        asks = [(fraction, jobs, hosts) for (fraction, hosts), jobs in fractions.items()]
        counts[key] = folded_gpus(counts[key] - sliced_jobs[key], asks)
    return groups_from_counts(
        counts, {k: v.submitted() for k, v in named.items()}, {k: v.ids() for k, v in named.items()}
    )


def demand_groups(text: str | bytes, rules: DemandRules) -> list[DemandGroup]:
    return fold(iter_pending(load_jobs(text), rules), rules.shard_pools)


def pending_jobs(text: str | bytes, rules: DemandRules) -> list[Job]:
    """The pending GPU jobs one by one (an array record becomes one ``Job`` per task)."""
    jobs: list[Job] = []
    for item in iter_pending(load_jobs(text), rules):
        key = item.key
        for copy in range(item.copies):
            jobs.append(
                Job.model_construct(
                    id=item.id if item.copies == 1 else f"{item.id}_{copy}",
                    gpus=key.gpus,
                    submit_time=item.submit_time,
                    high_priority=key.high_priority,
                    checkpoint_interval_s=key.checkpoint_interval_s,
                    checkpoint_duration_s=item.checkpoint_duration_s,
                    nodes=key.nodes,
                    gpu_models=key.gpu_models,
                    min_gpu_memory_gib=key.min_gpu_memory_gib,
                    partition=key.partition,
                    team=key.team,
                    priority_class=key.priority_class,
                )
            )
    return jobs


def _job_nodes(job: Fields) -> list[str]:
    resources = job.get("job_resources")
    if isinstance(resources, dict):
        allocated = resources.get("allocated_nodes")
        if isinstance(allocated, list):
            names = [n.get("nodename") for n in allocated if isinstance(n, dict)]
            return [n for n in names if isinstance(n, str)]
    nodes = job.get("nodes")
    return nodes.split(",") if isinstance(nodes, str) and nodes else []


def active_jobs_on(text: str | bytes, node: str) -> list[str]:
    """Ids of the jobs running (or finishing) on ``node``."""
    found = []
    for job in load_jobs(text):
        try:
            if not isinstance(job, _JobFields | dict):
                raise BadFieldError(f"is a JSON {type(job).__name__}, not an object")
            if _is_active(job.get("job_state")) and node in _job_nodes(job):
                found.append(str(_job_id(job)))
        except BadFieldError as exc:
            raise SourceError(f"squeue --json: job {_ident(job)}: {exc}") from None
    return found


def read_running_jobs(
    text: str | bytes,
    rules: DemandRules,
    node_shards: Mapping[str, tuple[int, int]] | None = None,
) -> dict[str, list[RunningJob]]:
    """Every job running (or finishing) on each node, with the GPUs it holds there: one document
    for all nodes, so a zone-wide reclaim of hundreds of nodes costs one ``squeue``. A job on
    several nodes is listed on each. Unlike a comment, an allocation we cannot read fails the
    read: it is what the work at risk is counted in. A shard job holds one GPU of each node, and
    its shards' share of a GPU (``gpu_share``) where ``node_shards`` gives the node's shards and
    GPUs (``sinfo``); a node it does not give leaves the share unknown, the GPU counted whole.
    A job on MIG instances holds, on each node, the GPU they are cut from and their compute's
    share of it (one ``1g.10gb``: 1/7), or the GPUs their compute adds up to, rounded up, when
    that is a GPU or more, as the Kubernetes source and the simulator count a slice holder."""
    memo = _Memo(rules)
    qos_high = rules.high_priority_qos
    priority_min = rules.high_priority_min
    by_node: dict[str, list[RunningJob]] = {}
    for job in load_running_jobs(text):
        try:
            if not isinstance(job, _JobFields | dict):
                raise BadFieldError(f"is a JSON {type(job).__name__}, not an object")
            if not _is_active(job.get("job_state")):
                continue
            nodes = _job_nodes(job)
            if not nodes:
                raise BadFieldError("is running but names no node")
            gpus = _gpus_by_node(job, nodes, memo)
            if max(gpus) > MAX_GPUS_PER_NODE or min(gpus) < 0:
                raise BadFieldError(f"holds {max(gpus):,} GPUs of one node")
            started = _time_field(job, "start_time")
            if started <= 0:
                raise BadFieldError(f"start_time {started} is not a time")
            checkpointing = memo.checkpointing(_str_field(job, "comment"))
            high = (priority_min is not None and _int_field(job, "priority") >= priority_min) or (
                bool(qos_high) and _str_field(job, "qos") in qos_high
            )
            needs = memo.gpu_needs(job, _job_gpus(job, memo)[1])
            shares = _shares(job, nodes, gpus, memo, node_shards or {})
            gpus, shares = _mig_held(job, nodes, gpus, shares, memo)
            job_id = str(_job_id(job))
            team = rules.team_names(job.get(rules.team_field)) if rules.team_field else None
            priority_class = rules.class_names(job.get("qos"))
            submitted = _time_field(job, "submit_time")
        except BadFieldError as exc:
            raise SourceError(f"squeue --json: job {_ident(job)}: {exc}") from None
        for node, count, share in zip(nodes, gpus, shares, strict=True):
            by_node.setdefault(node, []).append(
                RunningJob(
                    id=job_id,
                    node=node,
                    gpus=count,
                    started_at=float(started),
                    checkpoint_interval_s=checkpointing.interval_s,
                    checkpoint_duration_s=checkpointing.duration_s,
                    checkpoint_signal=checkpointing.signal,
                    nodes=len(nodes),
                    high_priority=high,
                    gpu_models=needs.gpu_models,
                    min_gpu_memory_gib=needs.min_gpu_memory_gib,
                    team=team,
                    priority_class=priority_class,
                    submitted_at=float(submitted) if submitted > 0 else None,
                    gpu_share=share,
                )
            )
    return by_node


def _shares(
    job: Fields,
    nodes: list[str],
    gpus: list[int],
    memo: _Memo,
    node_shards: Mapping[str, tuple[int, int]],
) -> list[float | None]:
    """The share of a GPU a shard job's shards are on each node (shards over the node's shards
    per GPU); None where it holds whole GPUs or the node's shards are not known."""
    if any(gpus) and not _job_shards(job, memo, len(nodes)):
        return [None] * len(nodes)
    shares: list[float | None] = []
    for node, shards in zip(nodes, _shards_by_node(job, nodes, memo), strict=True):
        known = node_shards.get(node)
        if not shards or known is None or known[0] <= 0 or known[1] <= 0:
            shares.append(None)
        else:
            shares.append(float(Fraction(shards * known[1], known[0])))
    return shares


def _mig_held(
    job: Fields, nodes: list[str], gpus: list[int], shares: list[float | None], memo: _Memo
) -> tuple[list[int], list[float | None]]:
    """The GPUs a job holds on each node and its share of one, with MIG instances (which Slurm
    counts as GPUs) read as slices of a GPU: from its ``gres_detail`` entry for each node, else
    its request's profile and Slurm's count of instances on the node."""
    detail = job.get("gres_detail")
    if isinstance(detail, list) and len(detail) == len(nodes):
        held = [memo.migs(entry) if isinstance(entry, str) else ([], 0) for entry in detail]
    else:
        profile = _job_mig(job, memo)
        if profile is None:
            return gpus, shares
        held = [([(profile, count)], 0) for count in gpus]
    if not any(instances for instances, _ in held):
        return gpus, shares
    counted: list[int] = []
    shared: list[float | None] = []
    for (instances, whole), count, share in zip(held, gpus, shares, strict=True):
        if not instances:
            counted.append(count)
            shared.append(share)
            continue
        compute = mig_share(instances)
        counted.append(whole + math.ceil(compute))
        shared.append(float(compute) if not whole and compute < 1 else None)
    return counted, shared


class QueuedJob(NamedTuple):
    """One job of the queue as placement sees it (a tuple: 100,000 are made every tick).
    ``partitions`` are the partitions a pending job may start in (where a running one runs);
    ``nodes`` are where it runs (none while pending); ``array_task`` is ``A_T`` for a task of
    array ``A`` and ``array_pending`` is ``A`` for the record of array ``A``'s pending tasks;
    ``asks_gpus`` is False for CPU-only jobs and for requests no capacity could hold, which
    placement leaves alone."""

    id: str
    pending: bool
    partitions: tuple[str, ...]
    asks_gpus: bool
    checkpointable: bool
    high_priority: bool
    nodes: tuple[str, ...] = ()
    array_task: str | None = None
    array_pending: str | None = None


def read_queue(
    text: str | bytes,
    rules: DemandRules,
    partitions: frozenset[str] | None = None,
    ids: frozenset[str] = frozenset(),
) -> list[QueuedJob]:
    """The jobs of ``squeue --json`` placement decides by (``queue_facts``)."""
    return queue_facts(_decode_jobs(text, _SQUEUE_PLACEMENT_DECODER), rules, partitions, ids)


def queue_facts(
    jobs: list[Any],
    rules: DemandRules,
    partitions: frozenset[str] | None = None,
    ids: frozenset[str] = frozenset(),
) -> list[QueuedJob]:
    """The pending jobs in one of ``partitions`` (every pending job when None) and the pending or
    running jobs named in ``ids`` (a job id, ``A_T`` for an array task, which an array's record
    of pending tasks may hold), with what placement decides by; array tasks are told apart only
    when ``ids`` are asked for. Whatever a pending job waits
    for, it may become eligible between two ticks, so none is skipped for its reason. A job
    checkpoints when its comment declares an interval, and is high priority by the same rule as
    demand. A job whose fields we cannot read fails the read, as for demand. ``jobs`` are
    decoded already, so that the document demand was read from serves placement too."""
    memo = _Memo(rules)
    qos_high = rules.high_priority_qos
    priority_min = rules.high_priority_min
    arrays = {i.partition("_")[0] for i in ids if "_" in i}
    touches: dict[str, bool] = {}
    queued: list[QueuedJob] = []
    for job in jobs:
        try:
            if not isinstance(job, _JobFields | dict):
                raise BadFieldError(f"is a JSON {type(job).__name__}, not an object")
            state = job.get("job_state")
            pending = _is_pending(state)
            if not pending and not _is_active(state):
                continue
            job_id = str(_job_id(job))
            text = _str_field(job, "partition")
            wanted = touches.get(text)
            if wanted is None:
                wanted = touches[text] = partitions is None or not partitions.isdisjoint(
                    text.split(",")
                )
            array_task, array_pending = _array_ids(job) if ids else (None, None)
            if not (
                (pending and wanted)
                or job_id in ids
                or array_task in ids
                or array_pending in arrays
            ):
                continue
            try:
                per_node, nodes, _ = _job_request(job, memo)
                asks_gpus = per_node > 0 or _job_shards(job, memo, nodes) > 0
            except _SkippedJobError:
                asks_gpus = False
            checkpointable = memo.checkpointing(_str_field(job, "comment")).interval_s is not None
            high = (priority_min is not None and _int_field(job, "priority") >= priority_min) or (
                bool(qos_high) and _str_field(job, "qos") in qos_high
            )
        except BadFieldError as exc:
            raise SourceError(f"squeue --json: job {_ident(job)}: {exc}") from None
        queued.append(
            QueuedJob(
                job_id,
                pending,
                tuple(p for p in text.split(",") if p),
                asks_gpus,
                checkpointable,
                high,
                () if pending else tuple(_job_nodes(job)),
                array_task,
                array_pending,
            )
        )
    return queued


def _array_ids(job: Fields) -> tuple[str | None, str | None]:
    """``(A_T, None)`` for task T of array A, ``(None, A)`` for array A's record of pending
    tasks, ``(None, None)`` for a job that is not an array's."""
    array = job.get("array_job_id")
    if array in (None, 0) or (isinstance(array, dict) and not array.get("number")):
        return None, None
    array_id = _int_field(job, "array_job_id")
    task = job.get("array_task_id")
    if task is None or (isinstance(task, dict) and task.get("set") is False):
        return None, str(array_id)
    task_id = _int_field(job, "array_task_id")
    if task_id in _UNSET_COUNTS - {0}:
        return None, str(array_id)
    return f"{array_id}_{task_id}", None


def _is_active(state: Any) -> bool:
    if isinstance(state, str):
        return state in ACTIVE_STATES
    if isinstance(state, list):
        return any(isinstance(s, str) and s in ACTIVE_STATES for s in state)
    raise BadFieldError(f"job_state {shown(state)} is not a state")


def _gpus_by_node(job: Fields, nodes: list[str], memo: _Memo) -> list[int]:
    """GPUs the job holds on each of its nodes. ``gres_detail`` has one entry per allocated node,
    in node order (``gpu:a100:2(IDX:0-1)``), and is exact even for ``--gpus=3`` over two nodes;
    without it, the per-node request, else the job's total spread over its nodes. A shard job
    (``shard:2(IDX:0)``) holds the GPUs its shards are on, one on each node in 22.05: no
    whole-GPU job can have them while it runs (``slurm_shards``)."""
    detail = job.get("gres_detail")
    if isinstance(detail, list) and len(detail) == len(nodes):
        counts = []
        for entry in detail:
            if not isinstance(entry, str):
                raise BadFieldError(f"gres_detail entry {shown(entry)} is not a string")
            try:
                count = memo.gpus(entry)[0]
                if not count and "shard" in entry:
                    shards, gpus = memo.shards(entry)
                    count = (gpus or 1) if shards else 0
            except BadFieldError as exc:
                raise BadFieldError(f"gres_detail {exc}") from None
            counts.append(count)
        return counts
    per_node, _ = _gres_field(job, "tres_per_node", memo)
    if per_node:
        return [per_node] * len(nodes)
    total = _allocated_gpus(_str_field(job, "tres_alloc_str"))
    if total is None:
        total = _job_gpus(job, memo)[0]
    if not total and _job_shards(job, memo, len(nodes)):
        return [1] * len(nodes)
    share, extra = divmod(total, len(nodes))
    return [share + (1 if index < extra else 0) for index in range(len(nodes))]


def shards_by_node(text: str | bytes, nodes: frozenset[str]) -> dict[str, int]:
    """The shards the running jobs hold on each of ``nodes``, from their ``gres_detail`` (one
    entry per allocated node, in node order): what Slurm 22.05's ``GresUsed`` does not say
    (``slurm_shards``). A job without a detail for each node holds its per-node request on
    each. Fields we cannot read fail the read, as for running jobs."""
    memo = _Memo(DemandRules())
    held: dict[str, int] = {}
    for job in load_running_jobs(text):
        try:
            if not isinstance(job, _JobFields | dict):
                raise BadFieldError(f"is a JSON {type(job).__name__}, not an object")
            if not _is_active(job.get("job_state")):
                continue
            names = _job_nodes(job)
            if nodes.isdisjoint(names):
                continue
            counts = _shards_by_node(job, names, memo)
        except BadFieldError as exc:
            raise SourceError(f"squeue --json: job {_ident(job)}: {exc}") from None
        for name, count in zip(names, counts, strict=True):
            if name in nodes and count:
                held[name] = held.get(name, 0) + count
    return held


def _shards_by_node(job: Fields, nodes: list[str], memo: _Memo) -> list[int]:
    """Shards the job holds on each of its nodes: its ``gres_detail`` entry for each, else its
    per-node request on each."""
    detail = job.get("gres_detail")
    if isinstance(detail, list) and len(detail) == len(nodes):
        counts = []
        for entry in detail:
            if not isinstance(entry, str):
                raise BadFieldError(f"gres_detail entry {shown(entry)} is not a string")
            try:
                counts.append(memo.shards(entry)[0] if "shard" in entry else 0)
            except BadFieldError as exc:
                raise BadFieldError(f"gres_detail {exc}") from None
        return counts
    return [_job_shards(job, memo, len(nodes))] * len(nodes)


def _allocated_gpus(tres: str) -> int | None:
    """``gres/gpu=N`` of a TRES string (``cpu=8,node=2,gres/gpu=6``): present only where the
    cluster accounts GPUs as a TRES."""
    for item in tres.split(","):
        key, _, value = item.partition("=")
        if key.strip() == "gres/gpu":
            if not _GPU_COUNT.fullmatch(value.strip()) or int(value) > INT_MAX:
                raise BadFieldError(f"tres_alloc_str {shown(tres)} is not a GPU count")
            return int(value)
    return None


@dataclass(frozen=True)
class NodeRules:
    """How ``sinfo``'s nodes are read: the cloud feature, gres type renames, and which node
    features name a GPU model (for a node whose gres has no type) or its GPU memory."""

    cloud_feature: str
    gpu_models: Mapping[str, str] = field(default_factory=dict)
    feature_gpu_models: Mapping[str, str] = field(default_factory=dict)
    feature_gpu_memory_gib: Mapping[str, float] = field(default_factory=dict)


def _node_features(item: Mapping[str, Any]) -> list[str]:
    """``features`` as 22.05 prints it (``"a100,gpu80g"``) or as a list (later releases)."""
    return _names(item, "features", "a feature list")


def _names(item: Mapping[str, Any], name: str, what: str) -> list[str]:
    """A list of names, or one string of them separated by commas (absent: none)."""
    value = item.get(name)
    if value is None:
        return []
    if isinstance(value, str):
        return [f for f in value.split(",") if f]
    if isinstance(value, list) and all(isinstance(f, str) for f in value):
        return list(value)
    raise BadFieldError(f"{name} {shown(value)} is not {what}")


def _node(item: Any, rules: NodeRules) -> NodeGpus:
    if not isinstance(item, dict):
        raise BadFieldError(f"is a JSON {type(item).__name__}, not an object")
    name = _str_field(item, "name")
    if not name:
        raise BadFieldError("has no name")
    gres, gres_used = _str_field(item, "gres"), _str_field(item, "gres_used")
    try:
        gpus, model = parse_gpu_gres(gres)
        used, _ = parse_gpu_gres(gres_used)
        gpus, used, model = _mig_gpus(gres, gres_used, gpus, used, model)
        shards = parse_shards(gres)[0] if "shard" in gres else 0
        shard_gpus = 0
        if "shard" in gres_used:
            shards_used, on_gpus = parse_shards(gres_used)
            shard_gpus = on_gpus if on_gpus is not None else min(shards_used, 1)
    except BadFieldError as exc:
        raise BadFieldError(f"gres: {exc}") from None
    except ShardSyntaxError as exc:
        raise BadFieldError(f"gres: {exc}") from None
    if gpus > MAX_GPUS_PER_NODE or used > MAX_GPUS_PER_NODE:
        raise BadFieldError(f"gres: {max(gpus, used):,} GPUs on one node")
    if shards and not gpus:
        raise BadFieldError(f"gres {shown(gres)}: shards without GPUs to share")
    if shard_gpus > gpus:
        raise BadFieldError(f"gres_used {shown(gres_used)}: shards on more GPUs than it has")
    state = _str_field(item, "state").lower()
    flags = item.get("state_flags") or []
    if not isinstance(flags, list) or not all(isinstance(f, str) for f in flags):
        raise BadFieldError(f"state_flags {shown(flags)} is not a list of flags")
    features = _node_features(item)
    schedulable = state not in UNSCHEDULABLE_STATES and not UNSCHEDULABLE_FLAGS.intersection(flags)
    featured_model, memory = node_gpu_facts(
        features, rules.feature_gpu_models, rules.feature_gpu_memory_gib
    )
    return NodeGpus(
        name=name,
        gpus=gpus,
        gpus_allocated=used + shard_gpus,
        gpu_model=rules.gpu_models.get(model, model) if model else featured_model,
        schedulable=schedulable,
        cloud=rules.cloud_feature in features,
        gpu_memory_gib=memory,
        shards=shards,
        shard_gpus=shard_gpus,
    )


def _mig_gpus(
    gres: str, gres_used: str, gpus: int, used: int, model: str | None
) -> tuple[int, int, str | None]:
    """A node's GPUs, those in use and its GPU type, with MIG instances (which Slurm counts as
    GPUs: ``gpu:a100_1g.10gb:7`` is one A100 cut in seven) read as the GPUs they are cut from:
    their compute summed and rounded up (a GPU's instances add up to at most 7 sevenths), and
    as many in use as the instances in use could sit on, at most those GPUs (which GPU an
    instance is cut from is not printed, so a node is never taken for emptier than it may be;
    a cut GPU is no whole GPU's room anyway). Its type is the one before the profile."""
    instances, _ = mig_entries(gres)
    if not instances:
        return gpus, used, model
    cut = math.ceil(mig_share(instances))
    whole = gpus - sum(count for _, count in instances)
    taken, whole_used = mig_entries(gres_used)
    in_use = sum(count for _, count in taken)
    if model is not None and (found := mig_type(model)) is not None:
        model = found[1]
    return whole + cut, whole_used + min(in_use, cut), model


def read_nodes(
    text: str | bytes,
    cloud_feature: str | NodeRules,
    partitions: frozenset[str] | None = None,
    gpu_models: Mapping[str, str] | None = None,
) -> list[NodeGpus]:
    """GPU nodes from ``sinfo --json``, on-prem and cloud, each once. ``cloud_feature`` may be
    the whole ``NodeRules`` (``gpu_models`` is then ignored)."""
    rules = (
        cloud_feature
        if isinstance(cloud_feature, NodeRules)
        else NodeRules(cloud_feature, gpu_models or {})
    )
    nodes: dict[str, NodeGpus] = {}
    for item in load_document(text, "sinfo --json", "nodes"):
        try:
            node = _node(item, rules)
            in_partition = partitions is None or bool(
                partitions.intersection(_names(item, "partitions", "a list of partitions"))
            )
        except BadFieldError as exc:
            raise SourceError(f"sinfo --json: node {_node_ident(item)}: {exc}") from None
        if (node.gpus > 0 or node.cloud) and (in_partition or node.cloud):
            nodes[node.name] = node
    return list(nodes.values())


def _node_ident(item: Any) -> str:
    value = item.get("name", "?") if isinstance(item, dict) else "?"
    return value if isinstance(value, str) and len(value) <= SHOWN_CHARS else shown(value)


def cloud_node_weights(text: str | bytes, cloud_feature: str) -> dict[str, Any]:
    """Each cloud node's name and Slurm weight, from ``sinfo --json``: what placement compares
    with the weight it wants. A cloud node without a usable name fails the read, since its name
    goes into an ``scontrol`` command."""
    weights: dict[str, Any] = {}
    for item in load_document(text, "sinfo --json", "nodes"):
        try:
            if not isinstance(item, dict):
                raise BadFieldError(f"is a JSON {type(item).__name__}, not an object")
            if cloud_feature not in _node_features(item):
                continue
            name = _str_field(item, "name")
            if not NODE_NAME.fullmatch(name):
                raise BadFieldError(f"name {shown(name)} is not a node name")
            weights[name] = item.get("weight")
        except BadFieldError as exc:
            raise SourceError(f"sinfo --json: node {_node_ident(item)}: {exc}") from None
    return weights


def onprem_nodes(nodes: list[NodeGpus]) -> tuple[OnPremNode, ...]:
    return tuple(
        OnPremNode.model_construct(
            name=n.name,
            gpus=n.gpus,
            gpu_model=n.gpu_model,
            gpu_memory_gib=n.gpu_memory_gib,
            gpus_allocated=min(n.gpus_allocated, n.gpus),
            gpu_util_pct=None,
            idle_since=None,
            schedulable=n.schedulable,
        )
        for n in nodes
        if not n.cloud
    )
