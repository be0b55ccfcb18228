"""GCP pools set their VMs' startup script, metadata items and service account (issue 17, item
5): the options are checked with the config (``validate``, one line naming file, line and
field), and what a launch or a gang's bulk insert sends is read back from the Compute Engine
emulator, as the VM holds it.

A pool's boot script comes from its ``user_data`` (its own, or the Slurm join script the
assembly renders for a pool that joins) or from the ``startup_script`` option: one of the two,
never both.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from gcp_emulator import IMAGE, PROJECT, REGION, ComputeEmulator
from waits import bound

from autoscaler.app.assembly import FileParts, build_file_parts, check_config
from autoscaler.cli import main
from autoscaler.model import Pool
from autoscaler.model.config import load_config
from autoscaler.model.errors import InputError
from autoscaler.sources.slurm_join import join_script
from autoscaler.spi.provider import GangLauncher
from providers.gcp import GcpProvider

FLEET = "opts"
SCRIPT = "#!/bin/sh\necho 'set up the node'\n"
ACCOUNT = "gpu-nodes@my-project.iam.gserviceaccount.com"
CLOUD_PLATFORM = "https://www.googleapis.com/auth/cloud-platform"


def pool(name: str = "gcp-a100", **extra: Any) -> dict[str, Any]:
    options = {"image": IMAGE, **extra.pop("options", {})}
    return {
        "name": name,
        "provider": "gcp",
        "region": REGION,
        "zone": f"{REGION}-a",
        "instance_type": "a2-highgpu-1g",
        "gpus_per_instance": 1,
        "market": "spot",
        "options": options,
        **extra,
    }


def write(tmp_path: Path, gcp: ComputeEmulator, pools: list[Any], *, joining: bool = False) -> Path:
    document: dict[str, Any] = {
        "fleet_id": FLEET,
        "providers": {
            "gcp": {"project": PROJECT, "endpoint": gcp.url, "operation_timeout_s": bound(30)}
        },
        "pools": pools,
    }
    if joining:
        document["sources"] = [{"kind": "slurm", "settings": {"join_user_data": True}}]
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


def built(path: Path) -> FileParts:
    config = load_config(path)
    check_config(config, str(path))  # what validate accepts
    return build_file_parts(config, str(path))


def launched_vm(parts: FileParts, name: str, gcp: ComputeEmulator) -> dict[str, Any]:
    """Launch one VM of the pool and read back what the emulator holds for it."""
    provider = parts.providers["gcp"]
    (instance,) = provider.launch(parts_pool(parts, name), 1, f"req-{name}", FLEET).instances
    return gcp.find(instance.id)[1]


def parts_pool(parts: FileParts, name: str) -> Pool:
    """The pool as the provider was built with it (its user data filled by the assembly)."""
    provider: Any = parts.providers["gcp"]
    found: Pool = provider.pools[name]
    return found


def items(vm: dict[str, Any]) -> list[tuple[str, str]]:
    return [(i["key"], i["value"]) for i in vm.get("metadata", {}).get("items", [])]


def refused(path: Path, capsys: pytest.CaptureFixture[str]) -> str:
    """The one error line ``validate`` prints, checked to be what ``run --dry-start`` says."""
    capsys.readouterr()
    assert main(["validate", "--config", str(path)]) == 2
    line = capsys.readouterr().err
    assert main(["run", "--dry-start", "--config", str(path), "--log-level", "ERROR"]) == 2
    assert capsys.readouterr().err == line and line.count("\n") == 1, line
    return line.rstrip("\n")


def line_of(path: Path, text: str) -> int:
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if text in line)


def test_startup_script_metadata_and_service_account_reach_the_vm(
    tmp_path: Path, gcp: ComputeEmulator
) -> None:
    options = {
        "startup_script": SCRIPT,
        "metadata": {"enable-oslogin": "TRUE", "team": "ml-platform"},
        "service_account": {"email": ACCOUNT, "scopes": ["cloud-platform", "storage-ro"]},
    }
    path = write(tmp_path, gcp, [pool(options=options), pool("gcp-plain")])
    parts = built(path)
    try:
        vm = launched_vm(parts, "gcp-a100", gcp)
        assert items(vm) == [
            ("startup-script", SCRIPT),
            ("enable-oslogin", "TRUE"),
            ("team", "ml-platform"),
        ]
        assert vm["serviceAccounts"] == [
            {
                "email": ACCOUNT,
                "scopes": [
                    CLOUD_PLATFORM,
                    "https://www.googleapis.com/auth/devstorage.read_only",
                ],
            }
        ]
        plain = launched_vm(parts, "gcp-plain", gcp)
        assert "metadata" not in plain and "serviceAccounts" not in plain, "nothing unasked"
    finally:
        parts.close()


def test_the_default_account_gets_cloud_platform_and_gangs_boot_the_same(
    tmp_path: Path, gcp: ComputeEmulator
) -> None:
    options = {
        "startup_script": SCRIPT,
        "metadata": {"a": "b"},
        "service_account": {"email": "default"},
        "placement_policy": {"create": True},
    }
    path = write(tmp_path, gcp, [pool("gcp-gang", market="on-demand", options=options)])
    parts = built(path)
    try:
        provider = parts.providers["gcp"]
        assert isinstance(provider, GangLauncher)
        gang = provider.launch_gang(parts_pool(parts, "gcp-gang"), 2, "gang-1", FLEET)
        assert len(gang.instances) == 2
        for instance in gang.instances:
            vm = gcp.find(instance.id)[1]
            assert items(vm) == [("startup-script", SCRIPT), ("a", "b")]
            assert vm["serviceAccounts"] == [{"email": "default", "scopes": [CLOUD_PLATFORM]}]
    finally:
        parts.close()


def test_a_startup_script_url_alone_is_passed_on(tmp_path: Path, gcp: ComputeEmulator) -> None:
    url = {"startup-script-url": "gs://my-bucket/boot.sh"}
    path = write(tmp_path, gcp, [pool(options={"metadata": url})])
    parts = built(path)
    try:
        assert items(launched_vm(parts, "gcp-a100", gcp)) == [
            ("startup-script-url", "gs://my-bucket/boot.sh")
        ]
    finally:
        parts.close()


# -- the boot script: user_data or startup_script, one of the two ------------------------------


def test_startup_script_and_user_data_both_set_is_one_error_naming_both(
    tmp_path: Path, gcp: ComputeEmulator, capsys: pytest.CaptureFixture[str]
) -> None:
    both = pool(user_data="#!/bin/sh\necho mine\n", options={"startup_script": SCRIPT})
    path = write(tmp_path, gcp, [pool("gcp-first"), both])
    line = refused(path, capsys)
    at = line_of(path, "startup_script:")
    assert line.startswith(f"error: {path}:{at}: pools[1].options.startup_script: "), line
    assert "startup_script and the pool's user_data" in line and "keep one" in line


def test_a_pool_that_joins_slurm_gets_the_join_script_or_its_own_never_both(
    tmp_path: Path, gcp: ComputeEmulator, capsys: pytest.CaptureFixture[str]
) -> None:
    """With the Slurm source's ``join_user_data`` the join script is the user data of a pool
    that joins and brings none: a startup script beside it is refused; a pool that never joins
    (or says ``user_data: ""``) boots its startup script."""
    joining = pool(options={"startup_script": SCRIPT})
    path = write(tmp_path, gcp, [joining], joining=True)
    line = refused(path, capsys)
    assert "pools[0].options.startup_script" in line and "join script" in line, line

    workers = pool("gcp-workers", joins_scheduler=False, options={"startup_script": SCRIPT})
    own = pool("gcp-own", user_data="", options={"startup_script": SCRIPT})
    path = write(tmp_path, gcp, [workers, own, pool("gcp-joins")], joining=True)
    parts = built(path)
    try:
        for name in ("gcp-workers", "gcp-own"):
            assert items(launched_vm(parts, name, gcp)) == [("startup-script", SCRIPT)], name
        ((key, script),) = items(launched_vm(parts, "gcp-joins", gcp))
        assert key == "startup-script" and script.endswith(join_script().partition("\n")[2])
    finally:
        parts.close()


# -- what Compute Engine would refuse, refused with the config ---------------------------------


@pytest.mark.parametrize(
    ("options", "at", "field", "said"),
    [
        (
            {"metadata": {"startup-script": SCRIPT}},
            "startup-script:",
            "pools[0].options.metadata",
            "give it as the option startup_script or as the pool's user_data",
        ),
        (
            {"metadata": {"a key": "x"}},
            "a key:",
            "pools[0].options.metadata",
            "metadata key 'a key': expected up to 128 letters, digits, - and _",
        ),
        (
            {"metadata": {"enable-oslogin": True}},
            "enable-oslogin:",
            "pools[0].options.metadata",
            "must be text: quote it (enable-oslogin: 'True')",
        ),
        (
            {"metadata": {"big": "x" * (256 * 1024 + 1)}},
            "big:",
            "pools[0].options.metadata",
            "262,145 bytes; a GCP metadata value holds at most 256 KB",
        ),
        (
            {"startup_script": "#" * (256 * 1024 + 1)},
            "startup_script:",
            "pools[0].options.startup_script",
            "262,145 bytes of startup script",
        ),
        (
            {"metadata": {"a": "x" * 200_000, "b": "y" * 200_000}, "startup_script": "#" * 200_000},
            "a: xxxx",  # a block's error points at its first line
            "pools[0].options.metadata",
            "comes to 600,016 bytes; Compute Engine takes at most 512 KB",
        ),
        (
            {"startup_script": SCRIPT, "metadata": {"startup-script-url": "gs://b/s.sh"}},
            "startup-script-url:",
            "pools[0].options.metadata.startup-script-url",
            "would both run at boot: keep one",
        ),
        (
            {"service_account": {"email": "nodes"}},
            "email:",
            "pools[0].options.service_account.email",
            "expected a service account's email",
        ),
        (
            {"service_account": {"email": "default", "scopes": ["cloud-platfrom"]}},
            "- cloud-platfrom",
            "pools[0].options.service_account.scopes",
            "'cloud-platfrom' is not an OAuth scope",
        ),
        (
            {"service_acount": {"email": "default"}},
            "email: default",
            "pools[0].options.service_acount",
            "unknown field; expected one of: ",
        ),
    ],
)
def test_bad_options_are_one_line_naming_file_line_and_field(
    tmp_path: Path,
    gcp: ComputeEmulator,
    capsys: pytest.CaptureFixture[str],
    options: dict[str, Any],
    at: str,
    field: str,
    said: str,
) -> None:
    path = write(tmp_path, gcp, [pool(options=options)])
    line = refused(path, capsys)
    assert line.startswith(f"error: {path}:{line_of(path, at)}: {field}: "), line
    assert said in line, line


def test_the_options_are_checked_without_a_config_file_too(gcp: ComputeEmulator) -> None:
    """The provider's own check (what ``from_config`` raises), as the library sees it."""
    both = Pool.model_validate(pool(user_data="x", options={"startup_script": SCRIPT}))
    with pytest.raises(InputError) as caught:
        GcpProvider.from_config({"project": PROJECT, "endpoint": gcp.url}, [both], FLEET)
    assert caught.value.field == "pools[0].options.startup_script"
