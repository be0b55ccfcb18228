"""A watch-fed cache of pods and nodes, as client-go's shared informers keep one: each kind is
listed once (with the list's resourceVersion), then watched from that version in a background
thread that applies ADDED, MODIFIED and DELETED to an in-memory store. A watch the server ends
(its timeout) is opened again from the last version seen; a 410 Gone (the version is older
than the server keeps) or a broken watch lists afresh, after a backoff that doubles up to
BACKOFF_MAX_S and starts over once a watch opens (a list that works beside a watch that never
opens is not a loop of lists).

A tick reads the store instead of listing (``snapshot``), but never a store it cannot trust:
a snapshot fails, in one line naming the call that failed, while the kind was never listed,
or while its watch has been failing (no list or watch opened since) for longer than
``cache_max_failing_s``. The time counts from the first failure, so a watch that breaks and
comes back within the bound is never seen by a tick, and one that stays broken makes the
reading unknown as a failing list would, a bound later.

Every call goes through ``KubeApi``; nothing here speaks to the client.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from autoscaler.model.errors import SourceError
from autoscaler.sources.kubernetes.api import ExpiredError, KubeApi, Listing, Watch

log = logging.getLogger(__name__)

Obj = dict[str, Any]
BACKOFF_START_S = 0.5
BACKOFF_MAX_S = 16.0


def _key(obj: Obj) -> tuple[str, str] | None:
    meta = obj.get("metadata")
    if not isinstance(meta, dict):
        return None
    name = meta.get("name")
    if not isinstance(name, str):
        return None
    namespace = meta.get("namespace")
    return (namespace if isinstance(namespace, str) else "", name)


class Informer:
    """One kind's store, kept by a list and then a watch in a daemon thread."""

    def __init__(
        self,
        what: str,
        lister: Callable[[], Listing],
        watcher: Callable[[str], Watch],
        max_failing_s: float,
        backoff_max_s: float = BACKOFF_MAX_S,
    ) -> None:
        self.what = what  # "pods", "nodes"
        self._lister = lister
        self._watcher = watcher
        self.max_failing_s = max_failing_s
        self.backoff_max_s = backoff_max_s
        self._store: dict[tuple[str, str], Obj] = {}
        self._version = ""
        self._synced = False
        self._failing_since: float | None = None
        self._error = ""
        self.lists = 0  # how many times the store was listed afresh
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._stopped = threading.Event()
        self._watch: Watch | None = None
        self._opened = False  # whether a watch opened since the last list
        self._thread: threading.Thread | None = None

    # -- what a reader sees ----------------------------------------------------------------------

    def start(self) -> None:
        with self._lock:
            if self._thread is not None:
                return
            self._thread = threading.Thread(
                target=self._run, name=f"kubernetes-{self.what}-informer", daemon=True
            )
        self._thread.start()

    def wait_synced(self, timeout_s: float) -> bool:
        """Wait until the first list has filled the store, it failed, or ``timeout_s`` passed
        (a failing server fails the first reading at once, as a failing list does)."""
        give_up = time.monotonic() + timeout_s
        with self._lock:
            while not (self._synced or self._error or self._stopped.is_set()):
                left = give_up - time.monotonic()
                if left <= 0:
                    break
                self._changed.wait(left)
            return self._synced

    def snapshot(self, where: str) -> Listing:
        """The store's objects now, or a ``SourceError`` when it cannot be read as the truth."""
        with self._lock:
            if not self._synced:
                said = f": {self._error}" if self._error else ""
                raise SourceError(f"{where}: the {self.what} cache is not synced yet{said}")
            if self._failing_since is not None:
                failing = time.monotonic() - self._failing_since
                if failing > self.max_failing_s:
                    raise SourceError(
                        f"{self._error} (the {self.what} watch has failed for {failing:.0f}s, "
                        f"past cache_max_failing_s {self.max_failing_s:g}s: the cache is stale)"
                    )
            kept = sorted(self._store.items())
            version = self._version
        # in a list's order (namespace, name), so a reading is the one a list gives
        return Listing([obj for _, obj in kept], version)

    def stop(self) -> None:
        self._stopped.set()
        with self._lock:
            watch = self._watch
            self._changed.notify_all()
        if watch is not None:
            watch.close()

    # -- the thread ------------------------------------------------------------------------------

    def _run(self) -> None:
        backoff = BACKOFF_START_S
        while not self._stopped.is_set():
            self._opened = False
            try:
                self._relist()
                self._follow()
                if self._opened:
                    backoff = BACKOFF_START_S
                    continue  # a 410 on a watch that worked: list afresh at once
            except SourceError as exc:
                if not self._stopped.is_set():  # not the stream ``stop`` closed
                    self._failed(str(exc))
            except Exception as exc:  # the thread must outlive any one failure
                self._failed(f"{self.what} cache: {type(exc).__name__}: {exc}"[:300])
            if self._opened:  # the watch worked before it failed: a fresh start
                backoff = BACKOFF_START_S
            # a list that works beside a watch that never opens (a missing watch grant) lists
            # again at the backoff's pace, not in a loop
            if self._stopped.wait(backoff):
                return
            backoff = min(backoff * 2, self.backoff_max_s)

    def _relist(self) -> None:
        listing = self._lister()
        store: dict[tuple[str, str], Obj] = {}
        for obj in listing.items:
            key = _key(obj) if isinstance(obj, dict) else None
            if key is not None:
                store[key] = obj
        with self._lock:
            self._store = store
            self._version = listing.resource_version
            self._synced = True
            self.lists += 1
            self._healthy()

    def _follow(self) -> None:
        """Watch from the store's version until a 410 (returns) or a failure (raises); a watch
        the server ends is opened again from the last version seen."""
        while not self._stopped.is_set():
            with self._lock:
                version = self._version
            try:
                watch = self._watcher(version)
            except ExpiredError as exc:
                log.info("%s; listing again", exc)
                return
            with self._lock:
                self._watch = watch
                self._opened = True
                self._healthy()
            try:
                for kind, obj in watch:
                    self._apply(kind, obj)
            except ExpiredError as exc:
                log.info("%s; listing again", exc)
                return
            finally:
                with self._lock:
                    self._watch = None

    def _apply(self, kind: str, obj: Obj) -> None:
        meta = obj.get("metadata")
        version = meta.get("resourceVersion") if isinstance(meta, dict) else None
        key = _key(obj)
        with self._lock:
            if kind in ("ADDED", "MODIFIED") and key is not None:
                self._store[key] = obj
            elif kind == "DELETED" and key is not None:
                self._store.pop(key, None)
            if isinstance(version, str) and version:
                self._version = version

    def _healthy(self) -> None:
        if self._failing_since is not None:
            log.info("the %s watch works again", self.what)
        self._failing_since = None
        self._error = ""
        self._changed.notify_all()

    def _failed(self, error: str) -> None:
        with self._lock:
            if self._failing_since is None:
                self._failing_since = time.monotonic()
                log.warning("%s; the %s cache lists again after a backoff", error, self.what)
            self._error = error
            self._changed.notify_all()


class WatchCache:
    """The pods (unfinished, every namespace) and nodes of one cluster, each an informer."""

    def __init__(self, api: KubeApi, max_failing_s: float) -> None:
        self.pods = Informer("pods", api.list_pods, api.watch_pods, max_failing_s)
        self.nodes = Informer("nodes", api.list_nodes, api.watch_nodes, max_failing_s)

    def start(self, timeout_s: float) -> None:
        """Start both informers and wait (up to ``timeout_s``, together) for their first list."""
        self.pods.start()
        self.nodes.start()
        give_up = time.monotonic() + timeout_s
        self.pods.wait_synced(timeout_s)
        self.nodes.wait_synced(max(0.0, give_up - time.monotonic()))

    def stop(self) -> None:
        self.pods.stop()
        self.nodes.stop()
