"""The controller's one YAML config file and its validation."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import (
    Field,
    NonNegativeFloat,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    model_validator,
)

from autoscaler.inputfile import LocatedDocument, read_yaml, validate_document
from autoscaler.model import Frozen, Name, Pool


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
    max_launches_per_tick: PositiveInt = 50
    max_drains_per_tick: PositiveInt = 50
    scale_up_cooldown_s: NonNegativeFloat = 0.0
    scale_down_cooldown_s: NonNegativeFloat = 300.0


class PolicyConfig(Frozen):
    name: str = "cost-aware"
    params: dict[str, Any] = Field(default_factory=dict)


class SourceConfig(Frozen):
    """A queue source: which kind (an entry point in ``gpu_autoscaler.sources``) and its settings,
    which the source checks itself."""

    kind: str
    name: str | None = None
    settings: dict[str, Any] = Field(default_factory=dict)


class ControllerConfig(Frozen):
    fleet_id: Name
    tick_seconds: PositiveFloat = 60.0
    policy: PolicyConfig = PolicyConfig()
    providers: dict[str, dict[str, Any]] = Field(default_factory=dict)
    sources: tuple[SourceConfig, ...] = ()
    pools: tuple[Pool, ...] = ()
    limits: Limits = Limits()
    capacity_cache_ttl_s: NonNegativeFloat = 300.0
    risky_pool_ttl_s: NonNegativeFloat = 3600.0
    drain_timeout_s: NonNegativeFloat = 3600.0
    request_timeout_s: PositiveFloat = 600.0

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

    def pool(self, name: str) -> Pool:
        for pool in self.pools:
            if pool.name == name:
                return pool
        raise KeyError(name)


def load_config(path: Path | str) -> ControllerConfig:
    return config_from_document(read_yaml(path))


def config_from_document(
    document: LocatedDocument, at: tuple[int | str, ...] = ()
) -> ControllerConfig:
    return validate_document(ControllerConfig, document, at=at)
