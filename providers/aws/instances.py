"""Our EC2 instances: listed, launched and terminated by their tags.

* Launch: ``CreateFleet`` of type ``instant`` across a pool's instance types and subnets or zones
  (spot with ``price-capacity-optimized``, on-demand with ``lowest-price``), or ``RunInstances``
  when a pool names one type in one place. Every instance carries the fleet, pool, request and
  launch-time tags. A launch is idempotent: the request id is looked up by tag before launching
  and passed as the client token, so a retry or a restart never buys a second set. A pool's
  ``user_data`` (its own, or the scheduler's join script) is the instances' user data, over the
  launch template's own.
* List and terminate by the fleet tag only: an instance without it is invisible to us. Listing
  reads our tags (``DescribeTags``) and states (``DescribeInstanceStatus``), a fraction of
  ``DescribeInstances``' bytes; the few instances those cannot describe fully are looked up there.
"""

from __future__ import annotations

import base64
import math
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from autoscaler.model import Instance, InstanceState, Pool
from autoscaler.model.catalog import InstanceCatalog
from autoscaler.model.clock import Clock
from autoscaler.model.errors import CapacityError, ProviderError
from autoscaler.spi.provider import (
    FLEET_TAG,
    LAUNCHED_AT_TAG,
    POOL_TAG,
    REQUEST_TAG,
    TEAM_TAG,
    LaunchResult,
    launch_tags,
)
from providers.aws.errors import fleet_shortfall, typed
from providers.aws.sdk import Clients
from providers.aws.settings import AwsPoolOptions

LISTED_STATES = ("pending", "running", "shutting-down", "stopping", "stopped")
STATES = {
    "pending": InstanceState.PENDING,
    "running": InstanceState.RUNNING,
    "shutting-down": InstanceState.TERMINATING,
    "stopping": InstanceState.TERMINATING,
    "stopped": InstanceState.TERMINATING,
    "terminated": InstanceState.TERMINATED,
}
LAUNCH_TAGS = (POOL_TAG, REQUEST_TAG, LAUNCHED_AT_TAG, TEAM_TAG)  # written once, at launch
PAGE_SIZE = 1000  # the most DescribeTags and DescribeInstanceStatus return in one page
IDS_PER_FILTER = 200  # instance ids per filter in one call
# How long an instance whose tags are visible may stay invisible to the describe calls (they are
# eventually consistent just after a launch) before we stop counting it as pending.
UNSEEN_GRACE_S = 600.0


def shapes(pool: Pool, options: AwsPoolOptions) -> list[dict[str, str]]:
    """The (instance type, subnet or zone) pairs a launch of the pool may choose from."""
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


class AwsInstances:
    """The instances of one fleet, and what listings and launches taught us of them: each one's
    region (for terminate) and pool (for notices), and the launch tags already read."""

    def __init__(
        self,
        clients: Clients,
        pools: Mapping[str, Pool],
        options: Mapping[str, AwsPoolOptions],
        regions: Sequence[str],
        fleet_id: str,
        clock: Clock,
        catalog: InstanceCatalog,
    ) -> None:
        self.clients = clients
        self.pools = pools
        self.options = options
        self.fleet_id = fleet_id
        self.clock = clock
        self.catalog = catalog
        self.regions = sorted({p.region for p in pools.values()} | set(regions))
        # By pool name: the pools a launch is handed are the controller's, and it is the
        # provider's own (as the assembly built it) that carry the user data.
        self.user_data = {name: p.user_data for name, p in pools.items() if p.user_data}
        self._region_of: dict[str, str] = {}
        self._pool_of: dict[str, str] = {}
        self._launch_tags: dict[str, dict[str, dict[str, str]]] = {}

    def pool_of(self, instance_id: str) -> str:
        """The pool an instance we have seen belongs to ("unknown" for one we have not)."""
        return self._pool_of.get(instance_id, "unknown")

    # -- listing -----------------------------------------------------------------------------

    def list_instances(self) -> list[Instance]:
        found: list[Instance] = []
        for region in self.regions:
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
                        team=tags.get(TEAM_TAG) or None,
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
                self.clients.client("ec2", region)
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
                self.clients.client("ec2", region)
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
            for raw in self.describe(region, [{"Name": "instance-id", "Values": chunk}]):
                seen.add(str(raw["InstanceId"]))
                if raw.get("State", {}).get("Name") in LISTED_STATES:
                    listed.append(self.instance(raw, region))
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
                            team=tags.get(TEAM_TAG) or None,
                        ),
                        region,
                    )
                )
        return listed

    def describe(self, region: str, filters: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        """DescribeInstances of our fleet's instances matching ``filters``, page by page."""
        ec2 = self.clients.client("ec2", region)
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

    def instance(self, raw: Mapping[str, Any], region: str) -> Instance:
        """One DescribeInstances item as an instance (remembered for terminate and notices)."""
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
                team=tags.get(TEAM_TAG) or None,
            ),
            region,
        )

    def _remember(self, instance: Instance, region: str) -> Instance:
        """Where an instance lives and its pool, for terminate and the interruption watcher."""
        self._region_of[instance.id] = region
        self._pool_of[instance.id] = instance.pool
        return instance

    # -- launching ---------------------------------------------------------------------------

    def launch(
        self, pool: Pool, count: int, request_id: str, team: str | None = None
    ) -> LaunchResult:
        existing = [
            self.instance(raw, pool.region)
            for raw in self.describe(
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
        tags = self.tags_for(pool, request_id, now, team)
        try:
            if len(shapes(pool, self.options[pool.name])) == 1:
                ids, shortfall = self.run_instances(pool, count, request_id, tags)
            else:
                ids, shortfall = self.create_fleet(pool, count, request_id, tags)
        except Exception as exc:
            raise typed(exc, pool.name) from None
        instances = [self.launched(pool, i, request_id, now, team) for i in ids]
        if shortfall is None and len(instances) < count:
            shortfall = CapacityError(
                f"{pool.name}: {len(instances)} of {count} launched",
                pool=pool.name,
                code="UnfulfillableCapacity",
            )
        return LaunchResult(tuple(instances), shortfall)

    def tags_for(
        self, pool: Pool, request_id: str, now: float, team: str | None = None
    ) -> list[dict[str, str]]:
        """The four tags every launched instance carries (TagSpecifications), and the team tag
        when the launch is bought for a team (its value as the team is named: EC2 takes any
        value up to 256 characters, and team names are at most 253)."""
        tags = launch_tags(self.fleet_id, pool, request_id, now, team)
        return [{"Key": key, "Value": value} for key, value in tags.items()]

    def launched(
        self, pool: Pool, instance_id: str, request_id: str, now: float, team: str | None = None
    ) -> Instance:
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
            team=team or None,
        )

    def run_instances(
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
        (shape,) = shapes(pool, options)
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
        if pool.name in self.user_data:
            request["UserData"] = self.user_data[pool.name]  # botocore encodes it in base64
        if pool.is_spot:
            spot: dict[str, Any] = {
                "SpotInstanceType": "one-time",
                "InstanceInterruptionBehavior": "terminate",
            }
            if options.max_spot_price is not None:
                spot["MaxPrice"] = f"{options.max_spot_price:.5f}"
            request["InstanceMarketOptions"] = {"MarketType": "spot", "SpotOptions": spot}
        response = self.clients.client("ec2", pool.region).run_instances(**request)
        return [i["InstanceId"] for i in response.get("Instances", [])], None

    def create_fleet(
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
        overrides: list[dict[str, Any]] = [dict(shape) for shape in shapes(pool, options)]
        if group is not None:
            for override in overrides:
                override["Placement"] = {"GroupName": group}
        template: dict[str, str] = options.launch_template.spec()
        if pool.name in self.user_data:
            # an instant fleet's own user data, over the template's; sent as EC2 takes it
            template["LaunchTemplateSpecificationUserData"] = base64.b64encode(
                self.user_data[pool.name].encode()
            ).decode()
        request: dict[str, Any] = {
            "Type": "instant",
            "ClientToken": request_id[:64],
            "TargetCapacitySpecification": {
                "TotalTargetCapacity": count,
                "DefaultTargetCapacityType": market,
            },
            "LaunchTemplateConfigs": [
                {
                    "LaunchTemplateSpecification": template,
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
        response = self.clients.client("ec2", pool.region).create_fleet(**request)
        ids = [i for group in response.get("Instances", []) for i in group.get("InstanceIds", [])]
        return ids, fleet_shortfall(response.get("Errors", []), pool.name)

    # -- terminating -------------------------------------------------------------------------

    def terminate(self, instance_ids: Sequence[str]) -> None:
        """Terminate only instances that carry our fleet tag, whatever ids we are given."""
        by_region: dict[str, list[str]] = {}
        for instance_id in instance_ids:
            for region in (
                [self._region_of[instance_id]] if instance_id in self._region_of else self.regions
            ):
                by_region.setdefault(region, []).append(instance_id)
        for region, ids in by_region.items():
            owned = [
                str(raw["InstanceId"])
                for raw in self.describe(region, [{"Name": "instance-id", "Values": ids}])
            ]
            if not owned:
                continue
            try:
                self.clients.client("ec2", region).terminate_instances(InstanceIds=owned)
            except Exception as exc:
                raise typed(exc) from None


def _launched_at(tag: str | None) -> float | None:
    """Our launch-time tag as seconds, or None when it is missing or not a finite number."""
    if not tag:
        return None
    try:
        value = float(tag)
    except ValueError:
        return None
    return value if math.isfinite(value) else None
