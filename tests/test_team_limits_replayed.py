"""A team's burst limits held by the live controller's guard, replayed through the simulator:
the controller accrues each team's spend and tells the guard whom each instance was bought
for, so a capped team's cloud GPUs never pass its limit while another team's still grow."""

from __future__ import annotations

from pathlib import Path

from team_replays import replayed, row, scenario

from autoscaler.sim import SimResult

TEAMS = """
teams:
  capped: {burst_gpus: CAP}
  free: {}
"""
SPOT = (
    "{name: spot, market: spot, provider: aws, region: r1, instance_type: small, "
    "gpus_per_instance: 1, boot_seconds: 60}"
)


def replay_teams(tmp_path: Path, cap: int, teams: tuple[str, ...]) -> SimResult:
    rows = [row(f"{t}{n}", 0, 3_000, 1, t, 1) for t in teams for n in range(8)]
    text = scenario(
        "burst",
        [1],
        TEAMS.replace("CAP", str(cap)),
        window_s=20_000,
        limits="{scale_down_cooldown_s: 0}",
        pool=SPOT,
        market="  pools: {spot: {interruption_rate_per_hour: 0.0}}\n",
    )
    return replayed(tmp_path, text, rows)


def test_a_capped_team_never_holds_more_cloud_gpus_than_its_burst_limit(tmp_path: Path) -> None:
    result = replay_teams(tmp_path, 2, ("capped",))
    assert result.jobs_finished == 8
    assert max(result.timeline.cloud_gpus) == 2  # one on-prem GPU, two cloud, never more


def test_the_cap_binds_one_team_and_not_the_other(tmp_path: Path) -> None:
    result = replay_teams(tmp_path, 2, ("capped", "free"))
    assert result.jobs_finished == 16
    # the free team's eight jobs less what on-prem took, beside the capped team's two
    assert max(result.timeline.cloud_gpus) >= 8
    capped_cloud = result.team_bill.team_gpu_s("capped") - result.team_bill.team_gpu_s(
        "capped", "on-prem"
    )
    free_cloud = result.team_bill.team_gpu_s("free") - result.team_bill.team_gpu_s(
        "free", "on-prem"
    )
    assert free_cloud > capped_cloud > 0
