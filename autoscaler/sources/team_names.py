"""The team a scheduler names for a job (a Slurm account, a Kubernetes namespace or label), read
so that no value can take a reading down.

What a scheduler holds there is whatever its users typed: a team name is kept when it is a
string of 1 to ``MAX_TEAM_CHARS`` characters without control characters (which would forge log
lines and metrics labels); anything else is said once per source and value, and the job keeps
counting under no team (``None``, the ``unassigned`` terms of ``autoscaler.model.teams``) rather
than being left out of demand. Names are remembered, so 100,000 jobs of a few accounts cost a
dictionary lookup each.
"""

from __future__ import annotations

import logging
import re
import threading

log = logging.getLogger(__name__)

MAX_TEAM_CHARS = 253  # what DemandGroup.team holds
# Enough names for any site's teams; past it names are checked without being remembered, so a
# queue of a million distinct accounts cannot grow the memo.
MAX_REMEMBERED = 10_000
MAX_SAID = 20
SHOWN_CHARS = 80
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")
_MISSING = object()


class TeamNames:
    """Team names as one source reads them, remembered, and each bad value said once."""

    # what becomes of the jobs of a value that cannot be read, as the log line says it
    consequence = "its jobs count under no team (unassigned)"

    def __init__(self, where: str, field: str) -> None:
        self.where = where
        self.field = field
        self._known: dict[str, str | None] = {}
        self._said: set[str] = set()
        self._lock = threading.Lock()

    def __call__(self, value: object) -> str | None:
        """The team ``value`` names, or None (no team, or one that cannot be a team)."""
        if value is None or value == "":
            return None
        if not isinstance(value, str):
            self._say(f"is a JSON {type(value).__name__}, not a string", repr(value)[:SHOWN_CHARS])
            return None
        found = self._known.get(value, _MISSING)
        if found is not _MISSING:
            return found  # type: ignore[return-value]
        team = self._check(value)
        if len(self._known) < MAX_REMEMBERED:
            self._known[value] = team
        return team

    def _check(self, value: str) -> str | None:
        if len(value) > MAX_TEAM_CHARS:
            self._say(
                f"is {len(value):,} characters, more than a team name's {MAX_TEAM_CHARS}",
                repr(value[:SHOWN_CHARS]),
            )
            return None
        if _CONTROL.search(value):
            self._say("holds control characters", repr(value[:SHOWN_CHARS]))
            return None
        return value

    def _say(self, problem: str, shown: str) -> None:
        with self._lock:
            first = shown not in self._said and len(self._said) < MAX_SAID
            if first:
                self._said.add(shown)
        if first:
            log.warning(
                "%s: the %s %s %s: %s", self.where, self.field, shown, problem, self.consequence
            )
