"""Parity between the simulator and live: one trace segment, two worlds, the same decisions.

The simulator's figures are only as honest as its world is like the live one. This module replays
a short segment (``tests/data/parity``) through ``simulate`` and through the real controller
driving a real Slurm and moto's EC2, and writes down, tick by tick and in the same words for
both, what each decided and where each job was:

* every action of the tick (launch, drain, terminate, evict, evacuate, ...): its kind, pool,
  counts and outcome, the nodes it touched and the job it moved. Nodes are named so that the
  two worlds' names meet: on-prem nodes by name, cloud instances by pool and launch order
  (``aws-spot#1``, the first instance launched in ``aws-spot``); jobs by their trace id;
* the guard's clamps and whether the tick was held;
* where every submitted job was as the tick saw it: ``pending``, ``done`` or its node.

Timing aside, by construction: the live controller runs on a ``ManualClock`` set to the tick
times the simulator uses; a job is submitted just before the tick at its submit time; the
instances a tick launches boot (and the simulator's boot within a tick, ``boot_seconds`` <
``tick_seconds``) before the next tick, and join Slurm together, as the simulator's do (Slurm's
partitions are down while they join, so no job starts on the first to come up while the others
are still on their way); and a job ends on command, not on a timer: it waits for a marker file,
touched just before the tick at which the simulator has ended it. With submit times and
durations whole numbers of ticks that tick is fixed by when the job started: a job that started
at a tick (just before it: at its submission or in room freed then; or just after it: judged
spot-safe by it, as the simulator starts such a job right after the tick) ends ``duration /
tick`` ticks later; one that started on an instance that booted after a tick ends a tick after
that, as in the simulator it started ``boot_seconds`` after the tick and so ends between ticks
too. After each phase the live side waits until Slurm has settled: every job ended is gone and
every pending job has been looked at by Slurm's scheduler since the last change, so a job that
can start has.
"""

from __future__ import annotations

import datetime
import difflib
import json
import math
import os
import re
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from unittest import mock

from exporter_server import Answer, ExporterServer
from slurm_cluster import (
    GPU_MODEL,
    GPUS_PER_NODE,
    ONPREM_NODES,
    Layout,
    SlurmCluster,
    start_reserve_node,
    stop_reserve_node,
    wait_for,
)
from waits import bound

from autoscaler.app.assembly import Mode, Parts, build_controller
from autoscaler.fleet.telemetry import IdleTracker
from autoscaler.model import FleetView, Plan, Pool
from autoscaler.model.clock import ManualClock
from autoscaler.model.records import TickReport
from autoscaler.sim import engine
from autoscaler.sim.engine import Prepared, TickSeen, prepare, simulate
from autoscaler.sim.scenario import LoadedScenario, PolicySpec, Scenario, load_scenario
from autoscaler.sim.scheduler import SimScheduler
from autoscaler.sim.trace import TraceJob
from autoscaler.sources.scrape import ScrapeSettings, ScrapeTelemetrySource
from autoscaler.sources.slurm import SlurmAdapter
from autoscaler.sources.slurm_join import join_environment, node_features
from autoscaler.spi.policy import Policy, load_policy
from autoscaler.tick.controller import Controller
from autoscaler.tick.observe import Signals
from autoscaler.tick.retry import RetryPolicy
from providers.aws import AwsProvider

DATA = Path(__file__).resolve().parent / "data" / "parity"
SCENARIO = DATA / "scenario.yaml"
JOIN_SCRIPT = Path(__file__).resolve().parent.parent / "autoscaler/data/slurm/join-cloud-node.sh"
PENDING = "pending"
DONE = "done"
# Generous bounds: the machine is a busy two-core box, and none of these is a timing assertion.
SETTLE_S = 90.0
BOOT_S = 60.0
JOB_GUARD_S = 900  # a job script ends by itself after about this long, whatever happens
SPOT_PARTITIONS = {"gpu": "gpu-spot"}
ON_DEMAND_PARTITIONS = {"gpu": "gpu-od"}
# The partitions in the order a judged spot-safe job lists them (on-prem first): the order they
# come back up in after instances joined, so that no job starts in a later one while an earlier
# one it lists is still down.
MANAGED = (*SPOT_PARTITIONS, *SPOT_PARTITIONS.values(), *ON_DEMAND_PARTITIONS.values())
# The cluster laid out as docs/slurm.md tells operators to ("In the placement's order: the
# on-demand twin"): on-prem nodes in gpu, spot and on-demand cloud nodes each in a twin of
# their own. Only the first on-prem node is in gpu (the segment's on-prem fleet is that one
# node); the other stays in the onprem partition, which SlurmCluster.reset waits on, and is not
# counted (the adapter reads the managed partitions only).
PARTITIONS = (
    "Nodeset=cloud-on-demand Feature=market-on-demand\n"
    "Nodeset=cloud-spot Feature=market-spot\n"
    f"PartitionName=gpu Nodes={ONPREM_NODES[0]} Default=YES MaxTime=INFINITE State=UP\n"
    "PartitionName=gpu-spot Nodes=cloud-spot MaxTime=INFINITE State=UP\n"
    "PartitionName=gpu-od Nodes=cloud-on-demand MaxTime=INFINITE State=UP\n"
    "PartitionName=onprem Nodes={onprem} MaxTime=INFINITE State=UP\n"
)
_SCHED_EVAL = re.compile(r"\bLastSchedEval=(\S+)")
_JOB_STATE = re.compile(r"\bJobState=(\S+)")
_JOB_ID = re.compile(r"\bJobId=(\d+)")


# --------------------------------------------------------------------------------------------
# The segment


@dataclass(frozen=True)
class Segment:
    """The scenario both worlds replay, checked to be one the live side can replay faithfully."""

    loaded: LoadedScenario
    prepared: Prepared

    @property
    def scenario(self) -> Scenario:
        return self.loaded.scenario

    @property
    def spec(self) -> PolicySpec:
        return self.scenario.policies[0]

    @property
    def tick_s(self) -> float:
        return self.scenario.controller.tick_seconds

    @property
    def jobs(self) -> list[TraceJob]:
        return self.prepared.selection.jobs

    @property
    def pools(self) -> tuple[Pool, ...]:
        return self.scenario.controller.pools

    def ticks(self) -> list[float]:
        """The regular tick times of the replay, from 0 to the end of the window."""
        count = math.floor(self.prepared.horizon_s / self.tick_s)
        return [k * self.tick_s for k in range(count + 1)]

    def in_ticks(self, seconds: float) -> int:
        return round(seconds / self.tick_s)

    def policy(self) -> Policy:
        return load_policy(self.spec.name, self.spec.params, where=self.loaded.source)


def load_segment(path: Path = SCENARIO) -> Segment:
    loaded = load_scenario(path)
    prepared = prepare(loaded)
    segment = Segment(loaded, prepared)
    problems = []
    for job in segment.jobs:
        for what, seconds in (("submit", job.submit), ("duration", job.duration)):
            if seconds % segment.tick_s:
                problems.append(f"job {job.id}: {what} {seconds:g} s is not whole ticks")
        if job.nodes != 1 or job.high_priority or job.gpu_models:
            problems.append(f"job {job.id}: only single-node jobs of no priority or model")
    for pool in segment.pools:
        if not 0 < pool.boot_seconds < segment.tick_s:
            problems.append(f"pool {pool.name}: boot_seconds must be within one tick")
        if pool.gpus_per_instance != GPUS_PER_NODE:
            problems.append(f"pool {pool.name}: the test's cloud nodes have {GPUS_PER_NODE} GPUs")
    onprem = [(n.name, n.gpus, n.count) for n in segment.scenario.onprem]
    if onprem != [(ONPREM_NODES[0], GPUS_PER_NODE, 1)]:
        problems.append(f"on-prem must be the test cluster's {ONPREM_NODES[0]} alone")
    if problems:
        raise ValueError(f"{path}: not a segment the live side can replay: {'; '.join(problems)}")
    return segment


# --------------------------------------------------------------------------------------------
# What a tick decided, in words both worlds share


class Labels:
    """Node names both worlds share: cloud instances by pool and launch order, others as they
    are named (on-prem nodes have the same names in both)."""

    def __init__(self) -> None:
        self._names: dict[str, str] = {}
        self._launched: dict[str, int] = {}

    def learn(self, report: TickReport) -> None:
        for action in report.actions:
            if action.kind != "launch" or action.pool is None:
                continue
            for instance_id in action.instance_ids:
                if instance_id not in self._names:
                    number = self._launched.get(action.pool, 0) + 1
                    self._launched[action.pool] = number
                    self._names[instance_id] = f"{action.pool}#{number}"

    def __call__(self, node: str) -> str:
        return self._names.get(node, node)


@dataclass(frozen=True)
class Act:
    """One action record, without its free-text detail and with shared names."""

    kind: str
    pool: str | None
    requested: int
    done: int
    outcome: str
    nodes: tuple[str, ...]
    job: str | None

    def line(self) -> str:
        text = f"{self.kind} {self.pool or '-'} {self.done}/{self.requested} {self.outcome}"
        if self.nodes:
            text += " " + ",".join(self.nodes)
        if self.job is not None:
            text += f" job {self.job}"
        return text


@dataclass(frozen=True)
class TickRecord:
    """What one tick did and saw. ``errors`` are shown with it but not compared: the worlds
    differ in what can fail (a command timing out on a busy machine), and what matters is
    whether the decisions differ."""

    at: float
    actions: tuple[Act, ...]
    clamps: tuple[str, ...]
    held: str | None
    placements: tuple[tuple[str, str], ...]
    errors: tuple[str, ...] = ()

    def key(self) -> tuple[object, ...]:
        return (self.at, self.actions, self.clamps, self.held, self.placements)

    def lines(self) -> list[str]:
        at = f"t={self.at:>5.0f}s"
        lines = [f"{at} {a.line()}" for a in self.actions] or [f"{at} (no action)"]
        lines += [f"{at} clamp {c}" for c in self.clamps]
        if self.held is not None:
            lines.append(f"{at} held: {self.held}")
        lines += [f"{at}   job {job}: {where}" for job, where in self.placements]
        lines += [f"{at}   (error, not compared: {e})" for e in self.errors]
        return lines


def record(
    report: TickReport,
    at: float,
    labels: Labels,
    seen: Mapping[str, str],
    trace_id: Callable[[str], str],
) -> TickRecord:
    """The tick in shared words: ``seen`` is where each job was as the tick saw it (a node of
    the world's own naming, pending or done), ``trace_id`` names a world's job by the trace."""
    labels.learn(report)
    actions = tuple(
        Act(
            a.kind,
            a.pool,
            a.requested,
            a.done,
            a.outcome,
            tuple(labels(i) for i in a.instance_ids),
            trace_id(a.job_id) if a.job_id is not None else None,
        )
        for a in report.actions
    )
    clamps = tuple(f"{c.rule} {c.pool or '-'} {c.requested}->{c.allowed}" for c in report.clamps)
    placements = tuple(
        (
            job,
            "+".join(labels(n) for n in where.split(","))
            if where not in (PENDING, DONE)
            else where,
        )
        for job, where in sorted(seen.items())
    )
    return TickRecord(at, actions, clamps, report.held, placements, tuple(report.errors))


def difference(sim: Sequence[TickRecord], live: Sequence[TickRecord]) -> str | None:
    """None while the live ticks so far are the simulator's; else both sides, tick by tick up
    to the first tick that differs, as a diff of the simulator's record to the live one."""
    for index, (ours, theirs) in enumerate(zip(sim, live, strict=False)):
        if ours.key() != theirs.key():
            return _shown(sim[: index + 1], live[: index + 1], ours.at)
    if len(live) > len(sim):
        return _shown(sim, live, live[len(sim)].at)
    return None


def _shown(sim: Sequence[TickRecord], live: Sequence[TickRecord], at: float) -> str:
    ours = [line for r in sim for line in r.lines()]
    theirs = [line for r in live for line in r.lines()]
    diff = difflib.unified_diff(ours, theirs, "simulator", "live", lineterm="", n=len(ours))
    return (
        f"the simulator and live first differ at t={at:g} s (- simulator, + live):\n"
        + "\n".join(list(diff)[2:])
    )


class Seeing:
    """The policy under test, wrapped to note where every job is as the tick sees it: ``look``
    is called when the controller asks the policy, after the tick has observed the world."""

    def __init__(self, inner: Policy) -> None:
        self.inner = inner
        self.look: Callable[[], dict[str, str]] = dict
        self.seen: dict[str, str] = {}

    def decide(self, view: FleetView) -> Plan:
        self.seen = {}
        self.seen = self.look()
        return self.inner.decide(view)


# --------------------------------------------------------------------------------------------
# The simulator's side


def replay_sim(segment: Segment) -> list[TickRecord]:
    """Every tick of ``simulate`` on the segment, with the jobs as each tick saw them."""
    labels = Labels()
    seeing = Seeing(segment.policy())
    records: list[TickRecord] = []
    schedulers: list[SimScheduler] = []

    class Watched(SimScheduler):
        """The simulator's scheduler, made known to the test when the replay builds it."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            schedulers.append(self)

    def look() -> dict[str, str]:
        return _sim_placements(schedulers[0])

    def trace_id(job_id: str) -> str:
        return schedulers[0].jobs[int(job_id)].trace.id

    def on_tick(seen: TickSeen) -> None:
        records.append(record(seen.report, seen.report.now, labels, seeing.seen, trace_id))

    seeing.look = look
    with mock.patch.object(engine, "SimScheduler", Watched):
        simulate(segment.prepared, segment.spec, policy=seeing, on_tick=on_tick)
    return records


def _sim_placements(scheduler: SimScheduler) -> dict[str, str]:
    where = {}
    for job in scheduler.jobs:
        if job.finished_at is not None:
            where[job.trace.id] = DONE
        elif job.members:
            where[job.trace.id] = ",".join(node.name for node in job.members)
        else:
            where[job.trace.id] = PENDING
    return where


def launched_pools(records: Sequence[TickRecord]) -> list[str]:
    """The pool of every instance the replay launched, in launch order."""
    return [a.pool or "" for r in records for a in r.actions if a.kind == "launch" for _ in a.nodes]


# --------------------------------------------------------------------------------------------
# The live side


def instance_name(number: int) -> str:
    """The id moto gives the ``number``-th instance the live side launches (from 1), and the
    name of the Slurm node waiting for it."""
    return f"i-0{number:016x}"


def layout(segment: Segment, pools: Sequence[str]) -> Layout:
    """The test cluster with one reserve node for each instance the simulator launched, named
    as moto will name the live instance and carrying the features the join script gives a node
    of its pool. Slurm 22.05 talks to a dynamic node only on the cluster's one SlurmdPort, so a
    host can run one dynamic node; reserve nodes are static, each on its own port."""
    by_name = {p.name: p for p in segment.pools}
    reserve = tuple(
        (instance_name(n), ",".join(node_features(by_name[pool])))
        for n, pool in enumerate(pools, start=1)
    )
    return Layout(
        partitions=PARTITIONS, reserve=reserve, scheduler="bf_interval=1,sched_interval=2"
    )


@dataclass
class LiveJob:
    trace: TraceJob
    marker: Path
    slurm_id: str | None = None
    started_tick: int | None = None  # the tick it started at, just before or just after it
    booted: bool = False  # it started on an instance that booted after that tick
    ended: bool = False

    def end_tick(self, ticks: int) -> int | None:
        """The tick before which the job ends: ``ticks`` (its duration) after the tick it
        started at, or one more when it started on an instance that booted after that tick."""
        if self.started_tick is None:
            return None
        return self.started_tick + ticks + self.booted


@dataclass
class LiveRun:
    """The segment live: the real controller with the Slurm adapter (queue, nodes, scheduler),
    the AWS provider on moto, GPU telemetry scraped over HTTP, on a clock set to the tick times."""

    segment: Segment
    cluster: SlurmCluster
    aws_url: str
    exporter: ExporterServer
    tmp: Path
    base: float = field(default_factory=lambda: float(math.floor(time.time())))
    records: list[TickRecord] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.clock = ManualClock(self.base)
        self.labels = Labels()
        self.seeing = Seeing(self.segment.policy())
        self.seeing.look = self._placements
        self.jobs = [LiveJob(job, self.tmp / f"{job.id}.end") for job in self.segment.jobs]
        self.up: dict[str, str] = {}  # cloud node -> pool, while booted
        self.pools = {p.name: p for p in self.segment.pools}
        config = self.segment.scenario.controller
        self.provider = AwsProvider.from_config(
            {
                "endpoint_url": self.aws_url,
                "price_catalog": str(DATA / "catalog.csv"),
                "advisor": str(DATA / "advisor.csv"),
            },
            list(config.pools),
            config.fleet_id,
            self.clock,
        )
        self.slurm = SlurmAdapter.from_config(
            {
                "slurm_conf": str(self.cluster.conf),
                "spot_partitions": SPOT_PARTITIONS,
                "on_demand_partitions": ON_DEMAND_PARTITIONS,
                "partitions": list(MANAGED),
            },
            "slurm",
        )
        self.targets = self.tmp / "gpu-targets.json"
        self.targets.write_text("[]")
        self.scrape = ScrapeTelemetrySource(
            ScrapeSettings(targets_file=self.targets), "gpus", self.clock
        )
        tracker = IdleTracker(
            self.segment.scenario.idle_util_pct,
            config.telemetry.window_s,
            config.telemetry.max_age_s,
        )
        self.controller: Controller = build_controller(
            config,
            Mode.LIVE,
            self.seeing,
            self.clock,
            Parts(
                {"aws": self.provider},
                Signals(
                    queues=(self.slurm,),
                    nodes=self.slurm,
                    telemetry=(self.scrape,),
                    tracker=tracker,
                ),
                self.slurm,
            ),
            incarnation="live",
            retry=RetryPolicy(attempts=2, sleep=lambda _s: None),
        ).controller
        self._by_slurm_id: dict[str, LiveJob] = {}

    def run(self) -> Iterator[TickRecord]:
        """Tick through the segment; each tick's record is given as soon as it is made, before
        the world reacts to it, so a caller can stop at the first difference."""
        for k, t in enumerate(self.segment.ticks()):
            self._before_tick(k, t)
            self._publish_telemetry()
            self.clock.set(self.base + t)
            report = self.controller.tick()
            self.records.append(record(report, t, self.labels, self.seeing.seen, self._trace_id))
            yield self.records[-1]
            self._after_tick(k, report)

    def close(self) -> None:
        """End every job (its script waits on its marker) and cancel what is left."""
        for job in self.jobs:
            job.marker.touch()
        self.cluster.cancel_all()
        self.provider.close()
        self.scrape.close()

    # -- phases ------------------------------------------------------------------------------

    def _before_tick(self, k: int, t: float) -> None:
        """Just before the tick at ``t``: jobs the simulator ended by then end, jobs submitted
        at ``t`` are submitted, and Slurm settles."""
        ending = [
            job
            for job in self.jobs
            if not job.ended and job.end_tick(self.segment.in_ticks(job.trace.duration)) == k
        ]
        for job in ending:
            job.marker.touch()
        if ending:
            wait_for(
                f"jobs {', '.join(j.trace.id for j in ending)} to end",
                lambda: not {j.slurm_id for j in ending} & set(self._queue()),
                SETTLE_S,
            )
            for job in ending:
                job.ended = True
        arriving = [job for job in self.jobs if job.trace.submit == t]
        for job in arriving:
            job.slurm_id = self._submit(job)
            self._by_slurm_id[job.slurm_id] = job
        if ending or arriving:
            self._settle()
        self._note_starts(k, set())

    def _after_tick(self, k: int, report: TickReport) -> None:
        """Between ticks: launched instances boot and join, terminated ones go, and Slurm
        settles (the tick may also have changed which partitions jobs may use)."""
        booting = [
            (instance_id, self.pools[action.pool])
            for action in report.actions
            if action.kind == "launch" and action.pool is not None
            for instance_id in action.instance_ids
        ]
        for action in report.actions:
            if action.kind == "terminate" and action.done:
                for instance_id in action.instance_ids:
                    self._shut(instance_id)
        if booting:
            self._boot_together(booting)
        self._settle()
        self._note_starts(k, {instance_id for instance_id, _ in booting})

    # -- jobs --------------------------------------------------------------------------------

    def _submit(self, job: LiveJob) -> str:
        args = [f"--job-name={job.trace.id}", f"--gres=gpu:{job.trace.gpus}"]
        if job.trace.checkpoint_interval_s is not None:
            args.append(
                f"--comment=checkpoint_interval={job.trace.checkpoint_interval_s:g} "
                f"checkpoint_duration={job.trace.checkpoint_duration_s:g}"
            )
        script = (
            f"i=0; while [ ! -e {job.marker} ] && [ $i -lt {JOB_GUARD_S * 5} ]; "
            "do sleep 0.2; i=$((i + 1)); done"
        )
        return self.cluster.sbatch(*args, "--wrap", script)

    def _queue(self) -> dict[str, tuple[str, str]]:
        """Every job Slurm still lists (pending, running or completing): its state and nodes."""
        out = self.cluster.run("squeue", "-h", "-o", "%i|%T|%N")
        rows = (line.split("|") for line in out.splitlines() if line.strip())
        return {job_id: (state, nodes) for job_id, state, nodes in rows}

    def _placements(self) -> dict[str, str]:
        queue = self._queue()
        where = {}
        for job in self.jobs:
            if job.slurm_id is None:
                continue
            state, nodes = queue.get(job.slurm_id, ("COMPLETED", ""))
            if state in ("RUNNING", "CONFIGURING") and nodes:
                where[job.trace.id] = nodes
            elif state == "PENDING":
                where[job.trace.id] = PENDING
            else:
                where[job.trace.id] = DONE
        return where

    def _note_starts(self, k: int, booted: set[str]) -> None:
        """Jobs that started since the last look started at tick ``k``: on an instance in
        ``booted`` (those that joined after the tick), ``boot_seconds`` after it."""
        queue = self._queue()
        for job in self.jobs:
            if job.slurm_id is None or job.started_tick is not None:
                continue
            state, nodes = queue.get(job.slurm_id, ("", ""))
            if state == "RUNNING":
                job.started_tick = k
                job.booted = nodes in booted

    def _trace_id(self, slurm_id: str) -> str:
        job = self._by_slurm_id.get(slurm_id)
        return job.trace.id if job is not None else f"slurm:{slurm_id}"

    def _settle(self) -> None:
        since = time.time()
        try:
            wait_for("Slurm to settle", lambda: self._settled(since), SETTLE_S)
        except AssertionError as exc:
            jobs = self.cluster.run("squeue", "-h", "-o", "%i %j %T %r %N %P")
            raise AssertionError(
                f"{exc} (since {since:.0f}); squeue:\n{jobs}\n{self.cluster.log_tail()}"
            ) from None

    def _settled(self, since: float) -> bool:
        """No job starting or completing, and every pending job looked at by the scheduler in
        a second that began after ``since``: whatever could start has started."""
        out = self.cluster.run("scontrol", "show", "job", "--oneliner")
        after = math.floor(since) + 1
        for line in out.splitlines():
            state = _JOB_STATE.search(line)
            if state is None:
                continue
            if state.group(1) in ("CONFIGURING", "COMPLETING"):
                return False
            if state.group(1) == "PENDING":
                evaluated = _SCHED_EVAL.search(line)
                if evaluated is None or _slurm_time(evaluated.group(1)) < after:
                    return False
        return True

    # -- instances ---------------------------------------------------------------------------

    def _boot_together(self, booting: Sequence[tuple[str, Pool]]) -> None:
        """The tick's instances join at once, as the simulator's do (they all boot
        ``boot_seconds`` after the tick, and its scheduler looks at the queue once they have):
        Slurm starts no job while they join (the partitions are down meanwhile; pending jobs
        stay queued), so which job goes where does not depend on which slurmd came up first."""
        self._partitions("DOWN")
        try:
            for instance_id, pool in booting:
                self._boot(instance_id, pool)
        finally:
            self._partitions("UP")

    def _partitions(self, state: str) -> None:
        """Every managed partition to ``state``, up in the order judged jobs list them: were
        ``gpu-od`` up before ``gpu-spot``, Slurm could start a spot-safe job on on-demand room
        in between, which it would not do with both up."""
        for partition in MANAGED:
            self.cluster.run("scontrol", "update", f"partitionname={partition}", f"state={state}")

    def _boot(self, instance_id: str, pool: Pool) -> None:
        """What the instance's boot script does: the join script renders the node it joins as
        (its name, GPUs and features); the reserve node of that name, laid out with the
        features of the pool the simulator launched into, must be that node, and starts."""
        recorded = self.tmp / f"join-{instance_id}"
        recorder = self.tmp / "slurmd-recorder"
        recorder.write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > "{recorded}"\n')
        recorder.chmod(0o755)
        joined = subprocess.run(
            ["sh", str(JOIN_SCRIPT)],
            env={
                "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
                **join_environment(pool, gpu_type=GPU_MODEL),
                "GPU_AUTOSCALER_NODE_NAME": instance_id,
                "GPU_AUTOSCALER_GPUS": str(pool.gpus_per_instance),
                "GPU_AUTOSCALER_SLURMD": str(recorder),
            },
            capture_output=True,
            text=True,
            timeout=bound(60),
            check=False,
        )
        assert joined.returncode == 0, joined.stderr
        args = recorded.read_text().splitlines()
        conf = dict(word.split("=", 1) for word in args[args.index("--conf") + 1].split())
        assert args[:3] == ["-Z", "-N", instance_id], args
        reserved = next(
            (
                dict(word.split("=", 1) for word in line.split())
                for line in self.cluster.conf.read_text().splitlines()
                if line.startswith(f"NodeName={instance_id} ")
            ),
            None,
        )
        assert reserved is not None, f"no reserve node waits for {instance_id}"
        wanted = {key: reserved.get(key) for key in ("Feature", "Gres")}
        assert wanted == {key: conf.get(key) for key in wanted}, (instance_id, args)
        start_reserve_node(self.cluster, instance_id)
        wait_for(
            f"{instance_id} to join Slurm",
            lambda: (
                self.cluster.run("sinfo", "-h", "-N", "-n", instance_id, "-o", "%t").strip()
                in ("idle", "mix", "alloc")
            ),
            BOOT_S,
        )
        self.up[instance_id] = pool.name

    def _shut(self, instance_id: str) -> None:
        """The instance is gone: its node leaves Slurm (back into the reserve)."""
        if self.up.pop(instance_id, None) is not None:
            stop_reserve_node(self.cluster, instance_id)

    def _publish_telemetry(self) -> None:
        """What dcgm-exporter on each cloud node would say now, listed for the scrape as a
        Prometheus file_sd file lists it: a GPU a job holds is busy (the segment's jobs use
        their GPUs fully), the others idle."""
        held: dict[str, int] = {}
        queue = self._queue()
        for job in self.jobs:
            if job.slurm_id is None:
                continue
            state, nodes = queue.get(job.slurm_id, ("", ""))
            if state == "RUNNING":
                held[nodes] = held.get(nodes, 0) + job.trace.gpus
        groups = []
        for node, pool in sorted(self.up.items()):
            lines = [
                f'DCGM_FI_DEV_GPU_UTIL{{gpu="{gpu}",Hostname="{node}"}} '
                f"{100 if gpu < held.get(node, 0) else 0}\n"
                for gpu in range(self.pools[pool].gpus_per_instance)
            ]
            self.exporter.answers[f"/{node}"] = Answer("".join(lines))
            groups.append({"targets": [self.exporter.url(f"/{node}")], "labels": {"node": node}})
        self.targets.write_text(json.dumps(groups))


def _slurm_time(text: str) -> float:
    """A Slurm timestamp (local time, to the second); never, for Unknown or None."""
    try:
        return datetime.datetime.strptime(text, "%Y-%m-%dT%H:%M:%S").timestamp()
    except ValueError:
        return -math.inf
