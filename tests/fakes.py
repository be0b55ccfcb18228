"""In-memory stand-ins for the controller's collaborators, for unit tests of the core.

They implement the same protocols a cloud or a scheduler does, keep state, and can be told to
fail; the cloud SDK integrations are tested against real servers elsewhere.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from autoscaler.model import (
    DemandGroup,
    Instance,
    InstanceState,
    InterruptionNotice,
    Job,
    OnPremNode,
    Placement,
    Pool,
    PriceQuote,
)
from autoscaler.model.clock import ManualClock
from autoscaler.model.config import ControllerConfig, Limits
from autoscaler.model.errors import CapacityError, ProviderError
from autoscaler.model.teams import TeamsConfig
from autoscaler.ops.journal import Journal
from autoscaler.ops.metrics import Metrics
from autoscaler.spi.policy import Policy
from autoscaler.spi.provider import LaunchResult
from autoscaler.spi.sources import NodeReading, NodeUsage, aggregate
from autoscaler.tick.controller import Controller
from autoscaler.tick.retry import RetryPolicy
from policies.cost_aware import CostAwarePolicy


@dataclass
class FakeCloud:
    """One provider's instances. ``faults`` are consumed one per launch call, in order."""

    name: str
    price_table: dict[str, float] = field(default_factory=dict)
    capacity: dict[str, int] = field(default_factory=dict)
    instances: dict[str, Instance] = field(default_factory=dict)
    by_request: dict[str, list[str]] = field(default_factory=dict)
    faults: list[ProviderError | None] = field(default_factory=list)
    list_error: Exception | None = None
    notices: list[InterruptionNotice] = field(default_factory=list)
    unacknowledged: list[InterruptionNotice] = field(default_factory=list)
    launch_calls: list[tuple[str, int, str]] = field(default_factory=list)
    gang_calls: list[tuple[str, int, str]] = field(default_factory=list)
    terminate_calls: list[list[str]] = field(default_factory=list)
    now: Callable[[], float] = lambda: 0.0
    counter: int = 0

    def list_instances(self, fleet_id: str) -> list[Instance]:
        if self.list_error is not None:
            raise self.list_error
        return list(self.instances.values())

    def launch(
        self, pool: Pool, count: int, request_id: str, fleet_id: str, *, team: str | None = None
    ) -> LaunchResult:
        self.launch_calls.append((pool.name, count, request_id))
        if request_id in self.by_request:
            return LaunchResult(
                tuple(self.instances[i] for i in self.by_request[request_id]),
                already_existed=True,
            )
        if self.faults:
            fault = self.faults.pop(0)
            if fault is not None:
                raise fault
        room = self.capacity.get(pool.name, 10**9) - sum(
            1 for i in self.instances.values() if i.pool == pool.name
        )
        granted = max(0, min(count, room))
        made = []
        for _ in range(granted):
            self.counter += 1
            instance = Instance(
                id=f"{self.name}-{self.counter}",
                pool=pool.name,
                state=InstanceState.PENDING,
                launched_at=self.now(),
                request_id=request_id,
                gpus=pool.gpus_per_instance,
                team=team,
            )
            self.instances[instance.id] = instance
            made.append(instance)
        self.by_request[request_id] = [i.id for i in made]
        shortfall = None
        if granted < count:
            shortfall = CapacityError(f"only {granted} of {count}", pool=pool.name)
        return LaunchResult(tuple(made), shortfall)

    def launch_gang(
        self, pool: Pool, count: int, request_id: str, fleet_id: str, *, team: str | None = None
    ) -> LaunchResult:
        """All or nothing: a gang the pool's capacity cannot hold whole is not started."""
        self.gang_calls.append((pool.name, count, request_id))
        room = self.capacity.get(pool.name, 10**9) - sum(
            1 for i in self.instances.values() if i.pool == pool.name
        )
        if room < count and request_id not in self.by_request:
            raise CapacityError(f"room for {room} of a gang of {count}", pool=pool.name)
        return self.launch(pool, count, request_id, fleet_id, team=team)

    def terminate(self, instance_ids: Sequence[str], request_id: str) -> None:
        self.terminate_calls.append(list(instance_ids))
        for instance_id in instance_ids:
            self.instances.pop(instance_id, None)

    def prices(self, pools: Sequence[Pool]) -> list[PriceQuote]:
        return [
            PriceQuote(pool=p.name, price_per_hour=self.price_table[p.name], as_of=self.now())
            for p in pools
            if p.name in self.price_table
        ]

    def poll_notices(self) -> list[InterruptionNotice]:
        taken, self.notices = self.notices, []
        self.unacknowledged.extend(taken)
        return taken

    def acknowledge(self, notices: Sequence[InterruptionNotice]) -> None:
        for notice in notices:
            self.unacknowledged.remove(notice)

    def boot_all(self) -> None:
        for instance_id, instance in list(self.instances.items()):
            self.instances[instance_id] = instance.model_copy(
                update={"state": InstanceState.RUNNING}
            )


@dataclass
class FakeQueue:
    name: str = "queue"
    jobs: list[Job] = field(default_factory=list)
    error: Exception | None = None

    def read(self, now: float) -> Sequence[DemandGroup]:
        if self.error is not None:
            raise self.error
        return aggregate(self.jobs)


@dataclass
class FakeNodes:
    name: str = "nodes"
    onprem: list[OnPremNode] = field(default_factory=list)
    cloud: dict[str, NodeUsage] = field(default_factory=dict)
    error: Exception | None = None

    def read_nodes(self, now: float) -> NodeReading:
        if self.error is not None:
            raise self.error
        return NodeReading(tuple(self.onprem), dict(self.cloud))


class SoloLaunches:
    """A ``FakeCloud`` whose cloud cannot launch a multi-node job's nodes together: it has every
    provider method but ``launch_gang`` (a capability is declared by having it)."""

    def __init__(self, cloud: FakeCloud) -> None:
        self.cloud = cloud
        self.name = cloud.name

    def list_instances(self, fleet_id: str) -> list[Instance]:
        return self.cloud.list_instances(fleet_id)

    def launch(
        self, pool: Pool, count: int, request_id: str, fleet_id: str, *, team: str | None = None
    ) -> LaunchResult:
        return self.cloud.launch(pool, count, request_id, fleet_id, team=team)

    def terminate(self, instance_ids: Sequence[str], request_id: str) -> None:
        self.cloud.terminate(instance_ids, request_id)

    def prices(self, pools: Sequence[Pool]) -> list[PriceQuote]:
        return self.cloud.prices(pools)

    def poll_notices(self) -> list[InterruptionNotice]:
        return self.cloud.poll_notices()

    def acknowledge(self, notices: Sequence[InterruptionNotice]) -> None:
        self.cloud.acknowledge(notices)


@dataclass
class FakeScheduler:
    placements: list[Placement] = field(default_factory=list)
    drained: list[str] = field(default_factory=list)
    evicted: list[str] = field(default_factory=list)
    running: dict[str, int] = field(default_factory=dict)

    def apply_placement(self, placement: Placement) -> None:
        self.placements.append(placement)

    def drain(self, node: str, reason: str) -> int:
        self.drained.append(node)
        return self.running.get(node, 0)

    def evict(self, node: str, reason: str) -> int:
        self.evicted.append(node)
        return self.running.pop(node, 0)


def pool(
    name: str,
    *,
    provider: str = "fake",
    market: str = "spot",
    gpus: int = 1,
    region: str = "r1",
    max_instances: int | None = None,
    gpu_model: str | None = None,
) -> Pool:
    return Pool(
        name=name,
        provider=provider,
        region=region,
        instance_type=f"type-{gpus}",
        gpus_per_instance=gpus,
        gpu_model=gpu_model,
        market=market,  # type: ignore[arg-type]
        max_instances=max_instances,
        boot_seconds=120,
    )


def job(
    job_id: str,
    gpus: int = 1,
    *,
    checkpoint: float | None = 1800.0,
    high: bool = False,
    submit: float = 0.0,
    nodes: int = 1,
    models: tuple[str, ...] = (),
) -> Job:
    return Job(
        id=job_id,
        gpus=gpus,
        submit_time=submit,
        checkpoint_interval_s=checkpoint,
        high_priority=high,
        nodes=nodes,
        gpu_models=models,
    )


@dataclass
class Rig:
    """A controller wired to fakes, with a clock the test moves."""

    controller: Controller
    cloud: FakeCloud
    queue: FakeQueue
    nodes: FakeNodes
    scheduler: FakeScheduler
    clock: ManualClock


def rig(
    pools: Sequence[Pool],
    prices: dict[str, float],
    *,
    policy: Policy | None = None,
    limits: dict[str, Any] | None = None,
    capacity: dict[str, int] | None = None,
    capacity_cache_ttl_s: float = 300.0,
    journal: Journal | None = None,
    fence: Callable[[int], None] | None = None,
    metrics: Metrics | None = None,
    registration_timeout_s: float | None = None,
    gangs: bool = True,
    teams: TeamsConfig | None = None,
) -> Rig:
    clock = ManualClock(1_000_000.0)
    cloud = FakeCloud(
        "fake", price_table=dict(prices), capacity=dict(capacity or {}), now=clock.now
    )
    queue = FakeQueue()
    nodes = FakeNodes()
    scheduler = FakeScheduler()
    config = ControllerConfig(
        fleet_id="test",
        pools=tuple(pools),
        limits=Limits(**(limits or {})),
        capacity_cache_ttl_s=capacity_cache_ttl_s,
        # FakeNodes reports only the cloud nodes a test says joined; the registration rule
        # has its own tests (test_registration.py)
        registration_timeout_s=registration_timeout_s,
        teams=teams,
    )
    controller = Controller(
        config,
        policy or CostAwarePolicy(),
        {"fake": cloud if gangs else SoloLaunches(cloud)},
        clock,
        [queue],
        nodes,
        scheduler,
        incarnation="t",
        retry=RetryPolicy(attempts=3, sleep=lambda _s: None),
        journal=journal,
        fence=fence,
        metrics=metrics,
    )
    return Rig(controller, cloud, queue, nodes, scheduler, clock)
