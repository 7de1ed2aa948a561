"""The manifest's plan-v2 keys: a Workflow's `params` and a step's `retry`.

    [workflows.nightly.params.date]
    type = "string"            # string | integer | boolean
    default = "2026-12-01"     # optional: without it the parameter is required
    description = "the day to process"

    steps = [{ key = "fetch", task = "fetch", retry = { max_attempts = 3, backoff_ms = 1000 } }]

Every refusal is a ManifestError naming the table and the key.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from domain.errors import PlanError
from domain.manifest_checks import NAME_RULE, describe, manifest_error, name_at, text_at
from domain.params import (
    MAX_PARAMS,
    PARAM_TYPES,
    ParamDefinition,
    env_name,
    env_name_clash,
    type_problem,
)
from domain.retry import RetryPolicy, retry_problem

PARAM_KEYS = ("type", "default", "description")
RETRY_KEYS = ("max_attempts", "backoff_ms")


def params_at(source: str, table: str, raw: Any) -> tuple[ParamDefinition, ...]:
    """The `params` table of a Workflow (`table` is "workflows.<key>")."""
    if not isinstance(raw, Mapping):
        raise manifest_error(
            source, table, "params", f"must be a table of parameters, not {describe(raw)}"
        )
    if len(raw) > MAX_PARAMS:
        raise manifest_error(source, table, "params", f"at most {MAX_PARAMS} parameters")
    clash = env_name_clash([name for name in raw if isinstance(name, str)])
    if clash is not None:
        first, second = clash
        raise manifest_error(
            source,
            table,
            "params",
            f"parameters {first!r} and {second!r} would both be {env_name(first)} to the "
            "task: rename one",
        )
    params = []
    for name in sorted(raw):
        name_at(source, table, f"params.{name}", name, "parameter name", NAME_RULE)
        where = f"{table}.params.{name}"
        entry = raw[name]
        if not isinstance(entry, Mapping):
            raise manifest_error(source, where, None, f"must be a table, not {describe(entry)}")
        for key in entry:
            if key not in PARAM_KEYS:
                raise manifest_error(
                    source, where, key, f"unknown key (allowed: {', '.join(PARAM_KEYS)})"
                )
        if "type" not in entry:
            raise manifest_error(
                source, where, "type", f"missing (one of {', '.join(PARAM_TYPES)})"
            )
        kind = entry["type"]
        if kind not in PARAM_TYPES:
            raise manifest_error(
                source,
                where,
                "type",
                f"must be one of {', '.join(PARAM_TYPES)}, not {describe(kind)}",
            )
        default = entry.get("default")
        if default is not None:
            problem = type_problem(kind, default)
            if problem is not None:
                raise manifest_error(
                    source, where, "default", f"{problem}, not {describe(default)}"
                )
        description = entry.get("description")
        if description is not None:
            text_at(source, where, "description", description)
        params.append(ParamDefinition(name, kind, default, description))
    return tuple(params)


def retry_at(source: str, table: str, where: str, raw: Any) -> RetryPolicy:
    """A step's `retry` table (`where` is "steps[<i>]")."""
    key = f"{where}.retry"
    if not isinstance(raw, Mapping):
        raise manifest_error(
            source,
            table,
            key,
            f"must be a table {{ max_attempts = 3, backoff_ms = 1000 }}, not {describe(raw)}",
        )
    for name in raw:
        if name not in RETRY_KEYS:
            raise manifest_error(
                source, table, f"{key}.{name}", f"unknown key (allowed: {', '.join(RETRY_KEYS)})"
            )
    max_attempts = raw.get("max_attempts", 1)
    backoff_ms = raw.get("backoff_ms", 0)
    problem = retry_problem(max_attempts, backoff_ms)
    if problem is not None:
        field = "max_attempts" if problem.startswith("max_attempts") else "backoff_ms"
        raise manifest_error(source, table, f"{key}.{field}", problem)
    try:
        return RetryPolicy(max_attempts, backoff_ms)
    except PlanError as error:  # pragma: no cover - retry_problem says the same
        raise manifest_error(source, table, key, str(error)) from None
