"""The priority class a scheduler names for a job (a Slurm QOS, a Kubernetes
``priorityClassName``), read as team names are (``team_names.TeamNames``: a string of 1 to 253
characters without control characters is kept, anything else is said once per source and value),
except that a bad value leaves the job in no class (order 0, ``autoscaler.model.priorities``)."""

from __future__ import annotations

import logging

from autoscaler.sources.team_names import TeamNames

log = logging.getLogger(__name__)


class ClassNames(TeamNames):
    """Priority class names as one source reads them, remembered, each bad value said once."""

    consequence = "its jobs count in no priority class (order 0)"
