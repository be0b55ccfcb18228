"""AWS gangs: a multi-node job's instances launched all or none, in a cluster placement group.

* The pool's ``placement_group`` option names the group, or asks for one to be made: it is
  looked up by name (``DescribePlacementGroups``) the first time a gang of the pool launches and
  created with strategy ``cluster``, tagged with the fleet and pool, if it is missing and
  ``create`` is set. A missing group without ``create`` is a configuration mistake
  (``InvalidRequest``). A pool without the option launches its gangs all or none, unplaced.
* The launch asks EC2 for all or nothing: ``RunInstances`` with ``MinCount = MaxCount = n`` (one
  shape), or an instant ``CreateFleet`` with ``MinTargetCapacity = n`` in one zone and one
  instance type (several shapes). EC2 then either launches the whole gang or fails with a
  capacity error. Should fewer come up all the same, every instance of the request is
  terminated and ``CapacityError`` raised: a half gang runs nothing and costs money.
* Idempotent by request id as ``launch`` is (the request tag is looked up first, the request id
  is the client token). A retry that finds the whole gang alive returns it (``already_existed``);
  one that finds only part of it (an earlier attempt was cut off mid-rollback, or a member died)
  terminates that part and raises ``CapacityError``: it does not launch again under the same id,
  because EC2 answers a repeated client token with the earlier launch. The controller's next
  decision buys under a new request id.

A rollback terminates by instance id, not through ``AwsInstances.terminate``: that re-reads the
instances by tag first, and EC2's reads can miss an instance for a moment after its launch.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from functools import partial

from autoscaler.model import Instance, Pool
from autoscaler.model.errors import CapacityError, InvalidRequest, ProviderError
from autoscaler.spi.provider import FLEET_TAG, POOL_TAG, REQUEST_TAG, LaunchResult
from providers.aws.errors import typed
from providers.aws.instances import AwsInstances, shapes
from providers.placement import KnownGroups, PlacementOption

log = logging.getLogger(__name__)

ALIVE = ("pending", "running")
USABLE_GROUP_STATES = ("pending", "available")
UNKNOWN_GROUP = "InvalidPlacementGroup.Unknown"
DUPLICATE_GROUP = "InvalidPlacementGroup.Duplicate"
INCOMPLETE = "GangIncomplete"


class AwsGangs:
    """``launch_gang`` for one provider's instances (they own the clients, options and tags)."""

    def __init__(self, instances: AwsInstances) -> None:
        self.instances = instances
        self._groups = KnownGroups()

    def launch(
        self, pool: Pool, count: int, request_id: str, team: str | None = None
    ) -> LaunchResult:
        instances = self.instances
        alive = self._alive(pool, request_id)
        if len(alive) == count:
            return LaunchResult(tuple(alive), already_existed=True)
        if alive:
            self._roll_back(pool, [i.id for i in alive])
            raise CapacityError(
                f"{pool.name}: gang {request_id} found with {len(alive)} of {count} instances "
                "alive; those were terminated",
                pool=pool.name,
                code=INCOMPLETE,
            )
        group = self.group(pool)
        now = instances.clock.now()
        tags = instances.tags_for(pool, request_id, now, team)
        try:
            if len(shapes(pool, instances.options[pool.name])) == 1:
                ids, shortfall = instances.run_instances(
                    pool, count, request_id, tags, together=True, group=group
                )
            else:
                ids, shortfall = instances.create_fleet(
                    pool, count, request_id, tags, together=True, group=group
                )
        except Exception as exc:
            error = typed(exc, pool.name)
            if error.code == UNKNOWN_GROUP:
                self.forget(pool)  # deleted behind our back: looked up (and made) again next time
            raise error from None
        if len(ids) < count:
            strays = {i.id for i in self._alive(pool, request_id)}
            self._roll_back(pool, sorted(set(ids) | strays))
            if shortfall is not None:
                raise shortfall
            raise CapacityError(
                f"{pool.name}: {len(ids)} of a gang of {count} came up; all were terminated",
                pool=pool.name,
                code="UnfulfillableCapacity",
            )
        return LaunchResult(tuple(instances.launched(pool, i, request_id, now, team) for i in ids))

    # -- the placement group -----------------------------------------------------------------

    def group(self, pool: Pool) -> str | None:
        """The pool's placement group, looked up (and made, if asked) once per provider."""
        option = self.instances.options[pool.name].placement_group
        return self._groups.get(
            option, self.instances.fleet_id, pool.name, partial(self._find, pool)
        )

    def _find(self, pool: Pool, option: PlacementOption, name: str) -> str:
        """The group's name once it is known to exist (made if missing and asked to be)."""
        ec2 = self.instances.clients.client("ec2", pool.region)
        try:
            found = ec2.describe_placement_groups(
                Filters=[{"Name": "group-name", "Values": [name]}]
            ).get("PlacementGroups", [])
        except Exception as exc:
            raise typed(exc, pool.name) from None
        usable = [
            g
            for g in found
            if g.get("GroupName") == name and g.get("State", "available") in USABLE_GROUP_STATES
        ]
        if not usable:
            if not option.create:
                raise InvalidRequest(
                    f"{pool.name}: placement group {name!r} does not exist in {pool.region} "
                    "(name an existing one, or set placement_group.create: true)",
                    pool=pool.name,
                    code=UNKNOWN_GROUP,
                )
            self._create(pool, name)
        return name

    def forget(self, pool: Pool) -> None:
        self._groups.forget(pool.name)

    def _create(self, pool: Pool, name: str) -> None:
        """A cluster placement group tagged with the fleet (so IAM can fence the creation to
        it) and the pool. Another replica making it first is fine."""
        tags = [
            {"Key": FLEET_TAG, "Value": self.instances.fleet_id},
            {"Key": POOL_TAG, "Value": pool.name},
        ]
        try:
            self.instances.clients.client("ec2", pool.region).create_placement_group(
                GroupName=name,
                Strategy="cluster",
                TagSpecifications=[{"ResourceType": "placement-group", "Tags": tags}],
            )
        except Exception as exc:
            error = typed(exc, pool.name)
            if error.code != DUPLICATE_GROUP:
                raise error from None
        log.info("%s: created cluster placement group %s in %s", pool.name, name, pool.region)

    # -- members -----------------------------------------------------------------------------

    def _alive(self, pool: Pool, request_id: str) -> list[Instance]:
        return [
            self.instances.instance(raw, pool.region)
            for raw in self.instances.describe(
                pool.region,
                [
                    {"Name": f"tag:{REQUEST_TAG}", "Values": [request_id]},
                    {"Name": "instance-state-name", "Values": list(ALIVE)},
                ],
            )
        ]

    def _roll_back(self, pool: Pool, ids: Sequence[str]) -> None:
        """Terminate a gang's instances. Failing raises the typed error: the controller's
        retry of the same request finds what is left alive and terminates it then."""
        if not ids:
            return
        try:
            self.instances.clients.client("ec2", pool.region).terminate_instances(
                InstanceIds=list(ids)
            )
        except Exception as exc:
            error: ProviderError = typed(exc, pool.name)
            log.warning("%s: rolling back gang instances %s failed: %s", pool.name, ids, error)
            raise error from None
        log.info("%s: rolled back gang instances %s", pool.name, ", ".join(ids))
