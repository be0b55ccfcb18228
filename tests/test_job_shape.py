"""The shape fields a queue item may carry (autoscaler/spi/job_shape.py): what each reads
as, what is refused with the field named, and that any value at all either reads into a shape
a DemandGroup accepts or is refused in one line."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from autoscaler.model import Job
from autoscaler.spi.job_shape import (
    SHAPE_FIELDS,
    BadShapeError,
    JobShape,
    ShapeReader,
    item_shape,
    json_item_fields,
)

DEFAULT = JobShape(4, 2, ("A100",), None)


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({}, DEFAULT),
        ({"payload": "x"}, DEFAULT),
        ({"gpus": 8}, JobShape(8, 2, ("A100",), None)),
        ({"gpus": "16", "nodes": "4"}, JobShape(16, 4, ("A100",), None)),
        ({"nodes": 3}, JobShape(6, 3, ("A100",), None)),
        ({"gpus_per_node": 8, "nodes": 2}, JobShape(16, 2, ("A100",), None)),
        ({"gpus": 16, "gpus_per_node": 8}, JobShape(16, 2, ("A100",), None)),
        ({"gpu_model": " H100 "}, JobShape(4, 2, ("H100",), None)),
        ({"gpu_models": ["h100", "a100", "h100"]}, JobShape(4, 2, ("a100", "h100"), None)),
        ({"gpu_models": "h100|a100"}, JobShape(4, 2, ("a100", "h100"), None)),
        ({"gpu_models": "h100, a100"}, JobShape(4, 2, ("a100", "h100"), None)),
        ({"gpu_models": '["L4"]'}, JobShape(4, 2, ("L4",), None)),
        ({"min_gpu_memory_gib": "80"}, JobShape(4, 2, ("A100",), 80.0)),
        ({"min_gpu_memory_gib": 40.5}, JobShape(4, 2, ("A100",), 40.5)),
    ],
)
def test_what_an_item_says_fills_the_defaults(fields: dict[str, Any], expected: JobShape) -> None:
    assert item_shape(fields, DEFAULT) == expected


@pytest.mark.parametrize(
    ("fields", "complaint"),
    [
        ({"gpus": "lots"}, "gpus 'lots' is not a whole number"),
        ({"gpus": 4.5}, "gpus 4.5 is not a whole number"),
        ({"gpus": True}, "gpus True is not a whole number"),
        ({"gpus": 0}, "gpus 0 is not between 1 and"),
        ({"nodes": -1}, "nodes -1 is not between 1 and 100,000"),
        ({"gpus": 6, "nodes": 4}, "gpus 6 is not a multiple of nodes 4"),
        ({"gpus": 8, "gpus_per_node": 8}, "gpus 8 is not gpus_per_node 8 times nodes 2"),
        ({"gpus_per_node": 5000}, "gpus_per_node 5000 is not between 1 and 1,024"),
        ({"gpus": 40_000}, "more than 1024"),
        ({"gpu_model": ""}, "gpu_model '' is not a model name"),
        ({"gpu_model": 100}, "gpu_model 100 is not a model name"),
        ({"gpu_models": [7]}, "gpu_models [7] is not a list of model names"),
        ({"gpu_models": "[oops"}, "gpu_models '[oops' is not a list of names"),
        ({"gpu_model": "A100", "gpu_models": ["H100"]}, "gives both gpu_model and gpu_models"),
        ({"min_gpu_memory_gib": 0}, "min_gpu_memory_gib 0 is not a positive size"),
        ({"min_gpu_memory_gib": "nan"}, "min_gpu_memory_gib 'nan' is not a positive size"),
        ({"min_gpu_memory_gib": [1]}, "min_gpu_memory_gib [1] is not a positive size"),
    ],
)
def test_a_bad_shape_field_is_named(fields: dict[str, Any], complaint: str) -> None:
    with pytest.raises(BadShapeError) as failure:
        item_shape(fields, DEFAULT)
    assert complaint in str(failure.value)


@pytest.mark.parametrize(
    ("item", "fields"),
    [
        ('{"gpus": 2}', {"gpus": 2}),
        ('  {"gpus": 2}', {"gpus": 2}),
        ("job-17", None),
        ('"job-17"', None),
        ("[1, 2]", None),
        ("{not json", None),
    ],
)
def test_only_json_objects_carry_fields(item: str, fields: dict[str, Any] | None) -> None:
    assert json_item_fields(item) == fields


anything = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 5000) | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3),
    max_leaves=5,
)


@given(st.dictionaries(st.sampled_from(SHAPE_FIELDS), anything, max_size=6))
def test_any_fields_read_into_a_valid_job_or_one_line_refusal(fields: dict[str, Any]) -> None:
    try:
        shape = item_shape(fields, DEFAULT)
    except BadShapeError as exc:
        assert "\n" not in str(exc) and len(str(exc)) < 200
        return
    job = Job(
        id="1",
        gpus=shape.gpus,
        submit_time=0.0,
        nodes=shape.nodes,
        gpu_models=shape.gpu_models,
        min_gpu_memory_gib=shape.min_gpu_memory_gib,
    )
    assert job.shape.gpus * job.nodes == job.gpus
    assert list(shape.gpu_models) == sorted(set(shape.gpu_models))


@given(st.lists(st.dictionaries(st.sampled_from(SHAPE_FIELDS), anything, max_size=4), max_size=8))
def test_the_remembering_reader_answers_as_item_shape_does(items: list[dict[str, Any]]) -> None:
    reader = ShapeReader(DEFAULT, remembered=3)
    for fields in items * 2:
        try:
            expected: JobShape | str = item_shape(fields, DEFAULT)
        except BadShapeError as exc:
            expected = str(exc)
        try:
            found: JobShape | str = reader.shape(fields)
        except BadShapeError as exc:
            found = str(exc)
        assert found == expected
