"""A real Slurm 22.05 cluster on loopback for the adapter's tests: munged with its own key and
socket, slurmctld and two slurmd nodes with four fake A100s each, and a ``Nodeset`` that dynamic
cloud nodes (``slurmd -Z``) join by the ``gpu-autoscaler`` feature.

A test may start a cluster of its own ``Layout``: other partitions, and *reserve nodes*, static
nodes declared ``State=FUTURE`` with features and a port of their own, which Slurm lists nowhere
until the test starts their slurmd (``start_reserve_node``) and forgets again when it stops them.
Only one dynamic node per host can listen on the cluster's ``SlurmdPort`` (slurmctld sends a
dynamic node's messages there, whatever port the node has), so a test that needs several cloud
nodes joins one through the boot script and brings the others up from the reserve.

Every port is free-picked and every file lives in the worker's own directory, so xdist workers
each run their own cluster. Daemons are stopped by the pids in their pid files, never by name.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import pytest
from waits import bound

ONPREM_NODES = ("gpu-a", "gpu-b")
GPUS_PER_NODE = 4
GPU_MODEL = "a100"
CLOUD_FEATURE = "gpu-autoscaler"
START_TIMEOUT_S = 60.0

T = TypeVar("T")

DEFAULT_PARTITIONS = (
    f"Nodeset=cloudnodes Feature={CLOUD_FEATURE}\n"
    "PartitionName=gpu Nodes={onprem},cloudnodes Default=YES MaxTime=INFINITE State=UP\n"
    "PartitionName=onprem Nodes={onprem} MaxTime=INFINITE State=UP\n"
)


@dataclass(frozen=True)
class Layout:
    """What a cluster has besides its on-prem nodes: ``partitions`` (slurm.conf lines; ``{onprem}``
    stands for the on-prem node list; keep an ``onprem`` partition of them, which ``reset`` waits
    on), ``reserve`` nodes (name -> features), ``scheduler`` (``SchedulerParameters``) and
    ``cred_expire`` (the job credential lifetime, 120 s by default, which is also how long a
    requeued job must stay off the node it left), ``shards_per_gpu`` (Slurm's GPU sharding,
    ``gres/shard``: each on-prem GPU shared by up to that many jobs; 0, the default: none), and
    ``gpu_type`` (the on-prem GPUs' gres type; a MIG profile's, ``a100_1g.10gb``, makes each fake
    GPU a MIG instance as a site's ``AutoDetect=nvml`` names them: Slurm schedules an instance
    as a GPU of that type, and a type is only a name to it)."""

    partitions: str = DEFAULT_PARTITIONS
    reserve: tuple[tuple[str, str], ...] = ()
    scheduler: str | None = None
    cred_expire: int | None = None
    shards_per_gpu: int = 0
    gpu_type: str = GPU_MODEL


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@dataclass(frozen=True)
class SlurmCluster:
    root: Path
    conf: Path
    munge_dir: Path
    onprem_nodes: tuple[str, ...]
    gpus_per_node: int
    gpu_model: str
    cloud_feature: str
    gpu_dir: Path
    reserve_nodes: tuple[str, ...] = field(default=())

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def run(self, *args: str, timeout: float = 60.0) -> str:
        """Run a Slurm command, its ``timeout`` a ceiling scaled by the wait knob."""
        done = subprocess.run(
            list(args),
            env=self.env,
            capture_output=True,
            text=True,
            timeout=bound(timeout),
            check=False,
        )
        if done.returncode != 0:
            raise AssertionError(f"{' '.join(args)} failed ({done.returncode}): {done.stderr}")
        return done.stdout

    def sbatch(self, *args: str) -> str:
        out = self.run("sbatch", "--parsable", "--output=/dev/null", *args)
        return out.strip().split(";")[0]

    def cancel_all(self) -> None:
        self.run("scancel", "--full", "--user=root")

    def job_field(self, job_id: str, name: str) -> str:
        out = self.run("scontrol", "show", "job", job_id)
        for token in out.split():
            key, _, value = token.partition("=")
            if key == name:
                return value
        raise AssertionError(f"job {job_id} has no {name}: {out}")

    def node_field(self, node: str, name: str) -> str:
        out = self.run("scontrol", "show", "node", node)
        for token in out.split():
            key, _, value = token.partition("=")
            if key == name:
                return value
        raise AssertionError(f"node {node} has no {name}: {out}")

    def reset(self) -> None:
        """Cancel every job, resume the on-prem nodes and wait until the cluster is empty and
        idle, so the next test on this worker's cluster starts from nothing."""
        self.cancel_all()
        for node in self.onprem_nodes:
            subprocess.run(
                ["scontrol", "update", f"nodename={node}", "state=resume"],
                env=self.env,
                capture_output=True,
                check=False,
            )
        wait_for(
            "the cluster to be empty",
            lambda: not self.run("squeue", "-h") and _all_idle(self),
        )

    def log_tail(self, lines: int = 15) -> str:
        parts = []
        for log in sorted(self.root.glob("*.log")) + sorted(self.munge_dir.glob("*.log")):
            tail = log.read_text(errors="replace").splitlines()[-lines:]
            parts.append(f"--- {log.name}\n" + "\n".join(tail))
        return "\n".join(parts)


def wait_for(what: str, probe: Callable[[], T | None], timeout: float = 120.0) -> T:
    """Poll ``probe`` until it answers; ``timeout`` is a ceiling scaled by the wait knob."""
    timeout = bound(timeout)
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value is not None and value is not False:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(0.1)


def _slurm_conf(root: Path, munge_socket: Path, gpu_dir: Path, layout: Layout = Layout()) -> str:
    host = socket.gethostname().split(".")[0]
    shards = f",shard:{layout.shards_per_gpu * GPUS_PER_NODE}" if layout.shards_per_gpu else ""
    node_lines = "\n".join(
        f"NodeName={name} NodeAddr=127.0.0.1 NodeHostname={host} Port={free_port()} CPUs=8 "
        f"RealMemory=4000 Gres=gpu:{layout.gpu_type}:{GPUS_PER_NODE}{shards} State=UNKNOWN"
        for name in ONPREM_NODES
    )
    reserve_lines = "".join(
        f"NodeName={name} NodeAddr=127.0.0.1 NodeHostname={host} Port={free_port()} CPUs=8 "
        f"RealMemory=4000 Gres=gpu:{GPU_MODEL}:{GPUS_PER_NODE} Feature={features} State=FUTURE\n"
        for name, features in layout.reserve
    )
    onprem = ",".join(ONPREM_NODES)
    scheduler = f"SchedulerParameters={layout.scheduler}\n" if layout.scheduler else ""
    credential = f",cred_expire={layout.cred_expire}" if layout.cred_expire else ""
    return f"""\
ClusterName=autoscaler{os.getpid()}
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={free_port()}
SlurmUser=root
SlurmdUser=root
SlurmdPort={free_port()}
AuthType=auth/munge
AuthInfo=socket={munge_socket}{credential}
CredType=cred/munge
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool-%n
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd-%n.pid
SlurmctldLogFile={root}/slurmctld.log
SlurmdLogFile={root}/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SchedulerType=sched/backfill
PriorityType=priority/multifactor
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
GresTypes=gpu{",shard" if layout.shards_per_gpu else ""}
ReturnToService=2
SlurmdParameters=config_overrides
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
KillWait=1
MinJobAge=30
MaxNodeCount={len(ONPREM_NODES) + len(layout.reserve) + 4}
{scheduler}{node_lines}
{reserve_lines}{layout.partitions.replace("{onprem}", onprem)}"""


def _gres_conf(gpu_dir: Path, layout: Layout) -> str:
    """Four fake A100s (character devices: a GPU without ``File=`` is dropped silently); with
    sharding, each GPU's shards on a line of their own naming its device, which is how Slurm
    knows which GPU a shard is of (``Count`` is then the shards of that one GPU)."""
    lines = [
        "AutoDetect=off",
        f"Name=gpu Type={layout.gpu_type} File={gpu_dir}/gpu[0-{GPUS_PER_NODE - 1}]",
    ]
    if layout.shards_per_gpu:
        lines += [
            f"Name=shard Count={layout.shards_per_gpu} File={gpu_dir}/gpu{index}"
            for index in range(GPUS_PER_NODE)
        ]
    return "\n".join(lines) + "\n"


def _alive(pid: int) -> bool:
    """Whether the process runs; a zombie waiting for a reaper that never comes does not."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


def stop_pid_files(pid_files: list[Path]) -> None:
    """SIGTERM every daemon at once, then SIGKILL whatever is still up after ten seconds (a
    grace period scaled by the wait knob: a daemon saving its state on a busy machine is slow)."""
    pids = []
    for pid_file in pid_files:
        try:
            pid = int(pid_file.read_text().strip())
            os.kill(pid, signal.SIGTERM)
        except (OSError, ValueError):
            continue
        pids.append(pid)
    deadline = time.monotonic() + bound(10)
    while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    for pid in pids:
        if _alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def _start_munge(munge_dir: Path) -> Path:
    (munge_dir / "munge.key").write_bytes(os.urandom(1024))
    shutil.chown(munge_dir, "munge", "munge")
    shutil.chown(munge_dir / "munge.key", "munge", "munge")
    (munge_dir / "munge.key").chmod(0o400)
    munge_socket = munge_dir / "munge.socket"
    subprocess.run(
        [
            "runuser",
            "-u",
            "munge",
            "--",
            "munged",
            f"--key-file={munge_dir / 'munge.key'}",
            f"--socket={munge_socket}",
            f"--pid-file={munge_dir / 'munged.pid'}",
            f"--seed-file={munge_dir / 'munged.seed'}",
            f"--log-file={munge_dir / 'munged.log'}",
        ],
        check=True,
        capture_output=True,
        timeout=bound(60),
    )
    return munge_socket


def start_slurm_cluster(root: Path, layout: Layout = Layout()) -> SlurmCluster:
    """Start munged, slurmctld and the on-prem slurmds; wait until every node is idle."""
    munge_dir = Path(tempfile.mkdtemp(prefix="autoscaler-munge-"))
    munge_dir.chmod(0o755)
    gpu_dir = root / "dev"
    gpu_dir.mkdir()
    for index in range(GPUS_PER_NODE):
        os.mknod(gpu_dir / f"gpu{index}", 0o666 | 0o020000, os.makedev(1, 3))
    (root / "state").mkdir()
    cluster = SlurmCluster(
        root=root,
        conf=root / "slurm.conf",
        munge_dir=munge_dir,
        onprem_nodes=ONPREM_NODES,
        gpus_per_node=GPUS_PER_NODE,
        gpu_model=layout.gpu_type,
        cloud_feature=CLOUD_FEATURE,
        gpu_dir=gpu_dir,
        reserve_nodes=tuple(name for name, _ in layout.reserve),
    )
    try:
        munge_socket = _start_munge(munge_dir)
        cluster.conf.write_text(_slurm_conf(root, munge_socket, gpu_dir, layout))
        (root / "gres.conf").write_text(_gres_conf(gpu_dir, layout))
        subprocess.run(
            ["slurmctld", "-i"], env=cluster.env, check=True, capture_output=True, timeout=bound(60)
        )
        for node in ONPREM_NODES:
            subprocess.run(
                ["slurmd", "-N", node],
                env=cluster.env,
                check=True,
                capture_output=True,
                timeout=bound(60),
            )
        wait_for("the on-prem nodes to be idle", lambda: _all_idle(cluster), START_TIMEOUT_S)
    except (AssertionError, subprocess.SubprocessError, OSError) as exc:
        tail = cluster.log_tail()
        stop_slurm_cluster(cluster)
        raise RuntimeError(f"the test Slurm cluster did not come up: {exc}\n{tail}") from None
    return cluster


def _all_idle(cluster: SlurmCluster) -> bool:
    done = subprocess.run(
        ["sinfo", "-h", "-N", "-p", "onprem", "-o", "%N %t"],
        env=cluster.env,
        capture_output=True,
        text=True,
        timeout=bound(30),
        check=False,
    )
    states = dict(line.split() for line in done.stdout.splitlines() if line.strip())
    return done.returncode == 0 and all(states.get(n) == "idle" for n in ONPREM_NODES)


def start_reserve_node(cluster: SlurmCluster, name: str) -> None:
    """Bring a reserve node up: its slurmd registers it, and Slurm lists it idle, with its
    features, in the partitions its features put it in."""
    subprocess.run(
        ["slurmd", "-N", name],
        env=cluster.env,
        check=True,
        capture_output=True,
        timeout=bound(60),
    )


def stop_reserve_node(cluster: SlurmCluster, name: str) -> None:
    """Stop a reserve node's slurmd and put it back in the reserve (``State=FUTURE``), where no
    listing shows it; its jobs must be gone first."""
    stop_pid_files([cluster.root / f"slurmd-{name}.pid"])
    cluster.run("scontrol", "update", f"nodename={name}", "state=future")


def stop_slurm_cluster(cluster: SlurmCluster) -> None:
    stop_pid_files(sorted(cluster.root.glob("slurmd-*.pid")))
    stop_pid_files([cluster.root / "slurmctld.pid"])
    stop_pid_files([cluster.munge_dir / "munged.pid"])
    shutil.rmtree(cluster.munge_dir, ignore_errors=True)


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    cluster = start_slurm_cluster(tmp_path_factory.mktemp("slurm"))
    try:
        yield cluster
    finally:
        stop_slurm_cluster(cluster)
