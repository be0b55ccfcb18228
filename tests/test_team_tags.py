"""An instance's team survives a controller's restart, and every launch made for a team's work
has one: each provider tags what it launches with the team (AWS and Azure tags, a GCP label,
the simulator's listing), its listing gives it back, the instance table keeps it on adoption,
the view carries it (``CloudNode.team``) so the replacement bought for work an interruption
notice displaces, and Karpenter's consolidation replacement, are bought for the same team, and
each team's month spend is recovered from the journal (SQLite and PostgreSQL)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from azure_emulator import AzureWorld
from fakes import FakeCloud, FakeNodes, FakeQueue, FakeScheduler, pool
from gcp_emulator import LABEL_VALUE, ComputeEmulator
from hypothesis import given
from hypothesis import strategies as st
from test_aws import FLEET as AWS_FLEET
from test_aws import described, fleet_pool
from test_aws import provider as aws_provider
from test_azure import FLEET as AZURE_FLEET
from test_azure import pool as azure_pool
from test_azure import provider as azure_provider
from test_gcp import FLEET as GCP_FLEET
from test_gcp import gcp_pool, stored
from test_gcp import provider as gcp_provider
from test_peers import mk, node, notice, pv, view

from autoscaler.fleet.instances import InstanceTable, Launched
from autoscaler.fleet.team_spend import TeamSpend
from autoscaler.model import Instance, InstanceState, Job
from autoscaler.model.clock import ManualClock
from autoscaler.model.config import ControllerConfig
from autoscaler.model.teams import TeamsConfig, TeamSpec
from autoscaler.ops.journal.base import Journal, SpendRow, open_postgres, open_sqlite
from autoscaler.spi.provider import TEAM_TAG
from autoscaler.spi.sources import NodeUsage
from autoscaler.tick.controller import Controller
from autoscaler.tick.retry import RetryPolicy
from policies.cost_aware import CostAwareParams, CostAwarePolicy
from policies.karpenter import KarpenterPolicy
from providers.azure.instances import TAG_KEYS
from providers.gcp.instances import (
    LABEL_KEYS,
    TEAM_METADATA_KEY,
    label_value,
    labels_for,
    team_metadata,
    team_of,
)
from providers.sim import LiveSimProvider

# Team names as the config accepts them (model/domain.py Name), up to its 128 characters.
CONFIG_TEAM = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}", fullmatch=True)
# What a scheduler may name a team the config does not list: any text up to 253 characters
# without control characters (the sources' rule).
ANY_TEAM = st.text(
    st.characters(blacklist_categories=("Cc", "Cs")), min_size=1, max_size=253
).filter(lambda t: t.strip() == t and t != "")
LONG_TEAM = "research-" + "x" * 119  # 128 characters: its GCP label is a hash


# -- the tag round-trips ----------------------------------------------------------------------


@given(st.one_of(CONFIG_TEAM, ANY_TEAM))
def test_a_gcp_team_label_is_valid_and_gives_the_team_back(team: str) -> None:
    labels = labels_for({TEAM_TAG: team})
    assert LABEL_VALUE.match(labels[LABEL_KEYS[TEAM_TAG]]), "a label value GCP accepts"
    metadata = {item["key"]: item["value"] for item in team_metadata(team)}
    assert team_of(labels, metadata) == team
    if "__" not in label_value(team):
        assert metadata == {}, "the label says it all: no metadata item"


def test_a_gcp_vm_with_no_team_label_or_a_hashed_one_without_its_item_has_no_team() -> None:
    assert team_of({}, {}) is None
    assert team_of(labels_for({TEAM_TAG: LONG_TEAM}), {}) is None, "never the hash as a name"


# -- each cloud tags at launch and lists it back ----------------------------------------------


def test_aws_tags_the_team_at_launch_and_a_fresh_provider_lists_it_back(aws: str) -> None:
    spot = fleet_pool()
    cloud = aws_provider(aws, [spot])
    bought = cloud.launch(spot, 2, "req-team", AWS_FLEET, team="ml.vision:a-1")
    plain = cloud.launch(spot, 1, "req-none", AWS_FLEET)
    assert {i.team for i in bought.instances} == {"ml.vision:a-1"}
    assert {i.team for i in plain.instances} == {None}
    tags = {
        raw["InstanceId"]: {t["Key"]: t["Value"] for t in raw.get("Tags", [])}
        for raw in described(aws)
    }
    assert {tags[i.id][TEAM_TAG] for i in bought.instances} == {"ml.vision:a-1"}
    assert all(TEAM_TAG not in tags[i.id] for i in plain.instances), "no team, no tag"
    restarted = aws_provider(aws, [spot])  # remembers nothing of the launches
    listed = {i.id: i.team for i in restarted.list_instances(AWS_FLEET)}
    expected = {i.id: "ml.vision:a-1" for i in bought.instances} | {
        i.id: None for i in plain.instances
    }
    assert listed == expected
    # the DescribeInstances path (an instance the tags and states cannot describe) agrees
    raw = next(r for r in described(aws) if r["InstanceId"] == bought.instances[0].id)
    assert restarted.instances.instance(raw, raw["Placement"]["AvailabilityZone"][:-1]).team == (
        "ml.vision:a-1"
    )


def test_aws_a_repeated_launch_returns_the_teams_instances(aws: str) -> None:
    spot = fleet_pool()
    cloud = aws_provider(aws, [spot])
    first = cloud.launch(spot, 1, "req-again", AWS_FLEET, team="serving")
    again = aws_provider(aws, [spot]).launch(spot, 1, "req-again", AWS_FLEET, team="serving")
    assert again.already_existed and [i.team for i in again.instances] == ["serving"]
    assert [i.id for i in again.instances] == [i.id for i in first.instances]


@pytest.mark.parametrize("team", ["serving", "Team A", LONG_TEAM])
def test_gcp_labels_the_team_at_launch_and_a_fresh_provider_lists_it_back(
    gcp: ComputeEmulator, team: str
) -> None:
    spot = gcp_pool()
    cloud = gcp_provider(gcp, [spot])
    bought = cloud.launch(spot, 2, "req-team", GCP_FLEET, team=team)
    plain = cloud.launch(spot, 1, "req-none", GCP_FLEET)
    assert {i.team for i in bought.instances} == {team}
    for instance in bought.instances:
        vm = stored(gcp, instance.id)
        assert vm["labels"][LABEL_KEYS[TEAM_TAG]] == label_value(team)
        items = {i["key"]: i["value"] for i in (vm.get("metadata") or {}).get("items", [])}
        assert items.get(TEAM_METADATA_KEY) == (team if "__" in label_value(team) else None)
    for instance in plain.instances:
        assert LABEL_KEYS[TEAM_TAG] not in stored(gcp, instance.id)["labels"]
    listed = {i.id: i.team for i in gcp_provider(gcp, [spot]).list_instances(GCP_FLEET)}
    assert listed == {i.id: team for i in bought.instances} | {i.id: None for i in plain.instances}


@pytest.mark.parametrize("team", ["serving", "Team A", LONG_TEAM])
def test_azure_tags_the_team_at_launch_and_a_fresh_provider_lists_it_back(
    azure_world: AzureWorld, team: str
) -> None:
    spot = azure_pool()
    cloud = azure_provider(azure_world, [spot])
    bought = cloud.launch(spot, 2, "req-team", AZURE_FLEET, team=team)
    plain = cloud.launch(spot, 1, "req-none", AZURE_FLEET)
    assert {i.team for i in bought.instances} == {team}
    emulator = azure_world.emulator
    for instance in bought.instances:
        vm = emulator.vm(instance.id)
        assert vm is not None and vm.body["tags"][TAG_KEYS[TEAM_TAG]] == team
    for instance in plain.instances:
        vm = emulator.vm(instance.id)
        assert vm is not None and TAG_KEYS[TEAM_TAG] not in vm.body["tags"]
    listed = {i.id: i.team for i in azure_provider(azure_world, [spot]).list_instances(AZURE_FLEET)}
    assert listed == {i.id: team for i in bought.instances} | {i.id: None for i in plain.instances}


def test_the_simulated_cloud_lists_the_team_of_each_launch_and_gang() -> None:
    pools = [pool("s", provider="sim")]
    cloud = LiveSimProvider.from_config({"prices": {"s": 1.0}}, pools, "f", ManualClock(0.0))
    one = cloud.launch(pools[0], 1, "r-1", "f", team="ml")
    gang = cloud.launch_gang(pools[0], 2, "r-2", "f", team="web")
    plain = cloud.launch(pools[0], 1, "r-3", "f")
    expected = (
        {i.id: "ml" for i in one.instances}
        | {i.id: "web" for i in gang.instances}
        | {i.id: None for i in plain.instances}
    )
    assert {i.id: i.team for i in cloud.list_instances("f")} == expected


# -- the table, the view, the replacements ----------------------------------------------------


def instance(instance_id: str, team: str | None) -> Instance:
    return Instance(
        id=instance_id,
        pool="a",
        state=InstanceState.RUNNING,
        launched_at=0.0,
        request_id="r",
        gpus=1,
        team=team,
    )


def test_adoption_keeps_the_team_the_listing_names_and_a_launch_record_wins() -> None:
    table = InstanceTable()
    table.sync([("fake", instance("i-a", "ml")), ("fake", instance("i-n", None))], 1.0, {"fake"})
    assert table.teams() == {"i-a": "ml", "i-n": None}
    launched = InstanceTable()
    launched.apply(Launched(instance("i-b", None), "fake", team="web"), 1.0)
    launched.sync([("fake", instance("i-b", None))], 2.0, {"fake"})
    assert launched.teams() == {"i-b": "web"}


@pytest.mark.parametrize(
    "policy",
    [CostAwarePolicy, KarpenterPolicy],
    ids=["cost-aware", "karpenter"],
)
def test_work_a_notice_displaces_is_replaced_for_the_team_of_its_node(policy: type) -> None:
    a, b = pv(mk("a"), 1.0), pv(mk("b"), 1.1)
    busy = node("i-1", "a", allocated=1).model_copy(update={"team": "ml"})
    other = node("i-2", "a", allocated=1).model_copy(update={"team": None})
    plan = policy().decide(
        view([a, b], instances=[busy, other], notices=[notice("i-1", "a"), notice("i-2", "a")])
    )
    teams = sorted((launch.team or "", launch.count) for launch in plan.launches)
    assert teams == [("", 1), ("ml", 1)], "one launch per team, each the size of its work"


def test_karpenters_consolidation_replacement_is_bought_for_the_replaced_nodes_team() -> None:
    od8 = pv(mk("od8", gpus=8, market="on-demand"), 8.0)
    spot1 = pv(mk("spot1", gpus=1), 0.5)
    under = node("under", "od8", gpus=8, allocated=1, underused_for=60, checkpoint=True)
    plan = KarpenterPolicy().decide(
        view([od8, spot1], instances=[under.model_copy(update={"team": "research"})])
    )
    assert [(launch.pool, launch.team) for launch in plan.launches] == [("spot1", "research")]


# -- a restart on the same cloud and journal --------------------------------------------------

T0 = 1_700_000_000.0  # mid-November 2023
PRICE = 2.0
HOUR = 3600.0


@pytest.fixture(params=["sqlite", "postgres"])
def journal_opener(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[[], Journal]:
    """Opens the same journal again, as a restarted controller does."""
    if request.param == "sqlite":
        path = tmp_path / "journal.db"
        return lambda: open_sqlite(path)
    dsn = request.getfixturevalue("postgres_dsn")
    return lambda: open_postgres(dsn)


def controller(
    cloud: FakeCloud,
    clock: ManualClock,
    journal: Journal | None,
    queue: FakeQueue,
    nodes: FakeNodes,
    incarnation: str,
) -> Controller:
    config = ControllerConfig(
        fleet_id="test",
        pools=(pool("a"), pool("b")),
        registration_timeout_s=None,
        teams=TeamsConfig(teams={"ml": TeamSpec(monthly_budget_usd=10_000.0), "web": TeamSpec()}),
    )
    return Controller(
        config,
        CostAwarePolicy(CostAwareParams(idle_seconds=10**9)),
        {"fake": cloud},
        clock,
        [queue],
        nodes,
        FakeScheduler(),
        incarnation=incarnation,
        retry=RetryPolicy(attempts=1, sleep=lambda _s: None),
        journal=journal,
    )


def team_job(job_id: str, team: str) -> Job:
    return Job(id=job_id, gpus=1, submit_time=T0, checkpoint_interval_s=1800.0, team=team)


@pytest.fixture
def world() -> Iterator[tuple[FakeCloud, ManualClock, FakeQueue, FakeNodes]]:
    clock = ManualClock(T0)
    cloud = FakeCloud("fake", price_table={"a": PRICE, "b": PRICE}, now=clock.now)
    yield cloud, clock, FakeQueue(), FakeNodes()


def bought(
    world: tuple[FakeCloud, ManualClock, FakeQueue, FakeNodes], journal: Journal | None
) -> Controller:
    """A controller that bought one instance for ``ml`` and one for ``web``, booted and busy
    for three hours of ticks."""
    cloud, clock, queue, nodes = world
    first = controller(cloud, clock, journal, queue, nodes, "one")
    queue.jobs = [team_job("x", "ml"), team_job("y", "web")]
    first.tick()
    assert sorted(i.team or "" for i in cloud.instances.values()) == ["ml", "web"]
    cloud.boot_all()
    queue.jobs = []
    nodes.cloud = {i: NodeUsage(1, 90.0) for i in cloud.instances}
    for _ in range(18):
        clock.advance(600)
        report = first.tick()
        assert not report.errors and not report.actions, report.errors
    return first


def test_a_restarted_controller_knows_each_instances_team_and_each_teams_month(
    world: tuple[FakeCloud, ManualClock, FakeQueue, FakeNodes],
    journal_opener: Callable[[], Journal],
) -> None:
    cloud, clock, queue, nodes = world
    journal = journal_opener()
    first = bought(world, journal)
    before = first.fleet.team_spend.month(clock.now())
    assert before is not None and before["ml"] == pytest.approx(PRICE * 3, rel=0.02)
    owners = first.fleet.table.teams()
    journal.close()

    again = journal_opener()
    second = controller(cloud, clock, again, queue, nodes, "two")
    report = second.tick()
    assert not report.errors and not report.actions, report.errors
    assert second.fleet.table.teams() == owners, "adopted with the team its tag names"
    after = second.fleet.team_spend.month(clock.now())
    assert after == pytest.approx(before), "each team's month, read back from the journal"
    clock.advance(HOUR)
    second.tick()
    later = second.fleet.team_spend.month(clock.now())
    assert later is not None
    assert later == pytest.approx({t: usd + PRICE for t, usd in before.items()}), (
        "charged on from where the journal left off, never twice"
    )
    again.close()


def test_without_a_journal_a_restart_charges_the_live_instances_from_their_launch(
    world: tuple[FakeCloud, ManualClock, FakeQueue, FakeNodes],
) -> None:
    cloud, clock, queue, nodes = world
    first = bought(world, None)
    second = controller(cloud, clock, None, queue, nodes, "two")
    second.tick()
    assert second.fleet.table.teams() == first.fleet.table.teams()
    assert second.fleet.team_spend.month(clock.now()) == pytest.approx(
        first.fleet.team_spend.month(clock.now())
    ), "each tagged instance is charged from its launch: what it has cost this month"


def row(instance_id: str, usd: float, last_at: float, month: str = "2023-11") -> SpendRow:
    return SpendRow(instance_id, month, "fake", "a", 1, T0 - HOUR, last_at, usd, 1.0)


def test_recovered_spend_counts_once_a_team_is_known_and_never_another_months() -> None:
    spend = TeamSpend()
    assert spend.wants_journal(T0)
    spend.recover(None, T0)
    assert spend.month(T0) is None and spend.wants_journal(T0), "unknown until read"
    rows = [row("i-ml", 5.0, T0), row("i-late", 3.0, T0), row("i-old", 9.0, T0, "2023-10")]
    spend.recover(rows, T0)
    assert not spend.wants_journal(T0)
    empty = view([pv(mk("a"), PRICE)])
    spend.accrue(empty.model_copy(update={"now": T0}), {"i-ml": "ml", "i-none": None})
    assert spend.month(T0) == {"ml": pytest.approx(5.0)}
    # a cloud that failed to list comes back: its instance's journaled month counts then
    spend.accrue(empty.model_copy(update={"now": T0 + 60}), {"i-ml": "ml", "i-late": "web"})
    assert spend.month(T0 + 60) == {"ml": pytest.approx(5.0), "web": pytest.approx(3.0)}
