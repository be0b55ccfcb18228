"""``gpu-autoscaler trace import``: what a site already records, as the simulator's inputs.

``trace import sacct FILE --out trace.csv`` turns Slurm accounting (``sacct --json`` or
``sacct -P``) into a job trace a scenario names in ``trace.file``; ``trace import prometheus
--pending FILE --running FILE --out series.csv`` and ``trace import csv FILE --out series.csv``
turn pending and running GPUs over time into a demand series a scenario names in
``trace.series``, and print the jobs the replay will infer from it with the error of that
inference. docs/trace-import.md has the commands that export each input.
"""

from __future__ import annotations

import argparse
from datetime import UTC, tzinfo
from pathlib import Path

from autoscaler.cli.base import Subcommands
from autoscaler.model.errors import InputError

SHOWN_LINE = "  "


def add(commands: Subcommands) -> None:
    trace = commands.add_parser("trace", help="import a site's job history as a replayable trace")
    actions = trace.add_subparsers(dest="trace_command", metavar="import")
    importer = actions.add_parser(
        "import", help="turn sacct, Prometheus or a CSV into a trace or demand series"
    )
    kinds = importer.add_subparsers(dest="kind", metavar="{sacct,prometheus,csv}")

    sacct = kinds.add_parser(
        "sacct", help="Slurm accounting (sacct --json, or sacct -P) into a job trace CSV"
    )
    sacct.add_argument("file", type=Path, help="what sacct --json or sacct -P printed")
    sacct.add_argument("--out", type=Path, required=True, help="the job trace CSV to write")
    sacct.add_argument(
        "--group-by",
        choices=("account", "partition", "user", "qos"),
        default="account",
        help="what becomes the trace's user_group (default: account)",
    )
    sacct.add_argument(
        "--timezone",
        default="UTC",
        help="the zone of sacct -P's times without one (default: UTC); IANA name",
    )
    sacct.add_argument(
        "--origin",
        default=None,
        help="the moment that is trace time 0 (ISO 8601; default: the first submission)",
    )
    sacct.add_argument(
        "--gpu-model",
        action="append",
        default=[],
        metavar="TYPE=MODEL",
        help="rename a gres type to the GPU model of the scenario's pools (repeatable; "
        "TYPE= drops it: the jobs accept any GPU)",
    )
    sacct.set_defaults(run=_sacct)

    prometheus = kinds.add_parser(
        "prometheus",
        help="two Prometheus query_range answers (pending and running GPUs) into a demand series",
    )
    prometheus.add_argument("--pending", type=Path, required=True, help="pending GPUs answer")
    prometheus.add_argument("--running", type=Path, required=True, help="running GPUs answer")
    _series_options(prometheus)
    prometheus.set_defaults(run=_prometheus)

    csv = kinds.add_parser("csv", help="a CSV of pending and running GPUs into a demand series")
    csv.add_argument("file", type=Path, help="the CSV")
    csv.add_argument("--time-column", default="time_s", help="epoch seconds or ISO 8601 times")
    csv.add_argument("--pending-column", default="pending_gpus", help="pending GPUs")
    csv.add_argument("--running-column", default="running_gpus", help="running GPUs")
    _series_options(csv)
    csv.set_defaults(run=_csv)

    def usage(_args: argparse.Namespace) -> int:
        importer.print_help()
        return 2

    trace.set_defaults(run=usage)
    importer.set_defaults(run=usage)


def _series_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", type=Path, required=True, help="the demand series CSV to write")
    parser.add_argument(
        "--job-gpus",
        type=int,
        default=1,
        help="the size of each inferred job, for the summary printed (the scenario's "
        "trace.series.job_gpus decides the replay's); default 1",
    )


def _zone(name: str) -> tzinfo:
    if name.upper() == "UTC":
        return UTC
    from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise InputError(
            "--timezone", f"unknown time zone {name[:60]!r}; give an IANA name"
        ) from None


def _renames(pairs: list[str]) -> dict[str, str]:
    renames: dict[str, str] = {}
    for pair in pairs:
        kind, equals, model = pair.partition("=")
        if not equals or not kind.strip():
            raise InputError("--gpu-model", f"expected TYPE=MODEL, got {pair[:60]!r}")
        renames[kind.strip()] = model.strip()
    return renames


def _is_json(path: Path) -> bool:
    try:
        with path.open("rb") as handle:
            head = handle.read(4096).lstrip(b"\xef\xbb\xbf \t\r\n")
    except FileNotFoundError:
        raise InputError(str(path), "no such file") from None
    except OSError as exc:
        raise InputError(str(path), f"cannot be read: {exc.strerror or exc}") from None
    return head.startswith((b"{", b"["))


def _sacct(args: argparse.Namespace) -> int:
    from autoscaler.model.csvfile import parse_timestamp
    from autoscaler.sim.importers.outfile import write_trace
    from autoscaler.sim.importers.sacct import to_trace
    from autoscaler.sim.importers.sacct_json import read_sacct_json
    from autoscaler.sim.importers.sacct_text import read_sacct_text

    zone = _zone(args.timezone)
    renames = _renames(args.gpu_model)
    origin = parse_timestamp(args.origin, "--origin") if args.origin else None
    records = (
        read_sacct_json(args.file) if _is_json(args.file) else read_sacct_text(args.file, zone)
    )
    imported = to_trace(records, args.group_by, renames)
    if not imported.rows:
        left = "; ".join(f"{n:,} {why}" for why, n in sorted(imported.skipped.items()))
        raise InputError(
            str(args.file), f"no GPU job that ran ({imported.records:,} records: {left or 'none'})"
        )
    if origin is None:
        origin = float(int(min(r.submit for r in imported.rows)))
    write_trace(imported.rows, args.out, origin)
    for line in imported.lines(origin):
        print(line)
    print(f"wrote {args.out}; name it in a scenario as  trace: {{file: {args.out}}}")
    return 0


def _report_series(
    samples: list[tuple[float, float, float]], source: Path, args: argparse.Namespace
) -> int:
    """Check the series as a replay would, print the jobs it stands for, write it. ``source``
    is the input named by an error about the whole series."""
    from autoscaler.sim.demand_series import check_span, infer
    from autoscaler.sim.importers.outfile import write_series

    if not 1 <= args.job_gpus <= 65_536:
        raise InputError("--job-gpus", f"expected 1 to 65,536 GPUs, got {args.job_gpus}")
    check_span(samples, str(source))
    inference = infer(samples, args.job_gpus, str(source))
    write_series(samples, args.out)
    for line in inference.lines():
        print(line)
    print(
        f"wrote {args.out}; name it in a scenario as  trace: {{series: {{file: {args.out}, "
        f"job_gpus: {args.job_gpus}}}}}"
    )
    return 0


def _prometheus(args: argparse.Namespace) -> int:
    from autoscaler.sim.importers.prometheus import demand_from_answers, read_answer

    samples, filled = demand_from_answers(read_answer(args.pending), read_answer(args.running))
    if filled:
        print(f"{filled:,} missing points inside a series took its previous value")
    return _report_series(samples, args.running, args)


def _csv(args: argparse.Namespace) -> int:
    from autoscaler.sim.importers.series_csv import read_demand_csv

    samples = read_demand_csv(args.file, args.time_column, args.pending_column, args.running_column)
    return _report_series(samples, args.file, args)
