"""EC2 placement groups in front of moto, which has none (5.2.5 answers CreatePlacementGroup and
DescribePlacementGroups with NotImplemented and ignores ``Placement.GroupName``).

A reverse proxy between the provider and the moto server: it serves the two placement-group
actions itself, in EC2's query protocol and XML, keeps the groups, refuses a launch into a group
that does not exist (``InvalidPlacementGroup.Unknown``, as EC2 does) and records which group each
launched instance went into. Every other request goes to moto unchanged. The provider runs the
real boto3 over HTTP; nothing in it or in botocore is patched.

Capacity in a group can be limited two ways, both at the HTTP boundary:

* ``refuse_over(k)``: EC2's own all-or-nothing: a launch that must place more than ``k``
  instances together (``MinCount``, ``MinTargetCapacity``) fails for capacity and places none;
* ``come_up(k)``: only ``k`` instances of a launch come up: the request goes on to moto asking
  for ``k`` (moto launches exactly what it is asked), which is what the provider's rollback must
  handle.
"""

from __future__ import annotations

import itertools
import re
import threading
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, urlencode

import pytest
from contract_support import AwsWorld
from recording_proxy import RecordingProxy, Seen

from autoscaler.model import Pool

XMLNS = "http://ec2.amazonaws.com/doc/2016-11-15/"
STRATEGIES = ("cluster", "spread", "partition")
CREDENTIAL_REGION = re.compile(r"Credential=[^/]+/\d{8}/([^/]+)/ec2/")
OVERRIDE_GROUP = re.compile(r"^LaunchTemplateConfigs\.\d+\.Overrides\.\d+\.Placement\.GroupName$")


@dataclass
class Group:
    name: str
    group_id: str
    region: str
    strategy: str
    tags: dict[str, str] = field(default_factory=dict)
    state: str = "available"


def _text(parent: ET.Element, tag: str, value: str) -> None:
    ET.SubElement(parent, tag).text = value


def _group_xml(parent: ET.Element, tag: str, group: Group, account: str) -> None:
    element = ET.SubElement(parent, tag)
    _text(element, "groupName", group.name)
    _text(element, "groupId", group.group_id)
    _text(element, "strategy", group.strategy)
    _text(element, "state", group.state)
    _text(
        element,
        "groupArn",
        f"arn:aws:ec2:{group.region}:{account}:placement-group/{group.name}",
    )
    tag_set = ET.SubElement(element, "tagSet")
    for key, value in group.tags.items():
        item = ET.SubElement(tag_set, "item")
        _text(item, "key", key)
        _text(item, "value", value)


def _response(action: str, build: Any) -> bytes:
    root = ET.Element(f"{action}Response", xmlns=XMLNS)
    _text(root, "requestId", "placement-proxy")
    build(root)
    return b'<?xml version="1.0" encoding="UTF-8"?>' + ET.tostring(root)


Answer = tuple[int, list[tuple[str, str]], bytes]


def _error(status: int, code: str, message: str) -> Answer:
    body = (
        '<?xml version="1.0" encoding="UTF-8"?><Response><Errors><Error>'
        f"<Code>{code}</Code><Message>{message}</Message></Error></Errors>"
        "<RequestID>placement-proxy</RequestID></Response>"
    ).encode()
    return status, [("Content-Type", "text/xml")], body


def _indexed(form: dict[str, str], prefix: str) -> list[str]:
    """``Prefix.1``, ``Prefix.2``, ... in order."""
    return [form[k] for k in sorted(form, key=_position) if re.fullmatch(rf"{prefix}\.\d+", k)]


def _position(key: str) -> tuple[int, ...]:
    return tuple(int(n) for n in re.findall(r"\d+", key))


class PlacementProxy(RecordingProxy):
    """Placement groups served here, everything else forwarded to moto (and recorded)."""

    account = "123456789012"

    def __init__(self, upstream: str) -> None:
        super().__init__(upstream)
        self.state_lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        with self.state_lock:
            self.groups: dict[tuple[str, str], Group] = {}
            self.placed: dict[str, str] = {}  # instance id -> group name
            self.created: list[str] = []  # CreatePlacementGroup calls that made a group
            self.refused_over: int | None = None
            self.coming_up: int | None = None
            self._ids = itertools.count(1)
        self.clear()

    # -- steering, for tests ----------------------------------------------------------------

    def add_group(self, name: str, strategy: str = "cluster", region: str = "us-east-1") -> None:
        """A group made outside the controller (by an operator's terraform, say)."""
        with self.state_lock:
            self.groups[(region, name)] = Group(name, self._new_id(), region, strategy)

    def refuse_over(self, count: int | None) -> None:
        with self.state_lock:
            self.refused_over = count

    def come_up(self, count: int | None) -> None:
        with self.state_lock:
            self.coming_up = count

    def group_of(self, instance_id: str) -> str | None:
        with self.state_lock:
            return self.placed.get(instance_id)

    def _new_id(self) -> str:
        return f"pg-{next(self._ids):017x}"

    # -- the wire ----------------------------------------------------------------------------

    def _forward(self, method: str, target: str, headers: Any, body: bytes) -> Answer:
        form = dict(parse_qsl(body.decode(errors="replace"), keep_blank_values=True))
        action = form.get("Action", "")
        found = CREDENTIAL_REGION.search(str(headers.get("Authorization", "")))
        region = found.group(1) if found else "us-east-1"
        if action in ("CreatePlacementGroup", "DescribePlacementGroups"):
            with self.lock:
                self.seen.append(self._seen(method, target, action))
            with self.state_lock:
                if action == "CreatePlacementGroup":
                    return self._create(form, region)
                return self._describe(form, region)
        if action == "RunInstances":
            return self._launch(method, target, headers, form, region, fleet=False)
        if action == "CreateFleet":
            return self._launch(method, target, headers, form, region, fleet=True)
        return super()._forward(method, target, headers, body)

    def _seen(self, method: str, target: str, action: str) -> Seen:
        return Seen(method, target.split("?", 1)[0], action)

    def _create(self, form: dict[str, str], region: str) -> Answer:
        name = form.get("GroupName", "")
        strategy = form.get("Strategy", "")
        if not name or len(name) > 255:
            return _error(400, "InvalidParameterValue", f"Invalid placement group name '{name}'")
        if strategy not in STRATEGIES:
            return _error(400, "InvalidParameterValue", f"Invalid strategy '{strategy}'")
        if (region, name) in self.groups:
            return _error(
                400,
                "InvalidPlacementGroup.Duplicate",
                f"The placement group '{name}' already exists.",
            )
        tags: dict[str, str] = {}
        for key in sorted(form, key=_position):
            found = re.fullmatch(r"TagSpecification\.(\d+)\.Tag\.(\d+)\.Key", key)
            if found is None:
                continue
            spec, number = found.groups()
            if form.get(f"TagSpecification.{spec}.ResourceType") != "placement-group":
                return _error(
                    400,
                    "InvalidParameterValue",
                    "'placement-group' is the only resource type a placement group is tagged as",
                )
            tags[form[key]] = form.get(f"TagSpecification.{spec}.Tag.{number}.Value", "")
        group = Group(name, self._new_id(), region, strategy, tags)
        self.groups[(region, name)] = group
        self.created.append(name)

        def build(root: ET.Element) -> None:
            _text(root, "return", "true")
            _group_xml(root, "placementGroup", group, self.account)

        return 200, [("Content-Type", "text/xml")], _response("CreatePlacementGroup", build)

    def _describe(self, form: dict[str, str], region: str) -> Answer:
        here = [g for (r, _), g in sorted(self.groups.items()) if r == region]
        names = _indexed(form, "GroupName")
        for name in names:
            if not any(g.name == name for g in here):
                return _error(
                    400,
                    "InvalidPlacementGroup.Unknown",
                    f"The Placement Group '{name}' is unknown.",
                )
        if names:
            here = [g for g in here if g.name in names]
        ids = _indexed(form, "GroupId")
        if ids:
            here = [g for g in here if g.group_id in ids]
        for key in sorted(form, key=_position):
            found = re.fullmatch(r"Filter\.(\d+)\.Name", key)
            if found is None:
                continue
            wanted = _indexed(form, f"Filter.{found.group(1)}.Value")
            attribute = form[key]
            if attribute.startswith("tag:"):
                here = [g for g in here if g.tags.get(attribute[4:]) in wanted]
                continue
            field_of = {
                "group-name": "name",
                "group-id": "group_id",
                "strategy": "strategy",
                "state": "state",
            }.get(attribute)
            if field_of is None:
                return _error(400, "InvalidParameterValue", f"The filter '{attribute}' is invalid")
            here = [g for g in here if getattr(g, field_of) in wanted]

        def build(root: ET.Element) -> None:
            listed = ET.SubElement(root, "placementGroupSet")
            for group in here:
                _group_xml(listed, "item", group, self.account)

        return 200, [("Content-Type", "text/xml")], _response("DescribePlacementGroups", build)

    def _launch(
        self,
        method: str,
        target: str,
        headers: Any,
        form: dict[str, str],
        region: str,
        *,
        fleet: bool,
    ) -> Answer:
        if fleet:
            names = {v for k, v in form.items() if OVERRIDE_GROUP.match(k)}
            market = form.get("TargetCapacitySpecification.DefaultTargetCapacityType", "")
            prefix = "SpotOptions" if market == "spot" else "OnDemandOptions"
            together = int(form.get(f"{prefix}.MinTargetCapacity", "0") or 0)
            total_key = "TargetCapacitySpecification.TotalTargetCapacity"
        else:
            names = {form["Placement.GroupName"]} if "Placement.GroupName" in form else set()
            together = int(form.get("MinCount", "1"))
            total_key = "MaxCount"
        with self.state_lock:
            for name in names:
                if (region, name) not in self.groups:
                    with self.lock:
                        self.seen.append(self._seen(method, target, form.get("Action", "")))
                    return _error(
                        400,
                        "InvalidPlacementGroup.Unknown",
                        f"The Placement Group '{name}' is unknown.",
                    )
            refused = self.refused_over is not None and together > self.refused_over
            coming = self.coming_up
        if names and refused:
            with self.lock:
                self.seen.append(self._seen(method, target, form.get("Action", "")))
            message = (
                "We currently do not have sufficient capacity in the Availability Zone you "
                "requested. Our system will be working on provisioning additional capacity."
            )
            if not fleet:
                return _error(500, "InsufficientInstanceCapacity", message)
            return 200, [("Content-Type", "text/xml")], _fleet_refusal(message)
        if names and coming is not None:
            form[total_key] = str(min(int(form[total_key]), coming))
            if not fleet:
                form["MinCount"] = str(min(int(form["MinCount"]), coming))
        body = urlencode(form).encode()
        sent = {k: v for k, v in headers.items() if k.lower() != "content-length"}
        sent["Content-Length"] = str(len(body))
        status, kept, data = super()._forward(method, target, sent, body)
        if status == 200 and names:
            (name,) = names
            with self.state_lock:
                for instance_id in _launched_ids(data, fleet):
                    self.placed[instance_id] = name
        return status, kept, data


def _fleet_refusal(message: str) -> bytes:
    """An instant fleet that could not reach its MinTargetCapacity: no instances, one error."""

    def build(root: ET.Element) -> None:
        _text(root, "fleetId", "fleet-00000000-0000-4000-8000-placement00")
        errors = ET.SubElement(root, "errorSet")
        item = ET.SubElement(errors, "item")
        _text(item, "errorCode", "InsufficientInstanceCapacity")
        _text(item, "errorMessage", message)
        ET.SubElement(root, "fleetInstanceSet")

    return _response("CreateFleet", build)


def _launched_ids(data: bytes, fleet: bool) -> list[str]:
    root = ET.fromstring(data)
    if fleet:
        path = "./{*}fleetInstanceSet/{*}item/{*}instanceIds/{*}item"
    else:
        path = "./{*}instancesSet/{*}item/{*}instanceId"
    return [str(e.text) for e in root.findall(path)]


class AwsGangWorld(AwsWorld):
    """The contract's AWS world with placement groups: moto behind a ``PlacementProxy``."""

    def __init__(self, proxy: PlacementProxy) -> None:
        super().__init__(proxy.url)
        self.proxy = proxy

    def gang_pool(self, name: str) -> Pool:
        pool = self.pool(name)
        return pool.model_copy(
            update={"options": {**pool.options, "placement_group": {"create": True}}}
        )

    def placement(self, instance_id: str) -> str | None:
        return self.proxy.group_of(instance_id)

    def placement_groups(self) -> int:
        with self.proxy.state_lock:
            return len(self.proxy.groups)

    def come_up(self, count: int | None) -> None:
        self.proxy.come_up(count)


@pytest.fixture(scope="session")
def placement_proxy(moto_url: str) -> Iterator[PlacementProxy]:
    """One proxy in front of the session's moto (the gang tests and the provider contract)."""
    proxy = PlacementProxy(moto_url)
    proxy.start()
    yield proxy
    proxy.stop()


@pytest.fixture
def ec2_groups(aws: str, placement_proxy: PlacementProxy) -> PlacementProxy:
    """A clean moto behind the placement-group proxy."""
    placement_proxy.reset()
    return placement_proxy
