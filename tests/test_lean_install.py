"""The controller, the node agent and the image run without the report extra: numpy, scipy,
matplotlib and tqdm serve only the dry-run report, the lower bound and synthetic traces. Each
command runs in a fresh Python whose import system refuses those modules (a meta-path finder), as
a lean install would; the report itself ends in one line and exit 2 naming the extra. The
declared dependencies are read from pyproject.toml and checked against what the code imports."""

from __future__ import annotations

import ast
import importlib.metadata
import os
import re
import signal
import socket
import subprocess
import sys
import time
import tomllib
import urllib.error
import urllib.request
from pathlib import Path

from test_sim_engine import job_row, small_scenario
from waits import bound

ROOT = Path(__file__).resolve().parent.parent
REPORT_ONLY = ("numpy", "scipy", "matplotlib", "tqdm")
INSTALL_HINT = "pip install 'hybrid-gpu-autoscaler[report]'"
CONTAINER_CONFIG = ROOT / "examples" / "container" / "config.yaml"
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())

BLOCKER = (
    "import sys\n"
    "class Lean:\n"
    "    def find_spec(self, name, path=None, target=None):\n"
    f"        if name.split('.')[0] in {REPORT_ONLY!r}:\n"
    "            raise ImportError('not installed: ' + name)\n"
    "sys.meta_path.insert(0, Lean())\n"
    "sys.argv[0] = 'lean'\n"
)


def lean_code(entry: str) -> str:
    """Run ``entry``'s main with the report extra's modules refused, and check at the end that
    none of them slipped in (an import that does not go through the finders cannot)."""
    return BLOCKER + (
        f"from {entry} import main\n"
        "try:\n"
        "    code = main()\n"
        "except SystemExit as exc:\n"
        "    code = exc.code\n"
        f"leaked = [m for m in {REPORT_ONLY!r} if m in sys.modules]\n"
        "assert not leaked, leaked\n"
        "sys.exit(code)\n"
    )


def lean(*args: str, entry: str = "autoscaler.cli", **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", lean_code(entry), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, **env},
        timeout=bound(300),
    )


def test_run_plan_validate_and_help_need_no_report_extra(tmp_path: Path) -> None:
    for args in (["--help"], ["run", "--help"], ["plan", "--help"], ["agent", "--help"]):
        done = lean(*args)
        assert done.returncode == 0, (args, done.stderr)
        assert "usage:" in done.stdout
    done = lean("validate", str(CONTAINER_CONFIG))
    assert done.returncode == 0, done.stderr
    assert "ok" in done.stdout
    # plan runs a whole tick (the sim provider, the static source, the policy) and acts on nothing
    done = lean("plan", "--config", str(CONTAINER_CONFIG))
    assert done.returncode == 0, done.stderr
    assert "sim-a10g-spot" in done.stdout


def test_a_scenario_with_a_trace_file_validates_without_the_extra(tmp_path: Path) -> None:
    scenario = small_scenario(tmp_path, jobs=[job_row("a", 0, 600), job_row("b", 60, 600)])
    done = lean("validate", str(scenario))
    assert done.returncode == 0, done.stderr


def test_the_report_without_the_extra_is_one_line_naming_it(tmp_path: Path) -> None:
    scenario = small_scenario(tmp_path, jobs=[job_row("a", 0, 600)])
    for args in (
        ["report", "--out", str(tmp_path / "out")],
        ["report", "--scenario", str(scenario), "--out", str(tmp_path / "out")],
        ["report", "--suite", str(tmp_path / "suite.yaml"), "--out", str(tmp_path / "out")],
    ):
        done = lean(*args)
        assert done.returncode == 2, (args, done.stderr)
        assert done.stderr.count("\n") == 1, done.stderr
        assert INSTALL_HINT in done.stderr and "numpy" in done.stderr
        assert not (tmp_path / "out").exists()


def test_generating_a_synthetic_trace_without_numpy_is_one_line_naming_the_extra(
    tmp_path: Path,
) -> None:
    scenario = small_scenario(tmp_path, jobs=[job_row("a", 0, 600)])
    text = scenario.read_text()
    default = "trace: {file: trace.csv, window_start_s: 0, window_end_s: 86400}"
    assert default in text
    scenario.write_text(
        text.replace(
            default,
            "trace: {synthetic: {family: bursty, jobs: 40, days: 0.5, seed: 9}, "
            "window_start_s: 0, window_end_s: 43200}",
        )
    )
    done = lean("validate", str(scenario), GPU_AUTOSCALER_CACHE=str(tmp_path / "cache"))
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1, done.stderr
    assert INSTALL_HINT in done.stderr and "synthetic" in done.stderr


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_the_agent_serves_metrics_and_stops_without_the_extra() -> None:
    port = free_port()
    done = lean("--help", entry="node_agent.cli")
    assert done.returncode == 0, done.stderr
    command = [sys.executable, "-c", lean_code("node_agent.cli")]
    agent = subprocess.Popen(
        [*command, "--cloud", "none", "--listen", f"127.0.0.1:{port}"],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        exposition = ""
        give_up = time.monotonic() + bound(60)
        while not exposition and time.monotonic() < give_up and agent.poll() is None:
            try:
                with urllib.request.urlopen(
                    f"http://127.0.0.1:{port}/metrics", timeout=bound(30)
                ) as r:
                    exposition = r.read().decode()
            except (urllib.error.URLError, ConnectionError):
                time.sleep(0.2)
        assert agent.poll() is None, agent.communicate()[1]
        assert re.search(r"^# TYPE \S+ gauge$", exposition, re.MULTILINE), exposition
        agent.send_signal(signal.SIGTERM)
        _, err = agent.communicate(timeout=bound(60))
        assert agent.returncode == 0, err
    finally:
        if agent.poll() is None:
            agent.kill()
            agent.wait()


# ---------------------------------------------------------------- what is declared


def requirement_names(requirements: list[str]) -> set[str]:
    return {canonical(re.split(r"[\s\[<>=!~;]", r, maxsplit=1)[0]) for r in requirements}


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def test_the_report_modules_are_an_extra_the_dev_install_and_not_the_image_installs() -> None:
    project = PYPROJECT["project"]
    core = requirement_names(project["dependencies"])
    extras = {k: requirement_names(v) for k, v in project["optional-dependencies"].items()}
    heavy = {"numpy", "scipy", "matplotlib", "tqdm"}
    assert not heavy & core, "the controller and the agent install without them"
    assert heavy <= extras["report"]
    assert not heavy & extras["agent"]
    assert project["scripts"]["gpu-autoscaler-agent"] == "node_agent.cli:main"
    makefile = (ROOT / "Makefile").read_text()
    installs = re.findall(r"pip install .*-e '\.\[([a-z,]+)\]'", makefile)
    assert installs and all("report" in i.split(",") and "dev" in i.split(",") for i in installs)
    dockerfile = (ROOT / "Dockerfile").read_text()
    image_extras = re.findall(r'pip install .*"\.\[([a-z,]+)\]"', dockerfile)
    assert image_extras and not any("report" in e.split(",") for e in image_extras)


def third_party_imports(*folders: str) -> dict[str, set[str]]:
    """Top-level names of every import outside the standard library and the project, by file,
    except those only for type checkers (``if TYPE_CHECKING:``)."""
    ours = {"autoscaler", "providers", "policies", "node_agent"}
    found: dict[str, set[str]] = {}
    for folder in folders:
        for path in sorted((ROOT / folder).rglob("*.py")):
            tree = ast.parse(path.read_text(), str(path))
            typing_only = {
                id(inner)
                for node in ast.walk(tree)
                if isinstance(node, ast.If) and ast.unparse(node.test).endswith("TYPE_CHECKING")
                for inner in ast.walk(node)
            }
            for node in ast.walk(tree):
                if id(node) in typing_only:
                    continue
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                    names = [node.module]
                else:
                    continue
                for name in names:
                    top = name.split(".")[0]
                    if top not in sys.stdlib_module_names and top not in ours:
                        found.setdefault(top, set()).add(str(path.relative_to(ROOT)))
    return found


def with_their_requirements(names: set[str]) -> set[str]:
    """The distributions ``names`` bring along (pydantic brings pydantic-core), as installed."""
    seen: set[str] = set()
    todo = list(names)
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        try:
            requires = importlib.metadata.distribution(name).requires or []
        except importlib.metadata.PackageNotFoundError:
            continue
        todo += requirement_names([r for r in requires if not re.search(r"extra\s*==", r)])
    return seen


def test_the_agent_extra_covers_every_package_the_agent_imports() -> None:
    """The agent is node_agent/ and the model it depends on; what they import must come with
    ``pip install 'hybrid-gpu-autoscaler[agent]'``. tqdm, optional in the model's progress
    helper (a terminal's bar, lines without it), is the one exception the agent never uses."""
    project = PYPROJECT["project"]
    declared = with_their_requirements(
        requirement_names(project["dependencies"])
        | requirement_names(project["optional-dependencies"]["agent"])
    )
    distributions = importlib.metadata.packages_distributions()
    imported = third_party_imports("node_agent", "autoscaler/model")
    imported.pop("tqdm", None)
    missing = {
        module: sorted(files)
        for module, files in imported.items()
        if not {canonical(d) for d in distributions.get(module, [module])} & declared
    }
    assert not missing, f"imported by the agent but not in its install: {missing}"
