"""The quickstarts (docs/quickstart-aws.md, -gcp.md, -azure.md, -slurm.md) hold up.

* Every config a quickstart shows is a real file under examples/quickstart/, shown whole, and is
  exactly what its cloud's terraform example renders (with the variables' defaults and outputs
  shaped as ``terraform apply`` gives them); `gpu-autoscaler validate` and `run --dry-start`
  accept each one.
* Each doc has every step (prerequisites, terraform, the config, validate / plan / run, what to
  check, tear down), its links resolve and the files its commands name exist.
* Each cloud's config, pointed at that cloud's emulator (moto, the Compute Engine and ARM
  emulators) and a real Redis, does what the doc says: three pending jobs bring up the spot
  pool's two instances and one on-demand instance as the fallback, with the metrics and log
  events the doc tells the reader to look for; once the jobs are gone the instances are given
  back, and SIGTERM ends the controller with status 0.
* The Slurm quickstart's targets script lists, from a real Slurm, the cloud nodes' agents at the
  addresses the nodes registered from, in a form the scrape source reads.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import boto3
import pytest
import yaml
from aws_support import REGION as AWS_REGION
from azure_emulator import RESOURCE_GROUP, ArmEmulator
from azure_emulator import SUBSCRIPTION as AZURE_SUBSCRIPTION
from gcp_emulator import PROJECT as GCP_PROJECT
from gcp_emulator import ComputeEmulator
from quickstart_support import CONFIGS, DOCS, QUICKSTARTS, ROOT, rendered
from redis_server import RedisServer, free_port
from slurm_cluster import SlurmCluster, stop_pid_files, wait_for
from waits import bound

from autoscaler.cli import main
from autoscaler.sources.scrape import ScrapeTelemetrySource
from autoscaler.spi.provider import FLEET_TAG, POOL_TAG
from providers.gcp.instances import tags_from_labels

DOC_NAMES = ("aws", "gcp", "azure", "slurm")
TARGETS_SCRIPT = CONFIGS / "gpu-targets-from-slurm.sh"
FLEET = "quickstart"
# three pending one-GPU jobs: the spot pool's two instances, then the on-demand fallback's one
WANTED = {"gpu-spot": 2, "gpu-on-demand": 1}

BLOCK = re.compile(r"^```(\w*)\n(.*?)^```$", re.M | re.S)
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
CONFIG_LINK = re.compile(
    r"^\[(examples/quickstart/[\w.-]+)\]\(\.\./(examples/quickstart/[\w.-]+)\):$"
)
REPO_PATH = re.compile(r"(?<![\w./-])((?:examples|terraform|docs|tests)/[\w./-]*[\w-])")


def doc(name: str) -> Path:
    return DOCS / f"quickstart-{name}.md"


# -- the configs ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("cloud", "template"),
    [(cloud, template) for cloud, q in QUICKSTARTS.items() for template in q.configs],
)
def test_each_config_is_what_its_terraform_renders(cloud: str, template: str) -> None:
    quickstart = QUICKSTARTS[cloud]
    path = CONFIGS / quickstart.configs[template]
    assert path.read_text() == rendered(quickstart, template), (
        f"{path} differs from {quickstart.directory / template} rendered with the defaults: "
        "render it again (tests/quickstart_support.py) or change the template"
    )


def test_every_config_under_examples_quickstart_is_rendered_by_a_quickstart() -> None:
    rendered_files = {f for q in QUICKSTARTS.values() for f in q.configs.values()}
    assert {p.name for p in CONFIGS.glob("*.yaml")} == rendered_files


@pytest.mark.parametrize("name", sorted(p.name for p in CONFIGS.glob("*.yaml")))
def test_each_config_validates_and_dry_starts(
    name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    path = CONFIGS / name
    assert main(["validate", str(path)]) == 0
    ok = f"{path}: ok: fleet '{FLEET}', 2 pools, policy 'cost-aware'"
    assert capsys.readouterr().out.strip() == ok
    assert main(["run", "--dry-start", "--config", str(path), "--log-level", "ERROR"]) == 0
    assert capsys.readouterr().out.strip() == ok


@pytest.mark.parametrize("name", sorted(p.name for p in CONFIGS.glob("*.yaml")))
def test_each_config_is_one_spot_pool_with_an_on_demand_fallback(name: str) -> None:
    config = yaml.safe_load((CONFIGS / name).read_text())
    pools = {p["name"]: p for p in config["pools"]}
    assert [(p["name"], p["market"]) for p in config["pools"]] == [
        ("gpu-spot", "spot"),
        ("gpu-on-demand", "on-demand"),
    ]
    spot, on_demand = pools["gpu-spot"], pools["gpu-on-demand"]
    shape = ("provider", "region", "instance_type", "gpus_per_instance", "gpu_model")
    assert [spot[k] for k in shape] == [on_demand[k] for k in shape]
    assert config["policy"]["name"] == "cost-aware"
    assert config["policy"].get("params", {}).get("on_demand_fallback", True)
    kinds = [s["kind"] for s in config["sources"]]
    slurm = name.endswith("-slurm.yaml")
    assert kinds == (["slurm", "scrape"] if slurm else ["sqs" if "aws" in name else "redis"])
    # queue workers never join a scheduler; Slurm nodes do, booting with the join script
    assert all(p.get("joins_scheduler", True) is slurm for p in config["pools"])
    if slurm:
        (hpc, gpus) = config["sources"]
        assert hpc["settings"]["join_user_data"] is True
        assert hpc["settings"]["spot_partitions"] == {"gpu": "gpu-spot"}
        assert hpc["settings"]["on_demand_partitions"] == {"gpu": "gpu-od"}
        assert gpus["settings"]["node_label"] == "node"
    else:
        assert config["policy"]["params"]["unobserved_nodes"] == "surplus"


# -- the docs ------------------------------------------------------------------------------------


def blocks(text: str) -> Iterator[tuple[str, str, str]]:
    """Each fenced block: its language, the line before it, its text."""
    for match in BLOCK.finditer(text):
        before = text[: match.start()].rstrip("\n").rsplit("\n", 1)[-1]
        yield match.group(1), before, match.group(2)


@pytest.mark.parametrize("name", DOC_NAMES)
def test_each_yaml_a_doc_shows_is_a_whole_config_file(name: str) -> None:
    text = doc(name).read_text()
    shown = []
    for language, before, body in blocks(text):
        if language != "yaml":
            continue
        link = CONFIG_LINK.match(before)
        assert link and link.group(1) == link.group(2), (
            f"{doc(name).name}: a yaml block must follow a line linking the file it shows, "
            f"[examples/quickstart/X.yaml](../examples/quickstart/X.yaml):, not {before!r}"
        )
        path = ROOT / link.group(1)
        assert body == path.read_text(), f"{doc(name).name} shows {path.name} other than it is"
        shown.append(path.name)
    if name != "slurm":
        assert shown == [f"{name}.yaml"], f"{doc(name).name} shows {shown}"
        return
    # the Slurm side shows one cloud's config whole and links the other two
    slurm_configs = [f"{cloud}-slurm.yaml" for cloud in QUICKSTARTS]
    assert shown and set(shown) <= set(slurm_configs), shown
    for config in slurm_configs:
        assert f"(../examples/quickstart/{config})" in text, f"quickstart-slurm.md: no {config}"


STEPS = {
    "Prerequisites": ("quota",),
    "Terraform": ("terraform init", "terraform apply"),
    "The controller config": (),
    "Validate, plan, run": ("gpu-autoscaler validate", "gpu-autoscaler plan", "gpu-autoscaler run"),
    "What to check": ("/metrics", "gpu_autoscaler_pending_gpus", "gpu_autoscaler_instances"),
    "Tear down": ("terraform destroy",),
}


@pytest.mark.parametrize("name", ("aws", "gcp", "azure"))
def test_each_cloud_doc_has_every_step(name: str) -> None:
    text = doc(name).read_text()
    headings = [line[3:] for line in text.splitlines() if line.startswith("## ")]
    found = [h for h in headings if h in STEPS]
    assert found == list(STEPS), f"{doc(name).name}: sections {headings}"
    for step, words in STEPS.items():
        section = text.split(f"## {step}\n", 1)[1].split("\n## ", 1)[0]
        for word in words:
            assert word in section, f"{doc(name).name}, {step}: no {word!r}"
    assert "docs/quickstart-slurm.md" in text or "quickstart-slurm.md" in text
    assert f"terraform/examples/{name}-quickstart" in text


def test_the_slurm_doc_covers_the_slurm_side() -> None:
    text = doc("slurm").read_text()
    for word in (
        "slurm.conf",
        "Nodeset=cloud-spot Feature=market-spot",
        "PartitionName=gpu-spot",
        "PartitionName=gpu-od Nodes=cloud-on-demand",
        "MaxNodeCount",
        "munge",
        "join_user_data",
        "market-spot",
        "gpu-targets-from-slurm.sh",
        "gpu-autoscaler-agent",
        "gpu-autoscaler validate",
        "gpu-autoscaler plan",
        "gpu-autoscaler run",
    ):
        assert word in text, f"quickstart-slurm.md does not say {word!r}"


def anchors(path: Path) -> set[str]:
    """GitHub's anchors for a Markdown file's headings."""
    found = set()
    for line in path.read_text().splitlines():
        if line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            found.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return found


@pytest.mark.parametrize("name", DOC_NAMES)
def test_each_doc_links_and_names_only_what_exists(name: str) -> None:
    path = doc(name)
    text = path.read_text()
    for target in LINK.findall(text):
        if target.startswith(("http://", "https://")):
            continue
        file, _, anchor = target.partition("#")
        linked = (path.parent / file).resolve() if file else path
        assert linked.exists(), f"{path.name} links {target}, which does not exist"
        if anchor:
            assert anchor in anchors(linked), f"{path.name} links {target}: no such heading"
    for mentioned in REPO_PATH.findall(text):
        assert (ROOT / mentioned).exists(), f"{path.name} names {mentioned}, which does not exist"


def test_the_readme_links_every_quickstart() -> None:
    readme = (ROOT / "README.md").read_text()
    for name in DOC_NAMES:
        assert f"(docs/quickstart-{name}.md)" in readme


# -- scaling, against each cloud's emulator -------------------------------------------------------


@contextmanager
def controller(config: dict[str, Any], tmp_path: Path) -> Iterator[tuple[Path, int]]:
    """`gpu-autoscaler run` on the config, ticking every second, its metrics on a free port; on
    leaving, SIGTERM and exit status 0."""
    port = free_port()
    config = {
        **config,
        "tick_seconds": 1,
        "metrics": {"listen": {"host": "127.0.0.1", "port": port}},
        "journal": {"sqlite_path": str(tmp_path / "journal.db")},
        # no waiting out the boot time and the scale-down cool-down the doc tells of
        "limits": {**config["limits"], "scale_down_cooldown_s": 0},
        "pools": [{**pool, "boot_seconds": 0} for pool in config["pools"]],
    }
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    log = tmp_path / "controller.log"
    with log.open("w") as sink:
        process = subprocess.Popen(
            [sys.executable, "-m", "autoscaler.cli", "run", "--config", str(path)],
            stdout=sink,
            stderr=subprocess.STDOUT,
            env=dict(os.environ),
        )
    try:
        yield log, port
    finally:
        process.send_signal(signal.SIGTERM)
        code = process.wait(timeout=bound(60))
    assert code == 0, log.read_text()[-3000:]


def metric(port: int, name: str, **labels: str) -> float | None:
    text = (
        urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=bound(30))
        .read()
        .decode()
    )
    for line in text.splitlines():
        series, _, value = line.rpartition(" ")
        if series.split("{", 1)[0] != name:
            continue
        if all(f'{key}="{val}"' in series for key, val in labels.items()):
            return float(value)
    return None


def events(log: Path) -> list[dict[str, Any]]:
    found = []
    for line in log.read_text().splitlines():
        if line.startswith("{"):
            found.append(json.loads(line))
    return found


def scales_up_and_down(
    config: dict[str, Any],
    tmp_path: Path,
    add_jobs: Callable[[int], None],
    drop_jobs: Callable[[], None],
    instances: Callable[[], Counter[str]],
    check_up: Callable[[], None] = lambda: None,
) -> None:
    """What each cloud quickstart's "What to check" says happens; ``check_up`` looks at the
    instances while they are up."""
    add_jobs(3)
    with controller(config, tmp_path) as (log, port):
        waiting(
            log,
            "the spot pool's two instances and the on-demand fallback's one",
            lambda: instances() == Counter(WANTED),
        )
        waiting(log, "the metrics of a tick that saw them", lambda: _counted(port))
        assert metric(port, "gpu_autoscaler_pending_gpus") == 3
        assert metric(port, "gpu_autoscaler_demand_known") == 1
        assert metric(port, "gpu_autoscaler_source_up", kind="queue", source="work") == 1
        launches = metric(port, "gpu_autoscaler_actions_total", kind="launch", outcome="ok")
        assert launches is not None and launches >= 2
        launched = [
            e for e in events(log) if e.get("action") == "launch" and e.get("outcome") == "ok"
        ]
        assert sorted(e["pool"] for e in launched) == ["gpu-on-demand", "gpu-spot"], launched
        check_up()
        drop_jobs()
        waiting(log, "every instance to be given back", lambda: not instances())
        waiting(log, "no pending GPUs", lambda: metric(port, "gpu_autoscaler_pending_gpus") == 0)
    given_back = {
        (e["action"], e.get("pool"))
        for e in events(log)
        if e.get("action") in ("drain", "terminate") and e.get("outcome") == "ok"
    }
    assert given_back == {(a, p) for a in ("drain", "terminate") for p in WANTED}, given_back
    assert "Traceback" not in log.read_text()


def waiting(log: Path, what: str, condition: Callable[[], bool]) -> None:
    """Wait on the condition with the suite's generous bound; a timeout shows the controller's
    last lines."""
    try:
        wait_for(what, lambda: condition() or None)
    except AssertionError as exc:
        raise AssertionError(
            f"{exc}; the controller's log ends:\n{log.read_text()[-4000:]}"
        ) from None


def _counted(port: int) -> bool:
    return all(
        (metric(port, "gpu_autoscaler_instances", pool=pool) or 0) >= 1
        and metric(port, "gpu_autoscaler_desired_instances", pool=pool) == count
        for pool, count in WANTED.items()
    )


def quickstart_config(name: str) -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((CONFIGS / name).read_text())
    return loaded


def test_the_aws_quickstart_scales_its_spot_pool_against_moto(aws: str, tmp_path: Path) -> None:
    ec2 = boto3.client("ec2", region_name=AWS_REGION, endpoint_url=aws)
    sqs = boto3.client("sqs", region_name=AWS_REGION, endpoint_url=aws)
    config = quickstart_config("aws.yaml")
    template = config["pools"][0]["options"]["launch_template"]["name"]
    ec2.create_launch_template(
        LaunchTemplateName=template, LaunchTemplateData={"ImageId": "ami-12c6146b"}
    )
    subnets = sorted(
        s["SubnetId"]
        for s in ec2.describe_subnets()["Subnets"]
        if s["DefaultForAz"] and s["AvailabilityZone"] in ("us-east-1a", "us-east-1b")
    )
    work = sqs.create_queue(QueueName=config["sources"][0]["settings"]["queue_url"].rsplit("/")[-1])
    notices = sqs.create_queue(
        QueueName=config["providers"]["aws"]["interruption_queue_url"].rsplit("/")[-1]
    )
    config["providers"]["aws"].update(
        endpoint_url=aws, interruption_queue_url=notices["QueueUrl"], queue_wait_s=1
    )
    config["sources"][0]["settings"].update(queue_url=work["QueueUrl"], endpoint_url=aws)
    for pool in config["pools"]:
        pool["options"]["subnets"] = subnets

    def instances() -> Counter[str]:
        found = ec2.describe_instances(
            Filters=[
                {"Name": f"tag:{FLEET_TAG}", "Values": [FLEET]},
                {"Name": "instance-state-name", "Values": ["pending", "running"]},
            ]
        )["Reservations"]
        return Counter(
            {t["Key"]: t["Value"] for t in i["Tags"]}[POOL_TAG]
            for r in found
            for i in r["Instances"]
        )

    def add_jobs(count: int) -> None:
        for i in range(count):
            sqs.send_message(QueueUrl=work["QueueUrl"], MessageBody=json.dumps({"job": i}))

    def check_up() -> None:
        """The spot pool's instances are spot ones, the fallback's are not, and both come from
        the launch template in the subnets the config names."""
        found = [
            i
            for r in ec2.describe_instances(
                Filters=[{"Name": "instance-state-name", "Values": ["pending", "running"]}]
            )["Reservations"]
            for i in r["Instances"]
        ]
        markets = Counter(
            ({t["Key"]: t["Value"] for t in i["Tags"]}[POOL_TAG], i.get("InstanceLifecycle"))
            for i in found
        )
        assert markets == Counter({("gpu-spot", "spot"): 2, ("gpu-on-demand", None): 1})
        assert {i["SubnetId"] for i in found} <= set(subnets)

    scales_up_and_down(
        config,
        tmp_path,
        add_jobs,
        lambda: sqs.purge_queue(QueueUrl=work["QueueUrl"]),
        instances,
        check_up,
    )


def redis_jobs(
    server: RedisServer, settings: dict[str, Any]
) -> tuple[Callable[[int], None], Callable[[], None]]:
    """The doc's demo on a Redis stream: make the consumer group, add jobs, drop them."""
    client = server.client()
    key, group = settings["key"], settings["group"]
    client.delete(key)
    client.xgroup_create(key, group, id="$", mkstream=True)

    def add(count: int) -> None:
        for i in range(count):
            client.xadd(key, {"job": str(i)})

    def drop() -> None:
        client.xtrim(key, maxlen=0)

    return add, drop


def test_the_gcp_quickstart_scales_its_spot_pool_against_the_emulator(
    gcp: ComputeEmulator, redis_server: RedisServer, tmp_path: Path
) -> None:
    config = quickstart_config("gcp.yaml")
    config["providers"]["gcp"].update(project=GCP_PROJECT, endpoint=gcp.url)
    settings = config["sources"][0]["settings"]
    settings["url"] = redis_server.url
    add, drop = redis_jobs(redis_server, settings)

    def instances() -> Counter[str]:
        with gcp.lock:
            live = [
                vm
                for vm in gcp.instances.values()
                if vm["status"] in ("PROVISIONING", "STAGING", "RUNNING")
            ]
        return Counter(tags_from_labels(vm.get("labels", {}))[POOL_TAG] for vm in live)

    def check_up() -> None:
        """What the pools' options put on each VM: Spot or not, the subnetwork, the nodes'
        service account and the driver's metadata."""
        with gcp.lock:
            made = [json.loads(json.dumps(vm)) for vm in gcp.instances.values()]
        options = config["pools"][0]["options"]
        for vm in made:
            pool = tags_from_labels(vm["labels"])[POOL_TAG]
            spot = vm.get("scheduling", {}).get("provisioningModel") == "SPOT"
            assert spot is (pool == "gpu-spot"), vm.get("scheduling")
            assert vm["networkInterfaces"][0]["subnetwork"].endswith(options["subnetwork"])
            assert [a["email"] for a in vm["serviceAccounts"]] == [
                options["service_account"]["email"]
            ]
            items = {i["key"]: i["value"] for i in vm["metadata"]["items"]}
            assert items == {"install-nvidia-driver": "True"}

    scales_up_and_down(config, tmp_path, add, drop, instances, check_up)


def test_the_azure_quickstart_scales_its_spot_pool_against_the_emulator(
    azure_emulator: ArmEmulator, redis_server: RedisServer, tmp_path: Path
) -> None:
    azure_emulator.reset()
    config = quickstart_config("azure.yaml")
    config["providers"]["azure"].update(
        subscription_id=AZURE_SUBSCRIPTION,
        resource_group=RESOURCE_GROUP,
        endpoint=azure_emulator.url,
        retail_prices_url=azure_emulator.prices_url,
    )
    settings = config["sources"][0]["settings"]
    settings["url"] = redis_server.url
    settings["key"] = "gpu-work-azure"
    add, drop = redis_jobs(redis_server, settings)

    def instances() -> Counter[str]:
        return Counter(
            vm.body.get("tags", {}).get("gpu-autoscaler.pool", "?")
            for vm in azure_emulator.live()
            if vm.body.get("tags", {}).get("gpu-autoscaler.fleet") == FLEET
        )

    def check_up() -> None:
        """The spot pool's VMs are Spot ones, the fallback's are not, and both join the subnet
        the config names."""
        options = config["pools"][0]["options"]
        for vm in azure_emulator.live():
            properties = vm.body["properties"]
            pool = vm.body["tags"]["gpu-autoscaler.pool"]
            assert properties.get("priority", "Regular") == (
                "Spot" if pool == "gpu-spot" else "Regular"
            )
            assert options["subnet_id"] in json.dumps(properties["networkProfile"])

    scales_up_and_down(config, tmp_path, add, drop, instances, check_up)


# -- the Slurm quickstart's targets script ---------------------------------------------------------


def test_the_targets_script_lists_the_cloud_nodes_slurm_knows(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    """A dynamic node joined as the join script joins one (``slurmd -Z`` with the autoscaler's
    feature) is listed at the address it registered from, named for the scrape source; the
    on-prem nodes, without the feature, are not."""
    name = "i-0quickstart"
    conf = f"Gres=gpu:1 Feature={slurm_cluster.cloud_feature},market-spot,pool-gpu-spot"
    subprocess.run(
        ["slurmd", "-Z", "-N", name, "--conf", conf],
        env=slurm_cluster.env,
        check=True,
        capture_output=True,
        timeout=bound(60),
    )
    try:
        wait_for(
            "the cloud node to join",
            lambda: name in slurm_cluster.run("sinfo", "-h", "-N", "-o", "%N") or None,
        )
        address = slurm_cluster.node_field(name, "NodeAddr")
        out = tmp_path / "gpu-targets.json"
        done = subprocess.run(
            ["sh", str(TARGETS_SCRIPT), str(out)],
            env=slurm_cluster.env,
            capture_output=True,
            text=True,
            timeout=bound(60),
            check=False,
        )
        assert done.returncode == 0, done.stderr
        assert json.loads(out.read_text()) == [
            {"targets": [f"{address}:9400"], "labels": {"node": name}}
        ]
        source = ScrapeTelemetrySource.from_config(
            {"targets_file": str(out), "node_label": "node"}, "gpus"
        )
        try:
            assert [(t.url, t.node) for t in source.targets()] == [
                (f"http://{address}:9400/metrics", name)
            ]
        finally:
            source.close()
    finally:
        stop_pid_files([slurm_cluster.root / f"slurmd-{name}.pid"])
        wait_for(
            "the cloud node to be forgotten",
            lambda: _deleted(slurm_cluster, name) or None,
        )


def _deleted(cluster: SlurmCluster, name: str) -> bool:
    subprocess.run(
        ["scontrol", "delete", f"nodename={name}"],
        env=cluster.env,
        capture_output=True,
        timeout=bound(60),
        check=False,
    )
    return name not in cluster.run("sinfo", "-h", "-N", "-o", "%N")


def test_the_targets_script_keeps_the_last_file_when_sinfo_fails(tmp_path: Path) -> None:
    out = tmp_path / "gpu-targets.json"
    out.write_text("[]\n")
    done = subprocess.run(
        ["sh", str(TARGETS_SCRIPT), str(out)],
        env={**os.environ, "SINFO": "false"},
        capture_output=True,
        text=True,
        timeout=bound(60),
        check=False,
    )
    assert done.returncode != 0
    assert out.read_text() == "[]\n"
    assert [p.name for p in tmp_path.iterdir()] == ["gpu-targets.json"], "no temporary left"
