"""What plan v2 adds to a plan: bound parameter values and per-step retry policies.

A plan uses v2 only when its Workflow declares parameters or a step may be
retried (max_attempts > 1); otherwise it is a v1 plan, byte for byte. In a v2
plan the top level has `params` (every declared name with its bound value) and
every step has `retry` (`max_attempts`, `backoff_ms`). A v1 plan refuses both
fields; a v2 plan that uses neither is refused as not canonical.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from domain.errors import PlanError
from domain.fields import NAME_PATTERN, check_mapping, refuse_type
from domain.params import PARAM_TYPES, ParamValue, type_problem
from domain.retry import retry_problem

PLAN_SCHEMA_V1 = "qinglong/plugin-package-workflow-execution-plan@v1"
PLAN_SCHEMA_V2 = "qlflow/workflow-execution-plan@v2"
PLAN_SCHEMAS = (PLAN_SCHEMA_V1, PLAN_SCHEMA_V2)
V2_PLAN_FIELDS = ("params",)
V2_STEP_FIELDS = ("retry",)

Params = tuple[tuple[str, ParamValue], ...]


def schema_for(params: Params, max_attempts: Iterable[int]) -> str:
    """The schema a plan with these parameters and step attempt limits has."""
    if params or any(limit > 1 for limit in max_attempts):
        return PLAN_SCHEMA_V2
    return PLAN_SCHEMA_V1


def check_schema(value: object) -> str:
    """`value` if it names a plan schema this code reads."""
    if value not in PLAN_SCHEMAS:
        raise PlanError("schema", f"plan schema must be one of {PLAN_SCHEMAS}, not {value!r}")
    return str(value)


def refuse_v2_fields(document: Mapping[str, Any], fields: tuple[str, ...], what: str) -> None:
    """A v1 plan (or step) carrying a v2 field is refused, naming the field."""
    for name in fields:
        if name in document:
            raise PlanError(
                "v2_field",
                f"{what} has {name!r}, a field of {PLAN_SCHEMA_V2}; a v1 plan has none",
            )


def normalize_params(raw: object) -> Params:
    """A v2 plan's bound parameter values, sorted by name."""
    values = check_mapping(raw, "plan params")
    params = []
    for name in sorted(values):
        if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name):
            raise PlanError("param_name", f"plan parameter name {name!r} is not a valid name")
        value = values[name]
        if all(type_problem(kind, value) is not None for kind in PARAM_TYPES):
            refuse_type(value, f"plan parameter {name!r}", "a string, an integer or a boolean")
        params.append((name, value))
    return tuple(params)


def normalize_retry(raw: object, what: str) -> tuple[int, int]:
    """A v2 plan step's (max_attempts, backoff_ms)."""
    policy = check_mapping(raw, f"{what} retry")
    unknown = sorted(set(policy) - {"max_attempts", "backoff_ms"})
    missing = sorted({"max_attempts", "backoff_ms"} - set(policy))
    if unknown or missing:
        raise PlanError(
            "unknown_field" if unknown else "missing_field",
            f"{what} retry: {', '.join(unknown or missing)}",
        )
    problem = retry_problem(policy["max_attempts"], policy["backoff_ms"])
    if problem is not None:
        raise PlanError("retry", f"{what}: {problem}")
    return policy["max_attempts"], policy["backoff_ms"]


def check_uses_v2(schema: str, params: Params, max_attempts: Iterable[int]) -> None:
    """A plan's schema must be the one its content calls for."""
    expected = schema_for(params, max_attempts)
    if schema != expected:
        raise PlanError(
            "schema",
            f"a plan with these parameters and retry policies has schema {expected!r}, "
            f"not {schema!r}",
        )


def retry_field(max_attempts: int, backoff_ms: int) -> dict[str, int]:
    """A v2 plan step's `retry` member."""
    return {"max_attempts": max_attempts, "backoff_ms": backoff_ms}
