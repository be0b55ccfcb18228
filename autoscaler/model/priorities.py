"""The priority class of work, resolved against the config's ``teams.priority_classes``: its
order, whether it may run on spot, whether it may preempt lower classes, and its aging.

A class comes from the scheduler (a Slurm job's QOS, a Kubernetes pod's ``priorityClassName``,
a trace's ``priority_class``). A class the config does not list, and work naming none, is order
0 that may run on spot, preempts nothing and is never promoted: the config names the classes it
means to act on, and an unknown name says so once in the log (as ``TeamBook`` does for teams).

Aging keeps a lower class from starving behind higher ones that keep arriving: a pending group
whose oldest job has waited longer than its class's ``promote_after_s`` counts as the next class
up by order (the listed class with the smallest order above its own), and so on while it keeps
waiting: each further ``promote_after_s`` of the class it has reached raises it one class more,
until it reaches the top or a class that is never promoted. Promotion raises only the order it
is placed in; whether it may run on spot or preempt stays its own class's, since those describe
the work, not its wait. A running job counts in the class its age when it last started had
reached (``autoscaler/tick/rules/preempt.py``), so a job requeued by preemption again and again
ages into classes that may no longer take it.
"""

from __future__ import annotations

import bisect
import logging
import threading
from collections.abc import Mapping

from autoscaler.model.domain import Demand, DemandGroup
from autoscaler.model.teams import PriorityClass

log = logging.getLogger(__name__)

UNLISTED = PriorityClass(order=0)  # a class the config does not list, or none
MAX_SAID = 10_000


def resolve(classes: Mapping[str, PriorityClass], name: str | None) -> PriorityClass:
    """The class ``name`` names in the config, or ``UNLISTED``."""
    if not name:
        return UNLISTED
    return classes.get(name, UNLISTED)


def promoted_order(classes: Mapping[str, PriorityClass], name: str | None, waited_s: float) -> int:
    """The order a pending group of class ``name`` counts as after waiting ``waited_s`` (see the
    module's docstring: one class up per ``promote_after_s`` of the class reached)."""
    current = resolve(classes, name)
    ladder = sorted({c.order for c in classes.values()})
    by_order: dict[int, PriorityClass] = {}
    for cls in sorted(classes.values(), key=lambda c: c.order):
        # of several classes at one order, the one promoted soonest decides the next step
        known = by_order.get(cls.order)
        if known is None or _sooner(cls, known):
            by_order[cls.order] = cls
    left = waited_s
    while current.promote_after_s is not None and left > current.promote_after_s:
        above = bisect.bisect_right(ladder, current.order)
        if above >= len(ladder):
            break
        left -= current.promote_after_s
        current = by_order[ladder[above]]
    return current.order


def _sooner(a: PriorityClass, b: PriorityClass) -> bool:
    if a.promote_after_s is None:
        return False
    return b.promote_after_s is None or a.promote_after_s < b.promote_after_s


class ClassBook:
    """The classes jobs name, resolved against the config; a class the config does not list is
    said once per name."""

    def __init__(self, classes: Mapping[str, PriorityClass]) -> None:
        self.classes = dict(classes)
        self._said: set[str] = set()
        self._lock = threading.Lock()

    def of(self, name: str | None) -> PriorityClass:
        if name and name not in self.classes:
            with self._lock:
                first = name not in self._said
                if first and len(self._said) < MAX_SAID:
                    self._said.add(name)
            if first:
                log.warning(
                    "priority class %r is not in the config's teams.priority_classes: its work "
                    "is order 0, may run on spot, preempts nothing and is never promoted",
                    name[:200],
                )
        return resolve(self.classes, name)

    def order_of(self, group: DemandGroup, now: float) -> int:
        """The order ``group`` is placed in now: its class's, raised by aging."""
        self.of(group.priority_class)
        return promoted_order(self.classes, group.priority_class, now - group.oldest_submit_time)

    def rank(self, demand: Demand, now: float) -> Demand:
        """``demand`` with every group of a class kept off spot marked ``high_priority`` (so
        every placement rule keeps it off spot), each group's ``class_order`` its aged class's
        (a policy that buys by class reads it), and the groups in the order they are placed
        in: highest (aged) class first, the sources' order otherwise."""
        if not self.classes or not demand.groups:
            return demand
        ranked: list[tuple[int, int, DemandGroup]] = []
        for index, group in enumerate(demand.groups):
            order = self.order_of(group, now)
            update: dict[str, object] = {"class_order": order} if order != group.class_order else {}
            if not self.of(group.priority_class).spot and not group.high_priority:
                update["high_priority"] = True
            kept = group.model_copy(update=update) if update else group
            ranked.append((-order, index, kept))
        ranked.sort(key=lambda r: (r[0], r[1]))
        return demand.model_copy(update={"groups": tuple(g for _, _, g in ranked)})
