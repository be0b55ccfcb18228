"""``/healthz``, ``/readyz`` and ``/metrics`` on one port, over real HTTP."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from fakes import job, pool, rig
from waits import bound

from autoscaler.ops.health import Readiness, StatusServer
from autoscaler.ops.journal.base import open_sqlite
from autoscaler.ops.metrics import Metrics


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def served() -> Iterator[tuple[StatusServer, Readiness, Clock, Metrics]]:
    clock = Clock()
    metrics = Metrics()
    readiness = Readiness(tick_seconds=10.0, monotonic=clock)
    server = StatusServer(metrics.registry, readiness, "127.0.0.1", 0)
    server.start()
    try:
        yield server, readiness, clock, metrics
    finally:
        server.close()


def get(server: StatusServer, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(
            f"http://127.0.0.1:{server.port}{path}", timeout=bound(30)
        ) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def test_alive_is_not_ready_until_a_tick_finished_as_leader(
    served: tuple[StatusServer, Readiness, Clock, Metrics],
) -> None:
    server, readiness, _, _ = served
    assert get(server, "/healthz") == (200, "ok\n")
    status, body = get(server, "/readyz")
    assert status == 503
    assert json.loads(body)["reasons"] == [
        "no tick has finished yet",
        "not the leader (standby)",
    ]
    readiness.leadership(True)
    readiness.tick_finished([])
    status, body = get(server, "/readyz")
    assert status == 200 and json.loads(body)["ready"] is True


def test_stale_ticks_failing_sources_and_lost_leadership_each_make_it_unready(
    served: tuple[StatusServer, Readiness, Clock, Metrics],
) -> None:
    server, readiness, clock, _ = served
    readiness.leadership(True)
    readiness.tick_finished([])
    clock.now += readiness.max_tick_age_s + 1
    status, body = get(server, "/readyz")
    assert status == 503 and "last tick finished" in json.loads(body)["reasons"][0]
    readiness.tick_finished(["queue/slurm"])
    status, body = get(server, "/readyz")
    assert status == 503 and json.loads(body)["failing_sources"] == ["queue/slurm"]
    readiness.tick_finished([])
    assert get(server, "/readyz")[0] == 200
    readiness.leadership(False)
    assert get(server, "/readyz")[0] == 503
    assert get(server, "/healthz")[0] == 200, "a standby is alive"
    assert get(server, "/nope")[0] == 404


EXPECTED_FAMILIES = {
    "gpu_autoscaler_demand_gpus",
    "gpu_autoscaler_supply_gpus",
    "gpu_autoscaler_pending_gpus",
    "gpu_autoscaler_desired_instances",
    "gpu_autoscaler_instances",
    "gpu_autoscaler_cost_per_hour_dollars",
    "gpu_autoscaler_spend_dollars_total",
    "gpu_autoscaler_decisions_total",
    "gpu_autoscaler_actions_total",
    "gpu_autoscaler_provider_request_duration_seconds_bucket",
    "gpu_autoscaler_capacity_cache_entries",
    "gpu_autoscaler_tick_duration_seconds_bucket",
    "gpu_autoscaler_signal_age_seconds",
    "gpu_autoscaler_budget_exhausted",
    "gpu_autoscaler_fencing_token",
    "gpu_autoscaler_source_up",
}


def test_metrics_carry_the_full_set_after_ticks(
    served: tuple[StatusServer, Readiness, Clock, Metrics], tmp_path: Path
) -> None:
    server, _, _, metrics = served
    t = rig(
        [pool("a", gpus=2)],
        {"a": 1.5},
        limits={"max_cost_per_hour": 3.0},
        metrics=metrics,
        journal=open_sqlite(tmp_path / "j.db"),
    )
    t.queue.jobs = [job(f"j{i}", gpus=2) for i in range(3)]
    t.controller.tick()
    t.cloud.boot_all()
    t.clock.advance(60)
    t.controller.tick()
    status, body = get(server, "/metrics")
    assert status == 200
    names = {line.split("{")[0].split(" ")[0] for line in body.splitlines() if line[:1] != "#"}
    assert names >= EXPECTED_FAMILIES, sorted(EXPECTED_FAMILIES - names)
    sample = {
        line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
        for line in body.splitlines()
        if line and line[0] != "#"
    }
    assert sample['gpu_autoscaler_desired_instances{pool="a"}'] == 2
    assert sample['gpu_autoscaler_supply_gpus{pool="a"}'] == 4
    assert sample['gpu_autoscaler_cost_per_hour_dollars{pool="a"}'] == 3.0
    assert sample['gpu_autoscaler_budget_exhausted{cap="hourly"}'] == 1
    assert sample['gpu_autoscaler_actions_total{kind="launch",outcome="ok"}'] == 1
    assert sample["gpu_autoscaler_pending_gpus"] == 6
    assert sample['gpu_autoscaler_spend_dollars_total{pool="a"}'] == pytest.approx(3.0 / 60)
