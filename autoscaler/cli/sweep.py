"""``gpu-autoscaler sweep``: a grid of scenarios x policies x parameter values, replayed in
parallel (local processes, or a Ray cluster with ``--ray``), compared in one suite report.

The grid file is a suite file that may also give parameter grids (autoscaler/report/sweep_grid.py,
docs/evaluation.md "Sweeps"); the whole grid is checked before the first replay starts.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from autoscaler.cli.base import Subcommands
from autoscaler.model.errors import InputError


def add(commands: Subcommands) -> None:
    sweep = commands.add_parser(
        "sweep",
        help="replay a grid of scenarios x policies x parameters in parallel and compare them",
    )
    sweep.add_argument(
        "--grid",
        type=Path,
        required=True,
        metavar="FILE",
        help="the sweep file: scenarios (files or a suite), policies with parameter grids, "
        "options; any suite file is one (see docs/evaluation.md, Sweeps)",
    )
    sweep.add_argument(
        "--out", type=Path, default=Path("sweep"), help="folder for suite.json and suite.md"
    )
    sweep.add_argument(
        "--jobs",
        type=int,
        default=None,
        metavar="N",
        help="local processes running replays at once (default: the CPUs this process may "
        "use; 1 runs everything in this process)",
    )
    sweep.add_argument(
        "--ray",
        default=None,
        metavar="ADDRESS",
        help="run on a Ray cluster instead: auto, HOST:PORT, ray://HOST:10001, or local (needs "
        "pip install 'hybrid-gpu-autoscaler[ray]' here and on every node)",
    )
    sweep.add_argument(
        "--no-lower-bound",
        action="store_true",
        help="skip the offline bound (as the grid's options.lower_bound: false)",
    )
    sweep.add_argument(
        "--no-progress",
        action="store_true",
        help="no progress: by default a bar on a terminal, else one line on stderr per finished "
        "run and one every GPU_AUTOSCALER_PROGRESS_INTERVAL_S seconds (default 10)",
    )
    sweep.set_defaults(run=_sweep)


def _sweep(args: argparse.Namespace) -> int:
    from autoscaler.model.extras import require_report_extra

    require_report_extra("gpu-autoscaler sweep")
    if args.ray is not None and args.jobs is not None:
        raise InputError("--jobs", "--jobs is for local processes; a Ray cluster has its CPUs")
    if args.jobs is not None and not 1 <= args.jobs <= 1024:
        raise InputError("--jobs", f"expected 1 to 1,024 processes, got {args.jobs}")
    if args.ray is not None:
        from autoscaler.report.sweep_ray import check_reachable, import_ray

        # a missing extra or a wrong address is said before the grid is read
        import_ray()
        check_reachable(args.ray)
    from autoscaler.model.progress import is_terminal
    from autoscaler.report.suite import render_markdown, write_suite
    from autoscaler.report.sweep import Executor, InProcess, LocalProcesses, default_jobs, run_sweep
    from autoscaler.report.sweep_grid import load_sweep
    from autoscaler.report.write import check_out_dir

    sweep = load_sweep(args.grid)
    check_out_dir(args.out)
    executor: Executor
    if args.ray is not None:
        from autoscaler.report.sweep_ray import RayCluster

        executor = RayCluster(args.ray)
    else:
        jobs = args.jobs if args.jobs is not None else default_jobs()
        executor = InProcess() if jobs == 1 else LocalProcesses(jobs)

    def line(text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    # on a terminal the bar says it; in a log, one line per finished run
    lines = not args.no_progress and not is_terminal(sys.stderr)
    report = run_sweep(
        sweep,
        executor,
        lower_bound=not args.no_lower_bound,
        progress=line if lines else None,
        show_progress=not args.no_progress,
    )
    written = write_suite(report, args.out)
    print(render_markdown(report))
    print("written: " + ", ".join(str(p) for p in written))
    return 0
