"""The provider protocol: the small surface every cloud (and the simulator) implements.

Modelled on SkyPilot's per-cloud provision interface and Karpenter's cloud provider: a handful of
calls, idempotent by request id, with failures mapped onto the typed errors in ``errors``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from autoscaler.model import Instance, InterruptionNotice, Pool, PriceQuote
from autoscaler.model.errors import ProviderError

FLEET_TAG = "gpu-autoscaler/fleet"
POOL_TAG = "gpu-autoscaler/pool"
REQUEST_TAG = "gpu-autoscaler/request"
LAUNCHED_AT_TAG = "gpu-autoscaler/launched-at"
# Whom an instance was bought for (``LaunchRequest.team``), written at launch only when the
# launch names a team, so that a restarted controller's listing still says it.
TEAM_TAG = "gpu-autoscaler/team"


def launch_tags(
    fleet_id: str, pool: Pool, request_id: str, now: float, team: str | None = None
) -> dict[str, str]:
    """The four tags every launched instance carries, and the team's when it is bought for one,
    by our names: each provider writes them in its cloud's form (EC2 tags, GCP labels, Azure
    tags)."""
    tags = {
        FLEET_TAG: fleet_id,
        POOL_TAG: pool.name,
        REQUEST_TAG: request_id,
        LAUNCHED_AT_TAG: f"{now:.3f}",
    }
    if team:
        tags[TEAM_TAG] = team
    return tags


@dataclass(frozen=True)
class LaunchResult:
    """What a launch produced. Partial fulfilment is normal for spot: ``shortfall`` says why."""

    instances: tuple[Instance, ...]
    shortfall: ProviderError | None = None
    already_existed: bool = False


@dataclass(frozen=True)
class ProviderSnapshot:
    """One provider's answer for a tick; ``error`` set means the listing is not to be trusted."""

    instances: tuple[Instance, ...] = ()
    notices: tuple[InterruptionNotice, ...] = ()
    prices: tuple[PriceQuote, ...] = ()
    errors: tuple[ProviderError, ...] = field(default_factory=tuple)


@runtime_checkable
class Provider(Protocol):
    """A cloud as the core sees it. Every instance it launches carries the fleet, pool and request
    tags, and ``list_instances``/``terminate`` only ever see and touch instances so tagged.

    A launch that names a ``team`` also tags its instances with it (``TEAM_TAG``), and the
    listing gives it back on each ``Instance.team``: the clouds remember whom an instance was
    bought for across a controller's restart."""

    name: str

    def list_instances(self, fleet_id: str) -> list[Instance]: ...

    def launch(
        self, pool: Pool, count: int, request_id: str, fleet_id: str, *, team: str | None = None
    ) -> LaunchResult: ...

    def terminate(self, instance_ids: Sequence[str], request_id: str) -> None: ...

    def prices(self, pools: Sequence[Pool]) -> list[PriceQuote]: ...

    def poll_notices(self) -> list[InterruptionNotice]: ...

    def acknowledge(self, notices: Sequence[InterruptionNotice]) -> None:
        """The tick has handled these notices: a provider reading them from a queue may now
        delete them (never before, so a crash mid-tick loses none)."""
        ...


@runtime_checkable
class GangLauncher(Protocol):
    """A provider that can launch a multi-node job's nodes together: all ``count`` instances of
    ``pool`` placed close together (a placement group, compact placement policy or proximity
    placement group, as the pool's options name or create it), or none.

    When fewer than ``count`` come up, the provider terminates those that did and raises the
    typed error that stopped the rest (``CapacityError`` for a shortfall), so a gang is never
    left half-launched and paid for. Idempotent by ``request_id`` as ``launch`` is: a retry
    that finds the whole gang returns it with ``already_existed``.
    """

    def launch_gang(
        self, pool: Pool, count: int, request_id: str, fleet_id: str, *, team: str | None = None
    ) -> LaunchResult: ...


@runtime_checkable
class WatchesInBackground(Protocol):
    """A provider with a background part (an interruption watcher reading a queue), started
    once the run loop is up with the callback that wakes it; it stops on ``close``."""

    def start(self, wakeup: Callable[[], None] | None = None) -> None: ...


@runtime_checkable
class Closable(Protocol):
    """A provider holding clients or threads to let go when the controller stops."""

    def close(self) -> None: ...


@runtime_checkable
class ListingRepairs(Protocol):
    """A provider whose listing also repairs (Azure deletes VMs whose create failed); plan mode
    sets ``read_only`` so that it only looks."""

    read_only: bool


@runtime_checkable
class ProviderFactory(Protocol):
    """What a provider's entry point names: a class built from its config section and pools.
    The simulator's clouds have none (they run only inside a replay)."""

    def from_config(
        self, settings: Mapping[str, Any], pools: Sequence[Pool], fleet_id: str
    ) -> Provider: ...
