"""Prometheus as a queue source (any PromQL expression is pending demand, as KEDA's Prometheus
scaler reads it) and as a telemetry source (dcgm-exporter's GPU series, which ops often already
collect), both over the HTTP API's instant query, ``GET /api/v1/query``.

Nothing Prometheus answers is trusted blindly: an error status, a body that is not the API's
JSON, a NaN or infinite value, a negative count, a stale sample, a series without the labels we
join on, or a query that matches nothing (by default) fails the source with one line, so observe
marks demand or utilisation unknown instead of reading a broken pipeline as "no work" or "idle".
"""

from __future__ import annotations

import json
import math
import os
import socket
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PositiveFloat, PositiveInt, ValidationError

from autoscaler.inputfile import validate_settings
from autoscaler.model import DemandGroup
from autoscaler.sources import GpuSample, SourceError
from autoscaler.sources.job_shape import ShapeSettings

MAX_BODY = 16 * 1024 * 1024
SHOWN_LABELS = 240


@dataclass(frozen=True)
class QuerySample:
    """One value of an instant query's answer; a scalar answer is one sample without labels."""

    labels: Mapping[str, str]
    at: float
    value: float


class _ApiData(BaseModel):
    model_config = ConfigDict(extra="ignore")

    result_type: Literal["vector", "scalar", "matrix", "string"] = Field(alias="resultType")
    result: Any


class _ApiAnswer(BaseModel):
    model_config = ConfigDict(extra="ignore")

    status: Literal["success", "error"]
    data: _ApiData | None = None
    error_type: str | None = Field(None, alias="errorType")
    error: str | None = None


class _VectorSample(BaseModel):
    model_config = ConfigDict(extra="ignore")

    metric: dict[str, str] = Field(default_factory=dict)
    value: tuple[float, str]


def series_name(labels: Mapping[str, str]) -> str:
    """A series as PromQL writes it, so an error names the series a user can query."""
    inner = ", ".join(f'{k}="{v}"' for k, v in sorted(labels.items()) if k != "__name__")
    text = f"{labels.get('__name__', '')}{{{inner}}}"
    return text if len(text) <= SHOWN_LABELS else text[: SHOWN_LABELS - 3] + "..."


def parse_query_response(body: bytes, where: str) -> list[QuerySample]:
    """The samples of an instant query's answer, every value finite; ``where`` starts every
    error line (it names the source)."""
    try:
        raw = json.loads(body)
    except (ValueError, RecursionError):
        raise SourceError(f"{where}: the answer is not JSON") from None
    try:
        answer = _ApiAnswer.model_validate(raw)
    except ValidationError:
        raise SourceError(f"{where}: the answer is not a Prometheus API response") from None
    if answer.status == "error":
        raise SourceError(f"{where}: Prometheus says {answer.error_type}: {answer.error}")
    if answer.data is None:
        raise SourceError(f"{where}: the answer has no data")
    kind, result = answer.data.result_type, answer.data.result
    try:
        if kind == "scalar":
            at, text = _VectorSample(value=result).value
            samples = [(dict[str, str](), at, text)]
        elif kind == "vector":
            if not isinstance(result, list):
                raise SourceError(f"{where}: the vector answer is not a list")
            parsed = [_VectorSample.model_validate(item) for item in result]
            samples = [(s.metric, s.value[0], s.value[1]) for s in parsed]
        else:
            raise SourceError(
                f"{where}: the query returns a {kind}; it must return an instant vector or a "
                "scalar (aggregate a range vector, e.g. with max_over_time)"
            )
    except ValidationError:
        raise SourceError(f"{where}: the {kind} answer is malformed") from None
    return [_finite(labels, at, text, where) for labels, at, text in samples]


def _finite(labels: dict[str, str], at: float, text: str, where: str) -> QuerySample:
    try:
        value = float(text)
    except ValueError:
        raise SourceError(f"{where}: series {series_name(labels)} has value {text!r}") from None
    if not math.isfinite(value):
        raise SourceError(f"{where}: series {series_name(labels)} is {text}")
    if not math.isfinite(at):
        raise SourceError(f"{where}: series {series_name(labels)} has no valid timestamp")
    return QuerySample(labels, at, value)


class _PrometheusApi:
    """Instant queries over HTTP (stdlib only); every failure is one ``SourceError`` line."""

    def __init__(self, url: str, timeout_s: float, token_env: str | None, where: str) -> None:
        self.endpoint = url.rstrip("/") + "/api/v1/query"
        self.timeout_s = timeout_s
        self.token_env = token_env
        self.where = where

    def instant(self, query: str, at: float | None = None) -> list[QuerySample]:
        params = {"query": query, "timeout": f"{self.timeout_s:g}s"}
        if at is not None:
            params["time"] = repr(at)
        request = urllib.request.Request(
            f"{self.endpoint}?{urllib.parse.urlencode(params)}", headers=self._headers()
        )
        return parse_query_response(self._fetch(request), self.where)

    def _headers(self) -> dict[str, str]:
        headers = {"Accept": "application/json"}
        if self.token_env is not None:
            token = os.environ.get(self.token_env)
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
        if len(body) > MAX_BODY:
            raise SourceError(f"{self.where}: the answer is larger than {MAX_BODY} bytes")
        return body

    def _http_error(self, exc: urllib.error.HTTPError) -> str:
        """Prometheus explains a bad query (400, 422) or an overloaded server (503) in a JSON
        body; that explanation is the useful part of the line."""
        status = f"HTTP {exc.code} {exc.reason}".strip()
        try:
            detail = _ApiAnswer.model_validate(json.loads(exc.read(MAX_BODY)))
        except (ValueError, ValidationError, OSError, RecursionError):
            return status
        if detail.error:
            return f"{status}: Prometheus says {detail.error_type}: {detail.error}"
        return status

    def _unreachable(self, reason: object) -> str:
        if isinstance(reason, TimeoutError | socket.timeout):
            return f"timed out after {self.timeout_s:g}s"
        if isinstance(reason, OSError) and reason.strerror:
            return f"cannot reach {self.endpoint} ({reason.strerror})"
        return f"cannot reach {self.endpoint} ({reason})"


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


def demand_from_samples(
    samples: Sequence[QuerySample], settings: PrometheusQueueSettings, now: float, where: str
) -> list[DemandGroup]:
    """Each series' value rounded up is a number of jobs (half a job waiting still needs a whole
    one's GPUs), grouped by the partition label when one is set; the answer must be fresh."""
    if not samples and settings.empty_result == "error":
        raise SourceError(
            f"{where}: the query matched no series (set empty_result: zero if that means no work)"
        )
    jobs: dict[str | None, int] = {}
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
        partition = None
        if settings.partition_label is not None:
            partition = sample.labels.get(settings.partition_label)
            if partition is None:
                raise SourceError(
                    f"{where}: series {name} has no {settings.partition_label!r} label "
                    "(partition_label)"
                )
        jobs[partition] = jobs.get(partition, 0) + math.ceil(sample.value)
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
        )
        for partition, count in sorted(jobs.items(), key=lambda item: item[0] or "")
        if count > 0
    ]


class PrometheusQueueSource:
    def __init__(self, settings: PrometheusQueueSettings, name: str) -> None:
        self.settings = settings
        self.name = name
        self.where = f"prometheus source {name!r}"
        self._api = _PrometheusApi(
            settings.url, settings.timeout_s, settings.bearer_token_env, self.where
        )

    @classmethod
    def from_config(cls, settings: Mapping[str, Any], name: str) -> PrometheusQueueSource:
        parsed = validate_settings(PrometheusQueueSettings, dict(settings), field=f"sources.{name}")
        return cls(parsed, name)

    def read(self, now: float) -> Sequence[DemandGroup]:
        samples = self._api.instant(self.settings.query)
        return demand_from_samples(samples, self.settings, now, self.where)


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
        utilisation = self._api.instant(self.settings.query)
        if not utilisation:
            raise SourceError(f"{self.where}: the query {self.settings.query!r} matched no series")
        evaluated = utilisation[0].at
        scraped = {
            _identity(s.labels): s.value
            for s in self._api.instant(f"timestamp({self.settings.query})", evaluated)
        }
        memory: dict[tuple[str, str], float] = {}
        if self.settings.memory_query is not None:
            for sample in self._api.instant(self.settings.memory_query, evaluated):
                memory[self._gpu_of(sample)] = sample.value
        readings: dict[tuple[str, str], GpuSample] = {}
        for sample in utilisation:
            host, gpu = self._gpu_of(sample)
            if not 0.0 <= sample.value <= 100.0:
                raise SourceError(
                    f"{self.where}: series {series_name(sample.labels)} is {sample.value:g}, "
                    "not a utilisation percentage"
                )
            reading = GpuSample(
                host=host,
                gpu=gpu,
                util_pct=sample.value,
                at=scraped.get(_identity(sample.labels), sample.at),
                uuid=sample.labels.get(self.settings.uuid_label),
                model=sample.labels.get(self.settings.model_label),
                memory_used_mib=memory.get((host, gpu)),
            )
            known = readings.get((host, gpu))
            if known is None or reading.at > known.at:
                readings[(host, gpu)] = reading
        return list(readings.values())

    def _gpu_of(self, sample: QuerySample) -> tuple[str, str]:
        wanted = (self.settings.host_label, self.settings.gpu_label)
        missing = [label for label in wanted if not sample.labels.get(label)]
        if missing:
            raise SourceError(
                f"{self.where}: series {series_name(sample.labels)} has no "
                f"{' or '.join(repr(m) for m in missing)} label"
            )
        return sample.labels[wanted[0]], sample.labels[wanted[1]]


def _identity(labels: Mapping[str, str]) -> frozenset[tuple[str, str]]:
    """A series without its metric name, which ``timestamp()`` drops."""
    return frozenset((k, v) for k, v in labels.items() if k != "__name__")
