"""How long the node agent takes to answer one scrape of an 8-GPU node.

Drives the real reader, collector and HTTP server against ``tests/fake_pynvml.py`` (8 H100s), so
the figures are the agent's own cost per scrape (reading, building the series, rendering the
text, serving it), not NVML's: on a GPU node each NVML call adds its driver time (tens of
microseconds; ``nvmlDeviceGetComputeRunningProcesses`` more) on top. Prints median, p95 and max
for three layers. Figures only; nothing is asserted.

    .venv/bin/python bench/bench_agent_scrape.py [--gpus 8] [--rounds 500] [--json OUT.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from fake_pynvml import fake_nvml
from prometheus_client import CollectorRegistry, generate_latest

from node_agent.exporter import GpuCollector, GpuMetricsServer
from node_agent.gpus import MIB, GpuReader


def timed(rounds: int, step: Callable[[], object]) -> dict[str, float]:
    for _ in range(min(20, rounds)):
        step()
    samples = []
    for _ in range(rounds):
        started = time.perf_counter()
        step()
        samples.append((time.perf_counter() - started) * 1000)
    samples.sort()
    return {
        "median_ms": statistics.median(samples),
        "p95_ms": samples[int(0.95 * (len(samples) - 1))],
        "max_ms": samples[-1],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=500)
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = parser.parse_args()

    nvml = fake_nvml(args.gpus)
    for gpu in nvml.gpus:
        gpu.util_gpu, gpu.memory_used, gpu.power_mw, gpu.processes = 93, 70_000 * MIB, 600_000, 2

    reader = GpuReader(nvml)
    reader.start()
    registry = CollectorRegistry()
    registry.register(GpuCollector(reader, "bench-node"))
    figures = {
        "read (NVML calls into readings)": timed(args.rounds, reader.read),
        "collect + render text": timed(args.rounds, lambda: generate_latest(registry)),
    }
    body_bytes = len(generate_latest(registry))
    reader.close()

    with GpuMetricsServer("bench-node", host="127.0.0.1", port=0, nvml=fake_nvml(args.gpus)) as s:
        url = f"http://127.0.0.1:{s.port}/metrics"

        def get() -> bytes:
            with urllib.request.urlopen(url, timeout=5) as answer:
                body: bytes = answer.read()
                return body

        figures["HTTP GET /metrics (loopback)"] = timed(args.rounds, get)

    print(f"agent scrape, {args.gpus} GPUs, {args.rounds} rounds, body {body_bytes} bytes")
    print(f"{'layer':34} {'median':>9} {'p95':>9} {'max':>9}")
    for layer, figure in figures.items():
        print(
            f"{layer:34} {figure['median_ms']:8.3f}ms {figure['p95_ms']:8.3f}ms "
            f"{figure['max_ms']:8.3f}ms"
        )
    if args.json is not None:
        args.json.write_text(json.dumps({"gpus": args.gpus, "figures": figures}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
