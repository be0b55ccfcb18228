"""What the quickstart tests share: each cloud's quickstart (its terraform example, the controller
configs it renders and the doc that shows them) and the values ``terraform apply`` would give the
templates, so that a rendered template can be compared with the config file the doc shows.

The configs under examples/quickstart/ are the templates rendered with the examples' variable
defaults and the fake outputs below (well-formed, as apply returns them, for account 123456789012
or project my-gpu-project). No cloud and no terraform binary is involved.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from terraform_support import TERRAFORM, load_module, locals_of, named, render_template

ROOT = TERRAFORM.parent
CONFIGS = ROOT / "examples" / "quickstart"
DOCS = ROOT / "docs"

ACCOUNT = "123456789012"
PROJECT = "my-gpu-project"
SUBSCRIPTION = "8a5d3c1e-1111-4222-8333-444455556666"
SSH_KEY = (
    "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl ops@example"
)


@dataclass(frozen=True)
class Quickstart:
    cloud: str
    directory: Path
    # template file -> the config file it renders to
    configs: Mapping[str, str]
    # what apply would give the templates' values that are not plain variables: by the exact
    # expression the example's config_values holds
    fakes: Mapping[str, Any]

    @property
    def doc(self) -> Path:
        return DOCS / f"quickstart-{self.cloud}.md"


QUICKSTARTS = {
    q.cloud: q
    for q in (
        Quickstart(
            "aws",
            TERRAFORM / "examples" / "aws-quickstart",
            {
                "controller-config.yaml.tftpl": "aws.yaml",
                "controller-config-slurm.yaml.tftpl": "aws-slurm.yaml",
            },
            {
                "${module.aws.interruption_queue_url}": (
                    f"https://sqs.us-east-1.amazonaws.com/{ACCOUNT}/gpu-autoscaler-interruptions"
                ),
                "${aws_sqs_queue.work.url}": (
                    f"https://sqs.us-east-1.amazonaws.com/{ACCOUNT}/gpu-autoscaler-work"
                ),
                "${aws_launch_template.node.name}": "gpu-autoscaler-gpu-node",
                "${local.subnet_ids}": [
                    "subnet-0a1b2c3d4e5f60718",
                    "subnet-0b2c3d4e5f6071829",
                    "subnet-0c3d4e5f607182930",
                ],
            },
        ),
        Quickstart(
            "gcp",
            TERRAFORM / "examples" / "gcp-quickstart",
            {
                "controller-config.yaml.tftpl": "gcp.yaml",
                "controller-config-slurm.yaml.tftpl": "gcp-slurm.yaml",
            },
            {
                "${var.project}": PROJECT,
                "${module.gcp.project}": PROJECT,
                "${google_compute_subnetwork.gpu.id}": (
                    f"projects/{PROJECT}/regions/us-central1/subnetworks/gpu-autoscaler"
                ),
                "${google_service_account.node.email}": (
                    f"gpu-autoscaler-node@{PROJECT}.iam.gserviceaccount.com"
                ),
            },
        ),
        Quickstart(
            "azure",
            TERRAFORM / "examples" / "azure-quickstart",
            {
                "controller-config.yaml.tftpl": "azure.yaml",
                "controller-config-slurm.yaml.tftpl": "azure-slurm.yaml",
            },
            {
                "${var.subscription_id}": SUBSCRIPTION,
                "${var.ssh_public_key}": SSH_KEY,
                "${module.azure.subscription_id}": SUBSCRIPTION,
                "${module.azure.resource_group}": "gpu-autoscaler",
                "${azurerm_subnet.gpu.id}": (
                    f"/subscriptions/{SUBSCRIPTION}/resourceGroups/gpu-autoscaler/providers/"
                    "Microsoft.Network/virtualNetworks/gpu-autoscaler/subnets/gpu-autoscaler"
                ),
            },
        ),
    )
}

_VARIABLE = re.compile(r"\$\{var\.(\w+)\}")
_LOWER = re.compile(r"\$\{lower\(var\.(\w+)\)\}")


def evaluate(expression: Any, variables: Mapping[str, Any], fakes: Mapping[str, Any]) -> Any:
    """What terraform would make of one of config_values' expressions: a fake output, a
    variable's default (as is, or lower-cased), or a string interpolating defaults. Anything
    else is an error, so a new expression gets a fake value on purpose."""
    if not isinstance(expression, str):
        return expression
    if expression in fakes:
        return fakes[expression]
    whole = _VARIABLE.fullmatch(expression)
    if whole:
        return variables[whole.group(1)]
    lowered = _LOWER.fullmatch(expression)
    if lowered:
        return str(variables[lowered.group(1)]).lower()
    text = _VARIABLE.sub(lambda m: str(variables[m.group(1)]), expression)
    if "${" in text:
        raise KeyError(f"no fake value for {expression!r}")
    return text


def template_values(quickstart: Quickstart) -> dict[str, Any]:
    module = load_module(quickstart.directory)
    defaults = {name: body.get("default") for name, body in named(module, "variable").items()}
    return {
        key: evaluate(expression, defaults, quickstart.fakes)
        for key, expression in locals_of(module)["config_values"].items()
    }


def rendered(quickstart: Quickstart, template: str) -> str:
    text = (quickstart.directory / template).read_text()
    return render_template(text, template_values(quickstart))
