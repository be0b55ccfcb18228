"""`gpu-autoscaler report --journal`: the real controller writes a journal over a few ticks
(launch with a capacity shortfall, boot, an interruption that loses work, a budget clamp, an
idle drain), and the report reads real spend back in the dry run's format."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import pytest
from fakes import FakeCloud, FakeNodes, FakeQueue, job, pool
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from test_sim_engine import job_row, small_scenario

from autoscaler.cli import main
from autoscaler.model import InterruptionNotice, Placement
from autoscaler.model.clock import ManualClock
from autoscaler.model.config import ControllerConfig, Limits
from autoscaler.ops.journal import Journal
from autoscaler.ops.journal.base import TickEntry, open_postgres, open_sqlite
from autoscaler.ops.onprem_idle import IdleNode
from autoscaler.report.journal import NOTHING_YET
from autoscaler.report.model import Report
from autoscaler.spi.sources import NodeUsage, RunningJob
from autoscaler.tick.controller import Controller
from autoscaler.tick.retry import RetryPolicy
from policies.cost_aware import CostAwareParams, CostAwarePolicy

# The PostgreSQL server fixtures (one server per session and worker, a database per test).

T0 = 1_000_000.0
PRICE_A = 2.0
PRICE_B = 3.0
DSN_VAR = "GPU_AUTOSCALER_TEST_JOURNAL_DSN"


@dataclass
class Scheduler:
    """Knows each node's jobs and requeues them when asked: enough for evacuation."""

    jobs: dict[str, list[RunningJob]] = field(default_factory=dict)

    def running_jobs(self, node: str) -> Sequence[RunningJob]:
        return list(self.jobs.get(node, []))

    def signal(self, job_id: str, signal: str) -> None:
        """No job here takes a checkpoint signal."""

    def requeue(self, job_id: str) -> None:
        for jobs in self.jobs.values():
            jobs[:] = [j for j in jobs if j.id != job_id]

    def apply_placement(self, placement: Placement) -> None:
        """Placement is not what these tests are about."""

    def drain(self, node: str, reason: str) -> int:
        return len(self.jobs.get(node, []))

    def evict(self, node: str, reason: str) -> int:
        return len(self.jobs.pop(node, []))


@dataclass
class Run:
    controller: Controller
    cloud: FakeCloud
    clock: ManualClock
    ticks: int = 0

    def tick(self) -> None:
        report = self.controller.tick()
        assert not report.errors, report.errors
        self.ticks += 1


def start(journal: Journal) -> Run:
    clock = ManualClock(T0)
    cloud = FakeCloud(
        "fake", price_table={"a": PRICE_A, "b": PRICE_B}, capacity={"a": 1}, now=clock.now
    )
    queue, nodes, scheduler = FakeQueue(), FakeNodes(), Scheduler()
    controller = Controller(
        ControllerConfig(
            fleet_id="test",
            pools=(pool("a"), pool("b")),
            limits=Limits(scale_down_cooldown_s=0, max_cost_per_hour=PRICE_A + PRICE_B),
        ),
        CostAwarePolicy(CostAwareParams(idle_seconds=0)),
        {"fake": cloud},
        clock,
        [queue],
        nodes,
        scheduler,
        incarnation="t",
        retry=RetryPolicy(attempts=1, sleep=lambda _s: None),
        journal=journal,
    )
    run = Run(controller, cloud, clock)
    # t=0: two jobs; pool a (cheapest) has room for one, the other goes to b
    queue.jobs = [job("x"), job("y")]
    run.tick()
    # t=600: both booted and busy
    clock.advance(600)
    cloud.boot_all()
    queue.jobs = []
    node_a, node_b = sorted(cloud.instances, key=lambda i: cloud.instances[i].pool)
    scheduler.jobs = {
        node_a: [RunningJob("x", node_a, 1, clock.now(), None, None, None)],
        node_b: [RunningJob("y", node_b, 1, clock.now(), None, None, None)],
    }
    busy = NodeUsage(1, 90.0, idle_since=None, empty_since=None)
    nodes.cloud = {node_a: busy, node_b: busy}
    run.tick()
    # t=900: b is taken back; y has run 300 s without a checkpoint and loses them; the
    # replacement would pass the $5/h cap while b is still billed, so the guard holds it back
    clock.advance(300)
    cloud.notices = [
        InterruptionNotice(
            instance_id=node_b, pool="b", received_at=clock.now(), deadline=clock.now() + 120
        )
    ]
    run.tick()
    # t=960: b is gone
    clock.advance(60)
    cloud.instances.pop(node_b)
    nodes.cloud.pop(node_b)
    run.tick()
    # t=1200: x has finished and a is idle: drained and terminated
    clock.advance(240)
    scheduler.jobs[node_a] = []
    nodes.cloud = {node_a: NodeUsage(0, 0.0, idle_since=T0, empty_since=T0)}
    run.tick()
    clock.advance(60)
    run.tick()
    return run


# What the script above bills: a from launch to its terminating tick, b until its last listing.
A_SECONDS = 1200.0
B_SECONDS = 900.0
EXPECTED_COST = PRICE_A * A_SECONDS / 3600 + PRICE_B * B_SECONDS / 3600
EXPECTED_GPU_HOURS = (A_SECONDS + B_SECONDS) / 3600
LOST_GPU_HOURS = 300.0 / 3600


def report_of(out: Path) -> Report:
    return Report.model_validate_json((out / "report.json").read_text())


def iso(at: float) -> str:
    return datetime.fromtimestamp(at, UTC).isoformat()


@pytest.fixture
def journal_file(tmp_path: Path) -> Path:
    path = tmp_path / "j.db"
    journal = open_sqlite(path)
    try:
        start(journal)
    finally:
        journal.close()
    return path


def test_real_spend_comes_out_in_the_dry_run_format(
    journal_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    assert main(["report", "--journal", str(journal_file), "--out", str(out)]) == 0
    report = report_of(out)
    assert report.kind == "journal" and report.journal is not None
    (real,) = report.policies
    assert real.cost == pytest.approx(EXPECTED_COST, abs=0.01)
    assert {c.pool: c.cost for c in real.cost_by_pool} == pytest.approx(
        {"a": PRICE_A * A_SECONDS / 3600, "b": PRICE_B * B_SECONDS / 3600}, abs=0.01
    )
    assert {c.pool: c.instance_hours for c in real.cost_by_pool} == pytest.approx(
        {"a": A_SECONDS / 3600, "b": B_SECONDS / 3600}, abs=0.01
    )
    assert real.gpu_hours.cloud_paid == pytest.approx(EXPECTED_GPU_HOURS, abs=0.01)
    assert real.gpu_hours.lost == pytest.approx(LOST_GPU_HOURS, abs=0.01)
    assert real.interruptions == 1
    assert real.instances_launched == 2
    assert real.capacity_failures == 1, "pool a had room for one of the two asked for"
    assert real.requeues == 1
    assert real.migrations == 0, "no job was moved off an on-prem node"
    assert real.ticks == 6 and real.held_ticks == 0
    assert real.clamps == {"budget": 1}

    facts = report.journal
    assert facts.cost_by_provider == pytest.approx({"fake": EXPECTED_COST}, abs=1e-3)
    assert facts.instances_billed == 2
    assert facts.instances_terminated == 1
    assert facts.actions["launch"] == {"ok": 1, "partial": 1}
    assert facts.actions["evacuate"] == {"requeued": 1}
    assert facts.actions["terminate"] == {"ok": 1}
    assert facts.lost_gpu_hours == pytest.approx(LOST_GPU_HOURS, abs=1e-4)
    assert facts.budget_capped_hours == pytest.approx({"budget": 60 / 3600}, abs=1e-4)
    assert facts.ticks_by_outcome == {"ok": 6}
    assert report.window.start_s == T0 and report.window.end_s == T0 + A_SECONDS + 60

    assert (out / "report.md").read_text().startswith("# Real spend from the journal")
    assert "<svg" in (out / "report.html").read_text()
    printed = capsys.readouterr().out
    assert "Real (journal)" in printed and "$1.42" in printed


def test_what_a_journal_cannot_know_is_unknown_not_zero(journal_file: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert main(["report", "--journal", str(journal_file), "--out", str(out)]) == 0
    raw = json.loads((out / "report.json").read_text())
    real = raw["policies"][0]
    for unknown in ("wait_s", "jobs_total", "jobs_finished", "onprem_utilisation", "checkpoints"):
        assert real[unknown] is None, unknown
    assert real["gpu_hours"]["useful"] is None and real["gpu_hours"]["cloud_idle"] is None
    assert raw["window"]["jobs"] is None
    row = next(line for line in (out / "report.md").read_text().splitlines() if "Real (" in line)
    assert "| — | — | — |" in row, "waits are shown as unknown"


def test_since_shares_out_the_instance_sums_by_time(journal_file: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    since = iso(T0 + 600)
    assert (
        main(["report", "--journal", str(journal_file), "--out", str(out), "--since", since]) == 0
    )
    report = report_of(out)
    (real,) = report.policies
    # a's sum spans 0..1200 s and b's 0..900 s: the part after 600 s of each
    expected = PRICE_A * 600 / 3600 + PRICE_B * 300 / 3600
    assert real.cost == pytest.approx(expected, abs=0.01)
    assert real.ticks == 5 and real.instances_launched == 0
    assert real.interruptions == 1
    assert report.window.start_s == T0 + 600


def test_a_running_controller_is_read_without_being_disturbed(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    journal = open_sqlite(path)
    try:
        run = start(journal)
        assert main(["report", "--journal", str(path), "--out", str(tmp_path / "mid")]) == 0
        run.clock.advance(60)
        run.tick()  # still writes after the read
    finally:
        journal.close()
    assert main(["report", "--journal", str(path), "--out", str(tmp_path / "end")]) == 0
    assert report_of(tmp_path / "mid").policies[0].ticks == 6
    assert report_of(tmp_path / "end").policies[0].ticks == 7


def test_an_empty_journal_says_there_is_nothing_yet(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "j.db"
    open_sqlite(path).close()
    out = tmp_path / "out"
    assert main(["report", "--journal", str(path), "--out", str(out)]) == 0
    report = report_of(out)
    assert report.findings == [NOTHING_YET]
    assert report.policies[0].ticks == 0
    assert NOTHING_YET in capsys.readouterr().out
    assert (out / "report.md").exists() and (out / "report.html").exists()


@pytest.mark.parametrize(
    ("content", "said"),
    [
        (None, "no such journal file"),
        (b"this is not a database at all" * 100, "cannot be read as a gpu-autoscaler journal"),
        ("other-tables", "is not a gpu-autoscaler journal"),
    ],
)
def test_a_missing_or_damaged_journal_is_one_line_naming_the_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: bytes | str | None, said: str
) -> None:
    path = tmp_path / "j.db"
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif content == "other-tables":
        with sqlite3.connect(path) as other:
            other.execute("CREATE TABLE notes (text TEXT)")
        other.close()
    assert main(["report", "--journal", str(path), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(path) in err and said in err, err
    assert not (tmp_path / "out").exists()


def test_bad_dates_and_stray_options_are_input_errors(
    journal_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = str(tmp_path / "out")
    assert main(["report", "--journal", str(journal_file), "--out", out, "--since", "May"]) == 2
    assert "--since" in capsys.readouterr().err
    assert main(["report", "--since", "2024-01-01", "--out", out]) == 2
    assert "--journal" in capsys.readouterr().err


def test_the_simulators_prediction_stands_beside_the_real_figures(
    journal_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    jobs = [job_row(f"j{i}", i * 900, 3000) for i in range(8)]
    scenario = small_scenario(tmp_path, jobs=jobs)
    out = tmp_path / "out"
    args = ["report", "--journal", str(journal_file), "--out", str(out)]
    assert main([*args, "--compare-scenario", str(scenario), "--no-progress"]) == 0
    report = report_of(out)
    real, predicted = report.policies
    assert real.policy == "journal" and predicted.policy == "cost-aware"
    assert predicted.label.startswith("Simulated: ")
    assert predicted.wait_s is not None, "the simulator knows the waits the journal does not"
    assert any(f.startswith("Per hour, real $") for f in report.findings)
    assert "Simulated: " in capsys.readouterr().out


def test_postgres_journal_reads_the_same_and_never_shows_the_dsn(
    postgres_dsn: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    journal = open_postgres(postgres_dsn)
    try:
        start(journal)
    finally:
        journal.close()
    monkeypatch.setenv(DSN_VAR, postgres_dsn)
    out = tmp_path / "out"
    assert main(["report", "--journal-postgres-env", DSN_VAR, "--out", str(out)]) == 0
    report = report_of(out)
    (real,) = report.policies
    assert real.cost == pytest.approx(EXPECTED_COST, abs=0.01)
    assert real.interruptions == 1 and real.instances_launched == 2
    assert report.journal is not None and report.journal.where.startswith("postgresql://")
    password = str(conninfo_to_dict(postgres_dsn)["password"])
    for name in ("report.json", "report.md", "report.html"):
        assert password not in (out / name).read_text()
    assert password not in capsys.readouterr().out


def test_postgres_that_refuses_is_one_line_without_the_password(
    postgres_dsn: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    secret = "not-the-password-4f1c"
    monkeypatch.setenv(DSN_VAR, make_conninfo(postgres_dsn, password=secret))
    assert main(["report", "--journal-postgres-env", DSN_VAR, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "postgresql://" in err
    assert secret not in err
    monkeypatch.delenv(DSN_VAR)
    assert main(["report", "--journal-postgres-env", DSN_VAR, "--out", str(tmp_path)]) == 2
    assert DSN_VAR in capsys.readouterr().err


def test_onprem_gpus_allocated_on_idle_nodes_are_reported_with_the_top_nodes(
    tmp_path: Path,
) -> None:
    """What the journal counted tick by tick, in total and for the nodes that wasted most; a
    period cut by --since counts the ticks inside it and shares each node-day sum by time."""
    path = tmp_path / "j.db"
    journal = open_sqlite(path)
    idle = (
        IdleNode("gpu-07", 8, T0 - 3600),  # idle all along, 8 GPUs held
        IdleNode("gpu-02", 2, T0 - 3600),
    )
    for number in range(5):  # ticks at T0 .. T0 + 240; the first counts nothing
        entry = TickEntry(
            "t", number, 1, T0 + 60 * number, 0.01, "ok", None, True, 0, 0, 0.0, {}, [], idle
        )
        journal.record_tick(entry, [], [])
    journal.record_tick(
        TickEntry("t", 5, 1, T0 + 300, 0.01, "ok", None, True, 0, 0, 0.0, {}, [], None), [], []
    )
    journal.close()

    out = tmp_path / "out"
    assert main(["report", "--journal", str(path), "--out", str(out)]) == 0
    report = report_of(out)
    (real,) = report.policies
    assert report.journal is not None
    total = (8 + 2) * 240 / 3600
    assert real.gpu_hours.onprem_allocated_idle == pytest.approx(total, abs=0.01)
    assert report.journal.onprem_idle_gpu_hours == pytest.approx(total, abs=1e-4)
    top = report.journal.onprem_idle_top_nodes
    assert [n.node for n in top] == ["gpu-07", "gpu-02"], "the node that wasted most first"
    assert [n.gpu_hours for n in top] == pytest.approx([8 * 240 / 3600, 2 * 240 / 3600], abs=1e-4)
    assert report.journal.onprem_idle_unknown_ticks == 1
    raw = json.loads((out / "report.json").read_text())
    assert raw["policies"][0]["gpu_hours"]["onprem_allocated_idle"] == pytest.approx(0.67)
    markdown = (out / "report.md").read_text()
    assert "On-prem GPUs allocated while their node read idle: 0.67 GPU-h" in markdown
    assert "gpu-07 0.53" in markdown and "1 tick(s) could not know" in markdown
    assert "GPU-h on-prem allocated idle" in markdown
    assert "gpu-07" in (out / "report.html").read_text()

    cut = tmp_path / "cut"
    since = iso(T0 + 120)
    assert main(["report", "--journal", str(path), "--out", str(cut), "--since", since]) == 0
    later = report_of(cut)
    assert later.journal is not None
    # ticks at T0 + 120, 180 and 240 count 60 s each; the node-day sums span T0 .. T0 + 240
    assert later.journal.onprem_idle_gpu_hours == pytest.approx(10 * 180 / 3600, abs=1e-4)
    assert later.journal.onprem_idle_top_nodes[0].gpu_hours == pytest.approx(
        8 * 240 / 3600 * 120 / 240, abs=1e-4
    )


def test_a_journal_that_never_knew_says_unknown_not_zero(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    journal = open_sqlite(path)
    for number in range(3):
        entry = TickEntry("t", number, 1, T0 + 60 * number, 0.01, "ok", None, True, 0, 0, 0.0, {})
        journal.record_tick(entry, [], [])
    journal.close()
    out = tmp_path / "out"
    assert main(["report", "--journal", str(path), "--out", str(out)]) == 0
    report = report_of(out)
    assert report.policies[0].gpu_hours.onprem_allocated_idle is None
    assert report.journal is not None and report.journal.onprem_idle_gpu_hours is None
    assert "read idle: unknown" in (out / "report.md").read_text()
