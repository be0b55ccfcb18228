"""The monthly cap as a projected ceiling, for the guard.

A cap that only stops launches lets the fleet already running bill past it. So the guard holds
the *projection* under ``limits.max_cost_per_month``: what the journal says was spent this
calendar month (UTC) plus what the capacity we keep would cost if it ran to the month's end. A
launch is granted only while its own cost to the month's end still fits; when the projection is
over the cap already, the guard sheds capacity, in this order, until it fits:

1. idle capacity: nodes holding no job (empty, or not yet joined);
2. work that on-prem can hold: nodes whose jobs fit in the on-prem GPUs free now;
3. best-effort work: nodes whose every job saves checkpoints, so moving them loses little.

Within each class the dearest node goes first; the jobs of classes 2 and 3 are moved at their
checkpoints. Work that cannot checkpoint is never shed to meet a budget: if the projection is
still over, scale-up stays held and ``gpu_autoscaler_budget_exhausted`` says so.
"""

from __future__ import annotations

import math
from collections.abc import Collection
from dataclasses import dataclass
from datetime import UTC, datetime

from autoscaler.fleet.instances import holds_capacity
from autoscaler.model import CAPACITY_STATES, CloudNode, DrainRequest, FleetView

HOUR = 3600.0


def hours_to_month_end(now: float) -> float:
    """Hours from ``now`` to the start of the next calendar month, UTC."""
    at = datetime.fromtimestamp(now, UTC)
    year, month = (at.year + 1, 1) if at.month == 12 else (at.year, at.month + 1)
    return max(0.0, (datetime(year, month, 1, tzinfo=UTC).timestamp() - now) / HOUR)


def run_rate(view: FleetView) -> float:
    """$/hour of the capacity the fleet keeps (nodes already leaving are not projected)."""
    return view.cost_per_hour(CAPACITY_STATES)


@dataclass(frozen=True)
class Projection:
    spent: float
    rate_per_hour: float
    hours_left: float
    cap: float

    @property
    def month_end(self) -> float:
        return self.spent + self.rate_per_hour * self.hours_left

    @property
    def room(self) -> float:
        """Dollars the projection may still grow by this month."""
        return self.cap - self.month_end

    def describe(self) -> str:
        return (
            f"projected month-end ${self.month_end:,.2f} (${self.spent:,.2f} spent + "
            f"${self.rate_per_hour:,.2f}/h for {self.hours_left:,.0f} h) of "
            f"${self.cap:,.2f}"
        )


def shed(
    view: FleetView, projection: Projection, leaving: Collection[str] = ()
) -> list[DrainRequest]:
    """Drains that bring the projection back under the cap, in the documented order.
    ``leaving`` are nodes already given back this tick: their cost comes off first."""
    prices = {p.pool.name: p.price.price_per_hour for p in view.pools if p.price is not None}
    over = -projection.room - sum(
        prices.get(n.pool, 0.0) * projection.hours_left
        for n in view.instances
        if n.instance_id in leaving and holds_capacity(n.state)
    )
    if over <= 0 or projection.hours_left <= 0:
        return []
    keeping = [
        n
        for n in view.instances
        if holds_capacity(n.state) and prices.get(n.pool, 0.0) > 0 and n.instance_id not in leaving
    ]
    dearest_first = sorted(keeping, key=lambda n: (-prices[n.pool], n.instance_id))
    free_onprem = view.onprem_gpus_free
    chosen: list[DrainRequest] = []
    taken: set[str] = set()
    reason = f"monthly budget: {projection.describe()}"

    def take(node: CloudNode, move_jobs: bool) -> None:
        nonlocal over
        taken.add(node.instance_id)
        chosen.append(
            DrainRequest(instance_id=node.instance_id, reason=reason, move_jobs=move_jobs)
        )
        over -= prices[node.pool] * projection.hours_left

    for node in dearest_first:
        if over > 0 and (not node.joined or node.gpus_allocated == 0):
            take(node, move_jobs=False)
    for node in dearest_first:
        if over > 0 and node.instance_id not in taken and node.gpus_allocated <= free_onprem:
            free_onprem -= node.gpus_allocated
            take(node, move_jobs=True)
    for node in dearest_first:
        if over > 0 and node.instance_id not in taken and node.jobs_checkpoint is True:
            take(node, move_jobs=True)
    return chosen


def launch_room(projection: Projection, price: float | None) -> float:
    """Instances at ``price`` the projection still has room for."""
    if price is None:
        return 0.0
    cost = price * projection.hours_left
    if cost <= 0:
        return math.inf
    return max(0.0, math.floor(projection.room / cost + 1e-9))
