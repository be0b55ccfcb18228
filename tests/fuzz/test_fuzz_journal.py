"""The journal boundaries fuzzed (``boundary_journal``): a damaged, read-only or foreign journal
is refused with one line or read right, never a traceback or a figure made of garbage, and
damage done while the controller runs is noticed or found at the restart, never a silent loss.
The regression tests of each failure issue 15 named are in tests/test_journal_damage.py."""

from __future__ import annotations

import random

import pytest
from boundary_journal import (
    BOUNDARIES,
    Damage,
    MidRun,
    MidRunJournalBoundary,
    ReportInput,
    ReportJournalBoundary,
    RunJournalBoundary,
)
from harness import Boundary, assert_held, fuzz_settings
from hypothesis import given
from hypothesis import strategies as st

REPORT = ReportJournalBoundary()
RUN = RunJournalBoundary()
MID_RUN = MidRunJournalBoundary()


@fuzz_settings()
@given(st.randoms(use_true_random=False))
def test_report_on_a_damaged_journal_holds(rng: random.Random) -> None:
    assert_held(REPORT, REPORT.generate(rng))


@fuzz_settings()
@given(st.randoms(use_true_random=False))
def test_run_on_a_damaged_journal_holds(rng: random.Random) -> None:
    assert_held(RUN, RUN.generate(rng))


@fuzz_settings()
@given(st.randoms(use_true_random=False))
def test_damage_while_running_is_noticed_or_found(rng: random.Random) -> None:
    assert_held(MID_RUN, MID_RUN.generate(rng))


@pytest.mark.parametrize("boundary", BOUNDARIES, ids=lambda b: b.name)
def test_every_seed_is_accepted(boundary: Boundary) -> None:
    for seed in boundary.seeds():
        outcome = assert_held(boundary, seed)
        assert outcome.kind == "accepted", outcome.detail


@pytest.mark.parametrize(
    ("damage", "run_refuses"),
    [
        (Damage("cell", "instance_costs", "usd", None, "abc"), True),
        (Damage("cell", "instance_costs", "usd", None, "NaN"), True),
        (Damage("cell", "ticks", "at", None, 1e300), False),
        (Damage("meta", value="abc", how="set"), True),
        (Damage("bytes", how="garbage", at=0.5, seed=1), True),
        # bits flipped in the schema: SQLite's own error message is not UTF-8
        (Damage("bytes", how="flip", at=0.6056905620512711, count=54, seed=1069691222), True),
    ],
    ids=["text-usd", "nan-usd", "tick-1e300", "schema-abc", "garbage", "undecodable"],
)
def test_the_issues_journals_are_refused_by_report_and_by_run_where_it_reads(
    damage: Damage, run_refuses: bool
) -> None:
    """``report`` reads every row; ``run`` reads the schema, this month's cost rows and the
    calls cut short, so an old tick's garbage time does not stop the controller (the tick it
    writes next is journaled cleanly, which the boundary checks) while ``report`` names it."""
    for full_cli in (False, True):
        assert assert_held(REPORT, ReportInput(damage, full_cli)).kind == "rejected"
    assert assert_held(RUN, damage).kind == ("rejected" if run_refuses else "accepted")


@pytest.mark.parametrize("harm", ["delete", "replace", "overwrite"])
def test_a_journal_deleted_or_overwritten_mid_run_is_noticed(harm: str) -> None:
    outcome = assert_held(MID_RUN, MidRun(harm))
    assert outcome.kind == "rejected" and "while the controller ran" in outcome.detail
