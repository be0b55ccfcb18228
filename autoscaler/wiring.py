"""Building the live controller's parts from its config: providers and queue sources are found
through their entry point groups, and each checks its own settings.

A provider class offers ``from_config(settings, pools, fleet_id) -> Provider``; a queue source
class ``from_config(settings, name) -> QueueSource``. Both raise ``InputError`` naming the field.
"""

from __future__ import annotations

from typing import Any

from autoscaler.config import ControllerConfig
from autoscaler.errors import InputError
from autoscaler.policy import PROVIDER_GROUP, load_entry_point
from autoscaler.provider import Provider
from autoscaler.sources import QueueSource

SOURCE_GROUP = "gpu_autoscaler.sources"


def build_providers(config: ControllerConfig, where: str = "config") -> dict[str, Provider]:
    names = sorted({p.provider for p in config.pools} | set(config.providers))
    providers: dict[str, Provider] = {}
    for name in names:
        cls: Any = load_entry_point(PROVIDER_GROUP, name, "provider")
        factory = getattr(cls, "from_config", None)
        if factory is None:
            raise InputError(
                where,
                f"the provider {name!r} runs only inside the simulator",
                field=f"providers.{name}",
            )
        pools = [p for p in config.pools if p.provider == name]
        providers[name] = factory(config.providers.get(name, {}), pools, config.fleet_id)
    return providers


def build_sources(config: ControllerConfig) -> list[QueueSource]:
    sources: list[QueueSource] = []
    for index, spec in enumerate(config.sources):
        cls: Any = load_entry_point(SOURCE_GROUP, spec.kind, "source")
        sources.append(cls.from_config(spec.settings, spec.name or f"{spec.kind}-{index}"))
    return sources
