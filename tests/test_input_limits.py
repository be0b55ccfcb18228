"""The limits of the one YAML reader and the one CSV reader, and of the simulator's step series:
what every config, scenario and data file may hold (docs/scenario.md, "Input limits")."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel, ConfigDict

from autoscaler.model.csvfile import read_rows
from autoscaler.model.errors import InputError
from autoscaler.model.inputfile import (
    MAX_DEPTH,
    parse_dotted,
    parse_yaml,
    relocate,
    validate_settings,
)
from autoscaler.sim.series import StepSeries


def error(text: str) -> str:
    with pytest.raises(InputError) as caught:
        parse_yaml(text, "f.yaml")
    return str(caught.value)


def test_merge_keys_follow_yaml_explicit_keys_win_then_earlier_maps() -> None:
    document = parse_yaml(
        "a: &a {x: 1, y: 1}\nb: &b {x: 2, z: 2}\nc:\n  <<: [*a, *b]\n  y: 3\n", "f.yaml"
    )
    assert document.data["c"] == {"x": 1, "y": 3, "z": 2}
    assert document.line_of(("c", "y")) == 5, "an explicit key keeps its own line"
    assert document.line_of(("c", "z")) == 2, "a merged key is where it was written"
    assert document.line_of(("c",)) == 4
    assert "a merge key (<<) takes a mapping" in error("c: {<<: 5}\n")
    assert "the merge key << is given twice" in error("a: &a {x: 1}\nc: {<<: *a, <<: *a}\n")


def test_aliases_count_against_the_budget_and_may_not_contain_themselves() -> None:
    shared = parse_yaml("a: &a [1, 2]\nb: *a\nc: *a\n", "f.yaml")
    assert shared.data == {"a": [1, 2], "b": [1, 2], "c": [1, 2]}
    assert error("a: &a {b: *a}\n") == "f.yaml:1: an alias refers to a value that contains it"
    levels = "a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]\n" for i in range(1, 6)
    )
    assert "expands to more than 100,000 values" in error(levels)


def test_nesting_is_bounded_before_the_composer_recurses() -> None:
    assert parse_yaml("a: " + "[" * (MAX_DEPTH - 1) + "]" * (MAX_DEPTH - 1), "f.yaml").data
    assert error("a: " + "[" * 100_000) == f"f.yaml:1: nested more than {MAX_DEPTH} levels deep"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("a: .nan\n", "f.yaml:1: a: expected a finite number, got '.nan'"),
        ("a: -.inf\n", "f.yaml:1: a: expected a finite number, got '-.inf'"),
        ("a: 1" + "0" * 20 + "\n", "f.yaml:1: a: expected a number of at most 1e+15 in magnitude"),
        ("a: 1" + "0" * 5000 + "\n", "f.yaml:1: a: not a valid value: '1000"),
        ("a: !!binary AAAA\n", "f.yaml:1: a: the tag '!!binary' is not supported"),
        ("a: b\x00\n", "f.yaml:1: not valid YAML: the character #x0000 is not allowed"),
        ("a: 1\n---\nb: 2\n", "f.yaml:2: not valid YAML: but found another document"),
    ],
)
def test_one_line_for_each_kind_of_bad_value(text: str, message: str) -> None:
    assert error(text).startswith(message)


def test_dates_stay_text_and_an_empty_file_is_an_empty_document() -> None:
    assert parse_yaml("start: 2024-01-01\n", "f.yaml").data == {"start": "2024-01-01"}
    empty = parse_yaml("# nothing\n", "f.yaml")
    assert empty.data == {} and empty.where(("fleet_id",)) == "f.yaml:1"


def test_a_file_too_large_or_not_utf8_is_refused(tmp_path: Path) -> None:
    from autoscaler.model.inputfile import read_yaml

    big = tmp_path / "big.yaml"
    big.write_text("a: " + "x" * (1 << 20) + "\n")
    with pytest.raises(InputError, match="larger than 1024 KiB"):
        read_yaml(big)
    latin = tmp_path / "latin.yaml"
    latin.write_bytes(b"a: 1\nb: caf\xe9\n")
    with pytest.raises(InputError, match=r"latin.yaml:2: not UTF-8 text"):
        read_yaml(latin)


class _Settings(BaseModel):
    model_config = ConfigDict(extra="forbid")
    rate: float = math.inf  # a default may be infinite; a value the user gives may not
    count: int = 1


def test_settings_blocks_get_the_numeric_rule_too() -> None:
    assert validate_settings(_Settings, {"count": 3}, field="sources.q").rate == math.inf
    for given_value in ("NaN", "1e999", "-Infinity"):
        with pytest.raises(InputError) as caught:
            validate_settings(_Settings, {"rate": given_value}, field="sources.q")
        assert str(caught.value) == "config: sources.q.rate: expected a finite number"
    with pytest.raises(InputError, match=r"sources\.q\.count: expected a number of at most 1e"):
        validate_settings(_Settings, {"count": 10**30}, field="sources.q")


def test_relocate_points_a_dotted_field_at_its_line() -> None:
    document = parse_yaml(
        "fleet_id: x\nsources:\n  - kind: static\n    settings:\n      jobs: []\n", "c.yaml"
    )
    assert parse_dotted("pools[3].options.subnets[0]") == ("pools", 3, "options", "subnets", 0)
    moved = relocate(
        InputError("config", "too short", field="sources.q.jobs"),
        document,
        (("sources.q", ("sources", 0, "settings")),),
    )
    assert str(moved) == "c.yaml:5: sources[0].settings.jobs: too short"
    elsewhere = InputError("trace.csv:3", "bad")
    assert relocate(elsewhere, document) is elsewhere, "an error about another file stays"


def test_csv_header_rows_and_encoding(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_bytes("\ufeffa,b\n1,2\n\n3,4\n".encode())
    assert [r.values for r in read_rows(path, ("a", "b"))] == [
        {"a": "1", "b": "2"},
        {"a": "3", "b": "4"},
    ], "a byte-order mark and blank lines are allowed"
    path.write_text("a,b\n1,2\n3\n")
    with pytest.raises(InputError, match=r"t.csv:3: expected 2 fields as the header has, got 1"):
        list(read_rows(path, ("a",)))
    path.write_text("a,b,a\n1,2,3\n")
    with pytest.raises(InputError, match=r"t.csv:1: the column 'a' appears twice"):
        list(read_rows(path, ("a",)))
    path.write_bytes(b"a,b\n" + b"1,2\n" * 3000 + b"1,\xff\n")
    with pytest.raises(InputError, match=r"t.csv:3002: not UTF-8 text"):
        list(read_rows(path, ("a",)))


def test_a_series_refuses_a_period_it_cannot_divide_by() -> None:
    for period in (0.0, -1.0, math.nan, math.inf):
        with pytest.raises(ValueError, match="period must be positive"):
            StepSeries([0.0], [1.0], period=period)
    with pytest.raises(ValueError, match="finite"):
        StepSeries([0.0, math.inf], [1.0, 2.0])
    with pytest.raises(ValueError, match="finite"):
        StepSeries([0.0], [math.nan])
    assert StepSeries([0.0], [math.inf]).at(5) == math.inf, "infinite: not on offer"


@given(
    st.lists(st.floats(0, 1e6), min_size=1, max_size=6),
    st.floats(1e-3, 1e6),
    st.floats(-1e9, 1e12),
)
def test_next_change_always_moves_forward(times: list[float], period: float, t: float) -> None:
    times.sort()
    series = StepSeries(times, [1.0] * len(times), period=period)
    assert series.next_change(t) > t
