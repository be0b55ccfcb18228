"""A cloud node that boots but never joins the workload scheduler is terminated past its pool's
boot time plus ``registration_timeout_s`` and, while jobs wait, bought again in its pool. A node
nobody could see (the node listing or its cloud's listing failed) is never judged."""

from __future__ import annotations

from fakes import Rig, job, pool, rig

from autoscaler.model.teams import TeamsConfig, TeamSpec
from autoscaler.ops.metrics import Metrics
from autoscaler.spi.sources import NodeUsage

BOOT_S = 120.0  # fakes.pool's boot time
TIMEOUT_S = 900.0


def launched_one(t: Rig) -> str:
    t.queue.jobs = [job("a")]
    t.controller.tick()
    t.cloud.boot_all()
    (instance,) = t.cloud.instances
    return instance


def terminations(t: Rig) -> list[tuple[str, str]]:
    report = t.controller.tick()
    return [
        (ids, a.detail)
        for a in report.actions
        if a.kind == "terminate" and a.done
        for ids in a.instance_ids
    ]


def test_a_node_that_never_joins_is_terminated_and_replaced_while_jobs_wait() -> None:
    metrics = Metrics()
    t = rig([pool("a")], {"a": 1.0}, registration_timeout_s=TIMEOUT_S, metrics=metrics)
    instance = launched_one(t)
    t.clock.advance(BOOT_S + TIMEOUT_S - 60)
    assert terminations(t) == [], "still inside its registration time"
    t.clock.advance(120)
    report = t.controller.tick()
    ended = [a for a in report.actions if a.kind == "terminate" and a.done]
    assert [a.instance_ids for a in ended] == [(instance,)]
    assert "registration timeout" in ended[0].detail
    launches = [a for a in report.actions if a.kind == "launch" and a.done]
    assert [(a.pool, a.done) for a in launches] == [("a", 1)]
    assert "never joined" in launches[0].detail or launches[0].detail.startswith("replaces")
    assert len(t.cloud.instances) == 1 and instance not in t.cloud.instances
    counted = metrics.registry.get_sample_value(
        "gpu_autoscaler_registration_timeouts_total", {"pool": "a"}
    )
    assert counted == 1.0


def test_without_pending_work_the_node_is_ended_and_not_bought_again() -> None:
    t = rig([pool("a")], {"a": 1.0}, registration_timeout_s=TIMEOUT_S)
    instance = launched_one(t)
    t.queue.jobs = []
    t.clock.advance(BOOT_S + TIMEOUT_S + 60)
    report = t.controller.tick()
    assert [a.instance_ids for a in report.actions if a.kind == "terminate" and a.done] == [
        (instance,)
    ]
    assert not [a for a in report.actions if a.kind == "launch"]


def test_a_joined_node_or_one_nobody_could_see_is_left_alone() -> None:
    t = rig([pool("a")], {"a": 1.0}, registration_timeout_s=TIMEOUT_S)
    instance = launched_one(t)
    t.clock.advance(BOOT_S + TIMEOUT_S + 60)
    t.nodes.error = TimeoutError("slurmctld down")
    assert terminations(t) == [], "the node listing failed: unknown, not unjoined"
    t.nodes.error = None
    t.cloud.list_error = TimeoutError("api down")
    assert terminations(t) == [], "its cloud could not be listed"
    t.cloud.list_error = None
    t.nodes.cloud[instance] = NodeUsage(gpus_allocated=1)
    assert terminations(t) == [], "it joined"


def test_registration_ends_count_against_the_drain_rate() -> None:
    t = rig(
        [pool("a")],
        {"a": 1.0},
        registration_timeout_s=TIMEOUT_S,
        limits={"max_drains_per_tick": 1},
    )
    t.queue.jobs = [job("a"), job("b"), job("c")]
    t.controller.tick()
    t.cloud.boot_all()
    assert len(t.cloud.instances) == 3
    t.clock.advance(BOOT_S + TIMEOUT_S + 60)
    report = t.controller.tick()
    assert sum(a.done for a in report.actions if a.kind == "terminate") == 1
    assert [c.rule for c in report.clamps].count("drain_rate") == 2


def test_the_timeout_can_be_switched_off() -> None:
    t = rig([pool("a")], {"a": 1.0}, registration_timeout_s=None)
    launched_one(t)
    t.clock.advance(10 * (BOOT_S + TIMEOUT_S))
    assert terminations(t) == []


def test_a_pool_of_queue_workers_that_never_join_is_left_alone() -> None:
    workers = pool("a").model_copy(update={"joins_scheduler": False})
    t = rig([workers], {"a": 1.0}, registration_timeout_s=TIMEOUT_S)
    launched_one(t)
    t.clock.advance(10 * (BOOT_S + TIMEOUT_S))
    assert terminations(t) == []


def test_the_replacement_is_bought_for_the_team_the_node_was_bought_for() -> None:
    teams = TeamsConfig(teams={"research": TeamSpec(burst_gpus=2)})
    t = rig([pool("a")], {"a": 1.0}, registration_timeout_s=TIMEOUT_S, teams=teams)
    t.queue.jobs = [job("a").model_copy(update={"team": "research"})]
    t.controller.tick()
    t.cloud.boot_all()
    (instance,) = t.cloud.instances
    assert t.controller.table.teams() == {instance: "research"}
    t.clock.advance(BOOT_S + TIMEOUT_S + 60)
    t.controller.tick()
    (replacement,) = t.cloud.instances
    assert replacement != instance
    # bought again for research, and counted against its burst limit
    assert t.controller.table.teams() == {replacement: "research"}
