"""The real controller driving the AWS provider against moto: fallback and backoff within a tick,
and convergence. (The chaos run with faults and restarts is part of the provider contract.)"""

from __future__ import annotations

from typing import Any

import boto3
from aws_support import REGION, Faults, inject
from botocore.awsrequest import AWSResponse
from fakes import FakeQueue, job
from test_aws import FLEET, real_spot_prices

from autoscaler.model import Pool
from autoscaler.model.clock import ManualClock
from autoscaler.model.config import ControllerConfig, Limits
from autoscaler.tick.controller import Controller
from autoscaler.tick.retry import RetryPolicy
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
