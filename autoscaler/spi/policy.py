"""The policy SDK: what a policy is, and how the controller finds the installed ones.

A policy is a class with a pydantic ``Params`` model and a pure ``decide(view) -> Plan``: no I/O,
no clock reads, no randomness it does not own. Plugins register the class under the entry point
group ``gpu_autoscaler.policies``; the config names it and gives its params, which are validated
by ``Params`` so an ops engineer gets a clear error for a bad value, not a surprise at 3 am.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from pydantic import BaseModel

from autoscaler.model import FleetView, Plan
from autoscaler.model.errors import InputError
from autoscaler.model.inputfile import validate_settings
from autoscaler.model.plugins import installed, load_installed

POLICY_GROUP = "gpu_autoscaler.policies"
PROVIDER_GROUP = "gpu_autoscaler.providers"


@runtime_checkable
class Policy(Protocol):
    """What the controller calls each tick. (Its class also carries a pydantic ``Params`` model;
    that is checked where the class is loaded, see ``PolicyClass``.)"""

    def decide(self, view: FleetView) -> Plan: ...


class PolicyClass(Protocol):
    """What a plugin registers: a class with a ``Params`` model, built from validated params."""

    @property
    def Params(self) -> type[BaseModel]: ...  # noqa: N802 (the class attribute plugins define)

    def __call__(self, params: Any) -> Policy: ...


@dataclass(frozen=True)
class Installed:
    name: str
    value: str
    distribution: str | None


def describe_installed(group: str) -> list[Installed]:
    return [
        Installed(name, entry.value, entry.dist.name if entry.dist is not None else None)
        for name, entry in installed(group).items()
    ]


def load_entry_point(group: str, name: str, what: str) -> Any:
    return load_installed(group, name, what, "config", field=f"{what}.name")


def policy_class(name: str) -> PolicyClass:
    cls = load_entry_point(POLICY_GROUP, name, "policy")
    params = getattr(cls, "Params", None)
    if not (isinstance(params, type) and issubclass(params, BaseModel)) or not callable(
        getattr(cls, "decide", None)
    ):
        raise InputError(
            "config",
            f"{name!r} is not a policy: it needs a pydantic Params model and a decide(view) method",
            field="policy.name",
        )
    return cls  # type: ignore[no-any-return]


def build_policy(
    cls: PolicyClass,
    params: Mapping[str, Any],
    where: str = "config",
    field_prefix: str = "policy.params",
) -> Policy:
    """Validate params against the policy's own model and build it."""
    validated = validate_settings(cls.Params, dict(params), field=field_prefix, where=where)
    return cls(validated)


def load_policy(
    name: str, params: Mapping[str, Any], where: str = "config", field_prefix: str = "policy.params"
) -> Policy:
    return build_policy(policy_class(name), params, where, field_prefix)
