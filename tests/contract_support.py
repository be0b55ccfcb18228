"""What every provider's test world offers the shared contract tests (test_provider_contract.py).

A world is one provider and the backend it talks to (moto for AWS, the emulators in this folder
for GCP and Azure, the simulated clouds for sim). ``CAPABILITIES`` says which parts of the contract
a backend can exercise; the tests run every applicable pair, and nothing is skipped.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from typing import Any, ClassVar, Literal, Protocol

from aws_support import REGION, Faults
from botocore.awsrequest import AWSResponse

from autoscaler.model import Pool
from autoscaler.model.clock import Clock, ManualClock
from autoscaler.sim.cloud import PoolMarketModel, SimCloud
from autoscaler.sim.scheduler import SimScheduler
from autoscaler.sim.series import StepSeries
from autoscaler.spi.provider import FLEET_TAG, Provider
from providers.aws import AwsProvider
from providers.sim import SimProvider

FLEET = "contract"
Operation = Literal["launch", "list", "terminate"]
FAULT_KINDS = ("capacity", "quota", "throttle", "server", "auth")


class World(Protocol):
    name: str
    capabilities: ClassVar[frozenset[str]]
    page_size: int | None

    def pool(
        self, name: str, *, market: str = "spot", gpus: int = 1, max_instances: int | None = None
    ) -> Pool:
        """A pool of this cloud; launches in it need nothing else set up."""
        ...

    def provider(self, pools: Sequence[Pool], clock: Clock) -> Provider:
        """A fresh provider object for these pools, as a restarted controller would build."""
        ...

    def live(self) -> dict[str, dict[str, str]]:
        """Every live instance in the backend, ours or not, with its tags or labels."""
        ...

    def add_stranger(self) -> str:
        """Create an instance the controller did not launch (no fleet tag); return its id."""
        ...

    def fail_next(self, operation: Operation, fault: str, times: int = 1) -> None:
        """The next ``times`` calls of ``operation`` fail as the cloud would with this fault."""
        ...

    def grant_at_most(self, count: int | None) -> None:
        """Launches get at most ``count`` instances, the rest failing for capacity; None ends it."""
        ...

    def chaos(self, chance: float, seed: int) -> None:
        """From now on every operation fails with this chance (every fault kind); 0 stops it."""
        ...


class GangWorld(World, Protocol):
    """A world whose provider launches gangs (``GangLauncher``): a multi-node job's instances
    all or none, close together. The simulated clouds are not one yet."""

    def gang_pool(self, name: str) -> Pool:
        """A pool whose gangs go into a placement group the provider makes for it."""
        ...

    def placement(self, instance_id: str) -> str | None:
        """The placement group (policy) an instance was launched into, if any."""
        ...

    def placement_groups(self) -> int:
        """How many placement groups (policies) the backend holds."""
        ...

    def come_up(self, count: int | None) -> None:
        """Only ``count`` instances of a gang come up, the rest failing for capacity; those
        that came up are left for the provider to roll back. None ends it."""
        ...


# -- AWS on moto ----------------------------------------------------------------------------

AWS_OPERATIONS = {
    "launch": "CreateFleet",
    "list": "DescribeTags",
    "terminate": "TerminateInstances",
}


class AwsWorld:
    name = "aws"
    capabilities: ClassVar[frozenset[str]] = frozenset(
        {"stranger", "partial", "chaos", *FAULT_KINDS}
    )

    def __init__(self, url: str) -> None:
        self.url = url
        self.page_size = 1000
        self.faults = {op: Faults() for op in AWS_OPERATIONS.values()}
        self.granted: int | None = None
        import boto3

        self.ec2 = boto3.client("ec2", region_name=REGION, endpoint_url=url)

    def pool(
        self, name: str, *, market: str = "spot", gpus: int = 1, max_instances: int | None = None
    ) -> Pool:
        return Pool(
            name=name,
            provider="aws",
            region=REGION,
            zone=f"{REGION}a",
            instance_type="g5.xlarge" if gpus == 1 else "g5.12xlarge",
            gpus_per_instance=gpus,
            market=market,  # type: ignore[arg-type]
            max_instances=max_instances,
            boot_seconds=0,
            options={
                "instance_types": ["g5.2xlarge"] if gpus == 1 else [],
                "launch_template": {"name": "gpu"},
            },
        )

    def provider(self, pools: Sequence[Pool], clock: Clock) -> Provider:
        provider = AwsProvider.from_config({"endpoint_url": self.url}, pools, FLEET, clock)
        client = provider.client("ec2", REGION)
        for operation, faults in self.faults.items():
            client.meta.events.register(f"before-send.ec2.{operation}", faults)
        client.meta.events.register("before-parameter-build.ec2.CreateFleet", self._trim)
        client.meta.events.register("after-call.ec2.CreateFleet", self._report_trimmed)
        client.meta.events.register("before-call.ec2.DescribeSpotPriceHistory", self._prices)
        return provider

    def _trim(self, params: dict[str, Any], **_: Any) -> None:
        self._asked = params["TargetCapacitySpecification"]["TotalTargetCapacity"]
        if self.granted is not None:
            params["TargetCapacitySpecification"]["TotalTargetCapacity"] = max(
                0, min(self._asked, self.granted)
            )

    def _report_trimmed(self, parsed: dict[str, Any], **_: Any) -> None:
        if self.granted is not None and self.granted < self._asked:
            parsed.setdefault("Errors", []).append(
                {
                    "ErrorCode": "InsufficientInstanceCapacity",
                    "ErrorMessage": "there is not enough capacity",
                }
            )

    def _prices(self, **_: Any) -> tuple[AWSResponse, dict[str, Any]]:
        rows = [
            {
                "AvailabilityZone": f"{REGION}a",
                "InstanceType": kind,
                "ProductDescription": "Linux/UNIX",
                "SpotPrice": price,
                "Timestamp": __import__("datetime").datetime(2026, 1, 1),
            }
            for kind, price in (
                ("g5.xlarge", "0.45"),
                ("g5.2xlarge", "0.55"),
                ("g5.12xlarge", "2.40"),
            )
        ]
        return AWSResponse(self.url, 200, {}, None), {
            "SpotPriceHistory": rows,
            "ResponseMetadata": {"HTTPStatusCode": 200},
        }

    def live(self) -> dict[str, dict[str, str]]:
        pages = self.ec2.describe_instances(
            Filters=[{"Name": "instance-state-name", "Values": ["pending", "running"]}]
        )["Reservations"]
        return {
            i["InstanceId"]: {t["Key"]: t["Value"] for t in i.get("Tags", [])}
            for r in pages
            for i in r["Instances"]
        }

    def add_stranger(self) -> str:
        return str(
            self.ec2.run_instances(
                ImageId="ami-12c6146b", MinCount=1, MaxCount=1, InstanceType="g5.xlarge"
            )["Instances"][0]["InstanceId"]
        )

    def fail_next(self, operation: Operation, fault: str, times: int = 1) -> None:
        self.faults[AWS_OPERATIONS[operation]].planned.extend([fault] * times)

    def grant_at_most(self, count: int | None) -> None:
        self.granted = count

    def chaos(self, chance: float, seed: int) -> None:
        for index, faults in enumerate(self.faults.values()):
            faults.chance = chance
            faults.choices = ("throttle", "capacity", "server", "timeout")
            faults.rng = random.Random(seed + index)


# -- the simulated clouds -------------------------------------------------------------------


class _NoEvents:
    def __call__(self, when: float, kind: str, payload: object) -> None:
        """Boots and reclaims are not part of the provider contract."""


class SimWorld:
    """The simulator's provider: what a dry run's act step talks to. It only ever holds the
    instances it launched, and its one failure is running out of spot capacity."""

    name = "sim"
    capabilities: ClassVar[frozenset[str]] = frozenset({"capacity", "partial"})
    page_size = None

    def __init__(self) -> None:
        self.clock = ManualClock(0.0)
        self.capacity = math.inf
        self.failing = 0
        self._cloud: SimCloud | None = None

    def pool(
        self, name: str, *, market: str = "spot", gpus: int = 1, max_instances: int | None = None
    ) -> Pool:
        return Pool(
            name=name,
            provider="aws",
            region="r",
            instance_type=f"gpu-{gpus}",
            gpus_per_instance=gpus,
            market=market,  # type: ignore[arg-type]
            max_instances=max_instances,
            boot_seconds=60,
        )

    def provider(self, pools: Sequence[Pool], clock: Clock) -> Provider:
        if self._cloud is None:
            world = self

            class Market(PoolMarketModel):
                def capacity(self, t: float) -> float:
                    if world.failing:
                        world.failing -= 1
                        return 0.0
                    return world.capacity

            markets = {
                p.name: Market(StepSeries([0.0], [1.0]), interruption_rate_per_hour=0.0)
                for p in pools
            }
            scheduler = SimScheduler(self.clock, 5.0, lambda job, end: None)
            self._cloud = SimCloud(pools, markets, {"aws": 120.0}, 1, scheduler, _NoEvents())
        return SimProvider(self._cloud, "aws", self.clock)

    def live(self) -> dict[str, dict[str, str]]:
        assert self._cloud is not None
        return {i.id: {FLEET_TAG: FLEET} for i in self._cloud.instances.values()}

    def add_stranger(self) -> str:
        raise NotImplementedError("the simulated clouds hold no one else's instances")

    def fail_next(self, operation: Operation, fault: str, times: int = 1) -> None:
        assert operation == "launch" and fault == "capacity"
        self.failing += times

    def grant_at_most(self, count: int | None) -> None:
        self.capacity = math.inf if count is None else count

    def chaos(self, chance: float, seed: int) -> None:
        raise NotImplementedError
