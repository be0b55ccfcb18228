"""The ``placement`` pool option the cloud providers share: which placement group, compact
placement policy or proximity placement group a multi-node job's nodes are launched into.

A gang's nodes talk to each other constantly (NCCL all-reduce), so they are launched close
together. Each cloud has its own object for that; the option names one that exists, or asks the
provider to create one for the pool (with a name derived from the fleet and pool, the same on
every restart, so a second controller or a restart finds it instead of making another).

Only ``launch_gang`` uses it: an ordinary launch is not constrained to one rack, where capacity
is scarcer.
"""

from __future__ import annotations

import hashlib
import re
import threading
from collections.abc import Callable

from pydantic import BaseModel, ConfigDict, Field, model_validator

# What every cloud accepts: lowercase letters, digits and hyphens, starting with a letter and
# ending with a letter or digit (GCP resource names are the strictest: at most 63).
DERIVED_MAX = 63


class PlacementOption(BaseModel):
    """``options.placement`` of a pool: ``{name: X}`` uses an existing group, ``{create: true}``
    creates one named after the fleet and pool if it is not there, ``{name: X, create: true}``
    creates X if it is not there."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str | None = Field(
        None, min_length=1, description="an existing group, or the one to make"
    )
    create: bool = Field(False, description="create the group if it does not exist")

    @model_validator(mode="after")
    def _something(self) -> PlacementOption:
        if self.name is None and not self.create:
            raise ValueError("give the name of an existing group, or create: true (or both)")
        return self


def derived_name(fleet_id: str, pool: str, max_length: int = DERIVED_MAX) -> str:
    """The group name a pool's ``{create: true}`` makes: readable (``ga-<fleet>-<pool>``) and
    unique per fleet and pool (a hash of both ends it, since squeezing the names into the
    cloud's alphabet can make two pairs read the same)."""
    digest = hashlib.sha256(f"{fleet_id}\n{pool}".encode()).hexdigest()[:10]
    readable = re.sub(r"[^a-z0-9]+", "-", f"{fleet_id}-{pool}".lower()).strip("-")
    room = max_length - len("ga--") - len(digest)
    readable = readable[:room].strip("-")
    return f"ga-{readable}-{digest}" if readable else f"ga-{digest}"


def group_name(option: PlacementOption, fleet_id: str, pool: str) -> str:
    return option.name if option.name is not None else derived_name(fleet_id, pool)


class KnownGroups:
    """Per pool, the group its gangs launch into, once found (or made): a provider looks it up
    the first time a gang of the pool launches, not every time. Safe across the controller's
    threads; two racing first lookups both find (or make) the same derived name."""

    def __init__(self) -> None:
        self._known: dict[str, str] = {}
        self._lock = threading.Lock()

    def get(
        self,
        option: PlacementOption | None,
        fleet_id: str,
        pool: str,
        find: Callable[[PlacementOption, str], str],
    ) -> str | None:
        """None for a pool without the option; else what ``find(option, name)`` returned for
        the pool's group name (the name itself, or the cloud's id for it), remembered."""
        if option is None:
            return None
        with self._lock:
            known = self._known.get(pool)
        if known is not None:
            return known
        found = find(option, group_name(option, fleet_id, pool))
        with self._lock:
            self._known[pool] = found
        return found

    def forget(self, pool: str) -> None:
        """The pool's group is gone (deleted behind our back): look it up again next time."""
        with self._lock:
            self._known.pop(pool, None)
