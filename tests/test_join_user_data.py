"""Cloud nodes boot with their pool's join script (issue 16, item 4).

A Slurm source with ``join_user_data`` renders, for every pool that joins the scheduler, the
boot script that starts the node under its instance id with the features its pool gives it
(market, pool, GPU model). The assembly puts it in the pool's ``user_data``, and each provider
hands it to the cloud the way that cloud takes it: EC2 user data (RunInstances, CreateFleet),
the GCP ``startup-script`` metadata, Azure custom data. The tests launch through the real APIs
(moto's EC2 server, the GCP and Azure emulators), read back what each cloud holds, and run that
script with a recording slurmd: the node asks for exactly the features ``node_features`` says.
"""

from __future__ import annotations

import base64
import string
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import boto3
import pytest
import yaml
from aws_support import REGION as AWS_REGION
from azure_emulator import POOL_OPTIONS as AZURE_OPTIONS
from azure_emulator import REGION as AZURE_REGION
from azure_emulator import ArmEmulator, AzureWorld
from gcp_emulator import IMAGE as GCP_IMAGE
from gcp_emulator import PROJECT as GCP_PROJECT
from gcp_emulator import REGION as GCP_REGION
from gcp_emulator import ComputeEmulator
from hypothesis import given, settings
from hypothesis import strategies as st
from waits import bound

from autoscaler.app.assembly import (
    build_providers,
    build_providers_and_signals,
    check_config,
    close_all,
    joined_pools,
)
from autoscaler.cli import main
from autoscaler.model import Market, Pool
from autoscaler.model.config import ControllerConfig, load_config
from autoscaler.model.errors import InputError
from autoscaler.sources.slurm import SlurmAdapter, SlurmSettings
from autoscaler.sources.slurm_join import gres_type, join_script, node_features
from autoscaler.spi.provider import GangLauncher, Provider
from autoscaler.spi.sources import RendersJoinScript

FLEET = "join"
CONF_SERVER = "--conf-server slurmctld.example:6817"


# -- running a boot script -------------------------------------------------------------------


def boot(script: str, directory: Path, name: str = "i-0node", gpus: int = 4) -> list[str]:
    """Run a boot script as the instance would, with a slurmd that records its arguments (the
    name and GPU count given, as no cloud metadata or GPU answers here)."""
    path = directory / "boot.sh"
    path.write_text(script)
    recorder = directory / "slurmd"
    recorded = directory / "slurmd-args"
    recorded.unlink(missing_ok=True)
    recorder.write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > {recorded}\n')
    recorder.chmod(0o755)
    done = subprocess.run(
        ["sh", str(path)],
        env={
            "PATH": "/usr/bin:/bin",
            "GPU_AUTOSCALER_SLURMD": str(recorder),
            "GPU_AUTOSCALER_NODE_NAME": name,
            "GPU_AUTOSCALER_GPUS": str(gpus),
        },
        capture_output=True,
        text=True,
        timeout=bound(60),
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return recorded.read_text().splitlines()


def node_conf(args: list[str]) -> dict[str, str]:
    """The ``--conf`` the script gave slurmd, as attribute -> value (a ``Comment=`` an operator
    appends, which may hold spaces, is left out)."""
    conf = args[args.index("--conf") + 1]
    return dict(word.split("=", 1) for word in conf.split(" Comment=")[0].split())


def features(args: list[str]) -> list[str]:
    return node_conf(args)["Feature"].split(",")


# -- the config: one Slurm source that renders, pools on three clouds ------------------------


def aws_pool(name: str, market: str, **extra: Any) -> dict[str, Any]:
    return {
        "name": name,
        "provider": "aws",
        "region": AWS_REGION,
        "instance_type": "g5.xlarge",
        "gpus_per_instance": 1,
        "market": market,
        "options": {"launch_template": {"name": "gpu"}},
        **extra,
    }


def gcp_pool(name: str, market: str, **extra: Any) -> dict[str, Any]:
    return {
        "name": name,
        "provider": "gcp",
        "region": GCP_REGION,
        "zone": f"{GCP_REGION}-a",
        "instance_type": "a2-highgpu-1g",
        "gpus_per_instance": 1,
        "market": market,
        "options": {"image": GCP_IMAGE},
        **extra,
    }


def azure_pool(name: str, market: str, **extra: Any) -> dict[str, Any]:
    return {
        "name": name,
        "provider": "azure",
        "region": AZURE_REGION,
        "instance_type": "Standard_NC4as_T4_v3",
        "gpus_per_instance": 1,
        "market": market,
        "options": dict(AZURE_OPTIONS),
        **extra,
    }


def document(
    aws: str, gcp: ComputeEmulator, azure: AzureWorld, slurm: dict[str, Any], pools: list[Any]
) -> dict[str, Any]:
    return {
        "fleet_id": FLEET,
        "providers": {
            "aws": {"endpoint_url": aws},
            "gcp": {"project": GCP_PROJECT, "endpoint": gcp.url, "operation_timeout_s": bound(30)},
            "azure": azure.settings(),
        },
        "sources": [{"kind": "slurm", "name": "hpc", "settings": slurm}],
        "pools": pools,
    }


def write_config(tmp_path: Path, doc: dict[str, Any]) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


@pytest.fixture
def clouds(aws: str, gcp: ComputeEmulator, azure_world: AzureWorld) -> Clouds:
    return aws, gcp, azure_world


JOINING = {
    "join_user_data": True,
    "gpu_models": {"a10g": "A10G", "a100": "A100"},
    "join_gpu_types": {"azure-t4-od": "t4"},
    "join_environment": {"GPU_AUTOSCALER_SLURMD_ARGS": CONF_SERVER},
}


Clouds = tuple[str, ComputeEmulator, AzureWorld]


def launch_one(provider: Provider, pool: Pool, clouds: Clouds) -> tuple[str, str | None]:
    """Launch one instance of ``pool`` and read back the boot data its cloud holds for it."""
    (instance,) = provider.launch(pool, 1, f"req-{pool.name}", FLEET).instances
    return instance.id, boot_data(instance.id, pool.provider, clouds)


def ec2_user_data(aws: str, instance_id: str) -> str | None:
    """What EC2 says an instance boots with (DescribeInstanceAttribute userData, base64)."""
    ec2 = boto3.client("ec2", region_name=AWS_REGION, endpoint_url=aws)
    value = ec2.describe_instance_attribute(InstanceId=instance_id, Attribute="userData")[
        "UserData"
    ].get("Value")
    return base64.b64decode(value, validate=True).decode() if value else None


def boot_data(instance_id: str, cloud: str, clouds: Clouds) -> str | None:
    """The boot data the instance's cloud holds for it: EC2's user data, the GCP VM's
    ``startup-script`` metadata, the Azure VM's custom data (ARM's body as the emulator keeps
    it: ARM never returns custom data in a GET)."""
    aws, gcp, azure = clouds
    if cloud == "aws":
        return ec2_user_data(aws, instance_id)
    if cloud == "gcp":
        items = gcp.find(instance_id)[1].get("metadata", {}).get("items", [])
        scripts = [item["value"] for item in items if item["key"] == "startup-script"]
        assert len(scripts) <= 1
        return scripts[0] if scripts else None
    vm = azure.emulator.vm(instance_id)
    assert vm is not None
    custom = vm.body["properties"]["osProfile"].get("customData")
    return base64.b64decode(custom, validate=True).decode() if custom is not None else None


def test_every_cloud_boots_a_joining_pools_instances_with_its_join_script(
    tmp_path: Path, clouds: Clouds
) -> None:
    aws, gcp, azure = clouds
    pools = [
        aws_pool("aws-g5-spot", "spot"),
        # several shapes: CreateFleet, whose user data is the instant fleet's own
        aws_pool(
            "aws-g5-od",
            "on-demand",
            options={"launch_template": {"name": "gpu"}, "instance_types": ["g5.2xlarge"]},
        ),
        gcp_pool("gcp-a100-spot", "spot"),
        azure_pool("azure-t4-od", "on-demand"),
        aws_pool("aws-workers", "spot", joins_scheduler=False),
        aws_pool("aws-own", "spot", user_data="#!/bin/sh\necho mine\n"),
        gcp_pool("gcp-image-own", "on-demand", user_data=""),
    ]
    config = load_config(write_config(tmp_path, document(aws, gcp, azure, JOINING, pools)))
    providers, wiring = build_providers_and_signals(config, "config.yaml")
    assert isinstance(wiring.scheduler, RendersJoinScript)
    gres = {"aws-g5-spot": "a10g", "aws-g5-od": "a10g", "gcp-a100-spot": "a100"}
    gres["azure-t4-od"] = "t4"
    try:
        for pool in config.pools:
            instance_id, script = launch_one(providers[pool.provider], pool, clouds)
            if pool.name == "aws-workers":
                assert script is None, "a pool of queue workers joins nothing"
                continue
            if pool.name == "aws-own":
                assert script == "#!/bin/sh\necho mine\n", "a pool's own user data is kept"
                continue
            if pool.name == "gcp-image-own":
                assert script is None, "an empty user_data is none, and the scheduler's stays out"
                continue
            assert script is not None and script.endswith(join_script().partition("\n")[2])
            args = boot(script, tmp_path, name=instance_id, gpus=pool.gpus_per_instance)
            assert args[:3] == ["-Z", "-N", instance_id]
            assert features(args) == list(node_features(pool)), pool.name
            assert features(args)[1:3] == [f"market-{pool.market.value}", f"pool-{pool.name}"]
            assert node_conf(args)["Gres"] == f"gpu:{gres[pool.name]}:1"
            assert " ".join(args[args.index("--conf") + 2 :]) == CONF_SERVER
    finally:
        close_all([*providers.values(), *wiring.signals.queues])


def test_the_boot_script_is_the_launch_templates_no_longer(aws: str, tmp_path: Path) -> None:
    """EC2 takes the launch's user data over the template's: what the pool gives wins."""
    ec2 = boto3.client("ec2", region_name=AWS_REGION, endpoint_url=aws)
    ec2.create_launch_template(
        LaunchTemplateName="with-boot",
        LaunchTemplateData={
            "ImageId": "ami-12c6146b",
            "UserData": base64.b64encode(b"#!/bin/sh\necho template\n").decode(),
        },
    )
    template = {"launch_template": {"name": "with-boot"}}
    several = {**template, "instance_types": ["g5.2xlarge"]}
    pools = [
        Pool.model_validate(aws_pool("one", "spot", options=template, user_data="#!/bin/sh\n1\n")),
        Pool.model_validate(aws_pool("fleet", "spot", options=several, user_data="#!/bin/sh\n2")),
        Pool.model_validate(aws_pool("plain", "spot", options=template)),
    ]
    config = ControllerConfig(
        fleet_id=FLEET, providers={"aws": {"endpoint_url": aws}}, pools=tuple(pools)
    )
    provider = build_providers(config)["aws"]
    read = {}
    for pool in pools:
        (instance,) = provider.launch(pool, 1, f"req-{pool.name}", FLEET).instances
        read[pool.name] = ec2_user_data(aws, instance.id)
    assert read == {
        "one": "#!/bin/sh\n1\n",
        "fleet": "#!/bin/sh\n2",
        "plain": "#!/bin/sh\necho template\n",
    }


def test_gangs_boot_with_the_pools_user_data(
    clouds: Clouds,
) -> None:
    """A multi-node job's instances are launched another way (RunInstances all or none, a GCP
    bulk insert, Azure VMs in a proximity placement group); they boot the same."""
    aws, gcp, azure = clouds
    script = "#!/bin/sh\necho 'gang member'\n"
    pools = [
        Pool.model_validate(aws_pool("aws-gang", "on-demand", user_data=script)),
        Pool.model_validate(
            gcp_pool(
                "gcp-gang",
                "spot",
                user_data=script,
                options={"image": GCP_IMAGE, "placement_policy": {"create": True}},
            )
        ),
        Pool.model_validate(
            azure_pool(
                "azure-gang",
                "spot",
                user_data=script,
                options={**AZURE_OPTIONS, "proximity_placement_group": {"create": True}},
            )
        ),
    ]
    config = ControllerConfig.model_validate(
        document(aws, gcp, azure, {}, [p.model_dump() for p in pools])
    )
    providers = build_providers(config)
    for pool in pools:
        gangs = providers[pool.provider]
        assert isinstance(gangs, GangLauncher)
        launched = gangs.launch_gang(pool, 2, f"gang-{pool.name}", FLEET)
        assert len(launched.instances) == 2
        for instance in launched.instances:
            assert boot_data(instance.id, pool.provider, clouds) == script, pool.name


# -- what renders, and for which pools -------------------------------------------------------


A10G_SPOT = Pool(
    name="aws-use1-g5-spot",
    provider="aws",
    region="us-east-1",
    instance_type="g5.xlarge",
    gpus_per_instance=1,
    gpu_model="A10G",
    market=Market.SPOT,
)


def adapter(**settings: Any) -> SlurmAdapter:
    return SlurmAdapter(SlurmSettings.model_validate(settings))


def test_the_adapter_renders_only_when_asked() -> None:
    assert adapter().join_user_data(A10G_SPOT) is None
    script = adapter(join_user_data=True, cloud_feature="burst").join_user_data(A10G_SPOT)
    assert script is not None
    assert "export GPU_AUTOSCALER_FEATURE=burst\n" in script
    assert "export GPU_AUTOSCALER_MARKET=spot\n" in script
    assert "export GPU_AUTOSCALER_POOL=aws-use1-g5-spot\n" in script
    assert "export GPU_AUTOSCALER_GPU_TYPE" not in script, "no gres type known"


def test_the_gres_type_is_the_pools_own_then_the_one_gpu_models_maps_to_its_model() -> None:
    assert gres_type(A10G_SPOT, {}, {}) is None
    assert gres_type(A10G_SPOT, {}, {"a100": "A100", "a10g": "a10g", "other": "A10G"}) == "a10g"
    assert gres_type(A10G_SPOT, {"aws-use1-g5-spot": "nvidia_a10g"}, {"a10g": "A10G"}) == (
        "nvidia_a10g"
    )
    assert gres_type(A10G_SPOT.model_copy(update={"gpu_model": None}), {}, {"a": "A"}) is None


class _Renders:
    def __init__(self, script: str | None) -> None:
        self.script = script
        self.asked: list[str] = []

    def apply_placement(self, placement: Any) -> None: ...

    def drain(self, node: str, reason: str) -> int:
        return 0

    def evict(self, node: str, reason: str) -> int:
        return 0

    def join_user_data(self, pool: Pool) -> str | None:
        self.asked.append(pool.name)
        return self.script if self.script is None else f"{self.script} {pool.name}"


def test_the_assembly_fills_only_pools_that_join_and_bring_none_of_their_own() -> None:
    pools = [
        A10G_SPOT,
        A10G_SPOT.model_copy(update={"name": "workers", "joins_scheduler": False}),
        A10G_SPOT.model_copy(update={"name": "own", "user_data": "#!/bin/sh\nmine\n"}),
        A10G_SPOT.model_copy(update={"name": "none", "user_data": ""}),
    ]
    config = ControllerConfig(fleet_id=FLEET, pools=tuple(pools))
    renders = _Renders("#!/bin/sh\n# join")
    joined = {p.name: p.user_data for p in joined_pools(config, renders)}
    assert joined == {
        "aws-use1-g5-spot": "#!/bin/sh\n# join aws-use1-g5-spot",
        "workers": None,
        "own": "#!/bin/sh\nmine\n",
        "none": "",
    }
    assert renders.asked == ["aws-use1-g5-spot"]
    assert joined_pools(config, _Renders(None)) == config.pools
    assert joined_pools(config, None) == config.pools
    assert [p.user_data for p in joined_pools(config, adapter())] == [p.user_data for p in pools]


def test_a_pool_is_never_shown_with_its_boot_script() -> None:
    shown = repr(A10G_SPOT.model_copy(update={"user_data": "#!/bin/sh\nexport TOKEN=x\n"}))
    assert "TOKEN" not in shown and "user_data" not in shown


@settings(max_examples=40)
@given(
    name=st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,40}", fullmatch=True),
    model=st.text(alphabet=string.ascii_letters + string.digits + " -_/.,+()", min_size=1),
    market=st.sampled_from(list(Market)),
    extra=st.text(alphabet=string.printable, max_size=40),
)
def test_any_pool_renders_a_script_whose_node_has_the_pools_features(
    name: str, model: str, market: Market, extra: str
) -> None:
    """Whatever a pool is called and whatever its GPU model says, the rendered script, run by a
    shell, asks slurmd for the features ``node_features`` gives: the shell quoting holds."""
    pool = A10G_SPOT.model_copy(update={"name": name, "gpu_model": model, "market": market})
    script = adapter(
        join_user_data=True, join_environment={"GPU_AUTOSCALER_NODE_CONF": f"Comment={extra!r}"}
    ).join_user_data(pool)
    assert script is not None
    with tempfile.TemporaryDirectory() as directory:
        args = boot(script, Path(directory))
    assert features(args) == list(node_features(pool))
    conf = args[args.index("--conf") + 1]
    assert conf.endswith(f" Comment={extra!r}")


# -- config errors: one line naming the field --------------------------------------------------


@pytest.mark.parametrize(
    ("pool", "limit", "what"),
    [
        (aws_pool, 16 * 1024, "EC2 takes at most 16 KB"),
        (gcp_pool, 256 * 1024, "holds at most 256 KB"),
        (azure_pool, 65_535, "Azure custom data holds at most 64 KB"),
    ],
)
def test_user_data_too_large_for_the_cloud_is_one_error_naming_the_pools_field(
    tmp_path: Path,
    clouds: Clouds,
    capsys: pytest.CaptureFixture[str],
    pool: Any,
    limit: int,
    what: str,
) -> None:
    aws, gcp, azure = clouds
    fits = pool("fits", "spot", user_data="#" * limit)
    big = pool("big", "spot", user_data="#" * (limit + 1))
    path = write_config(tmp_path, document(aws, gcp, azure, {}, [fits]))
    check_config(load_config(path), str(path))
    path = write_config(tmp_path, document(aws, gcp, azure, {}, [fits, big]))
    with pytest.raises(InputError) as caught:
        check_config(load_config(path), str(path))
    message = str(caught.value)
    assert "pools[1].user_data" in message and what in message, message
    assert message.startswith(f"{path}:") and f"{limit + 1:,} bytes" in message
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "pools[1].user_data" in err and "Traceback" not in err


def test_a_rendered_script_too_large_for_the_cloud_names_the_pool(
    tmp_path: Path, clouds: Clouds
) -> None:
    aws, gcp, azure = clouds
    slurm = {**JOINING, "join_environment": {"GPU_AUTOSCALER_NODE_CONF": "x" * 16_000}}
    pools = [gcp_pool("gcp-a100-spot", "spot"), aws_pool("aws-g5-spot", "spot")]
    path = write_config(tmp_path, document(aws, gcp, azure, slurm, pools))
    with pytest.raises(InputError) as caught:
        check_config(load_config(path), str(path))
    assert "pools[1].user_data" in str(caught.value) and "16 KB" in str(caught.value)
    line = yaml.safe_dump(document(aws, gcp, azure, slurm, pools), sort_keys=False)
    pool_line = line.splitlines().index("- name: aws-g5-spot") + 1
    assert str(caught.value).startswith(f"{path}:{pool_line}: ")


@pytest.mark.parametrize(
    ("settings", "field", "said"),
    [
        (
            {"join_user_data": True, "join_environment": {"GPU_AUTOSCALER_POOL": "x"}},
            "join_environment",
            "is set for each pool by the adapter",
        ),
        (
            {"join_user_data": True, "join_environment": {"bad name": "x"}},
            "join_environment",
            "not an environment variable name",
        ),
        (
            {"join_user_data": True, "join_gpu_types": {"p": "a100 x"}},
            "join_gpu_types",
            "not a gres type name",
        ),
        ({"join_gpu_types": {"p": "a100"}}, "sources[0].settings", "set join_user_data: true"),
    ],
)
def test_bad_join_settings_are_one_error_naming_the_field(
    tmp_path: Path, settings: dict[str, Any], field: str, said: str
) -> None:
    path = write_config(
        tmp_path, {"fleet_id": FLEET, "sources": [{"kind": "slurm", "settings": settings}]}
    )
    with pytest.raises(InputError) as caught:
        check_config(load_config(path), str(path))
    assert field in str(caught.value) and said in str(caught.value), str(caught.value)


def test_azure_custom_data_and_user_data_are_one_or_the_other(
    tmp_path: Path, clouds: Clouds
) -> None:
    aws, gcp, azure = clouds
    options = {**AZURE_OPTIONS, "custom_data": "#cloud-config\n"}
    both = azure_pool("azure-t4-od", "on-demand", options=options)
    path = write_config(tmp_path, document(aws, gcp, azure, JOINING, [both]))
    with pytest.raises(InputError) as caught:
        check_config(load_config(path), str(path))
    assert "pools[0].options.custom_data" in str(caught.value)
    assert "keep one" in str(caught.value)
    path = write_config(tmp_path, document(aws, gcp, azure, {}, [both]))
    check_config(load_config(path), str(path))


def test_custom_data_alone_still_reaches_the_vm(azure_world: AzureWorld) -> None:
    emulator: ArmEmulator = azure_world.emulator
    pool = Pool.model_validate(
        azure_pool(
            "azure-t4-od", "on-demand", options={**AZURE_OPTIONS, "custom_data": "#cloud-config\n"}
        )
    )
    config = ControllerConfig.model_validate(
        {"fleet_id": FLEET, "providers": {"azure": azure_world.settings()}, "pools": [pool]}
    )
    provider = build_providers(config)["azure"]
    (instance,) = provider.launch(pool, 1, "req-custom", FLEET).instances
    vm = emulator.vm(instance.id)
    assert vm is not None
    assert base64.b64decode(vm.body["properties"]["osProfile"]["customData"]) == (
        b"#cloud-config\n"
    )
