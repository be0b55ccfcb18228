"""Issue 6: from an interruption notice to the checkpoint signal delivered to the job.

A. One notice, on a real Slurm 22.05 (munged, slurmctld, a dynamic cloud node joined by
   ``join-cloud-node.sh`` with fake GPUs, as ``tests/slurm_cluster.py`` starts them). A job whose
   batch script traps USR1 runs on the cloud node; the real ``Controller`` and ``Runner`` run with
   the real ``SlurmAdapter`` as queue source, node source and scheduler, a fake provider (it only
   lists the instance named like the node) and the real ``InboxServer`` on loopback. The notice is
   posted over HTTP as the node agent posts it; the figure runs from the post to the timestamp the
   trap writes (bash's ``$EPOCHREALTIME``, no fork). Each round starts a fresh controller and job.
B. A zone-wide reclaim: the same controller path with ``--nodes`` interrupted nodes in one tick.
   The adapter's ``bin_dir`` holds bash stand-ins for ``squeue`` (a ``squeue --json`` document of
   Slurm 22.05's shape: one checkpointing job per node, plus a job that cannot checkpoint on every
   fifth node), ``scancel``, ``scontrol`` and ``sinfo``; each logs its arrival time and arguments,
   so process start-up is part of the figure, as it is in production. The notices arrive through
   the provider's poll in one tick ("one tick"), and again posted over HTTP to the inbox by 32
   agents at once through the agent's own forwarder, retries included ("inbox", which may take
   more than one tick). The figure runs from the first notice to the last ``scancel`` logged.
   The adapter is queue source and scheduler here, not node source (``sinfo`` lists no nodes).

About a minute: part A's rounds wait for Slurm to start each job (about 3 s each).

Figures only; nothing is asserted. Needs root (munged) and the Slurm packages that
``scripts/install-test-services.sh`` installs.

    .venv/bin/python bench/bench_evacuate.py [--rounds 10] [--nodes 500] [--concurrency N]
        [--json OUT.json]
"""

from __future__ import annotations

import argparse
import copy
import json
import logging
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from slurm_cluster import (  # noqa: E402
    SlurmCluster,
    start_slurm_cluster,
    stop_pid_files,
    stop_slurm_cluster,
    wait_for,
)

from autoscaler.app.runner import Runner  # noqa: E402
from autoscaler.fleet.checkpoints import CheckpointLedger  # noqa: E402
from autoscaler.model import (  # noqa: E402
    Instance,
    InstanceState,
    InterruptionNotice,
    NoticeKind,
    Pool,
    PriceQuote,
)
from autoscaler.model.clock import SystemClock  # noqa: E402
from autoscaler.model.config import ControllerConfig  # noqa: E402
from autoscaler.model.records import TickReport  # noqa: E402
from autoscaler.ops.inbox import InboxServer, NoticeInbox  # noqa: E402
from autoscaler.sources.slurm import SlurmAdapter, SlurmSettings  # noqa: E402
from autoscaler.spi.provider import LaunchResult  # noqa: E402
from autoscaler.tick.controller import Controller  # noqa: E402
from autoscaler.tick.evacuate import Evacuator  # noqa: E402
from autoscaler.tick.observe import Signals  # noqa: E402
from autoscaler.tick.retry import RetryPolicy  # noqa: E402
from node_agent.forward import Delivery, Forwarder  # noqa: E402
from node_agent.metadata import AgentNotice, NoticeMetrics  # noqa: E402
from policies.cost_aware import CostAwareParams, CostAwarePolicy  # noqa: E402

SINGLE_TARGET_S = 1.0
RECLAIM_TARGET_S = 5.0
DEADLINE_S = 120.0
TOKEN = "bench-token"
PROVIDER = "bench"
POOL = "spot-a100"
CLOUD_NODE = "i-0bench0evacuate"
CHECKPOINT_COMMENT = "checkpoint_interval=600 checkpoint_duration=5 checkpoint_signal=USR1"
SQUEUE_SAMPLE = ROOT / "tests/data/slurm/squeue.json"
JOIN_SCRIPT = ROOT / "autoscaler/data/slurm/join-cloud-node.sh"


def pool() -> Pool:
    return Pool(
        name=POOL,
        provider=PROVIDER,
        region="r1",
        instance_type="p4d",
        gpus_per_instance=4,
        market="spot",
        boot_seconds=0,
    )


def running(instance_id: str) -> Instance:
    return Instance(
        id=instance_id,
        pool=POOL,
        state=InstanceState.RUNNING,
        launched_at=time.time() - 3600,
        request_id="bench",
        gpus=4,
    )


@dataclass
class BenchCloud:
    """The provider side, which is not what is measured: it lists the instances named like the
    Slurm nodes, hands out notices when told to (waking the run loop as a queue watcher does), and
    records what it is asked to launch or terminate."""

    instances: dict[str, Instance]
    name: str = PROVIDER
    notices: list[InterruptionNotice] = field(default_factory=list)
    launched: int = 0
    terminated: int = 0
    _wakeup: Callable[[], None] | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self, wakeup: Callable[[], None]) -> None:
        self._wakeup = wakeup

    def close(self) -> None:
        self._wakeup = None

    def deliver(self, notices: Sequence[InterruptionNotice]) -> None:
        with self._lock:
            self.notices.extend(notices)
        if self._wakeup is not None:
            self._wakeup()

    def list_instances(self, fleet_id: str) -> list[Instance]:
        return list(self.instances.values())

    def launch(
        self, pool: Pool, count: int, request_id: str, fleet_id: str, *, team: str | None = None
    ) -> LaunchResult:
        made = tuple(
            Instance(
                id=f"i-0new{self.launched + n:06d}",
                pool=pool.name,
                state=InstanceState.PENDING,
                launched_at=time.time(),
                request_id=request_id,
                gpus=pool.gpus_per_instance,
            )
            for n in range(count)
        )
        self.launched += count
        self.instances.update({i.id: i for i in made})
        return LaunchResult(made)

    def terminate(self, instance_ids: Sequence[str], request_id: str) -> None:
        self.terminated += len(instance_ids)

    def prices(self, pools: Sequence[Pool]) -> list[PriceQuote]:
        return [PriceQuote(pool=p.name, price_per_hour=10.0, as_of=time.time()) for p in pools]

    def poll_notices(self) -> list[InterruptionNotice]:
        with self._lock:
            taken, self.notices = self.notices, []
        return taken

    def acknowledge(self, notices: Sequence[InterruptionNotice]) -> None:
        """Nothing to delete: the notices were handed over in memory."""


class TimedSlurm(SlurmAdapter):
    """The real adapter, noting when each command it runs starts and ends (wall clock), so a
    round's time can be split into the commands of the tick."""

    def __init__(self, settings: SlurmSettings) -> None:
        super().__init__(settings)
        self.commands: list[tuple[str, float, float]] = []
        self._commands_lock = threading.Lock()

    def _run(self, *args: str) -> bytes:
        started = time.time()
        try:
            return super()._run(*args)
        finally:
            with self._commands_lock:
                self.commands.append((" ".join(args[:2]), started, time.time()))


class RecordingController(Controller):
    """The real controller, keeping each tick's report with its wall-clock start."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.reports: list[tuple[float, TickReport]] = []

    def tick(self) -> TickReport:
        started = time.time()
        report = super().tick()
        self.reports.append((started, report))
        return report


def build_controller(
    adapter: SlurmAdapter,
    cloud: BenchCloud,
    inbox: InboxServer,
    ledger: CheckpointLedger,
    node_source: bool,
    concurrency: int | None,
) -> RecordingController:
    config = ControllerConfig(fleet_id="bench", tick_seconds=3600, pools=(pool(),))
    controller = RecordingController(
        config,
        # the one cloud node runs one job on 1 of 4 GPUs: keep it for the notice, not consolidate it
        CostAwarePolicy(CostAwareParams(consolidate_below=None)),
        {PROVIDER: cloud},
        SystemClock(),
        scheduler=adapter,
        retry=RetryPolicy(attempts=1),
        signals=Signals(
            queues=(adapter,), nodes=adapter if node_source else None, notices=(inbox.inbox,)
        ),
        checkpoints=ledger,
    )
    if concurrency is not None and controller.evacuator is not None:
        # a knob for profiling only: the controller does not expose the pool size yet
        controller.evacuator.close()
        evacuator = Evacuator(
            adapter, ledger, replace(controller.evacuator.settings, concurrency=concurrency)
        )
        controller.evacuator = evacuator
        controller.actuator.evacuator = evacuator
    return controller


@contextmanager
def running_controller(
    adapter: SlurmAdapter,
    cloud: BenchCloud,
    node_source: bool = True,
    concurrency: int | None = None,
) -> Iterator[tuple[RecordingController, InboxServer]]:
    """A controller loop in its own thread with the inbox beside it, after its first tick (which
    adopts the listed instances); stopped and its evacuation pool shut on the way out."""
    ledger = CheckpointLedger()
    inbox = InboxServer(NoticeInbox(SystemClock()), TOKEN, checkpoints=ledger)
    controller = build_controller(adapter, cloud, inbox, ledger, node_source, concurrency)
    runner = Runner(controller, {PROVIDER: cloud}, background=[inbox])
    thread = threading.Thread(target=runner.run, name="controller", daemon=True)
    thread.start()
    try:
        wait_for("the first tick", lambda: len(controller.reports) >= 1, timeout=60)
        yield controller, inbox
    finally:
        runner.stop()
        thread.join(timeout=60)
        if controller.evacuator is not None:
            controller.evacuator.close()


def post_notice(port: int, instance_id: str, deadline: float) -> None:
    """As a node agent does: the agent's own forwarder, with its retries."""
    notice = AgentNotice(
        instance_id=instance_id,
        kind=NoticeKind.TERMINATE,
        deadline=deadline,
        source="bench",
        event_key=instance_id,
    )
    forwarder = Forwarder(f"http://127.0.0.1:{port}", TOKEN, NoticeMetrics())
    delivery = forwarder.send(notice)
    if delivery is not Delivery.DELIVERED:
        raise RuntimeError(f"the notice for {instance_id} was not delivered: {delivery}")


def spread(values: Sequence[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {
        "median_s": statistics.median(ordered),
        "p95_s": ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))],
        "max_s": ordered[-1],
        "min_s": ordered[0],
    }


# --- A: one notice on a real Slurm ------------------------------------------------------------


def join_cloud_node(cluster: SlurmCluster) -> Path:
    subprocess.run(
        ["sh", str(JOIN_SCRIPT)],
        env={
            **cluster.env,
            "GPU_AUTOSCALER_NODE_NAME": CLOUD_NODE,
            "GPU_AUTOSCALER_GPUS": str(cluster.gpus_per_node),
            "GPU_AUTOSCALER_GPU_TYPE": cluster.gpu_model,
            "GPU_AUTOSCALER_NODE_CONF": "CPUs=8 RealMemory=4000",
        },
        capture_output=True,
        check=True,
        timeout=15,
    )
    pid_file: Path = cluster.root / f"slurmd-{CLOUD_NODE}.pid"
    wait_for("the cloud node to be idle", lambda: node_idle(cluster), timeout=30)
    return pid_file


def node_idle(cluster: SlurmCluster) -> bool:
    """Idle and taking work: ``scontrol``'s state flags, as ``sinfo`` may show a dynamic node
    that has just been resumed as mixed."""
    flags = set(cluster.node_field(CLOUD_NODE, "State").split("+"))
    return "IDLE" in flags and not flags & {"DRAIN", "NOT_RESPONDING", "DOWN"}


def job_script(work: Path, round_: int) -> tuple[Path, Path, Path]:
    ready, signalled = work / f"ready-{round_}", work / f"signalled-{round_}"
    script = work / f"job-{round_}.sh"
    script.write_text(
        "#!/bin/bash\n"
        f"trap 'echo $EPOCHREALTIME > {signalled}.tmp; mv {signalled}.tmp {signalled}; exit 0' "
        "USR1\n"
        f"touch {ready}\n"
        "while true; do sleep 1 & wait $!; done\n"
    )
    return script, ready, signalled


def evacuating_tick(controller: RecordingController) -> tuple[float, TickReport] | None:
    return next(
        (
            (started, report)
            for started, report in list(controller.reports)
            if any(a.kind == "evacuate" for a in report.actions)
        ),
        None,
    )


def single_round(
    cluster: SlurmCluster, adapter: TimedSlurm, work: Path, round_: int
) -> dict[str, float]:
    script, ready, signalled = job_script(work, round_)
    job = cluster.sbatch(
        "-w", CLOUD_NODE, "--gres=gpu:1", f"--comment={CHECKPOINT_COMMENT}", str(script)
    )
    wait_for("the batch script to set its trap", ready.exists, timeout=30)
    cloud = BenchCloud({CLOUD_NODE: running(CLOUD_NODE)})
    with running_controller(adapter, cloud) as (controller, inbox):
        with adapter._commands_lock:
            adapter.commands.clear()
        posted = time.time()
        post_notice(inbox.port, CLOUD_NODE, posted + DEADLINE_S)
        accepted = time.time()
        wait_for("the trap to run", signalled.exists, timeout=30)
        delivered = float(signalled.read_text())
        tick_started, report = wait_for(
            "the notice's tick to end", lambda: evacuating_tick(controller), timeout=30
        )
        moves = [a.outcome for a in report.actions if a.kind == "evacuate"]
        if moves != ["checkpoint-asked"]:
            raise RuntimeError(f"round {round_}: job {job} was not asked to checkpoint: {moves}")
    with adapter._commands_lock:
        commands = list(adapter.commands)
    scancel = next(c for c in commands if c[0].startswith("scancel"))
    figures = {
        "notice_to_signal_s": delivered - posted,
        "post_accepted_s": accepted - posted,
        "post_to_tick_start_s": tick_started - posted,
        "tick_start_to_scancel_s": scancel[1] - tick_started,
        "scancel_s": scancel[2] - scancel[1],
        "scancel_end_to_trap_s": delivered - scancel[2],
        "tick_s": report.duration_s,
    }
    for name, started, ended in commands:
        if started < scancel[1]:
            key = name.replace(" ", "_").replace("-", "")
            figures[f"cmd_{key}_s"] = figures.get(f"cmd_{key}_s", 0.0) + ended - started
            figures[f"runs_{key}"] = figures.get(f"runs_{key}", 0.0) + 1
    figures["commands_before_scancel"] = float(sum(1 for c in commands if c[1] < scancel[1]))
    cluster.cancel_all()
    subprocess.run(
        ["scontrol", "update", f"nodename={CLOUD_NODE}", "state=resume"],
        env=cluster.env,
        capture_output=True,
        check=False,
    )
    wait_for(
        "the cloud node to be idle again",
        lambda: not cluster.run("squeue", "-h") and node_idle(cluster),
        timeout=30,
    )
    return figures


def single_notice(rounds: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-evacuate-") as tmp:
        work = Path(tmp)
        (work / "slurm").mkdir()
        cluster = start_slurm_cluster(work / "slurm")
        pid_file: Path | None = None
        try:
            pid_file = join_cloud_node(cluster)
            adapter = TimedSlurm(SlurmSettings(slurm_conf=str(cluster.conf)))
            runs = []
            for round_ in range(rounds):
                runs.append(single_round(cluster, adapter, work, round_))
                print(
                    f"  round {round_ + 1}/{rounds}: notice -> signal "
                    f"{runs[-1]['notice_to_signal_s'] * 1000:.0f} ms",
                    flush=True,
                )
        finally:
            if pid_file is not None:
                stop_pid_files([pid_file])
            stop_slurm_cluster(cluster)
    keys = sorted({k for run in runs for k in run})
    medians = {k: statistics.median(run.get(k, 0.0) for run in runs) for k in keys}
    return {
        "rounds": rounds,
        "notice_to_signal": spread([r["notice_to_signal_s"] for r in runs]),
        "medians": medians,
        "runs": runs,
    }


# --- B: a zone-wide reclaim against stand-in Slurm commands -----------------------------------


def reclaim_nodes(count: int) -> list[str]:
    return [f"i-0reclaim{n:05d}" for n in range(count)]


def squeue_document(nodes: Sequence[str]) -> dict[str, Any]:
    """One checkpointing job on each node, and one that cannot checkpoint on every fifth: real
    22.05 job records (the running job of the stored sample), renumbered and moved."""
    sample = json.loads(SQUEUE_SAMPLE.read_text())
    template = next(j for j in sample["jobs"] if j["job_state"] == "RUNNING")
    now = int(time.time())
    jobs = []
    job_id = 100_000
    for index, node in enumerate(nodes):
        kinds = [CHECKPOINT_COMMENT] + ([""] if index % 5 == 0 else [])
        for comment in kinds:
            job = copy.deepcopy(template)
            job_id += 1
            job.update(
                job_id=job_id,
                nodes=node,
                batch_host=node,
                comment=comment,
                start_time=now - 1800,
                submit_time=now - 1900,
                eligible_time=now - 1900,
                accrue_time=now - 1900,
            )
            job["job_resources"]["nodes"] = node
            for allocated in job["job_resources"]["allocated_nodes"]:
                allocated["nodename"] = node
            jobs.append(job)
    return {"meta": sample["meta"], "errors": [], "jobs": jobs}


def stand_in_bin(directory: Path, log: Path, squeue_json: Path) -> None:
    """bash stand-ins that log "<epoch s> <command> <args>" on arrival; ``squeue --json`` prints
    the document, ``squeue -h -j ID -o %T`` (a requeue's wait) says the job is pending."""
    logged = f'printf "%s %s %s\\n" "$EPOCHREALTIME" "$(basename "$0")" "$*" >> {log}\n'
    bodies = {
        "squeue": logged
        + f'if [ "$1" = "--json" ]; then exec cat {squeue_json}; fi\necho PENDING\n',
        "scancel": logged,
        "scontrol": logged,
        "sinfo": logged + 'echo \'{"meta": {}, "errors": [], "nodes": []}\'\n',
    }
    for name, body in bodies.items():
        script = directory / name
        script.write_text("#!/bin/bash\n" + body)
        script.chmod(0o755)


def read_log(log: Path, since: float) -> list[tuple[float, str, str]]:
    entries = []
    for line in log.read_text().splitlines():
        stamp, command, args = [*line.split(" ", 2), ""][:3]
        if float(stamp) >= since:
            entries.append((float(stamp), command, args))
    return entries


def reclaim(
    nodes: Sequence[str], work: Path, mode: str, concurrency: int | None
) -> dict[str, float]:
    log = work / f"commands-{mode}.log"
    log.touch()
    adapter = SlurmAdapter(SlurmSettings(bin_dir=str(work / "bin"), command_timeout_s=60))
    # the stand-ins log to the file named when they were written: point it at this run's log
    stand_in_bin(work / "bin", log, work / "squeue.json")
    cloud = BenchCloud({node: running(node) for node in nodes})
    with running_controller(adapter, cloud, False, concurrency) as (controller, inbox):
        first = len(controller.reports)
        started = time.time()
        deadline = started + DEADLINE_S
        if mode == "one-tick":
            cloud.deliver(
                [
                    InterruptionNotice(
                        instance_id=node,
                        pool=POOL,
                        kind=NoticeKind.TERMINATE,
                        received_at=started,
                        deadline=deadline,
                    )
                    for node in nodes
                ]
            )
        else:
            with ThreadPoolExecutor(32) as agents:
                list(agents.map(lambda node: post_notice(inbox.port, node, deadline), nodes))
        posted = time.time()

        wait_for(
            "every notice to be handled",
            lambda: sum(len(r.view.notices) for _, r in controller.reports[first:]) >= len(nodes),
            timeout=300,
        )
        reports = controller.reports[first:]
    entries = read_log(log, started)
    scancels = [e for e in entries if e[1] == "scancel"]
    requeues = [e for e in entries if e[1] == "scontrol" and e[2].startswith("requeue")]
    drains = [e for e in entries if e[1] == "scontrol" and "state=drain" in e[2]]
    asked = sum(1 for _, r in reports for a in r.actions if a.outcome == "checkpoint-asked")
    requeued = sum(1 for _, r in reports for a in r.actions if a.outcome == "requeued")
    failed = sum(1 for _, r in reports for a in r.actions if a.outcome == "failed")
    last_signal = max(e[0] for e in scancels) if scancels else float("nan")
    figures = {
        "nodes": float(len(nodes)),
        "ticks": float(len(reports)),
        "notices_posted_s": posted - started,
        "first_notice_to_last_signal_s": last_signal - started,
        "first_notice_to_last_requeue_s": (
            max(e[0] for e in requeues) - started if requeues else float("nan")
        ),
        "signals_logged": float(len(scancels)),
        "requeues_logged": float(len(requeues)),
        "checkpoint_asked": float(asked),
        "requeued": float(requeued),
        "failed": float(failed),
        "tick_s": sum(r.duration_s for _, r in reports),
        "commands_logged": float(len(entries)),
        "drains_logged": float(len(drains)),
        "first_notice_to_first_drain_s": drains[0][0] - started if drains else float("nan"),
        "drain_phase_s": drains[-1][0] - drains[0][0] if drains else float("nan"),
        "first_signal_s": min(e[0] for e in scancels) - started if scancels else float("nan"),
        "signal_phase_s": (
            max(e[0] for e in scancels) - min(e[0] for e in scancels) if scancels else float("nan")
        ),
    }
    return figures


def zone_reclaim(count: int, concurrency: int | None) -> dict[str, dict[str, float]]:
    nodes = reclaim_nodes(count)
    results = {}
    with tempfile.TemporaryDirectory(prefix="bench-evacuate-") as tmp:
        work = Path(tmp)
        (work / "bin").mkdir()
        (work / "squeue.json").write_text(json.dumps(squeue_document(nodes)))
        for mode in ("one-tick", "inbox"):
            results[mode] = reclaim(nodes, work, mode, concurrency)
    return results


def met(value: float, target: float) -> str:
    return "met" if value <= target else "NOT met"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10, help="single notices on real Slurm")
    parser.add_argument("--nodes", type=int, default=500, help="nodes in the zone-wide reclaim")
    parser.add_argument(
        "--concurrency",
        type=int,
        default=None,
        help="evacuation thread pool size for part B (default: the controller's own)",
    )
    parser.add_argument("--skip-slurm", action="store_true", help="part B only")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.ERROR)
    if shutil.which("slurmctld") is None and not args.skip_slurm:
        print("slurmctld is not installed: run scripts/install-test-services.sh", file=sys.stderr)
        return 1
    figures: dict[str, Any] = {}
    if not args.skip_slurm:
        print(f"A. one notice -> checkpoint signal on a real Slurm, {args.rounds} rounds")
        single = single_notice(args.rounds)
        figures["single"] = single
        spread_ = single["notice_to_signal"]
        medians = single["medians"]
        print(
            "  where the median goes: post accepted "
            f"{medians['post_accepted_s'] * 1000:.1f} ms; post -> tick start "
            f"{medians['post_to_tick_start_s'] * 1000:.1f} ms; tick start -> scancel "
            f"{medians['tick_start_to_scancel_s'] * 1000:.1f} ms "
            f"({medians['commands_before_scancel']:.0f} Slurm commands: "
            + ", ".join(
                f"{k[4:-2].replace('_', ' ')} x{medians['runs_' + k[4:-2]]:.0f} {v * 1000:.1f} ms"
                for k, v in medians.items()
                if k.startswith("cmd_")
            )
            + f"); scancel {medians['scancel_s'] * 1000:.1f} ms; scancel -> trap "
            f"{medians['scancel_end_to_trap_s'] * 1000:.1f} ms; whole tick "
            f"{medians['tick_s'] * 1000:.0f} ms"
        )
        print(
            f"A. notice -> signal delivered: median {spread_['median_s'] * 1000:.0f} ms, "
            f"p95 {spread_['p95_s'] * 1000:.0f} ms, max {spread_['max_s'] * 1000:.0f} ms over "
            f"{args.rounds} rounds (target: median <= {SINGLE_TARGET_S:g} s: "
            f"{met(spread_['median_s'], SINGLE_TARGET_S)})",
            flush=True,
        )
    pool_size = args.concurrency if args.concurrency is not None else "default"
    print(f"B. {args.nodes} simultaneous notices, stand-in Slurm commands, pool {pool_size}")
    reclaims = zone_reclaim(args.nodes, args.concurrency)
    figures["reclaim"] = reclaims
    for mode, run in reclaims.items():
        print(
            f"  {mode}: {run['ticks']:.0f} tick(s), notices in within "
            f"{run['notices_posted_s'] * 1000:.0f} ms; first drain "
            f"{run['first_notice_to_first_drain_s'] * 1000:.0f} ms, drains took "
            f"{run['drain_phase_s'] * 1000:.0f} ms ({run['drains_logged']:.0f}); first signal at "
            f"{run['first_signal_s'] * 1000:.0f} ms, signals took "
            f"{run['signal_phase_s'] * 1000:.0f} ms; last requeue at "
            f"{run['first_notice_to_last_requeue_s'] * 1000:.0f} ms; ticks "
            f"{run['tick_s'] * 1000:.0f} ms; {run['commands_logged']:.0f} commands run"
        )
        print(
            f"B. {mode}: first notice -> last signal out {run['first_notice_to_last_signal_s']:.2f}"
            f" s; {run['signals_logged']:.0f} signals and {run['requeues_logged']:.0f} requeues "
            f"logged ({run['checkpoint_asked']:.0f} asked, {run['requeued']:.0f} requeued, "
            f"{run['failed']:.0f} failed) (target: all signals out within "
            f"{RECLAIM_TARGET_S:g} s: "
            f"{met(run['first_notice_to_last_signal_s'], RECLAIM_TARGET_S)})",
            flush=True,
        )
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
