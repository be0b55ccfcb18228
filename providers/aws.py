"""AWS: spot and on-demand GPU instances through boto3 (the ``aws`` extra), imported lazily.

* Launch: ``CreateFleet`` of type ``instant`` across a pool's instance types and subnets or zones
  (spot with ``price-capacity-optimized``, on-demand with ``lowest-price``), or ``RunInstances``
  when a pool names one type in one place. Every instance carries the fleet, pool, request and
  launch-time tags. A launch is idempotent: the request id is looked up by tag before launching
  and passed as the client token, so a retry or a restart never buys a second set.
* List and terminate by the fleet tag only: an instance without it is invisible to us. Listing
  reads our tags (``DescribeTags``) and states (``DescribeInstanceStatus``), a fraction of
  ``DescribeInstances``' bytes; the few instances those cannot describe fully are looked up there.
* Prices: live spot prices (latest per zone and type, cached for a TTL), on-demand list prices and
  Spot Advisor interruption rates from the shipped catalog.
* Errors: mapped onto the core's typed errors (``providers.aws_errors``); botocore's own retries
  are off so that the controller's bounded retry policy is the only one.
* Interruptions: an SQS watcher (``providers.aws_notices``) when ``interruption_queue_url`` is set.
* Gangs: ``launch_gang`` launches a multi-node job's instances all or none, in the pool's cluster
  placement group (``providers.aws_gang``).

Credentials come from the standard boto3 chain (environment, profile, instance or pod role),
never from the config file.
"""

from __future__ import annotations

import math
import re
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from autoscaler.model import Instance, InstanceState, InterruptionNotice, Pool, PriceQuote
from autoscaler.model.catalog import (
    AWS_ADVISOR,
    AWS_CATALOG,
    InstanceCatalog,
    SkyPilotCatalog,
    SpotAdvisor,
)
from autoscaler.model.clock import Clock, SystemClock
from autoscaler.model.errors import CapacityError, InputError, ProviderError
from autoscaler.model.inputfile import validate_settings
from autoscaler.spi.provider import (
    FLEET_TAG,
    LAUNCHED_AT_TAG,
    POOL_TAG,
    REQUEST_TAG,
    LaunchResult,
)
from providers.aws_errors import CAPACITY_CODES, error_code, typed
from providers.aws_gang import AwsGangs
from providers.aws_notices import NoticeWatcher
from providers.placement import PlacementOption

LISTED_STATES = ("pending", "running", "shutting-down", "stopping", "stopped")
STATES = {
    "pending": InstanceState.PENDING,
    "running": InstanceState.RUNNING,
    "shutting-down": InstanceState.TERMINATING,
    "stopping": InstanceState.TERMINATING,
    "stopped": InstanceState.TERMINATING,
    "terminated": InstanceState.TERMINATED,
}
PRODUCT = "Linux/UNIX"
LAUNCH_TAGS = (POOL_TAG, REQUEST_TAG, LAUNCHED_AT_TAG)  # written once, at launch
PAGE_SIZE = 1000  # the most DescribeTags and DescribeInstanceStatus return in one page
IDS_PER_FILTER = 200  # instance ids per filter in one call
# How long an instance whose tags are visible may stay invisible to the describe calls (they are
# eventually consistent just after a launch) before we stop counting it as pending.
UNSEEN_GRACE_S = 600.0
PLACEMENT_GROUP_NAME = re.compile(r"^[\x21-\x7e]{1,255}$")  # up to 255 printable ASCII
# botocore's own checks, so that a setting it would refuse when a client is made (on the first
# tick, or on a region's first listing) is refused with the config instead
REGION = re.compile(r"^(?![0-9]+$)(?!-)[a-zA-Z0-9-]{1,63}(?<!-)$")
_HOST = re.compile(r"^((?!-)[A-Z\d-]{1,63}(?<!-)\.)*((?!-)[A-Z\d-]{1,63}(?<!-))\.?$", re.I)
_QUEUE_PATH = re.compile(r"^/[A-Za-z0-9_-]{1,64}/[A-Za-z0-9_-]{1,80}(\.fifo)?$")


class _Strict(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class AwsSettings(_Strict):
    """``providers.aws`` in the controller config."""

    endpoint_url: str | None = Field(None, description="an EC2/SQS endpoint override (tests)")
    regions: tuple[str, ...] = Field(
        (), description="regions to list besides the pools' (to collect instances of pools removed)"
    )
    interruption_queue_url: str | None = None
    queue_wait_s: int = Field(20, ge=0, le=20)
    price_ttl_s: float = Field(300.0, ge=0)
    connect_timeout_s: float = Field(5.0, gt=0)
    read_timeout_s: float = Field(20.0, gt=0)
    catalog: str | None = Field(None, description="instance type catalog CSV (default: shipped)")
    price_catalog: str | None = Field(
        None, description="a SkyPilot-format catalog CSV to price pools from instead of the API"
    )
    advisor: str | None = Field(None, description="Spot Advisor bucket CSV (default: shipped)")

    @field_validator("endpoint_url")
    @classmethod
    def _endpoint(cls, value: str | None) -> str | None:
        problem = None if value is None else endpoint_problem(value)
        if problem is not None:
            raise ValueError(f"expected an http(s) URL such as http://localhost:5000 ({problem})")
        return value

    @field_validator("interruption_queue_url")
    @classmethod
    def _queue_url(cls, value: str | None) -> str | None:
        problem = None if value is None else queue_url_problem(value)
        if problem is not None:
            raise ValueError(
                "expected an SQS queue URL such as "
                f"https://sqs.us-east-1.amazonaws.com/123456789012/notices ({problem})"
            )
        return value

    @field_validator("regions")
    @classmethod
    def _region_names(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for region in value:
            if not REGION.match(region):
                raise ValueError(
                    f"expected AWS region names such as us-east-1, got {region[:40]!r}"
                )
        return value


class LaunchTemplate(_Strict):
    name: str | None = None
    id: str | None = None
    version: str = "$Latest"

    @model_validator(mode="after")
    def _one_reference(self) -> LaunchTemplate:
        if (self.name is None) == (self.id is None):
            raise ValueError("give exactly one of name or id")
        return self

    def spec(self) -> dict[str, str]:
        key = ("LaunchTemplateName", self.name) if self.name else ("LaunchTemplateId", self.id)
        return {key[0]: str(key[1]), "Version": self.version}


class AwsPoolOptions(_Strict):
    """``options`` of an AWS pool."""

    instance_types: tuple[str, ...] = Field(
        (), description="more instance types besides the pool's, for CreateFleet to choose from"
    )
    subnets: tuple[str, ...] = ()
    zones: tuple[str, ...] = ()
    launch_template: LaunchTemplate | None = None
    image_id: str | None = None
    security_group_ids: tuple[str, ...] = ()
    max_spot_price: float | None = Field(None, gt=0)
    placement_group: PlacementOption | None = Field(
        None,
        description="the cluster placement group a gang is launched into: {name: X} (existing), "
        "{create: true} (made for the pool) or {name: X, create: true}",
    )

    @model_validator(mode="after")
    def _launchable(self) -> AwsPoolOptions:
        if self.launch_template is None and self.image_id is None:
            raise ValueError("give a launch_template or an image_id")
        if self.subnets and self.zones:
            raise ValueError("give subnets or zones, not both")
        return self

    @field_validator("placement_group")
    @classmethod
    def _group_name(cls, value: PlacementOption | None) -> PlacementOption | None:
        name = value.name if value is not None else None
        if name is not None and not PLACEMENT_GROUP_NAME.match(name):
            raise ValueError("name: expected up to 255 printable ASCII characters")
        return value


class AwsProvider:
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
            self.options[pool.name] = validate_settings(
                AwsPoolOptions, pool.options, field=f"pools[{index}].options"
            )
            options = self.options[pool.name]
            if len(self._shapes(pool)) > 1 and options.launch_template is None:
                raise InputError(
                    "config",
                    "a pool with several instance types or places needs a "
                    "launch_template (CreateFleet requires one)",
                    field=f"pools[{index}].options",
                )
        self.catalog = InstanceCatalog(Path(settings.catalog) if settings.catalog else AWS_CATALOG)
        self.advisor = SpotAdvisor(Path(settings.advisor) if settings.advisor else AWS_ADVISOR)
        self.price_catalog = (
            SkyPilotCatalog(Path(settings.price_catalog)) if settings.price_catalog else None
        )
        self._session = session
        self._clients: dict[tuple[str, str], Any] = {}
        self._clients_lock = threading.Lock()
        self._spot: dict[str, tuple[float, dict[tuple[str, str], float]]] = {}
        self._region_of: dict[str, str] = {}
        self._pool_of: dict[str, str] = {}
        self._launch_tags: dict[str, dict[str, dict[str, str]]] = {}
        self.gangs = AwsGangs(self)
        self.watcher: NoticeWatcher | None = None
        if settings.interruption_queue_url:
            region = _queue_region(settings.interruption_queue_url) or next(
                iter(self._regions()), None
            )
            if region is None:
                raise InputError(
                    "config",
                    "the queue's region is not in its URL, and no pool or regions entry "
                    "gives one: add the region to regions",
                    field="providers.aws.interruption_queue_url",
                )
            self.watcher = NoticeWatcher(
                self.client("sqs", region),
                settings.interruption_queue_url,
                self.clock,
                lambda instance: self._pool_of.get(instance, "unknown"),
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

    # -- clients -----------------------------------------------------------------------------

    def client(self, service: str, region: str) -> Any:
        """The boto3 client for a service and region (made once; tests hook into it)."""
        with self._clients_lock:
            key = (service, region)
            if key not in self._clients:
                import boto3
                from botocore.config import Config

                if self._session is None:
                    self._session = boto3.session.Session()
                read_timeout = self.settings.read_timeout_s
                if service == "sqs":
                    # a long poll holds the request open for queue_wait_s by design
                    read_timeout = max(read_timeout, self.settings.queue_wait_s + 10.0)
                self._clients[key] = self._session.client(
                    service,
                    region_name=region,
                    endpoint_url=self.settings.endpoint_url,
                    config=Config(
                        retries={"total_max_attempts": 1, "mode": "standard"},
                        connect_timeout=self.settings.connect_timeout_s,
                        read_timeout=read_timeout,
                        user_agent_extra="hybrid-gpu-autoscaler",
                    ),
                )
            return self._clients[key]

    def _regions(self) -> list[str]:
        return sorted({p.region for p in self.pools.values()} | set(self.settings.regions))

    # -- listing -----------------------------------------------------------------------------

    def list_instances(self, fleet_id: str) -> list[Instance]:
        found: list[Instance] = []
        for region in self._regions():
            found.extend(self._list_region(region))
        return found

    def _list_region(self, region: str) -> list[Instance]:
        """Our instances in one region from their tags and states.

        DescribeInstances sends ~3 KB of XML per instance and botocore's parsing of it dominated
        the tick at thousands of instances; the tags and the state are all the controller needs
        when the pool is configured (it gives the type and GPUs). Tags are read before states, so
        an instance that ends between the two calls shows its newer state. Whatever the two
        cannot answer exactly as DescribeInstances would (no state yet, no launch-time tag, a pool
        no longer configured) is asked of DescribeInstances, for those ids only.
        """
        tagged = self._our_tags(region)
        if not tagged:
            return []
        states = self._states(region)
        listed: list[Instance] = []
        unresolved: dict[str, dict[str, str]] = {}
        for instance_id, tags in tagged.items():
            state = states.get(instance_id)
            if state == "terminated":
                continue
            pool = self.pools.get(tags.get(POOL_TAG, ""))
            launched = _launched_at(tags.get(LAUNCHED_AT_TAG))
            if state is None or pool is None or launched is None:
                unresolved[instance_id] = tags
                continue
            listed.append(
                self._remember(
                    Instance(
                        id=instance_id,
                        pool=pool.name,
                        state=STATES.get(state, InstanceState.PENDING),
                        launched_at=launched,
                        request_id=tags.get(REQUEST_TAG, ""),
                        gpus=pool.gpus_per_instance,
                    ),
                    region,
                )
            )
        if unresolved:
            listed.extend(self._resolve(region, unresolved))
        return listed

    def _our_tags(self, region: str) -> dict[str, dict[str, str]]:
        """Our four tags of every instance carrying our fleet tag.

        The pool, request and launch-time tags are written once, at launch (TagSpecifications),
        so each instance's are read once and kept; a listing then reads only the fleet tag, a
        quarter of the tags. DescribeTags filters tags, not instances: other fleets' tags under
        our keys come too and are dropped here.
        """
        members = {
            instance_id
            for instance_id, tags in self._tags(region, [FLEET_TAG], [self.fleet_id]).items()
            if tags.get(FLEET_TAG) == self.fleet_id
        }
        known = self._launch_tags.get(region, {})
        new = sorted(members - known.keys())
        if len(new) > IDS_PER_FILTER:
            read = self._tags(region, LAUNCH_TAGS)
        elif new:
            read = self._tags(region, LAUNCH_TAGS, ids=new)
        else:
            read = {}
        kept = {i: tags for i, tags in known.items() if i in members}
        for instance_id in new:
            tags = read.get(instance_id, {})
            if POOL_TAG in tags and LAUNCHED_AT_TAG in tags:
                kept[instance_id] = tags
        self._launch_tags[region] = kept
        return {
            i: {FLEET_TAG: self.fleet_id, **kept.get(i, read.get(i, {}))} for i in sorted(members)
        }

    def _tags(
        self,
        region: str,
        keys: Sequence[str],
        values: Sequence[str] = (),
        ids: Sequence[str] = (),
    ) -> dict[str, dict[str, str]]:
        """Instance tags under these keys (and values, and instance ids), by instance id."""
        filters = [
            {"Name": "resource-type", "Values": ["instance"]},
            {"Name": "key", "Values": list(keys)},
        ]
        if values:
            filters.append({"Name": "value", "Values": list(values)})
        if ids:
            filters.append({"Name": "resource-id", "Values": list(ids)})
        tagged: dict[str, dict[str, str]] = {}
        try:
            pages = (
                self.client("ec2", region)
                .get_paginator("describe_tags")
                .paginate(Filters=filters, PaginationConfig={"PageSize": PAGE_SIZE})
            )
            for page in pages:
                for tag in page.get("Tags", []):
                    tagged.setdefault(str(tag["ResourceId"]), {})[str(tag["Key"])] = str(
                        tag.get("Value", "")
                    )
        except Exception as exc:
            raise typed(exc) from None
        return tagged

    def _states(self, region: str) -> dict[str, str]:
        """The state name of every instance in the region, terminated ones included (so an
        instance that ended is told apart from one not yet visible)."""
        try:
            pages = (
                self.client("ec2", region)
                .get_paginator("describe_instance_status")
                .paginate(IncludeAllInstances=True, PaginationConfig={"PageSize": PAGE_SIZE})
            )
            return {
                str(status["InstanceId"]): str(status.get("InstanceState", {}).get("Name", ""))
                for page in pages
                for status in page.get("InstanceStatuses", [])
            }
        except Exception as exc:
            raise typed(exc) from None

    def _resolve(self, region: str, unresolved: Mapping[str, Mapping[str, str]]) -> list[Instance]:
        """DescribeInstances for the instances the tags and states could not describe. One whose
        tags are visible but which no describe call shows yet was just launched: it counts as
        pending for a grace period, so the controller does not take it for gone and buy again."""
        ids = sorted(unresolved)
        seen: set[str] = set()
        listed: list[Instance] = []
        for start in range(0, len(ids), IDS_PER_FILTER):
            chunk = ids[start : start + IDS_PER_FILTER]
            for raw in self._describe(region, [{"Name": "instance-id", "Values": chunk}]):
                seen.add(str(raw["InstanceId"]))
                if raw.get("State", {}).get("Name") in LISTED_STATES:
                    listed.append(self._instance(raw, region))
        now = self.clock.now()
        for instance_id in ids:
            tags = unresolved[instance_id]
            pool = self.pools.get(tags.get(POOL_TAG, ""))
            launched = _launched_at(tags.get(LAUNCHED_AT_TAG))
            if instance_id in seen or pool is None or launched is None:
                continue
            if now - launched < UNSEEN_GRACE_S:
                listed.append(
                    self._remember(
                        Instance(
                            id=instance_id,
                            pool=pool.name,
                            state=InstanceState.PENDING,
                            launched_at=launched,
                            request_id=tags.get(REQUEST_TAG, ""),
                            gpus=pool.gpus_per_instance,
                        ),
                        region,
                    )
                )
        return listed

    def _describe(self, region: str, filters: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        ec2 = self.client("ec2", region)
        try:
            pages = ec2.get_paginator("describe_instances").paginate(
                Filters=[{"Name": f"tag:{FLEET_TAG}", "Values": [self.fleet_id]}, *filters],
                PaginationConfig={"PageSize": 1000},
            )
            for page in pages:
                for reservation in page.get("Reservations", []):
                    yield from reservation.get("Instances", [])
        except Exception as exc:
            raise typed(exc) from None

    def _instance(self, raw: Mapping[str, Any], region: str) -> Instance:
        tags = {t["Key"]: t["Value"] for t in raw.get("Tags", [])}
        pool_name = tags.get(POOL_TAG, "unknown")
        pool = self.pools.get(pool_name)
        known = self.catalog.get(str(raw.get("InstanceType", "")))
        gpus = pool.gpus_per_instance if pool else (known.gpus if known and known.gpus else 1)
        launched = _launched_at(tags.get(LAUNCHED_AT_TAG))
        if launched is None:
            launch_time = raw.get("LaunchTime")
            launched = launch_time.timestamp() if launch_time is not None else self.clock.now()
        return self._remember(
            Instance(
                id=str(raw["InstanceId"]),
                pool=pool_name,
                state=STATES.get(raw.get("State", {}).get("Name", ""), InstanceState.PENDING),
                launched_at=launched,
                request_id=tags.get(REQUEST_TAG, ""),
                gpus=gpus,
            ),
            region,
        )

    def _remember(self, instance: Instance, region: str) -> Instance:
        """Where an instance lives and its pool, for terminate and the interruption watcher."""
        self._region_of[instance.id] = region
        self._pool_of[instance.id] = instance.pool
        return instance

    # -- launching ---------------------------------------------------------------------------

    def launch(self, pool: Pool, count: int, request_id: str, fleet_id: str) -> LaunchResult:
        existing = [
            self._instance(raw, pool.region)
            for raw in self._describe(
                pool.region,
                [
                    {"Name": f"tag:{REQUEST_TAG}", "Values": [request_id]},
                    {"Name": "instance-state-name", "Values": list(LISTED_STATES)},
                ],
            )
        ]
        if existing:
            return LaunchResult(tuple(existing), already_existed=True)
        now = self.clock.now()
        tags = self._tags_for(pool, request_id, now)
        try:
            if len(self._shapes(pool)) == 1:
                ids, shortfall = self._run_instances(pool, count, request_id, tags)
            else:
                ids, shortfall = self._create_fleet(pool, count, request_id, tags)
        except Exception as exc:
            raise typed(exc, pool.name) from None
        instances = [self._launched(pool, i, request_id, now) for i in ids]
        if shortfall is None and len(instances) < count:
            shortfall = CapacityError(
                f"{pool.name}: {len(instances)} of {count} launched",
                pool=pool.name,
                code="UnfulfillableCapacity",
            )
        return LaunchResult(tuple(instances), shortfall)

    def launch_gang(self, pool: Pool, count: int, request_id: str, fleet_id: str) -> LaunchResult:
        """All ``count`` instances in the pool's placement group, or none (``AwsGangs``)."""
        return self.gangs.launch(pool, count, request_id)

    def _tags_for(self, pool: Pool, request_id: str, now: float) -> list[dict[str, str]]:
        """The four tags every launched instance carries (TagSpecifications)."""
        return [
            {"Key": FLEET_TAG, "Value": self.fleet_id},
            {"Key": POOL_TAG, "Value": pool.name},
            {"Key": REQUEST_TAG, "Value": request_id},
            {"Key": LAUNCHED_AT_TAG, "Value": f"{now:.3f}"},
        ]

    def _launched(self, pool: Pool, instance_id: str, request_id: str, now: float) -> Instance:
        """An instance a launch just made, as pending, remembered for terminate and notices."""
        self._region_of[instance_id] = pool.region
        self._pool_of[instance_id] = pool.name
        return Instance(
            id=instance_id,
            pool=pool.name,
            state=InstanceState.PENDING,
            launched_at=now,
            request_id=request_id,
            gpus=pool.gpus_per_instance,
        )

    def _shapes(self, pool: Pool) -> list[dict[str, str]]:
        options = self.options[pool.name]
        types = [
            pool.instance_type,
            *[t for t in options.instance_types if t != pool.instance_type],
        ]
        places: list[dict[str, str]] = (
            [{"SubnetId": s} for s in options.subnets]
            or [{"AvailabilityZone": z} for z in options.zones]
            or ([{"AvailabilityZone": pool.zone}] if pool.zone else [{}])
        )
        return [{"InstanceType": t, **place} for t in types for place in places]

    def _run_instances(
        self,
        pool: Pool,
        count: int,
        request_id: str,
        tags: list[dict[str, str]],
        *,
        together: bool = False,
        group: str | None = None,
    ) -> tuple[list[str], ProviderError | None]:
        """``together``: all ``count`` or none (MinCount = MaxCount), in placement ``group``."""
        options = self.options[pool.name]
        (shape,) = self._shapes(pool)
        request: dict[str, Any] = {
            "MinCount": count if together else 1,
            "MaxCount": count,
            "InstanceType": shape["InstanceType"],
            "ClientToken": request_id[:64],
            "TagSpecifications": [{"ResourceType": "instance", "Tags": tags}],
        }
        if options.launch_template is not None:
            request["LaunchTemplate"] = options.launch_template.spec()
        if options.image_id is not None:
            request["ImageId"] = options.image_id
        if "SubnetId" in shape:
            request["SubnetId"] = shape["SubnetId"]
        elif "AvailabilityZone" in shape:
            request["Placement"] = {"AvailabilityZone": shape["AvailabilityZone"]}
        if group is not None:
            request.setdefault("Placement", {})["GroupName"] = group
        if options.security_group_ids:
            request["SecurityGroupIds"] = list(options.security_group_ids)
        if pool.is_spot:
            spot: dict[str, Any] = {
                "SpotInstanceType": "one-time",
                "InstanceInterruptionBehavior": "terminate",
            }
            if options.max_spot_price is not None:
                spot["MaxPrice"] = f"{options.max_spot_price:.5f}"
            request["InstanceMarketOptions"] = {"MarketType": "spot", "SpotOptions": spot}
        response = self.client("ec2", pool.region).run_instances(**request)
        return [i["InstanceId"] for i in response.get("Instances", [])], None

    def _create_fleet(
        self,
        pool: Pool,
        count: int,
        request_id: str,
        tags: list[dict[str, str]],
        *,
        together: bool = False,
        group: str | None = None,
    ) -> tuple[list[str], ProviderError | None]:
        """``together``: all ``count`` or none (``MinTargetCapacity``, which EC2 honours only
        with one zone or one instance type: both are asked), in placement ``group``."""
        options = self.options[pool.name]
        assert options.launch_template is not None
        market = "spot" if pool.is_spot else "on-demand"
        overrides: list[dict[str, Any]] = [dict(shape) for shape in self._shapes(pool)]
        if group is not None:
            for override in overrides:
                override["Placement"] = {"GroupName": group}
        request: dict[str, Any] = {
            "Type": "instant",
            "ClientToken": request_id[:64],
            "TargetCapacitySpecification": {
                "TotalTargetCapacity": count,
                "DefaultTargetCapacityType": market,
            },
            "LaunchTemplateConfigs": [
                {
                    "LaunchTemplateSpecification": options.launch_template.spec(),
                    "Overrides": overrides,
                }
            ],
            "TagSpecifications": [{"ResourceType": "instance", "Tags": tags}],
        }
        strategy: dict[str, Any]
        if pool.is_spot:
            strategy = {"AllocationStrategy": "price-capacity-optimized"}
            if options.max_spot_price is not None:
                strategy["MaxTotalPrice"] = f"{options.max_spot_price * count:.5f}"
        else:
            strategy = {"AllocationStrategy": "lowest-price"}
        if together:
            strategy.update(
                MinTargetCapacity=count, SingleAvailabilityZone=True, SingleInstanceType=True
            )
        request["SpotOptions" if pool.is_spot else "OnDemandOptions"] = strategy
        response = self.client("ec2", pool.region).create_fleet(**request)
        ids = [i for group in response.get("Instances", []) for i in group.get("InstanceIds", [])]
        return ids, _fleet_shortfall(response.get("Errors", []), pool.name)

    # -- terminating -------------------------------------------------------------------------

    def terminate(self, instance_ids: Sequence[str], request_id: str) -> None:
        """Terminate only instances that carry our fleet tag, whatever ids we are given."""
        by_region: dict[str, list[str]] = {}
        for instance_id in instance_ids:
            for region in (
                [self._region_of[instance_id]]
                if instance_id in self._region_of
                else self._regions()
            ):
                by_region.setdefault(region, []).append(instance_id)
        for region, ids in by_region.items():
            owned = [
                str(raw["InstanceId"])
                for raw in self._describe(region, [{"Name": "instance-id", "Values": ids}])
            ]
            if not owned:
                continue
            try:
                self.client("ec2", region).terminate_instances(InstanceIds=owned)
            except Exception as exc:
                raise typed(exc) from None

    # -- prices ------------------------------------------------------------------------------

    def prices(self, pools: Sequence[Pool]) -> list[PriceQuote]:
        now = self.clock.now()
        if self.price_catalog is not None:
            return self._catalog_prices(pools, self.price_catalog, now)
        quotes = []
        for pool in pools:
            on_demand = self._on_demand(pool)
            if pool.is_spot:
                price = self._spot_price(pool, now)
                rate = self.advisor.rate_per_hour(pool.region, pool.instance_type)
                source = "describe-spot-price-history"
            else:
                price, rate, source = on_demand, None, "catalog"
            if price is None:
                continue
            quotes.append(
                PriceQuote(
                    pool=pool.name,
                    price_per_hour=price,
                    on_demand_price_per_hour=on_demand,
                    interruption_rate_per_hour=rate,
                    as_of=now,
                    source=source,
                )
            )
        return quotes

    def _catalog_prices(
        self, pools: Sequence[Pool], catalog: SkyPilotCatalog, now: float
    ) -> list[PriceQuote]:
        quotes = []
        for pool in pools:
            listed = catalog.price(pool.instance_type, pool.region, pool.zone)
            if listed is None:
                continue
            price = listed.spot if pool.is_spot else listed.on_demand
            if price is None:
                continue
            quotes.append(
                PriceQuote(
                    pool=pool.name,
                    price_per_hour=price,
                    on_demand_price_per_hour=listed.on_demand,
                    interruption_rate_per_hour=self.advisor.rate_per_hour(
                        pool.region, pool.instance_type
                    )
                    if pool.is_spot
                    else None,
                    as_of=now,
                    source=catalog.path,
                )
            )
        return quotes

    def _on_demand(self, pool: Pool) -> float | None:
        known = self.catalog.get(pool.instance_type)
        return known.on_demand_price_per_hour if known else None

    def _spot_price(self, pool: Pool, now: float) -> float | None:
        """The cheapest current spot price among the pool's shapes, scaled to the pool's GPUs."""
        table = self._spot_table(pool.region, now)
        zones = set(self.options[pool.name].zones) or ({pool.zone} if pool.zone else set())
        best: float | None = None
        for shape in self._shapes(pool):
            kind = shape["InstanceType"]
            known = self.catalog.get(kind)
            scale = pool.gpus_per_instance / known.gpus if known and known.gpus else 1.0
            for (zone, instance_type), price in table.items():
                if instance_type == kind and (not zones or zone in zones):
                    value = price * scale
                    best = value if best is None else min(best, value)
        return best

    def _spot_table(self, region: str, now: float) -> dict[tuple[str, str], float]:
        cached = self._spot.get(region)
        if cached is not None and now - cached[0] < self.settings.price_ttl_s:
            return cached[1]
        types = sorted(
            {
                s["InstanceType"]
                for p in self.pools.values()
                if p.region == region and p.is_spot
                for s in self._shapes(p)
            }
        )
        table: dict[tuple[str, str], tuple[float, float]] = {}
        if types:
            try:
                pages = (
                    self.client("ec2", region)
                    .get_paginator("describe_spot_price_history")
                    .paginate(InstanceTypes=types, ProductDescriptions=[PRODUCT])
                )
                for page in pages:
                    for item in page.get("SpotPriceHistory", []):
                        key = (item["AvailabilityZone"], item["InstanceType"])
                        stamp = item["Timestamp"].timestamp()
                        if key not in table or table[key][0] < stamp:
                            table[key] = (stamp, float(item["SpotPrice"]))
            except Exception as exc:
                raise typed(exc) from None
        latest = {key: value for key, (_, value) in table.items()}
        self._spot[region] = (now, latest)
        return latest

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


def _fleet_shortfall(errors: Sequence[Mapping[str, Any]], pool: str) -> ProviderError | None:
    """CreateFleet reports what it could not launch per override; a capacity code among them
    is the one that tells act what to do, so it wins."""
    if not errors:
        return None
    codes = [str(e.get("ErrorCode", "")) for e in errors]
    chosen = next((i for i, c in enumerate(codes) if c in CAPACITY_CODES), 0)
    return error_code(codes[chosen], 400, str(errors[chosen].get("ErrorMessage", "")), pool)


def _launched_at(tag: str | None) -> float | None:
    """Our launch-time tag as seconds, or None when it is missing or not a finite number."""
    if not tag:
        return None
    try:
        value = float(tag)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def endpoint_problem(url: str) -> str | None:
    """Why botocore would refuse ``url`` as an endpoint, or None (for every AWS setting that
    holds a URL: check it with the config rather than when the first client is made)."""
    if any(c.isspace() or ord(c) < 0x20 for c in url):
        return "it holds spaces or control characters"
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 (a bad port raises here)
    except ValueError as exc:
        return str(exc)
    if parts.scheme not in ("http", "https"):
        return "it does not start with http:// or https://"
    host = parts.hostname or ""
    if not host or len(host) > 255 or not (_HOST.match(host) or ":" in host):
        return "its host is not a valid name"
    return None


def queue_url_problem(url: str) -> str | None:
    """Why ``url`` is not an SQS queue URL (an endpoint, then ``/<account>/<queue name>``)."""
    problem = endpoint_problem(url)
    if problem is None and not _QUEUE_PATH.match(urlsplit(url).path):
        problem = "its path is not /<account>/<queue name>"
    return problem


def _queue_region(url: str) -> str | None:
    """The region in an SQS queue URL such as https://sqs.us-east-1.amazonaws.com/123/q."""
    parts = (urlsplit(url).hostname or "").split(".")
    if len(parts) > 2 and parts[0] == "sqs" and REGION.match(parts[1]):
        return parts[1]
    return None
