"""The reconcile loop end to end against in-memory collaborators: what each tick does, and how a
failing policy, source or cloud degrades a tick instead of killing the controller."""

from __future__ import annotations

from fakes import FakeCloud, FakeQueue, Rig, job, pool, rig

from autoscaler.model import (
    FleetView,
    InstanceState,
    InterruptionNotice,
    LaunchRequest,
    NoticeKind,
    OnPremNode,
    Plan,
)
from autoscaler.model.clock import ManualClock
from autoscaler.model.config import ControllerConfig
from autoscaler.model.errors import AuthError, CapacityError, QuotaError, QuotaScope, ThrottledError
from autoscaler.model.records import TickReport
from autoscaler.spi.sources import NodeUsage
from autoscaler.tick.controller import Controller
from autoscaler.tick.retry import RetryPolicy
from policies.cost_aware import CostAwareParams, CostAwarePolicy


class Scripted:
    """A policy that returns whatever the test says, or raises."""

    Params = CostAwareParams

    def __init__(self, plan: object = None, error: Exception | None = None) -> None:
        self.plan = plan if plan is not None else Plan()
        self.error = error
        self.views: list[FleetView] = []

    def decide(self, view: FleetView) -> Plan:
        self.views.append(view)
        if self.error is not None:
            raise self.error
        return self.plan  # type: ignore[return-value]


def test_pending_jobs_launch_the_cheapest_spot_pool_and_nothing_more_while_booting() -> None:
    t = rig([pool("dear"), pool("cheap")], {"dear": 2.0, "cheap": 1.0})
    t.queue.jobs = [job(f"j{i}") for i in range(3)]
    first = t.controller.tick()
    assert [(a.kind, a.pool, a.done) for a in first.actions] == [("launch", "cheap", 3)]
    t.clock.advance(60)
    second = t.controller.tick()
    assert not [a for a in second.actions if a.kind == "launch"], "booting capacity is counted"


def test_onprem_gpus_are_used_before_any_cloud() -> None:
    t = rig([pool("cheap")], {"cheap": 1.0})
    t.nodes.onprem = [OnPremNode(name="n1", gpus=8, gpus_allocated=6)]
    t.queue.jobs = [job("a"), job("b"), job("c")]
    report = t.controller.tick()
    launched = sum(a.done for a in report.actions if a.kind == "launch")
    assert launched == 1, "two of three jobs fit the free on-prem GPUs"


def test_policy_that_raises_holds_the_fleet_and_says_why() -> None:
    t = rig([pool("p")], {"p": 1.0}, policy=Scripted(error=RuntimeError("boom")))
    t.queue.jobs = [job("a")]
    report = t.controller.tick()
    assert report.held is not None and "RuntimeError: boom" in report.held
    assert not t.cloud.launch_calls and not t.cloud.terminate_calls


def test_plan_naming_an_unknown_pool_is_rejected_whole() -> None:
    bad = Plan(launches=(LaunchRequest(pool="p", count=1), LaunchRequest(pool="nope", count=1)))
    t = rig([pool("p")], {"p": 1.0}, policy=Scripted(plan=bad))
    report = t.controller.tick()
    assert report.held is not None and "nope" in report.held
    assert not t.cloud.launch_calls


def test_policy_returning_something_else_than_a_plan_is_contained() -> None:
    t = rig([pool("p")], {"p": 1.0}, policy=Scripted(plan={"launch": 3}))
    report = t.controller.tick()
    assert report.held is not None and "not a Plan" in report.held


def test_failed_queue_source_is_unknown_demand_not_zero_and_holds_scale_down() -> None:
    t = rig([pool("p")], {"p": 1.0}, policy=CostAwarePolicy(CostAwareParams(idle_seconds=0)))
    t.queue.jobs = [job("a")]
    t.controller.tick()
    t.cloud.boot_all()
    (instance,) = t.cloud.instances
    t.nodes.cloud = {instance: NodeUsage(0, 0.0, idle_since=0.0, empty_since=0.0)}
    t.queue.error = ConnectionError("slurmctld down")
    t.clock.advance(3600)
    report = t.controller.tick()
    assert report.view.demand.known is False
    assert report.view.demand.failed_sources == ("queue",)
    assert any(c.rule == "demand_unknown" for c in report.clamps)
    assert not t.cloud.terminate_calls
    t.queue.error = None
    t.queue.jobs = []
    t.clock.advance(60)
    t.controller.tick()
    assert t.cloud.terminate_calls == [[instance]], "once demand is known again, idle goes"


def test_failed_listing_keeps_the_records_instead_of_declaring_them_gone() -> None:
    t = rig([pool("p")], {"p": 1.0})
    t.queue.jobs = [job("a")]
    t.controller.tick()
    t.cloud.list_error = TimeoutError("api down")
    t.clock.advance(3600)
    report = t.controller.tick()
    assert any("listing failed" in e for e in report.errors)
    assert [r.state for r in t.controller.table] == [InstanceState.PENDING]
    assert len(report.view.instances) == 1


def test_capacity_failure_falls_back_to_the_next_pool_in_the_same_tick_and_is_cached() -> None:
    t = rig([pool("a"), pool("b")], {"a": 1.0, "b": 1.5}, capacity_cache_ttl_s=300)
    t.cloud.faults = [CapacityError("InsufficientInstanceCapacity", pool="a")]
    t.queue.jobs = [job(f"j{i}") for i in range(2)]
    report = t.controller.tick()
    launches = [(a.pool, a.outcome, a.done) for a in report.actions if a.kind == "launch"]
    assert launches == [("a", "capacity", 0), ("b", "ok", 2)]
    assert t.controller.capacity.unavailable_until("a", t.clock.now()) == t.clock.now() + 300
    t.queue.jobs.append(job("late"))
    t.clock.advance(60)
    report = t.controller.tick()
    assert [a.pool for a in report.actions if a.kind == "launch"] == ["b"]
    t.clock.advance(300)
    t.queue.jobs.append(job("later"))
    report = t.controller.tick()
    assert [a.pool for a in report.actions if a.kind == "launch"] == ["a"], "TTL expired"


def test_partial_fulfilment_moves_the_rest_to_the_fallback() -> None:
    t = rig([pool("a"), pool("b")], {"a": 1.0, "b": 1.5}, capacity={"a": 1})
    t.queue.jobs = [job(f"j{i}") for i in range(3)]
    report = t.controller.tick()
    assert [(a.pool, a.done) for a in report.actions if a.kind == "launch"] == [("a", 1), ("b", 2)]


def test_regional_quota_blocks_every_pool_of_the_region() -> None:
    pools = [pool("a", region="r1"), pool("b", region="r1"), pool("c", region="r2")]
    t = rig(pools, {"a": 1.0, "b": 1.1, "c": 1.2})
    t.cloud.faults = [QuotaError("VcpuLimitExceeded", pool="a", scope=QuotaScope.REGION)]
    t.queue.jobs = [job("j")]
    report = t.controller.tick()
    assert [(a.pool, a.outcome) for a in report.actions if a.kind == "launch"] == [
        ("a", "quota"),
        ("c", "ok"),
    ]
    now = t.clock.now()
    assert not t.controller.capacity.is_available("b", now)


def test_throttling_is_retried_within_the_tick() -> None:
    t = rig([pool("a")], {"a": 1.0})
    t.cloud.faults = [ThrottledError("RequestLimitExceeded", retry_after_s=1.0), None]
    t.queue.jobs = [job("j")]
    report = t.controller.tick()
    assert [(a.outcome, a.done) for a in report.actions if a.kind == "launch"] == [("ok", 1)]
    assert len(t.cloud.launch_calls) == 2
    assert t.cloud.launch_calls[0][2] == t.cloud.launch_calls[1][2], "same request id on retry"


def test_auth_failure_is_not_retried_and_stops_that_provider_for_the_tick() -> None:
    t = rig([pool("a"), pool("b")], {"a": 1.0, "b": 1.5})
    t.cloud.faults = [AuthError("AuthFailure")]
    t.queue.jobs = [job("j")]
    report = t.controller.tick()
    assert [(a.pool, a.outcome) for a in report.actions if a.kind == "launch"] == [("a", "refused")]
    assert len(t.cloud.launch_calls) == 1


def test_interruption_notice_marks_the_pool_risky_and_drains_the_node() -> None:
    t = rig([pool("a"), pool("b")], {"a": 1.0, "b": 1.05})
    t.queue.jobs = [job("j", checkpoint=1800.0)]
    t.controller.tick()
    t.cloud.boot_all()
    (instance,) = t.cloud.instances
    now = t.clock.now()
    t.cloud.notices = [
        InterruptionNotice(instance_id=instance, pool="a", received_at=now, deadline=now + 120)
    ]
    t.clock.advance(30)
    report = t.controller.tick()
    assert t.scheduler.drained == [instance]
    assert t.controller.table.get(instance).state is InstanceState.INTERRUPTED  # type: ignore[union-attr]
    assert report.view.pool_by_name["a"].risky_until is None, "the view predates the notice"
    t.clock.advance(30)
    report = t.controller.tick()
    assert report.view.pool_by_name["a"].risky_until is not None
    assert report.view.pool_by_name["a"].recent_interruptions == 1
    assert not t.cloud.unacknowledged, "handled notices are acknowledged after the tick"


def test_notices_for_instances_we_do_not_own_are_ignored() -> None:
    t = rig([pool("a")], {"a": 1.0})
    t.cloud.notices = [
        InterruptionNotice(instance_id="i-stranger", pool="a", received_at=0, deadline=120)
    ]
    report = t.controller.tick()
    assert report.view.notices == ()
    assert not t.scheduler.drained
    assert not t.cloud.unacknowledged, "a stranger's notice is acknowledged too, not redelivered"


def test_idle_drain_uses_measured_utilisation_not_allocation() -> None:
    policy = CostAwarePolicy(CostAwareParams(idle_seconds=600))
    t = rig([pool("a")], {"a": 1.0}, policy=policy, limits={"scale_down_cooldown_s": 0})
    t.queue.jobs = [job("x"), job("y")]
    t.controller.tick()
    t.cloud.boot_all()
    t.queue.jobs = []
    busy_unallocated, idle_allocated = sorted(t.cloud.instances)
    now = t.clock.now()
    t.nodes.cloud = {
        # the scheduler shows nothing, but the GPU is busy (a job outside the scheduler's view)
        busy_unallocated: NodeUsage(0, 87.0, idle_since=None, empty_since=now - 3600),
        # a job holds the GPU and has not touched it for an hour
        idle_allocated: NodeUsage(1, 0.0, idle_since=now - 3600, empty_since=None),
    }
    t.clock.advance(60)
    report = t.controller.tick()
    assert [d.instance_id for d in report.plan.drains] == [idle_allocated]
    assert idle_allocated in t.scheduler.drained


def test_draining_node_is_terminated_once_empty_or_after_the_drain_timeout() -> None:
    policy = CostAwarePolicy(CostAwareParams(idle_seconds=0))
    t = rig([pool("a")], {"a": 1.0}, policy=policy, limits={"scale_down_cooldown_s": 0})
    t.queue.jobs = [job("x")]
    t.controller.tick()
    t.cloud.boot_all()
    t.queue.jobs = []
    (instance,) = t.cloud.instances
    now = t.clock.now()
    t.nodes.cloud = {instance: NodeUsage(1, 0.0, idle_since=now - 10, empty_since=None)}
    t.scheduler.running[instance] = 1
    t.clock.advance(60)
    t.controller.tick()
    assert t.controller.table.get(instance).state is InstanceState.DRAINING  # type: ignore[union-attr]
    assert not t.cloud.terminate_calls, "a job still runs there"
    t.clock.advance(t.controller.config.drain_timeout_s)
    report = t.controller.tick()
    assert t.scheduler.evicted == [instance]
    assert t.cloud.terminate_calls == [[instance]]
    assert any(a.kind == "evict" for a in report.actions)


def test_instance_tagged_ours_in_an_unconfigured_pool_is_collected() -> None:
    t = rig([pool("a")], {"a": 1.0})
    t.queue.jobs = [job("x")]
    t.controller.tick()
    (instance,) = t.cloud.instances
    t.cloud.instances[instance] = t.cloud.instances[instance].model_copy(
        update={"pool": "retired", "id": "orphan-1"}
    )
    t.cloud.instances["orphan-1"] = t.cloud.instances.pop(instance)
    t.clock.advance(60)
    report = t.controller.tick()
    assert ["orphan-1"] in t.cloud.terminate_calls
    assert any(a.kind == "terminate" and "collected" in a.detail for a in report.actions)


def test_a_restarted_controller_adopts_what_the_cloud_lists() -> None:
    t = rig([pool("a")], {"a": 1.0})
    t.queue.jobs = [job("x")]
    t.controller.tick()
    t.cloud.boot_all()
    fresh = rig([pool("a")], {"a": 1.0})
    fresh.cloud.instances = dict(t.cloud.instances)
    fresh.queue.jobs = [job("x")]
    report = fresh.controller.tick()
    assert [n.state for n in report.view.instances] == [InstanceState.RUNNING]
    assert not fresh.cloud.launch_calls, "the adopted instance already covers the job"


def tick_with_a_rebalance_notice(t: Rig, instance: str) -> TickReport:
    """The next tick, a minute on, with an AWS rebalance recommendation for ``instance``."""
    now = t.clock.now()
    t.cloud.notices = [
        InterruptionNotice(
            instance_id=instance,
            pool="a",
            kind=NoticeKind.REBALANCE,
            received_at=now,
            deadline=now + 600,
        )
    ]
    t.clock.advance(60)
    return t.controller.tick()


def test_a_rebalance_recommendation_is_noted_but_does_not_drain() -> None:
    t = rig([pool("a")], {"a": 1.0})
    t.queue.jobs = [job("j")]
    t.controller.tick()
    t.cloud.boot_all()
    (instance,) = t.cloud.instances
    report = tick_with_a_rebalance_notice(t, instance)
    assert [a.kind for a in report.actions if a.kind == "notice"] == ["notice"]
    assert not t.scheduler.drained
    assert t.controller.table.get(instance).state is InstanceState.RUNNING  # type: ignore[union-attr]


def test_capacity_failure_in_one_cloud_fails_over_to_the_next_cheapest_cloud_in_the_tick() -> None:

    clock = ManualClock(0.0)
    clouds = {
        "aws": FakeCloud("aws", price_table={"aws-spot": 1.0}, now=clock.now),
        "gcp": FakeCloud("gcp", price_table={"gcp-spot": 1.2}, now=clock.now),
        "azure": FakeCloud("azure", price_table={"azure-spot": 1.4}, now=clock.now),
    }
    pools = (
        pool("aws-spot", provider="aws"),
        pool("gcp-spot", provider="gcp"),
        pool("azure-spot", provider="azure"),
    )
    clouds["aws"].faults = [CapacityError("ICE", pool="aws-spot")]
    queue = FakeQueue(jobs=[job(f"j{i}") for i in range(2)])
    controller = Controller(
        ControllerConfig(fleet_id="multi", pools=pools),
        CostAwarePolicy(),
        clouds,
        clock,
        [queue],
        retry=RetryPolicy(attempts=1),
    )
    report = controller.tick()
    assert [(a.pool, a.outcome, a.done) for a in report.actions if a.kind == "launch"] == [
        ("aws-spot", "capacity", 0),
        ("gcp-spot", "ok", 2),
    ]
    assert len(clouds["gcp"].instances) == 2 and not clouds["azure"].instances


def test_a_notice_for_an_instance_already_gone_still_counts_as_an_interruption() -> None:
    t = rig([pool("a"), pool("b")], {"a": 1.0, "b": 1.1})
    t.queue.jobs = [job("j")]
    t.controller.tick()
    (instance,) = t.cloud.instances
    del t.cloud.instances[instance]  # reclaimed by the cloud before we heard
    t.clock.advance(700)
    t.controller.tick()
    t.cloud.notices = [
        InterruptionNotice(
            instance_id=instance, pool="a", received_at=t.clock.now(), deadline=t.clock.now()
        )
    ]
    t.clock.advance(60)
    report = t.controller.tick()
    assert [a.outcome for a in report.actions if a.kind == "interruption"] == ["gone"]
    t.clock.advance(60)
    report = t.controller.tick()
    assert report.view.pool_by_name["a"].recent_interruptions == 1


def test_with_act_on_rebalance_off_a_recommendation_buys_no_replacement() -> None:
    """The defect issue 16 names: the policy used to buy a replacement for every rebalance
    recommendation although nothing drained the original, paying for both."""
    t = rig([pool("a"), pool("b")], {"a": 1.0, "b": 1.5})
    t.queue.jobs = [job("j")]
    t.controller.tick()
    t.cloud.boot_all()
    (instance,) = t.cloud.instances
    t.nodes.cloud[instance] = NodeUsage(gpus_allocated=1)
    t.queue.jobs = []
    report = tick_with_a_rebalance_notice(t, instance)
    assert [a.kind for a in report.actions if a.kind == "notice"] == ["notice"], "still noted"
    assert report.view.notices == (), "the policy is not shown a notice nobody acts on"
    assert not [a for a in report.actions if a.kind == "launch"], "no replacement bought"
    assert len(t.cloud.instances) == 1
