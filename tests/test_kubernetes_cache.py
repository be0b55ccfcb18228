"""The ``kubernetes`` source's watch cache (``watch_cache: true``), through the official client
against the API emulator: it converges to the server's pods and nodes whatever happens to them,
lists again after a 410, and a reading fails (demand unknown, one line naming the call) while
the cache is not synced or its watch has been failing past ``cache_max_failing_s``; a synced
cache gives the same demand and node usage as a list."""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from k8s_api_emulator import K8sApi
from k8s_cluster import bind, finish, node, pod, spot_toleration, tried, wait_for
from k8s_source_support import clear, make_source
from waits import bound

from autoscaler.model.errors import SourceError
from autoscaler.sources.kubernetes import KubernetesSource
from autoscaler.sources.kubernetes.cache import Informer

CHECKPOINTS = {"gpu-autoscaler.io/checkpoint_interval": "600"}
# each reading's tick time: a reading at the same time as the last reuses its pod list
TICKS = itertools.count(1_000)


@pytest.fixture
def cached(k8s_api: K8sApi, monkeypatch: pytest.MonkeyPatch) -> Iterator[KubernetesSource]:
    made = make_source(k8s_api, monkeypatch, watch_cache=True)
    yield made
    made.close()


def _versions(items: list[dict[str, Any]]) -> dict[tuple[str, str], str]:
    return {
        (o["metadata"].get("namespace", ""), o["metadata"]["name"]): o["metadata"][
            "resourceVersion"
        ]
        for o in items
    }


def _server_pods(k8s_api: K8sApi) -> dict[tuple[str, str], str]:
    """The server's unfinished pods, as the cache's field selector sees them."""
    return _versions(
        [
            p
            for p in k8s_api.items("pods")
            if p["status"].get("phase") not in ("Succeeded", "Failed")
        ]
    )


def _informers(source: KubernetesSource) -> tuple[Informer, Informer]:
    source.read(0.0)  # starts the cache
    cache = source._cache
    assert cache is not None
    return cache.pods, cache.nodes


def _converged(k8s_api: K8sApi, pods: Informer, nodes: Informer) -> bool:
    try:
        return _versions(pods.snapshot("t").items) == _server_pods(k8s_api) and _versions(
            nodes.snapshot("t").items
        ) == _versions(k8s_api.items("nodes"))
    except SourceError:
        return False


def _expire_open_watches(k8s_api: K8sApi, changes: int = 8) -> None:
    """Make more changes than the server keeps while no watch can read them (its lock held):
    every open watch is then behind the kept history and answered 410 Expired."""
    k8s_api.history = 3
    with k8s_api._lock:
        for index in range(changes):
            k8s_api.put("nodes", node(f"churn-{index}", 0))
        for index in range(changes):
            k8s_api.remove("nodes", f"churn-{index}")


# -- converging ----------------------------------------------------------------------------------

NAMES = [f"p{i}" for i in range(6)]
operations = st.lists(
    st.one_of(
        st.tuples(st.just("create"), st.sampled_from(NAMES), st.integers(1, 8)),
        st.tuples(st.just("bind"), st.sampled_from(NAMES), st.sampled_from(["n0", "n1"])),
        st.tuples(st.just("finish"), st.sampled_from(NAMES), st.just(0)),
        st.tuples(st.just("delete"), st.sampled_from(NAMES), st.just(0)),
        st.tuples(st.just("node"), st.sampled_from(["n0", "n1", "n2"]), st.integers(0, 8)),
        st.tuples(st.just("unnode"), st.sampled_from(["n0", "n1", "n2"]), st.just(0)),
        st.tuples(st.just("expire"), st.just(""), st.just(0)),
    ),
    max_size=25,
)


def _play(k8s_api: K8sApi, op: tuple[str, str, Any]) -> None:
    what, name, value = op
    present = k8s_api.get("pods", name, "default")
    if what == "create":
        k8s_api.put("pods", tried(pod(name, gpus=value, annotations=CHECKPOINTS)))
    elif what == "bind" and present is not None and not present["spec"].get("nodeName"):
        bind(k8s_api, name, "default", value)
    elif what == "finish" and present is not None and present["spec"].get("nodeName"):
        finish(k8s_api, name)
    elif what == "delete" and present is not None:
        k8s_api.remove("pods", name, "default")
    elif what == "node":
        k8s_api.put("nodes", node(name, value))
    elif what == "unnode":
        k8s_api.remove("nodes", name)
    elif what == "expire":
        _expire_open_watches(k8s_api)


@settings(
    max_examples=12,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(before=operations, after=operations)
def test_the_cache_converges_to_the_server_whatever_happens(
    k8s_api: K8sApi,
    monkeypatch: pytest.MonkeyPatch,
    before: list[tuple[str, str, Any]],
    after: list[tuple[str, str, Any]],
) -> None:
    clear(k8s_api, "pods", "nodes")
    k8s_api.history = 10_000
    for op in before:
        _play(k8s_api, op)
    source = make_source(k8s_api, monkeypatch, watch_cache=True)
    try:
        pods, nodes = _informers(source)
        assert _converged(k8s_api, pods, nodes)  # the first reading waited for the first list
        for op in after:
            _play(k8s_api, op)
        assert wait_for(lambda: _converged(k8s_api, pods, nodes), bound(30)), (
            _versions(pods.snapshot("t").items),
            _server_pods(k8s_api),
        )
    finally:
        source.close()


def test_a_410_lists_again_and_the_cache_keeps_up(
    k8s_api: K8sApi, cached: KubernetesSource
) -> None:
    k8s_api.put("pods", tried(pod("a", gpus=1)))
    pods, nodes = _informers(cached)
    assert pods.lists == 1 and nodes.lists == 1
    _expire_open_watches(k8s_api)
    k8s_api.put("pods", tried(pod("b", gpus=2)))
    assert wait_for(lambda: nodes.lists >= 2 and pods.lists >= 2, bound(30))
    assert wait_for(lambda: _converged(k8s_api, pods, nodes), bound(30))
    assert sorted(g.gpus_per_job for g in cached.read(1.0)) == [1, 2]


def test_a_tick_reads_the_cache_not_the_server(k8s_api: K8sApi, cached: KubernetesSource) -> None:
    k8s_api.put("pods", tried(pod("a", gpus=1)))
    k8s_api.put("nodes", node("gpu-1", 8))
    cached.read(0.0)
    cached.read_nodes(0.0)
    lists = len([r for r in k8s_api.served("GET") if "watch" not in r.path])
    k8s_api.put("pods", tried(pod("b", gpus=4)))
    assert wait_for(lambda: len(cached.read(next(TICKS))) == 2, bound(30))
    for tick in range(2, 5):
        cached.read(float(tick))
        cached.read_nodes(float(tick))
    assert len([r for r in k8s_api.served("GET") if "watch" not in r.path]) == lists


# -- failing -------------------------------------------------------------------------------------


def test_a_cache_never_synced_fails_the_reading_naming_the_call(
    k8s_api: K8sApi, cached: KubernetesSource
) -> None:
    k8s_api.put("pods", tried(pod("a", gpus=1)))
    k8s_api.fail(503, path="/pods")
    with pytest.raises(SourceError) as caught:
        cached.read(1.0)
    assert "list pods: HTTP 503" in str(caught.value)
    with pytest.raises(SourceError, match=r"the pods cache is not synced yet: .*list pods"):
        cached.read(2.0)
    k8s_api.heal()

    def reads() -> bool:
        try:
            return [g.jobs for g in cached.read(next(TICKS))] == [1]
        except SourceError:
            return False

    assert wait_for(reads, bound(60), interval_s=0.2)


def test_a_watch_failing_past_the_bound_fails_the_reading_and_heals(
    k8s_api: K8sApi, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    source = make_source(k8s_api, monkeypatch, watch_cache=True, cache_max_failing_s=0.5)
    try:
        k8s_api.put("pods", tried(pod("a", gpus=1)))
        pods, _ = _informers(source)
        k8s_api.fail(503, path="/pods")
        with caplog.at_level(logging.WARNING):
            _expire_open_watches(k8s_api)  # the pods watch lists again, and the list fails

            def fails() -> bool:
                try:
                    source.read(next(TICKS))
                except SourceError as exc:
                    return "stale" in str(exc)
                return False

            assert wait_for(fails, bound(60), interval_s=0.1)
        with pytest.raises(SourceError) as caught:
            source.read(next(TICKS))
        said = str(caught.value)
        assert "list pods: HTTP 503" in said and "cache_max_failing_s 0.5s" in said
        assert "\n" not in said
        assert any("the pods cache lists again" in r.getMessage() for r in caplog.records)
        k8s_api.heal()
        k8s_api.put("pods", tried(pod("b", gpus=1)))

        def reads() -> bool:
            try:
                return [g.jobs for g in source.read(next(TICKS))] == [2]
            except SourceError:
                return False

        assert wait_for(reads, bound(60), interval_s=0.2)
        assert pods.lists >= 2
    finally:
        source.close()


def test_a_watch_that_never_opens_lists_again_at_the_backoffs_pace(
    k8s_api: K8sApi, cached: KubernetesSource
) -> None:
    """A missing ``watch`` grant: the lists work, every watch is refused. The cache stays as
    fresh as its lists, which come at the backoff's pace (0.5, 1, 2, ... s apart), not in a
    loop; a slow machine only makes them fewer, so the ceiling below cannot fail spuriously."""
    k8s_api.fail(403, path=r"watch=")
    started = time.monotonic()
    cached.read(next(TICKS))
    k8s_api.put("pods", tried(pod("late", gpus=1)))
    assert wait_for(
        lambda: [g.jobs for g in cached.read(next(TICKS))] == [1], bound(60), interval_s=0.2
    )
    elapsed = time.monotonic() - started
    lists = [r for r in k8s_api.served("GET") if "/pods" in r.path and "watch=" not in r.path]
    allowed, slept = 1, 0.0
    while slept <= elapsed:
        slept += min(0.5 * 2 ** (allowed - 1), 16.0)
        allowed += 1
    assert 2 <= len(lists) <= allowed, (len(lists), elapsed)


# -- the same reading ----------------------------------------------------------------------------


def test_the_cache_reads_the_same_demand_and_nodes_as_a_list(
    k8s_api: K8sApi, monkeypatch: pytest.MonkeyPatch, cached: KubernetesSource
) -> None:
    listing = make_source(k8s_api, monkeypatch, name="listing")
    try:
        cached.read(0.0)  # synced on an empty cluster: everything below arrives by the watch
        for index in range(4):
            k8s_api.put("nodes", node(f"gpu-{index}", 8))
        for index in range(40):
            made = pod(
                f"job-{index}",
                f"team-{index % 3}",
                gpus=1 + index % 4,
                annotations=CHECKPOINTS if index % 2 else None,
                tolerations=[spot_toleration()] if index % 3 else (),
                created=1_000 + index,
            )
            k8s_api.put("pods", tried(made))
            if index % 4 == 0:
                bind(k8s_api, f"job-{index}", f"team-{index % 3}", f"gpu-{index % 4}")
        finish(k8s_api, "job-0", "team-0")
        k8s_api.remove("pods", "job-1", "team-1")
        pods, nodes = _informers(cached)
        assert wait_for(lambda: _converged(k8s_api, pods, nodes), bound(30))
        assert cached.read(5.0) == listing.read(5.0)
        assert cached.read_nodes(5.0) == listing.read_nodes(5.0)
        assert cached.running_jobs_by_node() == listing.running_jobs_by_node()
    finally:
        listing.close()
