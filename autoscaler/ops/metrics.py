"""The controller's Prometheus metrics, named ``gpu_autoscaler_*`` after the Prometheus
conventions (base units, ``_total`` counters, ``_seconds``, ``_dollars``). One ``Metrics`` object
per controller, on its own registry, so tests and several controllers in one process never share
series. Served with ``/healthz`` and ``/readyz`` by ``health.StatusServer``."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)


class Metrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        # signals
        self.source_up = Gauge(
            "gpu_autoscaler_source_up",
            "1 when the source answered on the last tick, 0 when it failed",
            ["kind", "source"],
            registry=r,
        )
        self.source_problems = Gauge(
            "gpu_autoscaler_source_problems",
            "records the source's last reading could not take as they are, by kind: pending work "
            "counted as demand that cannot be met (unreadable, unknown-gpu-resource, "
            "unmet-node-selector, too-large), pods kept off spot (bad-checkpoint-annotation), "
            "nodes or bound pods left out",
            ["source", "problem"],
            registry=r,
        )
        self.source_errors = Counter(
            "gpu_autoscaler_source_errors",
            "Ticks on which the source failed",
            ["kind", "source"],
            registry=r,
        )
        self.signal_age = Gauge(
            "gpu_autoscaler_signal_age_seconds",
            "Seconds since the source last answered (staleness of what the controller acts on)",
            ["kind", "source"],
            registry=r,
        )
        self.demand_known = Gauge(
            "gpu_autoscaler_demand_known",
            "1 when every queue source answered on the last tick (scale-down is held while 0)",
            registry=r,
        )
        self.pending_gpus = Gauge(
            "gpu_autoscaler_pending_gpus", "GPUs pending jobs ask for", registry=r
        )
        self.team_pending_gpus = Gauge(
            "gpu_autoscaler_team_pending_gpus",
            "GPUs pending jobs ask for, by the team the scheduler names them (unassigned: none)",
            ["team"],
            registry=r,
        )
        # who pays for what (``autoscaler.fleet.team_usage``): pool "on-prem" for on-prem
        # nodes; "(idle)", "(unknown)" and "unassigned" are lines of their own
        self.team_gpu_seconds = Counter(
            "gpu_autoscaler_team_gpu_seconds",
            "GPU-seconds of billed cloud instances and on-prem nodes, by the team whose jobs "
            "held them ((idle): no job; (unknown): the jobs were not read), from the journal",
            ["team", "pool"],
            registry=r,
        )
        self.team_cost = Counter(
            "gpu_autoscaler_team_cost_usd",
            "Dollars accrued by billed cloud instances, split between the teams by the GPU share "
            "their jobs held, from the journal",
            ["team", "pool"],
            registry=r,
        )
        self.team_onprem_gpus = Gauge(
            "gpu_autoscaler_team_onprem_gpus",
            "On-prem GPUs the team's jobs hold now (no series while the jobs are not known)",
            ["team"],
            registry=r,
        )
        self.team_guaranteed_gpus = Gauge(
            "gpu_autoscaler_team_guaranteed_gpus",
            "On-prem GPUs the config guarantees the team",
            ["team"],
            registry=r,
        )
        self.unhostable_jobs = Gauge(
            "gpu_autoscaler_unhostable_jobs",
            "pending jobs no configured pool or on-prem node can ever host, by what they ask for",
            ["shape"],
            registry=r,
        )
        # fleet, per pool
        self.demand_gpus = Gauge(
            "gpu_autoscaler_demand_gpus",
            "GPUs the plan wants in the pool: live GPUs plus launches less drains",
            ["pool"],
            registry=r,
        )
        self.supply_gpus = Gauge(
            "gpu_autoscaler_supply_gpus",
            "GPUs of the pool's live instances (on-prem nodes under pool 'on-prem')",
            ["pool"],
            registry=r,
        )
        self.desired_instances = Gauge(
            "gpu_autoscaler_desired_instances",
            "Instances the guarded plan wants in the pool",
            ["pool"],
            registry=r,
        )
        self.instances = Gauge(
            "gpu_autoscaler_instances",
            "Instances we own in the pool, by lifecycle state",
            ["pool", "state"],
            registry=r,
        )
        # on-prem nodes, per node (the fleet bounds the names; a node gone loses its series)
        self.onprem_allocated = Gauge(
            "gpu_autoscaler_onprem_node_allocated_gpus",
            "GPUs the scheduler has allocated on the on-prem node",
            ["node"],
            registry=r,
        )
        self.onprem_utilisation = Gauge(
            "gpu_autoscaler_onprem_node_gpu_utilisation_ratio",
            "Measured GPU utilisation of the on-prem node (0 to 1, mean over telemetry.window_s);"
            " no series while unmeasured",
            ["node"],
            registry=r,
        )
        self.onprem_node_idle_allocated = Gauge(
            "gpu_autoscaler_onprem_node_idle_allocated_gpus",
            "GPUs allocated on the on-prem node while every GPU on it reads idle "
            "(below telemetry.idle_util_pct); no series while unmeasured",
            ["node"],
            registry=r,
        )
        self.onprem_idle_allocated = Gauge(
            "gpu_autoscaler_onprem_idle_allocated_gpus",
            "On-prem GPUs allocated on nodes that read idle, over the measured nodes "
            "(NaN when no node is measured or the node source failed)",
            registry=r,
        )
        self.onprem_idle_allocated_seconds = Counter(
            "gpu_autoscaler_onprem_idle_allocated_gpu_seconds",
            "GPU-seconds on-prem GPUs were allocated on nodes that read idle, tick to tick",
            registry=r,
        )
        self.onprem_unmeasured = Gauge(
            "gpu_autoscaler_onprem_unmeasured_nodes",
            "On-prem nodes with no current utilisation reading (never counted as idle)",
            registry=r,
        )
        # money
        self.cost_per_hour = Gauge(
            "gpu_autoscaler_cost_per_hour_dollars",
            "What the pool's live instances cost per hour at its price now",
            ["pool"],
            registry=r,
        )
        self.spend = Counter(
            "gpu_autoscaler_spend_dollars",
            "Dollars accrued by our instances since this process started",
            ["pool"],
            registry=r,
        )
        self.month_spend = Gauge(
            "gpu_autoscaler_month_spend_dollars",
            "Dollars accrued this calendar month (UTC), from the journal",
            registry=r,
        )
        self.budget_exhausted = Gauge(
            "gpu_autoscaler_budget_exhausted",
            "1 while the cap stops scale-up (cap: hourly or monthly)",
            ["cap"],
            registry=r,
        )
        # decisions and actions
        self.decisions = Counter(
            "gpu_autoscaler_decisions",
            "Policy decisions by outcome (ok, clamped, held)",
            ["outcome"],
            registry=r,
        )
        self.clamps = Counter(
            "gpu_autoscaler_clamps",
            "Parts of plans the guard cut, by rule",
            ["rule"],
            registry=r,
        )
        self.actions = Counter(
            "gpu_autoscaler_actions",
            "Actions taken, by kind and outcome",
            ["kind", "outcome"],
            registry=r,
        )
        # clouds
        self.provider_seconds = Histogram(
            "gpu_autoscaler_provider_request_duration_seconds",
            "Latency of calls to a cloud provider, by operation",
            ["provider", "operation"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.provider_errors = Counter(
            "gpu_autoscaler_provider_errors",
            "Failed calls to a cloud provider, by operation and error code",
            ["provider", "operation", "code"],
            registry=r,
        )
        self.capacity_cache_entries = Gauge(
            "gpu_autoscaler_capacity_cache_entries",
            "Pools held unavailable by the insufficient-capacity cache",
            registry=r,
        )
        # interruptions and checkpoints
        self.registration_timeouts = Counter(
            "gpu_autoscaler_registration_timeouts",
            "Cloud nodes terminated because they never joined the scheduler in time, by pool",
            ["pool"],
            registry=r,
        )
        self.interruptions = Counter(
            "gpu_autoscaler_interruptions",
            "Interruption notices acted on, by pool",
            ["pool"],
            registry=r,
        )
        self.checkpoints = Counter(
            "gpu_autoscaler_checkpoints",
            "Checkpoints jobs reported to the controller",
            registry=r,
        )
        self.evacuations = Counter(
            "gpu_autoscaler_evacuations",
            "Jobs moved off nodes the cloud is taking back, by what happened to each",
            ["move"],
            registry=r,
        )
        self.work_lost = Counter(
            "gpu_autoscaler_work_lost_gpu_seconds",
            "GPU-seconds lost to interruptions: what ran since the checkpoint a job resumes from",
            registry=r,
        )
        # the loop
        self.ticks = Counter("gpu_autoscaler_ticks", "Ticks by outcome", ["outcome"], registry=r)
        self.tick_seconds = Histogram(
            "gpu_autoscaler_tick_duration_seconds",
            "Wall time of a tick",
            buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
            registry=r,
        )
        self.leader = Gauge(
            "gpu_autoscaler_leader", "1 while this replica holds the leader lock", registry=r
        )
        self.fencing_token = Gauge(
            "gpu_autoscaler_fencing_token",
            "The leader lock's fencing token this replica acts under (0 on a standby)",
            registry=r,
        )
