"""Fuzzing plan `normalize` (SPEC §3): any input gives a valid ExecutionPlan or a
`PlanError` — never another exception. A plan that states its digest and still
passes after mutation is the very plan it started from."""

from __future__ import annotations

import orjson
from hypothesis import given
from hypothesis import strategies as st

from domain.errors import PlanError
from domain.plan import ExecutionPlan, normalize, plan_to_dict
from tests.domain.test_plan import plan_for
from tests.fuzz.support import FUZZ, hostile, json_values, mutated

DIAMOND = {"fetch": [], "left": ["fetch"], "right": ["fetch"], "archive": ["left", "right"]}
WIDE = {f"s{i:03d}": ([] if i < 3 else [f"s{i - 3:03d}", f"s{i - 1:03d}"]) for i in range(16)}
SEEDS = {
    "diamond": plan_for(DIAMOND, workflow_timeout_ms=60_000),
    "wide": plan_for(WIDE),
}
DOCUMENTS = {name: orjson.loads(orjson.dumps(plan_to_dict(p))) for name, p in SEEDS.items()}


def _normalize_or_refuse(value: object) -> ExecutionPlan | None:
    try:
        plan = normalize(value)
    except PlanError as error:
        assert str(error)
        return None
    assert isinstance(plan, ExecutionPlan)
    # a plan that passed is a fixed point: its JSON normalizes to itself
    assert normalize(orjson.loads(orjson.dumps(plan_to_dict(plan)))) == plan
    return plan


@FUZZ
@given(
    name=st.sampled_from(sorted(DOCUMENTS)),
    data=st.data(),
)
def test_mutated_plans_normalize_or_raise_plan_error(name: str, data) -> None:
    document = data.draw(mutated(DOCUMENTS[name], max_changes=5))
    plan = _normalize_or_refuse(document)
    if plan is not None and isinstance(document, dict) and "plan_digest" in document:
        assert plan == SEEDS[name], "the stated digest pins the content"


@FUZZ
@given(value=hostile | json_values)
def test_arbitrary_values_raise_plan_error(value) -> None:
    assert _normalize_or_refuse(value) is None


@FUZZ
@given(raw=st.binary(max_size=200) | st.text(max_size=200).map(str.encode))
def test_arbitrary_json_text_normalizes_or_raises_plan_error(raw: bytes) -> None:
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return
    _normalize_or_refuse(value)
