"""Our Azure VMs: listed, launched and deleted by their tags.

* Launch: one VM per instance, each a ``PUT`` of a deterministic name (fleet, request id, index),
  sent in parallel. A repeated PUT of a name is an update, never a second VM, and the request id
  is looked up by tag before launching, so a retry or a restart never buys a second set. Spot
  pools get ``priority=Spot``, ``evictionPolicy=Delete`` and ``billingProfile.maxPrice`` (-1: pay
  up to the on-demand price); on-demand pools ``priority=Regular``. Every VM carries the fleet,
  pool, request and launch-time tags, and the pool's ``user_data`` (its own, or the scheduler's
  join script), else its ``custom_data`` option, as its custom data.
* The long-running creates are waited on for at most ``operation_timeout_s``: a create still
  running then counts as launched (ARM accepted it; the next listing shows how it went), a
  create that failed is deleted at once and reported as the launch's typed shortfall.
* List and terminate by the fleet tag only: a VM without it is invisible to us. A listing also
  deletes VMs whose create failed (unless ``read_only``: plan mode only looks) and tells the
  evictions it sees to ``providers.azure.notices``.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import logging
import re
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

from autoscaler.model import Instance, InstanceState, Pool
from autoscaler.model.catalog import SkyPilotCatalog
from autoscaler.model.clock import Clock
from autoscaler.model.errors import ProviderError
from autoscaler.spi.provider import (
    FLEET_TAG,
    LAUNCHED_AT_TAG,
    POOL_TAG,
    REQUEST_TAG,
    TEAM_TAG,
    LaunchResult,
    launch_tags,
)
from providers.azure.errors import telling, typed
from providers.azure.notices import AzureEvictions, Sighting
from providers.azure.sdk import ArmClient, is_not_found, operation_failed
from providers.azure.settings import AzurePoolOptions, AzureSettings

log = logging.getLogger(__name__)

# Azure tag names may not contain '/', so the core's tag names are stored with '.' instead.
TAG_KEYS = {
    tag: tag.replace("/", ".")
    for tag in (FLEET_TAG, POOL_TAG, REQUEST_TAG, LAUNCHED_AT_TAG, TEAM_TAG)
}
CORE_TAGS = {key.lower(): tag for tag, key in TAG_KEYS.items()}
STATES = {
    "creating": InstanceState.PENDING,
    "updating": InstanceState.PENDING,
    "migrating": InstanceState.RUNNING,
    "succeeded": InstanceState.RUNNING,
    "deleting": InstanceState.TERMINATING,
}
FAILED_STATES = frozenset({"failed", "canceled"})
LIVE = frozenset({InstanceState.PENDING, InstanceState.RUNNING})
MAX_PARALLEL_CALLS = 8

T = TypeVar("T")
R = TypeVar("R")


def text(value: Any) -> str:
    """An SDK string or string enum as its wire value (``str()`` of an enum is its class name)."""
    return str(getattr(value, "value", value) or "")


def provisioning(vm: Any) -> str:
    return text(vm.provisioning_state).lower()


def azure_tags(tags: Mapping[str, str]) -> dict[str, str]:
    """The core's tags as Azure can store them."""
    return {TAG_KEYS.get(key, key): value for key, value in tags.items()}


def core_tags(tags: Mapping[str, str] | None) -> dict[str, str]:
    """A VM's Azure tags under the core's tag names (Azure tag names are case-insensitive)."""
    return {CORE_TAGS.get(key.lower(), key): value for key, value in (tags or {}).items()}


def vm_name(fleet_id: str, request_id: str, index: int) -> str:
    """The VM name for one instance of a launch: the same for the same fleet, request and index,
    so that a repeated launch PUTs the same names (an update) and cannot buy twice. It stays
    within Linux VM and host name rules (letters, digits, hyphens; at most 64)."""
    fleet = re.sub(r"[^a-z0-9-]+", "-", fleet_id.lower()).strip("-")[:24].strip("-") or "gpu"
    digest = hashlib.sha256(f"{fleet_id}\0{request_id}".encode()).hexdigest()[:12]
    return f"{fleet}-{digest}-{index}"


def free_names(fleet_id: str, request_id: str, count: int, taken: set[str]) -> list[str]:
    """The request's first ``count`` VM names that no VM of ours holds. Only a VM of an earlier
    attempt of the same request whose create failed (being deleted now) can hold one, since a
    live one makes the launch return early; ARM would refuse to PUT over a VM being deleted."""
    busy = {name.lower() for name in taken}
    names: list[str] = []
    index = 0
    while len(names) < count:
        name = vm_name(fleet_id, request_id, index)
        if name.lower() not in busy:
            names.append(name)
        index += 1
    return names


def parallel(call: Callable[[T], R], items: Sequence[T]) -> list[R | BaseException]:
    """``call`` over ``items`` on a few threads (ARM answers each PUT or DELETE in about a
    second); an item's exception is returned in its place."""

    def guarded(item: T) -> R | BaseException:
        try:
            return call(item)
        except Exception as exc:
            return exc

    if len(items) <= 1:
        return [guarded(item) for item in items]
    with ThreadPoolExecutor(max_workers=min(len(items), MAX_PARALLEL_CALLS)) as pool:
        return list(pool.map(guarded, items))


@dataclass
class Created:
    """What a round of creates came to: the VMs launched, the typed failures, and the names
    whose create ARM accepted and then failed (such a VM exists, failed, until deleted)."""

    instances: list[Instance] = field(default_factory=list)
    failures: list[ProviderError] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)


class AzureInstances:
    """The VMs of one fleet in its resource group, and the ones we are deleting."""

    read_only = False  # plan mode sets it: a listing then deletes nothing

    def __init__(
        self,
        sdk: ArmClient,
        settings: AzureSettings,
        pools: Mapping[str, Pool],
        options: Mapping[str, AzurePoolOptions],
        fleet_id: str,
        clock: Clock,
        catalog: SkyPilotCatalog | None,
        evictions: AzureEvictions,
    ) -> None:
        self.sdk = sdk
        self.settings = settings
        self.pools = pools
        self.options = options
        self.fleet_id = fleet_id
        self.clock = clock
        self.catalog = catalog
        self.evictions = evictions
        self.deleting: set[str] = set()
        # By pool name: the pools a launch is handed are the controller's, and it is the
        # provider's own (as the assembly built it) that carry the user data.
        self.user_data = {name: p.user_data for name, p in pools.items() if p.user_data}

    def _vms(self) -> list[Any]:
        """Every VM in the resource group, following ``nextLink`` to the last page."""
        try:
            return list(self.sdk.client().virtual_machines.list(self.settings.resource_group))
        except Exception as exc:
            raise typed(exc) from None

    def ours(self) -> list[tuple[Any, dict[str, str]]]:
        """Our VMs (the fleet tag, compared client-side: ARM cannot filter VMs by tag)."""
        found = []
        for vm in self._vms():
            tags = core_tags(vm.tags)
            if tags.get(FLEET_TAG) == self.fleet_id:
                found.append((vm, tags))
        return found

    # -- listing -----------------------------------------------------------------------------

    def list_instances(self) -> list[Instance]:
        """Our VMs and their states. A VM whose create failed holds nothing and is deleted here
        rather than listed; a Spot VM seen live and now deleted by Azure (not by us) is an
        eviction: a notice is queued, and this once the VM keeps its last state so that the
        controller, which ignores notices for instances listed as terminating, acts on it."""
        now = self.clock.now()
        found: list[Instance] = []
        live: dict[str, Sighting] = {}
        for vm, tags in self.ours():
            name = str(vm.name)
            state_name = provisioning(vm)
            if state_name in FAILED_STATES and not self._running_anyway(name):
                if not self.read_only:
                    self.delete_quietly(name)
                continue
            state = STATES.get(state_name, InstanceState.PENDING)
            if state_name in FAILED_STATES:
                state = InstanceState.RUNNING
            instance = self.instance(vm, tags, state)
            spot = text(vm.priority).lower() == "spot"
            before = self.evictions.last_seen(name)
            if (
                spot
                and state is InstanceState.TERMINATING
                and before is not None
                and name not in self.deleting
            ):
                self.evictions.notice(name, instance.pool, now)
                instance = instance.model_copy(update={"state": before[1]})
            if state in LIVE:
                live[name] = (instance.pool, state, spot)
            found.append(instance)
        listed = {i.id for i in found}
        self.evictions.listed(live, listed, self.deleting, now)
        self.deleting &= listed
        return found

    def _running_anyway(self, name: str) -> bool:
        """A VM in provisioning state Failed may still be running (an update or extension
        failed after it was created): only its instance view says, so it is asked for the rare
        Failed VM only."""
        try:
            view = self.sdk.client().virtual_machines.instance_view(
                self.settings.resource_group, name
            )
        except Exception as exc:
            raise typed(exc) from None
        codes = [str(s.code or "") for s in (view.statuses or [])]
        return any(code in ("PowerState/running", "PowerState/starting") for code in codes)

    def instance(self, vm: Any, tags: Mapping[str, str], state: InstanceState) -> Instance:
        pool_name = tags.get(POOL_TAG, "unknown")
        pool = self.pools.get(pool_name)
        size = str(getattr(vm.hardware_profile, "vm_size", "") or "")
        known = self.catalog.gpus(size) if self.catalog is not None else None
        gpus = pool.gpus_per_instance if pool else (known[0] if known and known[0] else 1)
        created = vm.time_created
        launched = created.timestamp() if created is not None else self.clock.now()
        with contextlib.suppress(ValueError):
            launched = float(tags.get(LAUNCHED_AT_TAG, ""))
        return Instance(
            id=str(vm.name),
            pool=pool_name,
            state=state,
            launched_at=launched,
            request_id=tags.get(REQUEST_TAG, ""),
            gpus=gpus,
            team=tags.get(TEAM_TAG) or None,
        )

    # -- launching ---------------------------------------------------------------------------

    def launch(
        self, pool: Pool, count: int, request_id: str, team: str | None = None
    ) -> LaunchResult:
        """Create ``count`` VMs, or return the request's VMs if an earlier attempt made any.

        The creates are waited on together for at most ``operation_timeout_s``. A create still
        running then, or whose status could not be read, counts as launched: ARM accepted it, so
        buying again would risk a second VM, and the next listing shows how it went (a later
        failure is deleted there and the controller replaces it). Creates that failed are
        deleted now and become the shortfall, or the raised error when nothing was launched."""
        ours = self.ours()
        existing = [
            self.instance(vm, tags, STATES.get(provisioning(vm), InstanceState.PENDING))
            for vm, tags in ours
            if tags.get(REQUEST_TAG) == request_id
            and provisioning(vm) not in (*FAILED_STATES, "deleting")
        ]
        if existing:
            return LaunchResult(tuple(existing), already_existed=True)
        now = self.clock.now()
        tags = self.tags(pool, request_id, now, team)
        names = free_names(self.fleet_id, request_id, count, {str(vm.name) for vm, _ in ours})
        created = self.create_vms(
            pool, names, lambda name: self.body(pool, name, tags), request_id, now, team
        )
        for name in created.failed:
            self.delete_quietly(name)
        shortfall = telling(created.failures)
        if shortfall is not None and not created.instances:
            raise shortfall
        return LaunchResult(tuple(created.instances), shortfall)

    def tags(
        self, pool: Pool, request_id: str, now: float, team: str | None = None
    ) -> dict[str, str]:
        """The four tags every launched VM carries, and the team's when it is bought for one
        (as the team is named: Azure tag values take up to 256 characters, team names 253)."""
        return azure_tags(launch_tags(self.fleet_id, pool, request_id, now, team))

    def create_vms(
        self,
        pool: Pool,
        names: Sequence[str],
        body: Callable[[str], dict[str, Any]],
        request_id: str,
        now: float,
        team: str | None = None,
    ) -> Created:
        """Start every VM's create at once and wait on them together for at most
        ``operation_timeout_s``. A create still running then, or whose status could not be
        read, counts as launched (pending): ARM accepted it. What to do about failures is the
        caller's: ``launch`` keeps the rest, a gang rolls back all."""
        vms = self.sdk.client().virtual_machines
        group = self.settings.resource_group
        started = parallel(lambda name: vms.begin_create_or_update(group, name, body(name)), names)
        deadline = time.monotonic() + self.settings.operation_timeout_s
        created = Created()
        for name, outcome in zip(names, started, strict=True):
            if isinstance(outcome, BaseException):
                created.failures.append(typed(outcome, pool.name))
                continue
            try:
                outcome.wait(max(0.0, deadline - time.monotonic()))
            except Exception as exc:
                if operation_failed(exc):
                    created.failures.append(typed(exc, pool.name))
                    created.failed.append(name)
                    continue
                log.warning("%s: create of %s not confirmed: %s", pool.name, name, typed(exc))
            finished = outcome.done() and text(outcome.status()).lower() == "succeeded"
            created.instances.append(
                Instance(
                    id=name,
                    pool=pool.name,
                    state=InstanceState.RUNNING if finished else InstanceState.PENDING,
                    launched_at=now,
                    request_id=request_id,
                    gpus=pool.gpus_per_instance,
                    team=team or None,
                )
            )
        return created

    def body(self, pool: Pool, name: str, tags: Mapping[str, str]) -> dict[str, Any]:
        """The VM as ARM's JSON: the pool's size, image and subnet, a NIC and OS disk that are
        deleted with the VM, the spot settings for a spot pool, and the pool's user-assigned
        identities (a boot script reads its secrets with one)."""
        options = self.options[pool.name]
        os_disk: dict[str, Any] = {"createOption": "FromImage", "deleteOption": "Delete"}
        if options.os_disk_size_gb is not None:
            os_disk["diskSizeGB"] = options.os_disk_size_gb
        user = options.admin_username
        os_profile: dict[str, Any] = {
            "computerName": name,
            "adminUsername": user,
            "linuxConfiguration": {
                "disablePasswordAuthentication": True,
                "ssh": {
                    "publicKeys": [
                        {
                            "path": f"/home/{user}/.ssh/authorized_keys",
                            "keyData": options.ssh_public_key,
                        }
                    ]
                },
            },
        }
        custom = self.user_data.get(pool.name, options.custom_data)
        if custom is not None:
            os_profile["customData"] = base64.b64encode(custom.encode()).decode()
        properties: dict[str, Any] = {
            "hardwareProfile": {"vmSize": pool.instance_type},
            "storageProfile": {"imageReference": options.image_reference(), "osDisk": os_disk},
            "osProfile": os_profile,
            "networkProfile": {
                "networkApiVersion": "2020-11-01",
                "networkInterfaceConfigurations": [
                    {
                        "name": f"{name}-nic",
                        "properties": {
                            "primary": True,
                            "deleteOption": "Delete",
                            "ipConfigurations": [
                                {
                                    "name": "primary",
                                    "properties": {
                                        "primary": True,
                                        "subnet": {"id": options.subnet_id},
                                    },
                                }
                            ],
                        },
                    }
                ],
            },
            "priority": "Spot" if pool.is_spot else "Regular",
        }
        if pool.is_spot:
            properties["evictionPolicy"] = "Delete"
            properties["billingProfile"] = {"maxPrice": options.max_price}
        body: dict[str, Any] = {
            "location": pool.region,
            "tags": dict(tags),
            "properties": properties,
        }
        if pool.zone:
            body["zones"] = [pool.zone.rsplit("-", 1)[-1]]
        if options.identities:
            body["identity"] = {
                "type": "UserAssigned",
                "userAssignedIdentities": {identity: {} for identity in options.identities},
            }
        return body

    # -- terminating -------------------------------------------------------------------------

    def terminate(self, instance_ids: Sequence[str]) -> None:
        """Delete only VMs that carry our fleet tag, whatever names we are given. The delete is
        accepted by ARM and not waited on: the listing shows the VM deleting, then gone."""
        wanted = {i.lower() for i in instance_ids}
        if not wanted:
            return
        owned = [
            str(vm.name)
            for vm, _ in self.ours()
            if str(vm.name).lower() in wanted and provisioning(vm) != "deleting"
        ]
        outcomes = parallel(self.delete, owned)
        errors = [typed(o) for o in outcomes if isinstance(o, BaseException)]
        if errors:
            raise errors[0]

    def delete(self, name: str) -> None:
        """Start deleting one VM (one already gone is fine)."""
        try:
            self.sdk.client().virtual_machines.begin_delete(
                self.settings.resource_group, name, polling=False
            )
        except Exception as exc:
            if not is_not_found(exc):
                raise
        self.deleting.add(name)

    def delete_quietly(self, name: str) -> None:
        """Delete a VM whose create failed. Failing here is only logged: the next listing finds
        the VM again and tries once more."""
        try:
            self.delete(name)
        except Exception as exc:
            log.warning("deleting %s, whose create failed, failed: %s", name, typed(exc))
