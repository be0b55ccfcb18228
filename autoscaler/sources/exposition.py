"""Reading dcgm-exporter's series out of Prometheus text exposition.

A scrape of 2,000 nodes must fold in well under a second, so this reads only the lines of the
series we use and skips everything else without parsing it. The format is the text format every
Prometheus exporter speaks (``name{label="value",...} value [timestamp_ms]``); label values may
hold escaped quotes, backslashes and newlines.

Each line is read by itself. A line we cannot use (a value that is not a finite number of the
series' range, a timestamp outside the plausible window, a missing ``gpu`` label) makes its node
unknown for this scrape: every reading of that node is left out, since a node with one GPU
unread could look idle while that GPU is busy, and the other nodes of the text still count. A
line that names no node we can tell (unreadable labels, no host label) leaves the whole text
unread, since it could belong to any of them.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from dataclasses import dataclass, field

from autoscaler.fleet.telemetry import FUTURE_SKEW_S
from autoscaler.spi.sources import GpuSample

UTIL = "DCGM_FI_DEV_GPU_UTIL"
FB_USED = "DCGM_FI_DEV_FB_USED"
WANTED = (UTIL, FB_USED)
# The largest framebuffer a GPU could report, in MiB (16 TiB): a larger reading is not one.
MAX_FB_MIB = 16 * 1024 * 1024
MAX_LABEL_CHARS = 1024
SHOWN_PROBLEMS = 3

_SAMPLE = re.compile(r"(?:\{(?P<labels>.*)\})?\s+(?P<rest>\S.*)$")
_VALUE = r'"[^"\\]*(?:\\.[^"\\]*)*"'
_LABEL_BLOCK = re.compile(r"^\s*(?:[A-Za-z_][A-Za-z0-9_]*\s*=\s*" + _VALUE + r"\s*(?:,\s*|$))*$")
_LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)\s*=\s*"([^"\\]*(?:\\.[^"\\]*)*)"')
_ESCAPES = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}
# Go's float syntax as exporters print it, in ASCII only (``float`` would also read ``'٣'``,
# ``'1_000'`` and surrounding spaces); NaN and infinities are read to be refused by name.
NUMBER = re.compile(
    r"[+-]?(?:(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?|[Ii]nf(?:inity)?|NaN|nan)"
)
_STAMP = re.compile(r"-?[0-9]{1,19}")


class ExpositionError(ValueError):
    """The text names a series we need but in a shape we cannot use; the message says which."""


@dataclass(frozen=True)
class Exposition:
    """What one exposition text gave: the readings of the nodes read whole, and one line for
    each of the first few lines left out (``unread`` counts them all)."""

    samples: list[GpuSample]
    problems: list[str] = field(default_factory=list)
    unread: int = 0
    unknown_hosts: frozenset[str] = frozenset()


@dataclass
class _Gpu:
    host: str
    gpu: str
    uuid: str | None = None
    model: str | None = None
    util: float | None = None
    fb_used: float | None = None
    at: float | None = None


class _BadLineError(Exception):
    """One line we cannot use; ``host`` is its node when the line names one."""

    def __init__(self, message: str, host: str | None) -> None:
        super().__init__(message)
        self.host = host


def parse_gpu_samples(
    text: str, at: float, host_label: str = "Hostname", node_override: str | None = None
) -> list[GpuSample]:
    """Every reading of the text, or ``ExpositionError`` naming the first line we cannot use."""
    read = read_exposition(text, at, host_label, node_override)
    if read.problems:
        raise ExpositionError(read.problems[0])
    return read.samples


def read_exposition(
    text: str, at: float, host_label: str = "Hostname", node_override: str | None = None
) -> Exposition:
    """One sample per GPU that reports utilisation, each line read by itself; ``at`` (now) stands
    in when a line has no timestamp, and bounds the timestamps a line may carry.

    ``node_override`` names the node when the target itself says which node it is (a file_sd
    label), for exporters whose Hostname is the pod's rather than the node's. Raises
    ``ExpositionError`` only for a line whose node cannot be told."""
    gpus: dict[tuple[str, str], _Gpu] = {}
    problems: list[str] = []
    unread = 0
    bad_hosts: set[str] = set()
    for name, start, line in _wanted_lines(text):
        try:
            host, index, labels, value, stamp = _read_line(
                name, line, at, host_label, node_override
            )
        except _BadLineError as bad:
            if bad.host is None:
                raise ExpositionError(f"line {_line_number(text, start)}: {bad}") from None
            unread += 1
            bad_hosts.add(bad.host)
            if len(problems) < SHOWN_PROBLEMS:
                problems.append(f"line {_line_number(text, start)}: {bad}")
            continue
        entry = gpus.get((host, index))
        if entry is None:
            entry = gpus[(host, index)] = _Gpu(host, index)
        entry.uuid = labels.get("UUID", entry.uuid)
        entry.model = labels.get("modelName", entry.model)
        if name == UTIL:
            entry.util = value
            entry.at = stamp if stamp is not None else at
        else:
            entry.fb_used = value
    samples = [
        GpuSample(
            host=entry.host,
            gpu=entry.gpu,
            util_pct=entry.util,
            at=entry.at if entry.at is not None else at,
            uuid=entry.uuid,
            model=entry.model,
            memory_used_mib=entry.fb_used,
        )
        for entry in gpus.values()
        if entry.util is not None and entry.host not in bad_hosts
    ]
    return Exposition(samples, problems, unread, frozenset(bad_hosts))


def _read_line(
    name: str, line: str, at: float, host_label: str, node_override: str | None
) -> tuple[str, str, dict[str, str], float, float | None]:
    """(host, gpu, labels, value, time) of one line, or ``_BadLineError`` naming what is wrong."""
    match = _SAMPLE.match(line, len(name))
    if match is None:
        raise _BadLineError(f"not a Prometheus sample line: {_shown(line)}", node_override)
    labels = _labels(match["labels"] or "")
    if labels is None:
        raise _BadLineError(f"{name}: malformed labels {_shown(match['labels'])}", node_override)
    series = _describe(name, labels)
    host = node_override or labels.get(host_label)
    if not host:
        raise _BadLineError(f"{series}: no {host_label!r} label to name the node", None)
    index = labels.get("gpu")
    if index is None:
        raise _BadLineError(f"{series}: no 'gpu' label to name the GPU", host)
    parts = match["rest"].split()
    if len(parts) > 2 or not NUMBER.fullmatch(parts[0]):
        raise _BadLineError(
            f"{series}: {_shown(match['rest'])} is not a number and timestamp", host
        )
    value = float(parts[0])
    if not math.isfinite(value):
        raise _BadLineError(f"{series}: value {_shown(parts[0])} is not a finite number", host)
    if value < 0:
        raise _BadLineError(f"{series}: value {value:g} is negative", host)
    if name == UTIL and value > 100.0:
        raise _BadLineError(f"{series}: value {value:g} is not a utilisation percentage", host)
    if name == FB_USED and value > MAX_FB_MIB:
        raise _BadLineError(f"{series}: value {value:g} MiB is more than a GPU holds", host)
    stamp = None
    if len(parts) == 2:
        if not _STAMP.fullmatch(parts[1]):
            raise _BadLineError(f"{series}: timestamp {_shown(parts[1])} is not milliseconds", host)
        stamp = int(parts[1]) / 1000.0
        if not 0.0 <= stamp <= at + FUTURE_SKEW_S:
            raise _BadLineError(
                f"{series}: timestamp {parts[1]} is not a time up to {FUTURE_SKEW_S:g}s from now",
                host,
            )
    return host, index, labels, value, stamp


def _labels(block: str) -> dict[str, str] | None:
    if not _LABEL_BLOCK.match(block):
        return None
    labels = {}
    for key, value in _LABEL.findall(block):
        if len(value) > MAX_LABEL_CHARS:
            return None
        labels[key] = (
            re.sub(r"\\[\\\"n]", lambda m: _ESCAPES[m[0]], value) if "\\" in value else value
        )
    return labels


def _shown(text: str, most: int = 60) -> str:
    return repr(text[:most] + ("..." if len(text) > most else ""))


def _line_number(text: str, start: int) -> int:
    """Counted only for the few lines an error names, so the fast path never pays for it."""
    return text.count("\n", 0, start) + 1


def _wanted_lines(text: str) -> Iterator[tuple[str, int, str]]:
    """Each line that starts with a wanted series name, found with ``str.find`` (a C loop)
    rather than by walking every line of the exporter's other series in Python."""
    for name in WANTED:
        needle = "\n" + name
        found = text.find(needle)
        start = 0 if text.startswith(name) else (-1 if found == -1 else found + 1)
        while start != -1:
            end = text.find("\n", start)
            line = text[start:] if end == -1 else text[start:end]
            follower = line[len(name) : len(name) + 1]
            if not follower or not (follower.isalnum() or follower in "_:"):
                yield name, start, line
            found = -1 if end == -1 else text.find(needle, end)
            start = -1 if found == -1 else found + 1


def _describe(name: str, labels: dict[str, str]) -> str:
    shown = ",".join(
        f'{key}="{repr(labels[key][:60])[1:-1]}"' for key in ("gpu", "Hostname") if key in labels
    )
    return f"{name}{{{shown}}}"
