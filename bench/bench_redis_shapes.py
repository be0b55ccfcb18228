"""What reading Redis items' own shapes (``item_shapes``) costs a tick, against a real redis-server
on loopback: a list of JSON items and a stream of entries, ``--items`` of each (a quarter
multi-node, a third naming GPU models, a few malformed), read with ``max_items_read`` covering
them all, against counting alone. Prints the best and median of ``--repeat`` reads. Figures only.

    .venv/bin/python bench/bench_redis_shapes.py [--items 10000] [--repeat 7] [--json OUT.json]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from redis_server import RedisServer, _started

from autoscaler.sources.redis_queue import RedisQueueSource

NOW = 1_800_000_000.0


def _fields(rng: random.Random) -> dict[str, Any]:
    roll = rng.random()
    if roll < 0.01:
        return {"gpus": "lots"}
    fields: dict[str, Any] = {"script": f"train-{rng.randrange(1000)}.py"}
    if roll < 0.25:
        fields.update(gpus=16, nodes=2)
    elif roll < 0.6:
        fields.update(gpus=rng.choice([1, 2, 4, 8]), gpu_models=rng.choice(["a100|h100", "l4"]))
    return fields


def _fill(server: RedisServer, items: int, seed: int) -> None:
    rng = random.Random(seed)
    client = server.client()
    pipe = client.pipeline(transaction=False)
    for index in range(items):
        fields = _fields(rng)
        pipe.lpush("jobs:list", json.dumps(fields))
        pipe.xadd(
            "jobs:stream",
            {k: str(v) for k, v in fields.items()},
            id=f"{1_700_000_000_000 + index}-0",
        )
    pipe.execute()


def _time(source: RedisQueueSource, repeat: int) -> tuple[float, float, int]:
    runs = []
    groups = 0
    for _ in range(repeat):
        start = time.perf_counter()
        groups = len(source.read(NOW))
        runs.append(time.perf_counter() - start)
    return min(runs), statistics.median(runs), groups


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    figures: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-redis-") as scratch:
        server = _started(Path(scratch), None)
        try:
            _fill(server, args.items, seed=1)
            for mode, key in (("list", "jobs:list"), ("stream", "jobs:stream")):
                for shapes in (False, True):
                    source = RedisQueueSource.from_config(
                        {
                            "url": server.url,
                            "key": key,
                            "mode": mode,
                            "item_shapes": shapes,
                            "max_items_read": max(args.items, 1),
                        },
                        "bench",
                    )
                    best, median, groups = _time(source, args.repeat)
                    name = f"{mode}, {'item shapes' if shapes else 'count only'}"
                    figures[name] = {"best_s": best, "median_s": median, "groups": groups}
                    print(
                        f"{name:<26} {args.items:,} items: {best * 1000:7.1f} ms best, "
                        f"{median * 1000:7.1f} ms median, {groups} demand group(s)"
                    )
        finally:
            server.stop()
    if args.json:
        args.json.write_text(json.dumps({"items": args.items, "figures": figures}, indent=2))


if __name__ == "__main__":
    main()
