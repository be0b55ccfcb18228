"""The example policy plugin works the way a user would use it: installed as a package, found
through its entry point, configured by name with validated params, and replayed offline.

The example is built and installed into a temporary folder (no network, nothing added to this
environment) and every check runs in a subprocess with that folder on ``PYTHONPATH``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from waits import bound

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "gpu-autoscaler-policy-example"
BUILT_INS = ("cost-aware", "cheapest-spot", "on-demand")


@pytest.fixture(scope="module")
def copied(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the example, so building it leaves no build/ or egg-info in the repository."""
    target = tmp_path_factory.mktemp("example") / EXAMPLE.name
    shutil.copytree(
        EXAMPLE,
        target,
        ignore=shutil.ignore_patterns(
            "build", "dist", "*.egg-info", "__pycache__", ".pytest_cache", ".mypy_cache"
        ),
    )
    return target


@pytest.fixture(scope="module")
def site(copied: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The example installed as a user would, into a folder of its own."""
    target = tmp_path_factory.mktemp("site")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "--target",
            str(target),
            str(copied),
        ],
        check=True,
        timeout=bound(120),
    )
    return target


def run(
    args: list[str], site: Path | None, cwd: Path, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if site is not None:
        env["PYTHONPATH"] = str(site)
    return subprocess.run(
        [sys.executable, *args],
        check=False,
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=bound(timeout),
    )


def run_python(code: str, site: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    return run(["-c", code], site, cwd)


def listed(output: str) -> dict[str, list[str]]:
    """``gpu-autoscaler policies`` output: each policy's name and its indented param lines."""
    found: dict[str, list[str]] = {}
    current: list[str] = []
    for line in output.splitlines():
        if line and not line.startswith(" "):
            current = found.setdefault(line.split()[0], [])
        elif line.strip():
            current.append(line.strip())
    return found


def test_installed_plugin_is_listed_with_its_params(site: Path, tmp_path: Path) -> None:
    done = run(["-m", "autoscaler.cli", "policies"], site, tmp_path)
    assert done.returncode == 0, done.stderr
    policies = listed(done.stdout)
    assert set(BUILT_INS) <= set(policies)
    assert "keep-warm" in policies
    header = next(line for line in done.stdout.splitlines() if line.startswith("keep-warm"))
    assert "gpu-autoscaler-policy-example" in header
    assert "gpu_autoscaler_keep_warm:KeepWarmPolicy" in header
    assert any(line.startswith("warm_gpus = 8") for line in policies["keep-warm"])
    assert any(line.startswith("inner.idle_seconds = ") for line in policies["keep-warm"])


def test_without_the_plugin_on_the_path_it_is_not_listed(tmp_path: Path) -> None:
    done = run(["-m", "autoscaler.cli", "policies"], None, tmp_path)
    assert done.returncode == 0, done.stderr
    policies = listed(done.stdout)
    assert set(BUILT_INS) <= set(policies)
    assert "keep-warm" not in policies


REPLAY_BY_NAME = """
import json
from autoscaler.spi.policy import load_policy
from autoscaler.sim import default_scenario_path, load_scenario, prepare, replay
from autoscaler.sim.scenario import LoadedScenario

policy = load_policy("keep-warm", {"warm_gpus": 4, "inner": {"idle_seconds": 300}})
loaded = load_scenario(default_scenario_path())
scenario = loaded.scenario
trace = scenario.trace.model_copy(update={"busiest_days": 1})
shorter = LoadedScenario(scenario.model_copy(update={"trace": trace}), loaded.base, loaded.source)
prepared = prepare(shorter)
results = {
    "cost-aware": replay(prepared, "cost-aware"),
    "keep-warm-0": replay(prepared, "keep-warm", {"warm_gpus": 0}),
    "keep-warm-4": replay(prepared, "keep-warm", {"warm_gpus": 4}),
}
print(json.dumps({
    "class": type(policy).__name__,
    "warm_gpus": policy.params.warm_gpus,
    "inner_idle_seconds": policy.params.inner.idle_seconds,
    "results": {
        key: {
            "policy": r.policy,
            "cost": r.cost,
            "waits_s": r.waits_s,
            "jobs_total": r.jobs_total,
            "jobs_finished": r.jobs_finished,
            "min_cloud_gpus": min(r.timeline.cloud_gpus),
            "held_ticks": r.held_ticks,
        }
        for key, r in results.items()
    },
}))
"""


def test_loaded_by_name_and_replayed_by_name(site: Path, tmp_path: Path) -> None:
    done = run_python(REPLAY_BY_NAME, site, tmp_path)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["class"] == "KeepWarmPolicy"
    assert out["warm_gpus"] == 4
    assert out["inner_idle_seconds"] == 300

    base, transparent, warm = (
        out["results"][k] for k in ("cost-aware", "keep-warm-0", "keep-warm-4")
    )
    assert transparent["policy"] == warm["policy"] == "keep-warm"
    # With no warm pool the plugin is exactly the policy it wraps: the same replay, to the cent.
    assert transparent["cost"] == base["cost"]
    assert transparent["waits_s"] == base["waits_s"]
    # With one, 4 spot GPUs are up all along, at a price, and the work gets done.
    assert warm["min_cloud_gpus"] >= 4
    assert warm["cost"] > base["cost"]
    assert warm["jobs_total"] == base["jobs_total"] > 0
    assert warm["jobs_finished"] >= base["jobs_finished"] > 0
    assert warm["held_ticks"] == 0  # the controller never had to reject one of its plans


BAD_PARAMS = """
from autoscaler.model.errors import InputError
from autoscaler.spi.policy import load_policy

for params in ({"warm_gpus": -1}, {"warm_gpu": 4}, {"inner": {"idle_seconds": "soon"}}):
    try:
        load_policy("keep-warm", params)
    except InputError as exc:
        print(exc)
    else:
        print("accepted", params)
"""


def test_bad_params_through_the_registry_name_the_field(site: Path, tmp_path: Path) -> None:
    done = run_python(BAD_PARAMS, site, tmp_path)
    assert done.returncode == 0, done.stderr
    negative, typo, nested = done.stdout.strip().splitlines()
    assert "policy.params.warm_gpus:" in negative
    assert "greater than or equal to 0" in negative
    assert "(got -1)" in negative
    assert "policy.params.warm_gpu:" in typo
    assert "policy.params.inner.idle_seconds:" in nested


def test_the_examples_own_tests_pass(site: Path, copied: Path) -> None:
    done = run(
        ["-m", "pytest", "-q", "-p", "no:cacheprovider", str(copied / "tests")],
        site,
        copied,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert " passed" in done.stdout


def test_the_readmes_snippet_prints_what_the_readme_says(site: Path, tmp_path: Path) -> None:
    """The README's offline-test snippet, run as a user would copy it, prints the line the
    README quotes: the figures there cannot drift from what the code does."""
    readme = (EXAMPLE / "README.md").read_text()
    section = readme.split("## Test it offline", 1)[1]
    snippet = section.split("```python\n", 1)[1].split("```", 1)[0]
    quoted = section.split("which prints `", 1)[1].split("`", 1)[0]
    done = run(["-c", snippet], site, tmp_path, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == quoted
