"""``sacct -P`` (``--parsable2``; ``-p`` too) text: Slurm's accounting where ``--json`` is not
available (before 21.08, or without slurmdbd's JSON plugins).

The header line names the fields, so their order is free; these are needed::

    sacct -a -X -D -P -S 2024-01-01 -E now \\
      --format=JobID,State,Submit,Start,End,ElapsedRaw,AllocTRES,ReqTRES,AllocNodes,Partition,Account,QOS,User,Cluster

``JobID``, ``State``, ``Submit``, ``Start``, ``End``, ``AllocTRES`` and ``ReqTRES`` are
required; ``ElapsedRaw`` (or ``Elapsed``), ``AllocNodes`` (or ``NNodes``), ``Partition``,
``Account``, ``QOS``, ``User`` and ``Cluster`` are read when given. Times are Slurm's
(``2024-01-01T12:00:00``, local time of the machine that ran sacct: say which zone with
``--timezone``) or epoch seconds (``SLURM_TIME_FORMAT=%s sacct ...``); ``Unknown`` and ``None``
mean no time. Job steps (``123.batch``, without ``-X``) are not jobs and are passed over. A job
name may hold ``|``, so ``JobName`` is best left out of the format: a line with more fields than
the header is refused, naming it.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import UTC, datetime, tzinfo
from pathlib import Path

from autoscaler.model.csvfile import EARLIEST, LATEST
from autoscaler.model.errors import InputError
from autoscaler.sim.importers.jsonfile import read_text, shown
from autoscaler.sim.importers.sacct import Gpus, Record, gpus_from_tres

REQUIRED = ("JobID", "State", "Submit", "Start", "End", "AllocTRES", "ReqTRES")
OPTIONAL = (
    "ElapsedRaw",
    "Elapsed",
    "AllocNodes",
    "NNodes",
    "Partition",
    "Account",
    "QOS",
    "User",
    "Cluster",
)
FORMAT = (
    "JobID,State,Submit,Start,End,ElapsedRaw,AllocTRES,ReqTRES,AllocNodes,Partition,Account,"
    "QOS,User,Cluster"
)
_NO_TIME = frozenset({"", "unknown", "none", "n/a", "0"})
_ELAPSED = re.compile(r"^(?:(\d{1,5})-)?(?:(\d{1,2}):)?(\d{1,2}):(\d{1,2})(?:\.\d+)?$")
_EPOCH = re.compile(r"^\d{1,12}$")
_TRES = re.compile(r"^[A-Za-z0-9_/:.+-]{1,200}=")
_MAX_TEXT = 256


def read_sacct_text(path: Path, zone: tzinfo = UTC) -> Iterator[Record]:
    """The records of ``path``, one per job line; steps are passed over."""
    source = str(path)
    lines = read_text(path).splitlines()
    header_at = next((i for i, line in enumerate(lines) if line.strip()), None)
    if header_at is None:
        raise InputError(source, "empty; expected the output of sacct -P with its header line")
    names = lines[header_at].split("|")
    if len(names) > 1 and names[-1] == "":
        names = names[:-1]  # sacct -p ends every line with the delimiter
    index = _header(source, header_at + 1, names)
    for number, line in enumerate(lines[header_at + 1 :], start=header_at + 2):
        if not line.strip():
            continue
        fields = line.split("|")
        if len(fields) == len(names) + 1 and fields[-1] == "":
            fields = fields[:-1]
        if len(fields) != len(names):
            raise InputError(
                f"{source}:{number}",
                f"expected {len(names)} fields separated by '|' as the header has, got "
                f"{len(fields)} (a job name holding '|'? leave JobName out of --format)",
            )
        row = _Row(f"{source}:{number}", fields, index, zone)
        job_id = row.text("JobID")
        if not job_id:
            raise row.error("JobID", "expected a job id, got an empty value")
        if "." in job_id:
            continue  # a step (123.batch, 123.0): its job has its own line
        yield row.record(job_id)


def _header(source: str, line: int, names: list[str]) -> dict[str, int]:
    index: dict[str, int] = {}
    for position, name in enumerate(names):
        key = name.strip().lower()
        if key in index:
            raise InputError(f"{source}:{line}", f"the field {shown(name)} appears twice")
        index[key] = position
    missing = [n for n in REQUIRED if n.lower() not in index]
    if missing:
        raise InputError(
            f"{source}:{line}",
            f"missing field(s) {', '.join(missing)} in the header line; run sacct -P "
            f"--format={FORMAT} (with its header: no -n)",
        )
    return index


class _Row:
    __slots__ = ("fields", "index", "where", "zone")

    def __init__(self, where: str, fields: list[str], index: dict[str, int], zone: tzinfo) -> None:
        self.where = where
        self.fields = fields
        self.index = index
        self.zone = zone

    def error(self, name: str, message: str) -> InputError:
        return InputError(self.where, message, field=name)

    def has(self, name: str) -> bool:
        return name.lower() in self.index

    def text(self, name: str) -> str:
        position = self.index.get(name.lower())
        value = self.fields[position].strip() if position is not None else ""
        if len(value) > _MAX_TEXT or not value.isprintable():
            raise self.error(name, f"expected printable text of at most {_MAX_TEXT} characters")
        return value

    def time(self, name: str) -> float | None:
        raw = self.text(name)
        if raw.lower() in _NO_TIME:
            return None
        if _EPOCH.match(raw):
            seconds = float(raw)
        else:
            try:
                moment = datetime.fromisoformat(raw)
            except ValueError:
                raise self.error(
                    name,
                    f"expected a time such as 2024-01-01T12:00:00 or epoch seconds, got "
                    f"{shown(raw)}",
                ) from None
            if moment.tzinfo is None:
                moment = moment.replace(tzinfo=self.zone)
            try:
                seconds = moment.timestamp()
            except (OverflowError, ValueError, OSError):
                seconds = -1.0
        if not EARLIEST <= seconds < LATEST:
            raise self.error(name, f"expected a time between 1970 and 2100, got {shown(raw)}")
        return seconds

    def count(self, name: str, raw: str | None = None) -> int | None:
        raw = self.text(name) if raw is None else raw
        if not raw:
            return None
        if not raw.isascii() or not raw.isdigit() or len(raw) > 9:
            raise self.error(name, f"expected a whole number, got {shown(raw)}")
        return int(raw)

    def elapsed(self) -> float | None:
        if self.has("ElapsedRaw") and self.text("ElapsedRaw"):
            raw = self.text("ElapsedRaw")
            if not raw.isascii() or not raw.isdigit() or len(raw) > 11:
                raise self.error("ElapsedRaw", f"expected whole seconds, got {shown(raw)}")
            return float(raw)
        if self.has("Elapsed") and self.text("Elapsed"):
            raw = self.text("Elapsed")
            found = _ELAPSED.match(raw)
            if not found:
                raise self.error(
                    "Elapsed", f"expected [days-]hours:minutes:seconds, got {shown(raw)}"
                )
            days, hours, minutes, seconds = (int(g) if g else 0 for g in found.groups())
            return float(((days * 24 + hours) * 60 + minutes) * 60 + seconds)
        return None

    def tres(self, name: str) -> list[tuple[str, str]]:
        raw = self.text(name)
        if not raw:
            return []
        entries: list[tuple[str, str]] = []
        for item in raw.split(","):
            if not _TRES.match(item):
                raise self.error(
                    name, f"expected name=count entries separated by ',', got {shown(item)}"
                )
            key, _, value = item.partition("=")
            entries.append((key, value))
        return entries

    def record(self, job_id: str) -> Record:
        submit = self.time("Submit")
        if submit is None:
            raise self.error("Submit", "expected the time the job was submitted, got none")
        allocated = gpus_from_tres(
            self.tres("AllocTRES"), lambda message: self.error("AllocTRES", message)
        )
        requested = gpus_from_tres(
            self.tres("ReqTRES"), lambda message: self.error("ReqTRES", message)
        ) or Gpus(0)
        nodes = self.count("AllocNodes") if self.has("AllocNodes") else None
        if not nodes and self.has("NNodes"):
            # what was asked for, as a count or a range (--nodes=1-2): its least
            nodes = self.count("NNodes", self.text("NNodes").split("-", 1)[0])
        return Record(
            job_id=job_id,
            cluster=self.text("Cluster"),
            state=self.text("State"),
            submit=submit,
            start=self.time("Start"),
            end=self.time("End"),
            elapsed=self.elapsed(),
            allocated=allocated,
            requested=requested,
            nodes=nodes,
            partition=self.text("Partition"),
            account=self.text("Account"),
            user=self.text("User"),
            qos=self.text("QOS"),
        )
