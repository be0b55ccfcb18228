"""The simulator's provider: one cloud of the simulated world, behind the same protocol as AWS,
GCP and Azure, so a dry run exercises the controller's real act step."""

from __future__ import annotations

from collections.abc import Sequence

from autoscaler.clock import Clock
from autoscaler.model import Instance, InterruptionNotice, Pool, PriceQuote
from autoscaler.provider import LaunchResult
from autoscaler.sim.cloud import SimCloud


class SimProvider:
    def __init__(self, cloud: SimCloud, provider: str, clock: Clock) -> None:
        self.name = provider
        self.cloud = cloud
        self.clock = clock

    def list_instances(self, fleet_id: str) -> list[Instance]:
        return self.cloud.list_instances(self.name)

    def launch(self, pool: Pool, count: int, request_id: str, fleet_id: str) -> LaunchResult:
        return self.cloud.launch(pool, count, request_id, self.clock.now())

    def terminate(self, instance_ids: Sequence[str], request_id: str) -> None:
        self.cloud.terminate(instance_ids, self.clock.now())

    def prices(self, pools: Sequence[Pool]) -> list[PriceQuote]:
        now = self.clock.now()
        return [self.cloud.quote(pool, now) for pool in pools]

    def poll_notices(self) -> list[InterruptionNotice]:
        return self.cloud.take_notices(self.name)

    def acknowledge(self, notices: Sequence[InterruptionNotice]) -> None:
        """Simulated notices are gone once read."""
