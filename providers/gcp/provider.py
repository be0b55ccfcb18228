"""GCP: Spot and standard GPU VMs on Compute Engine through google-cloud-compute (the ``gcp``
extra), imported lazily.

``GcpProvider`` composes this folder's parts behind the provider protocol:

* ``settings``: ``providers.gcp`` and a pool's ``options``, checked with the config;
* ``sdk``: the Compute Engine clients (the only module that imports the SDK), credentials from
  Application Default Credentials, the SDK's own retries off;
* ``errors``: HTTP errors and failed operations mapped onto the core's typed errors;
* ``instances``: one ``instances.insert`` per VM, idempotent by name and ``requestId``, spread
  over the pool's zones, with the pool's user data as the ``startup-script`` metadata; list and
  delete by our labels;
* ``pricing``: the shipped price history or a SkyPilot-format catalog;
* ``notices``: preemptions read from the zones' operations and from our listed Spot VMs;
* ``gang``: ``launch_gang``, a multi-node job's VMs made by one all-or-none bulk insert under
  the pool's compact placement policy.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from autoscaler.model import Instance, InterruptionNotice, Pool, PriceQuote
from autoscaler.model.clock import Clock, SystemClock
from autoscaler.model.errors import InputError
from autoscaler.model.inputfile import validate_settings
from autoscaler.spi.provider import LaunchResult
from providers.gcp.gang import GcpGangs
from providers.gcp.instances import GcpInstances
from providers.gcp.notices import GcpNotices
from providers.gcp.pricing import GcpPrices
from providers.gcp.sdk import ComputeClients
from providers.gcp.settings import GcpPoolOptions, GcpSettings, user_data_problem


class GcpProvider:
    # what ``providers.gcp`` and a pool's ``options`` hold (``gpu-autoscaler schema``)
    Settings = GcpSettings
    PoolOptions = GcpPoolOptions
    name = "gcp"

    def __init__(
        self,
        settings: GcpSettings,
        pools: Sequence[Pool],
        fleet_id: str,
        clock: Clock | None = None,
    ) -> None:
        self.settings = settings
        self.fleet_id = fleet_id
        self.clock = clock or SystemClock()
        self.pools = {p.name: p for p in pools}
        self.options: dict[str, GcpPoolOptions] = {}
        self.zones: dict[str, tuple[str, ...]] = {}
        for index, pool in enumerate(pools):
            where = f"pools[{index}].options"
            self.options[pool.name] = validate_settings(GcpPoolOptions, pool.options, field=where)
            problem = user_data_problem(pool.user_data) if pool.user_data else None
            if problem is not None:
                raise InputError("config", problem, field=f"pools[{index}].user_data")
            zones = self.options[pool.name].zones or ((pool.zone,) if pool.zone else ())
            if not zones:
                raise InputError("config", "give zones, or the pool's zone", field=f"{where}.zones")
            for zone in zones:
                if not zone.startswith(f"{pool.region}-"):
                    raise InputError(
                        "config",
                        f"zone {zone!r} is not in the pool's region {pool.region!r}",
                        field=f"{where}.zones",
                    )
            self.zones[pool.name] = zones
        self.pricing = GcpPrices(self.options, self.zones, self.clock, settings.price_catalog)
        self.sdk = ComputeClients(settings)
        self.instances = GcpInstances(
            self.sdk, settings, self.pools, self.options, self.zones, fleet_id, self.clock
        )
        self.notices = GcpNotices(self.sdk, settings, self.clock, self.instances)
        self.gangs = GcpGangs(self.instances)

    @classmethod
    def from_config(
        cls,
        settings: Mapping[str, Any],
        pools: Sequence[Pool],
        fleet_id: str,
        clock: Clock | None = None,
    ) -> GcpProvider:
        parsed = validate_settings(GcpSettings, dict(settings), field="providers.gcp")
        return cls(parsed, pools, fleet_id, clock)

    def list_instances(self, fleet_id: str) -> list[Instance]:
        return self.instances.list_instances()

    def launch(
        self, pool: Pool, count: int, request_id: str, fleet_id: str, *, team: str | None = None
    ) -> LaunchResult:
        return self.instances.launch(pool, count, request_id, team)

    def launch_gang(
        self, pool: Pool, count: int, request_id: str, fleet_id: str, *, team: str | None = None
    ) -> LaunchResult:
        """All ``count`` VMs under the pool's compact placement policy, or none (``GcpGangs``)."""
        return self.gangs.launch(pool, count, request_id, team)

    def terminate(self, instance_ids: Sequence[str], request_id: str) -> None:
        """Delete only VMs that carry our fleet label, whatever names we are given."""
        self.instances.terminate(instance_ids, request_id)

    def prices(self, pools: Sequence[Pool]) -> list[PriceQuote]:
        """A pool's price is the dearest of its zones: launches spread over all of them."""
        return self.pricing.prices(pools)

    def poll_notices(self) -> list[InterruptionNotice]:
        return self.notices.poll_notices()

    def acknowledge(self, notices: Sequence[InterruptionNotice]) -> None:
        self.notices.acknowledge(notices)
