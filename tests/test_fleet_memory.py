"""What outlives a tick lives in the controller's ``FleetMemory``; everything else a step keeps
between ticks is a cache that can be dropped without changing a decision (issue 16, item 2).

Two controllers are driven through the same random script of arrivals, boots, idle nodes,
failed price quotes and notices; one of them forgets every cache before each tick. Both must
decide and do the same thing at every tick.
"""

from __future__ import annotations

from dataclasses import dataclass

from fakes import Rig, job, pool, rig
from hypothesis import given, settings
from hypothesis import strategies as st

from autoscaler.model import InterruptionNotice, NoticeKind, OnPremNode
from autoscaler.spi.sources import NodeUsage
from policies.cost_aware import CostAwareParams, CostAwarePolicy


@dataclass(frozen=True)
class Step:
    jobs: int  # pending jobs this tick
    boot: bool  # the cloud boots what it has been asked for
    idle: bool  # every running cloud node reads idle and empty
    quote_fails: bool  # the cloud answers no price this tick
    notice: bool  # the first running instance gets a spot notice
    advance_s: int


steps = st.builds(
    Step,
    jobs=st.integers(0, 6),
    boot=st.booleans(),
    idle=st.booleans(),
    quote_fails=st.booleans(),
    notice=st.booleans(),
    advance_s=st.sampled_from([30, 60, 300, 900]),
)


def _rig() -> Rig:
    t = rig(
        [pool("cheap"), pool("dear")],
        {"cheap": 1.0, "dear": 2.5},
        policy=CostAwarePolicy(CostAwareParams(idle_seconds=120)),
        limits={"scale_down_cooldown_s": 0},
    )
    t.nodes.onprem = [OnPremNode(name="onprem-1", gpus=2, gpus_allocated=2)]
    return t


def _forget_caches(t: Rig) -> None:
    t.controller.observer._node_cache.clear()
    t.controller._unhostable_cache = None


def _play(t: Rig, step: Step, prices: dict[str, float]) -> tuple[object, ...]:
    t.queue.jobs = [job(f"j{i}") for i in range(step.jobs)]
    if step.boot:
        t.cloud.boot_all()
    now = t.clock.now()
    running = sorted(i for i, inst in t.cloud.instances.items() if inst.state.value == "running")
    t.nodes.cloud = {
        i: NodeUsage(0, 0.0, idle_since=now - 600, empty_since=now - 600)
        if step.idle
        else NodeUsage(1, 90.0, idle_since=None, empty_since=None)
        for i in running
    }
    t.cloud.price_table = {} if step.quote_fails else dict(prices)
    if step.notice and running:
        t.cloud.notices = [
            InterruptionNotice(
                instance_id=running[0],
                pool=t.cloud.instances[running[0]].pool,
                kind=NoticeKind.TERMINATE,
                deadline=now + 120,
                received_at=now,
            )
        ]
    report = t.controller.tick()
    t.clock.advance(step.advance_s)
    return (
        tuple(
            (a.kind, a.pool, a.done, a.outcome, a.request_id, a.instance_ids)
            for a in report.actions
        ),
        report.plan.launches if report.plan is not None else None,
        report.plan.drains if report.plan is not None else None,
        report.held,
    )


@settings(max_examples=40, deadline=None)
@given(st.lists(steps, min_size=1, max_size=14))
def test_dropping_every_cache_before_each_tick_changes_no_decision(script: list[Step]) -> None:
    prices = {"cheap": 1.0, "dear": 2.5}
    kept, forgetful = _rig(), _rig()
    for number, step in enumerate(script):
        _forget_caches(forgetful)
        assert _play(forgetful, step, prices) == _play(kept, step, prices), number


def test_what_observe_carries_over_is_the_controllers() -> None:
    """A quote that fails falls back to the last good one, which the controller's memory holds."""
    t = _rig()
    t.controller.tick()
    remembered = t.controller.fleet.observed.prices
    assert remembered["cheap"].price_per_hour == 1.0
    assert t.controller.observer.memory is t.controller.fleet.observed
    assert t.controller.checkpoints is t.controller.fleet.checkpoints
    assert t.controller.last_plan is t.controller.fleet.last_plan is not None
