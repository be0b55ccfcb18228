"""The journal's tables, in SQL both SQLite and PostgreSQL accept (``{id}`` is the dialect's
auto-numbered key). Times are Unix seconds; lists are JSON text.

``SCHEMA_VERSION`` is what this code writes; a journal written by an earlier version is brought
up to it when the controller opens it, by the steps in ``MIGRATIONS`` (each a column to add,
applied only where the column is missing), in the same transaction as the new version number.
A table added by a version is made by ``TABLES`` itself (``IF NOT EXISTS``).
"""

from __future__ import annotations

from typing import NamedTuple

SCHEMA_VERSION = 4


class AddColumn(NamedTuple):
    table: str
    column: str
    sql_type: str


# version -> what brings a journal of the version before it up to it
MIGRATIONS: dict[int, tuple[AddColumn, ...]] = {
    # 2: on-prem GPUs allocated on nodes that read idle, GPU-seconds per tick (NULL: not known,
    # and every tick written before version 2) and per node and day (the onprem_idle table)
    2: (AddColumn("ticks", "onprem_idle_gpu_s", "DOUBLE PRECISION"),),
    # 3: who pays for what (``autoscaler.fleet.team_usage``): each instance's accrued dollars
    # and GPU-time also in whole units (micro-dollars, GPU-milliseconds; NULL before version 3,
    # counted from the first tick after it), split between the teams in the team_usage table,
    # whose lines add up to them exactly
    3: (
        AddColumn("instance_costs", "usd_micros", "BIGINT"),
        AddColumn("instance_costs", "gpu_ms", "BIGINT"),
    ),
    # 4: whom each instance was bought for (``InstanceRecord.team``) on its cost rows, so a
    # team's month spend is the journal's own sum, instances that ended before a restart
    # included (NULL: no team, or a row written before version 4)
    4: (AddColumn("instance_costs", "team", "TEXT"),),
}

TABLES = (
    """CREATE TABLE IF NOT EXISTS journal_meta (
        key TEXT PRIMARY KEY,
        value TEXT NOT NULL
    )""",
    """CREATE TABLE IF NOT EXISTS ticks (
        id {id},
        incarnation TEXT NOT NULL,
        tick BIGINT NOT NULL,
        token BIGINT NOT NULL,
        at DOUBLE PRECISION NOT NULL,
        duration_s DOUBLE PRECISION NOT NULL,
        outcome TEXT NOT NULL,
        held TEXT,
        demand_known BOOLEAN NOT NULL,
        pending_gpus BIGINT NOT NULL,
        instances BIGINT NOT NULL,
        cost_per_hour DOUBLE PRECISION NOT NULL,
        plan TEXT NOT NULL,
        clamps TEXT NOT NULL,
        onprem_idle_gpu_s DOUBLE PRECISION
    )""",
    """CREATE TABLE IF NOT EXISTS actions (
        id {id},
        incarnation TEXT NOT NULL,
        tick BIGINT NOT NULL,
        token BIGINT NOT NULL,
        at DOUBLE PRECISION NOT NULL,
        kind TEXT NOT NULL,
        pool TEXT,
        requested BIGINT NOT NULL,
        done BIGINT NOT NULL,
        outcome TEXT NOT NULL,
        detail TEXT NOT NULL,
        request_id TEXT,
        instance_ids TEXT NOT NULL,
        job_id TEXT,
        lost_gpu_s DOUBLE PRECISION
    )""",
    "CREATE INDEX IF NOT EXISTS actions_at ON actions (at)",
    """CREATE TABLE IF NOT EXISTS cloud_calls (
        request_id TEXT PRIMARY KEY,
        kind TEXT NOT NULL,
        provider TEXT NOT NULL,
        pool TEXT,
        count BIGINT NOT NULL,
        token BIGINT NOT NULL,
        incarnation TEXT NOT NULL,
        started_at DOUBLE PRECISION NOT NULL,
        finished_at DOUBLE PRECISION,
        outcome TEXT NOT NULL,
        instance_ids TEXT NOT NULL,
        detail TEXT NOT NULL
    )""",
    """CREATE TABLE IF NOT EXISTS instance_costs (
        instance_id TEXT NOT NULL,
        month TEXT NOT NULL,
        provider TEXT NOT NULL,
        pool TEXT NOT NULL,
        gpus BIGINT NOT NULL,
        first_at DOUBLE PRECISION NOT NULL,
        last_at DOUBLE PRECISION NOT NULL,
        usd DOUBLE PRECISION NOT NULL,
        gpu_hours DOUBLE PRECISION NOT NULL,
        usd_micros BIGINT,
        gpu_ms BIGINT,
        team TEXT,
        PRIMARY KEY (instance_id, month)
    )""",
    "CREATE INDEX IF NOT EXISTS instance_costs_month ON instance_costs (month)",
    """CREATE TABLE IF NOT EXISTS onprem_idle (
        node TEXT NOT NULL,
        day TEXT NOT NULL,
        first_at DOUBLE PRECISION NOT NULL,
        last_at DOUBLE PRECISION NOT NULL,
        gpu_s DOUBLE PRECISION NOT NULL,
        PRIMARY KEY (node, day)
    )""",
    # GPU-milliseconds and micro-dollars per team, place (a pool, or on-prem) and day (UTC):
    # the teams' shares of every billed instance's and on-prem node's ticks, idle and unknown
    # time their own lines
    """CREATE TABLE IF NOT EXISTS team_usage (
        team TEXT NOT NULL,
        pool TEXT NOT NULL,
        day TEXT NOT NULL,
        first_at DOUBLE PRECISION NOT NULL,
        last_at DOUBLE PRECISION NOT NULL,
        gpu_ms BIGINT NOT NULL,
        usd_micros BIGINT NOT NULL,
        PRIMARY KEY (team, pool, day)
    )""",
)
