"""Slurm and Kubernetes name the team of the demand they read (issue 19): Slurm by the job's
account (or the field ``team_from`` names) on the real test cluster, Kubernetes by the pod's
namespace (or ``team_label``) on the API emulator; a value that cannot be a team is said once and
its jobs count under no team, never dropped."""

from __future__ import annotations

import copy
import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from k8s_api_emulator import K8sApi
from k8s_cluster import pod, tried
from k8s_source_support import make_source
from slurm_cluster import SlurmCluster

from autoscaler.model.errors import InputError
from autoscaler.sources.kubernetes import KubernetesSource
from autoscaler.sources.kubernetes.demand import pending_demand
from autoscaler.sources.kubernetes.pods import PodRules
from autoscaler.sources.kubernetes.settings import KubernetesSettings
from autoscaler.sources.slurm import DEFAULT_IGNORED_REASONS, SlurmAdapter
from autoscaler.sources.slurm_json import DemandRules, demand_groups, pending_jobs
from autoscaler.sources.team_names import MAX_TEAM_CHARS, TeamNames

CAPTURED = json.loads((Path(__file__).parent / "data" / "slurm" / "squeue.json").read_text())


def _teams(groups: Any) -> dict[str | None, int]:
    found: dict[str | None, int] = {}
    for group in groups:
        found[group.team] = found.get(group.team, 0) + group.gpus
    return found


# -- Slurm ---------------------------------------------------------------------------------------


@pytest.fixture
def hpc(slurm_cluster: SlurmCluster) -> Iterator[SlurmCluster]:
    """The shared cluster with its on-prem nodes drained, so GPU jobs wait; reset afterwards."""
    for node in slurm_cluster.onprem_nodes:
        slurm_cluster.run("scontrol", "update", f"nodename={node}", "state=drain", "reason=test")
    yield slurm_cluster
    slurm_cluster.reset()


def _adapter(cluster: SlurmCluster, **settings: Any) -> SlurmAdapter:
    return SlurmAdapter.from_config({"slurm_conf": str(cluster.conf), **settings}, "hpc")


def test_slurm_demand_is_counted_per_account_or_the_field_team_from_names(
    hpc: SlurmCluster,
) -> None:
    hpc.sbatch("--account=vision", "--gres=gpu:2", "--wrap", "sleep 60")
    hpc.sbatch("--account=vision", "--gres=gpu:2", "--wrap", "sleep 60")
    hpc.sbatch("--account=speech", "--gres=gpu:1", "--wrap", "sleep 60")
    hpc.sbatch("-p", "onprem", "--account=speech", "--gres=gpu:4", "--wrap", "sleep 60")

    by_account = _adapter(hpc).read(0.0)
    assert _teams(by_account) == {"vision": 4, "speech": 5}
    (vision,) = [g for g in by_account if g.team == "vision"]
    assert vision.jobs == 2, "one account's jobs of one shape are one group"

    assert _teams(_adapter(hpc, team_from="partition").read(0.0)) == {"gpu": 5, "onprem": 4}
    assert _teams(_adapter(hpc, team_from="none").read(0.0)) == {None: 9}


def test_team_from_names_a_field_slurm_gives() -> None:
    with pytest.raises(InputError, match=r"sources\.hpc\.team_from"):
        SlurmAdapter.from_config({"team_from": "user"}, "hpc")


def _captured_pending() -> dict[str, Any]:
    """A pending GPU job as Slurm 22.05's ``squeue --json`` writes it (every field)."""
    for job in CAPTURED["jobs"]:
        if job["job_state"] == "PENDING" and job["tres_per_node"]:
            return dict(job)
    raise AssertionError("the captured queue has a pending GPU job")


def _queue(*accounts: Any) -> str:
    base = _captured_pending()
    jobs = []
    for index, account in enumerate(accounts):
        job = copy.deepcopy(base)
        job.update(job_id=900_000 + index, account=account, array_task_string="")
        jobs.append(job)
    return json.dumps({**CAPTURED, "jobs": jobs})


def test_an_account_that_cannot_be_a_team_is_said_once_and_its_jobs_still_count(
    caplog: pytest.LogCaptureFixture,
) -> None:
    long = "a" * (MAX_TEAM_CHARS + 1)
    text = _queue("vision", "", long, "bad\nline", 7, long, None, "x" * MAX_TEAM_CHARS)
    rules = DemandRules(ignored_reasons=frozenset(DEFAULT_IGNORED_REASONS))
    with caplog.at_level(logging.WARNING):
        groups = demand_groups(text, rules)
        again = demand_groups(text, rules)
    assert groups == again
    per_job = _teams(groups)
    each = sum(per_job.values()) // 8
    assert per_job == {"vision": each, None: 6 * each, "x" * MAX_TEAM_CHARS: each}
    said = [r.getMessage() for r in caplog.records if "no team" in r.getMessage()]
    assert len(said) == 3, "each bad value once, whatever the number of its jobs and reads"
    assert all("\n" not in line and len(line) < 400 for line in said)
    jobs = pending_jobs(text, rules)
    assert [j.team for j in jobs if j.id == "900000"] == ["vision"]


def test_a_team_name_is_remembered_not_checked_per_job() -> None:
    names = TeamNames("test", "account")
    assert names("ml") == "ml"
    assert names("ml") is names("ml")
    assert names("") is None and names(None) is None
    assert names({"number": 1}) is None


# -- Kubernetes ----------------------------------------------------------------------------------


def test_kubernetes_demand_is_counted_per_namespace_or_team_label(
    k8s_api: K8sApi, monkeypatch: pytest.MonkeyPatch
) -> None:
    labelled = {"example.com/team": "speech"}
    k8s_api.put("pods", tried(pod("a", "vision", gpus=1)))
    k8s_api.put("pods", tried(pod("b", "vision", gpus=2)))
    k8s_api.put("pods", tried(pod("c", "research", gpus=4, labels=labelled)))
    gang = {"scheduling.x-k8s.io/pod-group": "ring"}
    k8s_api.put("pods", tried(pod("ring-0", "research", gpus=8, labels=gang, created=10)))
    k8s_api.put("pods", tried(pod("ring-1", "research", gpus=8, labels=gang | labelled)))

    by_namespace = make_source(k8s_api, monkeypatch)
    assert _teams(by_namespace.read(1.0)) == {"vision": 3, "research": 20}
    by_namespace.close()

    by_label = make_source(k8s_api, monkeypatch, team_label="example.com/team")
    groups = by_label.read(1.0)
    # the gang's team is its first member's (ring-0, made first, has no label)
    assert _teams(groups) == {None: 3 + 16, "speech": 4}
    by_label.close()


def test_team_label_is_a_label_key() -> None:
    with pytest.raises(InputError, match=r"sources\.cluster\.team_label"):
        KubernetesSource.from_config({"team_label": "not a key"}, "cluster")


def test_a_label_that_cannot_be_a_team_counts_under_no_team(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The API server refuses such label values; a proxy or an old object may still hold one."""
    rules = PodRules.of(KubernetesSettings(team_label="team"))
    pods = [
        tried(pod("a", "ml", gpus=1, labels={"team": "bad\u2028value"}, created=1)),
        tried(pod("b", "ml", gpus=1, labels={"team": "t" * (MAX_TEAM_CHARS + 1)}, created=1)),
        tried(pod("c", "ml", gpus=1, labels={"team": "vision"}, created=1)),
    ]
    with caplog.at_level(logging.WARNING):
        reading = pending_demand(pods, rules)
    assert not any(reading.problems.values()), "every pod is read"
    assert _teams(reading.groups) == {None: 2, "vision": 1}
    assert sum("no team" in r.getMessage() for r in caplog.records) == 2
