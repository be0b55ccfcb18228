"""The journal's tables, in SQL both SQLite and PostgreSQL accept (``{id}`` is the dialect's
auto-numbered key). Times are Unix seconds; lists are JSON text."""

from __future__ import annotations

SCHEMA_VERSION = 1

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
        clamps TEXT NOT NULL
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
        PRIMARY KEY (instance_id, month)
    )""",
    "CREATE INDEX IF NOT EXISTS instance_costs_month ON instance_costs (month)",
)
