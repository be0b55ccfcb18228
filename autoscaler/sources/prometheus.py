"""Prometheus as a queue source (any PromQL expression is pending demand, as KEDA's Prometheus
scaler reads it) and as a telemetry source (dcgm-exporter's GPU series, which ops often already
collect), both over the HTTP API's instant query, ``GET /api/v1/query``.

Nothing Prometheus answers is trusted blindly: an error status, a body that is not the API's
JSON, a NaN or infinite value, a negative count, a stale sample, a series without the labels we
join on, or a query that matches nothing (by default) fails the source with one line, so observe
marks demand or utilisation unknown instead of reading a broken pipeline as "no work" or "idle".
"""

from __future__ import annotations

import http.client
import logging
import math
import socket
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Literal

import msgspec
from pydantic import BaseModel, ConfigDict, Field, PositiveFloat, PositiveInt

from autoscaler.fleet.telemetry import FUTURE_SKEW_S
from autoscaler.model import DemandGroup, Name
from autoscaler.model.errors import SourceError
from autoscaler.model.inputfile import validate_settings
from autoscaler.model.secrets import read_secret_env
from autoscaler.sources.exposition import MAX_FB_MIB, NUMBER
from autoscaler.sources.team_names import TeamNames
from autoscaler.spi.job_shape import ShapeSettings
from autoscaler.spi.sources import GpuSample

log = logging.getLogger(__name__)

MAX_BODY = 16 * 1024 * 1024
SHOWN_LABELS = 240
SHOWN_TEXT = 200
# More series than any fleet's GPUs or any queue's partitions: an answer this long is a query
# that matches the wrong thing.
MAX_SERIES = 100_000
# More jobs than any queue holds: a count this large is a broken exporter, not demand.
MAX_JOBS = 100_000_000


@dataclass(frozen=True)
class QuerySample:
    """One value of an instant query's answer; a scalar answer is one sample without labels.
    ``value`` is finite from ``parse_query_response``; ``read_query_response`` also gives NaN
    and infinities, for a reader that leaves such a series out by itself."""

    labels: Mapping[str, str]
    at: float
    value: float


class _VectorSample(msgspec.Struct):
    value: tuple[float, str]
    metric: dict[str, str] = msgspec.field(default_factory=dict)


class _ApiData(msgspec.Struct):
    result_type: Literal["vector", "scalar", "matrix", "string"] = msgspec.field(name="resultType")
    result: msgspec.Raw


class _ApiAnswer(msgspec.Struct):
    status: Literal["success", "error"]
    data: _ApiData | None = None
    error_type: str | None = msgspec.field(default=None, name="errorType")
    error: str | None = None


_ANSWER = msgspec.json.Decoder(_ApiAnswer)
_VECTOR = msgspec.json.Decoder(Annotated[list[_VectorSample], msgspec.Meta(max_length=MAX_SERIES)])
_SCALAR = msgspec.json.Decoder(tuple[float, str])


def series_name(labels: Mapping[str, str]) -> str:
    """A series as PromQL writes it, so an error names the series a user can query."""
    inner = ", ".join(
        f'{k}="{_escaped(v)}"' for k, v in sorted(labels.items())[:32] if k != "__name__"
    )
    text = f"{_escaped(labels.get('__name__', ''))}{{{inner}}}"
    return text if len(text) <= SHOWN_LABELS else text[: SHOWN_LABELS - 3] + "..."


def _escaped(value: str) -> str:
    """A label value in one line (a value may hold newlines and control characters)."""
    return repr(value[:SHOWN_LABELS])[1:-1]


def one_line(text: str, most: int = SHOWN_TEXT) -> str:
    """Text a server sent (an error message) as one bounded line."""
    flat = " ".join(text[: most * 4].split())
    return flat if len(flat) <= most else flat[: most - 3] + "..."


def read_query_response(body: bytes, where: str) -> list[QuerySample]:
    """The samples of an instant query's answer, decoded strictly: JSON no deeper than the
    decoder's limit, the API's types (a timestamp is a number, a value a string in Prometheus's
    float syntax, labels strings), at most ``MAX_SERIES`` series. A value may be NaN or infinite
    here; ``where`` starts every error line (it names the source)."""
    try:
        answer = _ANSWER.decode(body)
        if answer.status == "error":
            said = f"{one_line(answer.error_type or '')}: {one_line(answer.error or '')}"
            raise SourceError(f"{where}: Prometheus says {said}")
        if answer.data is None:
            raise SourceError(f"{where}: the answer has no data")
        kind = answer.data.result_type
        if kind == "scalar":
            at, text = _SCALAR.decode(answer.data.result)
            samples = [(dict[str, str](), at, text)]
        elif kind == "vector":
            samples = [
                (s.metric, s.value[0], s.value[1]) for s in _VECTOR.decode(answer.data.result)
            ]
        else:
            raise SourceError(
                f"{where}: the query returns a {kind}; it must return an instant vector or a "
                "scalar (aggregate a range vector, e.g. with max_over_time)"
            )
    except RecursionError:
        raise SourceError(
            f"{where}: the answer is nested deeper than the decoder's limit"
        ) from None
    except msgspec.ValidationError as exc:
        raise SourceError(
            f"{where}: the answer is not a Prometheus API response ({one_line(str(exc))})"
        ) from None
    except msgspec.DecodeError:
        raise SourceError(f"{where}: the answer is not JSON") from None
    return [_sample(labels, at, text, where) for labels, at, text in samples]


def parse_query_response(body: bytes, where: str) -> list[QuerySample]:
    """The samples of an instant query's answer, every value finite."""
    samples = read_query_response(body, where)
    for sample in samples:
        if not math.isfinite(sample.value):
            raise SourceError(
                f"{where}: series {series_name(sample.labels)} is {_prometheus_text(sample.value)}"
            )
    return samples


def _prometheus_text(value: float) -> str:
    """NaN and infinities as Prometheus writes them."""
    if math.isnan(value):
        return "NaN"
    return ("+" if value > 0 else "-") + "Inf" if math.isinf(value) else f"{value:g}"


def _sample(labels: dict[str, str], at: float, text: str, where: str) -> QuerySample:
    if not NUMBER.fullmatch(text):
        raise SourceError(f"{where}: series {series_name(labels)} has value {text[:60]!r}")
    if not math.isfinite(at) or at < 0:
        raise SourceError(f"{where}: series {series_name(labels)} has no valid timestamp")
    value = float(text)
    return QuerySample(labels, at, value)


class _PrometheusApi:
    """Instant queries over HTTP (stdlib only); every failure is one ``SourceError`` line."""

    def __init__(self, url: str, timeout_s: float, token_env: str | None, where: str) -> None:
        self.endpoint = url.rstrip("/") + "/api/v1/query"
        self.timeout_s = timeout_s
        self.token_env = token_env
        self.where = where

    def instant(
        self, query: str, at: float | None = None, *, finite: bool = True
    ) -> list[QuerySample]:
        """The answer's samples; ``finite=False`` keeps NaN and infinite values for a reader
        that leaves those series out one by one."""
        params = {"query": query, "timeout": f"{self.timeout_s:g}s"}
        if at is not None:
            params["time"] = repr(at)
        request = urllib.request.Request(
            f"{self.endpoint}?{urllib.parse.urlencode(params)}", headers=self._headers()
        )
        body = self._fetch(request)
        if finite:
            return parse_query_response(body, self.where)
        return read_query_response(body, self.where)

    def _headers(self) -> dict[str, str]:
        headers = {"Accept": "application/json"}
        if self.token_env is not None:
            token = read_secret_env(self.token_env, self.where, "bearer_token_env")
            if not token:
                raise SourceError(
                    f"{self.where}: environment variable {self.token_env} (bearer_token_env) "
                    "is not set"
                )
            headers["Authorization"] = f"Bearer {token}"
        return headers

    def _fetch(self, request: urllib.request.Request) -> bytes:
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as answer:
                body: bytes = answer.read(MAX_BODY + 1)
        except urllib.error.HTTPError as exc:
            raise SourceError(f"{self.where}: {self._http_error(exc)}") from None
        except urllib.error.URLError as exc:
            raise SourceError(f"{self.where}: {self._unreachable(exc.reason)}") from None
        except (TimeoutError, OSError) as exc:
            raise SourceError(f"{self.where}: {self._unreachable(exc)}") from None
        except http.client.HTTPException as exc:
            raise SourceError(
                f"{self.where}: {self.endpoint} did not answer in HTTP ({type(exc).__name__})"
            ) from None
        if len(body) > MAX_BODY:
            raise SourceError(f"{self.where}: the answer is larger than {MAX_BODY} bytes")
        return body

    def _http_error(self, exc: urllib.error.HTTPError) -> str:
        """Prometheus explains a bad query (400, 422) or an overloaded server (503) in a JSON
        body; that explanation is the useful part of the line."""
        status = one_line(f"HTTP {exc.code} {exc.reason}".strip())
        try:
            detail = _ANSWER.decode(exc.read(MAX_BODY))
        except (msgspec.DecodeError, OSError, RecursionError, http.client.HTTPException):
            return status
        if detail.error:
            said = f"{one_line(detail.error_type or '')}: {one_line(detail.error)}"
            return f"{status}: Prometheus says {said}"
        return status

    def _unreachable(self, reason: object) -> str:
        if isinstance(reason, TimeoutError | socket.timeout):
            return f"timed out after {self.timeout_s:g}s"
        if isinstance(reason, OSError) and reason.strerror:
            return f"cannot reach {self.endpoint} ({reason.strerror})"
        return f"cannot reach {self.endpoint} ({one_line(str(reason))})"


class PrometheusQueueSettings(ShapeSettings):
    """A query's value counts jobs; their shape (``nodes``, ``gpu_models``,
    ``min_gpu_memory_gib``) is the settings', since a number carries none. Work of different
    shapes is counted by different sources (one query each)."""

    gpus_field = "gpus_per_unit"

    url: str = Field(pattern=r"^https?://", description="Prometheus's base URL")
    query: str = Field(min_length=1, description="PromQL whose value is the pending work")
    gpus_per_unit: PositiveInt = Field(1, description="each unit of the value is one job this big")
    partition_label: str | None = Field(
        None, description="split the answer into demand groups by this label's value"
    )
    max_sample_age_s: PositiveFloat = 120.0
    empty_result: Literal["error", "zero"] = Field(
        "error", description="what an answer without series means: unknown (error) or no work"
    )
    timeout_s: PositiveFloat = 5.0
    bearer_token_env: str | None = Field(
        None, min_length=1, description="NAME of the environment variable holding a bearer token"
    )
    checkpoint_interval_s: float | None = Field(None, gt=0)
    high_priority: bool = False
    team_label: str | None = Field(
        None,
        min_length=1,
        description="split the answer by team: this label's value names the team a series' "
        "jobs are counted under (the config's teams; a query such as "
        "sum by (team) (queue_depth)); a series without it counts under team",
    )
    team: Name | None = Field(
        None,
        description="the team the query's jobs are counted under (those of a series without "
        "team_label's label, when that is set); unset: no team",
    )


def demand_from_samples(
    samples: Sequence[QuerySample],
    settings: PrometheusQueueSettings,
    now: float,
    where: str,
    teams: TeamNames | None = None,
) -> list[DemandGroup]:
    """Each series' value rounded up is a number of jobs (half a job waiting still needs a whole
    one's GPUs), grouped by the partition label when one is set and by team; the answer must be
    fresh. A team label's value that cannot be a team is said once (``teams``) and its jobs
    count under no team."""
    teams = teams or TeamNames(where, f"label {settings.team_label}")
    if not samples and settings.empty_result == "error":
        raise SourceError(
            f"{where}: the query matched no series (set empty_result: zero if that means no work)"
        )
    jobs: dict[tuple[str | None, str | None], int] = {}
    for sample in samples:
        name = series_name(sample.labels)
        age = now - sample.at
        if abs(age) > settings.max_sample_age_s:
            when = f"{age:.0f}s old" if age > 0 else f"{-age:.0f}s in the future"
            raise SourceError(
                f"{where}: series {name} is {when} (max_sample_age_s {settings.max_sample_age_s:g})"
            )
        if sample.value < 0:
            raise SourceError(f"{where}: series {name} is negative ({sample.value:g})")
        if sample.value > MAX_JOBS:
            raise SourceError(
                f"{where}: series {name} is {sample.value:g}, more than {MAX_JOBS:,} jobs"
            )
        partition = None
        if settings.partition_label is not None:
            partition = sample.labels.get(settings.partition_label)
            if partition is None:
                raise SourceError(
                    f"{where}: series {name} has no {settings.partition_label!r} label "
                    "(partition_label)"
                )
        team = settings.team
        if settings.team_label is not None and settings.team_label in sample.labels:
            team = teams(sample.labels[settings.team_label])
        jobs[partition, team] = jobs.get((partition, team), 0) + math.ceil(sample.value)
    if sum(jobs.values()) > MAX_JOBS:
        raise SourceError(f"{where}: the answer adds up to more than {MAX_JOBS:,} jobs")
    shape = settings.job_shape()
    return [
        DemandGroup(
            gpus_per_job=shape.gpus,
            jobs=count,
            checkpoint_interval_s=settings.checkpoint_interval_s,
            high_priority=settings.high_priority,
            nodes=shape.nodes,
            gpu_models=shape.gpu_models,
            min_gpu_memory_gib=shape.min_gpu_memory_gib,
            partition=partition,
            oldest_submit_time=now,
            team=team,
        )
        for (partition, team), count in sorted(
            jobs.items(), key=lambda item: (item[0][0] or "", item[0][1] or "")
        )
        if count > 0
    ]


class PrometheusQueueSource:
    Settings = PrometheusQueueSettings  # what its ``settings`` hold (``gpu-autoscaler schema``)

    def __init__(self, settings: PrometheusQueueSettings, name: str) -> None:
        self.settings = settings
        self.name = name
        self.where = f"prometheus source {name!r}"
        self._api = _PrometheusApi(
            settings.url, settings.timeout_s, settings.bearer_token_env, self.where
        )
        self._teams = TeamNames(self.where, f"label {settings.team_label}")

    @classmethod
    def from_config(cls, settings: Mapping[str, Any], name: str) -> PrometheusQueueSource:
        parsed = validate_settings(PrometheusQueueSettings, dict(settings), field=f"sources.{name}")
        return cls(parsed, name)

    def read(self, now: float) -> Sequence[DemandGroup]:
        samples = self._api.instant(self.settings.query)
        return demand_from_samples(samples, self.settings, now, self.where, self._teams)


class PrometheusTelemetrySettings(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    url: str = Field(pattern=r"^https?://", description="Prometheus's base URL")
    query: str = Field("DCGM_FI_DEV_GPU_UTIL", min_length=1, description="utilisation, percent")
    memory_query: str | None = Field(
        "DCGM_FI_DEV_FB_USED", min_length=1, description="framebuffer used, MiB; null: skip"
    )
    host_label: str = Field("Hostname", description="names the node as the scheduler does")
    gpu_label: str = "gpu"
    uuid_label: str = "UUID"
    model_label: str = "modelName"
    timeout_s: PositiveFloat = 5.0
    bearer_token_env: str | None = Field(None, min_length=1)


class PrometheusTelemetrySource:
    """GPU readings from Prometheus. A reading's time is when it was scraped (``timestamp()`` of
    the query, evaluated at the same instant), not when we asked, so a tick that sees the same
    scrape twice does not mistake it for a new reading."""

    Settings = PrometheusTelemetrySettings  # what its ``settings`` hold (``gpu-autoscaler schema``)

    def __init__(self, settings: PrometheusTelemetrySettings, name: str) -> None:
        self.settings = settings
        self.name = name
        self.where = f"prometheus telemetry {name!r}"
        self._api = _PrometheusApi(
            settings.url, settings.timeout_s, settings.bearer_token_env, self.where
        )

    @classmethod
    def from_config(cls, settings: Mapping[str, Any], name: str) -> PrometheusTelemetrySource:
        parsed = validate_settings(
            PrometheusTelemetrySettings, dict(settings), field=f"sources.{name}"
        )
        return cls(parsed, name)

    def read_gpus(self, now: float) -> Sequence[GpuSample]:
        """Every GPU's latest reading. A series we cannot use (NaN, outside 0-100, a scrape time
        more than ``FUTURE_SKEW_S`` ahead of now, an impossible memory reading) leaves its host
        out of this read, as unknown, and the other hosts count; the read fails when no host is
        left, or when a series names no host or GPU (it could be any host's)."""
        utilisation = self._api.instant(self.settings.query, finite=False)
        if not utilisation:
            raise SourceError(f"{self.where}: the query {self.settings.query!r} matched no series")
        evaluated = utilisation[0].at
        if evaluated > now + FUTURE_SKEW_S:
            raise SourceError(
                f"{self.where}: the answer is evaluated {evaluated - now:.0f}s after now "
                f"(clocks more than {FUTURE_SKEW_S:g}s apart)"
            )
        scraped = {
            _identity(s.labels): s.value
            for s in self._api.instant(f"timestamp({self.settings.query})", evaluated, finite=False)
        }
        memory: dict[tuple[str, str], float] = {}
        if self.settings.memory_query is not None:
            for sample in self._api.instant(self.settings.memory_query, evaluated, finite=False):
                memory[self._gpu_of(sample)] = sample.value
        readings: dict[tuple[str, str], GpuSample] = {}
        problems: dict[str, str] = {}
        for sample in utilisation:
            host, gpu = self._gpu_of(sample)
            at = scraped.get(_identity(sample.labels), sample.at)
            used = memory.get((host, gpu))
            problem = _unusable(sample, at, used, now)
            if problem is not None:
                problems.setdefault(host, f"series {series_name(sample.labels)} {problem}")
                continue
            reading = GpuSample(
                host=host,
                gpu=gpu,
                util_pct=sample.value,
                at=at,
                uuid=sample.labels.get(self.settings.uuid_label),
                model=sample.labels.get(self.settings.model_label),
                memory_used_mib=used,
            )
            known = readings.get((host, gpu))
            if known is None or reading.at > known.at:
                readings[(host, gpu)] = reading
        kept = [reading for key, reading in readings.items() if key[0] not in problems]
        if problems:
            first = next(iter(problems.values()))
            summary = f"{len(problems)} host(s) left unknown: {first}"
            if not kept:
                raise SourceError(f"{self.where}: {summary}")
            log.warning("%s: %s", self.where, summary)
        return kept

    def _gpu_of(self, sample: QuerySample) -> tuple[str, str]:
        wanted = (self.settings.host_label, self.settings.gpu_label)
        missing = [label for label in wanted if not sample.labels.get(label)]
        if missing:
            raise SourceError(
                f"{self.where}: series {series_name(sample.labels)} has no "
                f"{' or '.join(repr(m) for m in missing)} label"
            )
        return sample.labels[wanted[0]], sample.labels[wanted[1]]


def _unusable(sample: QuerySample, at: float, used: float | None, now: float) -> str | None:
    """Why one GPU's reading cannot be used, or None."""
    if not math.isfinite(sample.value):
        return f"is {_prometheus_text(sample.value)}"
    if not 0.0 <= sample.value <= 100.0:
        return f"is {sample.value:g}, not a utilisation percentage"
    if not (math.isfinite(at) and 0.0 <= at <= now + FUTURE_SKEW_S):
        return f"was scraped at {at:g}, not a time up to {FUTURE_SKEW_S:g}s from now"
    if used is not None and not (math.isfinite(used) and 0.0 <= used <= MAX_FB_MIB):
        return f"has memory used {_prometheus_text(used)} MiB, not a reading"
    return None


def _identity(labels: Mapping[str, str]) -> frozenset[tuple[str, str]]:
    """A series without its metric name, which ``timestamp()`` drops."""
    return frozenset((k, v) for k, v in labels.items() if k != "__name__")
