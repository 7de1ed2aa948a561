"""Plan v2: parameters and retry policies bound into the plan; v1 unchanged byte for byte."""

from __future__ import annotations

import copy
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from domain.errors import InvalidInput, ManifestError, PlanError
from domain.manifest import revision_from_manifest, validate_manifest
from domain.plan import build_plan, normalize, plan_to_dict, step_run_ids_for
from domain.plan_v2 import PLAN_SCHEMA_V1, PLAN_SCHEMA_V2
from domain.publication import publication_for
from tests.hypothesis_budget import examples

QUICK = settings(
    max_examples=examples(60), deadline=None, suppress_health_check=[HealthCheck.too_slow]
)

DIAMOND: dict[str, Any] = {
    "package": {"name": "backup", "publisher": "acme"},
    "tasks": {
        "fetch": {"command": ["python3", "fetch.py"], "files": {"fetch.py": "sha256:" + "a" * 64}},
        "left": {"command": ["sh", "-c", "echo left"], "env": {"MODE": "x"}},
        "right": {"command": ["sh", "-c", "echo right"]},
        "archive": {"command": ["sh", "-c", "tar czf out.tgz data"]},
    },
    "workflows": {
        "nightly": {
            "timeout_ms": 600000,
            "steps": [
                {"key": "fetch", "task": "fetch"},
                {"key": "left", "task": "left", "needs": ["fetch"]},
                {"key": "right", "task": "right", "needs": ["fetch"]},
                {"key": "archive", "task": "archive", "needs": ["left", "right"]},
            ],
        }
    },
}
SINGLE: dict[str, Any] = {
    "package": {"name": "tiny", "publisher": "me", "project": "p1"},
    "tasks": {"hello": {"command": ["echo", "hi"]}},
    "workflows": {"once": {"steps": [{"key": "hello", "task": "hello"}]}},
}
# Computed by the code before plan v2 existed (commit 5176e51, `build_plan` on these
# manifests at generation 3, run id "run-1"), printed and pasted here: a manifest that
# uses no v2 feature must keep these digests forever.
V1_DIGESTS = {
    "diamond": {
        "plan": "sha256:83e80b5a063ad4010c96589ffa02949fed43c226a663f046bf86957931f64c1a",
        "revision": "sha256:94ea7c3a4b9bfe5ae06a8e6040fe6b6565aac2f120295eb348ac5ef60ef8f3d0",
        "workflow": "sha256:a6e1019a9b604856d392f72fbe433c61eab1b64673e0b6c15edfa70620baaff3",
        "publication": "sha256:8c428add71083cc480394ab4651e6b48573258a5ac98172303934f2f7074c9fe",
    },
    "single": {
        "plan": "sha256:75e22dcf78ac707b5de25c7539b2fea43c41b398bfbfb7df1765250097bdc862",
        "revision": "sha256:0fb4d5eb13415d2e7cc857675b2addd8506127f03968c41a99aba03505ccf672",
        "workflow": "sha256:fa60808c18b4d2a276a4e2560901677bbf8d9601da414202a4188fd0aa3c0730",
        "publication": "sha256:19fa47cc0b1a0b91d3f4b7771f76abe17745cca12c3867987a0d9b231221a865",
    },
}


def planned(raw: dict[str, Any], params: dict[str, Any] | None = None, run_id: str = "run-1"):
    manifest = validate_manifest(raw)
    revision = revision_from_manifest(manifest, generation=3)
    publication = publication_for(revision, manifest.package.publisher)
    workflow = manifest.workflows[0]
    ids = step_run_ids_for(run_id, [step.key for step in workflow.steps])
    plan = build_plan(publication, revision, workflow.key, run_id, ids, params=params)
    return plan, revision, publication, workflow.key


def with_v2(raw: dict[str, Any], *, params=None, retry=None) -> dict[str, Any]:
    raw = copy.deepcopy(raw)
    workflow = next(iter(raw["workflows"].values()))
    if params is not None:
        workflow["params"] = params
    if retry is not None:
        workflow["steps"][0]["retry"] = retry
    return raw


@pytest.mark.parametrize("name, raw", [("diamond", DIAMOND), ("single", SINGLE)])
def test_a_manifest_without_v2_features_keeps_its_v1_digests(name, raw):
    plan, revision, publication, key = planned(raw)
    assert plan.schema == PLAN_SCHEMA_V1
    assert plan.plan_digest == V1_DIGESTS[name]["plan"]
    assert revision.revision_digest == V1_DIGESTS[name]["revision"]
    assert publication.workflow_digests[key] == V1_DIGESTS[name]["workflow"]
    assert publication.publication_digest == V1_DIGESTS[name]["publication"]
    assert "params" not in plan_to_dict(plan)
    assert all("retry" not in step for step in plan_to_dict(plan)["steps"])


def test_a_retry_of_one_attempt_is_no_v2_feature_but_changes_the_workflow_digest():
    plan, _, publication, key = planned(with_v2(SINGLE, retry={"max_attempts": 1}))
    assert plan.schema == PLAN_SCHEMA_V1
    assert publication.workflow_digests[key] != V1_DIGESTS["single"]["workflow"]


def test_params_make_a_v2_plan_whose_digest_covers_the_values():
    raw = with_v2(
        SINGLE, params={"date": {"type": "string"}, "n": {"type": "integer", "default": 3}}
    )
    one, *_ = planned(raw, {"date": "2026-12-01"})
    two, *_ = planned(raw, {"date": "2026-12-02"})
    same, *_ = planned(raw, {"date": "2026-12-01", "n": 3})
    assert one.schema == PLAN_SCHEMA_V2
    assert one.param_values == {"date": "2026-12-01", "n": 3}
    assert one.plan_digest != two.plan_digest
    assert same.plan_digest == one.plan_digest
    assert plan_to_dict(one)["params"] == {"date": "2026-12-01", "n": 3}
    assert normalize(orjson.loads(orjson.dumps(plan_to_dict(one)))) == one


@pytest.mark.parametrize(
    "given, field, rule",
    [
        ({"date": "x", "other": 1}, "params.other", "unknown_param"),
        ({"date": 5}, "params.date", "param_type"),
        ({"date": "x", "flag": "yes"}, "params.flag", "param_type"),
        ({"date": "x", "n": True}, "params.n", "param_type"),
        ({}, "params.date", "missing_param"),
    ],
)
def test_bad_params_are_invalid_input_naming_the_parameter(given, field, rule):
    raw = with_v2(
        SINGLE,
        params={
            "date": {"type": "string"},
            "n": {"type": "integer", "default": 1},
            "flag": {"type": "boolean", "default": False},
        },
    )
    with pytest.raises(InvalidInput) as caught:
        planned(raw, given)
    assert (caught.value.field, caught.value.rule) == (field, rule)


def test_params_given_to_a_workflow_without_params_are_refused():
    with pytest.raises(InvalidInput) as caught:
        planned(SINGLE, {"x": 1})
    assert caught.value.rule == "unknown_param"


def test_a_retry_makes_a_v2_plan_and_each_step_carries_its_policy():
    plan, *_ = planned(with_v2(DIAMOND, retry={"max_attempts": 3, "backoff_ms": 1000}))
    assert plan.schema == PLAN_SCHEMA_V2
    document = plan_to_dict(plan)
    assert document["params"] == {}
    retries = {step["key"]: step["retry"] for step in document["steps"]}
    assert retries["fetch"] == {"max_attempts": 3, "backoff_ms": 1000}
    assert retries["archive"] == {"max_attempts": 1, "backoff_ms": 0}
    assert plan.step("fetch").max_attempts == 3


@pytest.mark.parametrize(
    "table, key",
    [
        ({"max_attempts": 0}, "steps[0].retry.max_attempts"),
        ({"max_attempts": 65}, "steps[0].retry.max_attempts"),
        ({"max_attempts": 2, "backoff_ms": -1}, "steps[0].retry.backoff_ms"),
        ({"max_attempts": 2, "backoff_ms": 600_001}, "steps[0].retry.backoff_ms"),
        ({"max_attempts": 2, "tries": 1}, "steps[0].retry.tries"),
        ({"max_attempts": 2.0}, "steps[0].retry.max_attempts"),
        ("3", "steps[0].retry"),
    ],
)
def test_bad_retry_tables_name_the_key(table, key):
    with pytest.raises(ManifestError) as caught:
        validate_manifest(with_v2(SINGLE, retry=table))
    assert caught.value.key == key, caught.value


@pytest.mark.parametrize(
    "params, key",
    [
        ({"d": {"type": "float"}}, "type"),
        ({"d": {}}, "type"),
        ({"d": {"type": "integer", "default": "1"}}, "default"),
        ({"d": {"type": "string", "help": "x"}}, "help"),
        ({"d": {"type": "string", "description": 3}}, "description"),
        ({"d": "string"}, None),
    ],
)
def test_bad_params_tables_name_the_key(params, key):
    with pytest.raises(ManifestError) as caught:
        validate_manifest(with_v2(SINGLE, params=params))
    assert caught.value.key == key, caught.value
    assert "params.d" in str(caught.value)


@pytest.mark.parametrize("names", [("foo", "FOO"), ("Day", "dAY"), ("a-b", "A-b")])
def test_params_a_task_could_not_tell_apart_are_refused_at_publish(names):
    params = {name: {"type": "string", "default": "x"} for name in names}
    with pytest.raises(ManifestError) as caught:
        validate_manifest(with_v2(SINGLE, params=params))
    assert caught.value.key == "params", caught.value
    message = str(caught.value)
    assert all(repr(name) in message for name in names) and "QLFLOW_PARAM_" in message


def test_params_with_distinct_variables_are_accepted():
    params = {name: {"type": "string", "default": "x"} for name in ("foo", "foo_2", "bar")}
    validate_manifest(with_v2(SINGLE, params=params))


def v2_document() -> dict[str, Any]:
    raw = with_v2(
        DIAMOND,
        params={"date": {"type": "string"}},
        retry={"max_attempts": 3, "backoff_ms": 1000},
    )
    plan, *_ = planned(raw, {"date": "2026-12-01"})
    return orjson.loads(orjson.dumps(plan_to_dict(plan)))


def refused(rule: str, document: object) -> PlanError:
    with pytest.raises(PlanError) as caught:
        normalize(document)
    assert caught.value.rule == rule, caught.value
    return caught.value


def test_v1_refuses_params_by_name():
    plan, *_ = planned(DIAMOND)
    document = plan_to_dict(plan)
    document["params"] = {"date": "x"}
    assert "params" in str(refused("v2_field", document))


def test_v2_refuses_a_plan_without_v2_features():
    document = v2_document()
    document["params"] = {}
    for step in document["steps"]:
        step["retry"] = {"max_attempts": 1, "backoff_ms": 0}
    del document["plan_digest"]
    refused("schema", document)


def test_v2_needs_params_and_every_step_retry():
    document = v2_document()
    del document["params"]
    refused("missing_field", document)
    document = v2_document()
    del document["steps"][2]["retry"]
    refused("missing_field", document)


@pytest.mark.parametrize(
    "change, rule",
    [
        (lambda d: d["steps"][0]["retry"].update(max_attempts=0), "retry"),
        (lambda d: d["steps"][0]["retry"].update(backoff_ms=1.5), "retry"),
        (lambda d: d["steps"][0]["retry"].update(extra=1), "unknown_field"),
        (lambda d: d["params"].update(x=1.5), "float"),
        (lambda d: d["params"].update(x=None), "type"),
        (lambda d: d["params"].update(date="2026-12-02"), "plan_digest"),
        (lambda d: d.update(schema="qlflow/workflow-execution-plan@v3"), "schema"),
    ],
)
def test_v2_normalize_is_strict(change, rule):
    document = v2_document()
    change(document)
    refused(rule, document)


param_values = st.one_of(
    st.text(max_size=20).filter(lambda t: "\x00" not in t),
    st.integers(min_value=-(2**53) + 1, max_value=2**53 - 1),
    st.booleans(),
)


@QUICK
@given(
    values=st.dictionaries(st.from_regex(r"[a-z][a-z0-9_]{0,10}", fullmatch=True), param_values),
    attempts=st.integers(min_value=1, max_value=64),
    backoff=st.integers(min_value=0, max_value=600_000),
    drop_digest=st.booleans(),
)
def test_v2_plans_round_trip_through_json_with_the_same_digest(
    values, attempts, backoff, drop_digest
):
    declared = {name: {"type": _type_of(value)} for name, value in values.items()}
    raw = with_v2(DIAMOND, params=declared, retry={"max_attempts": attempts, "backoff_ms": backoff})
    plan, *_ = planned(raw, values)
    document = orjson.loads(orjson.dumps(plan_to_dict(plan)))
    if drop_digest:
        del document["plan_digest"]
    again = normalize(document)
    assert again == plan
    assert again.schema == (PLAN_SCHEMA_V2 if values or attempts > 1 else PLAN_SCHEMA_V1)
    assert normalize(plan) == plan


@QUICK
@given(field=st.sampled_from(["params", "retry"]), data=st.data())
def test_a_v2_field_never_slips_into_a_v1_plan(field, data):
    plan, *_ = planned(DIAMOND)
    document = plan_to_dict(plan)
    value = data.draw(st.one_of(st.just({}), st.dictionaries(st.text(max_size=3), st.integers())))
    if field == "params":
        document["params"] = value
    else:
        document["steps"][data.draw(st.integers(0, 3))]["retry"] = value
    refused("v2_field", document)


def _type_of(value: object) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    return "string"
