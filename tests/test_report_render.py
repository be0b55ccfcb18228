"""The report renderers and writer, on a small report built by hand (no replay needed)."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

import autoscaler.report.write as write_module
from autoscaler.model.errors import InputError
from autoscaler.report.model import (
    GpuHours,
    Percentiles,
    PolicyResult,
    PolicyTimeline,
    PoolCost,
    PoolRow,
    Report,
    Series,
    WindowInfo,
)
from autoscaler.report.render import render_html, render_markdown, summary_markdown
from autoscaler.report.write import write_report
from autoscaler.sim.lowerbound_result import LowerBoundResult

CHECKPOINT_ASSUMPTION = "Checkpointing: no job checkpoints (the scenario states no rule)."
HOURS = [0.0, 6.0, 12.0, 24.0, 36.0, 48.0]


def _series(values: list[float]) -> Series:
    return Series(t_hours=HOURS, values=values)


def _timeline(final_cost: float, pending: float) -> PolicyTimeline:
    cost = [final_cost * t / HOURS[-1] for t in HOURS]
    return PolicyTimeline(
        cost=_series(cost),
        cost_per_hour=_series([final_cost / HOURS[-1]] * len(HOURS)),
        pending_gpus=_series([pending, 0.0, pending, 2.0, 0.0, 0.0]),
        running_gpus=_series([8.0, 16.0, 12.0, 10.0, 8.0, 4.0]),
        cloud_gpus=_series([0.0, 8.0, 4.0, 2.0, 0.0, 0.0]),
        onprem_busy_gpus=_series([8.0, 8.0, 8.0, 8.0, 8.0, 4.0]),
        wait_p95_by_hour=Series(t_hours=[0.0, 1.0, 2.0, 30.0], values=[0.0, 120.0, 900.0, 45.0]),
    )


def _policy(policy: str, label: str, cost: float, ratios: dict[str, float | None]) -> PolicyResult:
    return PolicyResult(
        policy=policy,
        label=label,
        params={"max_wait_s": 600} if policy == "cost-aware" else {},
        cost=cost,
        cost_by_pool=[
            PoolCost(pool="aws-spot-a100", cost=cost, instance_hours=cost / 10),
            PoolCost(pool="gcp-od-a100", cost=0.0, instance_hours=0.0),
        ],
        cost_per_useful_gpu_hour=cost / 400.0,
        wait_s=Percentiles(p50=12.0, p95=640.0, p99=1800.0, max=3600.0),
        jobs_total=120,
        jobs_finished=118,
        jobs_never_started=1,
        gpu_hours=GpuHours(
            useful=400.0,
            allocated_onprem=300.0,
            allocated_cloud=110.0,
            cloud_paid=130.0,
            cloud_idle=20.0,
            lost=10.0,
            checkpointing=2.5,
        ),
        onprem_utilisation=0.951,
        interruptions=7,
        checkpoints=42,
        requeues=7,
        instances_launched=15,
        capacity_failures=3,
        held_ticks=0,
        clamps={"max_instances": 2},
        ratio_to_lower_bound=ratios,
        ticks=2880,
        replay_wall_s=1.5,
        tick_ms=Percentiles(p50=0.2, p95=0.9, p99=1.4, max=3.0),
        timeline=_timeline(cost, pending=4.0),
    )


def sample_report() -> Report:
    return Report(
        scenario="two-day-sample",
        description="Two days of the sample trace against three policies.",
        source="scenarios/sample.yaml",
        seed=7,
        start="2024-03-01T00:00:00Z",
        wait_target_s=600.0,
        onprem_gpus=8,
        window=WindowInfo(
            trace="traces/sample.csv",
            start_s=0.0,
            end_s=172800.0,
            days=2.0,
            jobs=120,
            carried_jobs=3,
            gpu_hours_submitted=410.0,
            skipped={"zero_gpus": 4},
        ),
        assumptions=[CHECKPOINT_ASSUMPTION, "On-prem GPUs cost nothing in the report."],
        pools=[
            PoolRow(
                name="aws-spot-a100",
                provider="aws",
                region="us-east-1",
                zone="us-east-1a",
                instance_type="p4d.24xlarge",
                gpus=8,
                market="spot",
                price_per_hour_at_start=9.8765,
                interruptions="0.05000/instance-hour",
            ),
            PoolRow(
                name="gcp-od-a100",
                provider="gcp",
                region="us-central1",
                zone=None,
                instance_type="a2-highgpu-8g",
                gpus=8,
                market="on-demand",
                price_per_hour_at_start=29.39,
                interruptions="none",
            ),
        ],
        lower_bounds=[
            LowerBoundResult(
                max_wait_s=0.0, cost=1000.0, method="lp", bin_s=300.0, status="optimal", solve_s=0.4
            ),
            LowerBoundResult(
                max_wait_s=600.0,
                cost=800.0,
                method="lp",
                bin_s=300.0,
                status="optimal",
                solve_s=1.2,
            ),
        ],
        policies=[
            _policy("cost-aware", "Cost-aware", 12345.0, {"W=0s": 12.345, "W=600s": 15.43}),
            _policy("on-demand", "On-demand only <b>", 30100.5, {"W=0s": 30.1, "W=600s": None}),
            _policy("cheapest-spot", "Cheapest spot", 99.5, {"W=0s": 0.0995, "W=600s": 0.1244}),
        ],
        default_policy="cost-aware",
        findings=[
            "Cost-aware costs 0.41x On-demand only <b> ($12,345 vs $30,100) at p95 wait 640 s.",
        ],
    )


@pytest.fixture
def report() -> Report:
    return sample_report()


@pytest.fixture(scope="module")
def page() -> str:
    """Rendered once: each render draws three figures, which takes a noticeable fraction of a
    second."""
    return render_html(sample_report())


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


# ---------------------------------------------------------------- Markdown


def test_markdown_shows_every_policy_cost_ratio_and_assumption(report: Report) -> None:
    text = render_markdown(report)
    for policy in report.policies:
        assert policy.label in text
    assert "$12,345" in text
    assert "$30,100" in text or "$30,101" in text
    assert "$99.50" in text
    assert "÷ LB W=0s" in text
    assert "÷ LB W=600s" in text
    assert "12.35x" in text
    assert "15.43x" in text
    for line in report.assumptions:
        assert line in text
    assert "95.1 %" in text
    assert "118/120" in text


def test_markdown_shows_window_bounds_pools_and_replay(report: Report) -> None:
    text = render_markdown(report)
    assert text.startswith("# Dry-run cost report: two-day-sample\n")
    assert "traces/sample.csv" in text
    assert "2 days" in text
    assert "3 carried in" in text
    assert "zero_gpus: 4" in text
    assert "| 600 s | $800 | lp | optimal |" in text
    assert "us-east-1a" in text
    assert "$9.88" in text
    assert "2,880" in text
    assert "max_wait_s=600" in text


def test_markdown_lists_only_pools_with_cost(report: Report) -> None:
    text = render_markdown(report)
    cost_by_pool = text.split("## Cost by pool", 1)[1].split("## GPU-hours", 1)[0]
    assert "aws-spot-a100" in cost_by_pool
    assert "gcp-od-a100" not in cost_by_pool


def test_markdown_table_rows_line_up_with_headers(report: Report) -> None:
    text = render_markdown(report)
    comparison = text.split("## Comparison", 1)[1].split("\n## ", 1)[0]
    tables = [b.splitlines() for b in comparison.strip().split("\n\n") if b.startswith("|")]
    assert len(tables) == 2
    for table in tables:
        widths = {len(re.split(r"(?<!\\)\|", line)) for line in table}
        assert len(table) == 2 + len(report.policies)
        assert len(widths) == 1


def test_markdown_is_deterministic(report: Report) -> None:
    assert render_markdown(report) == render_markdown(report.model_copy(deep=True))


def test_summary_has_table_bounds_findings_and_assumptions(report: Report) -> None:
    text = summary_markdown(report)
    assert "| Policy |" in text
    assert "÷ LB W=600s" in text
    for policy in report.policies:
        assert policy.label in text
    assert report.findings[0] in text
    assert "Lower bound W=600 s: $800" in text
    assert CHECKPOINT_ASSUMPTION in text
    assert len(text) < len(render_markdown(report))


def test_summary_without_findings_or_bounds_says_so(report: Report) -> None:
    bare = report.model_copy(update={"findings": [], "lower_bounds": []})
    text = summary_markdown(bare)
    assert "No findings." in text
    assert "Lower bound" not in text


# ---------------------------------------------------------------- HTML


def test_html_is_self_contained(page: str) -> None:
    assert page.startswith("<!DOCTYPE html>")
    assert page.count("<svg") == 4
    assert "<style>" in page
    assert not re.search(r"""(?:src|href)\s*=\s*["']?\s*(?:https?:)?//""", page, re.IGNORECASE)
    assert not re.search(r"<script\b", page, re.IGNORECASE)
    assert "@import" not in page
    assert "<link" not in page
    assert "<img" not in page
    assert "<?xml" not in page


def test_html_escapes_text(page: str) -> None:
    assert "<b>" not in page
    assert "On-demand only &lt;b&gt;" in page


def test_html_has_the_tables_and_assumptions(page: str) -> None:
    assert "÷ LB W=0s" in page
    assert "$12,345" in page
    assert CHECKPOINT_ASSUMPTION in page
    assert page.count("<table") >= 7


def test_html_ids_are_unique(page: str) -> None:
    ids = re.findall(r'\bid="([^"]+)"', page)
    assert ids
    assert len(ids) == len(set(ids))


def test_html_is_byte_for_byte_deterministic(page: str, report: Report) -> None:
    assert render_html(report) == page


def test_html_handles_a_missing_bound_and_odd_labels(report: Report) -> None:
    infeasible = report.lower_bounds[0].model_copy(update={"cost": None, "status": "infeasible"})
    odd = report.policies[0].model_copy(update={"label": "_costs $1 to $2"})
    varied = report.model_copy(
        update={"lower_bounds": [infeasible], "policies": [odd, *report.policies[1:]]}
    )
    page = render_html(varied)
    assert "none (infeasible)" in page
    assert "_costs $1 to $2" in page


# ---------------------------------------------------------------- writing


def test_write_report_writes_three_files_and_json_round_trips(
    report: Report, tmp_path: Path
) -> None:
    out = tmp_path / "new" / "folder"
    written = write_report(report, out)
    assert sorted(p.name for p in written) == ["report.html", "report.json", "report.md"]
    assert sorted(p.name for p in out.iterdir()) == ["report.html", "report.json", "report.md"]
    loaded = Report.model_validate_json((out / "report.json").read_text(encoding="utf-8"))
    assert loaded == report
    assert (out / "report.md").read_text(encoding="utf-8") == render_markdown(report)
    assert (out / "report.html").read_text(encoding="utf-8") == render_html(report)


def test_rendering_failure_leaves_the_folder_as_it_was(
    report: Report, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "report.md").write_text("previous report\n", encoding="utf-8")
    before = _snapshot(tmp_path)

    def broken(_report: Report) -> str:
        raise RuntimeError("render failed")

    monkeypatch.setattr(write_module, "render_html", broken)
    with pytest.raises(RuntimeError, match="render failed"):
        write_report(report, tmp_path)
    assert _snapshot(tmp_path) == before


def test_rendering_failure_does_not_create_the_folder(
    report: Report, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(_report: Report) -> str:
        raise RuntimeError("render failed")

    monkeypatch.setattr(write_module, "render_markdown", broken)
    with pytest.raises(RuntimeError):
        write_report(report, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_failed_write_keeps_the_old_file_and_removes_the_temporary(
    report: Report, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "report.md").write_text("previous report\n", encoding="utf-8")
    real_replace = os.replace

    def failing_replace(src: str | Path, dst: str | Path) -> None:
        if Path(dst).name == "report.md":
            raise OSError(28, "No space left on device")
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", failing_replace)
    with pytest.raises(InputError, match=r"cannot write report\.md: No space left on device"):
        write_report(report, tmp_path)
    assert (tmp_path / "report.md").read_text(encoding="utf-8") == "previous report\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.json", "report.md"]


def test_out_dir_that_is_a_file_is_an_input_error(report: Report, tmp_path: Path) -> None:
    target = tmp_path / "report"
    target.write_text("not a folder", encoding="utf-8")
    with pytest.raises(InputError) as caught:
        write_report(report, target)
    assert caught.value.where == str(target)
    assert "not a directory" in caught.value.message
    assert target.read_text(encoding="utf-8") == "not a folder"


def test_out_dir_under_a_file_is_an_input_error(report: Report, tmp_path: Path) -> None:
    blocker = tmp_path / "blocker"
    blocker.write_text("", encoding="utf-8")
    with pytest.raises(InputError, match="cannot create the folder"):
        write_report(report, blocker / "out")
