"""Our Compute Engine VMs: listed, launched and deleted by their labels.

* Launch: one ``instances.insert`` per VM, spread over the pool's zones, each with a name and a
  ``requestId`` derived from the controller's request id, so a retry can never buy a VM twice:
  Compute Engine answers a repeated ``requestId`` with the same operation and a repeated name with
  409. Before inserting, the request's VMs are listed by label and only the ones missing are
  inserted. Operations are waited on through our own ``ZoneOperationsClient`` (the SDK's
  ``operation.result()`` would poll the public endpoint whatever endpoint we were given), bounded by
  ``operation_timeout_s``. A zone out of capacity hands its VMs to the pool's other zones. A VM
  that may exist (its operation unfinished at the deadline, or its insert answered by a server
  error while the VM is there) is counted, so the budget never forgets what is being paid for.
* List and terminate by the fleet label only: a VM without it is invisible to us.
* The core's tags are stored as labels (``label_value`` is reversible), and what a listing or a
  launch saw of each VM (its pool and zone) is kept for notices and terminate.
* A pool's ``user_data`` (its own, or the scheduler's join script) or its ``startup_script``
  option (one of the two) is the VM's ``startup-script`` metadata, which the guest environment
  of Google's images runs at every boot; the ``metadata`` option's items follow it, and the
  ``service_account`` option is the VM's service account with its scopes.
"""

from __future__ import annotations

import hashlib
import logging
import re
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from autoscaler.model import Instance, InstanceState, Pool
from autoscaler.model.clock import Clock
from autoscaler.model.errors import CapacityError, ProviderError, ThrottledError, TransientError
from autoscaler.spi.provider import (
    FLEET_TAG,
    LAUNCHED_AT_TAG,
    POOL_TAG,
    REQUEST_TAG,
    TEAM_TAG,
    LaunchResult,
    launch_tags,
)
from providers.gcp.errors import operation_error, typed
from providers.gcp.sdk import ComputeClients, is_conflict, is_done, is_not_found
from providers.gcp.settings import GcpPoolOptions, GcpSettings, boot_metadata

log = logging.getLogger(__name__)

MAX_RESULTS = 500

# The core's tag names as GCP label keys ("/" is not allowed in a label key).
LABEL_KEYS = {
    FLEET_TAG: "gpu-autoscaler-fleet",
    POOL_TAG: "gpu-autoscaler-pool",
    REQUEST_TAG: "gpu-autoscaler-request",
    LAUNCHED_AT_TAG: "gpu-autoscaler-launched-at",
    TEAM_TAG: "gpu-autoscaler-team",
}
# A team whose label value had to be hashed (too long once encoded) is also written whole in
# this metadata item, so that a listing can still give its name back.
TEAM_METADATA_KEY = "gpu-autoscaler-team"
TAG_KEYS = {label: tag for tag, label in LABEL_KEYS.items()}
LABEL_MAX = 63

STATES = {
    "PENDING": InstanceState.PENDING,
    "PROVISIONING": InstanceState.PENDING,
    "STAGING": InstanceState.PENDING,
    "REPAIRING": InstanceState.PENDING,
    "RUNNING": InstanceState.RUNNING,
    "PENDING_STOP": InstanceState.TERMINATING,
    "STOPPING": InstanceState.TERMINATING,
    "STOPPED": InstanceState.TERMINATING,
    "SUSPENDING": InstanceState.TERMINATING,
    "SUSPENDED": InstanceState.TERMINATING,
    "TERMINATED": InstanceState.TERMINATING,
    "DEPROVISIONING": InstanceState.TERMINATING,
}

# -- labels ------------------------------------------------------------------------------------

_PLAIN = frozenset("abcdefghijklmnopqrstuvwxyz0123456789-")


def label_value(text: str) -> str:
    """A tag value as a GCP label value (lowercase letters, digits, ``-`` and ``_``, at most 63).

    Every other character, ``_`` included, becomes ``_`` and two hex digits per UTF-8 byte, so the
    mapping is reversible. A value still too long keeps a readable prefix and ends in ``__`` and
    a hash: no plain encoding contains ``__``, so such a value can never be mistaken for another.
    """
    encoded = "".join(
        char if char in _PLAIN else "".join(f"_{byte:02x}" for byte in char.encode())
        for char in text
    )
    if len(encoded) <= LABEL_MAX:
        return encoded
    digest = hashlib.sha256(text.encode()).hexdigest()[:15]
    prefix = encoded[: LABEL_MAX - len(digest) - 2]
    cut = prefix.rfind("_")
    if cut >= len(prefix) - 2 and cut != -1:
        prefix = prefix[:cut]
    return f"{prefix}__{digest}"


def tag_value(label: str) -> str:
    """The tag value a label value encodes; a hashed (too long) value is returned as it is."""
    if "__" in label or "_" not in label:
        return label
    raw = bytearray()
    index = 0
    while index < len(label):
        char = label[index]
        if char == "_" and re.fullmatch(r"[0-9a-f]{2}", label[index + 1 : index + 3]):
            raw.append(int(label[index + 1 : index + 3], 16))
            index += 3
        else:
            raw.extend(char.encode())
            index += 1
    return raw.decode(errors="replace")


def labels_for(tags: Mapping[str, str]) -> dict[str, str]:
    return {LABEL_KEYS.get(key, key): label_value(value) for key, value in tags.items()}


def team_metadata(team: str | None) -> list[dict[str, str]]:
    """The metadata item that names a team whose label cannot (none when the label can)."""
    if team and "__" in label_value(team):
        return [{"key": TEAM_METADATA_KEY, "value": team}]
    return []


def team_of(labels: Mapping[str, str], metadata: Mapping[str, str]) -> str | None:
    """Whom a VM was bought for: its team label decoded, or, where that label is a hash, the
    team metadata item (None when neither says)."""
    label = labels.get(LABEL_KEYS[TEAM_TAG])
    if not label:
        return None
    if "__" in label:
        return metadata.get(TEAM_METADATA_KEY) or None
    return tag_value(label)


def tags_from_labels(labels: Mapping[str, str]) -> dict[str, str]:
    """A VM's labels with the core's tag names and values back (other labels as they are)."""
    return {
        TAG_KEYS.get(key, key): tag_value(value) if key in TAG_KEYS else value
        for key, value in labels.items()
    }


def instance_name(fleet_id: str, request_id: str, index: int) -> str:
    """A valid VM name that is the same every time for one fleet, request and position."""
    digest = hashlib.sha256(f"{fleet_id}\n{request_id}".encode()).hexdigest()[:16]
    return f"ga-{digest}-{index}"


_REQUESTS = uuid.UUID("5d0f3a52-2b8e-4c51-9a54-3f2e7b1c9d10")


def request_uuid(*parts: str) -> str:
    """Compute Engine's ``requestId`` must be a UUID; ours is derived, so a retry repeats it."""
    return str(uuid.uuid5(_REQUESTS, "\n".join(parts)))


# -- operations --------------------------------------------------------------------------------


def wait_done(
    wait: Callable[..., Any], request: Mapping[str, str], deadline: float, request_timeout_s: float
) -> Any:
    """The operation once ``DONE``, or None when the deadline passes or its fate cannot be
    read. ``wait`` is a zone or region operations client's ``wait`` and ``request`` names the
    operation in its scope (the caller binds the client, so the grants test sees which one).
    Waits are in real time whatever the controller's clock: the cloud works in real time.
    ``wait`` returns at once when done (or after up to two minutes on Compute Engine); between
    polls that return early we back off from 50 ms to 1 s."""
    pause = 0.05
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return None
        try:
            done = wait(
                request=dict(request),
                retry=None,
                timeout=min(remaining, max(request_timeout_s, 1.0)),
            )
            if is_done(done):
                return done
        except Exception as exc:
            if not isinstance(typed(exc), TransientError):
                return None
        time.sleep(min(pause, max(0.0, deadline - time.monotonic())))
        pause = min(pause * 2, 1.0)


def timestamp(text: str) -> float | None:
    """An RFC 3339 time of Compute Engine's as seconds, or None."""
    if not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def last(link: str) -> str:
    """The last part of a resource link: a zone's, a VM's or a machine type's name."""
    return link.rstrip("/").rsplit("/", 1)[-1]


# -- the VMs -----------------------------------------------------------------------------------


@dataclass
class Seen:
    """What a listing or a launch told us of one of our VMs, for notices and terminate."""

    pool: str
    zone: str
    at: float


@dataclass
class _Launch:
    """One launch's progress over its insert rounds."""

    placed: list[tuple[str, str]] = field(default_factory=list)
    unsure: list[tuple[str, str]] = field(default_factory=list)
    full_zones: set[str] = field(default_factory=set)
    capacity: ProviderError | None = None
    stopped: ProviderError | None = None

    def refused(self, error: ProviderError, zone: str) -> bool:
        """Note a refusal; True when the VM may try another zone (only a full zone allows it:
        quota, throttling and the rest would refuse it there too, so they end the launch)."""
        if isinstance(error, CapacityError):
            self.full_zones.add(zone)
            self.capacity = error
            return True
        if self.stopped is None:
            self.stopped = error
        return False


class GcpInstances:
    """The VMs of one fleet, and what listings and launches saw of them (``seen``: pool, zone
    and when, by name; ``preempted``: Spot VMs the last listing showed ``TERMINATED``)."""

    def __init__(
        self,
        sdk: ComputeClients,
        settings: GcpSettings,
        pools: Mapping[str, Pool],
        options: Mapping[str, GcpPoolOptions],
        zones: Mapping[str, tuple[str, ...]],
        fleet_id: str,
        clock: Clock,
    ) -> None:
        self.sdk = sdk
        self.settings = settings
        self.pools = pools
        self.options = options
        self.zones = zones
        self.fleet_id = fleet_id
        self.clock = clock
        self._pool_by_label = {label_value(name): name for name in pools}
        # By pool name: the pools a launch is handed are the controller's, and it is the
        # provider's own (as the assembly built it) that carry the user data.
        self.metadata = {
            name: boot_metadata(pool.user_data, options[name], index)
            for index, (name, pool) in enumerate(pools.items())
        }
        self.seen: dict[str, Seen] = {}
        self.preempted: dict[str, str] = {}

    # -- listing -----------------------------------------------------------------------------

    def _filter(self, request_id: str | None = None) -> str:
        """A list filter on our fleet's label (and a request's), in Compute Engine's syntax."""
        terms = {FLEET_TAG: self.fleet_id}
        if request_id is not None:
            terms[REQUEST_TAG] = request_id
        return " ".join(
            f'(labels.{LABEL_KEYS[tag]} = "{label_value(value)}")' for tag, value in terms.items()
        )

    def aggregated(self) -> list[tuple[str, Any]]:
        """Every VM carrying our fleet label, in every zone, all pages read before any is used
        (a listing that fails half-way must not look like a smaller fleet)."""
        instances, _ = self.sdk.clients()
        found: list[tuple[str, Any]] = []
        try:
            pages = self.sdk.call(
                instances.aggregated_list,
                {
                    "project": self.settings.project,
                    "filter": self._filter(),
                    "max_results": MAX_RESULTS,
                },
            )
            for scope, scoped in pages:
                found.extend((last(scope), raw) for raw in scoped.instances)
        except Exception as exc:
            raise typed(exc) from None
        return found

    def zone_list(self, zone: str, request_id: str, pool: str) -> list[Any]:
        """The VMs of one request in one zone."""
        instances, _ = self.sdk.clients()
        try:
            pages = self.sdk.call(
                instances.list,
                {
                    "project": self.settings.project,
                    "zone": zone,
                    "filter": self._filter(request_id),
                    "max_results": MAX_RESULTS,
                },
            )
            return list(pages)
        except Exception as exc:
            raise typed(exc, pool) from None

    def list_instances(self) -> list[Instance]:
        listed = self.aggregated()
        now = self.clock.now()
        preempted: dict[str, str] = {}
        found = []
        for zone, raw in listed:
            instance = self.instance(raw, zone, now)
            found.append(instance)
            if raw.status == "TERMINATED" and raw.scheduling.provisioning_model == "SPOT":
                preempted[instance.id] = instance.pool
        self.preempted = preempted
        return found

    def instance(self, raw: Any, zone: str, now: float) -> Instance:
        """One listed VM as an instance (its pool and zone remembered)."""
        labels = dict(raw.labels)
        tags = tags_from_labels(labels)
        pool_name = self._pool_by_label.get(
            labels.get(LABEL_KEYS[POOL_TAG], ""), tags.get(POOL_TAG, "unknown")
        )
        pool = self.pools.get(pool_name)
        launched = _launched_at(tags.get(LAUNCHED_AT_TAG, ""), str(raw.creation_timestamp))
        name = str(raw.name)
        self.seen[name] = Seen(pool_name, zone, now)
        return Instance(
            id=name,
            pool=pool_name,
            state=STATES.get(str(raw.status), InstanceState.PENDING),
            launched_at=launched if launched is not None else now,
            request_id=tags.get(REQUEST_TAG, ""),
            gpus=pool.gpus_per_instance if pool else _gpus(raw),
            team=team_of(labels, _metadata(raw)),
        )

    # -- launching ---------------------------------------------------------------------------

    def launch(
        self, pool: Pool, count: int, request_id: str, team: str | None = None
    ) -> LaunchResult:
        now = self.clock.now()
        existing = [
            self.instance(raw, zone, now)
            for zone in self.zones[pool.name]
            for raw in self.zone_list(zone, request_id, pool.name)
        ]
        if len(existing) >= count:
            return LaunchResult(tuple(existing), already_existed=True)
        have = {i.id for i in existing}
        wanted = [
            i for i in range(count) if instance_name(self.fleet_id, request_id, i) not in have
        ]
        wanted = wanted[: count - len(existing)]
        labels = self.labels(pool, request_id, now, team)
        progress = _Launch()
        deadline = time.monotonic() + self.settings.operation_timeout_s
        tried: dict[int, set[str]] = {index: set() for index in wanted}
        while wanted and progress.stopped is None:
            wanted = self._round(pool, request_id, labels, wanted, tried, progress, deadline, team)
        for name, zone in progress.unsure:
            if self._exists(zone, name) is not False:
                progress.placed.append((name, zone))
        launched = self.launched(pool, progress.placed, request_id, now, team)
        instances = (*existing, *launched)
        shortfall: ProviderError | None = None
        if len(instances) < count:
            missing = CapacityError(
                f"{pool.name}: {len(instances)} of {count} launched", pool=pool.name
            )
            shortfall = progress.stopped or progress.capacity or missing
            if not instances:
                raise shortfall
        return LaunchResult(instances, shortfall, already_existed=bool(existing))

    def _round(
        self,
        pool: Pool,
        request_id: str,
        labels: dict[str, str],
        wanted: list[int],
        tried: dict[int, set[str]],
        progress: _Launch,
        deadline: float,
        team: str | None = None,
    ) -> list[int]:
        """Insert the wanted VMs, each in a zone it has not tried and that is not full, then
        wait for the operations; return the VMs to try again in another zone."""
        instances, _ = self.sdk.clients()
        accepted: list[tuple[int, str, str]] = []
        again: list[int] = []
        for index in wanted:
            zones = [
                z
                for z in self.zones[pool.name]
                if z not in progress.full_zones and z not in tried[index]
            ]
            if not zones or progress.stopped is not None:
                continue
            zone = zones[index % len(zones)]
            tried[index].add(zone)
            name = instance_name(self.fleet_id, request_id, index)
            request = {
                "project": self.settings.project,
                "zone": zone,
                "request_id": request_uuid(self.fleet_id, request_id, str(index), zone),
                "instance_resource": self.resource(pool, name, zone, labels, team),
            }
            try:
                operation = self.sdk.call(instances.insert_unary, request)
            except Exception as exc:
                if is_conflict(exc):
                    progress.placed.append((name, zone))  # inserted by an earlier attempt
                    continue
                error = typed(exc, pool.name)
                if isinstance(error, TransientError) and not isinstance(error, ThrottledError):
                    progress.unsure.append((name, zone))  # a rate limit refuses up front
                if progress.refused(error, zone):
                    again.append(index)
                continue
            accepted.append((index, zone, str(operation.name)))
        for index, zone, operation_name in accepted:
            name = instance_name(self.fleet_id, request_id, index)
            done = self.wait(zone, operation_name, deadline)
            failed = operation_error(done, pool.name) if done is not None else None
            if failed is None:
                # done, or its fate unknown at the deadline: the VM exists or may, and counting
                # it keeps the guard's budget honest until a listing says otherwise
                if done is None:
                    log.warning("%s: insert of %s in %s not seen done", pool.name, name, zone)
                progress.placed.append((name, zone))
            elif progress.refused(failed, zone):
                again.append(index)
        return [
            index
            for index in again
            if any(
                z not in progress.full_zones and z not in tried[index]
                for z in self.zones[pool.name]
            )
        ]

    def labels(
        self, pool: Pool, request_id: str, now: float, team: str | None = None
    ) -> dict[str, str]:
        """The four labels every launched VM carries, and its team's when it is bought for one
        (``label_value``'s reversible encoding; see ``team_metadata`` for a long name)."""
        return labels_for(launch_tags(self.fleet_id, pool, request_id, now, team))

    def launched(
        self,
        pool: Pool,
        placed: Sequence[tuple[str, str]],
        request_id: str,
        now: float,
        team: str | None = None,
    ) -> list[Instance]:
        """VMs a launch just made (name, zone), as pending, remembered with their zone for
        notices and terminate."""
        for name, zone in placed:
            self.seen[name] = Seen(pool.name, zone, now)
        return [
            Instance(
                id=name,
                pool=pool.name,
                state=InstanceState.PENDING,
                launched_at=now,
                request_id=request_id,
                gpus=pool.gpus_per_instance,
                team=team or None,
            )
            for name, _ in placed
        ]

    def _exists(self, zone: str, name: str) -> bool | None:
        """Whether a VM exists, or None when the answer cannot be read.

        An insert that failed with a server error or a broken connection may have been done all
        the same (its answer lost on the way back). Such a VM is looked up by name; one that may
        exist is counted, so the guard's budget never forgets a VM that is being paid for, and
        the next listing drops it if it was never made."""
        instances, _ = self.sdk.clients()
        request = {"project": self.settings.project, "zone": zone, "instance": name}
        try:
            self.sdk.call(instances.get, request)
        except Exception as exc:
            return False if is_not_found(exc) else None
        return True

    def wait(self, zone: str, operation: str, deadline: float) -> Any:
        """A zone operation once ``DONE``, or None (see ``wait_done``)."""
        _, operations = self.sdk.clients()
        request = {"project": self.settings.project, "zone": zone, "operation": operation}
        return wait_done(operations.wait, request, deadline, self.settings.request_timeout_s)

    def resource(
        self, pool: Pool, name: str, zone: str, labels: dict[str, str], team: str | None = None
    ) -> dict[str, Any]:
        """The VM, as the fields of Compute Engine's ``Instance`` (the SDK builds the message)."""
        options = self.options[pool.name]
        scheduling: dict[str, Any]
        if pool.is_spot:
            scheduling = {
                "provisioning_model": "SPOT",
                "instance_termination_action": "DELETE",
                "on_host_maintenance": "TERMINATE",
                "automatic_restart": False,
            }
        else:
            # GPU VMs cannot live-migrate, on-demand ones included
            scheduling = {
                "provisioning_model": "STANDARD",
                "on_host_maintenance": "TERMINATE",
                "automatic_restart": True,
            }
        interface: dict[str, str] = {}
        if options.network or not options.subnetwork:
            interface["network"] = options.network or "global/networks/default"
        if options.subnetwork:
            interface["subnetwork"] = options.subnetwork
        resource: dict[str, Any] = {
            "name": name,
            "machine_type": f"zones/{zone}/machineTypes/{pool.instance_type}",
            "labels": labels,
            "scheduling": scheduling,
            "disks": [
                {
                    "boot": True,
                    "auto_delete": True,
                    "initialize_params": {
                        "source_image": options.image,
                        "disk_size_gb": options.disk_size_gb,
                    },
                }
            ],
            "network_interfaces": [interface],
        }
        items = [*self.metadata.get(pool.name, []), *team_metadata(team)]
        if items:
            resource["metadata"] = {"items": items}
        if options.service_account is not None:
            account = options.service_account
            resource["service_accounts"] = [
                {"email": account.email, "scopes": list(account.scopes)}
            ]
        if options.accelerator_type:
            resource["guest_accelerators"] = [
                {
                    "accelerator_type": f"zones/{zone}/acceleratorTypes/{options.accelerator_type}",
                    "accelerator_count": options.accelerator_count or pool.gpus_per_instance,
                }
            ]
        return resource

    # -- terminating -------------------------------------------------------------------------

    def terminate(self, instance_ids: Sequence[str], request_id: str) -> None:
        """Delete only VMs that carry our fleet label, whatever names we are given: they are
        looked up again by label first. Every deletion is tried; the first error is raised."""
        wanted = set(instance_ids)
        if not wanted:
            return
        owned = [(zone, str(raw.name)) for zone, raw in self.aggregated() if raw.name in wanted]
        instances, _ = self.sdk.clients()
        failure: ProviderError | None = None
        for zone, name in owned:
            request = {
                "project": self.settings.project,
                "zone": zone,
                "instance": name,
                "request_id": request_uuid(self.fleet_id, request_id, "delete", zone, name),
            }
            try:
                self.sdk.call(instances.delete, request)
            except Exception as exc:
                if not is_not_found(exc) and failure is None:
                    failure = typed(exc)
        if failure is not None:
            raise failure


def _launched_at(label: str, created: str) -> float | None:
    try:
        return float(label)
    except ValueError:
        return timestamp(created)


def _gpus(raw: Any) -> int:
    """GPUs of a VM from a pool we no longer know: its guest accelerators, or the count an
    A2/A3/G2 machine type ends with (``a2-highgpu-8g``)."""
    attached = sum(int(a.accelerator_count) for a in raw.guest_accelerators)
    if attached:
        return attached
    found = re.search(r"-(\d+)g$", last(str(raw.machine_type)))
    return int(found.group(1)) if found and int(found.group(1)) > 0 else 1


def _metadata(raw: Any) -> dict[str, str]:
    """A listed VM's metadata items by key (none when it has none)."""
    metadata = getattr(raw, "metadata", None)
    return {str(item.key): str(item.value) for item in getattr(metadata, "items", None) or ()}
