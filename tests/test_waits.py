"""The wait knob: ceilings scale with GPU_AUTOSCALER_TEST_WAIT_SCALE; a bad value is one line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from waits import VARIABLE, WaitScaleError, bound, scale

ROOT = Path(__file__).resolve().parent.parent


def test_unset_or_blank_is_one(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(VARIABLE, raising=False)
    assert scale() == 1.0
    assert bound(30) == 30
    monkeypatch.setenv(VARIABLE, "  ")
    assert bound(30) == 30


@given(factor=st.floats(min_value=0.01, max_value=1000), seconds=st.floats(0, 3600))
def test_bound_is_the_ceiling_times_the_knob(factor: float, seconds: float) -> None:
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(VARIABLE, repr(factor))
        assert bound(seconds) == pytest.approx(seconds * factor)


@pytest.mark.parametrize("raw", ["abc", "0", "-2", "nan", "inf", "1,5", "2s"])
def test_a_bad_value_names_the_variable(monkeypatch: pytest.MonkeyPatch, raw: str) -> None:
    monkeypatch.setenv(VARIABLE, raw)
    with pytest.raises(WaitScaleError, match=rf"^{VARIABLE}=.*expected a positive number"):
        bound(10)


def test_a_bad_value_stops_the_run_with_one_line(tmp_path: Path) -> None:
    """Through pytest itself: exit status 4 (usage error), one line, no traceback, no test run."""
    env = {**os.environ, VARIABLE: "fast"}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-n",
            "0",
            "--collect-only",
            str(ROOT / "tests" / "test_waits.py"),
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=bound(120),
        check=False,
    )
    output = (done.stdout + done.stderr).strip()
    assert done.returncode == pytest.ExitCode.USAGE_ERROR, output
    assert output.splitlines() == [
        f"ERROR: {VARIABLE}='fast': expected a positive number such as 1 or 2.5 "
        "(how much longer than usual tests may wait on real services)"
    ]
