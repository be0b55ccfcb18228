"""The trace import boundary (``boundary_trace_import``) under hypothesis (profile ``ci``;
``make fuzz`` runs the ``fuzz`` profile): any sacct output, Prometheus answer or demand CSV,
however damaged, is imported by the rules or refused in one line naming the file and line."""

from __future__ import annotations

import random

from boundary_trace_import import TraceImportBoundary
from harness import assert_held, fuzz_settings
from hypothesis import given
from hypothesis import strategies as st

BOUNDARY = TraceImportBoundary()


def test_every_seed_is_imported() -> None:
    for seed in BOUNDARY.seeds():
        outcome = assert_held(BOUNDARY, seed)
        assert outcome.kind == "accepted", (seed["kind"], outcome.detail)


@fuzz_settings()
@given(st.randoms(use_true_random=False))
def test_the_trace_import_boundary_holds(rng: random.Random) -> None:
    assert_held(BOUNDARY, BOUNDARY.generate(rng))
