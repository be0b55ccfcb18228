"""The log scrubber's time against the length of what it scrubs: linear now, quadratic before.

Every log line, CLI error, plan output and report string goes through ``autoscaler.model.secrets``'s
scrub, and any upstream error text or notice field can reach it. Issue 15 found its URL
credential pattern quadratic (1.9 s on 16,000 characters, ~30 s on 64,000, holding the GIL).
This prints, for texts of growing length in the shapes that hurt (a long run of letters, as an
error body of one long word; ``a://b:c`` repeated; a token echoed in many ``token=`` pairs;
ordinary words), the scrub time and the time per character; a linear scrubber keeps the last
column flat. ``--old`` also times the issue's pattern, up to ``--old-max`` characters.

    .venv/bin/python bench/bench_scrub.py
    .venv/bin/python bench/bench_scrub.py --old --old-max 16000
"""

from __future__ import annotations

import argparse
import json
import re
import time
from collections.abc import Callable
from pathlib import Path

from autoscaler.model.secrets import Secrets

# The URL-credential pattern issue 15 measured (autoscaler/model/logs.py before the fix).
OLD_URL = re.compile(r"(?i)([a-z][a-z0-9+.-]*://[^:/\s@]+:)[^@\s]+(@)")

FAMILIES: dict[str, Callable[[int], str]] = {
    "one long word": lambda n: "a" * n,
    "a://b:c repeated": lambda n: ("a://b:c" * (n // 7 + 1))[:n],
    "token=… pairs": lambda n: "".join(f"token=v{i:07d} " for i in range(n // 15 + 1))[:n],
    "bearer echoed": lambda n: (
        "Bearer tok-0123456789abcdef said tok-0123456789abcdef " * (n // 53 + 1)
    )[:n],
    "ordinary words": lambda n: ("the source failed: HTTP 503 try later; " * (n // 39 + 1))[:n],
}
LENGTHS = (1_000, 4_000, 16_000, 64_000, 256_000, 1_000_000)


def timed(scrub: Callable[[str], object], text: str) -> float:
    """Best of three, in seconds (a busy machine only ever adds time)."""
    best = float("inf")
    for _ in range(3):
        started = time.perf_counter()
        scrub(text)
        best = min(best, time.perf_counter() - started)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--old", action="store_true", help="also time the issue's pattern")
    parser.add_argument("--old-max", type=int, default=16_000, help="longest text for --old")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = parser.parse_args()
    figures: list[dict[str, object]] = []
    secrets = Secrets()
    secrets.add("tok-registered-0123456789", "hunter2-db-password")
    print(f"{'input':<18} {'chars':>9} {'scrub ms':>10} {'ns/char':>8}", end="")
    print(f" {'old ms':>10}" if args.old else "")
    for family, make in FAMILIES.items():
        for length in LENGTHS:
            text = make(length)
            seconds = timed(secrets.scrub, text)
            line = (
                f"{family:<18} {length:>9,} {seconds * 1e3:>10.2f} {seconds / length * 1e9:>8.0f}"
            )
            row: dict[str, object] = {"input": family, "chars": length, "scrub_s": seconds}
            if args.old and length <= args.old_max:
                old = timed(lambda t: OLD_URL.sub(r"\1***\2", t), text)
                line += f" {old * 1e3:>10.1f}"
                row["old_s"] = old
            print(line, flush=True)
            figures.append(row)
    if args.json is not None:
        args.json.write_text(json.dumps({"scrub": figures}, indent=2) + "\n")


if __name__ == "__main__":
    main()
