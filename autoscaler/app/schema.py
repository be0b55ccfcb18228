"""The controller config's JSON Schema, with every installed plugin's own settings in it.

The config holds free-form blocks that only a plugin knows: ``providers.<name>``, a pool's
``options`` (its provider's), a source's ``settings`` (its kind's) and ``policy.params`` (the
policy's). Each plugin class names the pydantic model of its block, the model ``from_config``
checks it with: a policy's ``Params``, a source's ``Settings``, a provider's ``Settings`` and
``PoolOptions``. The schema puts those models in place of the free-form dicts, one variant per
installed plugin, discriminated by ``provider``, ``kind`` or ``name`` (JSON Schema ``oneOf``
with a ``const`` each, plus the OpenAPI ``discriminator`` mapping some editors read). A plugin
that names no model keeps a free-form block. An editor pointed at the schema
(yaml-language-server) completes and checks the same fields ``validate`` does; ``validate``
remains the whole check (the schema cannot say that a zone lies in its region, or that a pool's
user data and startup script are one or the other). The classes name their models as declared
by the protocols below (``NamesSettings``, ``NamesPoolOptions``, ``NamesParams``).
"""

from __future__ import annotations

import inspect
from typing import Annotated, Any, ClassVar, Literal, Protocol, Union, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model

from autoscaler.app.assembly import SOURCE_GROUP
from autoscaler.model import Pool
from autoscaler.model.config import ControllerConfig, PolicyConfig, SourceConfig
from autoscaler.model.errors import InputError
from autoscaler.model.plugins import installed, load_installed
from autoscaler.spi.policy import POLICY_GROUP, PROVIDER_GROUP

JSON_SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"
DEFAULT_POLICY = PolicyConfig().name


def config_schema() -> dict[str, Any]:
    """The JSON Schema of the controller config, for the plugins installed now."""
    schema_model = create_model(
        "ControllerConfig",
        __base__=ControllerConfig,
        policy=(_policies(), Field(default_factory=PolicyConfig)),
        providers=(_providers(), Field(default_factory=dict)),
        sources=(_many(_sources()), ()),
        pools=(_many(_pools()), ()),
    )
    schema = schema_model.model_json_schema()
    schema["title"] = "gpu-autoscaler controller config"
    schema["description"] = (
        "The controller config of hybrid-gpu-autoscaler (gpu-autoscaler run --config FILE), "
        "with the settings of the plugins installed where `gpu-autoscaler schema` ran. "
        "`gpu-autoscaler validate --config FILE` checks everything this schema says and more."
    )
    return {"$schema": JSON_SCHEMA_DIALECT, **schema}


def _plugins(group: str) -> dict[str, object]:
    """The installed plugin classes of ``group`` by name; one that fails to load (None here)
    keeps its variant with a free-form block rather than failing the export."""
    classes: dict[str, object] = {}
    for name in installed(group):
        try:
            classes[name] = load_installed(group, name, "plugin", "schema")
        except InputError:
            classes[name] = None
    return classes


@runtime_checkable
class NamesSettings(Protocol):
    """A provider or source class that names the model of its settings block."""

    Settings: ClassVar[type[BaseModel]]


@runtime_checkable
class NamesPoolOptions(Protocol):
    """A provider class that names the model of its pools' ``options``."""

    PoolOptions: ClassVar[type[BaseModel]]


@runtime_checkable
class NamesParams(Protocol):
    """A policy class (``autoscaler.spi.policy.PolicyClass``): its ``Params`` model."""

    Params: ClassVar[type[BaseModel]]


def _model(model: object) -> type[BaseModel] | None:
    return model if isinstance(model, type) and issubclass(model, BaseModel) else None


def _settings(cls: object) -> type[BaseModel] | None:
    return _model(cls.Settings) if isinstance(cls, NamesSettings) else None


def _pool_options(cls: object) -> type[BaseModel] | None:
    return _model(cls.PoolOptions) if isinstance(cls, NamesPoolOptions) else None


def _params(cls: object) -> type[BaseModel] | None:
    return _model(cls.Params) if isinstance(cls, NamesParams) else None


def _block(model: type[BaseModel] | None) -> tuple[Any, Any]:
    """A variant's field for a plugin's block: its model (required when the model has required
    fields), or a free-form mapping when the plugin names none."""
    if model is None:
        return dict[str, Any], Field(default_factory=dict)
    try:
        model()
    except ValidationError:
        return model, ...
    return model, Field(default_factory=model)


def _title(name: str) -> str:
    return "".join(part.capitalize() for part in name.replace("_", "-").split("-") if part)


def _many(item: Any) -> Any:
    """``tuple[item, ...]`` of a type made at run time (as the config's lists are tuples)."""
    return tuple[item, ...]


def _const(value: str) -> Any:
    """``Literal[value]``: the discriminator of one plugin's variant."""
    return Literal[value]


def _union(variants: list[Any], discriminator: str) -> Any:
    if not variants:
        return None
    if len(variants) == 1:
        return variants[0]
    return Annotated[Union[tuple(variants)], Field(discriminator=discriminator)]  # noqa: UP007


def _policies() -> Any:
    variants = []
    for name, cls in sorted(_plugins(POLICY_GROUP).items()):
        params, default = _block(_params(cls))
        # the policy may be left out: only the default one may leave out its name
        named = (_const(name), name if name == DEFAULT_POLICY else ...)
        variants.append(
            create_model(
                f"{_title(name)}Policy",
                __base__=PolicyConfig,
                __doc__=f"The {name!r} policy and its params.",
                name=named,
                params=(params, default),
            )
        )
    return _union(variants, "name") or PolicyConfig


def _providers() -> Any:
    fields: dict[str, Any] = {}
    for name, cls in sorted(_plugins(PROVIDER_GROUP).items()):
        model = _settings(cls)
        fields[name] = (
            model | None if model is not None else dict[str, Any] | None,
            Field(None, description=f"the {name} provider's settings"),
        )
    return create_model(
        "Providers",
        __config__=ConfigDict(extra="forbid"),
        __doc__="Each installed provider's settings, by its name.",
        **fields,
    )


def _sources() -> Any:
    variants = []
    for kind, cls in sorted(_plugins(SOURCE_GROUP).items()):
        settings, default = _block(_settings(cls))
        variants.append(
            create_model(
                f"{_title(kind)}Source",
                __base__=SourceConfig,
                __doc__=f"A {kind} source and its settings.",
                kind=(_const(kind), ...),
                settings=(settings, default),
            )
        )
    return _union(variants, "kind") or SourceConfig


def _pools() -> Any:
    variants = []
    for name, cls in sorted(_plugins(PROVIDER_GROUP).items()):
        options, default = _block(_pool_options(cls))
        variants.append(
            create_model(
                f"{_title(name)}Pool",
                __base__=Pool,
                __doc__=f"A pool on {name} and its {name} options."
                + (f"\n\n{inspect.cleandoc(Pool.__doc__)}" if Pool.__doc__ else ""),
                provider=(_const(name), ...),
                options=(options, default),
            )
        )
    return _union(variants, "provider") or Pool
