"""The guard at scale with teams: what holding each team's burst limits and budget, and
splitting binding fleet-wide limits by weight, costs a tick.

The fake world: 10,000 live cloud instances over 200 pools (1, 4 and 8 GPUs per instance, each
priced), bought for 20 teams (and some for no team), and a plan of 600 launches (30 per team,
1 to 20 instances each, two fallbacks) under a ``max_gpus`` that cannot grant them all, so the
weighted split runs. The same plan is granted without teams (plan order, as before issue 19)
and with them. Prints the median and max time of ``guard()`` for each. Figures only.

    .venv/bin/python bench/bench_team_guard.py [--repeat 20]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from autoscaler.fleet.memory import Cooldowns
from autoscaler.model import (
    CloudNode,
    FleetView,
    InstanceState,
    LaunchRequest,
    Market,
    Plan,
    Pool,
    PoolView,
    PriceQuote,
)
from autoscaler.model.config import Limits
from autoscaler.model.teams import TeamsConfig, TeamSpec
from autoscaler.tick.guard import guard
from autoscaler.tick.intents import Requests
from autoscaler.tick.team_limits import TeamLedger

NOW = 1_790_000_000.0


def world(seed: int) -> tuple[FleetView, Plan, TeamLedger]:
    rng = random.Random(seed)
    pools = [
        Pool(
            name=f"p{k}",
            provider="fake",
            region="r1",
            instance_type=f"t{k}",
            gpus_per_instance=(1, 4, 8)[k % 3],
            market=Market.SPOT if k % 2 else Market.ON_DEMAND,
        )
        for k in range(200)
    ]
    views = tuple(
        PoolView(
            pool=p,
            price=PriceQuote(
                pool=p.name, price_per_hour=p.gpus_per_instance * rng.uniform(0.8, 3.0), as_of=0
            ),
        )
        for p in pools
    )
    teams = [f"team-{k}" for k in range(20)]
    owners: dict[str, str | None] = {}
    nodes = []
    for n in range(10_000):
        p = rng.choice(pools)
        iid = f"i-{n}"
        owners[iid] = rng.choice([*teams, None])
        nodes.append(
            CloudNode(
                instance_id=iid,
                pool=p.name,
                state=InstanceState.RUNNING,
                launched_at=NOW - 3600,
                gpus=p.gpus_per_instance,
            )
        )
    view = FleetView(now=NOW, tick=1, fleet_id="f", pools=views, instances=tuple(nodes))
    launches = []
    for team in teams:
        for _ in range(30):
            first, *rest = rng.sample(pools, 3)
            launches.append(
                LaunchRequest(
                    pool=first.name,
                    count=rng.randint(1, 20),
                    fallbacks=tuple(p.name for p in rest),
                    team=team,
                )
            )
    config = TeamsConfig(
        teams={
            t: TeamSpec(
                burst_gpus=rng.randint(2_000, 6_000),
                burst_usd_per_hour=rng.uniform(3_000, 12_000),
                monthly_budget_usd=rng.uniform(5e6, 2e7),
                weight=rng.uniform(0.5, 3.0),
            )
            for t in teams
        }
    )
    ledger = TeamLedger(config, owners, {t: rng.uniform(0, 1e6) for t in teams})
    return view, Plan(launches=tuple(launches)), ledger


def timed(view: FleetView, plan: Plan, ledger: TeamLedger | None, limits: Limits) -> float:
    started = time.perf_counter()
    guard(plan, Requests(), view, limits, Cooldowns(), teams=ledger)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args()
    view, plan, ledger = world(19)
    live_gpus = sum(n.gpus for n in view.instances)
    limits = Limits(max_gpus=live_gpus + 8_000, max_launches_per_tick=100_000)
    asked = sum(launch.count for launch in plan.launches)
    intents = guard(plan, Requests(), view, limits, Cooldowns(), teams=ledger)
    granted = sum(i.granted for i in intents.launches)
    print(
        f"world: {len(view.instances):,} live instances, {len(view.pools)} pools, "
        f"{len(plan.launches)} launches asking {asked:,} instances; "
        f"granted with teams {granted:,}"
    )
    for name, with_teams in (("without teams", None), ("with teams", ledger)):
        times = [timed(view, plan, with_teams, limits) for _ in range(args.repeat)]
        print(
            f"guard() {name}: median {statistics.median(times) * 1000:.1f} ms, "
            f"max {max(times) * 1000:.1f} ms over {args.repeat}"
        )


if __name__ == "__main__":
    main()
