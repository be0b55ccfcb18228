"""Issue 18's Kubernetes boundaries under hypothesis (profile ``ci``; ``make fuzz`` runs the
``fuzz`` profile): pod and node lists as the API server sends them, mutated from realistic
objects, through the source's demand and node readings; and the same lists, or answers that are
no list at all, served over real HTTP to ``KubernetesSource.read`` and ``read_nodes``. Every
input must end in readings that keep the documented rules (checked against an independent
reading: no pending GPU pod goes missing, bounded groups, one-line problems) or in the source's
one-line error naming the call: no traceback, no hang, no silent wrong answer. (The first run
found unreadable digits in a Gt bound or a GPU-memory label, a list as priorityClassName, a
node's metadata that is no object and names that broke problem lines; all fixed, and generated
here like any other input.)"""

from __future__ import annotations

import random
from collections.abc import Iterator

import pytest
from boundary_kubernetes import KubernetesApiBoundary, KubernetesBoundary
from harness import assert_held, fuzz_settings
from hypothesis import given
from hypothesis import strategies as st

BOUNDARY = KubernetesBoundary()


@pytest.fixture(scope="module")
def api() -> Iterator[KubernetesApiBoundary]:
    boundary = KubernetesApiBoundary()
    yield boundary
    boundary.close()


def test_the_realistic_pods_and_nodes_are_read() -> None:
    for seed in BOUNDARY.seeds():
        assert assert_held(BOUNDARY, seed).kind == "accepted", seed[0]


def test_the_realistic_lists_are_read_over_http(api: KubernetesApiBoundary) -> None:
    for seed in api.seeds():
        assert assert_held(api, seed).kind == "accepted"


@fuzz_settings()
@given(rng=st.randoms(use_true_random=False))
def test_any_pods_and_nodes_are_read_by_the_rules_or_refused_in_one_line(
    rng: random.Random,
) -> None:
    assert_held(BOUNDARY, BOUNDARY.generate(rng))


@fuzz_settings()
@given(rng=st.randoms(use_true_random=False))
def test_any_list_answer_is_read_by_the_rules_or_refused_in_one_line_naming_the_call(
    api: KubernetesApiBoundary, rng: random.Random
) -> None:
    assert_held(api, api.generate(rng))
