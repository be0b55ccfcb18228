"""The controller config boundary: fuzzed (``boundary_config``), and each failure issue 15 named
in it as a regression test. ``validate`` accepts exactly what ``run`` and ``plan`` build, and a
mistake is one line naming the file, the line and the field, exit 2."""

from __future__ import annotations

import random
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from boundary_config import BOMB, LOCAL, SECRET, ConfigBoundary, run_cli
from harness import assert_held, fuzz_settings
from hypothesis import given
from hypothesis import strategies as st

from autoscaler.model.config import load_config

BOUNDARY = ConfigBoundary()

AWS = """\
fleet_id: prod
providers:
  aws:
    interruption_queue_url: https://sqs.us-east-1.amazonaws.com/123456789012/notices
  gcp: {project: my-project}
pools:
  - name: gcp-a100
    provider: gcp
    region: us-central1
    zone: us-central1-a
    instance_type: a2-highgpu-1g
    gpus_per_instance: 1
    market: spot
    options: {image: projects/p/global/images/i}
  - name: aws-g5
    provider: aws
    region: us-east-1
    instance_type: g5.xlarge
    gpus_per_instance: 1
    market: spot
    options:
      image_id: ami-0123456789abcdef0
"""


@fuzz_settings()
@given(st.randoms(use_true_random=False))
def test_the_config_boundary_holds(rng: random.Random) -> None:
    assert_held(BOUNDARY, BOUNDARY.generate(rng))


def test_every_seed_is_accepted() -> None:
    for seed in BOUNDARY.seeds():
        outcome = assert_held(BOUNDARY, seed)
        assert outcome.kind == "accepted", outcome.detail


def write(tmp_path: Path, text: str | bytes, name: str = "config.yaml") -> Path:
    path = tmp_path / name
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    return path


def refused(path: Path, *command: str) -> str:
    """The one error line of ``gpu-autoscaler COMMAND`` (``validate FILE`` by default)."""
    run = run_cli(list(command) or ["validate", str(path)])
    assert run.rc == 2, run.err
    lines = run.error_lines
    assert len(lines) == 1, run.err
    return lines[0]


def test_an_alias_bomb_is_refused_at_once(tmp_path: Path) -> None:
    path = write(tmp_path, BOMB)
    line = refused(path)  # after expanding 100,000 values, not the 9**7 it asks for
    assert line.startswith(f"error: {path}:") and "expands to more than 100,000 values" in line


def test_a_recursive_alias_and_an_unknown_tag_are_one_line_each(tmp_path: Path) -> None:
    line = refused(write(tmp_path, "fleet_id: x\npolicy: &p {params: [*p]}\n"))
    assert (
        line == f"error: {tmp_path / 'config.yaml'}:2: an alias refers to a value that contains it"
    )
    line = refused(write(tmp_path, "fleet_id: x\ntick_seconds: !custom 5\n"))
    assert line == (
        f"error: {tmp_path / 'config.yaml'}:2: tick_seconds: the tag '!custom' is not supported"
    )
    line = refused(write(tmp_path, "fleet_id: !!python/object/apply:os.system [date]\n"))
    assert ":1: fleet_id: the tag '!!python/object/apply:os.system' is not supported" in line


def test_merge_keys_are_read_as_yaml_defines_them(tmp_path: Path) -> None:
    text = LOCAL.replace(
        "pools:\n  - name: sim-spot\n",
        "x-spot: &spot {provider: sim, region: us-east-1, market: spot, gpus_per_instance: 1}\n"
        "pools:\n  - name: sim-spot\n    <<: *spot\n",
    ).replace("fleet_id: fuzz", "fleet_id: fuzz\n")
    # the anchor's holder is not a config field: the merge is read, the stray key refused
    line = refused(write(tmp_path, text))
    assert "x-spot: unknown field" in line
    merged = LOCAL.replace(
        "  - name: sim-spot\n    provider: sim\n    region: us-east-1\n",
        "  - &spot\n    name: sim-spot\n    provider: sim\n    region: us-east-1\n",
    ).replace(
        "  - name: sim-od\n    provider: sim\n    region: us-east-1\n",
        "  - <<: *spot\n    name: sim-od\n",
    )
    config = load_config(write(tmp_path, merged))
    od = config.pool("sim-od")
    assert (od.provider, od.region, od.market.value, od.gpus_per_instance) == (
        "sim",
        "us-east-1",
        "on-demand",
        4,
    ), "explicit keys win over merged ones"
    assert od.options == config.pool("sim-spot").options


def test_deep_nesting_and_other_encodings_end_in_one_line(tmp_path: Path) -> None:
    deep = '{"fleet_id": "x", "policy": ' + '{"params": ' * 5000 + "{}" + "}" * 5001
    assert "nested more than 64 levels deep" in refused(write(tmp_path, deep))
    latin = LOCAL.replace("fleet_id: fuzz", "fleet_id: fuzz # é").encode("latin-1")
    assert refused(write(tmp_path, latin)) == f"error: {tmp_path / 'config.yaml'}:1: not UTF-8 text"


@pytest.mark.parametrize(
    ("written", "field"),
    [
        ("tick_seconds: .nan", "tick_seconds: expected a finite number, got '.nan'"),
        ("tick_seconds: 'NaN'", "tick_seconds: input should be greater than 0 (got 'NaN')"),
        ("tick_seconds: '1e999'", "tick_seconds: expected a finite number"),
        ("limits: {max_gpus: 1.0e+16}", "limits.max_gpus: expected a number of at most 1e+15"),
        ("tick_seconds: 1" + "0" * 400, "tick_seconds: expected a number of at most 1e+15"),
        ("tick_seconds: 1.0e+999", "tick_seconds: expected a finite number, got '1.0e+999'"),
    ],
)
def test_numbers_are_finite_and_in_range(tmp_path: Path, written: str, field: str) -> None:
    line = refused(write(tmp_path, LOCAL.replace("tick_seconds: 5", written)))
    assert line.startswith(f"error: {tmp_path / 'config.yaml'}:2: ") and field in line, line


def test_a_queue_url_that_run_would_fail_on_is_refused_by_validate_run_and_plan(
    tmp_path: Path,
) -> None:
    config = "fleet_id: prod\nproviders:\n  aws:\n    interruption_queue_url: URL\n"
    for url in ("https://example.com", "https://sqs.us-east-1.amazonaws.com/q", "sqs"):
        path = write(tmp_path, config.replace("URL", url))
        for command in (["validate", str(path)], ["plan", "--config", str(path)]):
            line = refused(path, *command)
            assert line.startswith(f"error: {path}:4: providers.aws.interruption_queue_url: ")
    path = write(tmp_path, config.replace("URL", "http://localhost:5000/123456789012/notices"))
    line = refused(path)
    assert "the queue's region is not in its URL" in line and line.startswith(f"error: {path}:4:")


@pytest.mark.parametrize(
    ("change", "where"),
    [
        (
            ("image_id: ami", "launch_templat: {name: t}\n      image_id: ami"),
            ":22: pools[1].options.launch_templat: unknown field",
        ),
        (("pools:", "sources: [{kind: kafka}]\npools:"), ":6: sources[0].kind: no source"),
        (
            ("pools:", "sources: [{kind: slurm, settings: {partitons: [gpu]}}]\npools:"),
            ":6: sources[0].settings.partitons: unknown field",
        ),
        (
            ("pools:", "sources: [{kind: prometheus, settings: {url: 'http://p'}}]\npools:"),
            ":6: sources[0].settings.query: required field is missing",
        ),
        (
            ("notices\n", "notices\n    price_tl_s: 5\n"),
            ":5: providers.aws.price_tl_s: unknown field",
        ),
    ],
)
def test_validate_refuses_what_run_refuses_naming_file_line_and_field(
    tmp_path: Path, change: tuple[str, str], where: str
) -> None:
    good = write(tmp_path, AWS)
    assert run_cli(["validate", str(good)]).rc == 0
    path = write(tmp_path, AWS.replace(*change))
    line = refused(path)
    assert line.startswith(f"error: {path}{where}"), line


def test_a_pools_option_error_names_that_pool_among_all_the_configs_pools(tmp_path: Path) -> None:
    # aws-g5 is the config's second pool and the aws provider's first
    path = write(tmp_path, AWS.replace("image_id: ami-0123456789abcdef0", "subnet: s-1"))
    line = refused(path)
    assert line.startswith(f"error: {path}:22: pools[1].options.subnet: unknown field"), line


def test_a_secret_pasted_as_a_variable_name_is_never_echoed(tmp_path: Path) -> None:
    for block in (
        f"inbox: {{token_env: '{SECRET} '}}",
        f"journal: {{postgres_dsn_env: 'postgresql://u:{SECRET}@db/j'}}",
    ):
        path = write(tmp_path, LOCAL.replace("journal: {enabled: false}", block))
        line = refused(path)
        assert SECRET not in line and "the NAME of an environment variable" in line


def test_a_value_with_a_newline_stays_on_one_line(tmp_path: Path) -> None:
    path = write(tmp_path, LOCAL.replace("fleet_id: fuzz", 'fleet_id: "a\\nb"'))
    line = refused(path)
    assert line.startswith(f"error: {path}:1: fleet_id: ") and "'a\\nb'" in line


def test_run_refuses_a_metrics_address_it_cannot_listen_on_in_one_line(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        for host, why in (("no.such.host.invalid", ""), ("127.0.0.1", "in use")):
            path = write(tmp_path, LOCAL + f"metrics: {{listen: {{host: {host}, port: {port}}}}}\n")
            done = subprocess.run(
                [sys.executable, "-m", "autoscaler.cli", "run", "--config", str(path)],
                capture_output=True,
                text=True,
                timeout=120,
                check=False,
            )
            assert done.returncode == 2, done.stderr
            assert done.stderr.startswith(f"error: {path}:38: metrics.listen: cannot listen on")
            assert why in done.stderr and done.stderr.count("\n") == 1
