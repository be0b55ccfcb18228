"""The base of every value object, in a module of its own so that the model's modules that
``domain`` itself builds on (``sharing``, for ``Pool.gpu_sharing``) can use it without a cycle."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Frozen(BaseModel):
    """Base for value objects: immutable, and strict about unknown fields."""

    model_config = ConfigDict(frozen=True, extra="forbid")
