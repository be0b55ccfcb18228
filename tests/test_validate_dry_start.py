"""``validate`` accepts exactly what ``run`` builds: for every config the fuzz generator of the
config boundary makes (``tests/fuzz/boundary_config.py``), ``gpu-autoscaler validate --config``
and ``gpu-autoscaler run --dry-start --config`` both accept it with the same line, or both
refuse it with exit 2 and the same one-line error naming the file and line."""

from __future__ import annotations

import logging
import random
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).parent / "fuzz"))

from boundary_config import (
    LOCAL,
    CliRun,
    config_seeds,
    error_problem,
    hostile_yaml,
    run_cli,
)
from harness import FUZZ
from waits import bound

from autoscaler.model.errors import InputError
from autoscaler.model.inputfile import read_yaml

SEEDS = config_seeds()


@contextmanager
def logging_kept() -> Iterator[None]:
    """``run`` routes the root logger to its own handler; give pytest's back afterwards."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:
        yield
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)


def both(path: Path) -> tuple[CliRun, CliRun]:
    with logging_kept():
        validated = run_cli(["validate", "--config", str(path)])
        started = run_cli(["run", "--dry-start", "--config", str(path), "--log-level", "ERROR"])
    return validated, started


def is_controller_config(path: Path) -> bool:
    """Whether ``validate`` reads the file as a controller config (not a scenario or a suite,
    which ``run`` never takes); a file that cannot be read counts, both must refuse it."""
    try:
        data = read_yaml(path).data
    except InputError:
        return True
    return not (isinstance(data, dict) and ("controller" in data or "scenarios" in data))


def write(directory: Path, data: str | bytes) -> Path:
    path = directory / "config.yaml"
    if isinstance(data, str):
        path.write_text(data, encoding="utf-8", errors="surrogatepass")
    else:
        path.write_bytes(data)
    return path


def assert_agree(path: Path) -> CliRun:
    validated, started = both(path)
    if not is_controller_config(path):
        assert started.rc == 2 and len(started.error_lines) == 1, started
        return validated
    assert (validated.rc, started.rc) in ((0, 0), (2, 2)), (validated, started)
    if validated.rc == 0:
        assert started.out == validated.out and started.out.count("\n") == 1, (validated, started)
        assert started.err == validated.err  # the same warnings
    else:
        assert started.error_lines == validated.error_lines, (validated, started)
        assert error_problem(started, [str(path)]) is None, started
    return validated


# the fuzz profile's inputs; hangs are the config boundary's test, agreement is this one's
@settings(FUZZ, deadline=None)
@given(st.randoms(use_true_random=False))
def test_validate_and_dry_start_agree_on_every_fuzzed_config(
    tmp_path_factory: pytest.TempPathFactory, rng: random.Random
) -> None:
    directory = tmp_path_factory.mktemp("agree", numbered=True)
    assert_agree(write(directory, hostile_yaml(SEEDS, rng)))


def test_every_seed_is_accepted_by_both(tmp_path: Path) -> None:
    for seed in SEEDS:
        assert assert_agree(write(tmp_path, seed)).rc == 0, seed[:200]


@pytest.mark.parametrize(
    ("change", "where"),
    [
        (
            ("options: {price_per_hour: 0.5,", "options: {price_per_hou: 0.5,"),
            ":20: pools[0].options.price_per_hou: unknown field; expected one of: "
            "on_demand_price_per_hour, price_per_hour",
        ),
        (("kind: static", "kind: kafka"), ":29: sources[0].kind: no source named 'kafka'"),
        (
            (
                "  - kind: static\n    name: demo\n    settings:\n",
                "  - kind: prometheus\n    name: demo\n    settings:\n      url: http://p:9090\n",
            ),
            ":32: sources[0].settings.query: required field is missing",
        ),
        (
            ("journal: {enabled: false}", "journal: {enabled: false}\nx_env: {a_env: 'a b'}"),
            ":38: x_env: unknown field",
        ),
        (
            (
                "    settings:\n      jobs:",
                "    settings:\n      token_env: 'not a name'\n      jobs:",
            ),
            ":32: sources[0].settings.token_env: unknown field",
        ),
    ],
)
def test_the_issues_mistakes_are_one_line_naming_file_line_and_field_from_both(
    tmp_path: Path, change: tuple[str, str], where: str
) -> None:
    path = write(tmp_path, LOCAL.replace(*change))
    validated = assert_agree(path)
    assert validated.rc == 2 and validated.error_lines[0].startswith(f"error: {path}{where}"), (
        validated.err
    )


def test_dry_start_as_a_command_contacts_nothing_and_exits_0(tmp_path: Path) -> None:
    """The installed command: an AWS pool and an SQS source pointed at addresses nothing
    listens on are built, and no client is made."""
    config = LOCAL.replace(
        "pools:\n",
        "pools:\n  - name: aws-g5\n    provider: aws\n    region: us-east-1\n"
        "    instance_type: g5.xlarge\n    gpus_per_instance: 1\n    market: spot\n"
        "    options: {image_id: ami-0123456789abcdef0}\n",
    ).replace(
        "providers:\n",
        "providers:\n  aws: {endpoint_url: 'http://127.0.0.1:9'}\n",
    )
    path = write(tmp_path, config)
    done = subprocess.run(
        [sys.executable, "-m", "autoscaler.cli", "run", "--dry-start", "--config", str(path)],
        capture_output=True,
        text=True,
        timeout=bound(120),
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"{path}: ok: fleet 'fuzz', 3 pools, policy 'cost-aware'\n"


def test_validate_takes_the_file_with_config_as_run_does_or_positionally(tmp_path: Path) -> None:
    path = write(tmp_path, LOCAL)
    ok = f"{path}: ok: fleet 'fuzz', 2 pools, policy 'cost-aware'\n"
    for args in (["--config", str(path)], [str(path)], [str(path), "--config", str(path)]):
        assert run_cli(["validate", *args]).out == ok
    other = tmp_path / "other.yaml"
    refused = run_cli(["validate", str(other), "--config", str(path)])
    assert refused.rc == 2 and refused.err == (
        f"error: validate: two files given ({other} and --config {path}): give one\n"
    )
    refused = run_cli(["validate"])
    assert refused.rc == 2 and "give the file to check: validate --config FILE" in refused.err
