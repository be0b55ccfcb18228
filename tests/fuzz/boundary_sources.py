"""Issue 15's source boundaries: Slurm's ``squeue --json`` / ``sinfo --json``, and Prometheus
(dcgm-exporter exposition text scraped over HTTP, PromQL answers for demand and GPU telemetry,
and the idle state the GPU readings drive).

Each input goes through the path the controller uses: the Slurm adapter's ``read``,
``read_nodes``, ``running_jobs_by_node`` and ``apply_placement`` on the bytes its commands would
print (only the command runner is replaced); the scrape source and both Prometheus sources over
real HTTP, from a server answering with the fuzzed bytes; the idle tracker fed what they read.

What is checked besides "only the boundary's own error": every reading is bounded (positive
counts, finite numbers, GPUs per node within 1,024, times plausible), and where an independent
reading of the same input is possible, the answer is that reading:

* Slurm demand against a reference reader of the documented rules (written apart from the
  adapter, with its own parsing), which either gives the exact jobs and GPUs, says the document
  must be refused (a backward array range, a field of the wrong type, a job listed twice...), or,
  for forms it does not model, makes no claim;
* the scrape against ``prometheus_client``'s own exposition parser plus the documented rules
  (which nodes must be kept, with which readings, which must be left out), and the good target
  served next to the fuzzed one must never lose its readings;
* Prometheus demand against a reference reading of the API answer;
* the idle tracker: after any readings, a busy reading taken now is never ignored.
"""

from __future__ import annotations

import json
import math
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from answer_server import AnswerServer
from harness import Outcome, mutate_text
from prometheus_client.parser import text_string_to_metric_families

from autoscaler.fleet.telemetry import FUTURE_SKEW_S, IdleTracker
from autoscaler.model import OnPremUse, Placement
from autoscaler.model.clock import ManualClock
from autoscaler.model.errors import SourceError
from autoscaler.sources.exposition import MAX_FB_MIB
from autoscaler.sources.prometheus import (
    MAX_JOBS,
    MAX_SERIES,
    PrometheusQueueSettings,
    PrometheusQueueSource,
    PrometheusTelemetrySettings,
    PrometheusTelemetrySource,
)
from autoscaler.sources.scrape import ScrapeSettings, ScrapeTelemetrySource
from autoscaler.sources.slurm import (
    DEFAULT_IGNORED_REASON_PREFIXES,
    DEFAULT_IGNORED_REASONS,
    SlurmAdapter,
    SlurmSettings,
)
from autoscaler.spi.sources import GpuSample

DATA = Path(__file__).resolve().parent.parent / "data"
NOW = 1_795_249_300.0  # the captured Slurm outputs' time, so their times are plausible
MAX_TIME = 253_402_300_799
MAX_GPUS_PER_NODE = 1024
MAX_NODES = 100_000
MAX_ARRAY_TASKS = 4_000_001
LONGEST_ERROR = 1000


def _read(path: str) -> str:
    return (DATA / path).read_text()


def _one_line(message: str) -> str | None:
    """Why an error message breaks the rule of one bounded line, or None."""
    if "\n" in message or "\r" in message:
        return f"the error spans several lines: {message[:200]!r}"
    if len(message) > LONGEST_ERROR:
        return f"the error is {len(message):,} characters long"
    return None


def _raw(text: str, rng: random.Random) -> str:
    """Text JSON cannot say through ``json.dumps``: deep nesting, huge or non-finite numbers."""
    return rng.choice(
        [
            "[" * 5000 + "]" * 5000,
            '{"a":' * 3000 + "1" + "}" * 3000,
            "1e999",
            "-1e999",
            "9" * 400,
            "-" + "9" * 30,
            "NaN",
            "Infinity",
            "1.5e308",
            text,
        ]
    )


RAW = "\u0000RAW\u0000"


def _dumps(document: Any, rng: random.Random) -> str:
    text = json.dumps(document)
    while json.dumps(RAW) in text:
        text = text.replace(json.dumps(RAW), _raw("0", rng), 1)
    return text


# --------------------------------------------------------------------------------------------
# Slurm


# fmt: off
JOB_VALUES: dict[str, list[Any]] = {
    "array_task_string": [
        "5-1", "9-0:2", "1--3", "²", "٣", "0-4000001", "0-9:0", "3,1", "1,1", "0-9%", "%3",
        "0-3%2", "0-99:2%8", "1,3,5-7", "", "0-3999999", " 1", "1-", "-1", "0x10", "1_0", "1e3",
        "0-9:2%0", "0-4000000", "7", "0-2,4-3", "0-" + "9" * 40, "1,2,3," * 3000 + "9999", 5,
        None, RAW,
    ],
    "array_max_tasks": [0, 3, -1, 2**64, 2**64 - 1, None, "3", True, 1.5, {"number": 2}, RAW],
    "submit_time": [
        0, -1, 1000, 2**63, 2**64, 10**30, 1e300, "now", None, True, 253402300800, {"number": 5},
        RAW,
    ],
    "node_count": [
        1, 0, -1, 2, 3, 100_001, 2**32 - 2, 2**64 - 2, 2**80, None, "2", {"set": False},
        {"set": True, "number": 3}, True, 1.0, RAW,
    ],
    "tasks": [1, 0, -1, 4, 2**64, None, "4", True, {"set": False}, RAW],
    "tres_per_node": [
        "gres:gpu:2", "gres:gpu:a100:2", "gres:gpu:²", "gres:gpu:٣", "gres:gpu:" + "9" * 30,
        "gres:gpu:-1", "gres:gpu:1e3", "gres/gpu:4", "gres:gpu", "gpu:a100:2(IDX:0-1)",
        "gres:gpu:a:b:c:2", "", None, 5, ["gres:gpu:1"], "gres:gpu:1025", "gres:gpu:1024",
        "gres:gpu:2,gres:gpu:3", "gres:shard:2", "gres:gpu:4000", RAW,
    ],
    "job_state": [
        "PENDING", "RUNNING", ["PENDING"], ["PENDING", {}], 3, None, "pending", [{"a": 1}], [[]],
        ["RUNNING", "PENDING"], RAW,
    ],
    "state_reason": [
        "Priority", "Resources", "Dependency", "PartitionNodeLimit", "AssocGrpGRES", None, 5,
        "x" * 70_000, RAW,
    ],
    "partition": ["gpu", "onprem", "gpu,onprem", "nope", None, 7, "", RAW],
    "priority": [1, 5000, None, "high", 2**70, {"number": 5000}, True, -5, RAW],
    "job_id": ["DUP", -1, 0, 2**32, "7", None, 2**70, True, 10**400, RAW],
    "comment": [
        "checkpoint_interval=600", "checkpoint_interval=1e308", "checkpoint_interval=nan",
        "checkpoint_interval=-5", "checkpoint_duration=1e300 checkpoint_interval=60", 5, None,
        "x" * 5000, "checkpoint_interval=٣٠٠", "checkpoint_signal=KILL checkpoint_interval=9",
    ],
    "features": ["", "a100|h100", "(((", 7, "x" * 2000, "a100&" * 300 + "h100", None],
    "qos": ["normal", 5, None, "urgent"],
    "job_resources": [
        None, 5, {"allocated_nodes": 5}, {"allocated_nodes": [{"nodename": 5}]}, RAW,
    ],
    "nodes": ["gpu-a", "", "a,b", None, 5, "i-0abc123", RAW],
    "gres_detail": [["gpu:a100:2(IDX:0-1)"], ["gpu:²"], [5], "x", None, ["gpu:a100:5000"]],
    "start_time": [0, -1, 1_700_000_000, 2**64, None, "x", 10**20, RAW],
    "tres_alloc_str": ["cpu=8,gres/gpu=6", "gres/gpu=²", "gres/gpu=" + "9" * 30, 5, None],
}
JOB_VALUES["tres_per_job"] = JOB_VALUES["tres_per_node"]
JOB_VALUES["tres_per_task"] = JOB_VALUES["tres_per_node"]

NODE_VALUES: dict[str, list[Any]] = {
    "gres": [
        "gpu:a100:4(S:0-1)", "gpu:²", "gpu:99999", "gpu:1025", "gpu:1024", "", None, 7,
        "gpu:a100:" + "9" * 30, "gpu:a100:-1", RAW,
    ],
    "state": ["idle", "down", "mixed", 5, None, ["idle"], RAW],
    "state_flags": [["DRAIN"], [{}], "DRAIN", None, [[1]], [5], RAW],
    "features": [
        "gpu-autoscaler", "a100,gpu-autoscaler", ["gpu-autoscaler"], 7, [1], "", None, RAW,
    ],
    "name": [
        "i-0abc", "", None, "bad name,x", "x" * 300, 5, "--weird", "gpu-a", "i-0abc123", RAW,
    ],
    "partitions": [["gpu"], "gpu", [{}], 5, None, [], RAW],
    "weight": [1, 1000, None, "x", {"number": 5}, 2**70, RAW],
}
NODE_VALUES["gres_used"] = NODE_VALUES["gres"]

DOCUMENT_VALUES: list[Any] = [
    {"errors": ["x"]}, {"errors": [{"error": "bad\nthing"}]}, {"errors": "str"}, {"errors": [{}]},
    {"errors": 5}, {"errors": {"error": "x"}}, {"errors": [{"error": "x" * 100_000}]},
    {"meta": RAW}, {"warnings": RAW},
]

SCRATCH = [
    "", "null", "{}", "[]", '{"jobs": 5}', '{"nodes": {}}',
    '{"jobs": [' + ",".join(["{}"] * 1000) + "]}",
    '{"jobs": [' + "[" * 100_000,
    "[" * 100_000 + "]" * 100_000,
    '{"jobs": [{"job_id": 1, "job_state": "PENDING", "x": ' + "[" * 3000 + "]" * 3000 + "}]}",
    '{"jobs": [], "nodes": []}', "\ufeff{}", '{"jobs": [1, "a", null, true]}',
    '{"jobs": [{"job_id": 1e999}]}',
]
# fmt: on

PARTITIONS = (
    b"PartitionName=gpu MinNodes=0 MaxNodes=UNLIMITED\nPartitionName=onprem MinNodes=1 MaxNodes=4\n"
)


class FeedAdapter(SlurmAdapter):
    """The real adapter with its command runner answering what the commands would print."""

    def __init__(self, settings: SlurmSettings, output: bytes) -> None:
        super().__init__(settings, "fuzz")
        self.output = output
        self.updates: list[tuple[str, ...]] = []

    def _run(self, *args: str) -> bytes:
        if args[0] in ("squeue", "sinfo"):
            return self.output
        if args[:2] == ("scontrol", "show"):
            return PARTITIONS
        if args[:2] == ("scontrol", "update"):
            self.updates.append(args)
            return b""
        raise AssertionError(f"the fuzz adapter was asked to run {args}")


PLAIN = SlurmSettings(high_priority_min=1000, gpu_models={"a100": "A100"})
FEATURED = SlurmSettings(
    high_priority_min=1000,
    high_priority_qos=["urgent"],
    gpu_models={"a100": "A100"},
    feature_gpu_models={"a100": "A100", "h100": "H100"},
    feature_gpu_memory_gib={"gpu80g": 80.0},
)


@dataclass(frozen=True)
class Refuse:
    why: str


@dataclass(frozen=True)
class Demand:
    jobs: int
    gpus: int


class _NoClaimError(Exception):
    """The reference does not model this form."""


class _RefusedError(Exception):
    """The documented rules say the document must be refused."""


_REF_GRES = re.compile(r"(?:gres[:/])?gpu(?::([A-Za-z][A-Za-z0-9_.-]*))?(?::([0-9]+))?", re.ASCII)
MAX_GRES_TYPE = 128  # characters: docs/slurm.md
_REF_RANGE = re.compile(r"([0-9]+)(?:-([0-9]+)(?::([0-9]+))?)?", re.ASCII)


class _ConstantError(ValueError):
    """NaN or Infinity: not JSON."""


def _no_constant(name: str) -> float:
    raise _ConstantError(name)


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(text[:20])
    return value


def _ref_int(job: dict[str, Any], name: str, default: Any = None) -> int:
    value = job.get(name, default)
    if isinstance(value, dict):
        raise _NoClaimError(name)
    if type(value) is not int or not -(2**63) <= value <= 2**64 - 1:
        raise _RefusedError(f"{name} {str(value)[:40]} is not a 64-bit integer")
    return value


def _ref_str(job: dict[str, Any], name: str) -> str:
    value = job.get(name)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise _RefusedError(f"{name} is not a string")
    return value


def _ref_count(job: dict[str, Any], name: str) -> int:
    value = job.get(name)
    if value is None:
        return 1
    count = _ref_int(job, name)
    if count < 0:
        raise _RefusedError(f"{name} is negative")
    return 1 if count in (0, 2**32 - 2, 2**32 - 1) else count


def _ref_gpus(job: dict[str, Any], name: str) -> int:
    text = _ref_str(job, name)
    if not text:
        return 0
    match = _REF_GRES.fullmatch(text)
    if match is None:
        raise _NoClaimError(name)
    count = int(match[2]) if match[2] is not None else 1
    if count > 2**64 - 1:
        raise _RefusedError(f"{name} {text[:40]!r} is beyond 64 bits")
    if match[1] is not None and len(match[1]) > MAX_GRES_TYPE:
        raise _RefusedError(f"{name} names a gres type of {len(match[1])} characters")
    return count


def _ref_array(spec: str, throttle: int) -> int:
    """Tasks of an array record, by expanding its ranges: strictly ascending, within Slurm's
    largest array, else the record is malformed."""
    if spec == "":
        return 1
    body, percent, limit = spec.partition("%")
    spans: list[range] = []
    for part in body.split(","):
        match = _REF_RANGE.fullmatch(part)
        if match is None:
            raise _RefusedError(f"array range {spec[:40]!r}")
        first = int(match[1])
        last = int(match[2]) if match[2] else first
        step = int(match[3]) if match[3] else 1
        if last < first or step < 1 or last >= MAX_ARRAY_TASKS:
            raise _RefusedError(f"array range {spec[:40]!r}")
        span = range(first, last + 1, step)
        if spans and span[0] <= spans[-1][-1]:
            raise _RefusedError(f"array ranges out of order {spec[:40]!r}")
        spans.append(span)
    if percent and not re.fullmatch(r"[0-9]+", limit, re.ASCII):
        raise _RefusedError(f"array throttle {spec[:40]!r}")
    count = sum(len(span) for span in spans)
    cap = int(limit) if percent else throttle
    return min(count, cap) if cap > 0 else count


def reference_demand(text: str) -> Refuse | Demand | None:
    """The documented rules, read apart from the adapter (settings: PLAIN, partition limits as
    FeedAdapter's scontrol prints them). None: a form this reference does not model."""
    try:
        document = json.loads(text, parse_constant=_no_constant, parse_float=_finite_float)
    except _ConstantError as exc:
        return Refuse(f"{exc} is not JSON")
    except (ValueError, RecursionError):
        return None  # not JSON, or a number beyond a double: whether it matters is not modelled
    if not isinstance(document, dict):
        return Refuse("the document is not an object")
    if document.get("errors"):
        return Refuse("Slurm reported errors")
    jobs = document.get("jobs")
    if not isinstance(jobs, list):
        return Refuse("no jobs list")
    total = Demand(0, 0)
    unsure = False
    seen: set[int] = set()
    for job in jobs:
        try:
            found = _reference_job(job, seen)
        except _NoClaimError:
            unsure = True
            continue
        except _RefusedError as refused:
            return Refuse(str(refused))
        if found is not None:
            total = Demand(total.jobs + found.jobs, total.gpus + found.gpus)
    return None if unsure else total


def _reference_job(job: Any, seen: set[int]) -> Demand | None:
    if not isinstance(job, dict):
        raise _RefusedError("a job is not an object")
    state = job.get("job_state")
    if isinstance(state, str):
        pending = state == "PENDING"
    elif isinstance(state, list):
        pending = "PENDING" in state
    else:
        raise _RefusedError("job_state is not a state")
    if not pending:
        return None
    reason = _ref_str(job, "state_reason")
    if reason in DEFAULT_IGNORED_REASONS or reason.startswith(DEFAULT_IGNORED_REASON_PREFIXES):
        return None
    partition = _ref_str(job, "partition")
    nodes = _ref_count(job, "node_count")
    if nodes > MAX_NODES:
        return None
    whole = _ref_gpus(job, "tres_per_job")
    if whole:
        per_node = -(-whole // nodes)
    else:
        per_node = _ref_gpus(job, "tres_per_node")
        if not per_node:
            per_task = _ref_gpus(job, "tres_per_task")
            per_node = -(-per_task * _ref_count(job, "tasks") // nodes) if per_task else 0
    if per_node > MAX_GPUS_PER_NODE or per_node <= 0:
        return None
    if reason == "PartitionNodeLimit":
        limits: dict[str, tuple[int, int | None]] = {"gpu": (0, None), "onprem": (1, 4)}
        fits = False
        for name in partition.split(","):
            least, most = limits.get(name, (MAX_NODES + 1, 0))
            fits = fits or (least <= nodes and (most is None or nodes <= most))
        if not fits:
            return None
    _ref_str(job, "comment")
    _ref_int(job, "priority")
    copies = _ref_array(_ref_str(job, "array_task_string"), _ref_int(job, "array_max_tasks", 0))
    submitted = _ref_int(job, "submit_time")
    if not 0 <= submitted <= MAX_TIME:
        raise _RefusedError("submit_time is not a time")
    job_id = _ref_int(job, "job_id")
    if not 0 <= job_id < 2**32 or job_id in seen:
        raise _RefusedError(f"job_id {str(job_id)[:30]} is not one job's id")
    seen.add(job_id)
    return Demand(copies, copies * per_node * nodes)


def demand_problems(groups: Sequence[Any], records: int) -> str | None:
    """Why an accepted reading of a queue breaks the bounds every reading keeps, or None."""
    for group in groups:
        if not (isinstance(group.jobs, int) and 1 <= group.jobs <= MAX_ARRAY_TASKS * records):
            return f"a group of {group.jobs} jobs"
        if not 1 <= group.nodes <= MAX_NODES or group.gpus_per_job % group.nodes:
            return f"a job of {group.gpus_per_job} GPUs over {group.nodes} nodes"
        if not 1 <= group.gpus_per_job // group.nodes <= MAX_GPUS_PER_NODE:
            return f"a job of {group.gpus_per_job} GPUs over {group.nodes} nodes"
        if not (math.isfinite(group.oldest_submit_time) and group.oldest_submit_time >= 0):
            return f"submitted at {group.oldest_submit_time}"
        interval = group.checkpoint_interval_s
        if interval is not None and not (math.isfinite(interval) and 0 < interval <= 30 * 86400):
            return f"checkpoints every {interval} s"
        memory = group.min_gpu_memory_gib
        if memory is not None and not (math.isfinite(memory) and memory > 0):
            return f"needs {memory} GiB per GPU"
    return None


def _records(text: str) -> int:
    return max(1, text.count('"job_id"'))


class SlurmBoundary:
    name = "Slurm squeue --json / sinfo --json"

    def seeds(self) -> Sequence[tuple[str, str]]:
        return [
            ("squeue", _read("slurm/squeue.json")),
            ("squeue", _read("slurm/squeue-shapes.json")),
            ("sinfo", _read("slurm/sinfo.json")),
            ("sinfo", _read("slurm/sinfo-shapes.json")),
        ]

    def generate(self, rng: random.Random) -> tuple[str, str]:
        kind, text = rng.choice(self.seeds())
        roll = rng.random()
        if roll < 0.4:
            for _ in range(rng.randint(1, 3)):
                text = mutate_text(text, rng)
            return kind, text
        if roll < 0.93:
            return kind, self._structured(kind, text, rng)
        return kind, rng.choice(SCRATCH)

    def _structured(self, kind: str, text: str, rng: random.Random) -> str:
        document = json.loads(text)
        key, table = ("jobs", JOB_VALUES) if kind == "squeue" else ("nodes", NODE_VALUES)
        items = document[key]
        for _ in range(rng.randint(1, 4)):
            choice = rng.random()
            if choice < 0.75 and items:
                item = rng.choice(items)
                field = rng.choice(sorted(table))
                value = rng.choice(table[field])
                if value == "DUP":
                    value = rng.choice(items).get("job_id")
                item[field] = value
            elif choice < 0.85 and items:
                items.append(dict(rng.choice(items)))
            elif choice < 0.9 and items:
                items.remove(rng.choice(items))
            else:
                document.update(rng.choice(DOCUMENT_VALUES))
        return _dumps(document, rng)

    def check(self, data: object) -> Outcome:
        assert isinstance(data, tuple)
        kind, text = str(data[0]), str(data[1])
        output = text.encode("utf-8", "surrogatepass")
        if kind == "sinfo":
            return self._check_sinfo(output)
        plain = FeedAdapter(PLAIN, output)
        expected = reference_demand(text)
        outcome: Outcome
        try:
            groups = plain.read(NOW)
        except SourceError as exc:
            broken = _one_line(str(exc))
            if broken:
                return Outcome.wrong(broken)
            if isinstance(expected, Demand):
                return Outcome.wrong(f"refused a queue the rules read as {expected}: {exc}")
            outcome = Outcome.rejected(str(exc))
        else:
            problem = demand_problems(groups, _records(text))
            if problem:
                return Outcome.wrong(f"read as demand: {problem}")
            found = Demand(sum(g.jobs for g in groups), sum(g.gpus for g in groups))
            if isinstance(expected, Refuse):
                return Outcome.wrong(f"read as demand {found} although {expected.why}")
            if isinstance(expected, Demand) and found != expected:
                return Outcome.wrong(f"read as demand {found}; the rules read {expected}")
            outcome = Outcome.accepted()
        return self._check_more_readers(output, text) or outcome

    def _check_more_readers(self, output: bytes, text: str) -> Outcome | None:
        """The other readers of the same document: with features read, running jobs, and the
        jobs on one node (what drain counts)."""
        featured = FeedAdapter(FEATURED, output)
        try:
            groups = featured.read(NOW)
        except SourceError as exc:
            if broken := _one_line(str(exc)):
                return Outcome.wrong(broken)
        else:
            if problem := demand_problems(groups, _records(text)):
                return Outcome.wrong(f"read as demand with features: {problem}")
        try:
            by_node = featured.running_jobs_by_node()
        except SourceError as exc:
            if broken := _one_line(str(exc)):
                return Outcome.wrong(broken)
        else:
            for node, jobs in by_node.items():
                for job in jobs:
                    if not (node and 0 <= job.gpus <= MAX_GPUS_PER_NODE and job.nodes >= 1):
                        return Outcome.wrong(f"running job {job} on {node!r}")
                    if not (math.isfinite(job.started_at) and 0 < job.started_at <= MAX_TIME):
                        return Outcome.wrong(f"running job started at {job.started_at}")
                    if not job.id.isdigit():
                        return Outcome.wrong(f"running job id {job.id[:40]!r}")
        try:
            ids = featured._jobs_on("i-0abc123")
        except SourceError as exc:
            if broken := _one_line(str(exc)):
                return Outcome.wrong(broken)
        else:
            if not all(i.isdigit() for i in ids):
                return Outcome.wrong(f"jobs on a node named by ids {ids[:3]}")
        return None

    def _check_sinfo(self, output: bytes) -> Outcome:
        adapter = FeedAdapter(FEATURED, output)
        try:
            reading = adapter.read_nodes(NOW)
        except SourceError as exc:
            if broken := _one_line(str(exc)):
                return Outcome.wrong(broken)
            outcome = Outcome.rejected(str(exc))
        else:
            for node in reading.onprem:
                if not (node.name and 0 <= node.gpus_allocated <= node.gpus <= MAX_GPUS_PER_NODE):
                    return Outcome.wrong(f"on-prem node {node}")
            for name, usage in reading.cloud.items():
                if not (name and 0 <= usage.gpus_allocated <= MAX_GPUS_PER_NODE):
                    return Outcome.wrong(f"cloud node {name!r} with {usage}")
            outcome = Outcome.accepted()
        try:
            adapter.apply_placement(Placement(spot_safe_onprem=OnPremUse.FIRST))
        except SourceError as exc:
            if broken := _one_line(str(exc)):
                return Outcome.wrong(broken)
        for update in adapter.updates:
            names = update[2].removeprefix("nodename=").split(",")
            if not all(re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", n) for n in names):
                return Outcome.wrong(f"scontrol asked to update nodes {update[2][:80]!r}")
        return outcome

    def close(self) -> None:
        """Nothing to release."""


# --------------------------------------------------------------------------------------------
# Prometheus: exposition text, PromQL answers, the idle state

GOOD_HOST = "good-node"
GOOD_TEXT = (
    "# TYPE DCGM_FI_DEV_GPU_UTIL gauge\n"
    f'DCGM_FI_DEV_GPU_UTIL{{gpu="0",UUID="GPU-g0",Hostname="{GOOD_HOST}"}} 97\n'
    f'DCGM_FI_DEV_GPU_UTIL{{gpu="1",UUID="GPU-g1",Hostname="{GOOD_HOST}"}} 0\n'
).encode()
# fmt: off
NUMBERS = [
    "NaN", "+Inf", "-Inf", "-1", "1e308", "1e999", "2.5", "0", "100", "100.0001", "-0", "1" * 400,
    "1e-400", "50", "17000000", "16777216",
]
GARBAGE = ["abc", "٣", "1_000", "0x10", "Infinity", "inf", "1,5", "--1"]
VALUES = NUMBERS + GARBAGE
GOOD_STAMPS = [
    "", str(int(NOW * 1000)), str(int((NOW - 3600) * 1000)), str(int((NOW + 10**6) * 1000)),
    str(int((NOW + 30) * 1000)), str(int((NOW + 61) * 1000)), "9" * 19, "-5", "0",
    "-" + "9" * 19,
]
STAMPS = [*GOOD_STAMPS, "9" * 30, "1e3", "٣", "12.5", "1_000"]
HOSTS = ["h1", "h2", "h3", GOOD_HOST, 'a\\"b', "x" * 2000, "é", "a\\nb"]
# fmt: on


def _exposition_line(rng: random.Random) -> str:
    name = rng.choice(["DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_GPU_UTILX"])
    labels = [f'gpu="{rng.randrange(3)}"', f'Hostname="{rng.choice(HOSTS)}"']
    if rng.random() < 0.1:
        labels.pop(rng.randrange(2))
    if rng.random() < 0.05:
        labels.append(rng.choice(["x=y", 'broken="', 'a="\\q"']))
    garbage = rng.random() < 0.15
    stamp = rng.choice(STAMPS if garbage else GOOD_STAMPS) if rng.random() < 0.5 else ""
    value = (
        rng.choice(VALUES if garbage else NUMBERS)
        if rng.random() < 0.7
        else f"{rng.uniform(0, 100):.2f}"
    )
    return f"{name}{{{','.join(labels)}}} {value} {stamp}".rstrip()


@dataclass(frozen=True)
class _Read:
    """What the documented rules say the scrape of one text gives: each node kept with its
    readings (host -> gpu -> util), or None when the text as a whole must fail."""

    kept: dict[str, dict[str, float]] | None


_WANTED_LINE = re.compile(r"(DCGM_FI_DEV_GPU_UTIL|DCGM_FI_DEV_FB_USED)([^A-Za-z0-9_:].*|)")
_STRICT_LABEL = r'[A-Za-z_][A-Za-z0-9_]*="(?:[^"\\\n]|\\[\\"n])*"'
_STRICT_LINE = re.compile(
    r"(?:DCGM_FI_DEV_GPU_UTIL|DCGM_FI_DEV_FB_USED)"
    rf"(?:\{{(?:{_STRICT_LABEL}(?:,{_STRICT_LABEL})*,?)?\}})? +"
    r"(?:[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?|[+-]?Inf|NaN)"
    r"(?: +-?[0-9]{1,19})? *\r?"
)


def reference_exposition(text: str) -> _Read | None:
    """prometheus_client's parser plus the documented rules. None (no claim) where the text's
    series lines are not in the strict syntax (a lax parser reads them its own way: leading
    blanks, float timestamps, three fields) or the parser refuses the text."""
    for line in text.split("\n"):
        stripped = line.strip()
        if _WANTED_LINE.fullmatch(stripped) and not (
            line.startswith(stripped[:20]) and _STRICT_LINE.fullmatch(line)
        ):
            return None
    try:
        families = list(text_string_to_metric_families(text))
    except Exception:  # the reference parser refusing the text is "no claim", not a finding
        return None
    kept: dict[str, dict[str, float]] = {}
    bad: set[str] = set()
    seen: set[tuple[str, str, str]] = set()
    for family in families:
        for sample in family.samples:
            if sample.name not in ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED"):
                continue
            host = sample.labels.get("Hostname")
            if not host or any(len(v) > 1024 for v in sample.labels.values()):
                return _Read(None)
            key = (sample.name, host, sample.labels.get("gpu", ""))
            if key in seen:
                return None  # a repeated series: which line wins is not the rule's business
            seen.add(key)
            try:
                value = float(sample.value)
                stamp = None if sample.timestamp is None else float(sample.timestamp)
            except OverflowError:
                return None  # the lax parser read a 400-digit number as an int
            limit = 100.0 if sample.name == "DCGM_FI_DEV_GPU_UTIL" else MAX_FB_MIB
            if (
                "gpu" not in sample.labels
                or not math.isfinite(value)
                or not 0 <= value <= limit
                or (stamp is not None and not 0 <= stamp <= NOW + FUTURE_SKEW_S)
            ):
                bad.add(host)
                continue
            if sample.name == "DCGM_FI_DEV_GPU_UTIL":
                kept.setdefault(host, {})[sample.labels["gpu"]] = value
    return _Read({h: gpus for h, gpus in kept.items() if h not in bad})


def tracker_problem(samples: Sequence[GpuSample], now: float) -> str | None:
    """After any readings, a busy reading taken now is never ignored: every host reads busy,
    or unknown, or idle only since that reading (never since before it)."""
    tracker = IdleTracker(5.0, 600.0, 180.0)
    tracker.observe(samples)
    tracker.nodes(now)
    gpus = {(s.host, s.gpu) for s in samples}
    busy_at = now + 1.0
    tracker.observe([GpuSample(host, gpu, 90.0, at=busy_at) for host, gpu in gpus])
    for host, reading in tracker.nodes(busy_at).items():
        if reading.idle_since is not None and reading.idle_since < busy_at:
            return f"host {host[:40]!r} reads idle since {reading.idle_since} after a busy reading"
        if not (math.isfinite(reading.util_pct) and 0 <= reading.util_pct <= 100):
            return f"host {host[:40]!r} reads {reading.util_pct} % used"
    return None


def sample_problem(sample: GpuSample, now: float) -> str | None:
    if not (sample.host and 0.0 <= sample.util_pct <= 100.0):
        return f"a reading {sample}"
    if not (math.isfinite(sample.at) and 0.0 <= sample.at <= now + FUTURE_SKEW_S):
        return f"a reading taken at {sample.at}"
    used = sample.memory_used_mib
    if used is not None and not (math.isfinite(used) and 0 <= used <= MAX_FB_MIB):
        return f"a reading of {used} MiB used"
    return None


def _vector(rows: list[tuple[dict[str, Any], Any, Any]]) -> dict[str, Any]:
    return {
        "status": "success",
        "data": {
            "resultType": "vector",
            "result": [{"metric": labels, "value": [at, value]} for labels, at, value in rows],
        },
    }


# fmt: off
ANSWER_TIMES: list[Any] = [
    NOW, NOW - 10, NOW - 1000, NOW + 10**9, 1e300, "x", None, True, -1, RAW, NOW + 30,
]
ANSWER_VALUES: list[Any] = [*VALUES, 5, None, True, ["1"], RAW]
LABEL_SETS: list[Any] = [
    {"queue": "a"}, {"queue": "b"}, {}, {"queue": 5}, {"a": None}, {"queue": "x" * 10_000},
    {"Hostname": "h1", "gpu": "0"}, {"Hostname": "h2", "gpu": "1"}, {"gpu": "0"}, 5, RAW,
]
ANSWER_SHAPES: list[Any] = [
    {"status": "error", "errorType": "bad_data", "error": "x\n" * 50_000},
    {"status": "error", "errorType": None, "error": None},
    {"status": "success", "data": None},
    {"status": "success"},
    {"status": "ok", "data": {"resultType": "vector", "result": []}},
    {"status": "success", "data": {"resultType": "matrix", "result": []}},
    {"status": "success", "data": {"resultType": "scalar", "result": [NOW, "3"]}},
    {"status": "success", "data": {"resultType": "scalar", "result": [NOW, "NaN"]}},
    {"status": "success", "data": {"resultType": "scalar", "result": "3"}},
    {"status": "success", "data": {"resultType": "vector", "result": {}}},
    {"status": "success", "data": {"resultType": "vector", "result": RAW}},
    {"status": "success", "data": {"resultType": "vector", "result": []}},
    [],
    RAW,
]
# fmt: on
QUEUE_VARIANTS: list[dict[str, Any]] = [
    {},
    {"empty_result": "zero", "partition_label": "queue"},
    {"gpus_per_unit": 4, "nodes": 2, "empty_result": "zero"},
]


def _answer_bytes(rng: random.Random, labels: Sequence[Any], clean: bool = False) -> bytes:
    """An API answer: a hostile shape, a huge vector, or a vector with at most one hostile
    row (none when ``clean``), sometimes mutated as text."""
    roll = 1.0 if clean else rng.random()
    if roll < 0.15:
        return _dumps(rng.choice(ANSWER_SHAPES), rng).encode()
    if roll < 0.17:
        row = b'{"value":[' + str(int(NOW)).encode() + b',"1"]},'
        return (
            b'{"status":"success","data":{"resultType":"vector","result":['
            + row * rng.choice([1000, MAX_SERIES])
            + b'{"value":[1,"1"]}]}}'
        )
    rows = []
    hostile = rng.randrange(6) if not clean and rng.random() < 0.6 else -1
    for index in range(rng.randint(1, 5)):
        labels_of = rng.choice(labels)
        if index == hostile:
            at = NOW if rng.random() < 0.5 else rng.choice(ANSWER_TIMES)
            value = rng.choice(ANSWER_VALUES)
        else:
            at, value = NOW - rng.choice([0, 5]), f"{rng.uniform(0, 99):.3f}"
            labels_of = labels_of if isinstance(labels_of, dict) else {}
        rows.append((labels_of, at, value))
    text = _dumps(_vector(rows), rng)
    if not clean and rng.random() < 0.2:
        text = mutate_text(text, rng)
    return text.encode("utf-8", "surrogatepass")


def reference_queue(body: bytes, variant: dict[str, Any]) -> Refuse | Demand | None:
    """The API answer read apart from the source, under the documented rules."""
    try:
        answer = json.loads(body, parse_constant=_no_constant)
    except _ConstantError:
        return Refuse("JSON has no NaN or Infinity")
    except (ValueError, RecursionError):
        return None
    if not isinstance(answer, dict) or answer.get("status") != "success":
        return Refuse("not a successful answer")
    data = answer.get("data")
    if not isinstance(data, dict) or data.get("resultType") not in ("vector", "scalar"):
        return Refuse("not an instant vector or scalar")
    result = data.get("result")
    rows: list[tuple[Any, Any]]
    if data["resultType"] == "scalar":
        rows = [({}, result)]
    elif isinstance(result, list) and all(isinstance(r, dict) for r in result):
        rows = [(r.get("metric", {}), r.get("value")) for r in result]
    else:
        return Refuse("the vector is not a list of samples")
    if len(rows) > MAX_SERIES:
        return Refuse("too many series")
    units = variant.get("gpus_per_unit", 1)
    jobs: dict[Any, int] = {}
    for labels, pair in rows:
        if not (isinstance(labels, dict) and all(isinstance(v, str) for v in labels.values())):
            return Refuse("labels are not strings")
        if not (isinstance(pair, list) and len(pair) == 2 and isinstance(pair[1], str)):
            return Refuse("a value is not [time, text]")
        at, text = pair
        if isinstance(at, bool) or not isinstance(at, int | float):
            return Refuse("a time is not a number")
        if isinstance(at, int) and abs(at) > 1e308:
            return Refuse("a time beyond a double")
        if not math.isfinite(at):
            return Refuse("a time is not a finite number")
        if not re.fullmatch(
            r"[+-]?(\d+(\.\d*)?([eE][+-]?\d+)?|\.\d+([eE][+-]?\d+)?)", text, re.ASCII
        ):
            return Refuse(f"value {text[:20]!r} is not a finite number")
        value = float(text)
        if not (math.isfinite(value) and 0 <= value <= MAX_JOBS) or abs(NOW - at) > 120:
            return Refuse(f"value {text[:20]!r} at {at} is not a fresh count")
        key = labels.get("queue") if "partition_label" in variant else None
        if "partition_label" in variant and key is None:
            return Refuse("a series without the partition label")
        jobs[key] = jobs.get(key, 0) + math.ceil(value)
    if not rows and variant.get("empty_result", "error") == "error":
        return Refuse("no series")
    if sum(jobs.values()) > MAX_JOBS:
        return Refuse("more jobs than any queue")
    return Demand(sum(jobs.values()), sum(jobs.values()) * units)


class PrometheusBoundary:
    name = "Prometheus exposition and PromQL answers"

    def __init__(self) -> None:
        self._server: AnswerServer | None = None
        self._scraper: ScrapeTelemetrySource | None = None

    def seeds(self) -> Sequence[tuple[str, bytes]]:
        texts = [
            _read("exposition/two-h100.txt"),
            _read("dcgm/agent-fake-2gpu.txt"),
            _read("dcgm/dcgm-exporter-sample.txt"),
        ]
        return [("exposition", text.encode()) for text in texts]

    def generate(self, rng: random.Random) -> tuple[Any, ...]:
        roll = rng.random()
        if roll < 0.45:
            _, seed = rng.choice(self.seeds())
            text = seed.decode()
            choice = rng.random()
            if choice < 0.55:
                for _ in range(rng.randint(1, 3)):
                    text = mutate_text(text, rng)
            elif choice < 0.95:
                lines = text.splitlines()
                for _ in range(rng.randint(1, 6)):
                    lines.insert(rng.randrange(len(lines) + 1), _exposition_line(rng))
                text = "\n".join(lines) + "\n"
            else:
                return ("exposition", bytes(rng.randrange(256) for _ in range(rng.randrange(200))))
            return ("exposition", text.encode("utf-8", "surrogatepass"))
        if roll < 0.7:
            variant = rng.randrange(len(QUEUE_VARIANTS))
            return ("queue", _answer_bytes(rng, [*LABEL_SETS[:6], 5, RAW]), variant)
        if roll < 0.9:
            gpu_labels = [
                {"Hostname": "h1", "gpu": "0", "UUID": "GPU-1"},
                {"Hostname": "h1", "gpu": "1"},
                {"Hostname": "h2", "gpu": "0"},
                {"Hostname": "h3", "gpu": "0", "__name__": "DCGM_FI_DEV_GPU_UTIL"},
            ]
            hostile = rng.randrange(4)
            return (
                "gpus",
                _answer_bytes(rng, [*gpu_labels, {"gpu": "0"}], clean=hostile != 0),
                _answer_bytes(rng, gpu_labels, clean=hostile != 1),
                _answer_bytes(rng, gpu_labels, clean=hostile != 2),
            )
        rows = []
        for _ in range(rng.randint(1, 8)):
            at = rng.choice([NOW - 5, NOW, NOW + 10**6, math.inf, math.nan, 1e300, -1.0, NOW + 59])
            util = rng.choice([0.0, 3.0, 90.0, math.nan, -1.0, 150.0, math.inf])
            rows.append((rng.choice(["h1", "h2"]), rng.choice(["0", "1"]), util, at))
        return ("tracker", tuple(rows))

    def _serve(self) -> AnswerServer:
        if self._server is None:
            self._server = AnswerServer()
            self._server.answer("/good/metrics", GOOD_TEXT)
        return self._server

    def check(self, data: object) -> Outcome:
        kind = data[0]  # type: ignore[index]
        if kind == "exposition":
            return self._check_exposition(data[1])  # type: ignore[index]
        if kind == "queue":
            return self._check_queue(data[1], QUEUE_VARIANTS[data[2]])  # type: ignore[index]
        if kind == "gpus":
            return self._check_gpus(*data[1:])  # type: ignore[index]
        samples = [GpuSample(h, g, u, at=a) for h, g, u, a in data[1]]  # type: ignore[index]
        problem = tracker_problem(samples, NOW)
        return Outcome.wrong(problem) if problem else Outcome.accepted()

    def _check_exposition(self, body: bytes) -> Outcome:
        server = self._serve()
        server.answer("/bad/metrics", body)
        good, bad = server.url("/good/metrics"), server.url("/bad/metrics")
        if self._scraper is None:
            self._scraper = ScrapeTelemetrySource(
                ScrapeSettings(targets=(good, bad), timeout_s=10.0), "fuzz", ManualClock(NOW)
            )
        try:
            samples = self._scraper.read_gpus(NOW)
        except SourceError as exc:
            return Outcome.wrong(f"the good target was lost with the bad one: {exc}")
        kept = {(s.gpu, s.util_pct) for s in samples if s.host == GOOD_HOST}
        if not {("0", 97.0), ("1", 0.0)} <= kept:
            return Outcome.wrong(f"the good target's readings were lost: {sorted(kept)}")
        for sample in samples:
            if problem := sample_problem(sample, NOW):
                return Outcome.wrong(problem)
        if problem := tracker_problem(samples, NOW):
            return Outcome.wrong(problem)
        status = self._scraper.target_status()[bad]
        if status is not None and (broken := _one_line(status)):
            return Outcome.wrong(broken)
        try:
            text = body.decode("utf-8")
        except UnicodeDecodeError:
            return Outcome.rejected(status or "")
        expected = reference_exposition(text)
        read: dict[str, dict[str, float]] = {}
        for sample in samples:
            if sample.host != GOOD_HOST:
                read.setdefault(sample.host, {})[sample.gpu] = sample.util_pct
        if expected is not None and GOOD_HOST not in text:
            if expected.kept is None and read:
                return Outcome.wrong(f"kept {sorted(read)[:3]} from a text that must fail")
            if expected.kept is not None and read != expected.kept:
                return Outcome.wrong(f"kept {_brief(read)}; the rules keep {_brief(expected.kept)}")
        return Outcome.rejected(status) if status else Outcome.accepted()

    def _check_queue(self, body: bytes, variant: dict[str, Any]) -> Outcome:
        server = self._serve()
        server.answer("/queue/api/v1/query", body)
        settings = PrometheusQueueSettings(url=server.url("/queue"), query="q", **variant)
        expected = reference_queue(body, variant)
        try:
            groups = PrometheusQueueSource(settings, "fuzz").read(NOW)
        except SourceError as exc:
            if broken := _one_line(str(exc)):
                return Outcome.wrong(broken)
            if isinstance(expected, Demand):
                return Outcome.wrong(f"refused an answer the rules read as {expected}: {exc}")
            return Outcome.rejected(str(exc))
        for group in groups:
            if not 1 <= group.jobs <= MAX_JOBS or group.gpus_per_job != settings.gpus_per_unit:
                return Outcome.wrong(f"read as {group.jobs} jobs of {group.gpus_per_job} GPUs")
        found = Demand(sum(g.jobs for g in groups), sum(g.gpus for g in groups))
        if isinstance(expected, Refuse):
            return Outcome.wrong(f"read as demand {found} although {expected.why}")
        if isinstance(expected, Demand) and found != expected:
            return Outcome.wrong(f"read as demand {found}; the rules read {expected}")
        return Outcome.accepted()

    def _check_gpus(self, utilisation: bytes, stamps: bytes, memory: bytes) -> Outcome:
        server = self._serve()
        path = "/gpus/api/v1/query"
        server.answer(path, utilisation, query="DCGM_FI_DEV_GPU_UTIL")
        server.answer(path, stamps, query="timestamp(DCGM_FI_DEV_GPU_UTIL)")
        server.answer(path, memory, query="DCGM_FI_DEV_FB_USED")
        settings = PrometheusTelemetrySettings(url=server.url("/gpus"))
        try:
            samples = PrometheusTelemetrySource(settings, "fuzz").read_gpus(NOW)
        except SourceError as exc:
            if broken := _one_line(str(exc)):
                return Outcome.wrong(broken)
            return Outcome.rejected(str(exc))
        if len({(s.host, s.gpu) for s in samples}) != len(samples):
            return Outcome.wrong("a GPU read twice")
        for sample in samples:
            if problem := sample_problem(sample, NOW):
                return Outcome.wrong(problem)
        if problem := tracker_problem(samples, NOW):
            return Outcome.wrong(problem)
        return Outcome.accepted()

    def close(self) -> None:
        if self._scraper is not None:
            self._scraper.close()
        if self._server is not None:
            self._server.close()


def _brief(read: dict[str, dict[str, float]]) -> str:
    return str({h[:20]: g for h, g in list(read.items())[:4]})[:200]


BOUNDARIES = [SlurmBoundary(), PrometheusBoundary()]
