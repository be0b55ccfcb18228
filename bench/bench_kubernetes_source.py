"""What one tick's reading costs the ``kubernetes`` source: ``--pods`` pods (a quarter pending and
unschedulable, the rest bound) and ``--nodes`` GPU nodes, listed through the official client
from the API emulator on loopback and folded into demand and node usage, as ``read`` and
``read_nodes`` do every tick (one pod list serves both). Prints the best and median of
``--repeat`` ticks, split into the list calls (the server's JSON, the wire, decoding) and the
folding; then the same with ``watch_cache: true``: the cache's first sync (once), and a tick's
``read`` and ``read_nodes`` from the synced cache. Issue 18's target is 1 s for 20,000 pods and
2,000 nodes. Figures only.

    .venv/bin/python bench/bench_kubernetes_source.py [--pods 20000] [--nodes 2000] [--repeat 5]
        [--json OUT.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from k8s_api_emulator import K8sApi, _handler
from k8s_cluster import node, pod, spot_toleration, tried

from autoscaler.sources.kubernetes import KubernetesSource
from autoscaler.sources.kubernetes.demand import pending_demand
from autoscaler.sources.kubernetes.nodes import Allocation, Nodes, node_reading

TOKEN_ENV = "BENCH_K8S_TOKEN"


def _populate(api: K8sApi, pods: int, nodes: int) -> None:
    for index in range(nodes):
        api.put(
            "nodes",
            node(f"gpu-{index}", 8, labels={"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}),
        )
    for index in range(pods):
        made = pod(
            f"job-{index}",
            f"team-{index % 40}",
            gpus=1 + (index // 4) % 4,
            labels={"app": f"app-{index % 200}", "team": f"team-{index % 40}"},
            annotations={"gpu-autoscaler.io/checkpoint_interval": "600"} if index % 3 else None,
            tolerations=[spot_toleration()] if (index // 4) % 2 else (),
            created=1_700_000_000 + index,
        )
        if index % 4 == 0:
            tried(made)
        else:
            made["spec"]["nodeName"] = f"gpu-{index % nodes}"
            made["status"].update(phase="Running", startTime="2024-01-01T00:00:00Z")
        api.put("pods", made)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=20_000)
    parser.add_argument("--nodes", type=int, default=2_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)

    api = K8sApi()
    _populate(api, args.pods, args.nodes)
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(api))
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    api.url = f"http://127.0.0.1:{server.server_address[1]}"
    os.environ[TOKEN_ENV] = api.token
    source = KubernetesSource.from_config(
        {"api_url": api.url, "token_env": TOKEN_ENV, "request_timeout_s": 600}, "bench"
    )
    lists: list[float] = []
    folds: list[float] = []
    sizes: dict[str, Any] = {}
    for tick in range(args.repeat):
        started = time.perf_counter()
        pods = source.api.list_pods().items
        nodes = source.api.list_nodes().items
        listed = time.perf_counter()
        reading = pending_demand(pods, source.rules)
        usage, _ = node_reading(
            Nodes.read(nodes, source.rules), Allocation.of(pods, source.rules), {}, float(tick)
        )
        folds.append(time.perf_counter() - listed)
        lists.append(listed - started)
        sizes = {
            "pending_pods": reading.pending,
            "groups": len(reading.groups),
            "onprem_nodes": len(usage.onprem),
        }
    source.close()

    # the watch cache: its first lists (the first reading waits for them), then ticks that read
    # the synced store (read and read_nodes, as the controller calls them) instead of listing
    cached = KubernetesSource.from_config(
        {"api_url": api.url, "token_env": TOKEN_ENV, "request_timeout_s": 600, "watch_cache": True},
        "bench-cached",
    )
    started = time.perf_counter()
    cached.read(0.0)
    sync_s = time.perf_counter() - started
    reads: list[float] = []
    for tick in range(1, args.repeat + 1):
        started = time.perf_counter()
        cached.read(float(tick))
        cached.read_nodes(float(tick))
        reads.append(time.perf_counter() - started)
    cached.close()
    server.shutdown()
    result = {
        "pods": args.pods,
        "nodes": args.nodes,
        "list_best_s": min(lists),
        "list_median_s": statistics.median(lists),
        "fold_best_s": min(folds),
        "fold_median_s": statistics.median(folds),
        "tick_best_s": min(a + b for a, b in zip(lists, folds, strict=True)),
        "cache_sync_s": sync_s,
        "cache_tick_best_s": min(reads),
        "cache_tick_median_s": statistics.median(reads),
        **sizes,
    }
    print(
        f"{args.pods:,} pods, {args.nodes:,} nodes ({sizes['pending_pods']:,} pending in "
        f"{sizes['groups']} groups, {sizes['onprem_nodes']:,} on-prem nodes), best/median of "
        f"{args.repeat}:\n"
        f"  list pods + nodes (server, wire, decode): {min(lists):.3f} / "
        f"{statistics.median(lists):.3f} s\n"
        f"  fold into demand and node usage:          {min(folds):.3f} / "
        f"{statistics.median(folds):.3f} s\n"
        f"  one tick's reading:                       {result['tick_best_s']:.3f} s (best)\n"
        f"watch cache (watch_cache: true):\n"
        f"  first sync (list pods + nodes, stored):   {sync_s:.3f} s (once)\n"
        f"  one tick's reading from the synced cache: {min(reads):.3f} / "
        f"{statistics.median(reads):.3f} s"
    )
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
