"""terraform/ grants exactly what the providers' code calls, the AWS grants are fenced by the fleet
tag, checkov finds nothing, and the example's outputs make a config the controller accepts.

No cloud and no terraform binary: the HCL is parsed (python-hcl2) and the code read as a tree.
"""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import hcl2
import pytest
from terraform_support import (
    IMPLIED,
    PARSE,
    TERRAFORM,
    Calls,
    aws_calls,
    aws_granted,
    azure_calls,
    azure_granted,
    blocks,
    compare,
    gcp_calls,
    gcp_granted,
    load_hcl,
    load_module,
    locals_of,
    named,
    policy_statements,
    render_template,
    resolve_local,
)
from waits import bound

from autoscaler.app.assembly import build_file_parts, build_providers
from autoscaler.model.config import load_config
from autoscaler.spi.provider import FLEET_TAG
from providers.aws.events import HEALTH, LEAVING_STATES, REBALANCE, SPOT_WARNING, STATE_CHANGE

MODULES = ("aws", "gcp", "azure")
# one root module per cloud that needs only that cloud (docs/quickstart-<cloud>.md)
QUICKSTARTS = {cloud: f"examples/{cloud}-quickstart" for cloud in MODULES}
PROVIDER_OF = {"aws": "aws", "gcp": "google", "azure": "azurerm"}
ROOT = TERRAFORM.parent
CLI = Path(sys.executable).parent / "gpu-autoscaler"

Module = dict[str, list[Any]]
CLOUDS: dict[str, tuple[Callable[[], Calls], Callable[[Module], set[str]]]] = {
    "aws": (aws_calls, aws_granted),
    "gcp": (gcp_calls, gcp_granted),
    "azure": (azure_calls, azure_granted),
}


@pytest.fixture(scope="module")
def modules() -> dict[str, Module]:
    names = (*MODULES, "examples", *QUICKSTARTS.values())
    return {name: load_module(TERRAFORM / name) for name in names}


# -- shape of the modules -----------------------------------------------------------------------


def test_every_tf_file_parses() -> None:
    files = sorted(TERRAFORM.rglob("*.tf"))
    assert len(files) >= 16
    for path in files:
        assert load_hcl(path), f"{path} parsed to nothing"


@pytest.mark.parametrize("name", [*MODULES, "examples", *QUICKSTARTS.values()])
def test_module_pins_terraform_and_providers(name: str, modules: dict[str, Module]) -> None:
    (settings,) = modules[name]["terraform"]
    assert settings["required_version"].startswith(">= 1.5")
    for provider in settings["required_providers"]:
        for spec in provider.values():
            assert spec["source"].startswith("hashicorp/")
            assert ">=" in spec["version"] and "<" in spec["version"].replace("<=", "")


@pytest.mark.parametrize("name", MODULES)
def test_module_documents_and_checks_its_inputs(name: str, modules: dict[str, Module]) -> None:
    variables = named(modules[name], "variable")
    outputs = named(modules[name], "output")
    assert variables and outputs
    for variable, body in {**variables, **outputs}.items():
        assert len(body.get("description", "")) > 20, f"{name}: {variable} has no description"
    for variable, body in variables.items():
        assert "type" in body, f"{name}: variable {variable} has no type"
        if "default" not in body:
            assert body.get("validation"), f"{name}: required {variable} is not validated"

    # the README's example parses and sets real variables, every required one among them
    readme = (TERRAFORM / name / "README.md").read_text()
    example = readme.split("## Example", 1)[1].split("```hcl\n", 1)[1].split("```", 1)[0]
    (call,) = hcl2.loads(example, serialization_options=PARSE)["module"][0].values()
    assert call.pop("source") == f"./terraform/{name}"
    assert set(call) <= set(variables)
    assert {v for v, body in variables.items() if "default" not in body} <= set(call)


# -- the consistency check ----------------------------------------------------------------------


@pytest.mark.parametrize("cloud", MODULES)
def test_grants_are_exactly_what_the_code_calls(cloud: str, modules: dict[str, Module]) -> None:
    calls, granted = CLOUDS[cloud]
    assert compare(calls(), granted(modules[cloud])) == []


def test_the_code_side_finds_every_kind_of_call() -> None:
    """Each way the code reaches a cloud is seen: a boto3 method, a paginator, a client held by
    another class, a Compute Engine method handed to a helper, an ARM group bound to a name."""
    aws = aws_calls().actions
    assert "ec2:RunInstances" in aws and "ec2:DescribeSpotPriceHistory" in aws
    assert any(w.startswith("providers/aws/notices.py") for w in aws["sqs:ReceiveMessage"])
    assert any(w.startswith("providers/aws/queue.py") for w in aws["sqs:GetQueueAttributes"])
    assert {"compute.instances.create", "compute.zoneOperations.get"} <= set(gcp_calls().actions)
    assert "Microsoft.Compute/virtualMachines/write" in azure_calls().actions


def _grant_lists(cloud: str, module: Module) -> list[list[str]]:
    """The mutable action lists a cloud's grant is read from, in a parsed module."""
    if cloud == "aws":
        document = blocks(module, "data", "aws_iam_policy_document")["controller"]
        found = [s["actions"] for s in document.get("statement", [])]
        for dynamic in document.get("dynamic", []):
            found += [c["actions"] for c in dynamic["statement"]["content"]]
        return found
    names = (
        ("permissions", "act_as_permissions")
        if cloud == "gcp"
        else ("controller_actions", "subnet_actions")
    )
    return [locals_of(module)[name] for name in names]


@pytest.mark.parametrize(
    ("cloud", "removed", "added"),
    [
        ("aws", "ec2:TerminateInstances", "ec2:DeleteVolume"),
        ("aws", "sqs:DeleteMessage", "sqs:PurgeQueue"),
        ("aws", "ec2:CreateTags", "ec2:DeleteTags"),
        ("gcp", "compute.instances.delete", "compute.instances.setTags"),
        ("gcp", "compute.instances.setMetadata", "compute.instances.setMachineType"),
        ("gcp", "iam.serviceAccounts.actAs", "iam.serviceAccounts.getAccessToken"),
        ("gcp", "compute.disks.create", "compute.disks.delete"),
        ("azure", "Microsoft.Compute/virtualMachines/delete", "Microsoft.Compute/disks/read"),
        ("azure", "Microsoft.Network/virtualNetworks/subnets/join/action", "*"),
    ],
)
def test_a_policy_that_drifts_from_the_code_fails(
    cloud: str, removed: str, added: str, modules: dict[str, Module]
) -> None:
    calls, granted = CLOUDS[cloud]
    code = calls()

    missing = copy.deepcopy(modules[cloud])
    for actions in _grant_lists(cloud, missing):
        while removed in actions:
            actions.remove(removed)
    assert any(
        p.startswith(f"needed but not granted: {removed} ") for p in compare(code, granted(missing))
    )

    extra = copy.deepcopy(modules[cloud])
    _grant_lists(cloud, extra)[0].append(added)
    assert compare(code, granted(extra)) == [f"granted but not needed by the code: {added}"]


def test_a_new_call_in_the_code_fails_until_granted(modules: dict[str, Module]) -> None:
    code = aws_calls()
    code.add("ec2:StopInstances", "providers/aws/instances.py:1")
    assert compare(code, aws_granted(modules["aws"])) == [
        "needed but not granted: ec2:StopInstances (called at providers/aws/instances.py:1)"
    ]
    code.unknown.append("providers/aws/instances.py:2: boto3 service 'pricing' has no IAM prefix")
    assert compare(code, aws_granted(modules["aws"]))[0].startswith("not understood: ")


# -- AWS: the fleet tag fences every write ------------------------------------------------------


def test_aws_writes_are_fenced_by_the_fleet_tag(modules: dict[str, Module]) -> None:
    aws = modules["aws"]
    statements = policy_statements(blocks(aws, "data", "aws_iam_policy_document")["controller"])
    fleet = ("StringEquals", f"aws:RequestTag/{FLEET_TAG}", ("${var.fleet_id}",))
    owned = ("StringEquals", f"aws:ResourceTag/{FLEET_TAG}", ("${var.fleet_id}",))
    by_sid = {s.sid: s for s in statements}
    assert all(s.effect == "Allow" for s in statements)

    # only Describe* (no resource-level permissions exist for them) on "*"
    for statement in statements:
        if statement.resources == ("*",):
            assert all(a.startswith("ec2:Describe") for a in statement.actions), statement.sid

    launch_types = locals_of(aws)["launch_resource_types"]
    assert "instance" not in launch_types
    shared = by_sid["LaunchWithSharedResources"]
    assert shared.resources == "${local.launch_resources}" and not shared.conditions

    for statement in statements:
        if statement.resources != "${local.instances}":
            continue
        assert fleet in statement.conditions or owned in statement.conditions, statement.sid
    launch = by_sid["LaunchOnlyFleetTaggedInstances"]
    assert set(launch.actions) == {"ec2:RunInstances", "ec2:CreateFleet"}
    assert fleet in launch.conditions
    tag = by_sid["TagOnlyAtLaunch"]
    assert tag.actions == ("ec2:CreateTags",)
    assert fleet in tag.conditions
    assert ("StringEquals", "ec2:CreateAction", ("CreateFleet", "RunInstances")) in tag.conditions
    terminate = by_sid["TerminateOnlyFleetInstances"]
    assert terminate.actions == ("ec2:TerminateInstances",) and terminate.conditions == (owned,)

    # every action on instances is one of the fenced statements'
    instance_actions = {
        a for s in statements if s.resources == "${local.instances}" for a in s.actions
    }
    assert instance_actions == {
        "ec2:RunInstances",
        "ec2:CreateFleet",
        "ec2:CreateTags",
        "ec2:TerminateInstances",
    }
    assert by_sid["PassNodeRoles"].optional
    assert ("StringEquals", "iam:PassedToService", ("ec2.amazonaws.com",)) in by_sid[
        "PassNodeRoles"
    ].conditions


def test_aws_trust_is_an_instance_profile_or_one_service_account(
    modules: dict[str, Module],
) -> None:
    trust = policy_statements(blocks(modules["aws"], "data", "aws_iam_policy_document")["trust"])
    by_sid = {s.sid: s for s in trust}
    assert set(by_sid) == {"Ec2InstanceProfile", "KubernetesServiceAccount"}
    assert all(s.optional for s in trust)
    irsa = by_sid["KubernetesServiceAccount"]
    assert irsa.actions == ("sts:AssumeRoleWithWebIdentity",)
    assert {c[1] for c in irsa.conditions} == {
        "${local.oidc_issuer}:sub",
        "${local.oidc_issuer}:aud",
    }


def test_aws_event_rules_carry_what_the_code_reads(modules: dict[str, Module]) -> None:
    aws = modules["aws"]
    rules = locals_of(aws)["event_rules"]
    detail_types = {t for rule in rules.values() for t in rule["pattern"]["detail-type"]}
    assert detail_types == {SPOT_WARNING, REBALANCE, STATE_CHANGE, HEALTH}
    (state_rule,) = [r for r in rules.values() if r["pattern"]["detail-type"] == [STATE_CHANGE]]
    assert set(state_rule["pattern"]["detail"]["state"]) == LEAVING_STATES
    sources = {
        rule["pattern"]["detail-type"][0]: rule["pattern"]["source"] for rule in rules.values()
    }
    assert sources[HEALTH] == ["aws.health"] and sources[SPOT_WARNING] == ["aws.ec2"]
    targets = blocks(aws, "resource", "aws_cloudwatch_event_target")["interruptions"]
    assert targets["for_each"] == "${local.event_rules}"
    assert targets["arn"] == "${aws_sqs_queue.interruptions.arn}"


def test_aws_queue_takes_only_eventbridge_encrypted_and_short_lived(
    modules: dict[str, Module],
) -> None:
    aws = modules["aws"]
    queue = blocks(aws, "resource", "aws_sqs_queue")["interruptions"]
    assert queue["sqs_managed_sse_enabled"] is True
    retention = named(aws, "variable")["message_retention_seconds"]["default"]
    assert 120 <= retention <= 3600  # outlives a spot warning, never replays old ones for long
    policy = policy_statements(blocks(aws, "data", "aws_iam_policy_document")["queue"])
    allows = [s for s in policy if s.effect == "Allow"]
    assert len(allows) == 1 and allows[0].actions == ("sqs:SendMessage",)
    (source,) = [c for c in allows[0].conditions if c[1] == "aws:SourceArn"]
    assert source[0] == "ArnEquals"
    queue_doc = blocks(aws, "data", "aws_iam_policy_document")["queue"]
    principals = queue_doc["statement"][0]["principals"]
    assert principals == [{"type": "Service", "identifiers": ["events.amazonaws.com"]}]
    denies = [s for s in policy if s.effect == "Deny"]
    assert denies and ("Bool", "aws:SecureTransport", ("false",)) in denies[0].conditions


def test_azure_subnet_join_is_granted_on_the_subnets_only(modules: dict[str, Module]) -> None:
    azure = modules["azure"]
    roles = blocks(azure, "resource", "azurerm_role_definition")
    join = "Microsoft.Network/virtualNetworks/subnets/join/action"
    assert locals_of(azure)["subnet_actions"] == [join]
    assert join not in locals_of(azure)["controller_actions"]
    assert roles["subnet_join"]["assignable_scopes"] == "${var.subnet_ids}"
    assert roles["controller"]["assignable_scopes"] == ["${data.azurerm_resource_group.fleet.id}"]
    assignments = blocks(azure, "resource", "azurerm_role_assignment")
    assert assignments["subnet_join"]["scope"] == "${each.value}"
    assert assignments["controller"]["scope"] == "${data.azurerm_resource_group.fleet.id}"


# -- checkov ------------------------------------------------------------------------------------


def _checkov() -> str:
    for candidate in (
        os.environ.get("CHECKOV"),
        str(ROOT / ".venv-tools" / "bin" / "checkov"),
        shutil.which("checkov"),
    ):
        if candidate and Path(candidate).is_file():
            return candidate
    pytest.fail(
        "checkov is not installed: run `make tools` (it installs checkov into .venv-tools/), "
        "or point CHECKOV at a checkov executable"
    )


def test_checkov_finds_nothing(tmp_path: Path) -> None:
    env = {**os.environ, "HOME": str(tmp_path), "BC_SKIP_MAPPING": "TRUE"}
    done = subprocess.run(
        [
            _checkov(),
            "-d",
            str(TERRAFORM),
            "--framework",
            "terraform",
            "--compact",
            "--quiet",
            "--skip-download",
            "-o",
            "json",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=bound(300),
        check=False,
    )
    report = json.loads(done.stdout)
    summary = report["summary"]
    failed = [
        f"{c['check_id']} {c['resource']} ({c['file_path']})"
        for c in report["results"].get("failed_checks", [])
    ]
    assert failed == [] and summary["failed"] == 0, failed
    assert summary["parsing_errors"] == 0
    assert summary["resource_count"] >= 15
    for skipped in report["results"].get("skipped_checks", []):
        reason = str(skipped.get("suppress_comment", ""))
        assert len(reason) > 15, f"{skipped['check_id']} is skipped without a reason"
    assert done.returncode == 0, done.stderr[-2000:]


# -- the example --------------------------------------------------------------------------------

# What `terraform apply` would output, as fake but well-formed values.
FAKE_OUTPUTS: dict[tuple[str, str], str] = {
    ("aws", "region"): "us-east-1",
    ("aws", "interruption_queue_url"): (
        "https://sqs.us-east-1.amazonaws.com/123456789012/gpu-autoscaler-interruptions"
    ),
    ("aws", "role_arn"): "arn:aws:iam::123456789012:role/gpu-autoscaler-controller",
    ("gcp", "project"): "my-gpu-project",
    ("gcp", "service_account_email"): "gpu-autoscaler@my-gpu-project.iam.gserviceaccount.com",
    ("azure", "subscription_id"): "8a5d3c1e-1111-4222-8333-444455556666",
    ("azure", "resource_group"): "gpu-fleet",
    ("azure", "client_id"): "0f3c2b1a-aaaa-4bbb-8ccc-ddddeeeeffff",
}
FAKE_VARIABLES = {
    "gcp_project": "my-gpu-project",
    "azure_subnet_id": (
        "/subscriptions/8a5d3c1e-1111-4222-8333-444455556666/resourceGroups/net/providers/"
        "Microsoft.Network/virtualNetworks/gpu/subnets/nodes"
    ),
    "ssh_public_key": 'ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMq "ops"@example',
}


def _example_values(modules: Mapping[str, Module]) -> dict[str, str]:
    """The template's values as terraform would pass them: each module output it names must
    exist in that module's outputs.tf, each variable in the example's variables.tf."""
    values: dict[str, str] = {}
    variables = named(modules["examples"], "variable")
    for key, expression in locals_of(modules["examples"])["config_values"].items():
        reference = expression.removeprefix("${").removesuffix("}").split(".")
        if reference[0] == "module":
            _, module, output = reference
            assert output in named(modules[module], "output"), f"{module} has no {output}"
            values[key] = FAKE_OUTPUTS[(module, output)]
        else:
            assert reference[0] == "var", expression
            variable = variables[reference[1]]
            values[key] = variable.get("default") or FAKE_VARIABLES[reference[1]]
    return values


def test_example_outputs_render_a_config_the_controller_accepts(
    modules: dict[str, Module], tmp_path: Path
) -> None:
    example = TERRAFORM / "examples"
    module_calls = named(modules["examples"], "module")
    assert {name: body["source"] for name, body in module_calls.items()} == {
        m: f"../{m}" for m in MODULES
    }
    template = (example / "controller-config.yaml.tftpl").read_text()
    values = _example_values(modules)
    config = tmp_path / "config.yaml"
    config.write_text(render_template(template, values))

    done = subprocess.run(
        [str(CLI), "validate", str(config)],
        capture_output=True,
        text=True,
        timeout=bound(120),
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"{config}: ok: fleet 'prod', 3 pools, policy 'cost-aware'"

    # the providers check their own settings and pool options when built
    loaded = load_config(config)
    providers = build_providers(loaded, str(config))
    try:
        assert sorted(providers) == ["aws", "azure", "gcp"]
        assert loaded.providers["aws"]["interruption_queue_url"] == values["interruption_queue_url"]
        assert loaded.providers["gcp"]["project"] == "my-gpu-project"
        assert loaded.providers["azure"]["resource_group"] == "gpu-fleet"
        azure_pool = loaded.pool("azure-t4-spot")
        assert azure_pool.options["ssh_public_key"] == FAKE_VARIABLES["ssh_public_key"]
    finally:
        for provider in providers.values():
            close = getattr(provider, "close", None)
            if close is not None:
                close()
    # the identities are named in the config for the operator, never used from it
    for identity in ("role_arn", "service_account_email", "client_id"):
        assert any(v in config.read_text() for k, v in FAKE_OUTPUTS.items() if k[1] == identity)


def test_template_renderer_refuses_what_it_cannot_render() -> None:
    with pytest.raises(ValueError):
        render_template("a: ${x}\n", {"x": "1"})
    with pytest.raises(ValueError):
        render_template("%{ if true }a%{ endif }", {})
    with pytest.raises(KeyError):
        render_template("a: ${jsonencode(x)}\n", {})
    assert render_template("a: ${jsonencode(x)}\n", {"x": 'say "hi"'}) == 'a: "say \\"hi\\""\n'


# -- the quickstarts: one cloud each --------------------------------------------------------------


@pytest.mark.parametrize("cloud", MODULES)
def test_a_quickstart_needs_only_its_own_cloud(cloud: str, modules: dict[str, Module]) -> None:
    quickstart = modules[QUICKSTARTS[cloud]]
    (settings,) = quickstart["terraform"]
    assert [set(p) for p in settings["required_providers"]] == [{PROVIDER_OF[cloud]}]
    assert [set(p) for p in quickstart["provider"]] == [{PROVIDER_OF[cloud]}]
    assert {name: body["source"] for name, body in named(quickstart, "module").items()} == {
        cloud: f"../../{cloud}"
    }
    for kind in ("resource", "data"):
        for block in quickstart.get(kind, []):
            for type_name in block:
                assert type_name.startswith(f"{PROVIDER_OF[cloud]}_"), type_name


@pytest.mark.parametrize("cloud", MODULES)
def test_a_quickstart_documents_and_checks_its_inputs(
    cloud: str, modules: dict[str, Module]
) -> None:
    quickstart = modules[QUICKSTARTS[cloud]]
    variables = named(quickstart, "variable")
    for name, body in {**variables, **named(quickstart, "output")}.items():
        assert len(body.get("description", "")) > 20, f"{cloud}: {name} has no description"
    for name, body in variables.items():
        assert "type" in body, f"{cloud}: variable {name} has no type"
        if "default" not in body:
            assert body.get("validation"), f"{cloud}: required {name} is not validated"
    outputs = named(quickstart, "output")
    for output, template in (
        ("controller_config", "controller-config.yaml.tftpl"),
        ("controller_config_slurm", "controller-config-slurm.yaml.tftpl"),
    ):
        assert outputs[output]["value"] == (
            f'${{templatefile("${{path.module}}/{template}", local.config_values)}}'
        )


def test_the_aws_quickstart_gives_the_role_what_its_config_and_template_use(
    modules: dict[str, Module],
) -> None:
    """The controller's role is the module's alone; the module's optional grants cover what
    the quickstart's config and launch template make the controller do: count the work queue
    the sqs source reads, and pass the nodes' role the template's instance profile carries.
    The template tags nothing itself, since the role may tag only instances, and only at launch
    with the fleet tag (TagOnlyAtLaunch)."""
    quickstart = modules[QUICKSTARTS["aws"]]
    call = named(quickstart, "module")["aws"]
    assert call["create_instance_profile"] is True
    assert call["regions"] == ["${var.region}"]
    assert call["work_queue_arns"] == ["${aws_sqs_queue.work.arn}"]
    assert call["node_role_arns"] == ["${aws_iam_role.node.arn}"]
    values = locals_of(quickstart)["config_values"]
    assert values["work_queue_url"] == "${aws_sqs_queue.work.url}"
    assert values["interruption_queue_url"] == "${module.aws.interruption_queue_url}"
    assert values["launch_template"] == "${aws_launch_template.node.name}"

    resources = {t for block in quickstart["resource"] for t in block}
    assert not {"aws_iam_policy", "aws_iam_role_policy", "aws_iam_role_policy_attachment"} & (
        resources
    ), "the quickstart grants nothing besides the module: the grant check covers it all"
    template = blocks(quickstart, "resource", "aws_launch_template")["node"]
    assert "tag_specifications" not in template
    (profile,) = template["iam_instance_profile"]
    assert profile["arn"] == "${aws_iam_instance_profile.node.arn}"
    node_profile = blocks(quickstart, "resource", "aws_iam_instance_profile")["node"]
    assert node_profile["role"] == "${aws_iam_role.node.name}"
    (metadata,) = template["metadata_options"]
    assert metadata["http_tokens"] == "required"
    (disk,) = template["block_device_mappings"]
    assert disk["ebs"][0]["encrypted"] is True


# What creating a VM with each field of the provider's Instance body is authorised as, besides
# compute.instances.create (Compute Engine's access control for instances.insert).
GCP_FIELD_PERMISSIONS: dict[str, frozenset[str]] = {
    "name": frozenset(),
    "machine_type": frozenset(),
    "scheduling": frozenset(),
    "guest_accelerators": frozenset(),
    "labels": frozenset({"compute.instances.setLabels"}),
    "disks": frozenset({"compute.disks.create", "compute.images.useReadOnly"}),
    "network_interfaces": frozenset({"compute.subnetworks.use"}),
    "metadata": frozenset({"compute.instances.setMetadata"}),
    "service_accounts": frozenset(
        {"compute.instances.setServiceAccount", "iam.serviceAccounts.actAs"}
    ),
}


def _gcp_quickstart_needs() -> dict[str, str]:
    """Each permission the VM bodies the GCP provider builds for the quickstart's pools need
    besides instances.create, with the pool that needs it. The bodies come from the provider
    itself, built from each quickstart config as run builds it (the Slurm join script made
    the pools' startup-script), so a new field in the code or a new option in a config fails
    until it is known here and granted."""
    needs: dict[str, str] = {}
    for name in ("gcp.yaml", "gcp-slurm.yaml"):
        config = load_config(ROOT / "examples" / "quickstart" / name)
        parts = build_file_parts(config, name)
        try:
            instances = parts.providers["gcp"].instances  # type: ignore[attr-defined]
            for pool in config.pools:
                body = instances.resource(pool, "ga-x-0", "us-central1-a", {"k": "v"})
                unknown = set(body) - set(GCP_FIELD_PERMISSIONS)
                assert not unknown, f"no permission is known for the VM fields {unknown}"
                for field in body:
                    for permission in GCP_FIELD_PERMISSIONS[field]:
                        needs.setdefault(permission, f"{name}: {pool.name}.{field}")
        finally:
            parts.close(quiet=True)
    return needs


def test_the_field_table_is_what_the_grant_check_implies_for_an_insert() -> None:
    """The permissions a VM body's fields need are the ones IMPLIED expects beside
    compute.instances.create, so the module grants what every field the provider may send needs."""
    fields = set().union(*GCP_FIELD_PERMISSIONS.values())
    assert fields == set(IMPLIED["compute.instances.create"])


def test_the_gcp_quickstart_grants_nothing_besides_the_module(modules: dict[str, Module]) -> None:
    """The module grants what the code calls, the pools' metadata and service account included,
    and acting as the accounts it is given; the quickstart hands it the nodes' account and
    grants nothing itself. The VM bodies the provider builds from the quickstart's configs need
    nothing the module does not grant."""
    quickstart = modules[QUICKSTARTS["gcp"]]
    granted = gcp_granted(modules["gcp"])
    needs = _gcp_quickstart_needs()
    missing = set(needs) - granted
    assert not missing, {p: needs[p] for p in missing}
    assert {"compute.instances.setMetadata", "iam.serviceAccounts.actAs"} <= set(needs)

    call = named(quickstart, "module")["gcp"]
    assert call["node_service_accounts"] == ["${google_service_account.node.email}"]
    values = locals_of(quickstart)["config_values"]
    assert values["node_service_account"] == "${google_service_account.node.email}"
    resources = {t for block in quickstart["resource"] for t in block}
    grants = {
        "google_project_iam_custom_role",
        "google_project_iam_member",
        "google_project_iam_binding",
        "google_service_account_iam_member",
        "google_service_account_iam_binding",
    }
    assert not grants & resources, (
        "the quickstart grants nothing besides the module: the grant check covers it all"
    )


def test_gcp_act_as_is_granted_on_the_nodes_accounts_only(modules: dict[str, Module]) -> None:
    """Acting as a service account is never project-wide (that would be acting as any account
    of the project): a role of its own, bound on each of node_service_accounts, and made only
    when some are given."""
    gcp = modules["gcp"]
    act_as = "iam.serviceAccounts.actAs"
    assert act_as not in locals_of(gcp)["permissions"]
    roles = blocks(gcp, "resource", "google_project_iam_custom_role")
    assert resolve_local(gcp, roles["act_as_nodes"]["permissions"]) == [act_as]
    assert roles["act_as_nodes"]["count"] == "${length(var.node_service_accounts) > 0 ? 1 : 0}"
    (project_binding,) = blocks(gcp, "resource", "google_project_iam_member").values()
    assert project_binding["role"] == "${google_project_iam_custom_role.controller.id}"
    binding = blocks(gcp, "resource", "google_service_account_iam_member")["act_as_nodes"]
    assert binding["count"] == "${length(var.node_service_accounts)}"
    assert binding["service_account_id"] == (
        "projects/-/serviceAccounts/${var.node_service_accounts[count.index]}"
    )
    assert binding["role"] == "${google_project_iam_custom_role.act_as_nodes[0].id}"
    assert binding["member"] == "serviceAccount:${google_service_account.controller.email}"

    # the variable takes service accounts' emails and nothing else
    variable = named(gcp, "variable")["node_service_accounts"]
    assert variable["default"] == []
    (check,) = variable["validation"]
    pattern = re.search(r'regex\("(.+?)", e\)', check["condition"])
    assert pattern is not None, check["condition"]
    email = re.compile(pattern.group(1).replace("\\\\", "\\"))
    for good in (
        "gpu-autoscaler-node@my-gpu-project.iam.gserviceaccount.com",
        "123456789012-compute@developer.gserviceaccount.com",
    ):
        assert email.search(good), good
    for bad in ("gpu-autoscaler-node", "someone@example.com", "user:me@my-gpu-project.iam"):
        assert not email.search(bad), bad


def test_the_azure_quickstart_scopes_the_identity_to_its_own_group_and_subnet(
    modules: dict[str, Module],
) -> None:
    quickstart = modules[QUICKSTARTS["azure"]]
    call = named(quickstart, "module")["azure"]
    assert call["resource_group_name"] == "${azurerm_resource_group.fleet.name}"
    assert call["subnet_ids"] == ["${azurerm_subnet.gpu.id}"]
    values = locals_of(quickstart)["config_values"]
    assert values["subnet_id"] == "${azurerm_subnet.gpu.id}"
    assert values["resource_group"] == "${module.azure.resource_group}"
    resources = {t for block in quickstart["resource"] for t in block}
    assert not {"azurerm_role_definition", "azurerm_role_assignment"} & resources, (
        "the quickstart grants nothing besides the module: the grant check covers it all"
    )
