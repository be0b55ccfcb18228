"""Azure gangs: a multi-node job's VMs created all or none, in a proximity placement group.

* The pool's ``proximity_placement_group`` option names a group in the fleet's resource group,
  or asks for one to be made: read (``proximityPlacementGroups`` GET) the first time a gang of
  the pool launches, and PUT if it is missing and ``create`` is set: a Standard group in the
  pool's region (and zone, with the pool's VM size as its intent, when the pool has a zone),
  tagged with the fleet and pool. A missing group without ``create``, or one in another region,
  is a configuration mistake (``InvalidRequest``). A pool without the option launches its gangs
  all or none, unplaced.
* ARM has no all-or-nothing create for loose VMs, so the provider makes it: one PUT per VM
  (names derived from the fleet, request id and index, as ``launch`` derives them), each
  referencing the group (``proximityPlacementGroup.id``), waited on together for at most
  ``operation_timeout_s``. If any create fails, every VM of the gang is deleted (made, still
  being made, or failed) and the failure raised: ``CapacityError`` for ``AllocationFailed`` and
  kin, which a placement group makes likelier since every VM must fit in one datacenter.
* A create still running at the timeout counts as launched (pending), as in ``launch``: ARM has
  accepted it. If it fails later, the listing deletes it and the gang is short a member, as when
  one is evicted.
* Idempotent by request id as ``launch`` is: the request's VMs are looked up by tag first; all
  ``n`` alive is the gang (``already_existed``); some but not all are deleted and
  ``CapacityError`` raised. Nothing is created again under the same request id while any VM of
  it is left; once all are gone, a retry is a fresh attempt.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from functools import partial
from typing import Any

from autoscaler.model import InstanceState, Pool
from autoscaler.model.errors import CapacityError, InvalidRequest
from autoscaler.spi.provider import FLEET_TAG, POOL_TAG, REQUEST_TAG, LaunchResult
from providers.azure.errors import telling, typed
from providers.azure.instances import (
    FAILED_STATES,
    STATES,
    AzureInstances,
    azure_tags,
    free_names,
    parallel,
    provisioning,
)
from providers.azure.sdk import is_not_found
from providers.placement import KnownGroups, PlacementOption

log = logging.getLogger(__name__)

INCOMPLETE = "GangIncomplete"


class AzureGangs:
    """``launch_gang`` for one provider's VMs (they own the client, options and bodies)."""

    def __init__(self, instances: AzureInstances) -> None:
        self.instances = instances
        self._groups = KnownGroups()  # pool -> the id of a group known to exist

    def launch(
        self, pool: Pool, count: int, request_id: str, team: str | None = None
    ) -> LaunchResult:
        vms = self.instances
        ours = vms.ours()
        members = [
            (vm, tags)
            for vm, tags in ours
            if tags.get(REQUEST_TAG) == request_id and provisioning(vm) != "deleting"
        ]
        alive = [
            vms.instance(vm, tags, STATES.get(provisioning(vm), InstanceState.PENDING))
            for vm, tags in members
            if provisioning(vm) not in FAILED_STATES
        ]
        if len(alive) == count == len(members):
            return LaunchResult(tuple(alive), already_existed=True)
        if members:
            self._roll_back(pool, [str(vm.name) for vm, _ in members])
            raise CapacityError(
                f"{pool.name}: gang {request_id} found with {len(alive)} of {count} VMs alive; "
                "its VMs were deleted",
                pool=pool.name,
                code=INCOMPLETE,
            )
        group = self.group(pool)
        now = vms.clock.now()
        tags = vms.tags(pool, request_id, now, team)
        names = free_names(vms.fleet_id, request_id, count, {str(vm.name) for vm, _ in ours})
        bodies = {name: self._body(pool, name, tags, group) for name in names}
        created = vms.create_vms(pool, names, bodies.__getitem__, request_id, now, team)
        failure = telling(created.failures)
        if failure is not None:
            self._roll_back(pool, names)
            raise failure
        return LaunchResult(tuple(created.instances))

    def _body(
        self, pool: Pool, name: str, tags: dict[str, str], group: str | None
    ) -> dict[str, Any]:
        body = self.instances.body(pool, name, tags)
        if group is not None:
            body["properties"]["proximityPlacementGroup"] = {"id": group}
        return body

    def _roll_back(self, pool: Pool, names: Sequence[str]) -> None:
        """Delete a gang's VMs (one never made is fine). Failing raises the typed error: the
        controller's retry of the same request finds what is left and deletes it then."""
        outcomes = parallel(self.instances.delete, list(names))
        errors = [typed(o, pool.name) for o in outcomes if isinstance(o, BaseException)]
        if errors:
            log.warning("%s: deleting gang VMs failed: %s", pool.name, errors[0])
            raise errors[0]
        log.info("%s: deleted gang VMs %s", pool.name, ", ".join(names))

    # -- the proximity placement group ------------------------------------------------------

    def group(self, pool: Pool) -> str | None:
        """The id of the pool's proximity placement group, read (and made) once."""
        vms = self.instances
        option = vms.options[pool.name].proximity_placement_group
        return self._groups.get(option, vms.fleet_id, pool.name, partial(self._find, pool))

    def _find(self, pool: Pool, option: PlacementOption, name: str) -> str:
        """The group's id once it is known to exist in the pool's region (made if missing and
        asked to be)."""
        vms = self.instances
        resource_group = vms.settings.resource_group
        try:
            found = vms.sdk.client().proximity_placement_groups.get(resource_group, name)
        except Exception as exc:
            if not is_not_found(exc):
                raise typed(exc, pool.name) from None
            if not option.create:
                raise InvalidRequest(
                    f"{pool.name}: proximity placement group {name!r} does not exist in "
                    f"resource group {resource_group} (name an existing one, or set "
                    "proximity_placement_group.create: true)",
                    pool=pool.name,
                    code="ResourceNotFound",
                ) from None
            found = self._create(pool, name)
        location = str(found.location or "").replace(" ", "").lower()
        if location != pool.region.replace(" ", "").lower():
            raise InvalidRequest(
                f"{pool.name}: proximity placement group {name!r} is in {found.location}, "
                f"the pool in {pool.region}",
                pool=pool.name,
                code="InvalidParameter",
            )
        return str(found.id)

    def _create(self, pool: Pool, name: str) -> Any:
        vms = self.instances
        body: dict[str, Any] = {
            "location": pool.region,
            "tags": azure_tags({FLEET_TAG: vms.fleet_id, POOL_TAG: pool.name}),
            "properties": {"proximityPlacementGroupType": "Standard"},
        }
        if pool.zone:
            # a zonal group with the pool's size as its intent: Azure picks a datacenter
            # that has it
            body["zones"] = [pool.zone.rsplit("-", 1)[-1]]
            body["properties"]["intent"] = {"vmSizes": [pool.instance_type]}
        try:
            made = vms.sdk.client().proximity_placement_groups.create_or_update(
                vms.settings.resource_group, name, body
            )
        except Exception as exc:
            raise typed(exc, pool.name) from None
        log.info("%s: created proximity placement group %s in %s", pool.name, name, pool.region)
        return made
