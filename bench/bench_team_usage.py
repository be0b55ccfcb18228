"""What the live per-team split adds to a tick: ``Splitter`` over a fleet's nodes, with the jobs
known (several teams per node) and unknown (no teams in the config, or the scheduler failed).

Prints the best of several runs per case, in milliseconds per tick and microseconds per node.
Figures only; nothing is asserted.

    .venv/bin/python bench/bench_team_usage.py [--nodes 10000] [--pools 200]
"""

from __future__ import annotations

import argparse
import functools
import random
import timeit

from autoscaler.fleet.team_usage import Holders, Splitter, Usage


def tick(nodes: list[tuple[str, Usage, int, Holders]]) -> None:
    splitter = Splitter()
    for place, amount, gpus, held in nodes:
        splitter.add(place, amount, gpus, held)
    splitter.result()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", type=int, default=10_000)
    parser.add_argument("--pools", type=int, default=200)
    parser.add_argument("--teams", type=int, default=20)
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    rng = random.Random(1)
    known: list[tuple[str, Usage, int, Holders]] = []
    for i in range(args.nodes):
        gpus = rng.choice((1, 4, 8))
        held = {f"team-{rng.randrange(args.teams)}": float(rng.randint(1, gpus)) for _ in range(3)}
        amount = Usage(gpus * 60_000, rng.randint(1_000, 100_000))
        known.append((f"pool-{i % args.pools}", amount, gpus, held))
    unknown: list[tuple[str, Usage, int, Holders]] = [(p, a, g, None) for p, a, g, _h in known]
    cases: list[tuple[str, list[tuple[str, Usage, int, Holders]]]] = [
        ("jobs known", known),
        ("jobs unknown", unknown),
    ]
    for name, nodes in cases:
        best = min(timeit.repeat(functools.partial(tick, nodes), number=1, repeat=args.repeat))
        print(
            f"{name:>13}: {best * 1000:7.1f} ms per tick of {args.nodes} nodes "
            f"({best / args.nodes * 1e6:.1f} us per node)"
        )


if __name__ == "__main__":
    main()
