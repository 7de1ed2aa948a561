"""normalize: strict reading of a plan, digest recomputation and round trips."""

from __future__ import annotations

import copy
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from domain.canonical import canonical_bytes
from domain.errors import PlanError
from domain.plan import MAX_PLAN_BYTES, ExecutionPlan, normalize, plan_to_dict
from tests.domain.test_plan import plan_for
from tests.hypothesis_budget import examples

DIAMOND = {"fetch": [], "left": ["fetch"], "right": ["fetch"], "archive": ["left", "right"]}
QUICK = settings(
    max_examples=examples(100), deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


@pytest.fixture(scope="module")
def plan() -> ExecutionPlan:
    return plan_for(DIAMOND, workflow_timeout_ms=60_000)


def through_json(document: dict[str, Any]) -> Any:
    return orjson.loads(orjson.dumps(document))


def refused(rule: str, document: object) -> PlanError:
    with pytest.raises(PlanError) as caught:
        normalize(document)
    assert caught.value.rule == rule, caught.value
    return caught.value


# --- round trips ----------------------------------------------------------------------


def test_json_round_trip_gives_an_equal_plan_with_the_same_digest(plan):
    again = normalize(through_json(plan_to_dict(plan)))
    assert again == plan
    assert again.plan_digest == plan.plan_digest


def test_plan_without_digest_normalizes_to_the_same_digest(plan):
    document = through_json(plan_to_dict(plan))
    del document["plan_digest"]
    assert normalize(document).plan_digest == plan.plan_digest


def test_field_order_of_the_input_does_not_matter(plan):
    document = plan_to_dict(plan)
    reversed_document = dict(reversed(list(document.items())))
    reversed_document["steps"] = [dict(reversed(list(s.items()))) for s in document["steps"]]
    assert normalize(reversed_document) == plan


def test_plan_without_timeout_round_trips_with_null():
    plan = plan_for({"a": []})
    document = through_json(plan_to_dict(plan))
    assert document["timeout_ms"] is None
    assert normalize(document) == plan


# --- digest checks --------------------------------------------------------------------


def test_changed_source_digest_with_the_old_plan_digest_is_refused(plan):
    document = through_json(plan_to_dict(plan))
    document["steps"][0]["source_digest"] = "sha256:" + "f" * 64
    refused("plan_digest", document)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("run_id", "run-0002"),
        ("generation", 99),
        ("timeout_ms", 1),
        ("workflow_digest", "sha256:" + "a" * 64),
        ("publication_id", "pub:other"),
    ],
)
def test_any_changed_field_with_the_old_plan_digest_is_refused(plan, field, value):
    document = through_json(plan_to_dict(plan))
    document[field] = value
    if field == "generation":
        for step in document["steps"]:
            step["task_ref"] = f"backup@99#{step['task_id']}"
    refused("plan_digest", document)


def test_malformed_stated_digest_is_refused(plan):
    document = through_json(plan_to_dict(plan))
    document["plan_digest"] = 12
    refused("type", document)
    document["plan_digest"] = plan.plan_digest.upper()
    refused("plan_digest", document)


# --- strict shape ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "field",
    ["model", "tool", "approval", "condition", "expression", "subworkflow", "retry",
     "template", "kind", "input", "metadata"],
)  # fmt: skip
def test_v1_refuses_extra_step_capabilities_as_unknown_fields(plan, field):
    document = through_json(plan_to_dict(plan))
    document["steps"][1][field] = {"anything": True}
    # retry is a plan v2 field: a v1 plan refuses it by name
    error = refused("v2_field" if field == "retry" else "unknown_field", document)
    assert field in str(error)


@pytest.mark.parametrize("field", ["retry", "condition", "template", "extensions", "kind"])
def test_v1_refuses_extra_plan_fields(plan, field):
    document = through_json(plan_to_dict(plan))
    document[field] = []
    refused("unknown_field", document)


@pytest.mark.parametrize("field", ["schema", "project", "run_id", "steps", "timeout_ms"])
def test_missing_plan_field_is_refused(plan, field):
    document = through_json(plan_to_dict(plan))
    del document[field]
    refused("missing_field", document)


@pytest.mark.parametrize("field", ["key", "needs", "initial_status", "task_ref"])
def test_missing_step_field_is_refused(plan, field):
    document = through_json(plan_to_dict(plan))
    del document["steps"][2][field]
    refused("missing_field", document)


@pytest.mark.parametrize(
    ("field", "value", "rule"),
    [
        ("generation", True, "type"),
        ("generation", 3.0, "float"),
        ("generation", "3", "type"),
        ("generation", 0, "generation"),
        ("timeout_ms", False, "type"),
        ("timeout_ms", 60_000.0, "float"),
        ("timeout_ms", 0, "timeout_ms"),
        ("project", 7, "type"),
        ("run_id", "r" * 37, "run_id"),
        ("lock_digest", "abc", "lock_digest"),
        ("schema", "qinglong/plugin-package-workflow-execution-plan@v2", "schema"),
        ("steps", {}, "type"),
        ("steps", [], "empty_workflow"),
    ],
)
def test_wrong_field_type_or_value_is_refused(plan, field, value, rule):
    document = through_json(plan_to_dict(plan))
    document[field] = value
    refused(rule, document)


@pytest.mark.parametrize("value", [None, [], "plan", 3, b"{}"])
def test_non_object_plan_is_refused(value):
    refused("type", value)


def test_non_string_key_is_refused(plan):
    document = plan_to_dict(plan)
    document[1] = "x"
    refused("type", document)


# --- structural rules re-checked ------------------------------------------------------


def step_of(document: dict[str, Any], key: str) -> dict[str, Any]:
    return next(step for step in document["steps"] if step["key"] == key)


def test_unsorted_steps_are_refused(plan):
    document = through_json(plan_to_dict(plan))
    document["steps"].reverse()
    refused("step_order", document)


def test_duplicate_step_is_refused(plan):
    document = through_json(plan_to_dict(plan))
    document["steps"].insert(1, copy.deepcopy(document["steps"][0]))
    refused("duplicate_step", document)


def test_unsorted_needs_are_refused(plan):
    document = through_json(plan_to_dict(plan))
    step_of(document, "archive")["needs"].reverse()
    refused("needs_order", document)


def test_unknown_need_is_refused(plan):
    document = through_json(plan_to_dict(plan))
    step_of(document, "archive")["needs"].append("zzz")
    refused("unknown_need", document)


def test_cycle_is_refused(plan):
    document = through_json(plan_to_dict(plan))
    fetch = step_of(document, "fetch")
    fetch["needs"], fetch["initial_status"] = ["archive"], "pending"
    error = refused("cycle", document)
    assert "archive -> left -> fetch -> archive" in str(error)


def test_initial_status_must_follow_needs(plan):
    document = through_json(plan_to_dict(plan))
    step_of(document, "left")["initial_status"] = "ready"
    refused("initial_status", document)
    document = through_json(plan_to_dict(plan))
    step_of(document, "fetch")["initial_status"] = "pending"
    refused("initial_status", document)
    document = through_json(plan_to_dict(plan))
    step_of(document, "fetch")["initial_status"] = "running"
    refused("initial_status", document)


def test_task_ref_must_be_generation_bound(plan):
    document = through_json(plan_to_dict(plan))
    step_of(document, "left")["task_ref"] = "backup@2#left"
    refused("task_ref", document)
    step_of(document, "left")["task_ref"] = "backup@3#right"
    refused("task_ref", document)


def test_duplicate_step_run_id_is_refused(plan):
    document = through_json(plan_to_dict(plan))
    step_of(document, "left")["step_run_id"] = step_of(document, "right")["step_run_id"]
    refused("step_run_id_duplicate", document)


def test_more_than_128_steps_is_refused(plan):
    document = through_json(plan_to_dict(plan))
    template = step_of(document, "fetch")
    document["steps"] = [dict(template, key=f"s{i:03d}", step_run_id=f"id{i}") for i in range(129)]
    refused("too_many_steps", document)


def test_plan_of_exactly_256_kib_is_accepted_and_one_byte_more_refused():
    keys = [f"{i:03d}".ljust(64, "k") for i in range(128)]
    document = through_json(plan_to_dict(plan_for({key: [] for key in keys})))
    del document["plan_digest"]
    digest_member = len(',"plan_digest":"sha256:"') + 64

    def encoded_size() -> int:
        return len(canonical_bytes(document)) + digest_member

    # Each 64-character need adds 67 bytes; the first one of a Step also turns
    # "ready" into "pending" (+2) and "[]" into '["..."]' (-1).
    remaining = MAX_PLAN_BYTES - encoded_size()
    for index, step in enumerate(document["steps"][1:], start=1):
        count = min(index, (remaining - 1) // 67)
        if count <= 0:
            break
        step["needs"], step["initial_status"] = keys[:count], "pending"
        remaining -= 67 * count + 1
    padding = MAX_PLAN_BYTES - encoded_size()
    assert 0 <= padding <= 100
    document["project"] += "p" * padding

    plan = normalize(document)
    assert len(canonical_bytes(plan_to_dict(plan))) == MAX_PLAN_BYTES
    assert len(orjson.dumps(plan_to_dict(plan))) == MAX_PLAN_BYTES
    document["installation"] += "i"
    refused("plan_size", document)


# --- properties -----------------------------------------------------------------------


@st.composite
def dags(draw: st.DrawFn) -> dict[str, list[str]]:
    """A random DAG of 1-128 Steps whose key order differs from its topological order."""
    size = draw(st.integers(min_value=1, max_value=128))
    names = draw(st.permutations([f"k{i}" for i in range(size)]))
    steps: dict[str, list[str]] = {}
    for index, name in enumerate(names):
        if index == 0:
            steps[name] = []
            continue
        earlier = draw(st.lists(st.integers(0, index - 1), max_size=min(index, 5), unique=True))
        steps[name] = [names[i] for i in earlier]
    return steps


@settings(max_examples=examples(40), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=dags(), timeout=st.none() | st.integers(1, 2**53 - 1))
def test_random_dags_build_and_round_trip(steps, timeout):
    plan = plan_for(steps, timeout_ms=timeout)
    assert len(plan.steps) == len(steps)
    assert list(plan.step_keys) == sorted(steps)
    for step in plan.steps:
        assert step.needs == tuple(sorted(steps[step.key]))
        assert step.initial_status == ("pending" if step.needs else "ready")
    document = through_json(plan_to_dict(plan))
    assert normalize(document) == plan
    del document["plan_digest"]
    assert normalize(document).plan_digest == plan.plan_digest


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=24,
)
PLAN_KEYS = [
    "schema", "project", "package", "installation", "lock_digest", "generation",
    "revision_id", "revision_digest", "publication_id", "publication_digest",
    "workflow_key", "workflow_digest", "run_id", "timeout_ms", "steps", "plan_digest",
]  # fmt: skip
plan_like = st.dictionaries(st.sampled_from(PLAN_KEYS), json_values, max_size=len(PLAN_KEYS))


@QUICK
@given(value=json_values | plan_like)
def test_arbitrary_json_raises_only_plan_error(value):
    with pytest.raises(PlanError):
        normalize(value)


@st.composite
def mutations(draw: st.DrawFn, document: dict[str, Any]) -> dict[str, Any]:
    """`document` with one random change somewhere in its tree: a value replaced,
    a key removed or a key added."""
    mutated = copy.deepcopy(document)
    container: Any = mutated
    while True:
        keys = list(container) if isinstance(container, dict) else list(range(len(container)))
        if not keys:
            break
        key = draw(st.sampled_from(keys))
        child = container[key]
        if isinstance(child, (dict, list)) and child and draw(st.booleans()):
            container = child
            continue
        action = draw(st.sampled_from(["replace", "delete", "add"]))
        if action == "replace":
            container[key] = draw(json_values)
        elif action == "delete":
            del container[key]
        elif isinstance(container, dict):
            container[draw(st.text(min_size=1, max_size=12))] = draw(json_values)
        else:
            container.insert(key, draw(json_values))
        break
    return mutated


@QUICK
@given(data=st.data())
def test_random_mutation_normalizes_to_the_same_plan_or_raises_plan_error(data):
    plan = plan_for(DIAMOND, workflow_timeout_ms=60_000)
    document = through_json(plan_to_dict(plan))
    mutated = data.draw(mutations(document))
    try:
        result = normalize(mutated)
    except PlanError:
        return
    # The stated digest pins the content: whatever passes is the original plan.
    assert result == plan
