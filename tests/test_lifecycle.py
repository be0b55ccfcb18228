"""The instance table: allowed moves only, and a faithful mirror of what the clouds list."""

from __future__ import annotations

import pytest

from autoscaler.fleet.instances import ALLOWED, IllegalTransitionError, InstanceTable
from autoscaler.model import Instance, InstanceState

S = InstanceState


def instance(instance_id: str, state: InstanceState = S.PENDING, pool: str = "p") -> Instance:
    return Instance(id=instance_id, pool=pool, state=state, launched_at=0.0, request_id="r", gpus=1)


def test_every_state_but_terminated_can_end_and_terminated_is_final() -> None:
    for state, targets in ALLOWED.items():
        if state is S.TERMINATED:
            assert targets == frozenset()
        else:
            assert S.TERMINATED in targets


def test_illegal_moves_raise_and_history_keeps_every_move() -> None:
    table = InstanceTable()
    record = table.record_launch(instance("i-1"), "aws", now=0.0)
    record.move(S.RUNNING, 10.0, "booted")
    record.move(S.DRAINING, 20.0, "idle")
    with pytest.raises(IllegalTransitionError):
        record.move(S.RUNNING, 30.0)
    assert [h[0] for h in record.history] == [S.PENDING, S.RUNNING, S.DRAINING]
    assert record.drain_started_at == 20.0


def test_sync_follows_the_cloud_adopts_strangers_and_notices_what_vanished() -> None:
    table = InstanceTable(request_timeout_s=600)
    table.record_launch(instance("booting"), "aws", now=0.0)
    table.record_launch(instance("requested", S.REQUESTED), "aws", now=0.0)
    table.record_launch(instance("gone"), "aws", now=0.0)
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
    table.record_launch(instance("i-aws"), "aws", now=0.0)
    table.record_launch(instance("i-gcp"), "gcp", now=0.0)
    report = table.sync(
        [("aws", instance("i-aws", S.RUNNING))], now=5000.0, providers_listed={"aws"}
    )
    assert report.vanished == ()
    assert table.get("i-gcp").state is S.PENDING  # type: ignore[union-attr]


def test_controller_states_are_not_undone_by_a_listing() -> None:
    table = InstanceTable()
    record = table.record_launch(instance("i", S.RUNNING), "aws", now=0.0)
    record.move(S.DRAINING, 1.0)
    table.sync([("aws", instance("i", S.RUNNING))], now=2.0, providers_listed={"aws"})
    assert record.state is S.DRAINING
    table.sync([("aws", instance("i", S.TERMINATED))], now=3.0, providers_listed={"aws"})
    assert record.state is S.TERMINATED


def test_an_instance_adopted_while_shutting_down_holds_no_capacity() -> None:
    table = InstanceTable()
    table.sync([("aws", instance("leaving", S.TERMINATING))], now=0.0, providers_listed={"aws"})
    record = table.get("leaving")
    assert record is not None and record.state is S.TERMINATING and not record.live
