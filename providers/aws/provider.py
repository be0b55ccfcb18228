"""AWS: spot and on-demand GPU instances through boto3 (the ``aws`` extra), imported lazily.

``AwsProvider`` composes this folder's parts behind the provider protocol:

* ``settings``: ``providers.aws`` and a pool's ``options``, checked with the config;
* ``sdk``: the boto3 clients (the only module that imports the SDK); botocore's own retries are
  off so that the controller's bounded retry policy is the only one;
* ``errors``: AWS's error codes mapped onto the core's typed errors;
* ``instances``: launch (``CreateFleet`` or ``RunInstances``, idempotent by request id, with the
  pool's user data), list and terminate, all by our tags;
* ``pricing``: live spot prices, catalog on-demand prices and Spot Advisor interruption rates;
* ``notices``: the SQS interruption watcher, when ``interruption_queue_url`` is set, reading the
  EventBridge events of ``events``;
* ``gang``: ``launch_gang``, a multi-node job's instances all or none, in the pool's cluster
  placement group.

``queue`` is a queue source, not part of the provider: SQS messages counted as demand.
Credentials come from the standard boto3 chain (environment, profile, instance or pod role),
never from the config file.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from autoscaler.model import Instance, InterruptionNotice, Pool, PriceQuote
from autoscaler.model.catalog import (
    AWS_ADVISOR,
    AWS_CATALOG,
    InstanceCatalog,
    SkyPilotCatalog,
    SpotAdvisor,
)
from autoscaler.model.clock import Clock, SystemClock
from autoscaler.model.errors import InputError
from autoscaler.model.inputfile import validate_settings
from autoscaler.spi.provider import LaunchResult
from providers.aws.gang import AwsGangs
from providers.aws.instances import AwsInstances, shapes
from providers.aws.notices import NoticeWatcher
from providers.aws.pricing import AwsPrices
from providers.aws.sdk import Clients
from providers.aws.settings import (
    REGION,
    AwsPoolOptions,
    AwsSettings,
    queue_region,
    user_data_problem,
)


class AwsProvider:
    # what ``providers.aws`` and a pool's ``options`` hold (``gpu-autoscaler schema``)
    Settings = AwsSettings
    PoolOptions = AwsPoolOptions
    name = "aws"

    def __init__(
        self,
        settings: AwsSettings,
        pools: Sequence[Pool],
        fleet_id: str,
        clock: Clock | None = None,
        session: Any = None,
    ) -> None:
        self.settings = settings
        self.fleet_id = fleet_id
        self.clock = clock or SystemClock()
        self.pools = {p.name: p for p in pools}
        self.options: dict[str, AwsPoolOptions] = {}
        for index, pool in enumerate(pools):
            if not REGION.match(pool.region):
                raise InputError(
                    "config",
                    f"expected an AWS region name such as us-east-1, got {pool.region[:40]!r}",
                    field=f"pools[{index}].region",
                )
            options = validate_settings(
                AwsPoolOptions, pool.options, field=f"pools[{index}].options"
            )
            self.options[pool.name] = options
            problem = user_data_problem(pool.user_data) if pool.user_data else None
            if problem is not None:
                raise InputError("config", problem, field=f"pools[{index}].user_data")
            if len(shapes(pool, options)) > 1 and options.launch_template is None:
                raise InputError(
                    "config",
                    "a pool with several instance types or places needs a "
                    "launch_template (CreateFleet requires one)",
                    field=f"pools[{index}].options",
                )
        catalog = InstanceCatalog(Path(settings.catalog) if settings.catalog else AWS_CATALOG)
        self.clients = Clients(settings, session)
        self.instances = AwsInstances(
            self.clients,
            self.pools,
            self.options,
            settings.regions,
            fleet_id,
            self.clock,
            catalog,
        )
        self.pricing = AwsPrices(
            self.clients,
            self.pools,
            self.options,
            self.clock,
            settings.price_ttl_s,
            catalog,
            SpotAdvisor(Path(settings.advisor) if settings.advisor else AWS_ADVISOR),
            SkyPilotCatalog(Path(settings.price_catalog)) if settings.price_catalog else None,
        )
        self.gangs = AwsGangs(self.instances)
        self.watcher: NoticeWatcher | None = None
        if settings.interruption_queue_url:
            region = queue_region(settings.interruption_queue_url) or next(
                iter(self.instances.regions), None
            )
            if region is None:
                raise InputError(
                    "config",
                    "the queue's region is not in its URL, and no pool or regions entry "
                    "gives one: add the region to regions",
                    field="providers.aws.interruption_queue_url",
                )
            self.watcher = NoticeWatcher(
                self.clients.client("sqs", region),
                settings.interruption_queue_url,
                self.clock,
                self.instances.pool_of,
                wait_s=settings.queue_wait_s,
            )

    @classmethod
    def from_config(
        cls,
        settings: Mapping[str, Any],
        pools: Sequence[Pool],
        fleet_id: str,
        clock: Clock | None = None,
    ) -> AwsProvider:
        parsed = validate_settings(AwsSettings, dict(settings), field="providers.aws")
        return cls(parsed, pools, fleet_id, clock)

    def client(self, service: str, region: str) -> Any:
        """The boto3 client for a service and region (made once; tests hook into it)."""
        return self.clients.client(service, region)

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
        """All ``count`` instances in the pool's placement group, or none (``AwsGangs``)."""
        return self.gangs.launch(pool, count, request_id, team)

    def terminate(self, instance_ids: Sequence[str], request_id: str) -> None:
        """Terminate only instances that carry our fleet tag, whatever ids we are given."""
        self.instances.terminate(instance_ids)

    def prices(self, pools: Sequence[Pool]) -> list[PriceQuote]:
        return self.pricing.prices(pools)

    # -- notices -----------------------------------------------------------------------------

    def start(self, wakeup: Callable[[], None] | None = None) -> None:
        """Start the interruption watcher; ``wakeup`` is called when a notice arrives."""
        if self.watcher is not None:
            self.watcher.start(wakeup)

    def close(self) -> None:
        if self.watcher is not None:
            self.watcher.stop()

    def poll_notices(self) -> list[InterruptionNotice]:
        if self.watcher is None:
            return []
        self.watcher.start()
        return self.watcher.take()

    def acknowledge(self, notices: Sequence[InterruptionNotice]) -> None:
        if self.watcher is not None:
            self.watcher.acknowledge(notices)
