"""Deterministic ids (SPEC §7): prefix + 32 hex digits of a domain-separated SHA-256."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from domain import ids
from domain.fields import ID_PATTERN
from domain.ids import STEP_RUN_ID, TASK_ATTEMPT, derive_id
from tests.hypothesis_budget import examples

PREFIXES = sorted(
    value
    for name, value in vars(ids).items()
    if name.isupper() and isinstance(value, str) and re.fullmatch(r"[a-z]{3}:", value)
)
ID_SHAPE = re.compile(r"[a-z]{3}:[0-9a-f]{32}")
parts = st.lists(st.none() | st.integers() | st.text(max_size=12), max_size=5)


def test_spec_prefixes_are_present_and_distinct():
    named = {"wfe:", "wff:", "wft:", "wta:", "wte:", "wca:", "wcm:", "wcs:", "wcr:"}
    assert named <= set(PREFIXES)
    values = [v for k, v in vars(ids).items() if k.isupper() and isinstance(v, str)]
    prefixes = [v for v in values if v.endswith(":")]
    assert len(prefixes) == len(set(prefixes))


@settings(max_examples=examples(100), deadline=None)
@given(prefix=st.sampled_from(PREFIXES), inputs=parts)
def test_id_is_36_characters_of_prefix_and_lowercase_hex(prefix, inputs):
    derived = derive_id(prefix, *inputs)
    assert len(derived) == 36
    assert ID_SHAPE.fullmatch(derived)
    assert derived.startswith(prefix)
    # Every derived id is usable wherever qlflow accepts an id (stream ids, StepRun ids).
    assert ID_PATTERN.fullmatch(derived)


@settings(max_examples=examples(100), deadline=None)
@given(prefix=st.sampled_from(PREFIXES), inputs=parts)
def test_same_inputs_give_the_same_id(prefix, inputs):
    assert derive_id(prefix, *inputs) == derive_id(prefix, *list(inputs))


@settings(max_examples=examples(100), deadline=None)
@given(first=parts, second=parts)
def test_distinct_inputs_give_distinct_ids(first, second):
    if first == second and [type(p) for p in first] == [type(p) for p in second]:
        assert derive_id(TASK_ATTEMPT, *first) == derive_id(TASK_ATTEMPT, *second)
    else:
        assert derive_id(TASK_ATTEMPT, *first) != derive_id(TASK_ATTEMPT, *second)


@pytest.mark.parametrize(
    ("first", "second"),
    [
        (("ab", "c"), ("a", "bc")),
        ((None,), ("None",)),
        ((1,), ("1",)),
        ((), ("",)),
        (("a",), ("a", None)),
    ],
)
def test_ambiguous_concatenations_give_distinct_ids(first, second):
    assert derive_id(STEP_RUN_ID, *first) != derive_id(STEP_RUN_ID, *second)


def test_same_parts_under_another_prefix_give_another_digest():
    assert derive_id(STEP_RUN_ID, "run-1")[4:] != derive_id(TASK_ATTEMPT, "run-1")[4:]


@pytest.mark.parametrize("prefix", ["xyz:", "wfe", "WFE:", "", "wfe:x"])
def test_unknown_prefix_is_refused(prefix):
    with pytest.raises(ValueError, match="unknown id prefix"):
        derive_id(prefix, "run-1")


@pytest.mark.parametrize("part", [True, 1.5, b"x", ["a"], {"a": 1}])
def test_non_scalar_or_bool_part_is_refused(part):
    with pytest.raises(TypeError):
        derive_id(STEP_RUN_ID, part)
