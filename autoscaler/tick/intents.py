"""What the steps of a tick hand each other: requests before the guard, intents after it.

The policy's plan and the controller's own rules (``autoscaler.tick.rules``) only *request*
changes to the fleet. The guard is the one place that knows a limit: it turns the requests into
``Intents`` — drains admitted, terminations of instances we own, and launches pre-granted pool
by pool along each fallback chain. act executes intents and reports what happened; it decides
nothing, so plan mode can run the very same tick with an executor that records instead.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from autoscaler.model import DrainRequest, LaunchRequest, Plan, PoolView
from autoscaler.model.records import Clamp
from autoscaler.spi.sources import RunningJob


@dataclass(frozen=True)
class Interrupt:
    """The cloud takes ``instance_id`` back at ``deadline``: no new work, its jobs leave."""

    instance_id: str
    pool: str
    deadline: float | None
    reason: str
    detail: str


@dataclass(frozen=True)
class Note:
    """Something seen that changes nothing but is recorded (and, for an instance the cloud took
    before we read its notice, counted against its pool as an interruption)."""

    kind: str
    instance_id: str
    pool: str
    outcome: str
    detail: str
    interrupted: bool = False


@dataclass(frozen=True)
class Terminate:
    instance_id: str
    provider: str
    pool: str
    reason: str
    rule: str = ""  # the rule that asked (the guard rate-limits some), "" for act's own drains


@dataclass(frozen=True)
class ContinueDrain:
    """A drain under way: keep the node closed, and end it once its jobs are gone, or, once
    ``timed_out``, by moving or evicting what still runs."""

    instance_id: str
    provider: str
    pool: str
    timed_out: bool
    move_jobs: bool


@dataclass(frozen=True)
class Replace:
    """Capacity written off (a node that never joined) is bought again in its pool, if the
    guard lets ``instance_id`` go."""

    instance_id: str
    launch: LaunchRequest


@dataclass(frozen=True)
class MoveJobs:
    """Make room on the on-prem ``node`` for the pending job ``for_job``: each of ``jobs``
    checkpoints on request, is requeued and kept off ``node``, and restarts on the cloud room the
    rule found for it (``Placement.rebalance_onprem``)."""

    node: str
    jobs: tuple[RunningJob, ...]
    for_job: str
    reason: str
    # The cloud room the rule found for each moved job: (job id, cloud instance id, GPUs). It is
    # held for the job until it has moved off (no other move is given it, and the policy does not
    # count it as free for other pending work).
    room: tuple[tuple[str, str, int], ...] = ()
    # When the jobs must be gone (a reclaimed guarantee's bound): a job whose checkpoint would
    # not end by then, or that cannot checkpoint, leaves at once. None: each waits for its own.
    by: float | None = None
    # Every on-prem node being freed for ``for_job`` by this tick's moves, ``node`` among them:
    # a multi-node job's nodes, freed all or none (the guard grants such moves together). Empty:
    # ``node`` alone. With ``by``, ``for_job`` is bound to them (``MovesJobsOff.bind``).
    together: tuple[str, ...] = ()

    @property
    def nodes(self) -> tuple[str, ...]:
        """The nodes ``for_job`` is to run on once this move and its companions are done."""
        return self.together or (self.node,)


@dataclass
class Requests:
    """Everything the controller's own rules ask of a tick, beside the policy's plan."""

    notices: list[Interrupt | Note] = field(default_factory=list)
    drains: list[DrainRequest] = field(default_factory=list)
    continuing: list[ContinueDrain] = field(default_factory=list)
    terminations: list[Terminate] = field(default_factory=list)
    replacements: list[Replace] = field(default_factory=list)
    moves: list[MoveJobs] = field(default_factory=list)

    @property
    def interrupts(self) -> list[Interrupt]:
        return [n for n in self.notices if isinstance(n, Interrupt)]

    def claimed(self) -> set[str]:
        """Instances a rule has already decided something for this tick."""
        return (
            {i.instance_id for i in self.interrupts}
            | {t.instance_id for t in self.terminations}
            | {d.instance_id for d in self.drains}
        )


@dataclass(frozen=True)
class LaunchStep:
    """One pool of a launch's chain: ``granted`` instances the guard lets it buy when every
    earlier step is fulfilled (``wanted`` is what that walk asked of it). Nodes an earlier step
    fails to buy may move here too, as far as ``Intents.fallbacks`` admits them."""

    pool: str
    wanted: int
    granted: int
    position: int = 0  # where the pool stands in the launch's chain (first choice: 0)


@dataclass(frozen=True)
class LaunchIntent:
    request: LaunchRequest
    index: int
    steps: tuple[LaunchStep, ...] = ()
    gangs: tuple[tuple[LaunchStep, ...], ...] = ()
    skipped: str | None = None

    @property
    def granted(self) -> int:
        """Instances bought if every first choice is fulfilled."""
        return sum(s.granted for s in self.steps) + sum(
            s.granted for gang in self.gangs for s in gang
        )


@dataclass
class Intents:
    """The tick's requests as the guard lets them through."""

    plan: Plan
    notices: tuple[Interrupt | Note, ...] = ()
    drains: tuple[DrainRequest, ...] = ()
    at_risk: tuple[str, ...] = ()
    continuing: tuple[ContinueDrain, ...] = ()
    terminations: tuple[Terminate, ...] = ()
    launches: tuple[LaunchIntent, ...] = ()
    moves: tuple[MoveJobs, ...] = ()
    clamps: list[Clamp] = field(default_factory=list)
    # The guard's room left once every first choice is granted; a failure gives its room back
    # here and its nodes move down the chain only as far as this admits.
    fallbacks: FallbackRoom | None = None


class FallbackRoom(Protocol):
    """The part of the guard's ``Allowance`` act is handed (see ``autoscaler.tick.guard``)."""

    def admit_launch(self, pool_view: PoolView, count: int) -> int: ...

    def refund(self, pool_view: PoolView, count: int) -> None: ...
