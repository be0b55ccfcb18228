"""The notice boundaries fuzzed (``boundary_notices``): the inbox over memory and over raw TCP to
a real inbox beside a real run loop, and the clouds' answers (EventBridge bodies, IMDS and Azure
and GCP metadata, SQS batches on moto). The failures issue 15 named here have their own
regression tests: ``tests/test_inbox_hostile.py``, ``tests/test_notice_batch.py``,
``tests/test_notice_wakes.py`` and ``tests/test_notice_parsing.py``."""

from __future__ import annotations

import dataclasses
import logging
import random
from collections.abc import Iterator

import pytest
from boundary_notices import CloudNoticesBoundary, HttpCase, InboxBoundary
from harness import FUZZ, assert_held, fuzz_settings
from hypothesis import given, settings
from hypothesis import strategies as st

INBOX = InboxBoundary()
CLOUD = CloudNoticesBoundary()


@pytest.fixture(scope="module", autouse=True)
def _close_boundaries() -> Iterator[None]:
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    yield
    INBOX.close()
    CLOUD.close()


@fuzz_settings()
@given(st.randoms(use_true_random=False))
def test_the_inbox_holds(rng: random.Random) -> None:
    assert_held(INBOX, INBOX.generate(rng))


@settings(FUZZ, max_examples=max(10, FUZZ.max_examples // 2))
@given(st.randoms(use_true_random=False))
def test_the_inbox_holds_over_raw_tcp_beside_a_run_loop(rng: random.Random) -> None:
    case = INBOX.generate(rng)
    assert isinstance(case, HttpCase)
    assert_held(INBOX, dataclasses.replace(case, tcp=True))


@fuzz_settings()
@given(st.randoms(use_true_random=False))
def test_the_cloud_answers_hold(rng: random.Random) -> None:
    assert_held(CLOUD, CLOUD.generate(rng))


@settings(FUZZ, max_examples=max(4, FUZZ.max_examples // 10))
@given(st.randoms(use_true_random=False))
def test_a_batch_of_nine_malformed_messages_and_one_warning_holds(rng: random.Random) -> None:
    saved, CLOUD.sqs_share = CLOUD.sqs_share, 1.0
    try:
        case = CLOUD.generate(rng)
    finally:
        CLOUD.sqs_share = saved
    assert assert_held(CLOUD, case).kind == "accepted"


@pytest.mark.parametrize("boundary", [INBOX, CLOUD], ids=["inbox", "cloud"])
def test_every_seed_is_accepted(boundary: InboxBoundary | CloudNoticesBoundary) -> None:
    for seed in boundary.seeds():
        outcome = assert_held(boundary, seed)
        assert outcome.kind == "accepted", (seed, outcome.detail)
