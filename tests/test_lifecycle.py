"""The instance table: allowed moves only, and a faithful mirror of what the clouds list."""

from __future__ import annotations

import contextlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autoscaler.fleet.instances import (
    ALLOWED,
    IllegalTransitionError,
    InstanceRecord,
    InstanceTable,
    Launched,
    Moved,
)
from autoscaler.model import Instance, InstanceState

S = InstanceState


def instance(instance_id: str, state: InstanceState = S.PENDING, pool: str = "p") -> Instance:
    return Instance(id=instance_id, pool=pool, state=state, launched_at=0.0, request_id="r", gpus=1)


def launch(table: InstanceTable, item: Instance, provider: str, now: float) -> InstanceRecord:
    record = table.apply(Launched(item, provider), now)
    assert record is not None
    return record


def test_every_state_but_terminated_can_end_and_terminated_is_final() -> None:
    for state, targets in ALLOWED.items():
        if state is S.TERMINATED:
            assert targets == frozenset()
        else:
            assert S.TERMINATED in targets


def test_illegal_moves_raise_and_history_keeps_every_move() -> None:
    table = InstanceTable()
    record = launch(table, instance("i-1"), "aws", 0.0)
    table.apply(Moved(record.id, S.RUNNING, "booted"), 10.0)
    table.apply(Moved(record.id, S.DRAINING, "idle"), 20.0)
    with pytest.raises(IllegalTransitionError):
        table.apply(Moved(record.id, S.RUNNING, ""), 30.0)
    assert [h[0] for h in record.history] == [S.PENDING, S.RUNNING, S.DRAINING]
    assert record.drain_started_at == 20.0


def test_sync_follows_the_cloud_adopts_strangers_and_notices_what_vanished() -> None:
    table = InstanceTable(request_timeout_s=600)
    launch(table, instance("booting"), "aws", 0.0)
    launch(table, instance("requested", S.REQUESTED), "aws", 0.0)
    launch(table, instance("gone"), "aws", 0.0)
    report = table.sync(
        [("aws", instance("booting", S.RUNNING)), ("aws", instance("adopted", S.RUNNING))],
        now=60.0,
        providers_listed={"aws"},
    )
    assert report.adopted == ("adopted",)
    assert report.vanished == ("gone",)
    assert table.get("booting").state is S.RUNNING  # type: ignore[union-attr]
    assert table.get("requested").state is S.REQUESTED, "still within its request timeout"  # type: ignore[union-attr]
    later = table.sync([], now=700.0, providers_listed={"aws"})
    assert set(later.vanished) == {"booting", "requested", "adopted"}


def test_a_provider_that_failed_to_list_keeps_its_records() -> None:
    table = InstanceTable()
    launch(table, instance("i-aws"), "aws", 0.0)
    launch(table, instance("i-gcp"), "gcp", 0.0)
    report = table.sync(
        [("aws", instance("i-aws", S.RUNNING))], now=5000.0, providers_listed={"aws"}
    )
    assert report.vanished == ()
    assert table.get("i-gcp").state is S.PENDING  # type: ignore[union-attr]


def test_controller_states_are_not_undone_by_a_listing() -> None:
    table = InstanceTable()
    record = launch(table, instance("i", S.RUNNING), "aws", 0.0)
    table.apply(Moved(record.id, S.DRAINING, ""), 1.0)
    table.sync([("aws", instance("i", S.RUNNING))], now=2.0, providers_listed={"aws"})
    assert record.state is S.DRAINING
    table.sync([("aws", instance("i", S.TERMINATED))], now=3.0, providers_listed={"aws"})
    assert record.state is S.TERMINATED


def test_an_instance_adopted_while_shutting_down_holds_no_capacity() -> None:
    table = InstanceTable()
    table.sync([("aws", instance("leaving", S.TERMINATING))], now=0.0, providers_listed={"aws"})
    record = table.get("leaving")
    assert record is not None and record.state is S.TERMINATING and not record.live


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["i-1", "i-2", "i-3"]),
            st.sampled_from(list(S)),
            st.sampled_from(["p", "q"]),
        ),
        max_size=30,
    )
)
def test_the_state_and_pool_indexes_always_agree_with_the_records(
    moves: list[tuple[str, InstanceState, str]],
) -> None:
    """Whatever order of launches, moves (allowed or not) and syncs: ``in_state`` and
    ``live_in_pool`` give exactly what a pass over every record would."""
    table = InstanceTable(keep_terminated_s=0.0)
    for now, (instance_id, state, pool_name) in enumerate(moves):
        if table.get(instance_id) is None:
            table.apply(Launched(instance(instance_id, pool=pool_name), "aws"), float(now))
        else:
            with contextlib.suppress(IllegalTransitionError):
                table.apply(Moved(instance_id, state, "moved"), float(now))
        if now % 7 == 6:
            table.sync([], float(now) + 10.0, providers_listed={"aws"})
    for state in S:
        assert {r.id for r in table.in_state(state)} == {r.id for r in table if r.state is state}
    for pool_name in ("p", "q"):
        expected = {r.id for r in table.live() if r.pool == pool_name}
        assert {r.id for r in table.live_in_pool(pool_name)} == expected
    assert set(table.live_pools()) == {r.pool for r in table.live()}
