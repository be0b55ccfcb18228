"""What tests/test_terraform.py compares: the cloud calls the providers' code makes, read from its
syntax tree, and the permissions terraform/ grants, read from the parsed HCL.

The code side is mechanical so that a new SDK call cannot slip past the identities: boto3 method
names convert to IAM actions by case (a paginator by its operation's name), Compute Engine and
ARM calls through small explicit tables; a call the tables do not know is reported, never
dropped. What a cloud authorises besides the call itself (tags written at launch, the disk and
NIC created with a VM) is in ``IMPLIED``, each entry with its reason and the call that needs it.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import hcl2

ROOT = Path(__file__).resolve().parent.parent
TERRAFORM = ROOT / "terraform"
PROVIDERS = ROOT / "providers"

# boto3 service name -> IAM service prefix (where they differ, add them here)
IAM_PREFIX = {"ec2": "ec2", "sqs": "sqs"}

# the SDK adaptor's client accessor -> the method that makes its tuple of clients
GCP_ACCESSORS = {"clients": "_make_clients", "placement_clients": "_make_placement_clients"}
# Compute Engine client class -> permission collection
GCP_COLLECTIONS = {
    "InstancesClient": "instances",
    "ZoneOperationsClient": "zoneOperations",
    "ResourcePoliciesClient": "resourcePolicies",
    "RegionOperationsClient": "regionOperations",
}
# method -> permission verb where the name does not convert by case
GCP_VERBS = {"insert": "create", "bulk_insert": "create", "aggregated_list": "list", "wait": "get"}

# ComputeManagementClient operation group -> ARM resource type
AZURE_COLLECTIONS = {
    "virtual_machines": "Microsoft.Compute/virtualMachines",
    "disks": "Microsoft.Compute/disks",
    "proximity_placement_groups": "Microsoft.Compute/proximityPlacementGroups",
}
AZURE_VERBS = {
    "list": "read",
    "list_all": "read",
    "get": "read",
    "instance_view": "instanceView/read",
    "create_or_update": "write",
    "begin_create_or_update": "write",
    "begin_update": "write",
    "begin_delete": "delete",
    "begin_deallocate": "deallocate/action",
    "begin_power_off": "powerOff/action",
}

# What a cloud authorises besides the action a call names: {action the code needs: {implied
# action: why}}. An implied action is expected only while the code still makes the call.
IMPLIED: dict[str, dict[str, str]] = {
    "ec2:RunInstances": {
        "ec2:CreateTags": "TagSpecifications on the launch are authorised as CreateTags",
        "iam:PassRole": "a launch template's instance profile passes its role to EC2",
    },
    "ec2:CreateFleet": {
        "ec2:RunInstances": "an instant fleet launches through RunInstances as the caller",
        "ec2:CreateTags": "TagSpecifications on the fleet are authorised as CreateTags",
        "iam:PassRole": "a launch template's instance profile passes its role to EC2",
    },
    "ec2:CreatePlacementGroup": {
        "ec2:CreateTags": "the gang's placement group is created with the fleet tag",
    },
    "compute.instances.create": {
        "compute.instances.setLabels": "the VM is created with the fleet's labels",
        "compute.disks.create": "the boot disk is created with the VM (initializeParams)",
        "compute.images.useReadOnly": "the boot disk's image, when it is in the project",
        "compute.subnetworks.use": "the network interface joins the pool's subnetwork",
        "compute.instances.setMetadata": "the VM is created with its pool's boot script and "
        "metadata items (startup_script, user_data or the join script; metadata)",
        "compute.instances.setServiceAccount": "the VM is created with its pool's service_account",
        "iam.serviceAccounts.actAs": "a VM that runs as a service account is launched acting "
        "as that account (granted on the nodes' accounts alone)",
    },
    "compute.resourcePolicies.get": {
        "compute.resourcePolicies.use": "a gang's VMs are created under the pool's compact "
        "placement policy, which the provider has looked up",
    },
    "Microsoft.Compute/virtualMachines/write": {
        "Microsoft.Compute/disks/write": "the managed OS disk is created from the image",
        "Microsoft.Network/networkInterfaces/write": "networkInterfaceConfigurations make ARM "
        "create the NIC",
        "Microsoft.Network/networkInterfaces/join/action": "the NIC is attached to the VM",
        "Microsoft.Network/virtualNetworks/subnets/join/action": "the NIC joins the pool's subnet",
    },
    "Microsoft.Compute/virtualMachines/delete": {
        "Microsoft.Compute/disks/delete": "the OS disk has deleteOption Delete",
        "Microsoft.Network/networkInterfaces/delete": "the NIC has deleteOption Delete",
    },
}

PARSE = hcl2.SerializationOptions(
    strip_string_quotes=True, with_comments=False, explicit_blocks=False
)


# -- HCL ----------------------------------------------------------------------------------------


def load_hcl(path: Path) -> dict[str, Any]:
    with path.open() as handle:
        return dict(hcl2.load(handle, serialization_options=PARSE))


def load_module(directory: Path) -> dict[str, list[Any]]:
    """Every top-level block of a module's .tf files, merged by kind (resource, locals, ...)."""
    merged: dict[str, list[Any]] = {}
    for path in sorted(directory.glob("*.tf")):
        for kind, blocks in load_hcl(path).items():
            merged.setdefault(kind, []).extend(blocks)
    return merged


def blocks(module: Mapping[str, list[Any]], kind: str, type_name: str) -> dict[str, Any]:
    """``resource``/``data`` blocks of one type, by name."""
    found: dict[str, Any] = {}
    for block in module.get(kind, []):
        for name, body in block.get(type_name, {}).items():
            found[name] = body
    return found


def locals_of(module: Mapping[str, list[Any]]) -> dict[str, Any]:
    merged: dict[str, Any] = {}
    for block in module.get("locals", []):
        merged.update(block)
    return merged


def named(module: Mapping[str, list[Any]], kind: str) -> dict[str, Any]:
    """``variable``/``output``/``module`` blocks by name."""
    found: dict[str, Any] = {}
    for block in module.get(kind, []):
        found.update(block)
    return found


# -- what terraform grants ----------------------------------------------------------------------


@dataclass(frozen=True)
class Statement:
    sid: str
    effect: str
    actions: tuple[str, ...]
    resources: str | tuple[str, ...]
    conditions: tuple[tuple[str, str, tuple[str, ...]], ...]
    optional: bool  # a dynamic block: present only when its variable is set


def policy_statements(document: Mapping[str, Any]) -> list[Statement]:
    """The statements of an ``aws_iam_policy_document``, its dynamic ones included."""
    raw: list[tuple[Mapping[str, Any], bool]] = [(s, False) for s in document.get("statement", [])]
    for dynamic in document.get("dynamic", []):
        for content in dynamic.get("statement", {}).get("content", []):
            raw.append((content, True))
    statements = []
    for body, optional in raw:
        resources = body.get("resources", ())
        statements.append(
            Statement(
                sid=str(body.get("sid", "")),
                effect=str(body.get("effect", "Allow")),
                actions=tuple(body.get("actions", ())),
                resources=resources if isinstance(resources, str) else tuple(resources),
                conditions=tuple(
                    (str(c["test"]), str(c["variable"]), tuple(c["values"]))
                    for c in body.get("condition", [])
                ),
                optional=optional,
            )
        )
    return statements


def aws_granted(module: Mapping[str, list[Any]]) -> set[str]:
    document = blocks(module, "data", "aws_iam_policy_document")["controller"]
    return {
        action
        for statement in policy_statements(document)
        if statement.effect == "Allow"
        for action in statement.actions
    }


def gcp_granted(module: Mapping[str, list[Any]]) -> set[str]:
    """Every custom role's permissions: the controller's, and the one it holds on the nodes'
    service accounts (made only when some are given, and counted as granted, as a dynamic AWS
    statement is)."""
    granted: set[str] = set()
    for role in blocks(module, "resource", "google_project_iam_custom_role").values():
        granted.update(resolve_local(module, role["permissions"]))
    return granted


def azure_granted(module: Mapping[str, list[Any]]) -> set[str]:
    granted: set[str] = set()
    for definition in blocks(module, "resource", "azurerm_role_definition").values():
        for permissions in definition["permissions"]:
            granted.update(resolve_local(module, permissions["actions"]))
    return granted


def resolve_local(module: Mapping[str, list[Any]], value: Any) -> Any:
    """A ``${local.NAME}`` reference's value, or the value itself."""
    if isinstance(value, str):
        found = re.fullmatch(r"\$\{local\.(\w+)\}", value)
        if found:
            return locals_of(module)[found.group(1)]
    return value


# -- what the code calls ------------------------------------------------------------------------


@dataclass
class Calls:
    """Cloud actions the code needs, each with where it is called (for the failure message)."""

    actions: dict[str, list[str]] = field(default_factory=dict)
    unknown: list[str] = field(default_factory=list)

    def add(self, action: str, where: str) -> None:
        self.actions.setdefault(action, []).append(where)


def camel(snake: str) -> str:
    return "".join(part[:1].upper() + part[1:] for part in snake.split("_"))


def lower_camel(snake: str) -> str:
    text = camel(snake)
    return text[:1].lower() + text[1:]


def cloud_modules(cloud: str) -> tuple[str, ...]:
    """Every module of a cloud's folder (``aws/instances.py``, ...): a module added there is
    read without being listed here."""
    return tuple(
        str(path.relative_to(PROVIDERS)) for path in sorted((PROVIDERS / cloud).glob("*.py"))
    )


def _tree(name: str) -> ast.Module:
    return ast.parse((PROVIDERS / name).read_text(), filename=name)


def _functions(tree: ast.AST) -> Iterator[ast.FunctionDef]:
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef):
            yield node


def _is_self_attr(node: ast.AST, name: str | None = None) -> bool:
    return (
        isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == "self"
        and (name is None or node.attr == name)
    )


def _client_call_service(node: ast.AST) -> str | None:
    """``X.client("ec2", ...)`` (a boto3 session's or the provider's own) -> "ec2"."""
    if not isinstance(node, ast.Call) or not node.args:
        return None
    func = node.func
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
    first = node.args[0]
    if name == "client" and isinstance(first, ast.Constant) and isinstance(first.value, str):
        return first.value
    return None


def _boto3_attributes(trees: Mapping[str, ast.Module]) -> dict[str, dict[str, str]]:
    """Per module, the ``self.<attr>`` attributes that hold a boto3 client, by service.

    Three ways the AWS modules keep one: assigned from a ``client("svc")`` call, a property
    returning such an attribute, and a constructor parameter whose callers (in any module)
    pass a ``client("svc")`` call."""
    found: dict[str, dict[str, str]] = {name: {} for name in trees}
    # class -> (module, attribute, position) of each parameter an attribute is assigned from
    parameters: dict[str, list[tuple[str, str, int]]] = {}
    for module, tree in trees.items():
        for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
            for function in (n for n in cls.body if isinstance(n, ast.FunctionDef)):
                params = [a.arg for a in function.args.args[1:]]
                for node in ast.walk(function):
                    if not (isinstance(node, ast.Assign) and len(node.targets) == 1):
                        continue
                    target = node.targets[0]
                    if not _is_self_attr(target):
                        continue
                    assert isinstance(target, ast.Attribute)
                    service = _client_call_service(node.value)
                    if service is not None:
                        found[module][target.attr] = service
                    elif (
                        function.name == "__init__"
                        and isinstance(node.value, ast.Name)
                        and node.value.id in params
                    ):
                        position = params.index(node.value.id)
                        parameters.setdefault(cls.name, []).append((module, target.attr, position))
            for function in (n for n in cls.body if isinstance(n, ast.FunctionDef)):
                decorated = any(
                    getattr(d, "id", None) == "property" for d in function.decorator_list
                )
                if not decorated:
                    continue
                for node in ast.walk(function):
                    if isinstance(node, ast.Return) and isinstance(node.value, ast.Attribute):
                        service = found[module].get(node.value.attr)
                        if _is_self_attr(node.value) and service is not None:
                            found[module][function.name] = service
    for tree in trees.values():
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)):
                continue
            for module, attribute, position in parameters.get(node.func.id, []):
                service = (
                    _client_call_service(node.args[position]) if position < len(node.args) else None
                )
                if service is not None:
                    found[module][attribute] = service
    return found


def aws_calls() -> Calls:
    """IAM actions for every boto3 client method the AWS modules call."""
    trees = {name: _tree(name) for name in cloud_modules("aws")}
    attributes = _boto3_attributes(trees)
    calls = Calls()
    for module, tree in trees.items():
        for function in _functions(tree):
            local: dict[str, str] = {}
            for node in ast.walk(function):
                if isinstance(node, ast.Assign) and len(node.targets) == 1:
                    target = node.targets[0]
                    service = _client_call_service(node.value)
                    if isinstance(target, ast.Name) and service is not None:
                        local[target.id] = service

            def service_of(
                node: ast.AST, local: dict[str, str] = local, module: str = module
            ) -> str | None:
                if isinstance(node, ast.Name):
                    return local.get(node.id)
                if _is_self_attr(node):
                    assert isinstance(node, ast.Attribute)
                    return attributes[module].get(node.attr)
                return _client_call_service(node)

            for node in ast.walk(function):
                if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                    continue
                service = service_of(node.func.value)
                if service is None:
                    continue
                where = f"providers/{module}:{node.lineno}"
                method = node.func.attr
                if method == "get_paginator":
                    first = node.args[0] if node.args else None
                    if not (isinstance(first, ast.Constant) and isinstance(first.value, str)):
                        calls.unknown.append(f"{where}: a paginator whose name is not a literal")
                        continue
                    method = first.value
                prefix = IAM_PREFIX.get(service)
                if prefix is None:
                    calls.unknown.append(f"{where}: boto3 service {service!r} has no IAM prefix")
                    continue
                calls.add(f"{prefix}:{camel(method)}", where)
    return calls


def gcp_calls() -> Calls:
    """Permissions for every Compute Engine client method the GCP modules use (called directly
    or handed to the SDK adaptor's ``call``), on clients unpacked from one of the adaptor's
    accessors (``self.sdk.clients()``, ``ours.sdk.placement_clients()``, ...)."""
    trees = {name: _tree(name) for name in cloud_modules("gcp")}
    makers = {maker: accessor for accessor, maker in GCP_ACCESSORS.items()}
    classes: dict[str, list[str]] = {}
    for function in _functions(trees["gcp/sdk.py"]):
        accessor = makers.get(function.name)
        if accessor is None:
            continue
        for node in ast.walk(function):
            if not isinstance(node, ast.Return):
                continue
            values = node.value.elts if isinstance(node.value, ast.Tuple) else []
            made = [_made_client(v, function) for v in values]
            classes[accessor] = [m for m in made if m is not None]
    calls = Calls()
    missing = sorted(set(GCP_ACCESSORS) - set(classes))
    if missing:
        calls.unknown.append(f"providers/gcp/sdk.py: no tuple of clients for {', '.join(missing)}")
        return calls
    for module, tree in trees.items():
        for function in _functions(tree):
            local: dict[str, str] = {}
            for node in ast.walk(function):
                if not (
                    isinstance(node, ast.Assign)
                    and isinstance(node.targets[0], ast.Tuple)
                    and isinstance(node.value, ast.Call)
                    and isinstance(node.value.func, ast.Attribute)
                    and node.value.func.attr in classes
                ):
                    continue
                clients = classes[node.value.func.attr]
                for position, element in enumerate(node.targets[0].elts):
                    if isinstance(element, ast.Name) and element.id != "_":
                        local[element.id] = clients[position]
            for node in ast.walk(function):
                if not (
                    isinstance(node, ast.Attribute)
                    and isinstance(node.value, ast.Name)
                    and node.value.id in local
                ):
                    continue
                where = f"providers/{module}:{node.lineno}"
                client = local[node.value.id]
                collection = GCP_COLLECTIONS.get(client)
                if collection is None:
                    calls.unknown.append(f"{where}: no permission collection for {client}")
                    continue
                method = node.attr.removesuffix("_unary")
                verb = GCP_VERBS.get(method, lower_camel(method))
                calls.add(f"compute.{collection}.{verb}", where)
    return calls


def _made_client(node: ast.AST, function: ast.FunctionDef) -> str | None:
    """The client class a returned value is made from: ``compute_v1.X(...)`` itself, or a name
    assigned from one in the same function."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        return node.func.attr
    if isinstance(node, ast.Name):
        for assign in ast.walk(function):
            if (
                isinstance(assign, ast.Assign)
                and isinstance(assign.targets[0], ast.Name)
                and assign.targets[0].id == node.id
            ):
                return _made_client(assign.value, function)
    return None


def azure_calls() -> Calls:
    """ARM actions for every ComputeManagementClient operation the Azure modules call, through
    ``<owner>.client().<group>.<method>`` or a name bound to ``<owner>.client().<group>`` (the
    owner is the SDK adaptor, ``self.sdk`` or ``vms.sdk``, or the provider)."""
    calls = Calls()

    def group_of(node: ast.AST, local: Mapping[str, str]) -> str | None:
        if isinstance(node, ast.Name):
            return local.get(node.id)
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Call)
            and isinstance(node.value.func, ast.Attribute)
            and node.value.func.attr == "client"
            and not node.value.args
        ):
            return node.attr
        return None

    for module in cloud_modules("azure"):
        for function in _functions(_tree(module)):
            local: dict[str, str] = {}
            for node in ast.walk(function):
                if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
                    group = group_of(node.value, {})
                    if group is not None:
                        local[node.targets[0].id] = group
            for node in ast.walk(function):
                if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                    continue
                group = group_of(node.func.value, local)
                if group is None:
                    continue
                where = f"providers/{module}:{node.lineno}"
                resource = AZURE_COLLECTIONS.get(group)
                verb = AZURE_VERBS.get(node.func.attr)
                if resource is None or verb is None:
                    calls.unknown.append(f"{where}: no ARM action for {group}.{node.func.attr}")
                    continue
                calls.add(f"{resource}/{verb}", where)
    return calls


# -- the comparison -----------------------------------------------------------------------------


def needed(calls: Calls) -> dict[str, str]:
    """Every action the code needs, directly or implied, with the reason (for messages)."""
    reasons = {action: "called at " + ", ".join(wheres) for action, wheres in calls.actions.items()}
    for action in list(calls.actions):
        for implied, why in IMPLIED.get(action, {}).items():
            reasons.setdefault(implied, f"implied by {action}: {why}")
    return reasons


def compare(calls: Calls, granted: Iterable[str]) -> list[str]:
    """What is wrong between code and grant, as readable lines; empty when they agree. A grant
    that depends on a variable (a dynamic statement) counts as granted."""
    granted = set(granted)
    want = needed(calls)
    problems = [f"not understood: {line}" for line in calls.unknown]
    problems += [
        f"needed but not granted: {action} ({want[action]})"
        for action in sorted(set(want) - granted)
    ]
    problems += [
        f"granted but not needed by the code: {action}" for action in sorted(granted - set(want))
    ]
    return problems


# -- the example's template ---------------------------------------------------------------------

INTERPOLATION = re.compile(r"\$\{jsonencode\((\w+)\)\}")


def render_template(text: str, values: Mapping[str, object]) -> str:
    """Render a template the way ``templatefile`` would, for the one form the example uses
    (``${jsonencode(name)}``); any other directive is an error, so the template stays one that
    this renderer and Terraform render alike."""
    rest = INTERPOLATION.sub("", text)
    if "${" in rest or "%{" in rest:
        raise ValueError("the template uses an interpolation other than ${jsonencode(name)}")
    missing = sorted(set(INTERPOLATION.findall(text)) - set(values))
    if missing:
        raise KeyError(f"no value for {', '.join(missing)}")
    return INTERPOLATION.sub(lambda m: json.dumps(values[m.group(1)]), text)
