"""The real controller driving the AWS provider against moto: fallback, backoff, convergence, and
a chaos run with faults and restarts that must never leak, duplicate or overspend."""

from __future__ import annotations

import random
from typing import Any

import boto3
from aws_support import REGION, Faults, inject
from botocore.awsrequest import AWSResponse
from fakes import FakeQueue, job
from test_aws import FLEET, real_spot_prices

from autoscaler.clock import ManualClock
from autoscaler.config import ControllerConfig, Limits
from autoscaler.controller import Controller
from autoscaler.model import InstanceState, Pool
from autoscaler.provider import FLEET_TAG, POOL_TAG
from autoscaler.retry import RetryPolicy
from policies.cost_aware import CostAwareParams, CostAwarePolicy
from providers.aws import AwsProvider

OPERATIONS = ("CreateFleet", "DescribeInstances", "TerminateInstances", "DescribeSpotPriceHistory")


def zone_pool(zone: str, max_instances: int | None = None) -> Pool:
    return Pool(
        name=f"g5-{zone[-1]}",
        provider="aws",
        region=REGION,
        zone=zone,
        instance_type="g5.xlarge",
        gpus_per_instance=1,
        market="spot",  # type: ignore[arg-type]
        max_instances=max_instances,
        boot_seconds=0,
        options={"instance_types": ["g5.2xlarge"], "launch_template": {"name": "gpu"}},
    )


class Harness:
    def __init__(
        self, url: str, pools: list[Pool], limits: Limits, clock: ManualClock, queue: FakeQueue
    ) -> None:
        self.url = url
        self.pools = pools
        self.limits = limits
        self.clock = clock
        self.queue = queue
        self.sleeps: list[float] = []
        self.restart()

    def restart(self) -> None:
        """A new process: a new provider and controller that know only what the cloud lists."""
        self.provider = AwsProvider.from_config(
            {"endpoint_url": self.url}, self.pools, FLEET, self.clock
        )
        rows = real_spot_prices("g5.xlarge", REGION, names=True)

        def real_prices(**_: Any) -> tuple[AWSResponse, dict[str, Any]]:
            answer = {"SpotPriceHistory": rows, "ResponseMetadata": {"HTTPStatusCode": 200}}
            return AWSResponse(self.url, 200, {}, None), answer

        self.ec2.meta.events.register("before-call.ec2.DescribeSpotPriceHistory", real_prices)
        config = ControllerConfig(
            fleet_id=FLEET, pools=tuple(self.pools), limits=self.limits, capacity_cache_ttl_s=120
        )
        policy = CostAwarePolicy(CostAwareParams(idle_seconds=0, unobserved_nodes="surplus"))
        self.controller = Controller(
            config,
            policy,
            {"aws": self.provider},
            self.clock,
            [self.queue],
            retry=RetryPolicy(attempts=3, sleep=self.sleeps.append),
        )

    @property
    def ec2(self) -> Any:
        return self.provider.client("ec2", REGION)

    def live(self) -> list[dict[str, Any]]:
        client = boto3.client("ec2", region_name=REGION, endpoint_url=self.url)
        pages = client.describe_instances(
            Filters=[{"Name": "instance-state-name", "Values": ["pending", "running"]}]
        )["Reservations"]
        return [i for r in pages for i in r["Instances"]]

    def price(self) -> float:
        (quote,) = self.provider.prices(self.pools[:1])
        return quote.price_per_hour


def test_capacity_failure_falls_back_in_the_same_tick_and_converges(aws: str) -> None:
    queue = FakeQueue(jobs=[job(f"j{i}") for i in range(3)])
    h = Harness(
        aws,
        [zone_pool("us-east-1a"), zone_pool("us-east-1b")],
        Limits(),
        ManualClock(1_700_000_000.0),
        queue,
    )
    faults = Faults(planned=["capacity"])
    inject(h.ec2, "CreateFleet", faults)
    report = h.controller.tick()
    launches = [(a.pool, a.outcome, a.done) for a in report.actions if a.kind == "launch"]
    assert launches[0][1] == "capacity" and launches[-1][2] == 3
    assert {a.pool for a in report.actions if a.outcome == "ok"} != {launches[0][0]}
    h.clock.advance(60)
    report = h.controller.tick()
    assert not [a for a in report.actions if a.kind == "launch"]
    assert len(h.live()) == 3


def test_throttling_backs_off_within_the_tick(aws: str) -> None:
    queue = FakeQueue(jobs=[job("j")])
    h = Harness(aws, [zone_pool("us-east-1a")], Limits(), ManualClock(1_700_000_000.0), queue)
    inject(h.ec2, "CreateFleet", Faults(planned=["throttle", "throttle"]))
    report = h.controller.tick()
    assert [(a.outcome, a.done) for a in report.actions if a.kind == "launch"] == [("ok", 1)]
    assert len(h.sleeps) == 2 and all(0 < s <= 8 for s in h.sleeps)
    assert len(h.live()) == 1


def test_chaos_faults_and_restarts_never_leak_duplicate_or_overspend(aws: str) -> None:
    rng = random.Random(7)
    pools = [zone_pool("us-east-1a", max_instances=4), zone_pool("us-east-1b", max_instances=4)]
    limits = Limits(
        max_instances=7, max_cost_per_hour=2.5, max_launches_per_tick=3, scale_down_cooldown_s=0
    )
    queue = FakeQueue()
    clock = ManualClock(1_700_000_000.0)
    h = Harness(aws, pools, limits, clock, queue)
    price = h.price()
    assert 0.2 < price < 1.0, "real g5.xlarge spot prices, not moto's constant"
    faults = {
        op: Faults(
            chance=0.2, choices=("throttle", "capacity", "server", "timeout"), rng=random.Random(i)
        )
        for i, op in enumerate(OPERATIONS)
    }

    def arm() -> None:
        for operation, fault in faults.items():
            inject(h.ec2, operation, fault)

    arm()
    demand = 0
    for _ in range(200):
        demand = max(0, min(12, demand + rng.choice([-2, -1, 0, 0, 1, 2])))
        queue.jobs = [job(f"d{i}") for i in range(demand)]
        if rng.random() < 0.05:
            h.restart()
            arm()
        h.controller.tick()
        clock.advance(30)
        live = h.live()
        by_pool: dict[str, int] = {}
        for raw in live:
            tags = {t["Key"]: t["Value"] for t in raw["Tags"]}
            assert tags[FLEET_TAG] == FLEET, "only tagged instances are ever launched"
            by_pool[tags[POOL_TAG]] = by_pool.get(tags[POOL_TAG], 0) + 1
        assert all(count <= 4 for count in by_pool.values()), by_pool
        assert len(live) <= 7
        assert len(live) * price <= 2.5 + 1e-9, "the budget cap holds at every tick"
    assert sum(len(f.injected) for f in faults.values()) > 50
    for fault in faults.values():
        fault.chance = 0.0
    queue.jobs = [job(f"end{i}") for i in range(5)]
    for _ in range(6):
        h.controller.tick()
        clock.advance(30)
    live = h.live()
    assert len(live) == 5, "the fleet matches the plan once the faults stop"
    known = {r.id for r in h.controller.table.live() if r.state is not InstanceState.TERMINATING}
    assert {raw["InstanceId"] for raw in live} == known, "no instance is orphaned"
