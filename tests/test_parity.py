"""The simulator and live make the same decisions on the same trace segment (issue 16, item 5).

``tests/data/parity`` is a short segment: two jobs fill the one on-prem node; two that
checkpoint burst to a spot instance; one that checkpoints arrives when only that spot instance
has room and waits for the next tick to be let onto spot (a new job is in Slurm's base
partition, which holds the on-prem nodes, only until a tick judges it); one that checkpoints
and one that cannot arrive with no room anywhere, and the tick that judges them buys a spot
instance for the first and an on-demand one for the second: both instances have room for the
first, which takes spot (its partitions list spot before on-demand), and the second, which
would not fit beside it, takes on-demand; one that cannot checkpoint takes on-prem room as it
frees, and one that checkpoints, arriving while both a spot and the on-demand instance have
room, waits for the next tick all the same and then takes spot; as the jobs end each cloud
node goes idle and is drained and terminated. It is replayed through ``simulate`` and live: the
real controller on a real Slurm 22.05 (queue, nodes, placement through the spot and on-demand
twin partitions, as docs/slurm.md lays them out), moto's EC2 and GPU telemetry scraped over
HTTP, with the same pools, policy, params, limits and prices. Tick by tick, both must launch the
same instances in the same pools, drain and terminate the same nodes, and see every job in the
same place (see ``tests/parity_support.py`` for how the two are made comparable, timing aside).
A difference fails with both sides' records, tick by tick, as a diff.

This is what keeps the simulator's report honest: a change that makes the simulated world
behave otherwise than the live one fails here. It found that the simulator let a new job onto
spot before any tick had judged it, and, once on-demand nodes had a twin of their own, onto
on-demand room (fixed in ``autoscaler/sim/scheduler.py``, UNJUDGED_TIERS); and it showed that
live, without the on-demand twin, a judged spot-safe job took on-demand room before spot room
(fixed in the Slurm adapter: ``on_demand_partitions``).

Not in the segment, and why:

* On-prem rebalancing (``rebalance_onprem`` is off). A move checkpoints the job on request: the
  simulator then ticks again when the checkpoint is written, between regular ticks; live the
  checkpoint report comes over HTTP in wall-clock time while this controller's clock jumps a
  tick at a time, and the moved job stays off its node for Slurm's job credential lifetime in
  real seconds. ``tests/test_slurm_placement.py`` tests the move live on its own.

Runs in about 15 to 40 seconds on the busy 2-core machine, nearly all of it the live side
waiting for Slurm to settle after each step.
"""

from __future__ import annotations

import itertools
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

import moto.ec2.models.instances
import pytest
from exporter_server import ExporterServer
from parity_support import (
    DONE,
    PENDING,
    Act,
    LiveRun,
    Segment,
    TickRecord,
    difference,
    instance_name,
    launched_pools,
    layout,
    load_segment,
    replay_sim,
)
from slurm_cluster import start_slurm_cluster, stop_slurm_cluster


@pytest.fixture(scope="module")
def segment() -> Segment:
    return load_segment()


@pytest.fixture(scope="module")
def simulated(segment: Segment) -> list[TickRecord]:
    return replay_sim(segment)


def test_the_segment_exercises_what_parity_is_for(
    segment: Segment, simulated: list[TickRecord]
) -> None:
    """The segment keeps its purpose: bursts to spot and to on-demand, on-prem use, drains and
    terminations, the job that cannot checkpoint never on spot, new jobs waiting for their
    judgement before the cloud, and a tick that buys spot and on-demand at once."""
    kinds = {(a.kind, a.pool) for r in simulated for a in r.actions}
    spot = {p.name for p in segment.pools if p.is_spot}
    on_demand = {p.name for p in segment.pools if not p.is_spot}
    for kind in ("launch", "drain", "terminate"):
        assert {pool for k, pool in kinds if k == kind} >= spot | on_demand, (kind, kinds)
    places = {where for r in simulated for _, where in r.placements}
    assert {PENDING, DONE, "gpu-a"} <= places
    assert any(_pool(p) in spot for p in places)
    assert any(_pool(p) in on_demand for p in places)
    protected = {j.id for j in segment.jobs if j.checkpoint_interval_s is None}
    for r in simulated:
        for job, where in r.placements:
            assert not (job in protected and _pool(where) in spot), (r.at, job, where)
    assert [r.at for r in simulated] == segment.ticks(), "regular ticks only"
    gpus = {j.id: j.gpus for j in segment.jobs}
    size = {p.name: p.gpus_per_instance for p in segment.pools}

    # New spot-safe jobs wait for the tick that judges them, with nothing bought for them, and
    # then take spot: one while only spot has room, one while on-demand has room too.
    safe = {j.id: j.submit for j in segment.jobs if j.checkpoint_interval_s is not None}
    waited = {
        job: free
        for (index, r), (_, after) in itertools.pairwise(enumerate(simulated))
        for free in [_free(simulated, index, gpus, size)]
        for job, where in r.placements
        if job in safe
        and safe[job] == r.at
        and where == PENDING
        and not any(a.kind == "launch" for a in r.actions)
        and _pool(dict(after.placements)[job]) in spot
    }

    def room(free: dict[str, int], job: str, pools: set[str]) -> bool:
        return any(left >= gpus[job] for node, left in free.items() if _pool(node) in pools)

    assert any(
        room(free, job, spot) and not room(free, job, on_demand) for job, free in waited.items()
    ), "a new spot-safe job waits for its judgement while only spot has room"
    assert any(
        room(free, job, spot) and room(free, job, on_demand) for job, free in waited.items()
    ), "a new spot-safe job waits for its judgement although on-demand has room too"

    # A tick buys a spot instance for a spot-safe job and an on-demand one for a job that must
    # stay off spot; both have room for the first, which takes spot, and the second, which
    # would not fit beside it on the on-demand instance, takes that.
    def bought_both(r: TickRecord, after: TickRecord) -> bool:
        bought = {n: _pool(n) for a in r.actions if a.kind == "launch" for n in a.nodes}
        at = dict(after.placements)
        pending = [job for job, where in r.placements if where == PENDING]
        return any(
            job in safe
            and other in protected
            and bought.get(at[job]) in spot
            and bought.get(at[other]) in on_demand
            and gpus[job] <= size[bought[at[other]]] < gpus[job] + gpus[other]
            for job in pending
            for other in pending
        )

    assert any(bought_both(r, after) for r, after in itertools.pairwise(simulated)), (
        "a tick buys spot and on-demand, and the spot-safe job takes spot"
    )


def _pool(where: str) -> str:
    """The pool of a cloud node's shared name (``aws-spot#1``); other places as they are."""
    return where.partition("#")[0]


def _free(
    records: Sequence[TickRecord], index: int, gpus: dict[str, int], size: dict[str, int]
) -> dict[str, int]:
    """The free GPUs of every cloud node up at tick ``index`` (launched at an earlier tick and
    not terminated since), by its shared name."""
    up: set[str] = set()
    for r in records[:index]:
        for a in r.actions:
            if a.kind == "launch":
                up.update(a.nodes)
            elif a.kind == "terminate":
                up.difference_update(a.nodes)
    free = {node: size[_pool(node)] for node in up}
    for job, where in records[index].placements:
        if where in free:
            free[where] -= gpus[job]
    return free


def test_a_difference_is_shown_tick_by_tick() -> None:
    def tick(at: float, where: str, *actions: Act) -> TickRecord:
        return TickRecord(at, actions, (), None, (("a", where),))

    launch = Act("launch", "aws-spot", 1, 1, "ok", ("aws-spot#1",), None)
    sim = [tick(0, PENDING, launch), tick(60, "aws-spot#1")]
    assert difference(sim, sim) is None
    assert difference(sim, sim[:1]) is None, "the live run so far agrees"
    live = [tick(0, PENDING, launch), tick(60, "aws-od#1")]
    shown = difference(sim, live)
    assert shown is not None
    assert "first differ at t=60 s" in shown
    assert "-t=   60s   job a: aws-spot#1" in shown
    assert "+t=   60s   job a: aws-od#1" in shown
    assert " t=    0s launch aws-spot 1/1 ok aws-spot#1" in shown, "the ticks before, as context"


@pytest.fixture
def instance_ids(monkeypatch: pytest.MonkeyPatch, simulated: list[TickRecord]) -> Iterator[None]:
    """moto names the live instances in launch order as the test's reserve Slurm nodes are
    named (moto runs in this process); past the simulator's launches, names no node has."""
    numbers = iter(range(1, 1000))
    monkeypatch.setattr(
        moto.ec2.models.instances, "random_instance_id", lambda: instance_name(next(numbers))
    )
    yield


@pytest.fixture
def cluster_root() -> Iterator[Path]:
    """A short directory for the cluster: slurmd makes a Unix socket per job step at
    ``<root>/spool-<node>/<node>_<job>.<step>``, and with this test's cloud node names (19
    characters, twice) a pytest temporary directory under an xdist worker passes the 108 bytes
    a socket path may have, and every job on a cloud node fails to launch (under /tmp, not
    wherever TMPDIR points, for the same reason)."""
    root = Path(tempfile.mkdtemp(prefix="parity-", dir="/tmp" if Path("/tmp").is_dir() else None))
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_the_simulator_and_live_make_the_same_decisions_tick_by_tick(
    segment: Segment,
    simulated: list[TickRecord],
    aws: str,
    exporters: ExporterServer,
    instance_ids: None,
    cluster_root: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    cluster = start_slurm_cluster(cluster_root, layout(segment, launched_pools(simulated)))
    try:
        live = LiveRun(segment, cluster, aws, exporters, tmp_path_factory.mktemp("parity-jobs"))
        try:
            for _ in live.run():
                shown = difference(simulated, live.records)
                assert shown is None, shown
        finally:
            live.close()
    finally:
        stop_slurm_cluster(cluster)
    assert len(live.records) == len(simulated)
