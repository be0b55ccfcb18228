"""Scraping and folding the GPU telemetry of 2,000 nodes in one tick.

A separate process serves 2,000 exporters on loopback, each answering at its own path with what
dcgm-exporter prints for an 8-GPU node (16 series per GPU with HELP and TYPE lines, about 30 KiB),
so every scrape crosses a real socket and a real HTTP exchange. The controller's side is the real
``ScrapeTelemetrySource`` (bounded thread pool, urllib, the exposition parser) followed by the
idle tracker's fold, as observe runs them each tick.

Prints the median, p95 and max per tick of scrape + fold, and the fold alone. Figures only.

    .venv/bin/python bench/bench_scrape.py [--nodes 2000] [--gpus 8] [--ticks 10]
        [--concurrency 64] [--json OUT.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import random
import statistics
import sys
import time
from multiprocessing.connection import Connection
from pathlib import Path

from autoscaler.fleet.telemetry import IdleTracker
from autoscaler.model.clock import SystemClock
from autoscaler.sources.scrape import ScrapeSettings, ScrapeTelemetrySource

TARGET_S = 2.0
FIELDS = (
    ("DCGM_FI_DEV_SM_CLOCK", "SM clock frequency (in MHz).", "gauge"),
    ("DCGM_FI_DEV_MEM_CLOCK", "Memory clock frequency (in MHz).", "gauge"),
    ("DCGM_FI_DEV_MEMORY_TEMP", "Memory temperature (in C).", "gauge"),
    ("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C).", "gauge"),
    ("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W).", "gauge"),
    (
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
        "Total energy consumption since boot (in mJ).",
        "counter",
    ),
    ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "Total number of PCIe retries.", "counter"),
    ("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).", "gauge"),
    ("DCGM_FI_DEV_MEM_COPY_UTIL", "Memory utilization (in %).", "gauge"),
    ("DCGM_FI_DEV_ENC_UTIL", "Encoder utilization (in %).", "gauge"),
    ("DCGM_FI_DEV_DEC_UTIL", "Decoder utilization (in %).", "gauge"),
    ("DCGM_FI_DEV_XID_ERRORS", "Value of the last XID error encountered.", "gauge"),
    ("DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB).", "gauge"),
    ("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).", "gauge"),
    ("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", "Total NVLink bandwidth counters.", "counter"),
    ("DCGM_FI_DEV_VGPU_LICENSE_STATUS", "vGPU License status", "gauge"),
)


def node_text(node: int, gpus: int, rng: random.Random) -> bytes:
    host = f"gpu-node-{node:05d}"
    lines: list[str] = []
    for name, help_text, kind in FIELDS:
        lines.append(f"# HELP {name} {help_text}")
        lines.append(f"# TYPE {name} {kind}")
        for gpu in range(gpus):
            labels = (
                f'gpu="{gpu}",UUID="GPU-{node:05d}{gpu:02d}-8f3c-4be1-9a55-1c2d3e4f5a6b",'
                f'pci_bus_id="00000000:{0x18 + gpu * 8:02X}:00.0",device="nvidia{gpu}",'
                f'modelName="NVIDIA H100 80GB HBM3",Hostname="{host}",'
                'DCGM_FI_DRIVER_VERSION="550.54.15"'
            )
            value = (
                rng.choice([0, 0, 3, 47, 88, 100])
                if name.endswith("GPU_UTIL")
                else rng.randint(0, 81000)
            )
            lines.append(f"{name}{{{labels}}} {value}")
    return ("\n".join(lines) + "\n").encode()


def serve(nodes: int, gpus: int, ready: Connection) -> None:
    rng = random.Random(7)
    bodies = [node_text(i, gpus, rng) for i in range(nodes)]

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request = await reader.readuntil(b"\r\n\r\n")
            path = request.split(b" ", 2)[1].decode()
            index = int(path.split("/")[2])
            body = bodies[index]
            writer.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\n"
                + f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
                + body
            )
            await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, ValueError, IndexError):
            pass
        finally:
            writer.close()

    async def main() -> None:
        server = await asyncio.start_server(answer, "127.0.0.1", 0, backlog=4096)
        ready.send(server.sockets[0].getsockname()[1])
        async with server:
            await server.serve_forever()

    asyncio.run(main())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--nodes", type=int, default=2000)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--ticks", type=int, default=10)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)

    parent, child = multiprocessing.Pipe()
    farm = multiprocessing.Process(target=serve, args=(args.nodes, args.gpus, child), daemon=True)
    farm.start()
    port = parent.recv()
    settings = ScrapeSettings(
        targets=tuple(f"http://127.0.0.1:{port}/node/{i}/metrics" for i in range(args.nodes)),
        timeout_s=5.0,
        concurrency=args.concurrency,
    )
    source = ScrapeTelemetrySource(settings, "bench", SystemClock())
    tracker = IdleTracker()
    walls: list[float] = []
    folds: list[float] = []
    failed = 0
    samples = 0
    try:
        source.read_gpus(time.time())
        for _ in range(args.ticks):
            started = time.perf_counter()
            read = source.read_gpus(time.time())
            scraped = time.perf_counter()
            tracker.observe(read)
            hosts = tracker.nodes(time.time())
            done = time.perf_counter()
            walls.append(done - started)
            folds.append(done - scraped)
            failed += sum(1 for why in source.target_status().values() if why is not None)
            samples = len(read)
    finally:
        source.close()
        farm.terminate()
        farm.join()
    walls.sort()
    figures = {
        "nodes": args.nodes,
        "gpus_per_node": args.gpus,
        "concurrency": args.concurrency,
        "ticks": args.ticks,
        "samples_per_tick": samples,
        "hosts_folded": len(hosts),
        "failed_scrapes": failed,
        "median_s": statistics.median(walls),
        "p95_s": walls[min(len(walls) - 1, round(0.95 * (len(walls) - 1)))],
        "max_s": walls[-1],
        "fold_median_ms": statistics.median(folds) * 1000,
        "target_s": TARGET_S,
        "target_met": statistics.median(walls) <= TARGET_S,
    }
    print(
        f"scrape + fold {args.nodes} exporters x {args.gpus} GPUs "
        f"(concurrency {args.concurrency}): median {figures['median_s']:.2f} s, "
        f"p95 {figures['p95_s']:.2f} s, max {figures['max_s']:.2f} s over {args.ticks} ticks "
        f"(target <= {TARGET_S:.0f} s); fold alone {figures['fold_median_ms']:.0f} ms; "
        f"{samples} GPU samples, {len(hosts)} hosts, {failed} failed scrapes"
    )
    if args.json is not None:
        args.json.write_text(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
