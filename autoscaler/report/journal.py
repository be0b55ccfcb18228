"""Real spend, read from a live controller's journal, in the dry run's report format.

The point is comparison: a user who chose a policy from the simulator's report wants to see what
it actually cost, laid out the same way, beside what the simulator predicted. The journal knows
what was paid and what the controller did, and (from schema version 2) the on-prem GPUs held by
jobs on nodes that read idle; it does not know queue waits, jobs or how busy the cloud GPUs
were, so those figures stay ``None`` (shown as a dash), never zero, which would read as a
claim.

The journal is only read, never written: SQLite is opened with ``mode=ro`` (a running
controller keeps writing undisturbed, WAL readers never block it) and PostgreSQL in a read-only
transaction. Every read happens in one transaction, so the figures come from one snapshot.
Every row is parsed with the limits of what the controller writes (``autoscaler.ops.journal.rows``):
text in a number's column, NaN, a time no clock could reach or a schema version that is not a
number end the report with one line naming the journal, the table, the row and the column,
never in a figure made of garbage.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import sqlite3
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

from autoscaler.fleet.team_usage import UNKNOWN
from autoscaler.model.errors import InputError
from autoscaler.model.secrets import read_secret_env
from autoscaler.model.teams import TeamsConfig
from autoscaler.ops.journal import rows
from autoscaler.ops.journal.base import IdleSpan, SpendRow, TeamSpan
from autoscaler.ops.journal.rows import (
    ActionFigures,
    CostsRow,
    IdleRow,
    RowError,
    TeamUsageRow,
    TickFigures,
    Time1,
    tick_figure_columns,
)
from autoscaler.ops.journal.schema import SCHEMA_VERSION
from autoscaler.report.build import HOUR, MAX_POINTS, percentiles
from autoscaler.report.journal_teams import TeamTotals, team_lines, team_totals
from autoscaler.report.model import (
    GpuHours,
    JournalFacts,
    NodeIdle,
    PolicyResult,
    PolicyTimeline,
    PoolCost,
    PoolRow,
    Report,
    Series,
    TeamResult,
    WindowInfo,
)

POLICY = "journal"
LABEL = "Real (journal)"
BUDGET_RULES = ("budget", "monthly_budget")
REQUEUE_PREFIX = "requeued"
MOVED_OFF = "moved-off"  # a job moved off an on-prem node to make room (on-prem rebalancing)
CUT_SHORT = ("unknown", "started")
NOTHING_YET = "The journal has nothing yet: no tick or spend is recorded in the period."
TOP_IDLE_NODES = 5
# The schema version that first recorded on-prem GPUs allocated on idle nodes.
ONPREM_IDLE_SINCE_VERSION = 2
# The schema version that first split what each node cost and held between the teams.
TEAM_USAGE_SINCE_VERSION = 3


# ---------------------------------------------------------------- reading


class _Cursor(Protocol):
    def fetchall(self) -> list[Any]: ...


class _Connection(Protocol):
    def execute(self, sql: str, params: Sequence[Any] = ...) -> Any: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class Tick:
    at: float
    duration_s: float
    outcome: str
    pending_gpus: int
    cost_per_hour: float
    clamp_rules: frozenset[str]
    onprem_idle_gpu_s: float | None = None  # None: the tick did not know


@dataclass(frozen=True)
class Action:
    at: float
    kind: str
    pool: str | None
    done: int
    outcome: str
    lost_gpu_s: float | None


@dataclass(frozen=True)
class Records:
    """One snapshot of the journal over the period asked for."""

    where: str
    ticks: list[Tick]
    actions: list[Action]
    spend: list[SpendRow]
    calls_cut_short: int
    onprem_idle: list[IdleSpan] = field(default_factory=list)
    team_usage: list[TeamSpan] = field(default_factory=list)


class JournalReader:
    """A read-only view of the journal's tables over one DB-API connection."""

    def __init__(self, connection: _Connection, where: str, placeholder: str) -> None:
        self._db = connection
        self.where = where
        self._placeholder = placeholder

    def close(self) -> None:
        self._db.close()

    def read(self, since: float | None, until: float | None) -> Records:
        low = -math.inf if since is None else since
        high = math.inf if until is None else until
        with self._snapshot():
            version = self._check_schema()
            return Records(
                where=self.where,
                ticks=self._ticks(low, high, version),
                actions=self._actions(low, high),
                spend=self._spend(low, high),
                calls_cut_short=self._calls_cut_short(low, high),
                onprem_idle=self._onprem_idle(low, high, version),
                team_usage=self._team_usage(low, high, version),
            )

    def _team_usage(self, low: float, high: float, version: int) -> list[TeamSpan]:
        """Per team, place and day; a journal older than version 3 has none."""
        if version < TEAM_USAGE_SINCE_VERSION:
            return []
        found = self._parsed(
            TeamUsageRow,
            "team_usage",
            f"SELECT {rows.columns(TeamUsageRow)} FROM team_usage "
            f"WHERE (last_at >= %s AND first_at <= %s) OR {rows.insane_time('first_at')} "
            f"OR {rows.insane_time('last_at')} ORDER BY first_at, team, pool",
            (low, high),
        )
        return [TeamSpan(*r) for r in found]

    def _ticks(self, low: float, high: float, version: int) -> list[Tick]:
        found = self._parsed(
            TickFigures,
            "ticks",
            f"SELECT {tick_figure_columns(version)} FROM ticks "
            f"WHERE (at >= %s AND at <= %s) OR {rows.insane_time('at')} ORDER BY at, id",
            (low, high),
        )
        return [
            Tick(
                at=r.at,
                duration_s=r.duration_s,
                outcome=r.outcome,
                pending_gpus=r.pending_gpus,
                cost_per_hour=r.cost_per_hour,
                clamp_rules=frozenset(c["rule"] for c in r.clamps),
                onprem_idle_gpu_s=r.onprem_idle_gpu_s,
            )
            for r in found
        ]

    def _onprem_idle(self, low: float, high: float, version: int) -> list[IdleSpan]:
        """Per node and day; a journal older than version 2 has none (it opens read-only
        here, so it is read as it is, not migrated)."""
        if version < ONPREM_IDLE_SINCE_VERSION:
            return []
        found = self._parsed(
            IdleRow,
            "onprem_idle",
            f"SELECT {rows.columns(IdleRow)} FROM onprem_idle "
            f"WHERE (last_at >= %s AND first_at <= %s) OR {rows.insane_time('first_at')} "
            f"OR {rows.insane_time('last_at')} ORDER BY first_at, node",
            (low, high),
        )
        return [IdleSpan(*r) for r in found]

    def _actions(self, low: float, high: float) -> list[Action]:
        found = self._parsed(
            ActionFigures,
            "actions",
            f"SELECT {rows.columns(ActionFigures)} FROM actions "
            f"WHERE (at >= %s AND at <= %s) OR {rows.insane_time('at')} ORDER BY id",
            (low, high),
        )
        return [
            Action(
                at=r.at,
                kind=r.kind,
                pool=r.pool,
                done=r.done,
                outcome=r.outcome,
                lost_gpu_s=r.lost_gpu_s,
            )
            for r in found
        ]

    def _spend(self, low: float, high: float) -> list[SpendRow]:
        found = self._parsed(
            CostsRow,
            "instance_costs",
            f"SELECT {rows.columns(CostsRow)} FROM instance_costs "
            f"WHERE (last_at >= %s AND first_at <= %s) OR {rows.insane_time('first_at')} "
            f"OR {rows.insane_time('last_at')} ORDER BY first_at",
            (low, high),
        )
        return [SpendRow(*r) for r in found]

    def _calls_cut_short(self, low: float, high: float) -> int:
        marks = ", ".join(["%s"] * len(CUT_SHORT))
        found = self._parsed(
            Time1,
            "cloud_calls",
            f"SELECT started_at FROM cloud_calls WHERE outcome IN ({marks}) "
            f"AND ((started_at >= %s AND started_at <= %s) OR {rows.insane_time('started_at')})",
            (*CUT_SHORT, low, high),
        )
        return len(found)

    def _check_schema(self) -> int:
        found = self._rows("SELECT value FROM journal_meta WHERE key = %s", ("schema_version",))
        try:
            return rows.schema_version(found[0][0] if found else str(SCHEMA_VERSION))
        except RowError as exc:
            raise InputError(self.where, str(exc)) from None

    def _parsed(
        self, row: type[rows.R], table: str, sql: str, params: Sequence[Any]
    ) -> list[rows.R]:
        try:
            return rows.parse_rows(row, table, self._rows(sql, params))
        except RowError as exc:
            raise InputError(self.where, f"not what gpu-autoscaler writes: {exc}") from None

    def _rows(self, sql: str, params: Sequence[Any]) -> list[Any]:
        if self._placeholder != "%s":
            sql = sql.replace("%s", self._placeholder)
        try:
            cursor: _Cursor = self._db.execute(sql, params)
            return cursor.fetchall()
        except InputError:
            raise
        except Exception as exc:
            raise InputError(self.where, _unreadable(exc)) from exc

    @contextmanager
    def _snapshot(self) -> Iterator[None]:
        try:
            self._db.execute("BEGIN")
        except Exception as exc:
            raise InputError(self.where, _unreadable(exc)) from exc
        try:
            yield
        finally:
            # nothing was written; a failed read may have ended the transaction already
            with contextlib.suppress(Exception):
                self._db.execute("ROLLBACK")


def _unreadable(exc: Exception) -> str:
    if isinstance(exc, UnicodeDecodeError):  # SQLite's message quotes bytes of a damaged file
        return "is damaged: SQLite's answer about it is not even text"
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    if "no such table" in text or "does not exist" in text:
        return f"is not a gpu-autoscaler journal ({text})"
    return f"cannot be read as a gpu-autoscaler journal: {text}"


def open_sqlite_reader(path: Path) -> JournalReader:
    """``mode=ro``: a missing file is an error rather than a new empty journal, and the
    controller writing the same file is never blocked or changed. A file SQLite's quick check
    finds damaged is refused: a damaged index could hide rows from the figures."""
    where = str(path)
    if not path.is_file():
        raise InputError(where, "no such journal file")
    try:
        connection = sqlite3.connect(
            f"{path.resolve().as_uri()}?mode=ro", uri=True, isolation_level=None
        )
    except (sqlite3.Error, UnicodeDecodeError) as exc:
        raise InputError(where, _unreadable(exc)) from exc
    try:
        connection.execute("PRAGMA busy_timeout=5000")
        damage = [
            " ".join(str(r[0]).split())
            for r in connection.execute("PRAGMA quick_check(3)").fetchall()
        ]
    except (sqlite3.Error, UnicodeDecodeError) as exc:
        connection.close()
        raise InputError(where, _unreadable(exc)) from exc
    if damage != ["ok"]:
        connection.close()
        raise InputError(
            where,
            f"the journal is damaged ({'; '.join(damage)[:300]}); SQLite cannot vouch for any "
            "row in it: report from a backup",
        )
    return JournalReader(connection, where, "?")


def open_postgres_reader(env_var: str) -> JournalReader:
    """The DSN comes from an environment variable so that no password is on a command line;
    messages name the variable and the server, never the DSN."""
    import psycopg
    from psycopg.conninfo import conninfo_to_dict

    dsn = read_secret_env(env_var, "--journal-postgres-env")
    if not dsn.strip():
        raise InputError(
            "--journal-postgres-env", f"the environment variable {env_var} is not set or empty"
        )
    try:
        parts = conninfo_to_dict(dsn)
    except psycopg.Error as exc:
        raise InputError(
            "--journal-postgres-env", f"{env_var} does not hold a valid PostgreSQL DSN"
        ) from exc
    where = (
        f"postgresql://{parts.get('host', 'localhost')}:{parts.get('port', 5432)}/"
        f"{parts.get('dbname', '')}"
    )
    try:
        connection = psycopg.connect(dsn, autocommit=True, connect_timeout=10)
        connection.execute("SET SESSION CHARACTERISTICS AS TRANSACTION READ ONLY")
        connection.execute(
            "SET SESSION CHARACTERISTICS AS TRANSACTION ISOLATION LEVEL REPEATABLE READ"
        )
    except psycopg.Error as exc:
        raise InputError(where, f"cannot connect to the journal: {_scrubbed(exc, parts)}") from exc
    return JournalReader(connection, where, "%s")


def _scrubbed(exc: Exception, parts: dict[str, Any]) -> str:
    """The server's first line of reason, with the password cut out should it ever appear."""
    lines = str(exc).strip().splitlines()
    text = lines[0] if lines else type(exc).__name__
    password = str(parts.get("password") or "")
    return text.replace(password, "***") if password else text


def read_journal(
    path: Path | None, postgres_env: str | None, since: float | None, until: float | None
) -> Records:
    if (path is None) == (postgres_env is None):
        raise InputError(
            "report", "give exactly one of --journal FILE and --journal-postgres-env VAR"
        )
    reader = (
        open_sqlite_reader(path) if path is not None else open_postgres_reader(postgres_env or "")
    )
    try:
        return reader.read(since, until)
    finally:
        reader.close()


def parse_moment(text: str | None, flag: str) -> float | None:
    """An ISO date or date-time; one without a zone is read as UTC, like every journal time."""
    if text is None:
        return None
    try:
        moment = datetime.fromisoformat(text.strip())
    except ValueError as exc:
        raise InputError(flag, f"{text!r} is not an ISO date or date-time") from exc
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp()


def iso(at: float) -> str:
    return datetime.fromtimestamp(at, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


# ---------------------------------------------------------------- figures


def _share(row: SpendRow | IdleSpan, since: float | None, until: float | None) -> float:
    """The part of an instance-month (or node-day) row inside the period. The journal keeps one
    running sum per instance and month (per node and day), so a row cut by --since/--until is
    shared out in proportion to time, as if its rate had been constant over the row."""
    low = row.first_at if since is None else max(row.first_at, since)
    high = row.last_at if until is None else min(row.last_at, until)
    span = row.last_at - row.first_at
    if span <= 0:
        return 1.0 if low <= high else 0.0
    return max(0.0, min(1.0, (high - low) / span))


def _onprem_idle_hours(ticks: Sequence[Tick]) -> float | None:
    """The on-prem GPU-hours allocated on idle nodes the ticks counted; None when no tick of the
    period knew (a journal from before version 2, or no on-prem utilisation reading)."""
    known = [t.onprem_idle_gpu_s for t in ticks if t.onprem_idle_gpu_s is not None]
    return math.fsum(known) / HOUR if known else None


def _top_idle_nodes(
    spans: Sequence[IdleSpan], since: float | None, until: float | None
) -> list[NodeIdle]:
    by_node: dict[str, float] = {}
    for span in spans:
        by_node[span.node] = by_node.get(span.node, 0.0) + span.gpu_s * _share(span, since, until)
    ranked = sorted(((-s, n) for n, s in by_node.items() if s > 0))[:TOP_IDLE_NODES]
    return [NodeIdle(node=n, gpu_hours=round(-s / HOUR, 4)) for s, n in ranked]


@dataclass(frozen=True)
class Spend:
    rows: list[tuple[SpendRow, float]]  # each row with the share of it inside the period
    since: float | None
    until: float | None

    @property
    def usd(self) -> float:
        return sum(r.usd * s for r, s in self.rows)

    @property
    def gpu_hours(self) -> float:
        return sum(r.gpu_hours * s for r, s in self.rows)

    def by(self, key: str) -> dict[str, tuple[float, float]]:
        """Dollars and instance-hours per pool or provider."""
        totals: dict[str, tuple[float, float]] = {}
        for row, share in self.rows:
            name = str(getattr(row, key))
            usd, hours = totals.get(name, (0.0, 0.0))
            instance_hours = row.gpu_hours / row.gpus if row.gpus else 0.0
            totals[name] = (usd + row.usd * share, hours + instance_hours * share)
        return totals

    def cumulative(self, at: float) -> float:
        """Spend inside the period up to ``at``, each row spread evenly over its own span."""
        until = at if self.until is None else min(at, self.until)
        return sum(row.usd * _share(row, self.since, until) for row, _ in self.rows)


def _budget_hours(ticks: Sequence[Tick]) -> dict[str, float]:
    """The time from each tick a budget rule clamped to the next tick: the guard held
    scale-up back for that long (the last tick's share is not known yet)."""
    hours = dict.fromkeys(BUDGET_RULES, 0.0)
    for tick, following in itertools.pairwise(ticks):
        for rule in BUDGET_RULES:
            if rule in tick.clamp_rules:
                hours[rule] += (following.at - tick.at) / HOUR
    return {rule: round(h, 4) for rule, h in hours.items() if h > 0}


def _actions(actions: Sequence[Action]) -> dict[str, dict[str, int]]:
    counts: dict[str, Counter[str]] = {}
    for action in actions:
        counts.setdefault(action.kind, Counter())[action.outcome] += 1
    return {kind: dict(sorted(c.items())) for kind, c in sorted(counts.items())}


def _sample(ticks: Sequence[Tick]) -> list[Tick]:
    step = max(1, math.ceil(len(ticks) / MAX_POINTS))
    return list(ticks[::step])


def _timeline(ticks: Sequence[Tick], spend: Spend, start: float) -> PolicyTimeline:
    """Cost, cost per hour and pending GPUs as the ticks saw them; GPUs running and waits
    are not in the journal and stay empty."""
    picked = _sample(ticks)
    hours = [round((t.at - start) / HOUR, 4) for t in picked]
    empty = Series(t_hours=[], values=[])
    return PolicyTimeline(
        cost=Series(t_hours=hours, values=[round(spend.cumulative(t.at), 4) for t in picked]),
        cost_per_hour=Series(t_hours=hours, values=[round(t.cost_per_hour, 4) for t in picked]),
        pending_gpus=Series(t_hours=hours, values=[float(t.pending_gpus) for t in picked]),
        running_gpus=empty,
        cloud_gpus=empty,
        onprem_busy_gpus=empty,
        wait_p95_by_hour=empty,
    )


def journal_teams(
    records: Records,
    spend: Spend,
    since: float | None,
    until: float | None,
    teams: TeamsConfig | None,
) -> tuple[list[TeamResult], TeamTotals | None]:
    """The Teams table: each team's on-prem and cloud GPU-hours and its cents of the cost,
    which add up to the policy's cost to the cent (``journal_teams``). None where every line
    is unknown (a controller whose config lists no teams)."""
    if not records.team_usage:
        return [], None
    totals = team_totals(
        records.team_usage, {p: usd for p, (usd, _h) in spend.by("pool").items()}, since, until
    )
    if set(totals.teams) <= {UNKNOWN}:  # a controller with no teams: nothing to say per team
        return [], None
    return [
        TeamResult(
            team=team,
            jobs=0,
            wait_s=None,
            gpu_hours_onprem=round(totals.gpu_hours(team, onprem=True), 4),
            gpu_hours_cloud=round(totals.gpu_hours(team, onprem=False), 4),
            cost_cents=totals.team_cents(team),
            guaranteed_gpus=(
                teams.teams[team].guaranteed_gpus
                if teams is not None and team in teams.teams
                else None
            ),
        )
        for team in totals.teams
    ], totals


def journal_policy(records: Records, spend: Spend, start: float) -> PolicyResult:
    ticks, actions = records.ticks, records.actions
    usd = spend.usd
    lost_gpu_s = sum(a.lost_gpu_s or 0.0 for a in actions if a.kind == "evacuate")
    clamps: Counter[str] = Counter()
    for tick in ticks:
        clamps.update(tick.clamp_rules)
    return PolicyResult(
        policy=POLICY,
        label=LABEL,
        cost=round(usd, 2),
        cost_by_pool=[
            PoolCost(pool=pool, cost=round(c, 2), instance_hours=round(h, 2))
            for pool, (c, h) in sorted(spend.by("pool").items())
        ],
        cost_per_useful_gpu_hour=None,
        wait_s=None,
        jobs_total=None,
        jobs_finished=None,
        jobs_never_started=None,
        gpu_hours=GpuHours(
            useful=None,
            allocated_onprem=None,
            allocated_cloud=None,
            cloud_paid=round(spend.gpu_hours, 2),
            cloud_idle=None,
            lost=round(lost_gpu_s / HOUR, 2),
            checkpointing=None,
            onprem_allocated_idle=_rounded(_onprem_idle_hours(ticks), 2),
        ),
        onprem_utilisation=None,
        interruptions=sum(1 for a in actions if a.kind == "interruption"),
        checkpoints=None,
        requeues=sum(
            1 for a in actions if a.kind == "evacuate" and a.outcome.startswith(REQUEUE_PREFIX)
        ),
        migrations=sum(
            1 for a in actions if a.kind == "evacuate" and a.outcome == MOVED_OFF and a.done
        ),
        instances_launched=sum(a.done for a in actions if a.kind == "launch"),
        capacity_failures=sum(
            1 for a in actions if a.kind == "launch" and a.outcome in ("capacity", "partial")
        ),
        held_ticks=sum(1 for t in ticks if t.outcome == "held"),
        clamps=dict(sorted(clamps.items())),
        ticks=len(ticks),
        replay_wall_s=None,
        tick_ms=percentiles([t.duration_s * 1000 for t in ticks]),
        timeline=_timeline(ticks, spend, start),
    )


def _facts(
    records: Records, spend: Spend, since: float | None, until: float | None
) -> JournalFacts:
    ticks, actions = records.ticks, records.actions
    return JournalFacts(
        where=records.where,
        since=None if since is None else iso(since),
        until=None if until is None else iso(until),
        first_tick=iso(ticks[0].at) if ticks else None,
        last_tick=iso(ticks[-1].at) if ticks else None,
        ticks_by_outcome=dict(sorted(Counter(t.outcome for t in ticks).items())),
        instances_billed=len({row.instance_id for row, share in spend.rows if share > 0}),
        cost_by_provider={p: round(c, 4) for p, (c, _h) in sorted(spend.by("provider").items())},
        actions=_actions(actions),
        instances_launched=sum(a.done for a in actions if a.kind == "launch"),
        instances_terminated=sum(a.done for a in actions if a.kind == "terminate"),
        interruptions=sum(1 for a in actions if a.kind == "interruption"),
        lost_gpu_hours=round(
            sum(a.lost_gpu_s or 0.0 for a in actions if a.kind == "evacuate") / HOUR, 4
        ),
        budget_capped_hours=_budget_hours(ticks),
        cloud_calls_cut_short=records.calls_cut_short,
        onprem_idle_gpu_hours=_rounded(_onprem_idle_hours(ticks), 4),
        onprem_idle_top_nodes=_top_idle_nodes(records.onprem_idle, since, until),
        onprem_idle_unknown_ticks=sum(1 for t in ticks if t.onprem_idle_gpu_s is None),
    )


def _rounded(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


def _pools(records: Records) -> list[PoolRow]:
    """What the journal knows of each pool: its name, provider and GPUs per instance; region,
    instance type, market and price are in the controller's config, not in the journal."""
    interrupted = Counter(a.pool for a in records.actions if a.kind == "interruption")
    seen: dict[str, SpendRow] = {}
    for row in records.spend:
        seen.setdefault(row.pool, row)
    return [
        PoolRow(
            name=name,
            provider=row.provider,
            region=None,
            zone=None,
            instance_type=None,
            gpus=row.gpus,
            market=None,
            price_per_hour_at_start=None,
            interruptions=f"{interrupted.get(name, 0)} observed",
        )
        for name, row in sorted(seen.items())
    ]


def _assumptions(since: float | None, until: float | None) -> list[str]:
    lines = [
        "Cost is what the controller accrued per instance at the end of each tick: the pool's "
        "price at that tick times the time since the instance was last billed (from launch "
        "for a new one), for instances pending, running, draining or interrupted.",
        "GPU-hours paid are the instances' GPUs times the hours billed; on-prem GPUs cost "
        "nothing here, as in the dry run.",
        "Work lost is the GPU-time the evacuations of interrupted or drained nodes recorded as "
        "lost; interruptions count every interruption the controller recorded.",
        "Queue waits, jobs, GPUs used and on-prem utilisation are not in the journal: shown as "
        "a dash (unknown), not as zero.",
        "On-prem allocated idle: each tick counts, per on-prem node whose GPUs all read below "
        "the telemetry idle threshold, its allocated GPUs times the part of the time since the "
        "previous tick it has read idle; nodes without a reading are not counted, and a tick "
        "that could not know (no reading at all, the node source failed, a journal from "
        "before schema version 2) leaves the figure unknown rather than zero. Top nodes are "
        "summed per node and day, shared out by time when --since/--until cut a day.",
        "Hours stopped by a budget cap run from each tick the guard clamped on the rule to the "
        "next tick.",
        "Teams: each tick, every billed instance's accrued cost and GPU-time, and every on-prem "
        "node's GPUs times the time since the previous tick, were split between the teams by "
        "the GPU share their jobs held on it; (idle) is what no job held, unassigned jobs that "
        "name no team, and (unknown) time whose jobs were not read (no teams in the config, "
        "the scheduler failed, or spend journaled before schema version 3). Each pool's cost "
        "is split between the teams in whole cents by the largest remainder, so the teams add "
        "up to the cost to the cent. Quota use is the on-prem GPUs a team held on average over "
        "the period; guarantees come from the config given with --config.",
    ]
    if since is not None or until is not None:
        lines.append(
            "The journal sums cost per instance and month; a sum only partly inside the period "
            "is counted in proportion to its time inside, as if its price had been constant."
        )
    return lines


def _findings(policy: PolicyResult, facts: JournalFacts, hours: float) -> list[str]:
    if policy.ticks == 0 and not facts.instances_billed:
        return [NOTHING_YET]
    lines = [
        f"Real cloud cost ${policy.cost:,.2f} over {hours:,.2f} h "
        f"({_per_hour(policy.cost, hours)}), {policy.gpu_hours.cloud_paid:,.2f} GPU-h paid "
        f"on {facts.instances_billed} instance(s).",
    ]
    if facts.interruptions:
        lines.append(
            f"{facts.interruptions} interruption(s); {policy.gpu_hours.lost:,.2f} GPU-h of work "
            "lost."
        )
    for rule, capped in sorted(facts.budget_capped_hours.items()):
        lines.append(f"The {rule} cap stopped scale-up for {capped:,.2f} h.")
    if facts.cloud_calls_cut_short:
        lines.append(
            f"{facts.cloud_calls_cut_short} cloud call(s) were cut short by a controller stop."
        )
    if facts.onprem_idle_gpu_hours:
        most = facts.onprem_idle_top_nodes[0] if facts.onprem_idle_top_nodes else None
        lines.append(
            f"On-prem GPUs were allocated on nodes that read idle for "
            f"{facts.onprem_idle_gpu_hours:,.2f} GPU-h"
            + (f", the most on {most.node} ({most.gpu_hours:,.2f} GPU-h)" if most else "")
            + ": held by jobs, unused."
        )
    return lines


def _per_hour(usd: float, hours: float) -> str:
    return f"${usd / hours:,.2f}/h" if hours > 0 else "no time elapsed"


def _period(records: Records, since: float | None, until: float | None) -> tuple[float, float]:
    """The part of the period asked for that the journal covers: a controller started late
    or stopped early is not charged per hour for time it was not there."""
    times = [t.at for t in records.ticks] + [
        moment for r in records.spend for moment in (r.first_at, r.last_at)
    ]
    if not times:
        start = since if since is not None else (until if until is not None else 0.0)
        return start, start
    start = min(times) if since is None else max(since, min(times))
    end = max(times) if until is None else min(until, max(times))
    return start, max(start, end)


def build_journal_report(
    records: Records,
    since: float | None = None,
    until: float | None = None,
    teams: TeamsConfig | None = None,
) -> Report:
    """``teams``: the controller's config's teams, for their guarantees (the journal does not
    hold the config)."""
    start, end = _period(records, since, until)
    spend = Spend([(row, _share(row, since, until)) for row in records.spend], since, until)
    policy = journal_policy(records, spend, start)
    team_rows, totals = journal_teams(records, spend, since, until, teams)
    policy = policy.model_copy(update={"teams": team_rows})
    facts = _facts(records, spend, since, until)
    hours = (end - start) / HOUR
    findings = _findings(policy, facts, hours)
    if totals is not None:
        findings += team_lines(totals, end - start, teams)
    return Report(
        kind="journal",
        journal=facts,
        scenario=records.where,
        description=(
            "What the controller did and what its cloud instances cost, read from its journal, "
            "in the same format as the dry-run report so the two can be compared."
        ),
        source=records.where,
        seed=None,
        start=iso(start),
        wait_target_s=None,
        onprem_gpus=None,
        window=WindowInfo(
            trace=f"journal {records.where}",
            start_s=round(start, 3),
            end_s=round(end, 3),
            days=round(hours / 24, 3),
            jobs=None,
            carried_jobs=None,
            gpu_hours_submitted=None,
        ),
        assumptions=_assumptions(since, until),
        pools=_pools(records),
        lower_bounds=[],
        policies=[policy],
        default_policy=POLICY,
        findings=findings,
    )


# ---------------------------------------------------------------- beside the simulator


def with_prediction(
    report: Report, scenario: Path, policy_name: str | None, show_progress: bool = False
) -> Report:
    """The simulator's replay of ``scenario`` for the policy the controller runs, as a second
    row: compared per hour, since the replayed window and the journal's period differ.
    ``show_progress`` shows the replay as it runs (a bar on a terminal, a line every ~10 s in a
    log: ``autoscaler.model.progress``); a long scenario replays for minutes."""
    from autoscaler.model.progress import Progress
    from autoscaler.report.build import DEFAULT_POLICY, policy_result
    from autoscaler.sim.engine import prepare, simulate
    from autoscaler.sim.scenario import load_scenario

    loaded = load_scenario(scenario)
    wanted = policy_name or DEFAULT_POLICY
    specs = list(enumerate(loaded.scenario.policies))
    match = next(((i, s) for i, s in specs if wanted in (s.name, s.title)), None)
    if match is None:
        raise InputError(
            loaded.source,
            f"--policy {wanted} is not among the scenario's policies: "
            + ", ".join(s.title for _i, s in specs),
            field="policies",
        )
    prepared = prepare(loaded)
    index, spec = match
    desc = f"replay {spec.title} for comparison"
    with Progress(desc, prepared.horizon_s / 3600, "h", enabled=show_progress) as bar:
        result = simulate(prepared, spec, index, lambda t: bar.update_to(t / 3600))
    predicted = policy_result(result, prepared, []).model_copy(
        update={"label": f"Simulated: {result.label} ({loaded.scenario.name})"}
    )
    real = report.policies[0]
    real_hours = (report.window.end_s - report.window.start_s) / HOUR
    sim_hours = prepared.horizon_s / HOUR
    line = (
        f"Per hour, real {_per_hour(real.cost, real_hours)} against "
        f"{_per_hour(predicted.cost, sim_hours)} predicted by the simulator for "
        f"{predicted.label}; interruptions {_rate(real.interruptions, real_hours)} against "
        f"{_rate(predicted.interruptions, sim_hours)}."
    )
    return report.model_copy(
        update={"policies": [*report.policies, predicted], "findings": [*report.findings, line]}
    )


def _rate(count: int, hours: float) -> str:
    return f"{count / hours * 24:,.2f}/day" if hours > 0 else "no time elapsed"


# ---------------------------------------------------------------- the command


def run_journal_report(
    path: Path | None,
    postgres_env: str | None,
    since_text: str | None,
    until_text: str | None,
    out: Path,
    compare_scenario: Path | None = None,
    policy_name: str | None = None,
    show_progress: bool = False,
    config_path: Path | None = None,
) -> int:
    """``gpu-autoscaler report --journal ...``: write report.json/md/html and print a summary.
    ``show_progress`` shows the ``compare_scenario`` replay as it runs."""
    from autoscaler.report.render import summary_markdown
    from autoscaler.report.write import publishable, write_report

    since = parse_moment(since_text, "--since")
    until = parse_moment(until_text, "--until")
    if since is not None and until is not None and until < since:
        raise InputError("--until", f"{until_text} is before --since {since_text}")
    teams = None
    if config_path is not None:
        from autoscaler.model.config import load_config

        teams = load_config(config_path).teams
    records = read_journal(path, postgres_env, since, until)
    report = build_journal_report(records, since, until, teams)
    if compare_scenario is not None:
        report = with_prediction(report, compare_scenario, policy_name, show_progress)
    report = publishable(report)
    written = write_report(report, out)
    print(summary_markdown(report))
    print("\nwritten: " + ", ".join(str(p) for p in written))
    return 0
