"""The node agent's life: find the cloud, name the node, serve its GPU metrics, watch for
interruption notices and hand each one to the local hooks and the controller at the same time,
until SIGTERM or SIGINT.

The cloud's watcher is found through the ``gpu_autoscaler.metadata_watchers`` entry points
(``node_agent.watchers``); nothing here names a cloud. On a cloud node the GPU series are
labelled with the instance id (AWS) or name (GCP, Azure), which is what the providers and the
scheduler call the node; elsewhere with the hostname.
"""

from __future__ import annotations

import argparse
import logging
import signal
import socket
import threading
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType

from prometheus_client import CollectorRegistry
from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from autoscaler.model.errors import InputError, SourceError, describe
from autoscaler.model.logs import configure
from node_agent.cli import URL_SHORTHANDS
from node_agent.forward import Delivery, Forwarder, load_token
from node_agent.hooks import LocalHooks, parse_signal
from node_agent.metadata import AgentNotice, NoticeMetrics, Watcher
from node_agent.metadata_azure import AzureAck
from node_agent.watchers import (
    CLOUD_WORDS,
    WatcherClass,
    WatcherContext,
    check_name,
    every_watcher,
    metadata_urls,
    watcher_class,
)

log = logging.getLogger(__name__)
PROBE_TIMEOUT_S = 1.0
STOP_JOIN_S = 3.0


@dataclass(frozen=True)
class AgentOptions:
    """The agent's command line, checked. ``metadata_urls`` holds only the URLs given; a watcher
    not named there reads its own ``default_metadata_url``."""

    listen_host: str = "0.0.0.0"
    listen_port: int = 9400
    hostname: str | None = None
    cloud: str = "auto"
    metadata_urls: Mapping[str, str] = field(default_factory=dict)
    controller_url: str | None = None
    token: str | None = field(default=None, repr=False)
    ca_file: Path | None = None
    hooks: LocalHooks = field(default_factory=LocalHooks)
    azure_ack: AzureAck = AzureAck.AFTER_HOOKS
    aws_poll_s: float = 5.0
    azure_poll_s: float = 1.0
    log_level: str = "INFO"
    log_format: str = "text"


def parse_listen(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise InputError("--listen", f"{text!r} is not HOST:PORT (e.g. 0.0.0.0:9400)")
    return host.strip("[]") or "0.0.0.0", int(port)


def parse_metadata_urls(args: argparse.Namespace) -> dict[str, str]:
    """``--metadata-url NAME=URL`` (any watcher) and the built-in clouds' shorthands
    ``--aws-metadata-url`` etc.; naming one watcher twice is a mistake, not a precedence rule."""
    given: dict[str, str] = {}
    for item in args.metadata_url or ():
        name, sep, url = item.partition("=")
        if not sep or not name or not url.startswith(("http://", "https://")):
            raise InputError("--metadata-url", f"{item!r} is not NAME=http(s)://HOST[:PORT]")
        if name in given:
            raise InputError("--metadata-url", f"{name} is given twice")
        check_name(name, "--metadata-url")
        given[name] = url
    for name in URL_SHORTHANDS:
        url = getattr(args, f"{name}_metadata_url")
        if url is None:
            continue
        if name in given:
            raise InputError(f"--{name}-metadata-url", f"{name} is also given by --metadata-url")
        given[name] = url
    return given


def options_from_arguments(args: argparse.Namespace) -> AgentOptions:
    """Every argument checked here, so a mistake ends in one line before anything starts (the
    watcher ``--cloud`` names is loaded here too)."""
    host, port = parse_listen(args.listen)
    if args.cloud not in CLOUD_WORDS:
        watcher_class(args.cloud)
    urls = parse_metadata_urls(args)
    for name in ("aws_poll_seconds", "azure_poll_seconds", "hook_timeout"):
        if not getattr(args, name) > 0:
            raise InputError("--" + name.replace("_", "-"), "must be a positive number of seconds")
    token: str | None = None
    if args.controller_url is not None:
        if not args.controller_url.startswith(("http://", "https://")):
            raise InputError("--controller-url", f"{args.controller_url!r} is not an http(s) URL")
        if args.ca_file is not None and not args.ca_file.is_file():
            raise InputError("--ca-file", f"{args.ca_file} is not a readable file")
        token = load_token(args.token_file, args.token_env)
    hooks = LocalHooks(
        command=args.hook_command,
        workload_signal=parse_signal(args.signal) if args.signal is not None else None,
        pid_file=args.signal_pid_file,
        process_group=args.signal_process_group,
        timeout_s=args.hook_timeout,
    )
    return AgentOptions(
        listen_host=host,
        listen_port=port,
        hostname=args.hostname,
        cloud=args.cloud,
        metadata_urls=urls,
        controller_url=args.controller_url,
        token=token,
        ca_file=args.ca_file,
        hooks=hooks,
        azure_ack=AzureAck(args.azure_ack),
        aws_poll_s=args.aws_poll_seconds,
        azure_poll_s=args.azure_poll_seconds,
        log_level=args.log_level,
        log_format=args.log_format,
    )


def detect_cloud(
    urls: Mapping[str, str],
    timeout_s: float = PROBE_TIMEOUT_S,
    watchers: Mapping[str, WatcherClass] | None = None,
) -> str:
    """The installed watcher (of those with a URL in ``urls``) whose metadata server answers;
    probed together so a non-cloud node waits one timeout, not one per cloud. AWS and Azure
    share an address but not their paths or headers; should two answer, the first by name
    wins and a line says so."""
    classes = every_watcher() if watchers is None else watchers
    probed = {name: cls for name, cls in sorted(classes.items()) if name in urls}
    if not probed:
        return "none"
    with ThreadPoolExecutor(max_workers=len(probed)) as pool:
        answers = {
            name: pool.submit(_probe, name, cls, urls[name], timeout_s)
            for name, cls in probed.items()
        }
        found = [name for name, answer in answers.items() if answer.result()]
    if len(found) > 1:
        log.warning("metadata servers of %s all answer; watching %s", ", ".join(found), found[0])
    return found[0] if found else "none"


def _probe(name: str, cls: WatcherClass, url: str, timeout_s: float) -> bool:
    """A probe that raises (a plugin's bug) counts as no answer, with one line."""
    try:
        return bool(cls.probe(url, timeout_s))
    except Exception as exc:
        log.warning("the %s metadata watcher's probe failed: %s", name, describe(exc))
        return False


class NoticeDispatch:
    """What happens to a notice: the local hooks and the controller hear it at the same time
    (the hook on its own thread), and the watcher learns whether the controller took it."""

    def __init__(self, forwarder: Forwarder | None, hooks: LocalHooks) -> None:
        self.forwarder = forwarder
        self.hooks = hooks

    def __call__(self, notice: AgentNotice) -> bool:
        log.warning(
            "interruption notice from %s: %s %s, deadline %s",
            notice.source,
            notice.kind.value,
            notice.instance_id,
            "none" if notice.deadline is None else f"{notice.deadline:.0f}",
        )
        hook = threading.Thread(target=self.hooks.run, args=(notice,), name="notice-hook")
        hook.start()
        delivered = True
        if self.forwarder is not None:
            delivered = self.forwarder.send(notice) is Delivery.DELIVERED
        hook.join()
        return delivered


def build_watcher(
    cloud: str,
    cls: WatcherClass,
    options: AgentOptions,
    dispatch: NoticeDispatch,
    metrics: NoticeMetrics,
) -> Watcher:
    url = options.metadata_urls.get(cloud, cls.default_metadata_url)
    return cls.from_context(WatcherContext(cloud, url, dispatch, metrics, options))


def choose_watcher(
    options: AgentOptions, dispatch: NoticeDispatch, metrics: NoticeMetrics
) -> tuple[str, Watcher | None]:
    """The cloud to watch and its watcher: the one ``--cloud`` names, or with ``auto`` the
    installed one whose metadata server answers; ``none`` when there is none."""
    cloud = options.cloud
    if cloud == "none":
        return cloud, None
    if cloud == "auto":
        classes = every_watcher()
        cloud = detect_cloud(metadata_urls(classes, options.metadata_urls), watchers=classes)
        log.info("cloud detected from the metadata servers: %s", cloud)
        if cloud == "none":
            return cloud, None
        cls = classes[cloud]
    else:
        cls = watcher_class(cloud)
    return cloud, build_watcher(cloud, cls, options, dispatch, metrics)


class _RegistryBridge(Collector):
    """Serves the notice metrics from the GPU exporter's registry, so the agent has one
    ``/metrics`` endpoint."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry

    def collect(self) -> Iterable[Metric]:
        return self.registry.collect()


def node_name(options: AgentOptions, watcher: Watcher | None) -> str:
    if options.hostname:
        return options.hostname
    if watcher is not None:
        try:
            return watcher.instance_name()
        except SourceError as exc:
            log.warning("%s; labelling GPUs with this machine's hostname", exc)
    return socket.gethostname()


def _stop_on_signals() -> threading.Event:
    """SIGTERM and SIGINT set the returned event (from the main thread only, where Python
    delivers signals)."""
    stop = threading.Event()
    if threading.current_thread() is threading.main_thread():

        def request_stop(signum: int, frame: FrameType | None) -> None:
            log.info("received %s, stopping", signal.Signals(signum).name)
            stop.set()

        signal.signal(signal.SIGTERM, request_stop)
        signal.signal(signal.SIGINT, request_stop)
    return stop


def run_agent(options: AgentOptions) -> int:
    # the controller's handler: its JSON shape or its plain lines, and its scrubbing (the token
    # was registered as it was read, secret-named variables are registered here)
    configure(options.log_level, json_lines=options.log_format == "json")
    from node_agent.exporter import ExporterError, GpuMetricsServer

    metrics = NoticeMetrics()
    forwarder = None
    if options.controller_url is not None and options.token is not None:
        forwarder = Forwarder(options.controller_url, options.token, metrics, options.ca_file)
    dispatch = NoticeDispatch(forwarder, options.hooks)
    cloud, watcher = choose_watcher(options, dispatch, metrics)
    hostname = node_name(options, watcher)
    try:
        server = GpuMetricsServer(hostname, options.listen_host, options.listen_port)
    except ExporterError as exc:
        # 9400 is dcgm-exporter's port too: a node that runs one already has it taken
        raise InputError(
            "--listen", f"{exc}; stop what listens there (a dcgm-exporter?) or choose another"
        ) from None
    server.registry.register(_RegistryBridge(metrics.registry))
    stop = _stop_on_signals()
    server.start()
    log.info(
        "agent for %s serving http://%s:%d/metrics", hostname, options.listen_host, server.port
    )
    watching: threading.Thread | None = None
    if watcher is None:
        log.info("no cloud metadata to watch: interruption notices are off on this node")
    else:
        if forwarder is None:
            log.warning("no --controller-url: notices only run the local hooks")
        watching = threading.Thread(
            target=watcher.run, args=(stop,), name=f"{cloud}-notices", daemon=True
        )
        watching.start()
        log.info("watching %s metadata for interruption notices", cloud)
    try:
        while not stop.wait(0.5):
            pass
    finally:
        stop.set()
        server.stop()
        if watching is not None:
            watching.join(STOP_JOIN_S)
    log.info("agent stopped")
    return 0
