"""GCP gangs: a multi-node job's VMs made all or none, under a compact placement policy.

* The pool's ``placement_policy`` option names a resource policy in the pool's region, or asks
  for one to be made: looked up (``resourcePolicies.get``) the first time a gang of the pool
  launches, and inserted if it is missing and ``create`` is set, as a group placement policy with
  ``collocation: COLLOCATED`` (the compact placement policy). A policy is regional, so it serves
  every zone of the pool. A missing policy without ``create`` is a configuration mistake
  (``InvalidRequest``). Resource policies carry no labels; the description names the fleet and
  pool. A pool without the option launches its gangs all or none, uncollocated.
* The VMs are made by one ``instances.bulkInsert`` per zone with ``count = minCount = n``:
  Compute Engine then makes all ``n`` or none (it deletes those it made when it cannot reach
  ``minCount``). Names are given per instance (``perInstanceProperties``), derived from the
  fleet, request id, zone and position, so they are the same on a retry and never collide
  between zones. A zone out of capacity hands the gang to the pool's next zone.
* Whatever the operation says, a failed gang leaves nothing running: the request's VMs still
  listed in the zone after a failed bulk insert are deleted (Compute Engine's own clean-up may
  not have run yet), and then the error is raised (``CapacityError`` once every zone has been
  tried).
* A bulk insert not ``DONE`` within ``operation_timeout_s`` counts as launched, every VM pending:
  Compute Engine will make all of them or none, and forgetting VMs that are being made would
  let the budget overspend. The next listing shows which it was.
* Idempotent by request id as ``launch`` is: the request's VMs are listed by label first; all
  ``n`` alive is the gang (``already_existed``); some but not all (a member preempted, an
  earlier attempt cut off) are deleted and ``CapacityError`` raised. The bulk insert's
  ``requestId`` is derived from the request id and zone, so a retry after a lost answer is the
  same operation, never a second gang.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from functools import partial
from typing import Any

from autoscaler.model import InstanceState, Pool
from autoscaler.model.errors import CapacityError, InvalidRequest, ProviderError, TransientError
from autoscaler.spi.provider import LaunchResult
from providers.gcp.errors import operation_error, typed
from providers.gcp.instances import (
    STATES,
    GcpInstances,
    instance_name,
    request_uuid,
    wait_done,
)
from providers.gcp.sdk import is_conflict, is_not_found
from providers.placement import KnownGroups, PlacementOption

log = logging.getLogger(__name__)

INCOMPLETE = "GangIncomplete"
ALREADY_EXISTS = frozenset({"alreadyExists", "RESOURCE_ALREADY_EXISTS"})
LIVE = frozenset({InstanceState.PENDING, InstanceState.RUNNING})


class GcpGangs:
    """``launch_gang`` for one provider's VMs (they own the clients, options and waits)."""

    def __init__(self, instances: GcpInstances) -> None:
        self.instances = instances
        self._policies = KnownGroups()  # pool -> a placement policy known to exist

    def launch(
        self, pool: Pool, count: int, request_id: str, team: str | None = None
    ) -> LaunchResult:
        ours = self.instances
        now = ours.clock.now()
        listed = [
            (zone, raw)
            for zone in ours.zones[pool.name]
            for raw in ours.zone_list(zone, request_id, pool.name)
        ]
        alive = [
            ours.instance(raw, zone, now)
            for zone, raw in listed
            if STATES.get(str(raw.status), InstanceState.PENDING) in LIVE
        ]
        if len(alive) == count == len(listed):
            return LaunchResult(tuple(alive), already_existed=True)
        if listed:
            self._delete(pool, request_id, [(zone, str(raw.name)) for zone, raw in listed])
            raise CapacityError(
                f"{pool.name}: gang {request_id} found with {len(alive)} of {count} VMs alive; "
                "its VMs were deleted",
                pool=pool.name,
                code=INCOMPLETE,
            )
        policy = self.policy(pool)
        labels = ours.labels(pool, request_id, now, team)
        deadline = time.monotonic() + ours.settings.operation_timeout_s
        refused: ProviderError | None = None
        for position, zone in enumerate(ours.zones[pool.name]):
            names = [
                instance_name(ours.fleet_id, request_id, position * count + index)
                for index in range(count)
            ]
            error = self._bulk_insert(pool, zone, names, labels, policy, request_id, deadline, team)
            if error is None:
                placed = [(name, zone) for name in names]
                return LaunchResult(tuple(ours.launched(pool, placed, request_id, now, team)))
            if not isinstance(error, CapacityError):
                raise error
            refused = error
        raise refused or CapacityError(f"{pool.name}: no zone to launch a gang in", pool=pool.name)

    def _bulk_insert(
        self,
        pool: Pool,
        zone: str,
        names: Sequence[str],
        labels: dict[str, str],
        policy: str | None,
        request_id: str,
        deadline: float,
        team: str | None = None,
    ) -> ProviderError | None:
        """One all-or-nothing bulk insert in one zone: None when the gang is made (or being
        made), else the typed error, with whatever the failed insert left in the zone deleted.
        An error answering the request itself is raised unless it is a full zone."""
        ours = self.instances
        instances, _ = ours.sdk.clients()
        resource = {
            "count": len(names),
            "min_count": len(names),
            "per_instance_properties": {name: {} for name in names},
            "instance_properties": self._properties(pool, zone, labels, policy, team),
        }
        request = {
            "project": ours.settings.project,
            "zone": zone,
            "request_id": request_uuid(ours.fleet_id, request_id, "gang", zone),
            "bulk_insert_instance_resource_resource": resource,
        }
        try:
            operation = ours.sdk.call(instances.bulk_insert_unary, request)
        except Exception as exc:
            error = typed(exc, pool.name)
            if isinstance(error, CapacityError):
                return error
            raise error from None
        done = ours.wait(zone, str(operation.name), deadline)
        if done is None:
            log.warning("%s: bulk insert of a gang in %s not seen done", pool.name, zone)
            return None
        failed = operation_error(done, pool.name)
        if failed is None:
            return None
        left = [str(raw.name) for raw in ours.zone_list(zone, request_id, pool.name)]
        self._delete(pool, request_id, [(zone, name) for name in left])
        return failed

    def _properties(
        self,
        pool: Pool,
        zone: str,
        labels: dict[str, str],
        policy: str | None,
        team: str | None = None,
    ) -> dict[str, Any]:
        """The VMs' properties: those of an ordinary launch's VM, with the short names a bulk
        insert takes (machine and accelerator types, resource policies)."""
        vm = self.instances.resource(pool, "gang", zone, labels, team)
        properties: dict[str, Any] = {
            "machine_type": pool.instance_type,
            "labels": vm["labels"],
            "scheduling": vm["scheduling"],
            "disks": vm["disks"],
            "network_interfaces": vm["network_interfaces"],
        }
        accelerators = [
            {
                "accelerator_type": str(accelerator["accelerator_type"]).rsplit("/", 1)[-1],
                "accelerator_count": accelerator["accelerator_count"],
            }
            for accelerator in vm.get("guest_accelerators", [])
        ]
        if accelerators:
            properties["guest_accelerators"] = accelerators
        for key in ("metadata", "service_accounts"):  # the boot script, the VM's identity
            if key in vm:
                properties[key] = vm[key]
        if policy is not None:
            properties["resource_policies"] = [policy]
        return properties

    def _delete(self, pool: Pool, request_id: str, vms: Sequence[tuple[str, str]]) -> None:
        """Delete a gang's VMs by name (gone already is fine). Every deletion is tried and the
        first failure raised: the controller's retry of the same request finds what is left
        and deletes it then."""
        ours = self.instances
        instances, _ = ours.sdk.clients()
        failure: ProviderError | None = None
        for zone, name in vms:
            request = {
                "project": ours.settings.project,
                "zone": zone,
                "instance": name,
                "request_id": request_uuid(ours.fleet_id, request_id, "gang-delete", zone, name),
            }
            try:
                ours.sdk.call(instances.delete, request)
            except Exception as exc:
                if not is_not_found(exc) and failure is None:
                    failure = typed(exc, pool.name)
        if failure is not None:
            log.warning("%s: deleting gang VMs failed: %s", pool.name, failure)
            raise failure
        if vms:
            log.info("%s: deleted gang VMs %s", pool.name, ", ".join(n for _, n in vms))

    # -- the placement policy ----------------------------------------------------------------

    def policy(self, pool: Pool) -> str | None:
        """The pool's compact placement policy, looked up (and made, if asked) once."""
        ours = self.instances
        option = ours.options[pool.name].placement_policy
        return self._policies.get(option, ours.fleet_id, pool.name, partial(self._find, pool))

    def _find(self, pool: Pool, option: PlacementOption, name: str) -> str:
        """The policy's name once it is known to exist (made if missing and asked to be)."""
        ours = self.instances
        policies, _ = ours.sdk.placement_clients()
        request = {"project": ours.settings.project, "region": pool.region}
        try:
            ours.sdk.call(policies.get, {**request, "resource_policy": name})
        except Exception as exc:
            if not is_not_found(exc):
                raise typed(exc, pool.name) from None
            if not option.create:
                raise InvalidRequest(
                    f"{pool.name}: resource policy {name!r} does not exist in {pool.region} "
                    "(name an existing one, or set placement_policy.create: true)",
                    pool=pool.name,
                    code="notFound",
                ) from None
            self._create(pool, name)
        return name

    def _create(self, pool: Pool, name: str) -> None:
        """A compact placement policy for the pool. Another replica making it first is fine."""
        ours = self.instances
        policies, _ = ours.sdk.placement_clients()
        resource = {
            "name": name,
            "region": pool.region,
            "description": (
                f"gpu-autoscaler fleet {ours.fleet_id}, pool {pool.name}: multi-node jobs' "
                "VMs placed close together"
            ),
            "group_placement_policy": {"collocation": "COLLOCATED"},
        }
        request = {
            "project": ours.settings.project,
            "region": pool.region,
            "request_id": request_uuid(ours.fleet_id, "placement", pool.region, name),
            "resource_policy_resource": resource,
        }
        try:
            operation = ours.sdk.call(policies.insert_unary, request)
        except Exception as exc:
            if is_conflict(exc):
                return
            raise typed(exc, pool.name) from None
        deadline = time.monotonic() + ours.settings.operation_timeout_s
        done = self._wait_region(pool.region, str(operation.name), deadline)
        if done is None:
            raise TransientError(
                f"{pool.name}: creating resource policy {name} not seen done", pool=pool.name
            )
        failed = operation_error(done, pool.name)
        if failed is not None and failed.code not in ALREADY_EXISTS:
            raise failed
        log.info("%s: created compact placement policy %s in %s", pool.name, name, pool.region)

    def _wait_region(self, region: str, operation: str, deadline: float) -> Any:
        """A region operation once ``DONE``, or None (see ``wait_done``)."""
        ours = self.instances
        _, region_operations = ours.sdk.placement_clients()
        request = {"project": ours.settings.project, "region": region, "operation": operation}
        return wait_done(region_operations.wait, request, deadline, ours.settings.request_timeout_s)
