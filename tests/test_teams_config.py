"""Teams in the config and the model: guarantees that cannot fit the on-prem fleet are one
`validate` line naming the teams; a team jobs name that the config does not list is a team of
its own on the unassigned terms, said once; demand folds per team and loses no job."""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from fakes import job, pool, rig
from hypothesis import given
from hypothesis import strategies as st

from autoscaler.model import Job
from autoscaler.model.config import ControllerConfig
from autoscaler.model.teams import UNASSIGNED, TeamBook, TeamsConfig, TeamSpec, overcommitted
from autoscaler.ops.metrics import Metrics
from autoscaler.spi.sources import aggregate

ROOT = Path(__file__).resolve().parent.parent
SCENARIO = ROOT / "autoscaler/data/scenarios/synthetic-bursty.yaml"


def validate(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "autoscaler.cli", "validate", str(path)],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )


def test_guarantees_over_the_fleet_are_one_validate_line_naming_the_teams(tmp_path: Path) -> None:
    config = tmp_path / "controller.yaml"
    config.write_text(
        "fleet_id: demo\n"
        "teams:\n"
        "  onprem_gpus: 32\n"
        "  teams:\n"
        "    research: {guaranteed_gpus: 24, weight: 2}\n"
        "    serving: {guaranteed_gpus: 16, burst_gpus: 8}\n"
        "    interns: {burst_gpus: 4}\n"
    )
    done = validate(config)
    assert done.returncode == 2
    (line,) = done.stderr.strip().splitlines()
    assert f"{config}:3: teams:" in line  # where the teams mapping starts
    assert "guaranteed_gpus add up to 40 (research 24, serving 16)" in line
    assert "more than the on-prem fleet's 32 GPUs" in line
    assert "Traceback" not in done.stderr and "interns" not in line

    config.write_text(config.read_text().replace("onprem_gpus: 32", "onprem_gpus: 40"))
    assert validate(config).returncode == 0


def test_a_scenario_checks_the_guarantees_against_its_own_on_prem_fleet(tmp_path: Path) -> None:
    scenario = yaml.safe_load(SCENARIO.read_text())
    onprem = sum(node["gpus"] * node.get("count", 1) for node in scenario.get("onprem", []))
    assert onprem > 0
    scenario["controller"]["teams"] = {
        "teams": {"a": {"guaranteed_gpus": onprem}, "b": {"guaranteed_gpus": 1}}
    }
    bad = tmp_path / "scenario.yaml"
    bad.write_text(yaml.safe_dump(scenario))
    done = validate(bad)
    assert done.returncode == 2, done.stdout
    assert f"add up to {onprem + 1} (a {onprem}, b 1)" in done.stderr
    assert f"on-prem fleet's {onprem} GPUs" in done.stderr


@given(
    st.dictionaries(
        st.from_regex(r"[a-z]{1,8}", fullmatch=True),
        st.integers(0, 64),
        max_size=6,
    ),
    st.integers(0, 256),
)
def test_overcommitted_says_so_exactly_when_the_sum_exceeds_the_fleet(
    guarantees: dict[str, int], fleet: int
) -> None:
    teams = {name: TeamSpec(guaranteed_gpus=gpus) for name, gpus in guarantees.items()}
    said = overcommitted(teams, fleet)
    assert (said is not None) == (sum(guarantees.values()) > fleet)
    if said is not None:
        assert all(name in said for name, gpus in guarantees.items() if gpus)


def test_an_unlisted_team_is_its_own_on_the_unassigned_terms_said_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    book = TeamBook(
        TeamsConfig(
            teams={"research": TeamSpec(guaranteed_gpus=8)},
            unassigned=TeamSpec(guaranteed_gpus=0, burst_gpus=2),
        )
    )
    with caplog.at_level(logging.WARNING):
        assert book.name("research") == "research"
        assert [book.name("vision") for _ in range(3)] == ["vision"] * 3
        assert book.name(None) == book.name("") == UNASSIGNED
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1 and "'vision' is not in the config's teams" in said[0]
    assert book.spec("vision").burst_gpus == 2 and book.spec("research").guaranteed_gpus == 8


job_strategy = st.builds(
    Job,
    id=st.from_regex(r"j[0-9]{1,6}", fullmatch=True),
    gpus=st.sampled_from([1, 2, 4, 8]),
    submit_time=st.floats(0, 1e6),
    high_priority=st.booleans(),
    team=st.sampled_from([None, "research", "serving", "vision"]),
)


@given(st.lists(job_strategy, max_size=60))
def test_demand_folds_per_team_and_loses_no_job(jobs: list[Job]) -> None:
    groups = aggregate(jobs)
    for team in {j.team for j in jobs}:
        mine = [g for g in groups if g.team == team]
        assert sum(g.jobs for g in mine) == sum(1 for j in jobs if j.team == team)
        assert sum(g.gpus for g in mine) == sum(j.gpus for j in jobs if j.team == team)
    keys = [(g.gpus_per_job, g.high_priority, g.team) for g in groups]
    assert len(keys) == len(set(keys)), "one group per shape and team"


def test_a_config_without_teams_is_one_fleet_as_before() -> None:
    config = ControllerConfig.model_validate({"fleet_id": "f"})
    assert config.teams is None
    assert TeamBook(config.teams).spec("anyone") == TeamSpec()


def test_pending_gpus_are_on_metrics_by_team() -> None:
    metrics = Metrics()
    t = rig([pool("a")], {"a": 1.0}, metrics=metrics)
    t.queue.jobs = [
        job("r1", 2).model_copy(update={"team": "research"}),
        job("r2", 4).model_copy(update={"team": "research"}),
        job("s1", 1).model_copy(update={"team": "serving"}),
        job("n1", 8),
    ]
    t.controller.tick()
    value = metrics.registry.get_sample_value
    assert value("gpu_autoscaler_team_pending_gpus", {"team": "research"}) == 6
    assert value("gpu_autoscaler_team_pending_gpus", {"team": "serving"}) == 1
    assert value("gpu_autoscaler_team_pending_gpus", {"team": UNASSIGNED}) == 8
    t.queue.jobs = []
    t.controller.tick()
    assert value("gpu_autoscaler_team_pending_gpus", {"team": "research"}) is None


def test_the_controller_says_once_that_jobs_name_a_team_the_config_lacks(
    caplog: pytest.LogCaptureFixture,
) -> None:
    teams = TeamsConfig(teams={"research": TeamSpec(guaranteed_gpus=0)})
    t = rig([pool("a")], {"a": 1.0}, teams=teams)
    t.queue.jobs = [
        job("r", 1).model_copy(update={"team": "research"}),
        job("v", 1).model_copy(update={"team": "vision"}),
    ]
    with caplog.at_level(logging.WARNING, "autoscaler.model.teams"):
        t.controller.tick()
        t.controller.tick()
    said = [r.getMessage() for r in caplog.records if r.name == "autoscaler.model.teams"]
    assert len(said) == 1 and "'vision'" in said[0]
