"""The controller's one YAML config file and its validation.

A config read from a file keeps the document it came from, so the code that builds the
controller's parts from it (``autoscaler.app.assembly``) can name the file and line of a setting its
providers and sources refuse, as pydantic's own errors do.
"""

from __future__ import annotations

import re
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    Field,
    NonNegativeFloat,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    PrivateAttr,
    model_validator,
)
from pydantic_core import PydanticCustomError

from autoscaler.model import Frozen, Name, Pool, gpu_model_matches
from autoscaler.model.catalog import gpu_facts
from autoscaler.model.errors import InputError
from autoscaler.model.gpus import memory_gib
from autoscaler.model.inputfile import Loc, LocatedDocument, read_yaml, relocate, validate_document
from autoscaler.model.secrets import looks_like_variable_name
from autoscaler.model.teams import TeamsConfig

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
_PLACE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:/+-]{0,127}$")
_PRINTABLE = re.compile(r"^[^\x00-\x1f\x7f]{1,128}$")


def _env_name(value: str) -> str:
    """A field that names an environment variable. A value that is not a name may be the
    secret itself pasted by mistake, so the error never quotes it (the ``no_echo`` prefix tells
    ``autoscaler.model.inputfile`` to leave the value out)."""
    if not _ENV_NAME.match(value) or not looks_like_variable_name(value):
        raise PydanticCustomError(
            "no_echo_env_name",
            "expected the NAME of an environment variable (letters, digits and _), not its "
            "value; the value given is not shown in case it is a secret",
        )
    return value


def _path(value: Path) -> Path:
    text = str(value)
    if not text or len(text) > 4096 or any(ord(c) < 0x20 or ord(c) == 0x7F for c in text):
        raise ValueError("expected a file path of printable characters")
    return value


EnvName = Annotated[str, AfterValidator(_env_name)]
FilePath = Annotated[Path, AfterValidator(_path)]


class Limits(Frozen):
    """Hard limits the guard enforces whatever the policy asks for.

    Rates are per tick: with the default 60 s tick, ``max_launches_per_tick`` is a per-minute rate.
    Cool-downs are per pool: after a scale-up, the pool neither scales up again for
    ``scale_up_cooldown_s`` nor drains for ``scale_down_cooldown_s`` (capacity just bought is not
    thrown away on the next wobble of the queue).
    """

    max_instances: NonNegativeInt | None = None
    max_gpus: NonNegativeInt | None = None
    max_cost_per_hour: NonNegativeFloat | None = None
    max_cost_per_month: NonNegativeFloat | None = None
    max_launches_per_tick: PositiveInt = 50
    max_drains_per_tick: PositiveInt = 50
    # Running jobs moved off on-prem nodes per tick to make room (``rebalance_onprem``): each
    # move costs the job a checkpoint write and a restart.
    max_job_moves_per_tick: PositiveInt = 20
    scale_up_cooldown_s: NonNegativeFloat = 0.0
    scale_down_cooldown_s: NonNegativeFloat = 300.0


class PolicyConfig(Frozen):
    name: str = "cost-aware"
    params: dict[str, Any] = Field(default_factory=dict)


class SourceRole(StrEnum):
    QUEUE = "queue"
    NODES = "nodes"
    TELEMETRY = "telemetry"
    SCHEDULER = "scheduler"


class SourceConfig(Frozen):
    """A source: which kind (an entry point in ``gpu_autoscaler.sources``) and its settings, which
    the source checks itself. One source may play several roles (Slurm is a queue, the node source
    and the scheduler); ``roles`` narrows them, and by default it plays every role it can."""

    kind: Name
    name: Name | None = None
    roles: tuple[SourceRole, ...] | None = None
    settings: dict[str, Any] = Field(default_factory=dict)


class TelemetryConfig(Frozen):
    """How GPU readings become the utilisation and idle time a policy sees: a GPU is idle below
    ``idle_util_pct``; utilisation is the mean over ``window_s``; a node with no reading newer
    than ``max_age_s`` is unknown (never idle)."""

    idle_util_pct: float = Field(5.0, ge=0, le=100)
    window_s: PositiveFloat = 600.0
    max_age_s: PositiveFloat = 180.0


class Listen(Frozen):
    """An address to serve on: a host name or IP address, and a port (0: any free one)."""

    host: str = Field("0.0.0.0", pattern=r"^[A-Za-z0-9_.:%-]{1,253}$")
    port: int = Field(ge=0, le=65535)


class InboxConfig(Frozen):
    """Where node agents post the interruption notices they read on the node. The shared token
    comes from the environment variable ``token_env`` or from ``token_file``, never from the
    config itself; TLS when ``tls_cert`` and ``tls_key`` are set."""

    listen: Listen = Listen(port=8081)
    token_env: EnvName = "GPU_AUTOSCALER_TOKEN"
    token_file: FilePath | None = None
    tls_cert: FilePath | None = None
    tls_key: FilePath | None = None

    @model_validator(mode="after")
    def _both_tls_files(self) -> InboxConfig:
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("tls_cert and tls_key go together: set both or neither")
        return self


class JournalConfig(Frozen):
    """Where every decision, action and dollar is recorded: an SQLite file by default, or the
    PostgreSQL database whose DSN is in the environment variable ``postgres_dsn_env`` (the DSN
    carries a password, so it never sits in the config)."""

    enabled: bool = True
    sqlite_path: FilePath = Path("gpu-autoscaler-journal.db")
    postgres_dsn_env: EnvName | None = None


class LeaderKind(StrEnum):
    AUTO = "auto"
    NONE = "none"
    POSTGRES = "postgres"
    KUBERNETES = "kubernetes"


class LeaderConfig(Frozen):
    """Which lock keeps two replicas from acting at once. ``auto``: a Kubernetes Lease when
    running in a cluster (``KUBERNETES_SERVICE_HOST`` is set), else a PostgreSQL advisory lock
    when the journal is in PostgreSQL, else none (a single replica)."""

    kind: LeaderKind = LeaderKind.AUTO
    name: Name = "gpu-autoscaler"
    namespace: Name | None = None
    lease_seconds: PositiveFloat = 15.0


class MetricsConfig(Frozen):
    """Where the controller serves its Prometheus metrics (``/metrics``)."""

    listen: Listen = Listen(port=9108)


class InterruptionConfig(Frozen):
    """How jobs leave a node that is going away, by what each can save.

    On a notice, a job is asked to checkpoint when its expected checkpoint time plus
    ``checkpoint_margin_s`` fits before the deadline less ``requeue_lead_s`` (the time a requeue
    needs); on a rebalance recommendation, with ``act_on_rebalance``, jobs whose checkpoint is
    younger than ``fresh_checkpoint_s`` move at once and the rest as soon as they next save. On
    a scale-down whose jobs outlast ``drain_timeout_s``, a job may be waited on for up to
    ``drain_checkpoint_wait_s`` more for its next checkpoint. ``checkpoint_aware: false`` turns
    all of this off (nodes are drained, and their jobs lose what they have not saved): the
    baseline the dry-run report compares with.
    """

    checkpoint_aware: bool = True
    checkpoint_margin_s: NonNegativeFloat = 10.0
    requeue_lead_s: NonNegativeFloat = 5.0
    act_on_rebalance: bool = False
    fresh_checkpoint_s: PositiveFloat = 300.0
    drain_checkpoint_wait_s: NonNegativeFloat = 600.0


class ControllerConfig(Frozen):
    fleet_id: Name
    tick_seconds: PositiveFloat = 60.0
    policy: PolicyConfig = PolicyConfig()
    providers: dict[Name, dict[str, Any]] = Field(default_factory=dict)
    sources: tuple[SourceConfig, ...] = ()
    telemetry: TelemetryConfig = TelemetryConfig()
    interruptions: InterruptionConfig = InterruptionConfig()
    inbox: InboxConfig | None = None
    metrics: MetricsConfig | None = None
    journal: JournalConfig = JournalConfig()
    leader: LeaderConfig = LeaderConfig()
    pools: tuple[Annotated[Pool, AfterValidator(_checked_pool)], ...] = ()
    limits: Limits = Limits()
    capacity_cache_ttl_s: NonNegativeFloat = 300.0
    risky_pool_ttl_s: NonNegativeFloat = 3600.0
    drain_timeout_s: NonNegativeFloat = 3600.0
    request_timeout_s: PositiveFloat = 600.0
    # A node not joined to the scheduler this long after its pool's boot time is replaced
    # (None: never); Karpenter's registration TTL is 15 minutes.
    registration_timeout_s: NonNegativeFloat | None = 900.0
    # Teams sharing the fleet (autoscaler/model/teams.py); None: one team, as before.
    teams: TeamsConfig | None = None

    _document: LocatedDocument | None = PrivateAttr(None)
    _at: Loc = PrivateAttr(())

    @model_validator(mode="after")
    def _unique_pool_names(self) -> ControllerConfig:
        seen: set[str] = set()
        for pool in self.pools:
            if pool.name in seen:
                raise ValueError(
                    f"pool name {pool.name!r} is used twice; pool names must be unique"
                )
            seen.add(pool.name)
        return self

    @model_validator(mode="after")
    def _caps_and_locks_have_their_stores(self) -> ControllerConfig:
        if self.limits.max_cost_per_month is not None and not self.journal.enabled:
            raise ValueError(
                "limits.max_cost_per_month reads this month's spend from the journal: "
                "enable the journal"
            )
        if self.leader.kind is LeaderKind.POSTGRES and (
            not self.journal.enabled or self.journal.postgres_dsn_env is None
        ):
            raise ValueError(
                "leader.kind postgres takes its lock in the journal's database: "
                "set journal.postgres_dsn_env"
            )
        return self

    def pool(self, name: str) -> Pool:
        for pool in self.pools:
            if pool.name == name:
                return pool
        raise KeyError(name)

    def located(
        self, error: InputError, renames: tuple[tuple[str, Loc], ...] = (), default: Loc = ()
    ) -> InputError:
        """``error``, raised by a part built from this config that knew only the dotted field
        (``pools[0].options.subnets``), pointed at the file and line of that field; unchanged
        for a config that was not read from a file. ``renames`` map the raiser's field names
        onto the config's (see ``autoscaler.model.inputfile.relocate``)."""
        if self._document is None:
            return error
        return relocate(error, self._document, renames, default=default, at=self._at)


def _checked_pool(pool: Pool) -> Pool:
    """A pool's places and instance type are names a cloud API takes (no spaces or control
    characters, at most 128), then its GPUs are filled from the catalog."""
    for name in ("region", "zone", "instance_type"):
        value = getattr(pool, name)
        if value is not None and not _PLACE.match(value):
            raise ValueError(
                f"{name}: expected up to 128 letters, digits and _ . : / + - (got {value[:40]!r})"
            )
    if pool.gpu_model is not None and not _PRINTABLE.match(pool.gpu_model):
        raise ValueError("gpu_model: expected up to 128 printable characters")
    return with_catalog_gpus(pool)


def with_catalog_gpus(pool: Pool) -> Pool:
    """The pool with its GPU model and memory per GPU filled from the shipped catalog of its
    cloud when the config leaves them out, so shapes are matched against what the instance
    really has. A model the config states that the catalog contradicts is refused: jobs would
    be bought GPUs they did not ask for."""
    facts = gpu_facts(pool.provider, pool.instance_type)
    model = pool.gpu_model
    memory = pool.gpu_memory_gib
    if facts is not None and facts.gpu_model is not None:
        if model is None:
            model = facts.gpu_model
        elif not (
            gpu_model_matches(model, facts.gpu_model) or gpu_model_matches(facts.gpu_model, model)
        ):
            raise ValueError(
                f"pool {pool.name!r}: gpu_model {model!r} does not match the {pool.provider} "
                f"catalog ({facts.catalog}), which lists {pool.instance_type} with "
                f"{facts.gpu_model!r} GPUs; fix gpu_model or instance_type"
            )
        if memory is None and gpu_model_matches(model, facts.gpu_model):
            memory = facts.gpu_memory_gib
    if memory is None:
        memory = memory_gib(model)
    if model == pool.gpu_model and memory == pool.gpu_memory_gib:
        return pool
    return pool.model_copy(update={"gpu_model": model, "gpu_memory_gib": memory})


def load_config(path: Path | str) -> ControllerConfig:
    return config_from_document(read_yaml(path))


def config_from_document(document: LocatedDocument, at: Loc = ()) -> ControllerConfig:
    config = validate_document(ControllerConfig, document, at=at)
    config._document = document
    config._at = at
    return config
