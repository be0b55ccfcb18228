"""Finding what is installed under an entry-point group, and loading one by the name a user gave.

Policies, providers and sources (the controller) and metadata watchers (the node agent) are all
found this way, so an installed package adds one without a change here. It lives in the model
because both the controller's SPI and the node agent, which may depend on nothing else, need it.
A name that is not installed, or that fails to load, is one ``InputError`` naming the option or
config field and the installed names, never a traceback.
"""

from __future__ import annotations

from importlib.metadata import EntryPoint, entry_points
from typing import Any

from autoscaler.model.errors import InputError, describe


def installed(group: str) -> dict[str, EntryPoint]:
    """Entry points of ``group`` by name; the first registration of a name wins, as pip would."""
    found: dict[str, EntryPoint] = {}
    for entry in sorted(entry_points(group=group), key=lambda e: e.name):
        found.setdefault(entry.name, entry)
    return found


def load_installed(
    group: str, name: str, what: str, where: str, field: str | None = None, *, also: str = ""
) -> Any:
    """The object registered as ``name`` in ``group``. ``what`` names the kind of plugin in the
    error (``policy``, ``metadata watcher``), ``where``/``field`` the option or config field the
    name came from, and ``also`` any other words that option takes (shown after the installed
    names)."""
    entries = installed(group)
    if name not in entries:
        choices = ", ".join(sorted(entries)) or "none"
        raise InputError(
            where,
            f"no {what} named {name!r} is installed; installed: {choices}{also}",
            field=field,
        )
    try:
        return entries[name].load()
    except Exception as exc:
        raise InputError(
            where, f"the {what} {name!r} failed to load: {describe(exc)}", field=field
        ) from None
