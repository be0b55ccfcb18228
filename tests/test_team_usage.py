"""Who pays for what, live: every tick, each billed instance's accrued cost and GPU-time and each
on-prem node's GPU-time is split between the teams whose jobs held its GPUs; the journal's team
lines add up to the fleet's journaled totals exactly, the report's Teams table to its cost to
the cent, and /metrics counts the same shares."""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from fakes import FakeCloud, FakeNodes, FakeQueue, job, pool
from hypothesis import given
from hypothesis import strategies as st
from test_journal import DAY0, _idle_entry, _v1_sqlite
from test_report_journal import report_of

from autoscaler.cli import main
from autoscaler.fleet.attribution import IDLE
from autoscaler.fleet.team_usage import (
    ONPREM,
    UNKNOWN,
    Splitter,
    TickHolders,
    Usage,
    shares_of,
    split,
    tick_holders,
)
from autoscaler.model import OnPremNode, Placement
from autoscaler.model.clock import ManualClock
from autoscaler.model.config import ControllerConfig
from autoscaler.model.teams import UNASSIGNED, TeamsConfig, TeamSpec
from autoscaler.ops.journal.base import Billed, Journal, open_postgres, open_sqlite
from autoscaler.ops.metrics import Metrics
from autoscaler.report.journal import build_journal_report, read_journal
from autoscaler.spi.sources import NodeUsage, RunningJob
from autoscaler.tick.controller import Controller
from autoscaler.tick.retry import RetryPolicy
from autoscaler.tick.tick_metrics import MAX_TEAM_SERIES
from policies.cost_aware import CostAwareParams, CostAwarePolicy

TEAMS = ("ml", "research", "web")
NAMES = [*TEAMS, UNASSIGNED]

# -- the split of one node's tick -------------------------------------------------------------


@given(
    st.integers(0, 10**12),
    st.integers(0, 16),
    st.dictionaries(st.sampled_from(NAMES), st.integers(0, 16), max_size=4),
)
def test_a_nodes_tick_is_shared_by_gpu_share_every_unit_given(
    total: int, gpus: int, held: dict[str, int]
) -> None:
    shares = split(total, gpus, {t: float(g) for t, g in held.items()})
    assert sum(shares.values()) == total
    assert all(units > 0 for units in shares.values())
    occupied = sum(held.values())
    whole = max(occupied, gpus)
    idle_gpus = max(0, gpus - occupied)
    if whole > 0 and total > 0:
        # idle is the unoccupied share, each team its own, each within one unit
        assert abs(shares.get(IDLE, 0) - total * idle_gpus / whole) < 1
        for team, g in held.items():
            assert abs(shares.get(team, 0) - total * g / whole) < 1
    assert UNKNOWN not in shares


@given(st.integers(0, 10**12), st.integers(0, 16))
def test_a_node_whose_jobs_are_not_known_goes_whole_to_the_unknown_line(
    total: int, gpus: int
) -> None:
    assert split(total, gpus, None) == ({UNKNOWN: total} if total else {})
    splitter = Splitter()
    splitter.add("a", Usage(total, total // 3), gpus, None)
    assert splitter.result() == ({(UNKNOWN, "a"): Usage(total, total // 3)} if total else {})


node_strategy = st.tuples(
    st.sampled_from(["a", "b", "on-prem"]),
    st.integers(0, 10**9),
    st.integers(0, 10**7),
    st.integers(0, 8),
    st.one_of(st.none(), st.dictionaries(st.sampled_from(NAMES), st.integers(0, 12), max_size=4)),
)


@given(st.lists(node_strategy, max_size=30))
def test_a_ticks_lines_add_up_to_each_places_units_each_within_one_of_its_share(
    nodes: list[tuple[str, int, int, int, dict[str, int] | None]],
) -> None:
    """Many nodes of a tick, split at once: every place's units all given, none negative, and
    each line within one unit of the exact sum of its shares of the nodes."""
    splitter = Splitter()
    units: dict[str, list[int]] = {}
    exact: dict[tuple[str, str], list[float]] = {}
    for place, time, money, gpus, held in nodes:
        weights = None if held is None else {t: float(g) for t, g in held.items()}
        splitter.add(place, Usage(time, money), gpus, weights)
        found = units.setdefault(place, [0, 0])
        found[0] += time
        found[1] += money
        for team, share in shares_of(gpus, weights).items():
            line = exact.setdefault((team, place), [0.0, 0.0])
            line[0] += time * share
            line[1] += money * share
    result = splitter.result()
    for place, (time, money) in units.items():
        assert sum(u.gpu_ms for (_t, p), u in result.items() if p == place) == time
        assert sum(u.usd_micros for (_t, p), u in result.items() if p == place) == money
    for key, usage in result.items():
        assert usage.gpu_ms >= 0 and usage.usd_micros >= 0
        assert abs(usage.gpu_ms - exact[key][0]) < 1 + 1e-9 * exact[key][0]
        assert abs(usage.usd_micros - exact[key][1]) < 1 + 1e-9 * exact[key][1]


def test_jobs_with_no_team_are_unassigned_and_unread_nodes_unknown() -> None:
    jobs = {
        "n1": [RunningJob("j", "n1", 2, 0.0, team=None), RunningJob("k", "n1", 1, 0.0, team="x")]
    }
    known = tick_holders(jobs, [("n1", 4), ("n2", 2)])
    assert known.onprem[0].holders == {UNASSIGNED: 2.0, "x": 1.0}
    assert known.onprem[1].holders == {}
    assert known.of_instance("i-1") == {}
    unknown = tick_holders(None, [("n1", 4)])
    assert unknown.onprem[0].holders is None and unknown.of_instance("i-1") is None


def test_a_job_on_a_slice_of_a_shared_gpu_holds_its_slice_not_the_gpu() -> None:
    jobs = {
        "n1": [
            RunningJob("a", "n1", 1, 0.0, team="x", gpu_share=0.3),
            RunningJob("b", "n1", 1, 0.0, team="y", gpu_share=0.5),
            RunningJob("c", "n1", 2, 0.0, team="y"),
        ]
    }
    held = tick_holders(jobs, [("n1", 4)])
    assert held.onprem[0].holders == {"x": 0.3, "y": 2.5}


# -- the real controller over many ticks ------------------------------------------------------


@dataclass
class TeamScheduler:
    """Every node's running jobs, each of a team; can be told to fail."""

    jobs: dict[str, list[RunningJob]] = field(default_factory=dict)
    failing: bool = False

    def running_jobs_by_node(self) -> Mapping[str, Sequence[RunningJob]]:
        if self.failing:
            raise RuntimeError("scheduler down")
        return {node: list(jobs) for node, jobs in self.jobs.items()}

    def running_jobs(self, node: str) -> Sequence[RunningJob]:
        return self.running_jobs_by_node().get(node, [])

    def signal(self, job_id: str, signal: str) -> None:
        """No job here takes a checkpoint signal."""

    def requeue(self, job_id: str) -> None:
        """Nothing is requeued in these tests."""

    def apply_placement(self, placement: Placement) -> None:
        """Placement is not what these tests are about."""

    def drain(self, node: str, reason: str) -> int:
        return len(self.jobs.get(node, []))

    def evict(self, node: str, reason: str) -> int:
        return len(self.jobs.pop(node, []))


PRICES = {"a": 3.0, "b": 1.25}
GPUS = {"a": 4, "b": 1}
ONPREM_NODES = {"n1": 8, "n2": 4}
T0 = 1_700_000_000.0
GUARANTEES = {"ml": 6, "research": 4}


@dataclass
class Fleet:
    controller: Controller
    cloud: FakeCloud
    clock: ManualClock
    scheduler: TeamScheduler
    config: ControllerConfig
    # what the test expects: team -> place -> (GPU-seconds, dollars)
    expected: dict[tuple[str, str], list[float]] = field(default_factory=dict)
    onprem_gpu_ms: int = 0

    def expect(self, team: str, place: str, gpu_s: float, usd: float) -> None:
        found = self.expected.setdefault((team, place), [0.0, 0.0])
        found[0] += gpu_s
        found[1] += usd


def fleet(journal: Journal | None, metrics: Metrics | None = None) -> Fleet:
    clock = ManualClock(T0)
    cloud = FakeCloud("fake", price_table=dict(PRICES), now=clock.now)
    queue = FakeQueue()
    nodes = FakeNodes()
    nodes.onprem = [OnPremNode(name=n, gpus=g, gpus_allocated=g) for n, g in ONPREM_NODES.items()]
    scheduler = TeamScheduler()
    config = ControllerConfig(
        fleet_id="test",
        pools=(pool("a", gpus=4), pool("b", gpus=1)),
        teams=TeamsConfig(
            teams={t: TeamSpec(guaranteed_gpus=g) for t, g in GUARANTEES.items()}
            | {"web": TeamSpec()}
        ),
    )
    controller = Controller(
        config,
        CostAwarePolicy(CostAwareParams(idle_seconds=10**9)),
        {"fake": cloud},
        clock,
        [queue],
        nodes,
        scheduler,
        incarnation="t",
        retry=RetryPolicy(attempts=1, sleep=lambda _s: None),
        journal=journal,
        metrics=metrics,
    )
    # two instances of a, one of b: what three pending jobs ask for
    queue.jobs = [job("x", gpus=4), job("y", gpus=4), job("z", gpus=1)]
    controller.tick()
    cloud.boot_all()
    queue.jobs = []
    nodes.cloud = {
        i: NodeUsage(GPUS[cloud.instances[i].pool], 90.0, idle_since=None, empty_since=None)
        for i in cloud.instances
    }
    return Fleet(controller, cloud, clock, scheduler, config)


def run_ticks(f: Fleet, ticks: int, seed: int) -> None:
    """``ticks`` ticks of random spacing; before each, every node's jobs are drawn anew from
    the teams (sometimes more GPUs than the node has, sometimes none); one tick in seven the
    scheduler fails. The test's own bill follows each instance from its launch."""
    rng = random.Random(seed)
    billed_since = {i: inst.launched_at for i, inst in f.cloud.instances.items()}
    last_tick = f.clock.now()
    for _ in range(ticks):
        f.clock.advance(rng.randint(5, 900))
        now = f.clock.now()
        nodes = {i: GPUS[inst.pool] for i, inst in f.cloud.instances.items()}
        nodes |= ONPREM_NODES
        f.scheduler.jobs = {}
        for node, gpus in nodes.items():
            for number in range(rng.randint(0, 3)):
                team = rng.choice([*TEAMS, None])
                held = rng.randint(1, max(1, gpus // 2))
                f.scheduler.jobs.setdefault(node, []).append(
                    RunningJob(f"{node}-{number}", node, held, now, team=team)
                )
        f.scheduler.failing = rng.random() < 1 / 7
        for node, gpus in nodes.items():
            if node in ONPREM_NODES:
                seconds = now - last_tick
                f.onprem_gpu_ms += round(gpus * seconds * 1000)
                place, usd = ONPREM, 0.0
            else:
                inst = f.cloud.instances[node]
                seconds = now - billed_since[node]
                billed_since[node] = now
                place, usd = inst.pool, PRICES[inst.pool] * seconds / 3600
            jobs = f.scheduler.jobs.get(node, [])
            if f.scheduler.failing:
                f.expect(UNKNOWN, place, gpus * seconds, usd)
                continue
            occupied = sum(j.gpus for j in jobs)
            whole = max(occupied, gpus)
            for j in jobs:
                share = j.gpus / whole  # more GPUs held than the node has: shared by them
                f.expect(j.team or UNASSIGNED, place, gpus * seconds * share, usd * share)
            if gpus > occupied:
                idle = gpus - occupied
                f.expect(IDLE, place, idle * seconds, usd * idle / whole)
        report = f.controller.tick()
        assert not [e for e in report.errors if "scheduler down" not in e], report.errors
        assert not report.actions, "the fleet stays as it is: only the bill is under test"
        last_tick = now


def test_per_team_totals_add_up_exactly_to_the_fleets_journaled_totals(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    journal = open_sqlite(path)
    f = fleet(journal)
    run_ticks(f, 120, seed=19)

    lines = journal.team_usage()
    fleet_units = journal.cost_units()
    cloud = [s for s in lines if s.pool != ONPREM]
    assert fleet_units.usd_micros > 0
    assert sum(s.usd_micros for s in lines) == fleet_units.usd_micros
    assert sum(s.gpu_ms for s in cloud) == fleet_units.gpu_ms
    assert sum(s.gpu_ms for s in lines if s.pool == ONPREM) == f.onprem_gpu_ms
    assert abs(fleet_units.usd_micros / 1e6 - sum(r.usd for r in journal.spend())) < 1e-3

    # each team's line is what its jobs held, tick by tick, at the prices of the pools
    got: dict[tuple[str, str], list[float]] = {}
    for s in lines:
        found = got.setdefault((s.team, s.pool), [0.0, 0.0])
        found[0] += s.gpu_ms / 1000
        found[1] += s.usd_micros / 1e6
    assert set(got) == {k for k, v in f.expected.items() if v[0] > 0}
    for key, (gpu_s, usd) in f.expected.items():
        assert got[key][0] == pytest.approx(gpu_s, abs=1.0), key
        assert got[key][1] == pytest.approx(usd, abs=1e-3), key
    assert {t for t, _p in got} >= {*TEAMS, UNASSIGNED, IDLE, UNKNOWN}

    # the report: the teams' cents add up to its cost to the cent
    report = build_journal_report(read_journal(path, None, None, None), teams=f.config.teams)
    (policy,) = report.policies
    assert sum(t.cost_cents for t in policy.teams) == round(policy.cost * 100)
    by_team = {t.team: t for t in policy.teams}
    for team in {t for t, _p in f.expected}:
        usd = sum(v[1] for (t, _p), v in f.expected.items() if t == team)
        onprem = sum(v[0] for (t, p), v in f.expected.items() if t == team and p == ONPREM)
        assert by_team[team].cost_cents / 100 == pytest.approx(usd, abs=0.02), team
        assert by_team[team].gpu_hours_onprem == pytest.approx(onprem / 3600, abs=1e-3)
    assert by_team["ml"].guaranteed_gpus == GUARANTEES["ml"]
    assert any(line.startswith("Team ml: a $") for line in report.findings)
    assert any("against a guarantee of 6" in line for line in report.findings)
    journal.close()


def test_report_journal_shows_the_teams_and_their_total_is_the_cost(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    journal = open_sqlite(path)
    run_ticks(fleet(journal), 30, seed=7)
    journal.close()
    out = tmp_path / "out"
    assert main(["report", "--journal", str(path), "--out", str(out), "--no-progress"]) == 0
    report = report_of(out)
    (policy,) = report.policies
    assert policy.teams and sum(t.cost_cents for t in policy.teams) == round(policy.cost * 100)
    text = (out / "report.md").read_text()
    assert "## Teams" in text and "(unknown)" in text
    assert any("does not hold the config" in line for line in report.findings)


def test_without_teams_in_the_config_everything_is_unknown_never_dropped(tmp_path: Path) -> None:
    journal = open_sqlite(tmp_path / "j.db")
    f = fleet(journal)
    f.controller.observer.teams = None  # as a config without teams reads no jobs
    for _ in range(5):
        f.clock.advance(60)
        f.controller.tick()
    lines = journal.team_usage()
    assert {s.team for s in lines} == {UNKNOWN}
    assert sum(s.usd_micros for s in lines) == journal.cost_units().usd_micros > 0
    journal.close()
    # the report has nothing to say per team then: no Teams table
    report = build_journal_report(read_journal(tmp_path / "j.db", None, None, None))
    assert report.policies[0].teams == [] and report.policies[0].cost > 0


def test_metrics_count_each_teams_gpu_seconds_and_dollars(tmp_path: Path) -> None:
    journal = open_sqlite(tmp_path / "j.db")
    metrics = Metrics()
    f = fleet(journal, metrics)
    run_ticks(f, 40, seed=3)
    registry = metrics.registry

    def total(name: str, pool: str | None = None) -> float:
        return sum(
            s.value
            for m in registry.collect()
            for s in m.samples
            if s.name == name and (pool is None or s.labels["pool"] == pool)
        )

    lines = journal.team_usage()
    usd = sum(s.usd_micros for s in lines) / 1e6
    assert total("gpu_autoscaler_team_cost_usd_total") == pytest.approx(usd, abs=1e-6)
    onprem_s = sum(s.gpu_ms for s in lines if s.pool == ONPREM) / 1000
    assert total("gpu_autoscaler_team_gpu_seconds_total", ONPREM) == pytest.approx(onprem_s)
    for team in ("ml", "research"):
        assert registry.get_sample_value(
            "gpu_autoscaler_team_guaranteed_gpus", {"team": team}
        ) == float(GUARANTEES[team])
    # the on-prem GPUs each team holds now, as the last tick read them
    f.scheduler.failing = False
    f.scheduler.jobs = {"n1": [RunningJob("j", "n1", 3, 0.0, team="web")]}
    f.clock.advance(30)
    f.controller.tick()
    assert registry.get_sample_value("gpu_autoscaler_team_onprem_gpus", {"team": "web"}) == 3.0
    assert registry.get_sample_value("gpu_autoscaler_team_onprem_gpus", {"team": "ml"}) is None
    journal.close()


def test_the_split_is_exact_on_postgres_too(postgres_dsn: str) -> None:
    journal = open_postgres(postgres_dsn)
    f = fleet(journal)
    run_ticks(f, 40, seed=11)
    lines = journal.team_usage()
    fleet_units = journal.cost_units()
    assert sum(s.usd_micros for s in lines) == fleet_units.usd_micros > 0
    assert sum(s.gpu_ms for s in lines if s.pool != ONPREM) == fleet_units.gpu_ms
    assert sum(s.gpu_ms for s in lines if s.pool == ONPREM) == f.onprem_gpu_ms
    journal.close()


def test_spend_journaled_before_version_3_is_the_unknown_line_of_the_report(
    tmp_path: Path,
) -> None:
    """An upgraded journal: the old row's dollars have no team line, so the report shows them
    as (unknown), and the teams still add up to the cost to the cent."""
    path = tmp_path / "j.db"
    _v1_sqlite(path)  # i-1 billed $3 in the hour before DAY0
    journal = open_sqlite(path)
    held = TickHolders(True, {"i-1": {"ml": 1.0}}, ())
    node = Billed("i-1", "aws", "a", 1, 3.0, DAY0 - 3600)
    for number in range(1, 3):
        journal.record_tick(_idle_entry(number, DAY0 + 1800 * number, None), [], [node], held)
    assert journal.cost_units() == Usage(3_600_000, 3_000_000)  # the hour since DAY0 only
    journal.close()
    report = build_journal_report(read_journal(path, None, None, None))
    (policy,) = report.policies
    cents = {t.team: t.cost_cents for t in policy.teams}
    assert cents == {"ml": 300, UNKNOWN: 300}
    assert sum(cents.values()) == round(policy.cost * 100) == 600


def test_a_period_cut_inside_a_day_still_adds_up_to_the_cost_to_the_cent(
    tmp_path: Path,
) -> None:
    path = tmp_path / "j.db"
    journal = open_sqlite(path)
    run_ticks(fleet(journal), 80, seed=5)
    journal.close()
    for since, until in ((T0 + 3 * 3600, None), (None, T0 + 5 * 3600), (T0 + 3600, T0 + 7200)):
        report = build_journal_report(read_journal(path, None, since, until), since, until)
        (policy,) = report.policies
        assert policy.cost > 0
        assert sum(t.cost_cents for t in policy.teams) == round(policy.cost * 100)


def test_team_series_stop_at_the_cap_however_many_teams_a_scheduler_names(
    tmp_path: Path,
) -> None:
    metrics = Metrics()
    f = fleet(None, metrics)
    f.clock.advance(60)
    report = f.controller.tick()
    observation = f.controller.last_observation
    recorder = f.controller.recorder
    assert observation is not None and recorder is not None
    many = {(f"team-{i:04d}", "a"): Usage(1000, 10) for i in range(MAX_TEAM_SERIES + 100)}
    held = tick_holders(
        {
            "n1": [
                RunningJob(f"j{i}", "n1", 1, 0.0, team=f"t{i}")
                for i in range(MAX_TEAM_SERIES + 100)
            ]
        },
        [("n1", 8)],
    )
    recorder.record(observation, report, 0, 1, held, many)
    samples = [
        s
        for m in metrics.registry.collect()
        for s in m.samples
        if s.name in ("gpu_autoscaler_team_cost_usd_total", "gpu_autoscaler_team_onprem_gpus")
    ]
    cost = [s for s in samples if s.name == "gpu_autoscaler_team_cost_usd_total"]
    onprem = [s for s in samples if s.name == "gpu_autoscaler_team_onprem_gpus"]
    assert len(cost) == MAX_TEAM_SERIES and len(onprem) == MAX_TEAM_SERIES


def test_report_journal_with_the_config_sets_quota_use_beside_the_guarantees(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "j.db"
    journal = open_sqlite(path)
    run_ticks(fleet(journal), 30, seed=13)
    journal.close()
    config = tmp_path / "controller.yaml"
    config.write_text(
        "fleet_id: test\npools: []\nteams:\n  teams:\n"
        "    ml: {guaranteed_gpus: 6}\n    research: {guaranteed_gpus: 4}\n"
    )
    out = tmp_path / "out"
    argv = ["report", "--journal", str(path), "--config", str(config), "--out", str(out)]
    assert main([*argv, "--no-progress"]) == 0
    report = report_of(out)
    by_team = {t.team: t for t in report.policies[0].teams}
    assert (by_team["ml"].guaranteed_gpus, by_team["research"].guaranteed_gpus) == (6, 4)
    assert any("against a guarantee of 4" in line for line in report.findings)
    assert not any("does not hold the config" in line for line in report.findings)
    # the config goes with a journal only
    assert main(["report", "--config", str(config), "--out", str(out)]) == 2
    assert "go with a journal" in capsys.readouterr().err
