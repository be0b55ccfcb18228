"""`gpu-autoscaler report` end to end: a small scenario in, three report files out, a summary on
stdout; a bad scenario out as one line on stderr, leaving an earlier report as it was."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from test_sim_engine import job_row, small_scenario

from autoscaler.report.model import Report


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "autoscaler.cli", *args], capture_output=True, text=True, check=False
    )


def test_report_writes_json_markdown_and_html(tmp_path: Path) -> None:
    jobs = [
        job_row(f"j{i}", i * 900, 3000 + 100 * i, preemptible=int(i % 3 != 0)) for i in range(30)
    ]
    scenario = small_scenario(tmp_path, jobs=jobs)
    out = tmp_path / "out"
    done = run("report", "--scenario", str(scenario), "--out", str(out), "--no-progress")
    assert done.returncode == 0, done.stderr
    assert "cost-aware (default)" in done.stdout and "cheapest-spot" in done.stdout
    assert "Checkpointing: preemptible=True" in done.stdout
    report = Report.model_validate_json((out / "report.json").read_text())
    assert [p.policy for p in report.policies] == ["cost-aware", "cheapest-spot", "on-demand"]
    assert [b.max_wait_s for b in report.lower_bounds] == [0.0, 120.0]
    for policy in report.policies:
        for bound in report.lower_bounds:
            assert bound.cost is not None and policy.cost >= bound.cost - 1e-6
    html = (out / "report.html").read_text()
    assert "<svg" in html and "cheapest-spot" in html
    assert (out / "report.md").read_text().startswith("#")
    comparison = report.checkpoint_comparison
    assert comparison is not None and comparison.policy == "cost-aware"
    default = report.policies[0]
    assert comparison.aware.gpu_hours_lost == default.gpu_hours.lost, "the default's own run"
    assert comparison.aware.cost == default.cost
    assert "Checkpoint awareness (cost-aware, same trace)" in done.stdout
    assert "| cost-aware: without |" in done.stdout


def test_checkpoint_awareness_loses_less_work_on_the_same_trace(tmp_path: Path) -> None:
    availability = "".join(
        f"t,availability,1-node,aws,z,small,2024-01-01,60,{a},{a + 10},{a * 60},600,"
        f"{int(a % 20 == 0)}\n"
        for a in range(0, 1440, 10)
    )
    jobs = [job_row("local", 0, 86000)] + [
        job_row(f"j{i}", i * 1200, 2400 + 300 * (i % 5)) for i in range(40)
    ]
    scenario = small_scenario(
        tmp_path,
        jobs=jobs,
        availability=availability,
        market="pools: {spot: {availability_trace: t}}",
    )
    out = tmp_path / "out"
    args = ["report", "--scenario", str(scenario), "--out", str(out), "--no-progress"]
    done = run(*args, "--policy", "cost-aware", "--no-lower-bound")
    assert done.returncode == 0, done.stderr
    comparison = Report.model_validate_json((out / "report.json").read_text()).checkpoint_comparison
    assert comparison is not None
    assert comparison.aware.interruptions > 0 and comparison.unaware.interruptions > 0
    assert comparison.aware.gpu_hours_lost < comparison.unaware.gpu_hours_lost


def test_one_policy_without_the_bound(tmp_path: Path) -> None:
    scenario = small_scenario(tmp_path, jobs=[job_row("a", 0, 600), job_row("b", 0, 600)])
    out = tmp_path / "out"
    done = run(
        "report",
        "--scenario",
        str(scenario),
        "--out",
        str(out),
        "--policy",
        "on-demand",
        "--no-lower-bound",
        "--no-progress",
    )
    assert done.returncode == 0, done.stderr
    data = json.loads((out / "report.json").read_text())
    assert [p["policy"] for p in data["policies"]] == ["on-demand"]
    assert data["lower_bounds"] == []


def test_bad_scenario_is_one_line_and_keeps_the_previous_report(tmp_path: Path) -> None:
    scenario = small_scenario(tmp_path, jobs=[job_row("a", 0, 600)])
    out = tmp_path / "out"
    assert (
        run(
            "report",
            "--scenario",
            str(scenario),
            "--out",
            str(out),
            "--no-progress",
            "--no-lower-bound",
        ).returncode
        == 0
    )
    before = (out / "report.json").read_text()
    scenario.write_text(scenario.read_text().replace("tick_seconds: 60", "tick_seconds: -1"))
    done = run("report", "--scenario", str(scenario), "--out", str(out), "--no-progress")
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert "controller.tick_seconds" in done.stderr and "greater than 0" in done.stderr
    assert (out / "report.json").read_text() == before
    unknown = run("report", "--scenario", str(scenario), "--policy", "nope")
    assert unknown.returncode == 2


def test_validate_a_scenario(tmp_path: Path) -> None:
    scenario = small_scenario(tmp_path, jobs=[job_row("a", 0, 600)])
    done = run("validate", str(scenario))
    assert done.returncode == 0 and "scenario 'small', 1 jobs, 2 pools, 3 policies" in done.stdout
    scenario.write_text(scenario.read_text().replace("- name: on-demand", "- name: on-demnd"))
    done = run("validate", str(scenario))
    assert done.returncode == 2 and "no policy named 'on-demnd'" in done.stderr
