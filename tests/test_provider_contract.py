"""The provider contract, run against every provider and the backend it talks to (AWS on moto,
GCP and Azure on the emulators in this folder, and the simulated clouds): launch, idempotent
relaunch, listing by tag or label, terminating only what is ours, typed errors, partial
fulfilment, pagination, and a chaos run with faults and restarts through the real controller.
Gangs (``GangLauncher``: all or none, close together) for the clouds that launch them."""

from __future__ import annotations

import random
from collections.abc import Iterator

import pytest
from aws_placement import AwsGangWorld, PlacementProxy
from azure_emulator import AzureWorld
from contract_support import FAULT_KINDS, FLEET, AwsWorld, GangWorld, SimWorld, World
from fakes import FakeQueue, job
from gcp_emulator import GcpWorld

from autoscaler.model import InstanceState
from autoscaler.model.clock import ManualClock
from autoscaler.model.config import ControllerConfig, Limits
from autoscaler.model.errors import (
    AuthError,
    CapacityError,
    ProviderError,
    QuotaError,
    ThrottledError,
    TransientError,
)
from autoscaler.spi.provider import FLEET_TAG, POOL_TAG, REQUEST_TAG, GangLauncher
from autoscaler.tick.controller import Controller
from autoscaler.tick.retry import RetryPolicy
from policies.cost_aware import CostAwareParams, CostAwarePolicy

WORLDS: dict[str, type] = {"aws": AwsWorld, "gcp": GcpWorld, "azure": AzureWorld, "sim": SimWorld}
# the worlds whose provider launches gangs (the simulated clouds' provider does not yet)
GANG_WORLDS = ("aws", "gcp", "azure")
EXPECTED: dict[str, type[ProviderError]] = {
    "capacity": CapacityError,
    "quota": QuotaError,
    "throttle": ThrottledError,
    "server": TransientError,
    "auth": AuthError,
}


def able(capability: str) -> list[str]:
    return [name for name, cls in WORLDS.items() if capability in cls.capabilities]


@pytest.fixture
def world(request: pytest.FixtureRequest) -> Iterator[World]:
    yield request.getfixturevalue(f"{request.param}_world")


@pytest.fixture
def aws_world(aws: str) -> AwsWorld:
    return AwsWorld(aws)


@pytest.fixture
def sim_world() -> SimWorld:
    return SimWorld()


@pytest.fixture
def gang_world(request: pytest.FixtureRequest) -> GangWorld:
    if request.param == "aws":
        proxy: PlacementProxy = request.getfixturevalue("ec2_groups")
        return AwsGangWorld(proxy)
    world: GangWorld = request.getfixturevalue(f"{request.param}_world")
    return world


def clock() -> ManualClock:
    return ManualClock(1_700_000_000.0)


@pytest.mark.parametrize("world", list(WORLDS), indirect=True)
def test_launch_tags_and_lists(world: World) -> None:
    pool = world.pool("pool-a")
    provider = world.provider([pool], clock())
    result = provider.launch(pool, 3, "req-launch", FLEET)
    assert len(result.instances) == 3 and result.shortfall is None
    listed = provider.list_instances(FLEET)
    assert sorted(i.id for i in listed) == sorted(i.id for i in result.instances)
    assert {(i.pool, i.request_id, i.gpus) for i in listed} == {("pool-a", "req-launch", 1)}
    live = world.live()
    for instance in result.instances:
        tags = live[instance.id]
        assert tags[FLEET_TAG] == FLEET
        if world.name != "sim":
            assert tags[POOL_TAG] == "pool-a" and tags[REQUEST_TAG] == "req-launch"


@pytest.mark.parametrize("world", list(WORLDS), indirect=True)
def test_a_repeated_launch_after_a_restart_buys_nothing_more(world: World) -> None:
    pool = world.pool("pool-a")
    first = world.provider([pool], clock()).launch(pool, 2, "req-again", FLEET)
    again = world.provider([pool], clock()).launch(pool, 2, "req-again", FLEET)
    assert again.already_existed
    assert sorted(i.id for i in again.instances) == sorted(i.id for i in first.instances)
    assert len(world.live()) == 2


@pytest.mark.parametrize("world", able("stranger"), indirect=True)
def test_only_our_instances_are_seen_and_terminated(world: World) -> None:
    pool = world.pool("pool-a")
    provider = world.provider([pool], clock())
    ours = [i.id for i in provider.launch(pool, 2, "req-ours", FLEET).instances]
    stranger = world.add_stranger()
    assert sorted(i.id for i in provider.list_instances(FLEET)) == sorted(ours)
    provider.terminate([*ours, stranger], "req-term")
    assert set(world.live()) == {stranger}


@pytest.mark.parametrize(
    ("world", "fault"),
    [
        (name, fault)
        for name, cls in WORLDS.items()
        for fault in FAULT_KINDS
        if fault in cls.capabilities
    ],
    indirect=["world"],
)
def test_launch_failures_arrive_typed(world: World, fault: str) -> None:
    pool = world.pool("pool-a")
    provider = world.provider([pool], clock())
    world.fail_next("launch", fault)
    try:
        result = provider.launch(pool, 1, "req-fail", FLEET)
    except ProviderError as error:
        assert isinstance(error, EXPECTED[fault]), error
        assert error.pool in (None, "pool-a")
    else:
        assert fault == "capacity", "only a capacity failure may come back as a shortfall"
        assert result.instances == () and isinstance(result.shortfall, CapacityError)
    assert [i for i in world.live() if world.live()[i].get(FLEET_TAG) == FLEET] == []


@pytest.mark.parametrize(
    ("world", "fault"),
    [
        (name, fault)
        for name, cls in WORLDS.items()
        for fault in ("throttle", "server")
        if fault in cls.capabilities
    ],
    indirect=["world"],
)
def test_listing_failures_arrive_typed(world: World, fault: str) -> None:
    pool = world.pool("pool-a")
    provider = world.provider([pool], clock())
    world.fail_next("list", fault)
    with pytest.raises(EXPECTED[fault]):
        provider.list_instances(FLEET)


@pytest.mark.parametrize("world", able("partial"), indirect=True)
def test_partial_fulfilment_is_a_capacity_shortfall(world: World) -> None:
    pool = world.pool("pool-a")
    provider = world.provider([pool], clock())
    world.grant_at_most(1)
    result = provider.launch(pool, 3, "req-partial", FLEET)
    assert len(result.instances) == 1
    assert isinstance(result.shortfall, CapacityError)
    assert len(world.live()) == 1


@pytest.mark.parametrize("world", able("pagination"), indirect=True)
def test_listing_spans_pages(world: World) -> None:
    assert world.page_size is not None
    pool = world.pool("pool-a", max_instances=None)
    provider = world.provider([pool], clock())
    count = world.page_size * 2 + 1
    launched = provider.launch(pool, count, "req-many", FLEET).instances
    assert len(launched) == count
    assert len(provider.list_instances(FLEET)) == count


@pytest.mark.parametrize("world", able("chaos"), indirect=True)
def test_chaos_faults_and_restarts_never_leak_duplicate_or_overspend(world: World) -> None:
    rng = random.Random(11)
    pools = [world.pool("pool-a", max_instances=4), world.pool("pool-b", max_instances=4)]
    limits = Limits(
        max_instances=7, max_cost_per_hour=40.0, max_launches_per_tick=3, scale_down_cooldown_s=0
    )
    queue = FakeQueue()
    now = clock()
    sleeps: list[float] = []

    def controller() -> Controller:
        provider = world.provider(pools, now)
        config = ControllerConfig(
            fleet_id=FLEET, pools=tuple(pools), limits=limits, capacity_cache_ttl_s=120
        )
        policy = CostAwarePolicy(CostAwareParams(idle_seconds=0, unobserved_nodes="surplus"))
        return Controller(
            config,
            policy,
            {world.name: provider},
            now,
            [queue],
            retry=RetryPolicy(attempts=3, sleep=sleeps.append),
        )

    running = controller()
    prices = {q.pool: q.price_per_hour for q in running.providers[world.name].prices(pools)}
    assert set(prices) == {"pool-a", "pool-b"}, "every pool has a price for the budget"
    world.chaos(0.2, seed=3)
    demand = 0
    for _ in range(200):
        demand = max(0, min(12, demand + rng.choice([-2, -1, 0, 0, 1, 2])))
        queue.jobs = [job(f"d{i}") for i in range(demand)]
        if rng.random() < 0.05:
            running = controller()
        running.tick()
        now.advance(30)
        live = {i: t for i, t in world.live().items() if t.get(FLEET_TAG) == FLEET}
        by_pool: dict[str, int] = {}
        for tags in live.values():
            by_pool[tags[POOL_TAG]] = by_pool.get(tags[POOL_TAG], 0) + 1
        assert all(count <= 4 for count in by_pool.values()), by_pool
        assert len(live) <= 7
        cost = sum(prices[p] * n for p, n in by_pool.items())
        assert cost <= 40.0 + 1e-9, "the budget cap holds at every tick"
    world.chaos(0.0, seed=0)
    queue.jobs = [job(f"end{i}") for i in range(5)]
    for _ in range(8):
        running.tick()
        now.advance(30)
    live = {i for i, t in world.live().items() if t.get(FLEET_TAG) == FLEET}
    assert len(live) == 5, "the fleet matches the plan once the faults stop"
    known = {r.id for r in running.table.live() if r.state is not InstanceState.TERMINATING}
    assert live == known, "no instance is orphaned"


# -- gangs --------------------------------------------------------------------------------------


def gangs(world: GangWorld, pool_name: str) -> GangLauncher:
    provider = world.provider([world.gang_pool(pool_name)], clock())
    assert isinstance(provider, GangLauncher)
    return provider


@pytest.mark.parametrize("gang_world", GANG_WORLDS, indirect=True)
def test_a_gang_comes_up_whole_together_and_tagged(gang_world: GangWorld) -> None:
    pool = gang_world.gang_pool("pool-g")
    provider = gang_world.provider([pool], clock())
    assert isinstance(provider, GangLauncher)
    result = provider.launch_gang(pool, 3, "req-gang", FLEET)
    assert len(result.instances) == 3 and result.shortfall is None
    assert not result.already_existed
    live = gang_world.live()
    for instance in result.instances:
        tags = live[instance.id]
        assert tags[FLEET_TAG] == FLEET and tags[POOL_TAG] == "pool-g"
        assert tags[REQUEST_TAG] == "req-gang"
    (group,) = {gang_world.placement(i.id) for i in result.instances}
    assert group is not None, "the gang is placed in the group made for the pool"
    assert gang_world.placement_groups() == 1
    listed = provider.list_instances(FLEET)
    assert sorted(i.id for i in listed) == sorted(i.id for i in result.instances)


@pytest.mark.parametrize("gang_world", GANG_WORLDS, indirect=True)
def test_a_gang_that_comes_up_short_leaves_nothing_running(gang_world: GangWorld) -> None:
    pool = gang_world.gang_pool("pool-g")
    provider = gang_world.provider([pool], clock())
    assert isinstance(provider, GangLauncher)
    gang_world.come_up(1)
    with pytest.raises(CapacityError) as caught:
        provider.launch_gang(pool, 3, "req-short", FLEET)
    assert caught.value.pool == "pool-g"
    assert [i for i, tags in gang_world.live().items() if tags.get(FLEET_TAG) == FLEET] == []
    alive = (InstanceState.PENDING, InstanceState.RUNNING)
    assert [i for i in provider.list_instances(FLEET) if i.state in alive] == []


@pytest.mark.parametrize("gang_world", GANG_WORLDS, indirect=True)
def test_a_repeated_gang_launch_after_a_restart_buys_nothing_more(gang_world: GangWorld) -> None:
    first = gangs(gang_world, "pool-g").launch_gang(
        gang_world.gang_pool("pool-g"), 3, "req-again", FLEET
    )
    again = gangs(gang_world, "pool-g").launch_gang(
        gang_world.gang_pool("pool-g"), 3, "req-again", FLEET
    )
    assert again.already_existed
    assert sorted(i.id for i in again.instances) == sorted(i.id for i in first.instances)
    assert len(gang_world.live()) == 3
    assert gang_world.placement_groups() == 1, "the group is reused, not made again"


@pytest.mark.parametrize("gang_world", GANG_WORLDS, indirect=True)
def test_a_multi_node_job_gets_its_nodes_together_through_the_controller(
    gang_world: GangWorld,
) -> None:
    pool = gang_world.gang_pool("pool-g")
    now = clock()
    queue = FakeQueue()
    config = ControllerConfig(
        fleet_id=FLEET,
        pools=(pool,),
        limits=Limits(max_instances=8, max_cost_per_hour=100.0, max_launches_per_tick=8),
    )
    controller = Controller(
        config,
        CostAwarePolicy(CostAwareParams(idle_seconds=0)),
        {gang_world.name: gang_world.provider([pool], now)},
        now,
        [queue],
        retry=RetryPolicy(attempts=2, sleep=lambda _: None),
    )
    gang_world.come_up(1)
    queue.jobs = [job("short", gpus=3, nodes=3)]
    controller.tick()
    assert [i for i, t in gang_world.live().items() if t.get(FLEET_TAG) == FLEET] == [], (
        "a gang that came up short is not kept, not even in part"
    )
    gang_world.come_up(None)
    queue.jobs = [job("whole", gpus=3, nodes=3)]
    for _ in range(6):
        now.advance(150)  # past the capacity cache's memory of the short gang
        controller.tick()
        ours = [i for i, t in gang_world.live().items() if t.get(FLEET_TAG) == FLEET]
        if ours:
            break
    assert len(ours) == 3
    (group,) = {gang_world.placement(i) for i in ours}
    assert group is not None
