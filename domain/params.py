"""Workflow parameters: what a Workflow declares and what a start binds (plan v2).

A Workflow declares each parameter's type (`string`, `integer` or `boolean`;
canonical JSON has no floats), an optional default and a description. A start
gives values; `bind_params` checks them against the declarations and returns the
complete set, defaults filled in, that the plan binds. Every refusal is an
InvalidInput whose `field` is `params.<name>`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from domain.canonical import MAX_SAFE_INTEGER
from domain.errors import InvalidInput, PlanError
from domain.fields import NAME_PATTERN

PARAM_TYPES = ("string", "integer", "boolean")
MAX_PARAMS = 64
MAX_STRING_CHARS = 4096

ParamValue = str | int | bool


class ParamText(str):
    """A value given as text (a command line's `-p name=value`): `bind_params` reads
    it as the declared type (integers in decimal, booleans as true/false)."""


@dataclass(frozen=True, slots=True)
class ParamDefinition:
    """One declared parameter. `default` is None when the parameter is required."""

    name: str
    type: str
    default: ParamValue | None = None
    description: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not NAME_PATTERN.fullmatch(self.name):
            raise PlanError("param_name", f"parameter name {self.name!r} is not a valid name")
        if self.type not in PARAM_TYPES:
            raise PlanError(
                "param_type", f"parameter {self.name!r}: type must be one of {PARAM_TYPES}"
            )
        if self.default is not None and type_problem(self.type, self.default) is not None:
            raise PlanError(
                "param_default",
                f"parameter {self.name!r}: default {self.default!r} is not a {self.type}",
            )
        if self.description is not None and not isinstance(self.description, str):
            raise PlanError("param_description", f"parameter {self.name!r}: description is text")

    @property
    def required(self) -> bool:
        return self.default is None


def env_name(name: str) -> str:
    """The environment variable a task reads a parameter from: QLFLOW_PARAM_<NAME>."""
    return f"QLFLOW_PARAM_{name.upper()}"


def env_name_clash(names: list[str] | tuple[str, ...]) -> tuple[str, str] | None:
    """Two parameter names a task could not tell apart (one environment variable,
    `foo` and `FOO`), or None."""
    seen: dict[str, str] = {}
    for name in sorted(names):
        other = seen.setdefault(env_name(name), name)
        if other != name:
            return other, name
    return None


def type_problem(type_name: str, value: object) -> str | None:
    """Why `value` is not a `type_name` value, or None when it is one."""
    if type_name == "boolean":
        return None if isinstance(value, bool) else "must be true or false"
    if type_name == "integer":
        if type(value) is not int:
            return "must be an integer"
        if abs(value) > MAX_SAFE_INTEGER:
            return f"must be at most {MAX_SAFE_INTEGER} in size"
        return None
    if not isinstance(value, str):
        return "must be a string"
    if len(value) > MAX_STRING_CHARS or "\x00" in value:
        return f"must be at most {MAX_STRING_CHARS} characters without NUL"
    return None


def bind_params(
    declared: tuple[ParamDefinition, ...], given: Mapping[str, Any] | None
) -> dict[str, ParamValue]:
    """The complete parameter set a start binds: `given` checked against `declared`
    (unknown name, wrong type, missing required value), defaults filled in."""
    values = {} if given is None else given
    if not isinstance(values, Mapping):
        raise InvalidInput("params", "object", "params must be a mapping of name to value")
    by_name = {param.name: param for param in declared}
    for name in sorted(values, key=str):
        if name not in by_name:
            known = ", ".join(sorted(by_name)) or "none"
            raise InvalidInput(
                f"params.{name}",
                "unknown_param",
                f"unknown parameter {name!r} (this Workflow declares: {known})",
            )
    bound: dict[str, ParamValue] = {}
    for name, param in sorted(by_name.items()):
        if name in values:
            value = values[name]
            if isinstance(value, ParamText):
                value = _from_text(param, str(value))
            problem = type_problem(param.type, value)
            if problem is not None:
                raise InvalidInput(
                    f"params.{name}",
                    "param_type",
                    f"parameter {name!r} is {_an(param.type)} {param.type}: {value!r} {problem}",
                )
            bound[name] = value
        elif param.default is not None:
            bound[name] = param.default
        else:
            raise InvalidInput(
                f"params.{name}",
                "missing_param",
                f"parameter {name!r} ({param.type}) is required: give it with -p {name}=VALUE",
            )
    return bound


def _an(word: str) -> str:
    return "an" if word[:1] in "aeiou" else "a"


def param_texts(pairs: list[str] | tuple[str, ...]) -> dict[str, ParamText]:
    """`name=value` texts (a command line's `-p`, repeatable) as values for `bind_params`;
    a name given twice or a text without `=` is refused."""
    values: dict[str, ParamText] = {}
    for text in pairs:
        name, sep, raw = text.partition("=")
        if not sep or not name:
            raise InvalidInput("params", "name_value", f"-p {text!r} is not name=value")
        if name in values:
            raise InvalidInput(f"params.{name}", "duplicate", f"parameter {name!r} given twice")
        values[name] = ParamText(raw)
    return values


def _from_text(param: ParamDefinition, raw: str) -> ParamValue:
    if param.type == "string":
        return raw
    if param.type == "boolean":
        if raw in ("true", "false"):
            return raw == "true"
        raise InvalidInput(
            f"params.{param.name}",
            "param_type",
            f"parameter {param.name!r} is a boolean: give true or false, not {raw!r}",
        )
    try:
        return int(raw, 10)
    except ValueError:
        raise InvalidInput(
            f"params.{param.name}",
            "param_type",
            f"parameter {param.name!r} is an integer: {raw!r} is not one",
        ) from None


def params_document(declared: tuple[ParamDefinition, ...]) -> dict[str, Any]:
    """The declarations as JSON (revision content and the Workflow's semantic digest)."""
    document: dict[str, Any] = {}
    for param in sorted(declared, key=lambda p: p.name):
        entry: dict[str, Any] = {"type": param.type}
        if param.default is not None:
            entry["default"] = param.default
        if param.description is not None:
            entry["description"] = param.description
        document[param.name] = entry
    return document


def params_from_document(value: Mapping[str, Any], what: str) -> tuple[ParamDefinition, ...]:
    """Strictly read `params_document` output back."""
    if not isinstance(value, Mapping):
        raise PlanError("type", f"{what} params must be an object")
    params = []
    for name, entry in value.items():
        if not isinstance(entry, Mapping) or "type" not in entry:
            raise PlanError("type", f"{what} parameter {name!r} must be an object with a type")
        unknown = sorted(set(entry) - {"type", "default", "description"})
        if unknown:
            raise PlanError("unknown_field", f"{what} parameter {name!r}: {', '.join(unknown)}")
        params.append(
            ParamDefinition(name, entry["type"], entry.get("default"), entry.get("description"))
        )
    return tuple(sorted(params, key=lambda p: p.name))
