"""``gpu-autoscaler schema``: the controller config's JSON Schema, with each installed plugin's
own settings as a real sub-schema (pool options by provider, source settings by kind, policy
params by name), checked with a JSON Schema validator as an editor would check a file:

* every config the tests, docs and examples hold is valid, and so is every fuzzed config
  ``validate`` accepts (an editor never flags what ``run`` takes);
* the issue's mistakes (a typo in a pool option or a source setting, an unknown source kind, a
  Prometheus source without ``query``) are flagged at the path of the field.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).parent / "fuzz"))

from boundary_config import LOCAL, config_seeds, hostile_yaml, run_cli
from harness import FUZZ

from autoscaler.app.schema import config_schema
from autoscaler.model.errors import InputError
from autoscaler.model.inputfile import read_yaml
from autoscaler.model.plugins import installed

SCHEMA = config_schema()
VALIDATOR = jsonschema.Draft202012Validator(SCHEMA)
SEEDS = config_seeds()

AWS_POOL = {
    "name": "aws-g5",
    "provider": "aws",
    "region": "us-east-1",
    "instance_type": "g5.xlarge",
    "gpus_per_instance": 1,
    "market": "spot",
    "options": {"image_id": "ami-0123456789abcdef0"},
}


def problems(document: Any) -> list[tuple[list[Any], str]]:
    """What an editor would flag: (the path in the document, the message). In a list of
    variants (``oneOf``), the errors of the variant whose discriminator matches (the plugin the
    block names, or the one of the value's type: a mapping, not null) are the ones shown; with
    no such variant, the item itself is flagged."""
    found: list[tuple[list[Any], str]] = []
    stack = list(VALIDATOR.iter_errors(document))
    while stack:
        error = stack.pop()
        if error.validator in ("oneOf", "anyOf") and error.context:
            variants: dict[Any, list[Any]] = {}
            for inner in error.context:
                variants.setdefault(inner.relative_schema_path[0], []).append(inner)
            named = [
                variant
                for variant in variants.values()
                if not any(
                    e.validator == "const"
                    or (
                        e.validator == "type" and list(e.absolute_path) == list(error.absolute_path)
                    )
                    for e in variant
                )
            ]
            if len(named) == 1:
                stack.extend(named[0])
                continue
        found.append((list(error.absolute_path), error.message))
    return found


def test_the_schema_is_a_valid_2020_12_schema_discriminated_by_plugin() -> None:
    jsonschema.Draft202012Validator.check_schema(SCHEMA)
    assert SCHEMA["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    defs = SCHEMA["$defs"]
    pools = SCHEMA["properties"]["pools"]["items"]
    providers = sorted(installed("gpu_autoscaler.providers"))
    assert sorted(pools["discriminator"]["mapping"]) == providers
    assert pools["discriminator"]["propertyName"] == "provider"
    gcp = defs["GcpPool"]["properties"]
    assert gcp["provider"]["const"] == "gcp"
    assert gcp["options"] == {"$ref": "#/$defs/GcpPoolOptions"}
    assert {"startup_script", "metadata", "service_account"} <= set(
        defs["GcpPoolOptions"]["properties"]
    )
    assert defs["GcpPoolOptions"]["additionalProperties"] is False
    sources = SCHEMA["properties"]["sources"]["items"]
    assert sorted(sources["discriminator"]["mapping"]) == sorted(
        installed("gpu_autoscaler.sources")
    )
    assert "query" in defs["PrometheusQueueSettings"]["required"]
    settings_of = defs["Providers"]["properties"]
    assert sorted(settings_of) == providers and defs["Providers"]["additionalProperties"] is False
    assert {"$ref": "#/$defs/GcpSettings"} in settings_of["gcp"]["anyOf"]
    policies = SCHEMA["properties"]["policy"]
    assert sorted(policies["discriminator"]["mapping"]) == sorted(
        installed("gpu_autoscaler.policies")
    )


def test_every_config_the_project_holds_is_valid() -> None:
    assert len(SEEDS) > 5
    for seed in SEEDS:
        assert problems(yaml.safe_load(seed)) == [], seed[:300]


# the fuzz profile's inputs; two CLI runs an input on a busy machine, so no deadline here
@settings(FUZZ, deadline=None)
@given(st.randoms(use_true_random=False))
def test_no_config_validate_accepts_is_flagged_by_the_schema(
    tmp_path_factory: pytest.TempPathFactory, rng: random.Random
) -> None:
    path = tmp_path_factory.mktemp("schema", numbered=True) / "config.yaml"
    data = hostile_yaml(SEEDS, rng)
    if isinstance(data, str):
        path.write_text(data, encoding="utf-8", errors="surrogatepass")
    else:
        path.write_bytes(data)
    if run_cli(["validate", "--config", str(path)]).rc != 0:
        return
    try:
        document = read_yaml(path).data
    except InputError:  # validate read it, so this cannot happen
        raise AssertionError("validate accepted a file the reader refuses") from None
    if isinstance(document, dict) and ("controller" in document or "scenarios" in document):
        return  # a scenario or a suite: not a controller config
    assert problems(document) == [], data


def with_change(path: tuple[Any, ...], value: Any, base: str = LOCAL) -> Any:
    document = yaml.safe_load(base)
    target = document
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return document


@pytest.mark.parametrize(
    ("path", "value", "where", "said"),
    [
        (
            ("pools", 0),
            {**AWS_POOL, "options": {"launch_templat": {"name": "t"}, "image_id": "ami-1"}},
            ["pools", 0, "options"],
            "'launch_templat' was unexpected",
        ),
        (
            ("sources", 0, "settings", "jobs", 0),
            {"count": 1, "gpu": 1},
            ["sources", 0, "settings", "jobs", 0],
            "'gpu' was unexpected",
        ),
        (
            ("sources", 0),
            {"kind": "prometheus", "settings": {"url": "http://p:9090"}},
            ["sources", 0, "settings"],
            "'query' is a required property",
        ),
        (("sources", 0), {"kind": "kafka"}, ["sources", 0], "'kind': 'kafka'"),
        (
            ("pools", 0, "options"),
            {"price_per_hou": 1},
            ["pools", 0, "options"],
            "'price_per_hou' was unexpected",
        ),
        (
            ("providers", "sim", "boot_second"),
            3,
            ["providers", "sim"],
            "'boot_second' was unexpected",
        ),
        (("policy", "params", "idle_second"), 3, ["policy", "params"], "'idle_second'"),
    ],
)
def test_the_issues_mistakes_are_flagged_where_they_are(
    path: tuple[Any, ...], value: Any, where: list[Any], said: str
) -> None:
    found = problems(with_change(path, value))
    assert any(at == where and said in message for at, message in found), found


def test_gcp_pool_options_are_checked_as_its_own() -> None:
    pool = {
        "name": "gcp-a100",
        "provider": "gcp",
        "region": "us-central1",
        "zone": "us-central1-a",
        "instance_type": "a2-highgpu-1g",
        "gpus_per_instance": 1,
        "market": "spot",
        "options": {
            "image": "projects/p/global/images/i",
            "service_account": {"email": "default", "scopes": ["cloud-platform"]},
            "metadata": {"enable-oslogin": "TRUE"},
        },
    }
    assert problems(with_change(("pools", 0), pool)) == []
    pool["options"]["metadata"] = {"enable-oslogin": True}
    found = problems(with_change(("pools", 0), pool))
    assert any(at == ["pools", 0, "options", "metadata", "enable-oslogin"] for at, _ in found)
    del pool["options"]["image"]
    found = problems(with_change(("pools", 0), pool))
    assert any("'image' is a required property" in message for _, message in found), found


def test_the_command_prints_the_schema_or_writes_it(tmp_path: Path) -> None:
    printed = run_cli(["schema"])
    assert printed.rc == 0 and json.loads(printed.out) == SCHEMA
    out = tmp_path / "gpu-autoscaler.schema.json"
    written = run_cli(["schema", "--out", str(out)])
    assert written.rc == 0 and written.out == ""
    assert json.loads(out.read_text()) == SCHEMA
    refused = run_cli(["schema", "--out", str(tmp_path / "no" / "such" / "dir.json")])
    assert refused.rc == 2 and refused.err.startswith("error: ") and refused.err.count("\n") == 1
