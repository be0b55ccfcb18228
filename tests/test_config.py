"""Config files: a good one loads; a bad one gets one line naming file, line, field and what is
allowed, through the library and through ``gpu-autoscaler validate``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from autoscaler.cli import main
from autoscaler.model.config import load_config
from autoscaler.model.errors import InputError

GOOD = """\
fleet_id: prod
tick_seconds: 30
policy:
  name: cost-aware
  params:
    idle_seconds: 300
limits:
  max_instances: 50
  max_cost_per_hour: 120
pools:
  - name: aws-use1-g5-spot
    provider: aws
    region: us-east-1
    instance_type: g5.xlarge
    gpus_per_instance: 1
    market: spot
    options: {image_id: ami-0123456789abcdef0}
  - name: aws-use1-g5-od
    provider: aws
    region: us-east-1
    instance_type: g5.xlarge
    gpus_per_instance: 1
    market: on-demand
    options: {image_id: ami-0123456789abcdef0}
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(text)
    return path


def error_for(tmp_path: Path, text: str) -> InputError:
    with pytest.raises(InputError) as caught:
        load_config(write(tmp_path, text))
    return caught.value


def test_a_good_config_loads(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, GOOD))
    assert config.fleet_id == "prod"
    assert [p.market for p in config.pools] == ["spot", "on-demand"]
    assert config.limits.max_cost_per_hour == 120


def test_bad_enum_names_line_field_and_allowed_values(tmp_path: Path) -> None:
    error = error_for(tmp_path, GOOD.replace("market: spot", "market: spto"))
    assert str(error).startswith(f"{tmp_path / 'config.yaml'}:16: pools[0].market: ")
    assert "'spot' or 'on-demand'" in str(error) and "'spto'" in str(error)


def test_unknown_field_lists_the_allowed_ones(tmp_path: Path) -> None:
    error = error_for(tmp_path, GOOD.replace("  max_instances: 50", "  max_instance: 50"))
    assert ":8: limits.max_instance: unknown field; expected one of:" in str(error)
    assert "max_instances" in str(error)


def test_missing_field_and_wrong_type(tmp_path: Path) -> None:
    error = error_for(
        tmp_path, GOOD.replace("    gpus_per_instance: 1\n    market: spot\n", "    market: spot\n")
    )
    assert "pools[0].gpus_per_instance: required field is missing" in str(error)
    error = error_for(tmp_path, GOOD.replace("max_instances: 50", "max_instances: lots"))
    assert ":8: limits.max_instances:" in str(error) and "'lots'" in str(error)


def test_duplicate_pool_names_and_duplicate_keys(tmp_path: Path) -> None:
    error = error_for(tmp_path, GOOD.replace("aws-use1-g5-od", "aws-use1-g5-spot"))
    assert "used twice" in str(error)
    error = error_for(
        tmp_path, GOOD.replace("tick_seconds: 30", "tick_seconds: 30\ntick_seconds: 5")
    )
    assert ":3:" in str(error) and "given twice" in str(error)


def test_yaml_syntax_error_names_the_line(tmp_path: Path) -> None:
    error = error_for(tmp_path, GOOD.replace("  params:\n", "  params: [\n"))
    assert str(error).startswith(str(tmp_path / "config.yaml") + ":")
    assert "not valid YAML" in str(error)


def test_validate_command_checks_policy_params_too(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["validate", str(write(tmp_path, GOOD))]) == 0
    assert "ok" in capsys.readouterr().out
    bad = write(tmp_path, GOOD.replace("idle_seconds: 300", "idle_seconds: -5"))
    assert main(["validate", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "policy.params.idle_seconds" in err and "greater than or equal to 0" in err
    unknown = write(tmp_path, GOOD.replace("name: cost-aware", "name: cost-awre"))
    assert main(["validate", str(unknown)]) == 2
    assert "no policy named 'cost-awre' is installed" in capsys.readouterr().err


def test_errors_reach_the_user_as_one_line_without_a_traceback(tmp_path: Path) -> None:
    bad = write(tmp_path, GOOD.replace("market: spot", "market: spto"))
    done = subprocess.run(
        [sys.executable, "-m", "autoscaler.cli", "validate", str(bad)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    missing = subprocess.run(
        [sys.executable, "-m", "autoscaler.cli", "validate", "nowhere.yaml"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert missing.returncode == 2 and missing.stderr == "error: nowhere.yaml: no such file\n"
