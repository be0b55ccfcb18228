"""``Pool.gpu_sharing`` and the fold of pending fractional jobs into whole GPUs
(``autoscaler.model.sharing.whole_gpus``), which the simulator and the live sources both tell
the controller: never fewer GPUs than the jobs' slices need, one GPU each where any pool does
not share, and a bad sharing in a config is one error naming the pool's field."""

from __future__ import annotations

import math
from fractions import Fraction
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autoscaler.cli import main
from autoscaler.model.config import load_config
from autoscaler.model.errors import InputError
from autoscaler.model.sharing import (
    GpuSharing,
    SharingMode,
    folded_gpus,
    whole_gpus,
    worst_slice,
)

A100_40GB = ("1g.5gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb")
MIG = GpuSharing(mode=SharingMode.MIG, profiles=A100_40GB)

CONFIG = """\
fleet_id: prod
tick_seconds: 30
policy: {name: cost-aware}
limits: {max_instances: 10, max_cost_per_hour: 100}
pools:
  - name: g5-spot
    provider: aws
    region: us-east-1
    instance_type: g5.xlarge
    gpus_per_instance: 1
    market: spot
    options: {image_id: ami-0123456789abcdef0}
    gpu_sharing: {mode: time-slicing, replicas: 4}
"""


def sliced(replicas: int) -> GpuSharing:
    return GpuSharing(mode=SharingMode.TIME_SLICING, replicas=replicas)


sharings = st.one_of(
    st.integers(2, 16).map(sliced),
    st.sampled_from([MIG, GpuSharing(mode=SharingMode.MIG, profiles=("3g.20gb", "7g.40gb"))]),
)
fractions = st.one_of(
    st.none(),
    st.sampled_from([0.05, 0.1, 0.25, 0.3, 0.46, 0.5, 0.6, 0.75, 0.99]),
    st.tuples(st.integers(1, 15), st.integers(2, 16)).map(lambda kn: Fraction(*kn)),
)
counts = st.lists(st.tuples(fractions, st.integers(0, 40)), max_size=6)


@settings(max_examples=300, deadline=None)
@given(counts, st.lists(sharings, min_size=1, max_size=4))
def test_the_fold_never_buys_fewer_gpus_than_the_slices_need(
    asked: list[tuple[float | Fraction | None, int]], pools: list[GpuSharing]
) -> None:
    folded = whole_gpus(asked, pools)
    jobs = sum(n for _, n in asked)
    assert folded <= jobs
    for pool in pools:
        # packed on this pool alone, the jobs' slices need at least this many GPUs
        need = Fraction(0)
        for fraction, n in asked:
            slices = pool.slices_for(fraction) if fraction is not None else None
            need += n if slices is None else Fraction(slices, pool.units) * n
        assert folded >= math.ceil(need)


@settings(max_examples=200, deadline=None)
@given(counts, st.lists(st.one_of(st.none(), sharings), max_size=4))
def test_where_any_pool_does_not_share_each_job_is_a_gpu(
    asked: list[tuple[float | Fraction | None, int]], pools: list[GpuSharing | None]
) -> None:
    if pools and all(p is not None for p in pools):
        pools = [*pools, None]
    assert whole_gpus(asked, pools) == sum(n for _, n in asked)


@settings(max_examples=300, deadline=None)
@given(
    st.integers(0, 20),
    st.lists(
        st.tuples(
            fractions.filter(lambda f: f is not None),
            st.integers(0, 40),
            st.lists(sharings, max_size=3),
        ),
        max_size=6,
    ),
)
def test_a_live_fold_counts_each_slice_against_its_own_hosts(
    whole: int, asked: list[tuple[float | Fraction, int, list[GpuSharing]]]
) -> None:
    """``folded_gpus`` (the live sources' fold): never fewer GPUs than the slices need on
    each of their hosts, never more than a GPU a job, and the simulator's fold when every
    slice has the same hosts."""
    folded = folded_gpus(whole, asked)
    assert folded <= whole + sum(n for _, n, _ in asked)
    need = Fraction(whole)
    for fraction, n, hosts in asked:
        cuts = [h.slices_for(fraction) for h in hosts]
        if not hosts or any(c is None for c in cuts):
            need += n
        else:
            need += n * max(Fraction(c or 0, h.units) for c, h in zip(cuts, hosts, strict=True))
    assert folded == math.ceil(need)
    if asked and all(hosts == asked[0][2] and hosts for _, _, hosts in asked):
        alike = [(None, whole), *((f, n) for f, n, _ in asked)]
        assert folded == whole_gpus(alike, asked[0][2])


def test_the_fold_takes_the_pool_that_packs_each_fraction_least_well() -> None:
    # nine quarter-GPU jobs and two halves on 4 replicas: 9/4 + 2/2 = 3.25, so 4 GPUs
    assert whole_gpus([(0.25, 9), (0.5, 2), (None, 0)], [sliced(4)]) == 4
    # 0.3 is 2 of 4 replicas but 3 of 10, and MIG's 3g (3/7): the worst is a half
    assert worst_slice(0.3, [sliced(4), sliced(10), MIG]) == Fraction(1, 2)
    assert whole_gpus([(0.3, 4)], [sliced(10), sliced(4)]) == 2
    # 0.6 is covered by no MIG profile short of 7g: a whole GPU each
    assert whole_gpus([(0.6, 3), (0.1, 7)], [MIG]) == 3 + 1
    assert whole_gpus([(0.25, 5), (None, 2)], []) == 7
    # a live source's exact share: 5 of 6 replicas is 5 slices, where the float 5/6 rounds up
    assert whole_gpus([(Fraction(5, 6), 6)], [sliced(6)]) == 5
    assert whole_gpus([(5 / 6, 6)], [sliced(6)]) == 6


def test_a_pool_may_say_how_its_gpus_are_shared(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(CONFIG)
    (pool,) = load_config(path).pools
    assert pool.gpu_sharing == sliced(4)
    path.write_text(CONFIG.replace("time-slicing, replicas: 4", "mig, profiles: [1g.10gb]"))
    (pool,) = load_config(path).pools
    assert pool.gpu_sharing is not None and pool.gpu_sharing.profiles == ("1g.10gb",)
    path.write_text(CONFIG.replace("    gpu_sharing: {mode: time-slicing, replicas: 4}\n", ""))
    assert load_config(path).pools[0].gpu_sharing is None


@pytest.mark.parametrize(
    ("sharing", "said"),
    [
        ("{mode: time-slicing}", "time-slicing needs replicas"),
        ("{mode: time-slicing, replicas: 1}", "greater than or equal to 2"),
        ("{mode: mig, profiles: [5g.20gb]}", "expected a MIG profile name"),
        ("{mode: mps, replicas: 4}", "'time-slicing' or 'mig'"),
        ("{mode: mig, profiles: [1g.5gb], replicas: 2}", "replicas are time-slicing's"),
    ],
)
def test_a_bad_sharing_is_one_error_naming_the_pools_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], sharing: str, said: str
) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(CONFIG.replace("{mode: time-slicing, replicas: 4}", sharing))
    with pytest.raises(InputError) as caught:
        load_config(path)
    assert "pools[0].gpu_sharing" in str(caught.value) and said in str(caught.value)
    assert str(caught.value).startswith(f"{path}:")
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err
    assert "pools[0].gpu_sharing" in err and err.count("\n") == 1
