"""The priority class a scheduler names for a job (a Slurm QOS, a Kubernetes
``priorityClassName``), read as team names are (``team_names.TeamNames``: a string of 1 to 253
characters without control characters is kept, anything else is said once per source and value),
except that a bad value leaves the job in no class (order 0, ``autoscaler.model.priorities``)."""

from __future__ import annotations

import logging

from autoscaler.sources.team_names import MAX_SAID, TeamNames

log = logging.getLogger(__name__)


class ClassNames(TeamNames):
    """Priority class names as one source reads them, remembered, each bad value said once."""

    def _say(self, problem: str, shown: str) -> None:
        with self._lock:
            first = shown not in self._said and len(self._said) < MAX_SAID
            if first:
                self._said.add(shown)
        if first:
            log.warning(
                "%s: the %s %s %s: its jobs count in no priority class (order 0)",
                self.where,
                self.field,
                shown,
                problem,
            )
