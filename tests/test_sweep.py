"""``gpu-autoscaler sweep``: a grid file expands to one run per combination, is checked whole
before anything runs (one error naming file, line and field), and gives the same figures in
this process, in a pool of processes and on a Ray cluster started by the test; a suite file is a
grid and gives what ``report --suite`` gives."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from waits import bound

from autoscaler.cli import main
from autoscaler.model.errors import InputError
from autoscaler.model.inputfile import parse_yaml
from autoscaler.report.suite import SuiteReport
from autoscaler.report.sweep import LocalProcesses, run_sweep
from autoscaler.report.sweep_grid import LoadedSweep, SweepPolicy, expand_policy, load_sweep
from autoscaler.sim.scenario import PolicySpec

ROOT = Path(__file__).resolve().parent.parent
DATA = Path(__file__).resolve().parent / "data" / "sweep"
GRID = DATA / "grid.yaml"
RAY = Path(sys.executable).parent / "ray"
# the figures of a run; what differs between runs is how long they took
TIMINGS = frozenset({"wall_s", "prepare_s", "replay_wall_s", "replay_cpu_s", "solve_s"})
RAY_START_S = 300.0  # a Ray head starts in 10-30 s on a quiet machine; CI's is not quiet


def figures(report_json: Path) -> Any:
    def strip(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: strip(v) for k, v in value.items() if k not in TIMINGS}
        if isinstance(value, list):
            return [strip(v) for v in value]
        return value

    return strip(json.loads(report_json.read_text()))


def sweep(*args: str) -> int:
    return main(["sweep", *args])


def cli(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "autoscaler.cli", *args],
        capture_output=True,
        text=True,
        check=False,
        cwd=ROOT,
        env={**os.environ, **env},
        timeout=bound(600),
    )


# ---------------------------------------------------------------- a Ray head for the test


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@contextmanager
def ray_head() -> Iterator[tuple[str, Path]]:
    """``ray start --head --block`` in its own session: its ports chosen free, its files in a
    short folder of its own (Ray's socket paths must stay under 108 bytes), no login token
    written to the home folder. Ended by signalling the process the test started; ``--block``
    takes Ray's own processes down with it."""
    folder = Path(tempfile.mkdtemp(prefix="ray", dir="/tmp"))
    port = free_port()
    log = folder / "head.log"
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}
    command = [
        str(RAY),
        "start",
        "--head",
        "--block",
        "--num-cpus=2",
        "--include-dashboard=false",
        "--disable-usage-stats",
        "--node-ip-address=127.0.0.1",
        f"--port={port}",
        f"--ray-client-server-port={free_port()}",
        f"--dashboard-port={free_port()}",
        f"--dashboard-agent-listen-port={free_port()}",
        "--object-store-memory=100000000",
        f"--temp-dir={folder}",
    ]
    with log.open("w") as out:
        head = subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    try:
        yield f"127.0.0.1:{port}", log
    finally:
        head.send_signal(signal.SIGTERM)
        try:
            head.wait(timeout=bound(120))
        except subprocess.TimeoutExpired:
            os.killpg(head.pid, signal.SIGKILL)
            head.wait(timeout=bound(60))
        shutil.rmtree(folder, ignore_errors=True)


def wait_until_started(log: Path) -> None:
    give_up = time.monotonic() + bound(RAY_START_S)
    while "Ray runtime started" not in log.read_text():
        assert time.monotonic() < give_up, "no Ray head within the bound:\n" + log.read_text()
        time.sleep(0.5)


# ---------------------------------------------------------------- the same figures everywhere


def test_the_same_figures_in_this_process_in_two_processes_and_on_ray(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with ray_head() as (address, log):
        # the local runs while the head starts
        assert sweep("--grid", str(GRID), "--out", str(tmp_path / "one"), "--jobs", "1") == 0
        capsys.readouterr()
        assert sweep("--grid", str(GRID), "--out", str(tmp_path / "two"), "--jobs", "2") == 0
        finished = [
            line
            for line in capsys.readouterr().err.splitlines()
            if re.match(r"\[\d+/10\] tiny-[ab]: ", line)
        ]
        wait_until_started(log)
        done = cli(
            "sweep",
            "--grid",
            str(GRID),
            "--out",
            str(tmp_path / "ray"),
            "--ray",
            address,
            RAY_AUTH_MODE="disabled",
        )
    assert done.returncode == 0, done.stderr
    assert "on the Ray cluster at 127.0.0.1:" in done.stderr
    # in a log, one line per finished run: ten tasks (two bounds, eight replays), counted
    assert [int(re.match(r"\[(\d+)/", line)[1]) for line in finished] == list(range(1, 11))  # type: ignore[index]
    assert sum("lower bound: $" in line for line in finished) == 2
    one = figures(tmp_path / "one" / "suite.json")
    assert figures(tmp_path / "two" / "suite.json") == one
    assert figures(tmp_path / "ray" / "suite.json") == one
    markdown = (tmp_path / "one" / "suite.md").read_text()
    assert (tmp_path / "two" / "suite.md").read_text() == markdown
    assert (tmp_path / "ray" / "suite.md").read_text() == markdown
    report = SuiteReport.model_validate_json((tmp_path / "one" / "suite.json").read_text())
    assert report.policies == [
        "cost-aware idle_seconds=0",
        "cost-aware idle_seconds=600",
        "cheapest-spot",
        "on-demand",
    ]
    assert report.default_policy == "cost-aware idle_seconds=600"
    for result in report.scenarios:
        assert result.lower_bound is not None and result.lower_bound.cost is not None
        assert [r.policy for r in result.rows] == report.policies
    # the runs differ: the grid's idle times lead to different bills
    costs = {r.policy: r.cost for r in report.scenarios[0].rows}
    assert costs["cost-aware idle_seconds=0"] != costs["cost-aware idle_seconds=600"]


def test_a_suite_file_is_a_grid_and_gives_what_report_suite_gives(tmp_path: Path) -> None:
    suite = DATA / "suite.yaml"
    args = ["--out", str(tmp_path / "swept"), "--no-lower-bound", "--no-progress", "--jobs", "1"]
    assert sweep("--grid", str(suite), *args) == 0
    reported = ["--out", str(tmp_path / "reported"), "--no-lower-bound", "--no-progress"]
    assert main(["report", "--suite", str(suite), *reported]) == 0
    swept = tmp_path / "swept" / "suite.md"
    assert swept.read_text() == (tmp_path / "reported" / "suite.md").read_text()
    assert figures(tmp_path / "swept" / "suite.json") == figures(
        tmp_path / "reported" / "suite.json"
    )


def test_a_sweep_runs_a_suites_scenarios_with_its_own_policies() -> None:
    loaded = load_sweep(DATA / "over-suite.yaml")
    assert [s.scenario.name for s in loaded.scenarios] == ["tiny-a", "tiny-b"]
    titles = ["cheapest-spot idle_seconds=0", "cheapest-spot idle_seconds=300"]
    for specs in loaded.policies:
        assert [s.title for _, s in specs] == titles
        assert [s.params for _, s in specs] == [{"idle_seconds": 0}, {"idle_seconds": 300}]
    assert loaded.default_policy == titles[0], "cost-aware does not run: the first run"
    assert loaded.lower_bound is False
    from_suite = load_sweep(DATA / "suite.yaml")
    assert from_suite.default_policy == "cheapest-spot"
    assert from_suite.titles() == ["cost-aware", "cheapest-spot"]


# ---------------------------------------------------------------- the grid


def test_a_grid_is_one_run_per_combination_titled_by_its_values(tmp_path: Path) -> None:
    grid = tmp_path / "grid.yaml"
    grid.write_text(
        f"name: g\nscenarios: [{{file: {DATA / 'tiny-a.yaml'}}}]\n"
        "policies:\n"
        "  - name: cost-aware\n"
        "    label: ca\n"
        "    params: {restart_overhead_s: 60}\n"
        "    grid: {idle_seconds: [null, 0, 90.5], replace_on_notice: [true, false]}\n"
        "  - name: on-demand\n"
    )
    loaded = load_sweep(grid)
    specs = [s for _, s in loaded.policies[0]]
    assert [s.title for s in specs] == [
        "ca idle_seconds=null replace_on_notice=true",
        "ca idle_seconds=null replace_on_notice=false",
        "ca idle_seconds=0 replace_on_notice=true",
        "ca idle_seconds=0 replace_on_notice=false",
        "ca idle_seconds=90.5 replace_on_notice=true",
        "ca idle_seconds=90.5 replace_on_notice=false",
        "on-demand",
    ]
    assert specs[4].params == {
        "restart_overhead_s": 60,
        "idle_seconds": 90.5,
        "replace_on_notice": True,
    }
    assert loaded.replays == 7
    assert loaded.default_policy == "ca idle_seconds=null replace_on_notice=true"


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    idle=st.lists(st.integers(0, 10_000), min_size=1, max_size=4, unique=True),
    overhead=st.lists(st.floats(0, 1e4, allow_nan=False), min_size=1, max_size=3, unique=True),
    fixed=st.booleans(),
)
def test_every_combination_runs_once_with_its_own_values(
    idle: list[int], overhead: list[float], fixed: bool
) -> None:
    text = "policies:\n  - {name: cost-aware}\n"
    document = parse_yaml(text, "grid.yaml")
    grid: dict[str, list[Any]] = {"idle_seconds": list(idle)}
    if not fixed:
        grid["restart_overhead_s"] = list(overhead)
    params = {"restart_overhead_s": overhead[0]} if fixed else {}
    policy = SweepPolicy(name="cost-aware", params=params, grid=grid)
    specs = expand_policy(policy, document, ("policies", 0))
    assert len(specs) == len(idle) * (1 if fixed else len(overhead))
    assert len({s.title for s in specs}) == len(specs), "titles tell the runs apart"
    seen = {(s.params["idle_seconds"], s.params["restart_overhead_s"]) for s in specs}
    expected = {(i, o) for i in idle for o in (overhead[:1] if fixed else overhead)}
    assert seen == expected


TINY = f"{{file: {DATA / 'tiny-a.yaml'}}}"


@pytest.mark.parametrize(
    ("text", "line", "field", "message"),
    [
        (
            f"scenarios: [{TINY}]\npolicies:\n  - {{name: cost-aware, grid: {{idle_seconds: "
            "[0, -5]}}\n",
            3,
            "policies[0].grid.idle_seconds[1]",
            "value -5",
        ),
        (
            f"scenarios: [{TINY}]\npolicies:\n  - name: cost-aware\n    grid:\n"
            "      idle_secs: [0]\n",
            5,
            "policies[0].grid.idle_secs[0]",
            "unknown field",
        ),
        (
            f"scenarios: [{TINY}]\npolicies:\n  - name: cost-aware\n"
            "    params: {idle_seconds: 5}\n    grid: {idle_seconds: [0]}\n",
            5,
            "policies[0].grid.idle_seconds",
            "in params too",
        ),
        (
            f"scenarios: [{TINY}]\npolicies:\n"
            "  - {name: cost-aware, grid: {idle_seconds: []}}\n",
            3,
            "policies[0].grid.idle_seconds",
            "at least 1",
        ),
        (
            f"scenarios: [{TINY}]\npolicies:\n"
            "  - {name: cost-aware, grid: {idle_seconds: 5}}\n",
            3,
            "policies[0].grid.idle_seconds",
            "list",
        ),
        (
            f"scenarios: [{TINY}]\npolicies:\n  - {{name: on-demand}}\n  - {{name: nope}}\n",
            4,
            "policies[1].name",
            "no policy named 'nope'",
        ),
        (
            f"scenarios: [{TINY}]\npolicies:\n  - {{name: on-demand}}\n  - {{name: on-demand}}\n",
            4,
            "policies[1]",
            "a second run titled 'on-demand'",
        ),
        (
            f"scenarios: [{TINY}]\npolicies:\n  - name: cost-aware\n    grid:\n"
            f"      idle_seconds: {list(range(101))}\n"
            f"      restart_overhead_s: {list(range(101))}\n",
            5,
            "policies[0].grid",
            "10,201 combinations",
        ),
        (
            f"scenarios: [{TINY}]\npolicies: [{{name: on-demand}}]\ndefault_policy: smart\n",
            3,
            "default_policy",
            "'smart' is not among the runs: on-demand",
        ),
        (
            f"scenarios:\n  - {TINY}\n  - {{file: {DATA / 'tiny-a.yaml'}}}\n",
            3,
            "scenarios[1].file",
            "scenario 'tiny-a' is already in the sweep (from scenarios[0].file)",
        ),
        (
            f"scenarios:\n  - {TINY}\n  - {{suite: {DATA / 'suite.yaml'}}}\n",
            3,
            "scenarios[1].suite",
            "'tiny-a' is already in the sweep",
        ),
        ("scenarios:\n  - {file: missing.yaml}\n", 2, "scenarios[0].file", "no such scenario"),
        ("scenarios:\n  - {suite: gone.yaml}\n", 2, "scenarios[0].suite", "no such suite file"),
        (
            f"scenarios:\n  - {{file: a.yaml, suite: {DATA / 'suite.yaml'}}}\n",
            2,
            "scenarios[0]",
            "give either file",
        ),
        (f"scenarios: [{TINY}]\noptions: {{lower_bound: maybe}}\n", 2, "options.lower_bound", ""),
        (f"scenarios: [{TINY}]\ngird: {{}}\n", 2, "gird", "unknown field"),
        (
            f"scenarios:\n  - {TINY}\n  - {{file: no-cost-aware.yaml}}\n",
            3,
            "scenarios[1].file",
            "scenario 'tiny-c' does not run the default policy 'cost-aware'",
        ),
    ],
)
def test_a_bad_grid_is_one_error_naming_its_line_and_field(
    tmp_path: Path, text: str, line: int, field: str, message: str
) -> None:
    grid = tmp_path / "grid.yaml"
    # tiny-a as tiny-c, whose own list lacks cost-aware
    copy = (DATA / "tiny-a.yaml").read_text().replace("  - name: cost-aware\n", "")
    (tmp_path / "no-cost-aware.yaml").write_text(copy.replace("name: tiny-a", "name: tiny-c"))
    for name in ("trace.csv", "prices.csv", "avail.csv"):
        shutil.copy(DATA / name, tmp_path / name)
    grid.write_text(text)
    with pytest.raises(InputError) as caught:
        load_sweep(grid)
    error = caught.value
    assert error.where == f"{grid}:{line}", error
    assert error.field == field, error
    assert message in error.message, error


# ---------------------------------------------------------------- the command's errors


def test_the_command_refuses_a_bad_grid_with_exit_2_and_one_line(tmp_path: Path) -> None:
    grid = tmp_path / "grid.yaml"
    grid.write_text(f"scenarios: [{TINY}]\npolicies: [{{name: nope}}]\n")
    done = cli("sweep", "--grid", str(grid), "--out", str(tmp_path / "out"))
    assert done.returncode == 2
    assert done.stderr.strip() == (
        f"error: {grid}:2: policies[0].name: "
        + done.stderr.split("policies[0].name: ", 1)[1].strip()
    )
    assert "no policy named 'nope'" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--jobs", "0"], "--jobs: expected 1 to 1,024 processes, got 0"),
        (["--jobs", "2", "--ray", "auto"], "--jobs: --jobs is for local processes"),
    ],
)
def test_bad_options_are_one_line(args: list[str], message: str, tmp_path: Path) -> None:
    done = cli("sweep", "--grid", str(GRID), "--out", str(tmp_path / "out"), *args)
    assert done.returncode == 2
    assert done.stderr.strip() == f"error: {message}" or done.stderr.startswith(f"error: {message}")
    assert len(done.stderr.strip().splitlines()) == 1


def test_a_ray_address_nothing_answers_at_is_one_line_at_once(tmp_path: Path) -> None:
    port = free_port()  # closed again: nothing listens there
    done = cli(
        "sweep", "--grid", str(GRID), "--out", str(tmp_path / "o"), "--ray", f"127.0.0.1:{port}"
    )
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"error: --ray: nothing answers at 127.0.0.1:{port} (Connection refused); is the Ray "
        "head running there?"
    ]


def test_without_ray_installed_the_command_names_the_extra(tmp_path: Path) -> None:
    refuse_ray = (
        "import sys\n"
        "class NoRay:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] == 'ray':\n"
        "            raise ImportError('No module named ' + repr(name))\n"
        "sys.meta_path.insert(0, NoRay())\n"
        "from autoscaler.cli import main\n"
        "sys.exit(main())\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", refuse_ray, "sweep", "--grid", str(GRID), "--ray", "auto"],
        capture_output=True,
        text=True,
        check=False,
        cwd=ROOT,
        timeout=bound(300),
    )
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("error: --ray: needs ray, which is not installed")
    assert lines[0].endswith("pip install 'hybrid-gpu-autoscaler[ray]'")


def test_a_runs_error_crosses_the_process_boundary_with_its_file_and_field() -> None:
    """A run that fails in a worker (here a spec no check saw: the grid file would have refused
    it) ends the sweep with the worker's InputError, its where and field intact."""
    loaded = load_sweep(GRID)
    bad = PolicySpec(name="cost-aware", params={"idle_seconds": -5})
    broken = LoadedSweep(
        name="broken",
        description="",
        source=str(GRID),
        default_policy="cost-aware",
        peer_wait_slack_s=5.0,
        lower_bound=False,
        scenarios=loaded.scenarios[:1],
        policies=(((0, bad),),),
    )
    with pytest.raises(InputError) as caught:
        run_sweep(broken, LocalProcesses(2), lower_bound=False)
    assert caught.value.field == "policies[0].params.idle_seconds", caught.value
    assert caught.value.where.endswith("tiny-a.yaml"), caught.value
