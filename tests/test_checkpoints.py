"""The checkpoint ledger: what an interruption is weighed against."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from autoscaler.fleet.checkpoints import RECENT_REPORTS, CheckpointLedger, CheckpointReport


def test_a_job_that_never_reported_falls_back_to_what_it_declared() -> None:
    ledger = CheckpointLedger()
    assert ledger.last("7") is None
    assert ledger.expected_duration("7") is None
    assert ledger.expected_duration("7", declared=30.0) == 30.0
    ledger.record(CheckpointReport("7", at=100.0, duration_s=12.0))
    assert ledger.expected_duration("7", declared=30.0) == 12.0, "measured beats declared"


def test_forgotten_jobs_leave_the_ledger() -> None:
    ledger = CheckpointLedger()
    ledger.record(CheckpointReport("1", 1.0, 1.0))
    ledger.record(CheckpointReport("2", 1.0, 1.0))
    ledger.forget({"1", "3"})
    assert ledger.known() == {"2"}


reports = st.lists(
    st.tuples(
        st.sampled_from(["a", "b", "c"]),
        st.floats(min_value=0, max_value=1e6),
        st.floats(min_value=0, max_value=600),
    ),
    max_size=40,
)


@given(reports)
def test_last_is_the_latest_report_and_duration_the_worst_recent_one(
    rows: list[tuple[str, float, float]],
) -> None:
    ledger = CheckpointLedger()
    for job, at, duration in rows:
        ledger.record(CheckpointReport(job, at, duration))
    for job in {r[0] for r in rows}:
        mine = [r for r in rows if r[0] == job]
        assert ledger.last(job) == max(at for _, at, _ in mine)
        assert ledger.expected_duration(job) == max(d for _, _, d in mine[-RECENT_REPORTS:])
    assert ledger.reports == len(rows)


def test_jobs_silent_for_longer_than_keep_s_leave_the_ledger() -> None:
    ledger = CheckpointLedger(keep_s=100.0)
    ledger.record(CheckpointReport(job_id="old", at=0.0, duration_s=5.0))
    ledger.record(CheckpointReport(job_id="busy", at=0.0, duration_s=5.0))
    ledger.record(CheckpointReport(job_id="busy", at=150.0, duration_s=5.0))
    assert ledger.expire(now=160.0) == 1
    assert ledger.known() == {"busy"}
    assert ledger.resume_point("old", started_at=20.0) == 20.0, "no checkpoint: its start"
    assert ledger.expected_duration("old", declared=30.0) == 30.0
