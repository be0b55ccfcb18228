"""What a tick did, as Prometheus series: the controller hands each tick's observation and report
here, and this keeps the little memory the series need between ticks (the checkpoint reports
already counted, the pool and state pairs last set)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from autoscaler.model import LIVE_STATES, InstanceState, Pool
from autoscaler.ops.metrics import Metrics

if TYPE_CHECKING:
    from autoscaler.model.records import TickReport
    from autoscaler.tick.observe import Observation


def tick_outcome(held: str | None, errors: Sequence[str]) -> str:
    return "held" if held else ("degraded" if errors else "ok")


class TickMetrics:
    def __init__(self, metrics: Metrics, pools: Sequence[Pool], checkpoint_reports: int) -> None:
        self.metrics = metrics
        self.pools = tuple(pools)
        self._checkpoint_reports = checkpoint_reports
        self._counted_states: set[tuple[str, InstanceState]] = set()

    def record(
        self, observation: Observation, report: TickReport, checkpoint_reports: int, token: int
    ) -> None:
        metrics = self.metrics
        view = report.view
        for (kind, name), up in observation.source_status.items():
            metrics.source_up.labels(kind, name).set(1 if up else 0)
            if not up:
                metrics.source_errors.labels(kind, name).inc()
        for (kind, name), age in observation.source_age.items():
            metrics.signal_age.labels(kind, name).set(age)
        demand = view.demand
        metrics.demand_known.set(1 if demand.known else 0)
        metrics.pending_gpus.set(sum(g.gpus_per_job * g.jobs for g in demand.groups))
        metrics.unhostable_jobs.clear()
        for item in report.unhostable:
            metrics.unhostable_jobs.labels(item.label).set(item.jobs)
        self._record_pools(report)
        for action in report.actions:
            metrics.actions.labels(action.kind, action.outcome).inc()
            if action.kind == "interruption" and action.outcome == "ok" and action.pool:
                metrics.interruptions.labels(action.pool).inc()
            if action.kind == "evacuate":
                metrics.evacuations.labels(action.outcome).inc()
                if action.lost_gpu_s:
                    metrics.work_lost.inc(action.lost_gpu_s)
        for clamp in report.clamps:
            metrics.clamps.labels(clamp.rule).inc()
        rules = {c.rule for c in report.clamps}
        metrics.budget_exhausted.labels("hourly").set(1 if "budget" in rules else 0)
        metrics.budget_exhausted.labels("monthly").set(1 if "monthly_budget" in rules else 0)
        if report.month_spend is not None:
            metrics.month_spend.set(report.month_spend)
        for pool, usd in report.accrued.items():
            metrics.spend.labels(pool).inc(usd)
        metrics.checkpoints.inc(max(0, checkpoint_reports - self._checkpoint_reports))
        self._checkpoint_reports = checkpoint_reports
        metrics.capacity_cache_entries.set(
            sum(1 for p in view.pools if p.unavailable_until is not None)
        )
        metrics.decisions.labels(
            "held" if report.held else ("clamped" if report.clamps else "ok")
        ).inc()
        metrics.ticks.labels(tick_outcome(report.held, report.errors)).inc()
        metrics.tick_seconds.observe(report.duration_s)
        metrics.fencing_token.set(token)

    def _record_pools(self, report: TickReport) -> None:
        """Per-pool series from one pass over the instances (a fleet is thousands of them)."""
        metrics = self.metrics
        view = report.view
        launched: dict[str, int] = {}
        drained: set[str] = set()
        for action in report.actions:
            if action.kind == "launch" and action.pool is not None:
                launched[action.pool] = launched.get(action.pool, 0) + action.done
            elif action.kind == "drain" and action.done:
                drained.update(action.instance_ids)
        by_state: dict[str, dict[InstanceState, int]] = {}
        live_gpus: dict[str, int] = {}
        staying: dict[str, int] = {}
        for node in view.instances:
            states = by_state.setdefault(node.pool, {})
            states[node.state] = states.get(node.state, 0) + 1
            if node.state not in LIVE_STATES:
                continue
            live_gpus[node.pool] = live_gpus.get(node.pool, 0) + node.gpus
            if node.state is not InstanceState.DRAINING and node.instance_id not in drained:
                staying[node.pool] = staying.get(node.pool, 0) + 1
        for pool_view in view.pools:
            pool = pool_view.pool
            name = pool.name
            desired = staying.get(name, 0) + launched.get(name, 0)
            metrics.desired_instances.labels(name).set(desired)
            metrics.demand_gpus.labels(name).set(desired * pool.gpus_per_instance)
            metrics.supply_gpus.labels(name).set(live_gpus.get(name, 0))
            live = sum(n for state, n in by_state.get(name, {}).items() if state in LIVE_STATES)
            price = pool_view.price.price_per_hour if pool_view.price is not None else 0.0
            metrics.cost_per_hour.labels(name).set(price * live)
            for state, count in by_state.get(name, {}).items():
                metrics.instances.labels(name, state.value).set(count)
        counted = {(name, state) for name, states in by_state.items() for state in states}
        for gone_pool, gone_state in self._counted_states - counted:
            metrics.instances.labels(gone_pool, gone_state.value).set(0)
        self._counted_states = counted
        metrics.supply_gpus.labels("on-prem").set(sum(n.gpus for n in view.onprem))
