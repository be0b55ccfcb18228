"""The per-cloud metadata watchers, found by entry point as the controller finds providers.

A watcher package registers a class under the group ``gpu_autoscaler.metadata_watchers``; the
agent's ``--cloud NAME`` picks one, ``--cloud auto`` probes every installed one. The agent never
imports a watcher by name, so a cloud we do not ship (an OCI, a neocloud) plugs in by installing
a package, and the three built-in clouds are registered the same way in our own pyproject.

What the agent needs from a registered class (``WatcherClass``): the metadata server's usual
base URL, a cheap ``probe`` that says whether this node runs in that cloud, and ``from_context``,
which builds the node's ``Watcher`` from what the agent hands it (``WatcherContext``).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from autoscaler.model.errors import InputError
from autoscaler.model.plugins import installed, load_installed
from node_agent.metadata import NoticeHandler, NoticeMetrics, Watcher

if TYPE_CHECKING:
    from node_agent.main import AgentOptions

log = logging.getLogger(__name__)

WATCHER_GROUP = "gpu_autoscaler.metadata_watchers"
CLOUD_WORDS = ("auto", "none")
"""``--cloud``'s own words; a watcher registered under one of them cannot be chosen."""


@dataclass(frozen=True)
class WatcherContext:
    """What the agent hands a watcher class to build this node's watcher.

    ``on_notice`` is called once per new notice and returns True once the controller took it
    (Azure acknowledges only then); ``metrics`` holds the counters every watcher feeds (a
    ``PollLoop`` does that for you); ``options`` is the agent's parsed command line, where the
    built-in watchers find their own knobs (``aws_poll_s``, ``azure_ack``, ...).
    """

    cloud: str
    metadata_url: str
    on_notice: NoticeHandler
    metrics: NoticeMetrics
    options: AgentOptions


class WatcherClass(Protocol):
    """What a package registers under ``gpu_autoscaler.metadata_watchers`` (usually the
    watcher class itself, with ``probe`` a staticmethod and ``from_context`` a classmethod)."""

    @property
    def default_metadata_url(self) -> str:
        """The metadata server's base URL on a real node; ``--metadata-url NAME=URL``
        overrides it."""
        ...

    def probe(self, base_url: str, timeout_s: float) -> bool:
        """True when this cloud's metadata server answers at ``base_url`` within
        ``timeout_s``; never raises (``--cloud auto`` probes every watcher at once)."""
        ...

    def from_context(self, context: WatcherContext) -> Watcher: ...


def installed_names() -> list[str]:
    return sorted(installed(WATCHER_GROUP))


def _also() -> str:
    return " (or " + ", ".join(CLOUD_WORDS) + ")"


def watcher_class(name: str, option: str = "--cloud") -> WatcherClass:
    """The class registered as ``name``; one line naming ``option`` and the installed names
    when there is none, it fails to import, or it is not shaped like a watcher."""
    found = load_installed(WATCHER_GROUP, name, "metadata watcher", option, also=_also())
    if not _is_watcher_class(found):
        raise InputError(
            option,
            f"{name!r} is registered in {WATCHER_GROUP} but is not a metadata watcher: it needs "
            "a default_metadata_url, probe(base_url, timeout_s) and from_context(context)",
        )
    return found  # type: ignore[no-any-return]


def _is_watcher_class(found: Any) -> bool:
    return (
        isinstance(getattr(found, "default_metadata_url", None), str)
        and callable(getattr(found, "probe", None))
        and callable(getattr(found, "from_context", None))
    )


def check_name(name: str, option: str) -> None:
    """Raises unless ``name`` is an installed watcher (without importing it)."""
    if name in CLOUD_WORDS or name not in installed(WATCHER_GROUP):
        choices = ", ".join(installed_names()) or "none"
        raise InputError(
            option, f"no metadata watcher named {name!r} is installed; installed: {choices}"
        )


def every_watcher() -> dict[str, WatcherClass]:
    """Every installed watcher that loads, for ``--cloud auto``: one that does not is logged
    and left out, so a broken plugin never leaves a node deaf to the clouds that work."""
    found: dict[str, WatcherClass] = {}
    for name in installed_names():
        if name in CLOUD_WORDS:
            continue
        try:
            found[name] = watcher_class(name, option="--cloud auto")
        except InputError as exc:
            log.warning("%s; not probing it", exc)
    return found


def metadata_urls(classes: Mapping[str, WatcherClass], given: Mapping[str, str]) -> dict[str, str]:
    """Each watcher's base URL: the one given on the command line, else its own default."""
    return {name: given.get(name, cls.default_metadata_url) for name, cls in classes.items()}
