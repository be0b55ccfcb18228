"""A real Slurm 22.05 with real accounting, for the ``sacct`` importer's tests: MariaDB (Debian's
``mariadb-server``) on a loopback port with its own data folder, ``slurmdbd`` storing into it,
and the test cluster of ``slurm_cluster`` (munge, slurmctld, two slurmds with four fake A100s
each) sending its records to that slurmdbd, so ``sacct --json`` and ``sacct -P`` answer as they
do on a site.

MariaDB starts on an empty data folder with ``--skip-grant-tables`` (no system tables to
install: about a second instead of ``mariadb-install-db``'s seven); slurmdbd creates its own
database in it. The cluster tracks ``gres/gpu`` (``AccountingStorageTRES``), which slurmctld
accepts only with a slurmdbd, so this cluster is started here rather than by
``slurm_cluster.start_slurm_cluster``, from the same configuration with accounting switched on,
and a ``parked`` partition that is down (a job submitted there waits until cancelled). Every
daemon is stopped by its pid file.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from slurm_cluster import (
    GPU_MODEL,
    GPUS_PER_NODE,
    ONPREM_NODES,
    START_TIMEOUT_S,
    SlurmCluster,
    _all_idle,
    _slurm_conf,
    _start_munge,
    free_port,
    stop_pid_files,
    stop_slurm_cluster,
    wait_for,
)
from waits import bound

PARKED = "parked"


@dataclass(frozen=True)
class Accounting:
    """The cluster, the pid files of its database and slurmdbd, and the database's process
    (this process started it, so it reaps it)."""

    cluster: SlurmCluster
    database_pid: Path
    slurmdbd_pid: Path
    database: list[subprocess.Popen[bytes]]


def _start_mariadb(root: Path, started: list[subprocess.Popen[bytes]]) -> int:
    data = root / "mariadb"
    data.mkdir()
    port = free_port()
    pid_file = root / "mariadbd.pid"  # stopped by it, as every daemon here
    process = subprocess.Popen(
        [
            "mariadbd",
            "--no-defaults",
            "--user=root",
            f"--datadir={data}",
            f"--socket={root / 'mariadbd.sock'}",
            f"--port={port}",
            "--bind-address=127.0.0.1",
            "--skip-grant-tables",
            "--skip-name-resolve",
            "--skip-log-bin",
            f"--pid-file={pid_file}",
            f"--log-error={root / 'mariadbd.log'}",
            "--innodb-buffer-pool-size=32M",
            "--innodb-log-file-size=8M",
        ],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    started.append(process)

    def ready() -> bool:
        done = subprocess.run(
            ["mariadb", "--no-defaults", "-h127.0.0.1", f"-P{port}", "-uroot", "-e", "select 1"],
            capture_output=True,
            timeout=bound(30),
            check=False,
        )
        return done.returncode == 0

    wait_for("MariaDB to take connections", ready, START_TIMEOUT_S)
    return port


def _dbd_conf(root: Path, munge_socket: Path, database_port: int, dbd_port: int) -> str:
    return f"""\
AuthType=auth/munge
AuthInfo=socket={munge_socket}
DbdHost=localhost
DbdAddr=127.0.0.1
DbdPort={dbd_port}
SlurmUser=root
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort={database_port}
StorageUser=root
StorageLoc=slurm_acct
PidFile={root}/slurmdbd.pid
LogFile={root}/slurmdbd.log
DebugLevel=info
"""


def _with_accounting(conf: str, munge_socket: Path, dbd_port: int) -> str:
    accounting = (
        "AccountingStorageType=accounting_storage/slurmdbd\n"
        "AccountingStorageHost=127.0.0.1\n"
        f"AccountingStoragePort={dbd_port}\n"
        # slurmdbd's connection is authenticated through this munge socket, not AuthInfo's
        f"AccountingStoragePass={munge_socket}\n"
        f"AccountingStorageTRES=gres/gpu,gres/gpu:{GPU_MODEL}\n"
        "JobAcctGatherType=jobacct_gather/none"
    )
    old = "AccountingStorageType=accounting_storage/none"
    if old not in conf:
        raise RuntimeError("slurm_cluster's configuration changed: no accounting line to replace")
    parked = f"PartitionName={PARKED} Nodes={ONPREM_NODES[0]} MaxTime=INFINITE State=DOWN\n"
    return conf.replace(old, accounting) + parked


def start_accounting(root: Path) -> Accounting:
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
        gpu_model=GPU_MODEL,
        cloud_feature="gpu-autoscaler",
        gpu_dir=gpu_dir,
    )
    accounting = Accounting(cluster, root / "mariadbd.pid", root / "slurmdbd.pid", [])
    try:
        munge_socket = _start_munge(munge_dir)
        database_port = _start_mariadb(root, accounting.database)
        dbd_port = free_port()
        dbd_conf = root / "slurmdbd.conf"  # slurmdbd reads it beside SLURM_CONF
        dbd_conf.write_text(_dbd_conf(root, munge_socket, database_port, dbd_port))
        dbd_conf.chmod(0o600)
        conf = _slurm_conf(root, munge_socket, gpu_dir)
        cluster.conf.write_text(_with_accounting(conf, munge_socket, dbd_port))
        (root / "gres.conf").write_text(
            f"AutoDetect=off\nName=gpu Type={GPU_MODEL} File={gpu_dir}/gpu[0-{GPUS_PER_NODE - 1}]\n"
        )
        subprocess.run(
            ["slurmdbd"], env=cluster.env, check=True, capture_output=True, timeout=bound(60)
        )

        def dbd_ready() -> bool:
            done = subprocess.run(
                ["sacctmgr", "-n", "-P", "list", "cluster"],
                env=cluster.env,
                capture_output=True,
                timeout=bound(60),
                check=False,
            )
            return done.returncode == 0

        wait_for("slurmdbd to answer", dbd_ready, START_TIMEOUT_S * 3)
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
        wait_for("the on-prem nodes to be idle", lambda: _all_idle(cluster), START_TIMEOUT_S * 3)
    except (AssertionError, subprocess.SubprocessError, OSError) as exc:
        tail = cluster.log_tail()
        stop_accounting(accounting)
        raise RuntimeError(f"the accounting test cluster did not come up: {exc}\n{tail}") from None
    return accounting


def stop_accounting(accounting: Accounting) -> None:
    stop_slurm_cluster(accounting.cluster)
    stop_pid_files([accounting.slurmdbd_pid])
    stop_pid_files([accounting.database_pid])
    for process in accounting.database:
        if process.poll() is None:
            process.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=bound(30))
    shutil.rmtree(accounting.cluster.root / "mariadb", ignore_errors=True)


@pytest.fixture(scope="module")
def slurm_accounting(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Accounting]:
    accounting = start_accounting(tmp_path_factory.mktemp("slurm-accounting"))
    try:
        yield accounting
    finally:
        stop_accounting(accounting)
