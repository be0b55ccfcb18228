"""Leader election: two replicas never act at once.

A lock hands its holder a fencing token, a number that grows with every change of leader. Every
mutating action is taken under the token and checked against it first (``Fence``), so a replica
that was paused while another took over finds its token stale and acts no more, instead of
acting on a world it no longer owns. After Kubernetes' leader election (a Lease renewed well
inside its duration) and Kleppmann's fencing tokens.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from autoscaler.model.records import LeadershipLost


@runtime_checkable
class LeaderLock(Protocol):
    """A lock a replica must hold to act.

    ``acquire`` is called at the start of every tick: it takes the lock when free, renews it when
    held, and returns the fencing token while this replica is the leader, ``None`` while another
    is. ``check(token)`` is called before each mutating action and raises ``LeadershipLost``
    unless the lock is still held under that token (without waiting: it may ask the lock's store,
    it never blocks for a lease). ``release`` gives the lock up at a clean shutdown so a standby
    takes over at once.
    """

    identity: str
    lease_seconds: float

    def acquire(self) -> int | None: ...

    def check(self, token: int) -> None: ...

    def release(self) -> None: ...


class SoleReplica:
    """The lock of a controller that runs alone: always held, token 1."""

    lease_seconds = 0.0

    def __init__(self, identity: str = "sole") -> None:
        self.identity = identity

    def acquire(self) -> int | None:
        return 1

    def check(self, token: int) -> None:
        if token != 1:
            raise LeadershipLost(f"token {token} is not the sole replica's")

    def release(self) -> None:
        return None
