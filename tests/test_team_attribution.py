"""Who pays for what: each pool's bill split between the teams whose jobs held its GPUs, idle
time its own line, in whole cents that add up to the bill exactly; and a replay of jobs of
several teams, whose report gives each team its waits, GPU-hours and share."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from test_sim_engine import job_row, small_scenario

from autoscaler.fleet.attribution import IDLE, apportion, bill, cents
from autoscaler.model.sharing import GpuSharing
from autoscaler.model.teams import TeamsConfig, TeamSpec
from autoscaler.report.build import build_report
from autoscaler.report.render import render_markdown
from autoscaler.sim.engine import Shortfall, count_short, prepare, simulate
from autoscaler.sim.scenario import OnPremNodeSpec, load_scenario
from autoscaler.sim.scheduler import ONPREM_PLACE
from autoscaler.sim.static_pools import replay_static_pools, slices

TEAMS = ["a", "b", "c", "unassigned"]
POOLS = ["spot-1", "spot-2", "od"]


@given(
    st.integers(0, 10**9),
    st.dictionaries(st.sampled_from([*TEAMS, IDLE]), st.floats(0, 1e9), max_size=5),
)
def test_apportion_gives_every_cent_and_follows_the_weights(
    total: int, weights: dict[str, float]
) -> None:
    shares = apportion(total, weights)
    assert sum(shares.values()) == total
    assert all(v >= 0 for v in shares.values())
    whole = sum(w for w in weights.values() if w > 0)
    for key, weight in weights.items():
        if whole > 0:  # within one cent of the exact share
            assert abs(shares[key] - total * weight / whole) < 1 + 1e-6 * total


held_strategy = st.dictionaries(
    st.tuples(st.sampled_from(TEAMS), st.sampled_from([*POOLS, ONPREM_PLACE])),
    st.floats(0, 1e7),
    max_size=12,
)


@given(
    st.dictionaries(st.sampled_from(POOLS), st.floats(0, 1e6), min_size=1),
    st.dictionaries(st.sampled_from(POOLS), st.floats(0, 2e7)),
    held_strategy,
)
def test_the_teams_lines_add_up_to_every_pools_bill_to_the_cent(
    cost: dict[str, float], paid: dict[str, float], held: dict[tuple[str, str], float]
) -> None:
    billed = bill(cost, paid, held)
    for pool, dollars in cost.items():
        split = sum(billed.cents.get(team, {}).get(pool, 0) for team in billed.teams)
        assert split == cents(dollars)
    assert sum(billed.team_cents(team) for team in billed.teams) == sum(
        cents(c) for c in cost.values()
    )
    for team in {t for t, _ in held}:
        assert billed.team_gpu_s(team) == sum(v for (t, _), v in held.items() if t == team)
    for pool, paid_s in paid.items():
        used = sum(v for (_, p), v in held.items() if p == pool)
        assert billed.team_gpu_s(IDLE, pool) == max(0.0, paid_s - used)


def test_a_team_that_held_no_cloud_gpu_pays_nothing_and_idle_pays_the_rest() -> None:
    billed = bill(
        {"spot-1": 10.0},
        {"spot-1": 4 * 3600.0},
        {("a", "spot-1"): 3600.0, ("b", ONPREM_PLACE): 7200.0},
    )
    assert billed.cents == {"a": {"spot-1": 250}, IDLE: {"spot-1": 750}}
    assert billed.team_gpu_s("b", ONPREM_PLACE) == 7200.0 and billed.team_cents("b") == 0
    assert billed.teams == ["a", "b", IDLE]


TEAM_RULES = """
teams:
  rules:
    - {team: serving, match: {priority_class: [LS]}}
    - {team: research, match: {priority_class: [BE]}}
"""


def test_a_replay_of_two_teams_bills_each_and_the_report_adds_up(tmp_path: Path) -> None:
    jobs = [job_row(f"be{i}", 60 * i, 3600, preemptible=1) for i in range(4)]
    jobs += [job_row(f"ls{i}", 30 + 60 * i, 1800, preemptible=0) for i in range(3)]
    path = small_scenario(tmp_path, jobs=jobs, extra=TEAM_RULES)
    guarantee = "  fleet_id: small\n  teams: {teams: {research: {guaranteed_gpus: 1}}}\n"
    path.write_text(path.read_text().replace("  fleet_id: small\n", guarantee, 1))
    loaded = load_scenario(path)
    prepared = prepare(loaded)
    assert {j.team for j in prepared.selection.jobs} == {"serving", "research"}
    results = [simulate(prepared, spec) for spec in loaded.scenario.policies]
    for result in results:
        assert sorted(result.wait_teams) == ["research"] * 4 + ["serving"] * 3
        billed = result.team_bill
        assert sum(billed.team_cents(t) for t in billed.teams) == sum(
            cents(c) for c in result.cost_by_pool.values()
        )
        held = sum(billed.team_gpu_s(t) for t in billed.teams if t != IDLE)
        assert abs(held - sum(result.allocated_gpu_s.values())) < 1e-6
    report = build_report(prepared, results, [], None)
    for policy in report.policies:
        rows = {t.team: t for t in policy.teams}
        assert set(rows) <= {"serving", "research", IDLE}
        assert rows["research"].jobs == 4 and rows["serving"].jobs == 3
        assert rows["research"].wait_s is not None
        assert rows["research"].guaranteed_gpus == 1 and rows["serving"].guaranteed_gpus is None
        assert (
            rows["research"].short_gpu_hours is not None and rows["serving"].short_gpu_hours is None
        )
        assert 0 <= (rows["research"].short_share or 0) <= 1
    text = render_markdown(report)
    assert "## Teams" in text and "| research |" in text and "| all |" in text


# -- static per-team pools: the baseline a shared fleet is judged against ------------------------


@given(
    st.lists(st.integers(1, 16), min_size=1, max_size=6),
    st.dictionaries(
        st.sampled_from(["a", "b", "c"]),
        st.tuples(st.integers(0, 24), st.floats(0.1, 10)),
        min_size=1,
    ),
)
def test_static_slices_give_each_team_its_guarantee_and_cut_the_whole_fleet(
    node_gpus: list[int], terms: dict[str, tuple[int, float]]
) -> None:
    fleet = [OnPremNodeSpec(name=f"n{i}", gpus=g) for i, g in enumerate(node_gpus)]
    total = sum(node_gpus)
    config = TeamsConfig(
        teams={t: TeamSpec(guaranteed_gpus=g, weight=w) for t, (g, w) in terms.items()}
    )
    cut = slices(fleet, config, sorted(terms))
    assert sum(s.gpus for s in cut) == total, "the whole fleet, no GPU twice"
    for piece in cut:
        assert sum(n.gpus for n in piece.nodes) == piece.gpus
        assert all(n.gpus <= max(node_gpus) for n in piece.nodes)
        if sum(g for g, _ in terms.values()) <= total:
            assert piece.gpus >= terms[piece.team][0], "at least its guarantee"


def test_a_replay_on_static_per_team_pools_is_reported_beside_the_shared_one(
    tmp_path: Path,
) -> None:
    jobs = [job_row(f"be{i}", 60 * i, 3600, preemptible=1) for i in range(4)]
    jobs += [job_row(f"ls{i}", 30 + 60 * i, 1800, preemptible=0) for i in range(3)]
    path = small_scenario(tmp_path, jobs=jobs, extra=TEAM_RULES)
    loaded = load_scenario(path)
    prepared = prepare(loaded)
    spec = loaded.scenario.policies[0]
    shared = simulate(prepared, spec)
    static = replay_static_pools(prepared, lambda alone: simulate(alone, spec))
    assert sorted(r.team for r in static) == ["research", "serving"]
    assert sum(r.onprem_gpus for r in static) == 1, "the one on-prem GPU, to one team"
    assert sum(len(r.result.waits_s) for r in static) == len(shared.waits_s)
    report = build_report(prepared, [shared], [], None, static)
    assert report.static_pools is not None
    assert {t.team: t.jobs for t in report.static_pools.teams} == {"research": 4, "serving": 3}
    text = render_markdown(report)
    assert "## Static per-team pools" in text and "Static pools cost" in text


class _Held:
    def __init__(self, by_team: dict[str, tuple[int, int]]) -> None:
        self.by_team = by_team

    def team_gpus(self) -> dict[str, tuple[int, int]]:
        return self.by_team


@pytest.mark.parametrize(
    ("held", "short"),
    [
        ((0, 4), 4.0),  # guaranteed 8, nothing held, 4 GPUs of work waiting: short by 4
        ((2, 10), 6.0),  # holds 2, plenty waiting: short by the rest of its 8
        ((8, 3), 0.0),  # holds its guarantee
        ((3, 0), 0.0),  # below it, but nothing waits: lending is fine
        ((12, 5), 0.0),  # borrowing beyond it
    ],
)
def test_a_team_is_short_only_while_its_work_waits_below_its_guarantee(
    held: tuple[int, int], short: float
) -> None:
    shortfall = Shortfall()
    count_short(shortfall, _Held({"research": held}), {"research": 8}, 60.0)  # type: ignore[arg-type]
    assert shortfall.gpu_s.get("research", 0.0) == short * 60.0
    assert shortfall.ticks.get("research", 0) == (1 if short else 0) and shortfall.samples == 1


def test_a_shortfall_is_late_only_once_it_has_lasted_longer_than_the_bound() -> None:
    shortfall = Shortfall()
    short, full = _Held({"research": (0, 4)}), _Held({"research": (8, 0)})
    for t in (0.0, 60.0, 120.0, 180.0):  # short from 0: late at 180 with a 120 s bound
        count_short(shortfall, short, {"research": 8}, 60.0, t, 120.0)  # type: ignore[arg-type]
    assert shortfall.gpu_s["research"] == 4 * 4 * 60.0
    assert shortfall.late_gpu_s["research"] == 4 * 60.0 and shortfall.late_ticks["research"] == 1
    # a break (the guarantee met) starts the clock again
    count_short(shortfall, full, {"research": 8}, 60.0, 240.0, 120.0)  # type: ignore[arg-type]
    count_short(shortfall, short, {"research": 8}, 60.0, 300.0, 120.0)  # type: ignore[arg-type]
    assert shortfall.late_ticks["research"] == 1


def test_a_nodes_own_gpu_sharing_goes_with_its_static_slice() -> None:
    shared = GpuSharing.model_validate({"mode": "time-slicing", "replicas": 4})
    fleet = [OnPremNodeSpec(name="n0", gpus=4, gpu_sharing=shared)]
    config = TeamsConfig(teams={"a": TeamSpec(guaranteed_gpus=2), "b": TeamSpec()})
    for piece in slices(fleet, config, ["a", "b"]):
        assert all(node.gpu_sharing == shared for node in piece.nodes)
