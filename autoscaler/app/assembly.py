"""The one assembly of the controller, for every mode (``build_controller``), and the live parts
it is built from: providers and sources are found through their entry point groups, and each
checks its own settings.

``live`` acts through the clouds and the scheduler; ``plan`` is the same tick with an executor
that records instead (``autoscaler.app.recording``); ``sim`` plugs in the simulator's clouds and
scheduler. Only the parts differ: the controller, its rules, guard and act are the same code.

A provider class offers ``from_config(settings, pools, fleet_id) -> Provider``; a source class
``from_config(settings, name)``, returning an object whose methods say which roles it can play
(queue, node source, telemetry, scheduler). Both raise ``InputError`` naming the field; errors
are pointed here at the file and line of that field when the config was read from a file.

``build_file_parts`` builds what the config file alone decides (the policy, the sources, the
providers with their pools, every ``*_env`` name) and contacts nothing: ``run`` starts with it,
and ``check_config`` (``gpu-autoscaler validate`` and ``run --dry-start``) builds it and the
controller, then closes them again, so validate accepts exactly what run builds. What lives
outside the file (the tokens and DSN in the environment, TLS files, ports, the journal, the
clouds) is read when ``run`` goes on from there.

The sources are built before the providers (``build_providers_and_signals``): a scheduler that
renders the boot script its cloud nodes join with (``RendersJoinScript``, Slurm's
``join_user_data``) fills the user data of each pool that joins it and brings none of its own,
and the providers launch with it.
"""

from __future__ import annotations

import os
import socket
import ssl
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from autoscaler.app.recording import Recorded, recording_provider, recording_scheduler
from autoscaler.fleet.checkpoints import CheckpointLedger
from autoscaler.fleet.telemetry import IdleTracker
from autoscaler.model import Pool
from autoscaler.model.clock import Clock, SystemClock
from autoscaler.model.config import ControllerConfig, LeaderKind, SourceRole
from autoscaler.model.errors import InputError
from autoscaler.model.logs import register_secret
from autoscaler.model.secrets import read_secret_env, register_config_secrets
from autoscaler.ops.inbox import InboxServer, NoticeInbox
from autoscaler.ops.journal import Journal, JournalError, open_journal
from autoscaler.ops.leader import LeaderLock, SoleReplica
from autoscaler.ops.metrics import Metrics
from autoscaler.spi.policy import PROVIDER_GROUP, Policy, load_entry_point, load_policy
from autoscaler.spi.provider import Closable, Provider, ProviderFactory
from autoscaler.spi.sources import (
    KnowsPools,
    NodeSource,
    QueueSource,
    RendersJoinScript,
    TelemetrySource,
    WorkloadScheduler,
)
from autoscaler.tick.controller import Controller
from autoscaler.tick.observe import Signals
from autoscaler.tick.retry import RetryPolicy

SOURCE_GROUP = "gpu_autoscaler.sources"


class Mode(StrEnum):
    LIVE = "live"
    PLAN = "plan"
    SIM = "sim"


@dataclass
class Parts:
    """What a mode plugs into the controller: the clouds, the signals observe reads and the
    scheduler act drains and requeues through; the journal, metrics and leader fence where the
    mode has them."""

    providers: Mapping[str, Provider]
    signals: Signals
    scheduler: WorkloadScheduler | None = None
    checkpoints: CheckpointLedger | None = None
    journal: Journal | None = None
    metrics: Metrics | None = None
    fence: Callable[[int], None] | None = None


@dataclass
class Assembled:
    controller: Controller
    recorded: Recorded | None = None


def build_controller(
    config: ControllerConfig,
    mode: Mode,
    policy: Policy,
    clock: Clock,
    parts: Parts,
    *,
    incarnation: str | None = None,
    retry: RetryPolicy | None = None,
    timer: Callable[[], float] = time.perf_counter,
) -> Assembled:
    """The controller for ``mode``. In plan mode every provider and the scheduler are wrapped
    to record what the tick would change, and nothing is journaled, fenced or exported."""
    providers = parts.providers
    scheduler = parts.scheduler
    recorded: Recorded | None = None
    journal, metrics, fence = parts.journal, parts.metrics, parts.fence
    if mode is Mode.PLAN:
        recorded = Recorded()
        providers = {n: recording_provider(p, clock, recorded) for n, p in providers.items()}
        if scheduler is not None:
            scheduler = recording_scheduler(scheduler, recorded)
        journal, metrics, fence = None, None, None
    try:
        controller = Controller(
            config,
            policy,
            providers,
            clock,
            scheduler=scheduler,
            signals=parts.signals,
            incarnation=incarnation,
            retry=retry,
            timer=timer,
            metrics=metrics,
            checkpoints=parts.checkpoints,
            journal=journal,
            fence=fence,
        )
    except InputError as exc:
        raise config.located(exc) from None
    return Assembled(controller, recorded)


def build_providers(
    config: ControllerConfig,
    where: str = "config",
    scheduler: WorkloadScheduler | None = None,
) -> dict[str, Provider]:
    """Every configured provider with its pools; pools that join ``scheduler`` get the boot
    script it renders as their user data (``joined_pools``), so build the sources first and pass
    their scheduler (``build_providers_and_signals``)."""
    all_pools = joined_pools(config, scheduler)
    names = sorted({p.provider for p in config.pools} | set(config.providers))
    providers: dict[str, Provider] = {}
    for name in names:
        indices = [i for i, p in enumerate(config.pools) if p.provider == name]
        # a provider numbers its own pools; the config numbers them all
        renames = tuple((f"pools[{k}]", ("pools", i)) for k, i in enumerate(indices))
        named_at = ("providers", name) if name in config.providers else ("pools", indices[0])
        try:
            cls: Any = load_entry_point(PROVIDER_GROUP, name, "provider")
            if not isinstance(cls, ProviderFactory):
                raise InputError(
                    where,
                    f"the provider {name!r} runs only inside the simulator",
                    field=f"providers.{name}",
                )
            pools = [all_pools[i] for i in indices]
            providers[name] = cls.from_config(
                config.providers.get(name, {}), pools, config.fleet_id
            )
        except InputError as exc:
            close_all(providers.values())
            raise config.located(
                exc, (("provider.name", named_at), *renames), default=named_at
            ) from None
    return providers


def joined_pools(config: ControllerConfig, scheduler: WorkloadScheduler | None) -> tuple[Pool, ...]:
    """The config's pools, each that joins the scheduler and has no user data of its own given
    the boot script the scheduler renders for it (when it renders one): the script that joins
    the instance to the scheduler under its id, with the pool's market, name and GPU model. A
    pool's own ``user_data``, even empty, is kept."""
    if not isinstance(scheduler, RendersJoinScript):
        return config.pools
    pools: list[Pool] = []
    for index, pool in enumerate(config.pools):
        rendered = None
        if pool.joins_scheduler and pool.user_data is None:
            try:
                rendered = scheduler.join_user_data(pool)
            except InputError as exc:
                raise config.located(exc, default=("pools", index)) from None
        pools.append(pool if rendered is None else pool.model_copy(update={"user_data": rendered}))
    if isinstance(scheduler, KnowsPools):
        scheduler.know_pools(pools)
    return tuple(pools)


def build_providers_and_signals(
    config: ControllerConfig, where: str = "config"
) -> tuple[dict[str, Provider], Wiring]:
    """The sources, then the providers with the pools the scheduler among them joins
    (``build_providers``); the sources are closed again when a provider cannot be built."""
    wiring = build_signals(config, where)
    try:
        providers = build_providers(config, where, wiring.scheduler)
    except BaseException:
        close_all([*wiring.signals.queues, *wiring.signals.telemetry])
        raise
    return providers, wiring


def load_configured_policy(config: ControllerConfig, where: str = "config") -> Policy:
    """The config's policy, built from its params; a bad name or param names its line."""
    try:
        return load_policy(config.policy.name, config.policy.params, where=where)
    except InputError as exc:
        raise config.located(exc, default=("policy",)) from None


@dataclass
class FileParts:
    """What the config file alone builds: the policy, the providers (their pools given the
    scheduler's boot script) and what the sources give the controller."""

    policy: Policy
    providers: dict[str, Provider]
    wiring: Wiring

    def plugged(self) -> Parts:
        """The parts as ``build_controller`` takes them, with nothing of the environment yet."""
        return Parts(self.providers, self.wiring.signals, self.wiring.scheduler)

    def close(self, *, quiet: bool = False) -> None:
        signals = self.wiring.signals
        close_all([*self.providers.values(), *signals.queues, *signals.telemetry], quiet=quiet)


def build_file_parts(config: ControllerConfig, where: str = "config") -> FileParts:
    """The policy, the sources, then the providers, each checking its own settings; then every
    ``*_env`` field's name is checked and its value registered as a secret. Nothing is contacted
    (the clouds' clients and the sources' connections are made on first use). ``run`` starts
    with this and ``check_config`` is this, so what ``validate`` accepts ``run`` builds; every
    error names the file, line and field."""
    policy = load_configured_policy(config, where)
    providers, wiring = build_providers_and_signals(config, where)
    parts = FileParts(policy, providers, wiring)
    try:
        register_config_secrets(config, where)
    except InputError as exc:
        parts.close(quiet=True)
        raise config.located(exc) from None
    except BaseException:
        parts.close(quiet=True)
        raise
    return parts


def check_config(config: ControllerConfig, where: str = "config") -> None:
    """Build what ``run`` builds from the file (``build_file_parts``) and the live controller
    over it, and close them: every setting the file holds is checked by the code that will use
    it. What lives outside the file (tokens and DSNs in the environment, TLS files, ports, the
    journal's database, credentials) is not checked here."""
    parts = build_file_parts(config, where)
    try:
        assembled = build_controller(
            config, Mode.LIVE, parts.policy, SystemClock(), parts.plugged()
        )
        assembled.controller.close()
    finally:
        parts.close(quiet=True)


def close_all(parts: Iterable[object], *, quiet: bool = False) -> None:
    """Close each part once (a source playing two roles is listed twice); ``quiet`` goes on
    past a part whose close fails (plan mode: a failed close must not hide the plan)."""
    closed: set[int] = set()
    for part in parts:
        if isinstance(part, Closable) and id(part) not in closed:
            closed.add(id(part))
            try:
                part.close()
            except Exception:
                if not quiet:
                    raise


@dataclass
class Wiring:
    """What the configured sources give the controller: the signals observe reads, and the
    workload scheduler act drains and requeues through."""

    signals: Signals
    scheduler: WorkloadScheduler | None = None


ROLE_TYPES: dict[SourceRole, type] = {
    SourceRole.QUEUE: QueueSource,
    SourceRole.NODES: NodeSource,
    SourceRole.TELEMETRY: TelemetrySource,
    SourceRole.SCHEDULER: WorkloadScheduler,
}


def build_signals(config: ControllerConfig, where: str = "config") -> Wiring:
    queues: list[QueueSource] = []
    telemetry: list[TelemetrySource] = []
    nodes: list[tuple[str, NodeSource]] = []
    schedulers: list[tuple[str, WorkloadScheduler]] = []
    for index, spec in enumerate(config.sources):
        field = f"sources[{index}]"
        name = spec.name or f"{spec.kind}-{index}"
        try:
            cls: Any = load_entry_point(SOURCE_GROUP, spec.kind, "source")
            source = cls.from_config(spec.settings, name)
        except InputError as exc:
            close_all([*queues, *telemetry])
            renames = (
                ("source.name", ("sources", index, "kind")),
                (f"sources.{name}", ("sources", index, "settings")),
            )
            raise config.located(exc, renames, default=("sources", index)) from None
        able = {role for role, kind in ROLE_TYPES.items() if isinstance(source, kind)}
        roles = set(spec.roles) if spec.roles is not None else able
        if roles - able:
            close_all([*queues, *telemetry, source])
            raise config.located(
                InputError(
                    where,
                    f"a {spec.kind} source cannot be "
                    + ", ".join(sorted(r.value for r in roles - able))
                    + f"; it can be {', '.join(sorted(r.value for r in able)) or 'nothing'}",
                    field=f"{field}.roles",
                )
            )
        if SourceRole.QUEUE in roles:
            queues.append(source)
        if SourceRole.TELEMETRY in roles:
            telemetry.append(source)
        if SourceRole.NODES in roles:
            nodes.append((field, source))
        if SourceRole.SCHEDULER in roles:
            schedulers.append((field, source))
    for role, chosen in (("node source", nodes), ("scheduler", schedulers)):
        if len(chosen) > 1:
            close_all([*queues, *telemetry])
            raise config.located(
                InputError(
                    where,
                    f"only one source may be the {role}; {chosen[0][0]} and {chosen[1][0]} both "
                    "are (narrow one with roles)",
                    field=f"{chosen[1][0]}.roles",
                )
            )
    tracker = IdleTracker(
        config.telemetry.idle_util_pct, config.telemetry.window_s, config.telemetry.max_age_s
    )
    signals = Signals(
        queues=tuple(queues),
        nodes=nodes[0][1] if nodes else None,
        telemetry=tuple(telemetry),
        tracker=tracker,
    )
    return Wiring(signals, schedulers[0][1] if schedulers else None)


def build_inbox(
    config: ControllerConfig, clock: Clock, where: str = "config"
) -> InboxServer | None:
    """The node agents' notice inbox, when configured; its token is read from the file or the
    environment now, so a missing token stops the start with one line instead of a silent inbox
    that refuses every agent."""
    try:
        return _build_inbox(config, clock, where)
    except InputError as exc:
        raise config.located(exc) from None


def _build_inbox(config: ControllerConfig, clock: Clock, where: str) -> InboxServer | None:
    settings = config.inbox
    if settings is None:
        return None
    if settings.token_file is not None:
        try:
            token = settings.token_file.read_text().strip()
        except OSError as exc:
            raise InputError(
                where, f"cannot read the token file: {exc.strerror}", field="inbox.token_file"
            ) from None
        field = "inbox.token_file"
    else:
        token = read_secret_env(settings.token_env, where, "inbox.token_env").strip()
        field = "inbox.token_env"
    if not token:
        source = (
            f"the file {settings.token_file}"
            if settings.token_file is not None
            else f"the environment variable {settings.token_env}"
        )
        raise InputError(where, f"the notice inbox needs a token; {source} is empty", field=field)
    register_secret(token)
    tls = None
    if settings.tls_cert is not None and settings.tls_key is not None:
        tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        try:
            tls.load_cert_chain(settings.tls_cert, settings.tls_key)
        except (OSError, ssl.SSLError) as exc:
            raise InputError(
                where, f"cannot load the TLS certificate and key: {exc}", field="inbox.tls_cert"
            ) from None
    try:
        return InboxServer(
            NoticeInbox(clock), token, settings.listen.host, settings.listen.port, tls
        )
    except OSError as exc:
        raise InputError(
            where,
            f"cannot listen on {settings.listen.host}:{settings.listen.port}: {exc.strerror}",
            field="inbox.listen",
        ) from None


def check_listen(config: ControllerConfig, field: str, host: str, port: int, where: str) -> None:
    """That ``host:port`` can be listened on now, so that a server the run loop starts later
    (the metrics endpoint) does not end the start in a traceback: a name that does not resolve,
    an address of another machine or a port in use is one line naming the setting."""
    try:
        for family, kind, proto, _, address in socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        ):
            with socket.socket(family, kind, proto) as probe:
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                probe.bind(address)
            return
    except OSError as exc:
        raise config.located(
            InputError(where, f"cannot listen on {host}:{port}: {exc.strerror or exc}", field)
        ) from None


def read_postgres_dsn(config: ControllerConfig, where: str = "config") -> str | None:
    """The journal's DSN from its environment variable, registered as a secret before anything
    can log it."""
    try:
        return _read_postgres_dsn(config, where)
    except InputError as exc:
        raise config.located(exc) from None


def _read_postgres_dsn(config: ControllerConfig, where: str) -> str | None:
    name = config.journal.postgres_dsn_env
    if not config.journal.enabled or name is None:
        return None
    dsn = read_secret_env(name, where, "journal.postgres_dsn_env").strip()
    if not dsn:
        raise InputError(
            where,
            f"the environment variable {name} holding the journal's PostgreSQL DSN is not set",
            field="journal.postgres_dsn_env",
        )
    register_secret(dsn)
    try:
        from psycopg.conninfo import conninfo_to_dict

        register_secret(str(conninfo_to_dict(dsn).get("password") or ""))
    except Exception:
        raise InputError(
            where,
            f"the environment variable {name} does not hold a valid PostgreSQL DSN",
            field="journal.postgres_dsn_env",
        ) from None
    return dsn


def build_journal(
    config: ControllerConfig, dsn: str | None, where: str = "config"
) -> Journal | None:
    if not config.journal.enabled:
        return None
    fenced_by = config.leader.name if leader_kind(config) is LeaderKind.POSTGRES else None
    try:
        return open_journal(config.journal.sqlite_path, dsn, fenced_by)
    except JournalError as exc:
        raise config.located(InputError(where, str(exc), field="journal")) from None


def leader_kind(config: ControllerConfig) -> LeaderKind:
    kind = config.leader.kind
    if kind is not LeaderKind.AUTO:
        return kind
    if os.environ.get("KUBERNETES_SERVICE_HOST"):
        return LeaderKind.KUBERNETES
    if config.journal.enabled and config.journal.postgres_dsn_env is not None:
        return LeaderKind.POSTGRES
    return LeaderKind.NONE


def build_lock(config: ControllerConfig, dsn: str | None) -> LeaderLock:
    kind = leader_kind(config)
    settings = config.leader
    if kind is LeaderKind.KUBERNETES:
        from autoscaler.ops.leader.kubernetes import KubernetesLeaseLock

        return KubernetesLeaseLock(
            settings.name, namespace=settings.namespace, lease_seconds=settings.lease_seconds
        )
    if kind is LeaderKind.POSTGRES and dsn is not None:
        from autoscaler.ops.leader.postgres import PostgresLeaderLock

        return PostgresLeaderLock(dsn, name=settings.name, lease_seconds=settings.lease_seconds)
    return SoleReplica()
