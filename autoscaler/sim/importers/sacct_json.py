"""``sacct --json``: Slurm's accounting as JSON (21.08 and later; needs slurmdbd).

Read: ``jobs[].job_id``, ``array.job_id``/``array.task_id``, ``het.job_id``/``het.job_offset``,
``state.current``, ``time.submission``/``start``/``end``/``elapsed``, ``tres.allocated`` and
``tres.requested`` (``type`` ``gres``, ``name`` ``gpu`` or ``gpu:<type>``, ``count``),
``allocation_nodes``, ``partition``, ``account``, ``user``, ``qos`` and ``cluster``; the rest
(steps included) is skipped without being built. Both number forms are read: 22.05's plain
integers (0 for "not set") and the ``{"set": ..., "infinite": ..., "number": ...}`` objects of
later releases, as is a state given as text (22.05) or as a list of flags (later).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec

from autoscaler.model.csvfile import EARLIEST, LATEST
from autoscaler.sim.importers.jsonfile import Reader, decode, shown
from autoscaler.sim.importers.sacct import Gpus, Record, gpus_from_tres

WHAT = "the output of sacct --json (an object with a jobs list)"
# Slurm's integers are at most 64 bits; a job id, array task or node count beyond these is
# not Slurm's.
MAX_ID = 2**32
MAX_NODES = 1_000_000
_MAX_TEXT = 256
_U = msgspec.UNSET


class _Job(msgspec.Struct):
    """The fields of a job read here; msgspec skips the others (steps are most of the bytes)."""

    job_id: Any = _U
    array: Any = _U
    het: Any = _U
    state: Any = _U
    time: Any = _U
    tres: Any = _U
    allocation_nodes: Any = _U
    partition: Any = _U
    account: Any = _U
    user: Any = _U
    qos: Any = _U
    cluster: Any = _U


class _Document(msgspec.Struct):
    jobs: list[_Job] = msgspec.field(default_factory=list)
    errors: Any = _U


def read_sacct_json(path: Path) -> Iterator[Record]:
    document = decode(path, WHAT, _Document)
    data = document.data
    if not isinstance(data, _Document):
        raise document.error((), f"expected {WHAT}")
    root = Reader(document, {"errors": data.errors}, ())
    errors = root.optional("errors")
    if errors is not None and errors.value is not _U:
        for error in errors.items():
            raise error.error(f"sacct reported an error: {shown(_error_text(error.value))}")
    for index, job in enumerate(data.jobs):
        loc = ("jobs", index)
        if not isinstance(job, _Job):
            raise document.error(loc, "expected a job (an object)")
        fields = {k: v for k, v in msgspec.structs.asdict(job).items() if v is not _U}
        yield _record(Reader(document, fields, loc))


def _error_text(value: Any) -> str:
    if isinstance(value, dict):
        for key in ("description", "error", "message"):
            if isinstance(value.get(key), str):
                return str(value[key])
    return str(value)


def _number(reader: Reader | None, *, maximum: float) -> float | None:
    """A Slurm number: an integer (0 is "not set" only where the caller says so) or the object
    form, whose ``set`` false or ``infinite`` true mean none."""
    if reader is None:
        return None
    if isinstance(reader.value, dict):
        flag = reader.optional("set")
        if flag is not None and flag.value is False:
            return None
        infinite = reader.optional("infinite")
        if infinite is not None and infinite.value is True:
            return None
        inner = reader.optional("number")
        return _number(inner, maximum=maximum) if inner is not None else None
    value = reader.number()
    if value < 0 or value > maximum or not value.is_integer():
        raise reader.error(f"expected a whole number from 0 to {maximum:g}, got {shown(value)}")
    return value


def _time(reader: Reader | None) -> float | None:
    value = _number(reader, maximum=LATEST)
    if value is None or value == 0:
        return None
    if not EARLIEST <= value < LATEST:
        assert reader is not None
        raise reader.error(f"expected a time between 1970 and 2100, got {shown(value)}")
    return value


def _text(reader: Reader | None) -> str:
    if reader is None:
        return ""
    value = reader.text().strip()
    if len(value) > _MAX_TEXT or not value.isprintable():
        raise reader.error(f"expected printable text of at most {_MAX_TEXT} characters")
    return value


def _state(reader: Reader) -> str:
    if isinstance(reader.value, list):
        states = [_text(item) for item in reader.items()]
        return states[0] if states else ""
    if isinstance(reader.value, dict):
        return _state(reader.get("current"))
    return _text(reader)


def _tres(reader: Reader | None) -> Gpus | None:
    if reader is None:
        return None
    entries: list[tuple[str, str]] = []
    for item in reader.items():
        kind = item.value.get("type") if isinstance(item.value, dict) else None
        if isinstance(kind, str) and kind != "gres":
            entries.append((kind, "0"))  # something was allocated, not a GPU (cpu, mem...)
            continue
        kind = _text(item.get("type"))
        name = _text(item.optional("name"))
        count = _number(item.optional("count"), maximum=2**63)
        if not (name == "gpu" or name.startswith("gpu:")):
            entries.append((kind, "0"))
            continue
        entries.append((f"gres/{name}", str(int(count or 0))))
    return gpus_from_tres(entries, reader.error)


def _job_id(job: Reader) -> str:
    raw = _number(job.get("job_id"), maximum=MAX_ID)
    if not raw:
        raise job.error("expected a job id above 0", "job_id")
    job_id = str(int(raw))
    array = job.optional("array")
    if array is not None:
        parent = _number(array.optional("job_id"), maximum=MAX_ID)
        task = _number(array.optional("task_id"), maximum=MAX_ID)
        if parent and task is not None:
            job_id = f"{int(parent)}_{int(task)}"
    het = job.optional("het")
    if het is not None:
        leader = _number(het.optional("job_id"), maximum=MAX_ID)
        offset = _number(het.optional("job_offset"), maximum=MAX_ID)
        if leader and offset is not None:
            job_id = f"{int(leader)}+{int(offset)}"
    return job_id


def _record(job: Reader) -> Record:
    job_id = _job_id(job)
    times = job.get("time")
    submit = _time(times.get("submission"))
    if submit is None:
        raise times.error("expected the time the job was submitted, got none", "submission")
    tres = job.get("tres")
    allocated = _tres(tres.optional("allocated"))
    requested = _tres(tres.optional("requested")) or Gpus(0)
    nodes = _number(job.optional("allocation_nodes"), maximum=MAX_NODES)
    elapsed = _number(times.optional("elapsed"), maximum=LATEST)
    start = _time(times.optional("start"))
    return Record(
        job_id=job_id,
        cluster=_text(job.optional("cluster")),
        state=_state(job.get("state")),
        submit=submit,
        start=start,
        end=_time(times.optional("end")),
        elapsed=elapsed if start is not None else None,
        allocated=allocated,
        requested=requested,
        nodes=int(nodes) if nodes else None,
        partition=_text(job.optional("partition")),
        account=_text(job.optional("account")),
        user=_text(job.optional("user")),
        qos=_text(job.optional("qos")),
    )
