"""The scenario file: everything a dry run needs that a live controller would learn from the world.

It names the trace and the window to replay, what the trace does not record (which jobs
checkpoint, how often and for how long; which are high priority), the on-prem fleet, the
controller config with its pools, where each pool's prices and interruptions come from, and the
policies to compare. Paths are relative to the scenario file.

Besides the numeric rule of every YAML file (``autoscaler.model.inputfile``), a scenario is
bounded so that a replay always ends in reasonable time: the window is at most a year and a day
and at most ``MAX_REPLAY_TICKS`` controller ticks, a tick is at least a second, a checkpoint
interval at least a second, an interruption rate at most ``MAX_RATE_PER_HOUR`` an hour, the lower
bound's bins at least a minute, and the on-prem fleet at most ``MAX_ONPREM_NODES`` nodes of at most
``MAX_NODE_GPUS`` GPUs.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    BaseModel,
    Field,
    NonNegativeFloat,
    PositiveFloat,
    PositiveInt,
    ValidationInfo,
    field_validator,
    model_validator,
)

from autoscaler.model import Frozen, Name, Pool
from autoscaler.model.config import ControllerConfig
from autoscaler.model.csvfile import parse_timestamp
from autoscaler.model.errors import InputError
from autoscaler.model.inputfile import (
    LocatedDocument,
    read_yaml,
    relocate,
    validate_document,
    validate_settings,
)
from autoscaler.model.sharing import GpuSharing
from autoscaler.model.teams import overcommitted
from autoscaler.sim.demand_spec import DemandSeriesSpec
from autoscaler.sim.synthetic import SyntheticTraceSpec

DAY = 86_400.0
MAX_WINDOW_S = 366 * DAY
MAX_REPLAY_TICKS = 1_000_000
MAX_RATE_PER_HOUR = 100.0
MAX_ONPREM_NODES = 50_000
MAX_NODE_GPUS = 1024


def _printable(value: str) -> str:
    if not value or len(value) > 4096 or any(ord(c) < 0x20 or ord(c) == 0x7F for c in value):
        raise ValueError("expected printable text without control characters")
    return value


Text = Annotated[str, AfterValidator(_printable)]


class JobMatch(Frozen):
    """Selects trace jobs by what the trace records. Every given condition must hold."""

    priority_class: tuple[str, ...] | None = None
    preemptible: bool | None = None
    min_gpus: PositiveInt | None = None
    max_gpus: PositiveInt | None = None
    user_group: tuple[str, ...] | None = None
    min_gpu_fraction: float | None = Field(None, gt=0, le=1)
    max_gpu_fraction: float | None = Field(None, gt=0, le=1)

    def matches(
        self,
        priority_class: str,
        preemptible: bool,
        gpus: int,
        user_group: str,
        gpu_fraction: float = 1.0,
    ) -> bool:
        if self.min_gpu_fraction is not None and gpu_fraction < self.min_gpu_fraction:
            return False
        if self.max_gpu_fraction is not None and gpu_fraction > self.max_gpu_fraction:
            return False
        if self.priority_class is not None and priority_class not in self.priority_class:
            return False
        if self.preemptible is not None and preemptible != self.preemptible:
            return False
        if self.min_gpus is not None and gpus < self.min_gpus:
            return False
        if self.max_gpus is not None and gpus > self.max_gpus:
            return False
        return self.user_group is None or user_group in self.user_group


class CheckpointRule(Frozen):
    """Jobs matching ``match`` (a ``fraction`` of them, chosen by the seed) checkpoint every
    ``interval_s`` seconds of work, each checkpoint taking ``duration_s``."""

    match: JobMatch = JobMatch()
    fraction: float = Field(1.0, ge=0, le=1)
    interval_s: float = Field(ge=1)
    duration_s: NonNegativeFloat = 0.0

    def describe(self) -> str:
        conditions = [f"{k}={v}" for k, v in self.match.model_dump(exclude_none=True).items()]
        who = " and ".join(conditions) if conditions else "all jobs"
        share = f"{self.fraction:.0%} of " if self.fraction < 1 else ""
        return (
            f"{share}{who}: checkpoint every {self.interval_s:g} s of work, "
            f"{self.duration_s:g} s per checkpoint"
        )


class TeamRule(Frozen):
    """Trace jobs matching ``match`` are ``team``'s (the first rule that matches decides)."""

    team: Name
    match: JobMatch = JobMatch()


class TeamAssignment(Frozen):
    """Which team each trace job is: the trace's ``user_group`` column as the team's name
    (``from_user_group``), else the first of ``rules`` that matches, else no team (counted
    under ``unassigned``)."""

    from_user_group: bool = False
    rules: tuple[TeamRule, ...] = Field((), max_length=256)

    def team_of(
        self,
        priority_class: str,
        preemptible: bool,
        gpus: int,
        user_group: str,
        gpu_fraction: float = 1.0,
    ) -> str | None:
        if self.from_user_group and user_group:
            return user_group[:253]
        for rule in self.rules:
            if rule.match.matches(priority_class, preemptible, gpus, user_group, gpu_fraction):
                return rule.team
        return None


class TraceSpec(Frozen):
    """Where the jobs come from (a trace ``file``, a ``synthetic`` trace generated from a
    seed, see autoscaler/sim/synthetic.py, or a demand ``series`` whose jobs are inferred, see
    autoscaler/sim/demand_series.py) and which window of it to replay."""

    file: Text | None = None
    synthetic: SyntheticTraceSpec | None = None
    series: DemandSeriesSpec | None = None
    busiest_days: float | None = Field(None, gt=0, le=MAX_WINDOW_S / DAY)
    window_start_s: NonNegativeFloat | None = None
    window_end_s: PositiveFloat | None = None
    include_running_at_start: bool = True
    max_jobs: PositiveInt | None = None

    @property
    def window_s(self) -> float | None:
        """The replayed window's length when the scenario fixes it (else the trace's span)."""
        if self.busiest_days is not None:
            return self.busiest_days * DAY
        if self.window_start_s is not None and self.window_end_s is not None:
            return self.window_end_s - self.window_start_s
        return None

    @model_validator(mode="after")
    def _one_source(self) -> TraceSpec:
        if [self.file, self.synthetic, self.series].count(None) != 2:
            raise ValueError(
                "give exactly one of file (a trace CSV), synthetic (a generated trace) and "
                "series (a demand series CSV)"
            )
        return self

    @model_validator(mode="after")
    def _one_window(self) -> TraceSpec:
        if self.busiest_days is not None and (
            self.window_start_s is not None or self.window_end_s is not None
        ):
            raise ValueError("give either busiest_days or window_start_s/window_end_s, not both")
        if (
            self.window_start_s is not None
            and self.window_end_s is not None
            and self.window_end_s <= self.window_start_s
        ):
            raise ValueError("window_end_s must be after window_start_s")
        window = self.window_s
        if window is not None and window > MAX_WINDOW_S:
            raise ValueError(
                f"the window is {window / DAY:,.1f} days long; at most "
                f"{MAX_WINDOW_S / DAY:.0f} days are replayed"
            )
        return self


class OnPremNodeSpec(Frozen):
    name: Name
    gpus: int = Field(gt=0, le=MAX_NODE_GPUS)
    gpu_model: Annotated[str, Field(max_length=128), AfterValidator(_printable)] | None = None
    count: int = Field(1, gt=0, le=MAX_ONPREM_NODES)
    # this node's GPUs may be shared by jobs asking for a fraction of one (overrides
    # gpu_sharing.onprem); None: as gpu_sharing.onprem says (whole GPUs when that is unset too)
    gpu_sharing: GpuSharing | None = None


class PoolMarket(Frozen):
    price_zone: Text | None = None
    price_per_hour: NonNegativeFloat | None = None
    availability_trace: Text | None = None
    availability_offset_s: NonNegativeFloat = 0.0
    availability_loop: bool = True
    interruption_rate_per_hour: float | None = Field(None, ge=0, le=MAX_RATE_PER_HOUR)


class MarketSpec(Frozen):
    price_files: tuple[Text, ...] = ()
    availability_file: Text | None = None
    advisor_file: Text | None = None
    advisor_snapshot: Text | None = None
    pools: dict[str, PoolMarket] = Field(default_factory=dict)


class PolicySpec(Frozen):
    name: Name
    label: Annotated[str, Field(max_length=128), AfterValidator(_printable)] | None = None
    params: dict[str, Any] = Field(default_factory=dict)

    @property
    def title(self) -> str:
        return self.label or self.name


class SharingSpec(Frozen):
    """Which GPUs jobs asking for a fraction of one may share (autoscaler/model/sharing.py):
    every on-prem node's (``onprem``, unless the node says otherwise) and the instances of the
    pools named in ``pools``, or of every pool (``every_pool``, unless ``pools`` names it).
    Unset everywhere, every job takes whole GPUs, as before."""

    onprem: GpuSharing | None = None
    pools: dict[str, GpuSharing] = Field(default_factory=dict)
    every_pool: GpuSharing | None = None

    def for_node(self, node: OnPremNodeSpec) -> GpuSharing | None:
        return node.gpu_sharing if node.gpu_sharing is not None else self.onprem

    def for_pool(self, name: str) -> GpuSharing | None:
        return self.pools.get(name, self.every_pool)


class LowerBoundSpec(Frozen):
    enabled: bool = True
    bin_seconds: float = Field(300.0, ge=60)


class Scenario(Frozen):
    name: str
    description: str = ""
    seed: int = 0
    start: str
    wait_target_s: NonNegativeFloat = 600.0
    idle_util_pct: float = Field(5.0, ge=0, le=100)
    trace: TraceSpec
    checkpointing: tuple[CheckpointRule, ...] = ()
    high_priority: JobMatch | None = None
    onprem: tuple[OnPremNodeSpec, ...] = ()
    teams: TeamAssignment | None = None
    notice_lead_s: dict[str, Annotated[float, Field(ge=0, le=DAY)]] = Field(
        default_factory=lambda: {"aws": 120.0, "gcp": 30.0, "azure": 30.0}
    )
    controller: ControllerConfig
    policies: tuple[PolicySpec, ...] = Field(min_length=1)
    market: MarketSpec = MarketSpec()
    lower_bound: LowerBoundSpec = LowerBoundSpec()
    gpu_sharing: SharingSpec = SharingSpec()

    @property
    def shares_gpus(self) -> bool:
        """Whether any GPU of the scenario may be shared by fractional jobs."""
        sharing = self.gpu_sharing
        return (
            bool(sharing.pools)
            or (sharing.every_pool is not None and bool(self.controller.pools))
            or any(p.gpu_sharing is not None for p in self.controller.pools)
            or any(sharing.for_node(n) is not None for n in self.onprem)
        )

    def sharing_of(self, pool: Pool) -> GpuSharing | None:
        """How a pool's instances share their GPUs: the controller config's own
        ``pools[].gpu_sharing``, as the live controller reads it, else the scenario's
        ``gpu_sharing`` for the pool."""
        if pool.gpu_sharing is not None:
            return pool.gpu_sharing
        return self.gpu_sharing.for_pool(pool.name)

    @field_validator("start")
    @classmethod
    def _iso_start(cls, value: str) -> str:
        try:
            parse_timestamp(value, "start")
        except InputError:
            raise ValueError(
                f"expected an ISO-8601 time such as 2023-05-15T00:00:00Z, got {value!r}"
            ) from None
        return value

    @field_validator("onprem")
    @classmethod
    def _fleet_is_bounded(cls, onprem: tuple[OnPremNodeSpec, ...]) -> tuple[OnPremNodeSpec, ...]:
        nodes = sum(node.count for node in onprem)
        if nodes > MAX_ONPREM_NODES:
            raise ValueError(f"{nodes:,} nodes in all; at most {MAX_ONPREM_NODES:,}")
        return onprem

    @field_validator("controller")
    @classmethod
    def _replay_is_bounded(
        cls, controller: ControllerConfig, info: ValidationInfo
    ) -> ControllerConfig:
        tick = controller.tick_seconds
        if tick < 1:
            raise ValueError(f"tick_seconds is {tick:g}; a replay ticks at most once a second")
        trace = info.data.get("trace")
        window = trace.window_s if isinstance(trace, TraceSpec) else None
        if window is not None and window / tick > MAX_REPLAY_TICKS:
            raise ValueError(
                f"the trace window is {window / tick:,.0f} ticks of {tick:g} s; at most "
                f"{MAX_REPLAY_TICKS:,} are replayed: raise tick_seconds or shorten the window"
            )
        return controller

    @field_validator("controller")
    @classmethod
    def _guarantees_fit_the_fleet(
        cls, controller: ControllerConfig, info: ValidationInfo
    ) -> ControllerConfig:
        """A scenario knows its on-prem fleet: the teams' guarantees must fit on it."""
        onprem = info.data.get("onprem")
        if controller.teams is not None and isinstance(onprem, tuple):
            gpus = sum(node.gpus * node.count for node in onprem)
            problem = overcommitted(controller.teams.teams, gpus)
            if problem:
                raise ValueError(f"teams: {problem}")
        return controller

    @field_validator("market")
    @classmethod
    def _priced_pools_exist(cls, market: MarketSpec, info: ValidationInfo) -> MarketSpec:
        controller = info.data.get("controller")
        names = {p.name for p in controller.pools} if controller is not None else set()
        for name in market.pools:
            if controller is not None and name not in names:
                raise ValueError(f"pools names {name!r}, which is not a pool in controller.pools")
        return market

    @field_validator("gpu_sharing")
    @classmethod
    def _shared_pools_exist(cls, sharing: SharingSpec, info: ValidationInfo) -> SharingSpec:
        controller = info.data.get("controller")
        names = {p.name for p in controller.pools} if controller is not None else set()
        for name in sharing.pools:
            if controller is not None and name not in names:
                raise ValueError(f"pools names {name!r}, which is not a pool in controller.pools")
        return sharing

    @field_validator("controller")
    @classmethod
    def _spot_pools_have_a_lead(
        cls, controller: ControllerConfig, info: ValidationInfo
    ) -> ControllerConfig:
        leads = info.data.get("notice_lead_s")
        for pool in controller.pools:
            if leads is not None and pool.is_spot and pool.provider not in leads:
                raise ValueError(
                    f"pool {pool.name!r} is spot on {pool.provider!r}, "
                    "which has no notice_lead_s entry"
                )
        return controller

    @property
    def start_epoch(self) -> float:
        return parse_timestamp(self.start, "start")


class LoadedScenario:
    """A validated scenario and the folder its relative paths are resolved against; with the
    document it was read from, errors about its fields can name their lines (``locating``)."""

    def __init__(
        self,
        scenario: Scenario,
        base: Path,
        source: str,
        document: LocatedDocument | None = None,
    ) -> None:
        self.scenario = scenario
        self.base = base
        self.source = source
        self.document = document

    @contextmanager
    def locating(self) -> Iterator[None]:
        """An ``InputError`` about one of the scenario's fields (``controller.pools[0]``, raised
        by code that knew only the field) leaves this block naming the field's line too."""
        try:
            yield
        except InputError as exc:
            if self.document is None:
                raise
            raise relocate(exc, self.document) from None

    def derive(self, **changes: Any) -> LoadedScenario:
        """The same scenario with some top-level fields replaced (models or plain dicts), checked
        again as a whole, e.g. ``loaded.derive(trace=loaded.scenario.trace.model_copy(
        update={"busiest_days": 1}))`` for a quick replay."""
        data = self.scenario.model_dump()
        for key, value in changes.items():
            data[key] = value.model_dump() if isinstance(value, BaseModel) else value
        scenario = validate_settings(Scenario, data, field="", where=self.source)
        return LoadedScenario(scenario, self.base, self.source, self.document)

    def check_replay_length(self, horizon_s: float) -> None:
        """A window the scenario left to the trace (no ``window_*_s`` or ``busiest_days``) is
        only known once the trace is read: it is bounded in ticks here, as fixed ones are when
        the scenario is validated."""
        tick = self.scenario.controller.tick_seconds
        if horizon_s / tick > MAX_REPLAY_TICKS:
            raise InputError(
                self.document.where(("trace",)) if self.document is not None else self.source,
                f"the trace spans {horizon_s / tick:,.0f} ticks of {tick:g} s; at most "
                f"{MAX_REPLAY_TICKS:,} are replayed: set window_start_s and window_end_s or "
                "busiest_days, or raise controller.tick_seconds",
                field="trace",
            )

    def path(self, relative: str) -> Path:
        candidate = Path(relative)
        return candidate if candidate.is_absolute() else (self.base / candidate).resolve()


def load_scenario(path: Path | str) -> LoadedScenario:
    path = Path(path)
    document = read_yaml(path)
    scenario = validate_document(Scenario, document)
    return LoadedScenario(scenario, path.resolve().parent, str(path), document)


def default_scenario_path() -> Path:
    return (
        Path(__file__).resolve().parent.parent
        / "data"
        / "scenarios"
        / "alibaba-openb-busy-25d.yaml"
    )
