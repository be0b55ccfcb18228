"""The shape of the jobs a counting queue source reports (Redis, SQS, Prometheus): settings each
such source shares, and the shape fields a queue item may carry of its own.

A counting source knows how many jobs wait, not what each needs of a node; its settings say it
(``nodes``, ``gpu_models``, ``min_gpu_memory_gib`` next to the source's GPUs per job). A Redis
item may say it itself (``item_shape``): a JSON object or a stream entry with the fields
``gpus`` (the whole job's) or ``gpus_per_node``, ``nodes``, ``gpu_model`` or ``gpu_models``, and
``min_gpu_memory_gib``. What an item leaves out comes from the settings, so producers that send
no shape keep working unchanged.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Mapping
from typing import Annotated, Any, ClassVar, NamedTuple

from pydantic import BaseModel, ConfigDict, Field, PositiveFloat, PositiveInt, model_validator

MAX_JOB_NODES = 100_000
MAX_GPUS_PER_NODE = 1024
SHAPE_FIELDS = ("gpus", "gpus_per_node", "nodes", "gpu_model", "gpu_models", "min_gpu_memory_gib")
_MODEL_SEPARATORS = re.compile(r"[|,\s]+")
_WHOLE = re.compile(r"[0-9]{1,12}")
# Strings longer than this are remembered by a digest, so a queue of huge items cannot grow the
# shape cache by their size.
_KEY_CHARS = 256
_FIELD_WORDS = ('"gpus', '"nodes"', '"gpu_model', '"min_gpu_memory_gib"')

ModelName = Annotated[str, Field(min_length=1, max_length=128, pattern=r"^\S(.*\S)?$")]


class JobShape(NamedTuple):
    """What one job needs: ``gpus`` in all, over ``nodes`` nodes at once (the same on each),
    one of ``gpu_models`` (any when empty, sorted, each once) with at least
    ``min_gpu_memory_gib`` per GPU (any when None)."""

    gpus: int
    nodes: int = 1
    gpu_models: tuple[str, ...] = ()
    min_gpu_memory_gib: float | None = None


class BadShapeError(ValueError):
    """An item's shape field we cannot use; the message names the field."""


def canonical_models(names: tuple[str, ...] | list[str]) -> tuple[str, ...]:
    """Sorted and each once, so that jobs accepting the same models fall in one group whoever
    wrote them."""
    return tuple(sorted(set(names)))


class ShapeSettings(BaseModel):
    """The shape of every job a source counts. Subclasses name their GPUs-per-job field in
    ``gpus_field``; it is the whole job's, split evenly over ``nodes``."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    gpus_field: ClassVar[str] = "gpus"

    nodes: PositiveInt = Field(
        1, le=MAX_JOB_NODES, description="nodes each job needs at once (a multi-node job)"
    )
    gpu_models: tuple[ModelName, ...] = Field(
        (), description="GPU models the jobs accept (any when empty)"
    )
    min_gpu_memory_gib: PositiveFloat | None = Field(
        None, description="memory each GPU must have, in GiB (any when unset)"
    )

    @model_validator(mode="after")
    def _whole_nodes(self) -> ShapeSettings:
        gpus = int(getattr(self, self.gpus_field))
        if gpus % self.nodes:
            raise ValueError(
                f"{self.gpus_field} ({gpus}) is each job's total and must be a multiple of "
                f"nodes ({self.nodes}): every node of a job gets the same GPUs"
            )
        if gpus // self.nodes > MAX_GPUS_PER_NODE:
            raise ValueError(
                f"{self.gpus_field} ({gpus}) over {self.nodes} node(s) is more than "
                f"{MAX_GPUS_PER_NODE} GPUs per node"
            )
        return self

    def job_shape(self) -> JobShape:
        return JobShape(
            int(getattr(self, self.gpus_field)),
            self.nodes,
            canonical_models(self.gpu_models),
            self.min_gpu_memory_gib,
        )


def item_shape(fields: Mapping[str, Any], default: JobShape) -> JobShape:
    """The shape an item states, its gaps filled from ``default``. Values may be JSON numbers or,
    as in stream entries, strings of them; ``gpu_models`` a list or ``a100|h100``. An item that
    names nodes but no GPUs gets the default's GPUs per node on each. Raises
    ``BadShapeError``."""
    if not any(name in fields for name in SHAPE_FIELDS):
        return default
    nodes = _whole(fields, "nodes", MAX_JOB_NODES)
    nodes = default.nodes if nodes is None else nodes
    total = _whole(fields, "gpus", MAX_JOB_NODES * MAX_GPUS_PER_NODE)
    per_node = _whole(fields, "gpus_per_node", MAX_GPUS_PER_NODE)
    if total is not None and per_node is not None and total != per_node * nodes:
        raise BadShapeError(
            f"gpus {total} is not gpus_per_node {per_node} times nodes {nodes}: give one of them"
        )
    if total is None:
        per_node = default.gpus // default.nodes if per_node is None else per_node
        total = per_node * nodes
    if total % nodes:
        raise BadShapeError(f"gpus {total} is not a multiple of nodes {nodes}")
    if total // nodes > MAX_GPUS_PER_NODE:
        raise BadShapeError(f"gpus {total} over {nodes} node(s) is more than {MAX_GPUS_PER_NODE}")
    models = _models(fields)
    memory = _memory(fields)
    return JobShape(
        total,
        nodes,
        default.gpu_models if models is None else models,
        default.min_gpu_memory_gib if memory is None else memory,
    )


class ShapeReader:
    """``item_shape`` with the answers remembered by the values of the shape fields: a queue of
    thousands of items has a handful of distinct shapes, so each is worked out once per source."""

    def __init__(self, default: JobShape, remembered: int = 4096) -> None:
        self.default = default
        self.remembered = remembered
        self._known: dict[tuple[Any, ...], JobShape | str] = {}

    def shape(self, fields: Mapping[str, Any]) -> JobShape:
        key = tuple(_hashable(fields.get(name)) for name in SHAPE_FIELDS)
        found = self._known.get(key)
        if found is None:
            try:
                found = item_shape(fields, self.default)
            except BadShapeError as exc:
                found = str(exc)
            if len(self._known) >= self.remembered:
                self._known.clear()
            self._known[key] = found
        if isinstance(found, str):
            raise BadShapeError(found)
        return found


def _hashable(value: Any) -> Any:
    """A bounded key for a field's value. A list is keyed by its scalars; anything nested in it,
    and any object, is refused by every shape field whatever it holds, so it needs no more."""
    if isinstance(value, list):
        return ("list", *(_scalar(v) for v in value))
    if isinstance(value, dict):
        return ("dict",)
    return _scalar(value)


def _scalar(value: Any) -> Any:
    if isinstance(value, str) and len(value) > _KEY_CHARS:
        return ("str", len(value), hashlib.blake2b(value.encode(errors="replace")).digest())
    if value is None or isinstance(value, str | int | float | bool):
        return (type(value).__name__, value)
    return ("nested",)


def json_item_fields(item: str) -> Mapping[str, Any] | None:
    """A list item's fields when it is a JSON object naming some shape field; None for any other
    payload (a job id, a path, JSON of another kind), which has the source's shape."""
    if not item.lstrip().startswith("{") or not any(word in item for word in _FIELD_WORDS):
        return None
    try:
        value = json.loads(item)
    except (ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


def _whole(fields: Mapping[str, Any], name: str, most: int) -> int | None:
    value = fields.get(name)
    if value is None:
        return None
    if isinstance(value, str) and _WHOLE.fullmatch(value.strip()):
        number = int(value)
    elif isinstance(value, int) and not isinstance(value, bool):
        number = value
    else:
        raise BadShapeError(f"{name} {_shown(value)} is not a whole number")
    if not 1 <= number <= most:
        raise BadShapeError(f"{name} {_shown(number)} is not between 1 and {most:,}")
    return number


def _models(fields: Mapping[str, Any]) -> tuple[str, ...] | None:
    one, many = fields.get("gpu_model"), fields.get("gpu_models")
    if one is not None and many is not None:
        raise BadShapeError("gives both gpu_model and gpu_models: give one")
    if one is not None:
        if not isinstance(one, str) or not one.strip() or len(one) > 128:
            raise BadShapeError(f"gpu_model {_shown(one)} is not a model name")
        return (one.strip(),)
    if many is None:
        return None
    if isinstance(many, str):
        text = many.strip()
        if text.startswith("["):
            try:
                many = json.loads(text)
            except (ValueError, RecursionError):
                raise BadShapeError(f"gpu_models {_shown(text)} is not a list of names") from None
        else:
            many = [name for name in _MODEL_SEPARATORS.split(text) if name]
    if not isinstance(many, list) or not all(
        isinstance(name, str) and name.strip() and len(name) <= 128 for name in many
    ):
        raise BadShapeError(f"gpu_models {_shown(many)} is not a list of model names")
    return canonical_models([name.strip() for name in many])


def _memory(fields: Mapping[str, Any]) -> float | None:
    value = fields.get("min_gpu_memory_gib")
    if value is None:
        return None
    try:
        number = float(value) if isinstance(value, str | int | float) else math.nan
    except ValueError:
        number = math.nan
    if isinstance(value, bool) or not math.isfinite(number) or not 0 < number <= 1e6:
        raise BadShapeError(f"min_gpu_memory_gib {_shown(value)} is not a positive size in GiB")
    return number


def _shown(value: Any) -> str:
    """A value for a message, bounded whatever it is (a structure nested a thousand deep, a
    4,000-digit number, a megabyte of text)."""
    if isinstance(value, dict):
        return "a JSON object"
    if isinstance(value, list):
        return f"a list of {len(value)}" if len(value) > 8 else _shown_list(value)
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > 10**30:
        return "a number of more than 30 digits"
    text = repr(value[:61] if isinstance(value, str) else value)
    return text if len(text) <= 60 else text[:57] + "..."


def _shown_list(value: list[Any]) -> str:
    if any(isinstance(v, list | dict) for v in value):
        return "a nested list"
    text = "[" + ", ".join(_shown(v) for v in value) + "]"
    return text if len(text) <= 60 else text[:57] + "..."
