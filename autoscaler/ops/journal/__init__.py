"""The journal: every decision, every action and its outcome, and what each instance has cost.

Two records serve two purposes. ``cloud_calls`` is a write-ahead log of every mutating cloud call
(launch, terminate): a row is written, under the leader's fencing token, *before* the call and
completed after it, so a controller killed mid-call leaves a row that says so, and its successor
matches it with what the cloud lists under that request id. ``ticks`` and ``actions`` hold each
tick's decision and every action act took, written in one transaction when the tick ends, with
the cost accrued by each instance since the last tick (``instance_costs``, per instance and month:
the monthly budget cap reads its sum). SQLite by default (one file, WAL, survives a kill -9),
PostgreSQL when configured (where two replicas share it and the leader lock lives).
"""

from autoscaler.ops.journal.base import (
    CloudCall,
    Journal,
    JournalError,
    SpendRow,
    open_journal,
)

__all__ = ["CloudCall", "Journal", "JournalError", "SpendRow", "open_journal"]
