"""Teams sharing one fleet, as the config states them: what each is guaranteed on-prem, what it
may burst to in the cloud, what it may spend, and its weight in sharing what is left; and the
priority classes work is placed in.

A team is named by the scheduler (a Slurm account, a Kubernetes namespace or label, a Redis key,
an SQS message attribute: each source's ``team_from``). A team that jobs name and the config
does not list is a team of its own with ``unassigned``'s terms (no guarantee by default), said
once (``TeamBook``). A scheduler's team may be any printable name up to 253 characters; the
config lists teams by the config's name rules (up to 128 of letters, digits, ``_.:-``), so a
Slurm account such as ``Team A`` cannot be listed and always gets the unassigned terms: name
such teams in the scheduler the way the config can.

Guarantees follow the quota-with-borrowing model of Kueue's cohorts and Slurm's QOS
``GrpTRES``: a team's guaranteed on-prem GPUs are its own when it has work for them; idle, they
are lent to others, and taken back by checkpoint within ``reclaim_within_s`` when the owner's
work arrives. Weights share what is left, as Slurm's fair-share ``Shares`` do.
"""

from __future__ import annotations

import logging
import threading

from pydantic import Field, NonNegativeFloat, NonNegativeInt, PositiveFloat, model_validator

from autoscaler.model.domain import Frozen, Name

log = logging.getLogger(__name__)

UNASSIGNED = "unassigned"


class TeamSpec(Frozen):
    """One team's terms."""

    guaranteed_gpus: NonNegativeInt = Field(
        0, description="on-prem GPUs the team gets first when it has work for them"
    )
    burst_gpus: NonNegativeInt | None = Field(
        None, description="cloud GPUs the team's work may hold at once (None: no team limit)"
    )
    burst_usd_per_hour: NonNegativeFloat | None = Field(
        None, description="$/hour of cloud capacity the team's work may hold at once"
    )
    monthly_budget_usd: NonNegativeFloat | None = Field(
        None, description="what the team's cloud use may cost in a calendar month (UTC)"
    )
    weight: PositiveFloat = Field(
        1.0, description="the team's share of what is left when fleet-wide limits bind"
    )


class PriorityClass(Frozen):
    """A class work is placed in: higher ``order`` first."""

    order: int = Field(description="higher is placed first and may preempt lower")
    spot: bool = Field(True, description="whether the class's work may run on spot capacity")
    preempts: bool = Field(
        False, description="whether the class's work may take GPUs from lower classes by checkpoint"
    )
    promote_after_s: PositiveFloat | None = Field(
        None,
        description="aging: work waiting longer than this counts as the next class up, so a "
        "lower class never starves (None: never promoted)",
    )
    preempt_within_s: PositiveFloat | None = Field(
        None,
        description="how long the class's work waits, at most, for on-prem GPUs it preempts "
        "from lower classes (None: teams.reclaim_within_s)",
    )


class TeamsConfig(Frozen):
    """``teams`` in the controller's config."""

    teams: dict[Name, TeamSpec] = Field(default_factory=dict)
    unassigned: TeamSpec = Field(
        default_factory=TeamSpec,
        description="the terms of a team jobs name that is not listed (and of work with no team)",
    )
    priority_classes: dict[Name, PriorityClass] = Field(default_factory=dict)
    onprem_gpus: NonNegativeInt | None = Field(
        None,
        description="the on-prem fleet's GPUs, for validate to check the guarantees against "
        "(the controller checks them against the GPUs it sees on every tick too)",
    )
    reclaim_within_s: PositiveFloat = Field(
        900.0,
        description="how long an owner waits, at most, for its guaranteed GPUs lent to others: "
        "the borrowing jobs are asked to checkpoint and requeued within it",
    )

    @model_validator(mode="after")
    def _guarantees_fit(self) -> TeamsConfig:
        if self.onprem_gpus is not None:
            problem = overcommitted(self.teams, self.onprem_gpus)
            if problem:
                raise ValueError(problem)
        return self

    def spec(self, team: str | None) -> TeamSpec:
        return self.teams.get(team or UNASSIGNED, self.unassigned)


def overcommitted(teams: dict[str, TeamSpec], onprem_gpus: int) -> str | None:
    """Why the guarantees cannot all be kept on ``onprem_gpus`` GPUs, naming the teams, or
    None."""
    guaranteed = {name: t.guaranteed_gpus for name, t in teams.items() if t.guaranteed_gpus}
    total = sum(guaranteed.values())
    if total <= onprem_gpus:
        return None
    named = ", ".join(f"{name} {gpus}" for name, gpus in sorted(guaranteed.items()))
    return (
        f"the teams' guaranteed_gpus add up to {total} ({named}), more than the on-prem "
        f"fleet's {onprem_gpus} GPUs"
    )


class TeamBook:
    """The teams jobs name, resolved against the config: a listed team is itself, any other is
    a team of its own on ``unassigned``'s terms, said once per name."""

    def __init__(self, config: TeamsConfig | None) -> None:
        self.config = config or TeamsConfig()
        self._said: set[str] = set()
        self._lock = threading.Lock()

    def name(self, team: str | None) -> str:
        """The team work is counted under: its own name, or ``unassigned`` when it has none."""
        if not team:
            return UNASSIGNED
        if team not in self.config.teams and team != UNASSIGNED:
            with self._lock:
                first = team not in self._said
                if first and len(self._said) < 10_000:
                    self._said.add(team)
            if first:
                log.warning(
                    "team %r is not in the config's teams: it gets the unassigned terms "
                    "(%d guaranteed GPUs)",
                    team[:200],
                    self.config.unassigned.guaranteed_gpus,
                )
        return team

    def spec(self, team: str | None) -> TeamSpec:
        return self.config.spec(team)
