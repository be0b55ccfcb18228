"""Azure: spot and on-demand GPU VMs through azure-mgmt-compute (the ``azure`` extra), lazily.

``AzureProvider`` composes this folder's parts behind the provider protocol:

* ``settings``: ``providers.azure`` and a pool's ``options``, checked with the config;
* ``sdk``: the ``ComputeManagementClient`` (the only module that imports the SDK), credentials
  from ``DefaultAzureCredential``, the SDK's own retries off;
* ``errors``: ARM's error codes mapped onto the core's typed errors;
* ``instances``: one PUT per VM of a deterministic name, idempotent by request id, creates
  waited on for at most ``operation_timeout_s``, the pool's user data as the VM's custom data;
  list and delete by our tags;
* ``pricing``: the Retail Prices API or a SkyPilot-format catalog;
* ``notices``: evictions of Spot VMs the listings saw live and Azure then deleted;
* ``gang``: ``launch_gang``, a multi-node job's VMs in the pool's proximity placement group,
  all deleted if any fails.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from autoscaler.model import Instance, InterruptionNotice, Pool, PriceQuote
from autoscaler.model.catalog import SkyPilotCatalog
from autoscaler.model.clock import Clock, SystemClock
from autoscaler.model.errors import InputError
from autoscaler.model.inputfile import validate_settings
from autoscaler.spi.provider import LaunchResult
from providers.azure.gang import AzureGangs
from providers.azure.instances import AzureInstances
from providers.azure.notices import AzureEvictions
from providers.azure.pricing import AzurePrices
from providers.azure.sdk import ArmClient
from providers.azure.settings import AzurePoolOptions, AzureSettings, custom_data_problem


class AzureProvider:
    # what ``providers.azure`` and a pool's ``options`` hold (``gpu-autoscaler schema``)
    Settings = AzureSettings
    PoolOptions = AzurePoolOptions
    name = "azure"

    def __init__(
        self,
        settings: AzureSettings,
        pools: Sequence[Pool],
        fleet_id: str,
        clock: Clock | None = None,
    ) -> None:
        self.settings = settings
        self.fleet_id = fleet_id
        self.clock = clock or SystemClock()
        self.pools = {p.name: p for p in pools}
        self.options: dict[str, AzurePoolOptions] = {}
        for index, pool in enumerate(pools):
            options = validate_settings(
                AzurePoolOptions, pool.options, field=f"pools[{index}].options"
            )
            if not pool.is_spot and "max_price" in options.model_fields_set:
                raise InputError(
                    "config",
                    "max_price applies to spot pools only",
                    field=f"pools[{index}].options.max_price",
                )
            self.options[pool.name] = options
            _check_boot_data(pool, options, index)
        catalog = SkyPilotCatalog(Path(settings.price_catalog)) if settings.price_catalog else None
        self.sdk = ArmClient(settings)
        self.evictions = AzureEvictions()
        self.instances = AzureInstances(
            self.sdk,
            settings,
            self.pools,
            self.options,
            fleet_id,
            self.clock,
            catalog,
            self.evictions,
        )
        self.pricing = AzurePrices(settings, self.clock, catalog)
        self.gangs = AzureGangs(self.instances)

    @classmethod
    def from_config(
        cls,
        settings: Mapping[str, Any],
        pools: Sequence[Pool],
        fleet_id: str,
        clock: Clock | None = None,
    ) -> AzureProvider:
        parsed = validate_settings(AzureSettings, dict(settings), field="providers.azure")
        return cls(parsed, pools, fleet_id, clock)

    def client(self) -> Any:
        """The ComputeManagementClient (made once, on first use)."""
        return self.sdk.client()

    @property
    def read_only(self) -> bool:
        """Plan mode sets it: a listing then deletes nothing (not even VMs whose create
        failed)."""
        return self.instances.read_only

    @read_only.setter
    def read_only(self, value: bool) -> None:
        self.instances.read_only = value

    # -- the protocol ------------------------------------------------------------------------

    def list_instances(self, fleet_id: str) -> list[Instance]:
        return self.instances.list_instances()

    def launch(
        self, pool: Pool, count: int, request_id: str, fleet_id: str, *, team: str | None = None
    ) -> LaunchResult:
        return self.instances.launch(pool, count, request_id, team)

    def launch_gang(
        self, pool: Pool, count: int, request_id: str, fleet_id: str, *, team: str | None = None
    ) -> LaunchResult:
        """All ``count`` VMs in the pool's proximity placement group, or none (``AzureGangs``)."""
        return self.gangs.launch(pool, count, request_id, team)

    def terminate(self, instance_ids: Sequence[str], request_id: str) -> None:
        """Delete only VMs that carry our fleet tag, whatever names we are given."""
        self.instances.terminate(instance_ids)

    def prices(self, pools: Sequence[Pool]) -> list[PriceQuote]:
        return self.pricing.prices(pools)

    def poll_notices(self) -> list[InterruptionNotice]:
        """Evictions the listings saw (each reported once), kept until acknowledged."""
        return self.evictions.poll_notices()

    def acknowledge(self, notices: Sequence[InterruptionNotice]) -> None:
        self.evictions.acknowledge(notices)


def _check_boot_data(pool: Pool, options: AzurePoolOptions, index: int) -> None:
    """A pool's boot data comes from its ``user_data`` or its ``custom_data`` option, not both
    (the scheduler's join script fills ``user_data`` for pools that join it), and fits in what
    ARM takes."""
    if pool.user_data and options.custom_data is not None:
        raise InputError(
            "config",
            "custom_data and the pool's user_data (its own, or the scheduler's join script) both "
            "give the VM's boot data: keep one (set user_data to keep yours over the join script)",
            field=f"pools[{index}].options.custom_data",
        )
    if pool.user_data:
        text, field = pool.user_data, f"pools[{index}].user_data"
    elif options.custom_data is not None:
        text, field = options.custom_data, f"pools[{index}].options.custom_data"
    else:
        return
    problem = custom_data_problem(text)
    if problem is not None:
        raise InputError("config", problem, field=field)
