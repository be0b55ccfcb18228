"""What a tick did, as Prometheus series: the controller hands each tick's observation and report
here, and this keeps the little memory the series need between ticks (the checkpoint reports
already counted, the pool and state pairs last set, the on-prem nodes with series and when the
last tick was)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from autoscaler.fleet.team_usage import (
    MICROS_PER_USD,
    MS_PER_S,
    TickHolders,
    Usage,
    onprem_gpus_held,
)
from autoscaler.model import LIVE_STATES, InstanceState, Pool
from autoscaler.model.teams import UNASSIGNED, TeamsConfig
from autoscaler.ops.metrics import Metrics
from autoscaler.ops.onprem_idle import (
    idle_allocated_gpus,
    idle_gpu_seconds,
    nodes_unknown,
    onprem_idle,
)
from autoscaler.tick.rules import registration

if TYPE_CHECKING:
    from autoscaler.model.records import TickReport
    from autoscaler.tick.observe import Observation


def tick_outcome(held: str | None, errors: Sequence[str]) -> str:
    return "held" if held else ("degraded" if errors else "ok")


# A scheduler may name any number of teams; a series each past this would swamp Prometheus.
MAX_TEAM_SERIES = 500


class TickMetrics:
    def __init__(
        self,
        metrics: Metrics,
        pools: Sequence[Pool],
        checkpoint_reports: int,
        teams: TeamsConfig | None = None,
    ) -> None:
        self.metrics = metrics
        for name, spec in sorted((teams.teams if teams is not None else {}).items())[
            :MAX_TEAM_SERIES
        ]:
            metrics.team_guaranteed_gpus.labels(name).set(spec.guaranteed_gpus)
        # the (team, pool) pairs with usage series: bounded like the teams' pending series
        self._team_pairs: set[tuple[str, str]] = set()
        self.pools = tuple(pools)
        self._checkpoint_reports = checkpoint_reports
        self._counted_states: set[tuple[str, InstanceState]] = set()
        # per on-prem node with series: (allocated, utilisation %, idle allocated), the last two
        # None while unmeasured
        self._onprem_shown: dict[str, tuple[int, float | None, int | None]] = {}
        # and its series: allocated, utilisation, idle allocated (None while unmeasured)
        self._onprem_series: dict[str, list[Any]] = {}
        self._last_at: float | None = None

    def record(
        self,
        observation: Observation,
        report: TickReport,
        checkpoint_reports: int,
        token: int,
        holders: TickHolders | None = None,
        team_usage: Mapping[tuple[str, str], Usage] | None = None,
    ) -> None:
        metrics = self.metrics
        self._record_teams(holders, team_usage)
        view = report.view
        for (kind, name), up in observation.source_status.items():
            metrics.source_up.labels(kind, name).set(1 if up else 0)
            if not up:
                metrics.source_errors.labels(kind, name).inc()
        for name, problems in observation.source_problems.items():
            for problem, count in problems.items():
                metrics.source_problems.labels(name, problem).set(count)
        for (kind, name), age in observation.source_age.items():
            metrics.signal_age.labels(kind, name).set(age)
        demand = view.demand
        metrics.demand_known.set(1 if demand.known else 0)
        metrics.pending_gpus.set(sum(g.gpus_per_job * g.jobs for g in demand.groups))
        by_team: dict[str, int] = {}
        for group in demand.groups:
            team = group.team or UNASSIGNED
            by_team[team] = by_team.get(team, 0) + group.gpus_per_job * group.jobs
        metrics.team_pending_gpus.clear()
        for team, gpus in sorted(by_team.items())[:MAX_TEAM_SERIES]:
            metrics.team_pending_gpus.labels(team).set(gpus)
        metrics.unhostable_jobs.clear()
        for item in report.unhostable:
            metrics.unhostable_jobs.labels(item.label).set(item.jobs)
        self._record_pools(report)
        self._record_onprem(report)
        for action in report.actions:
            metrics.actions.labels(action.kind, action.outcome).inc()
            if action.kind == "interruption" and action.outcome == "ok" and action.pool:
                metrics.interruptions.labels(action.pool).inc()
            if (
                action.kind == "terminate"
                and action.done
                and action.detail.endswith(registration.SAID)
            ):
                metrics.registration_timeouts.labels(action.pool or "").inc(action.done)
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

    def _record_teams(
        self, holders: TickHolders | None, usage: Mapping[tuple[str, str], Usage] | None
    ) -> None:
        """What each team held and was charged this tick. A scheduler may name any number of
        teams: past ``MAX_TEAM_SERIES`` (team, pool) pairs, new pairs get no series."""
        metrics = self.metrics
        for (team, pool), amount in sorted((usage or {}).items()):
            pair = (team, pool)
            if pair not in self._team_pairs:
                if len(self._team_pairs) >= MAX_TEAM_SERIES:
                    continue
                self._team_pairs.add(pair)
            metrics.team_gpu_seconds.labels(team, pool).inc(amount.gpu_ms / MS_PER_S)
            metrics.team_cost.labels(team, pool).inc(amount.usd_micros / MICROS_PER_USD)
        held = onprem_gpus_held(holders) if holders is not None else None
        metrics.team_onprem_gpus.clear()
        for team, gpus in sorted((held or {}).items())[:MAX_TEAM_SERIES]:
            metrics.team_onprem_gpus.labels(team).set(gpus)

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

    def _record_onprem(self, report: TickReport) -> None:
        """Per on-prem node: GPUs allocated, measured utilisation and GPUs allocated while the
        node reads idle. An unmeasured node has no utilisation or idle series (unknown is not
        idle); a node the scheduler no longer lists, or every node while the node source
        fails, loses its series, so the names stay those of the fleet. A series is set only
        when its value changed, through the series object kept per node: a fleet is thousands
        of nodes, and looking up labels is most of the cost."""
        metrics = self.metrics
        view = report.view
        failed = nodes_unknown(report.failing_sources)
        before = self._onprem_shown
        series = self._onprem_series
        shown: dict[str, tuple[int, float | None, int | None]] = {}
        for node in () if failed else view.onprem:
            name = node.name
            idle = idle_allocated_gpus(node)
            util = node.gpu_util_pct if idle is not None else None
            value = (node.gpus_allocated, util, idle)
            shown[name] = value
            old = before.get(name)
            if old == value:
                continue
            found = series.get(name)
            if found is None:
                found = series[name] = [metrics.onprem_allocated.labels(name), None, None]
            if old is None or old[0] != value[0]:
                found[0].set(node.gpus_allocated)
            if util is not None and idle is not None:
                fresh = found[1] is None or found[2] is None
                if fresh:
                    found[1] = metrics.onprem_utilisation.labels(name)
                    found[2] = metrics.onprem_node_idle_allocated.labels(name)
                if fresh or old is None or old[1] != util:
                    found[1].set(util / 100.0)
                if fresh or old is None or old[2] != idle:
                    found[2].set(idle)
            elif found[1] is not None:
                metrics.onprem_utilisation.remove(name)
                metrics.onprem_node_idle_allocated.remove(name)
                found[1] = found[2] = None
        for name in [n for n in series if n not in shown]:
            found = series.pop(name)
            metrics.onprem_allocated.remove(name)
            if found[1] is not None:
                metrics.onprem_utilisation.remove(name)
                metrics.onprem_node_idle_allocated.remove(name)
        self._onprem_shown = shown
        unmeasured = sum(1 for value in shown.values() if value[2] is None)
        metrics.onprem_unmeasured.set(math.nan if failed else unmeasured)
        idle_nodes = onprem_idle(view.onprem, report.failing_sources)
        if idle_nodes is None:
            metrics.onprem_idle_allocated.set(math.nan)
        else:
            metrics.onprem_idle_allocated.set(sum(n.gpus for n in idle_nodes))
            metrics.onprem_idle_allocated_seconds.inc(
                sum(idle_gpu_seconds(n, report.now, self._last_at) for n in idle_nodes)
            )
        self._last_at = report.now
