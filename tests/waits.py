"""One knob for how long tests wait on real services: ``GPU_AUTOSCALER_TEST_WAIT_SCALE``.

Tests that start Slurm, Prometheus, Redis, PostgreSQL, moto, the cloud emulators or a CLI
process wait on a *condition* (a line printed, a port answering, a job requeued), never on a
fixed sleep. Each wait has a ceiling so that a broken service fails the test instead of hanging
it; the ceiling is generous, and ``bound`` multiplies it by the knob, so a machine slower than
any ceiling anticipated (two busy cores, a fuzzer beside the run, an emulated CPU) is answered
by ``GPU_AUTOSCALER_TEST_WAIT_SCALE=4 make test`` instead of by editing tests. A ceiling only
costs time when the condition never holds, so a large scale slows nothing that passes.

The value must be a positive finite number (default 1.0). A bad one stops the run once, at
configuration time, with one line naming the variable (``pytest_configure`` below: conftest
lists this module as a plugin), instead of a traceback in every test that waits.
"""

from __future__ import annotations

import math
import os

import pytest

VARIABLE = "GPU_AUTOSCALER_TEST_WAIT_SCALE"


class WaitScaleError(ValueError):
    """The knob is set to something that is not a positive finite number."""


def scale() -> float:
    """The factor every ceiling is multiplied by, read from the environment on each call.

    Read each time rather than once at import so a test of the knob can set it with
    ``monkeypatch.setenv`` and so a subprocess inherits whatever the run was started with.
    """
    raw = os.environ.get(VARIABLE, "").strip()
    if not raw:
        return 1.0
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise WaitScaleError(
            f"{VARIABLE}={raw!r}: expected a positive number such as 1 or 2.5 "
            "(how much longer than usual tests may wait on real services)"
        )
    return value


def bound(seconds: float) -> float:
    """The ceiling for a wait on a real service: ``seconds`` times the knob."""
    return seconds * scale()


def pytest_configure(config: pytest.Config) -> None:
    """Refuse a bad knob before any test runs: one line, exit status 4 (usage error)."""
    try:
        scale()
    except WaitScaleError as error:
        raise pytest.UsageError(str(error)) from None
