"""The evaluation suite as a benchmark: every scenario, every policy, one table.

Runs the suite file (default: the shipped ``autoscaler/data/scenarios/suite.yaml``) exactly as
``gpu-autoscaler report --suite`` does, and prints the same table with each replay's wall time
beside it, then the wall time per policy summed over the scenarios. Each scenario's replay of one
policy is meant to stay under about 60 s on the 2-core dev machine; the figures show whether it
does. Nothing is asserted. While a replay or a bound runs, stderr shows its progress (a bar on a
terminal, a line every ~10 s in a log; ``--no-progress`` for none).

    .venv/bin/python bench/bench_policies.py                      # the whole suite (~20 min)
    .venv/bin/python bench/bench_policies.py --scenario synthetic-bursty --no-lower-bound
    .venv/bin/python bench/bench_policies.py --out suite-report --json figures.json
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
from collections.abc import Sequence
from pathlib import Path

from autoscaler.model.errors import InputError
from autoscaler.report.suite import SuiteReport, load_suite, render_markdown, run_suite, write_suite

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_SUITE = ROOT / "autoscaler" / "data" / "scenarios" / "suite.yaml"
TARGET_REPLAY_S = 60.0


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def wall_by_policy(report: SuiteReport) -> list[tuple[str, float, float, float, float]]:
    """(policy, summed wall s, slowest wall s, summed CPU s, slowest CPU s) per policy, in the
    suite's order."""
    out = []
    for title in report.policies:
        rows = [r for s in report.scenarios for r in s.rows if r.policy == title]
        walls = [r.replay_wall_s for r in rows]
        cpus = [r.replay_cpu_s for r in rows]
        out.append((title, sum(walls), max(walls, default=0.0), sum(cpus), max(cpus, default=0.0)))
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--suite", type=Path, default=DEFAULT_SUITE)
    parser.add_argument(
        "--scenario", action="append", help="only this scenario (name or file stem; repeatable)"
    )
    parser.add_argument("--policy", action="append", help="only this policy (repeatable)")
    parser.add_argument("--no-lower-bound", action="store_true")
    parser.add_argument("--out", type=Path, help="also write suite.json and suite.md here")
    parser.add_argument("--json", type=Path, help="write the suite's figures here as JSON")
    parser.add_argument(
        "--no-progress",
        action="store_true",
        help="no progress on stderr (by default a bar on a terminal, else a line every ~10 s)",
    )
    args = parser.parse_args(argv)
    try:
        loaded = load_suite(args.suite, only_policies=args.policy)
        if args.scenario:
            loaded = loaded.only_scenarios(args.scenario)
    except InputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"suite {args.suite}: {len(loaded.scenarios)} scenarios", flush=True)
    report = run_suite(
        loaded,
        lower_bound=not args.no_lower_bound,
        progress=lambda line: print(line, flush=True),
        show_progress=not args.no_progress,
    )
    print()
    print(render_markdown(report, show_wall=True))
    print("## Replay wall time per policy")
    print()
    for title, total, slowest, cpu_total, cpu_slowest in wall_by_policy(report):
        verdict = "met" if slowest <= TARGET_REPLAY_S else "MISSED"
        print(
            f"- {title}: {total:,.1f} s wall ({cpu_total:,.1f} s CPU) over "
            f"{len(report.scenarios)} scenario(s); slowest replay {slowest:.1f} s wall "
            f"({cpu_slowest:.1f} s CPU); target <= {TARGET_REPLAY_S:.0f} s wall per replay: "
            f"{verdict}"
        )
    print(f"- peak RSS {peak_rss_mib():.0f} MiB; suite wall {report.wall_s:,.0f} s")
    if args.out is not None:
        written = write_suite(report, args.out)
        print("written: " + ", ".join(str(p) for p in written))
    if args.json is not None:
        args.json.write_text(json.dumps(report.model_dump(mode="json"), indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
