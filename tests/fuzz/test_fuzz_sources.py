"""Issue 15's source boundaries under hypothesis (profile ``ci``: a bounded budget; ``make fuzz``
runs the ``fuzz`` profile): Slurm's ``squeue``/``sinfo --json`` through the adapter, and
Prometheus exposition text and API answers over real HTTP. Every input must end in a reading
that keeps the documented rules (checked against an independent reading where one exists) or in
the source's own one-line error: no traceback, no hang, no silent wrong answer."""

from __future__ import annotations

import random
from collections.abc import Iterator

import pytest
from boundary_sources import PrometheusBoundary, SlurmBoundary
from harness import assert_held, fuzz_settings
from hypothesis import given
from hypothesis import strategies as st


@pytest.fixture(scope="module")
def slurm() -> Iterator[SlurmBoundary]:
    boundary = SlurmBoundary()
    yield boundary
    boundary.close()


@pytest.fixture(scope="module")
def prometheus() -> Iterator[PrometheusBoundary]:
    boundary = PrometheusBoundary()
    yield boundary
    boundary.close()


def test_the_captured_slurm_outputs_are_read(slurm: SlurmBoundary) -> None:
    for seed in slurm.seeds():
        assert slurm.check(seed).kind == "accepted", seed[0]


def test_the_captured_exposition_texts_are_read(prometheus: PrometheusBoundary) -> None:
    for seed in prometheus.seeds():
        assert prometheus.check(seed).kind == "accepted"


@fuzz_settings()
@given(rng=st.randoms(use_true_random=False))
def test_any_slurm_output_is_read_by_the_rules_or_refused_in_one_line(
    slurm: SlurmBoundary, rng: random.Random
) -> None:
    assert_held(slurm, slurm.generate(rng))


@fuzz_settings()
@given(rng=st.randoms(use_true_random=False))
def test_any_exposition_or_promql_answer_is_read_by_the_rules_or_refused_in_one_line(
    prometheus: PrometheusBoundary, rng: random.Random
) -> None:
    assert_held(prometheus, prometheus.generate(rng))
