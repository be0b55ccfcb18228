"""GPU telemetry scraped straight from the nodes: our agents, or a dcgm-exporter ops already run
(both speak dcgm-exporter's names), with bounded concurrency so 2,000 nodes fit in a tick.

Targets come from the config, or from a Prometheus ``file_sd`` file (JSON or YAML, re-read when it
changes) so whatever already keeps Prometheus's target list keeps ours. A target that fails is
reported on its own and leaves its node without readings (unknown, never idle); the source as a
whole fails only when every target does and nothing at all was read.

Each target's text is read line by line (``exposition.read_exposition``): a line we cannot use
leaves out that node's readings for the scrape and marks the target failed with the reason, while
the other nodes of the same text, and every other target, still count.
"""

from __future__ import annotations

import http.client
import logging
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import msgspec
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PositiveFloat,
    PositiveInt,
    ValidationError,
    model_validator,
)

from autoscaler.model.clock import Clock, SystemClock
from autoscaler.model.errors import InputError, SourceError
from autoscaler.model.inputfile import read_yaml, validate_settings
from autoscaler.sources.exposition import UTIL, ExpositionError, read_exposition
from autoscaler.spi.sources import GpuSample

log = logging.getLogger(__name__)
MAX_BODY = 4 * 1024 * 1024
MAX_TARGETS_FILE = 16 * 1024 * 1024
SHOWN_FAILURES = 5


class ScrapeSettings(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    targets: tuple[str, ...] = Field(
        (), description="host:port or a full URL of each agent or dcgm-exporter"
    )
    targets_file: Path | None = Field(
        None, description="a Prometheus file_sd file (JSON or YAML) listing targets"
    )
    scheme: Literal["http", "https"] = "http"
    path: str = "/metrics"
    timeout_s: PositiveFloat = 2.0
    concurrency: PositiveInt = 64
    host_label: str = Field(
        "Hostname", description="the series label naming the node as the scheduler knows it"
    )
    node_label: str = Field(
        "node", description="a file_sd target label that names the node, overriding host_label"
    )

    @model_validator(mode="after")
    def _some_targets(self) -> ScrapeSettings:
        if not self.targets and self.targets_file is None:
            raise ValueError("set targets, targets_file or both")
        return self


class _TargetGroup(BaseModel):
    model_config = ConfigDict(extra="ignore")

    targets: list[str]
    labels: dict[str, str] = Field(default_factory=dict)


@dataclass(frozen=True)
class Target:
    url: str
    node: str | None = None


class ScrapeTelemetrySource:
    Settings = ScrapeSettings  # what its ``settings`` hold (``gpu-autoscaler schema``)

    def __init__(self, settings: ScrapeSettings, name: str, clock: Clock | None = None) -> None:
        self.settings = settings
        self.name = name
        self.clock = clock or SystemClock()
        self._pool = ThreadPoolExecutor(settings.concurrency, thread_name_prefix=f"scrape-{name}")
        self._file_stamp: tuple[float, int] | None = None
        self._file_targets: tuple[Target, ...] = ()
        self._status: dict[str, str | None] = {}

    @classmethod
    def from_config(cls, settings: Mapping[str, Any], name: str) -> ScrapeTelemetrySource:
        parsed = validate_settings(ScrapeSettings, dict(settings), field=f"sources.{name}")
        return cls(parsed, name)

    def targets(self) -> tuple[Target, ...]:
        static = tuple(Target(self._url(t)) for t in self.settings.targets)
        return static + self._read_targets_file()

    def read_gpus(self, now: float) -> Sequence[GpuSample]:
        targets = self.targets()
        results = list(self._pool.map(self._scrape, targets))
        samples: list[GpuSample] = []
        status: dict[str, str | None] = {}
        for target, (found, problem) in zip(targets, results, strict=True):
            samples.extend(found)
            status[target.url] = problem
        self._status = status
        failed = {url: why for url, why in status.items() if why is not None}
        if failed:
            shown = "; ".join(f"{url}: {why}" for url, why in list(failed.items())[:SHOWN_FAILURES])
            more = len(failed) - SHOWN_FAILURES
            summary = f"{len(failed)} of {len(targets)} targets failed: {shown}" + (
                f"; and {more} more" if more > 0 else ""
            )
            if len(failed) == len(targets) and not samples:
                raise SourceError(summary)
            log.warning("scrape %s: %s", self.name, summary)
        return samples

    def target_status(self) -> Mapping[str, str | None]:
        """Each target of the last read: None when it answered, else why it failed."""
        return dict(self._status)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _scrape(self, target: Target) -> tuple[list[GpuSample], str | None]:
        at = self.clock.now()
        request = urllib.request.Request(target.url, headers={"Accept": "text/plain;version=0.0.4"})
        try:
            with urllib.request.urlopen(request, timeout=self.settings.timeout_s) as response:
                body = response.read(MAX_BODY + 1)
        except urllib.error.HTTPError as exc:
            return [], f"HTTP {exc.code}"
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            return [], f"unreachable ({str(reason)[:200]})"
        except http.client.HTTPException as exc:
            return [], f"not an HTTP answer ({type(exc).__name__})"
        except ValueError:
            return [], "not a URL that can be fetched"
        if len(body) > MAX_BODY:
            return [], f"answer larger than {MAX_BODY // (1024 * 1024)} MiB"
        try:
            read = read_exposition(body.decode("utf-8"), at, self.settings.host_label, target.node)
        except UnicodeDecodeError:
            return [], "answer is not UTF-8 text"
        except ExpositionError as exc:
            return [], str(exc)
        if read.problems:
            unread = f"{read.unread} line(s) unread, node(s) left unknown: "
            hosts = ", ".join(sorted(repr(h[:60]) for h in read.unknown_hosts)[:SHOWN_FAILURES])
            return read.samples, f"{unread}{hosts}; {read.problems[0]}"
        if not read.samples:
            # the node agent on a node without a usable GPU: gpu_autoscaler_agent_nvml_up 0
            return [], f"no {UTIL} series (a node agent without a usable GPU serves none)"
        return read.samples, None

    def _url(self, target: str) -> str:
        if "://" in target:
            return target
        return f"{self.settings.scheme}://{target}{self.settings.path}"

    def _read_targets_file(self) -> tuple[Target, ...]:
        path = self.settings.targets_file
        if path is None:
            return ()
        try:
            stat = path.stat()
        except OSError as exc:
            raise SourceError(f"targets file {path}: {exc.strerror}") from None
        stamp = (stat.st_mtime, stat.st_size)
        if stamp == self._file_stamp:
            return self._file_targets
        data = _load_targets(path)
        if not isinstance(data, list):
            raise SourceError(f"targets file {path}: expected a list of target groups")
        targets: list[Target] = []
        for index, group in enumerate(data):
            try:
                parsed = _TargetGroup.model_validate(group)
            except ValidationError as exc:
                first = exc.errors()[0]
                where = ".".join(str(p) for p in first["loc"])
                raise SourceError(
                    f"targets file {path}: group [{index}] {where}: {first['msg']}"
                ) from None
            node = parsed.labels.get(self.settings.node_label)
            targets.extend(Target(self._url(t), node) for t in parsed.targets)
        self._file_stamp = stamp
        self._file_targets = tuple(targets)
        return self._file_targets


def _load_targets(path: Path) -> Any:
    """The file's document: JSON through msgspec (no depth or number it cannot hold), YAML
    through the project's bounded reader (size, depth, aliases); one ``SourceError`` line."""
    if path.suffix != ".json":
        try:
            return read_yaml(path).data
        except InputError as exc:
            raise SourceError(f"targets file {exc}") from None
    try:
        with path.open("rb") as handle:
            raw = handle.read(MAX_TARGETS_FILE + 1)
    except OSError as exc:
        raise SourceError(f"targets file {path}: {exc.strerror or exc}") from None
    if len(raw) > MAX_TARGETS_FILE:
        raise SourceError(f"targets file {path}: larger than {MAX_TARGETS_FILE // 2**20} MiB")
    try:
        return msgspec.json.decode(raw)
    except (msgspec.DecodeError, RecursionError) as exc:
        detail = " ".join(str(exc).split())[:120]
        raise SourceError(f"targets file {path}: not valid JSON or YAML ({detail})") from None
