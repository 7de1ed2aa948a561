"""Field checks of the package model and the execution plan.

Each check returns the value it accepts, or raises `PlanError` whose `rule` names
what was wrong: a float is never an integer, a bool is never a number, a name
never holds "@" or "#" (they build task references).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NoReturn

import orjson

from domain.canonical import MAX_SAFE_INTEGER, is_digest
from domain.errors import PlanError

# Package, Task, Workflow and Step names. No "@" or "#": they build task refs.
NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")
# Ids that appear in stream ids and event ids: at most 36 characters.
ID_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9:._-]{0,35}")
# Project and installation identifiers.
IDENTIFIER_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9:._-]{0,127}")
_MAX_PATH_CHARS = 1024


def refuse_type(value: object, what: str, expected: str) -> NoReturn:
    """Raise PlanError("float") for a float, else PlanError("type")."""
    if isinstance(value, float):
        raise PlanError("float", f"{what} is the float {value!r}; only integers are allowed")
    raise PlanError("type", f"{what} must be {expected}, not {type(value).__name__}")


def check_text(value: object, pattern: re.Pattern[str], rule: str, what: str) -> str:
    """Return `value` if it is a str fully matching `pattern`; else PlanError(rule)."""
    if not isinstance(value, str):
        refuse_type(value, what, "a string")
    if pattern.fullmatch(value) is None:
        raise PlanError(rule, f"{what} {value!r} must match {pattern.pattern}")
    return value


def check_name(value: object, rule: str, what: str) -> str:
    """A package, Task, Workflow or Step name: 1-64 of [A-Za-z0-9_-], alphanumeric first."""
    return check_text(value, NAME_PATTERN, rule, what)


def check_id(value: object, rule: str, what: str) -> str:
    """An id used in stream or event ids: 1-36 of [A-Za-z0-9:._-], alphanumeric first."""
    return check_text(value, ID_PATTERN, rule, what)


def check_digest(value: object, rule: str, what: str) -> str:
    """A digest: "sha256:" and 64 lowercase hex digits."""
    if not isinstance(value, str):
        refuse_type(value, what, "a digest string")
    if not is_digest(value):
        raise PlanError(rule, f"{what} {value!r} must be sha256:<64 lowercase hex>")
    return value


def check_positive_int(value: object, rule: str, what: str) -> int:
    """An integer from 1 to 2**53 - 1; a bool is not an integer."""
    if isinstance(value, bool) or not isinstance(value, int):
        refuse_type(value, what, "an integer")
    if not 1 <= value <= MAX_SAFE_INTEGER:
        raise PlanError(rule, f"{what} must be a positive integer up to 2**53 - 1, not {value}")
    return value


def check_bool(value: object, what: str) -> bool:
    """A real bool (0 and 1 are not)."""
    if not isinstance(value, bool):
        refuse_type(value, what, "a bool")
    return value


def check_list(value: object, what: str) -> Sequence[Any]:
    """A list or tuple (never a str, which is also a sequence)."""
    if not isinstance(value, (list, tuple)):
        refuse_type(value, what, "a list")
    return value


def check_mapping(value: object, what: str) -> Mapping[str, Any]:
    """A mapping whose keys are all str."""
    if not isinstance(value, Mapping):
        refuse_type(value, what, "an object")
    for key in value:
        if not isinstance(key, str):
            raise PlanError("type", f"{what} has the non-string key {key!r}")
    return value


def check_fields(
    value: Mapping[str, Any], required: Iterable[str], what: str, optional: Iterable[str] = ()
) -> None:
    """Refuse unknown fields ("unknown_field") and missing ones ("missing_field")."""
    required = set(required)
    allowed = required | set(optional)
    unknown = sorted(set(value) - allowed)
    if unknown:
        raise PlanError("unknown_field", f"{what} has unknown field(s) {', '.join(unknown)}")
    missing = sorted(required - set(value))
    if missing:
        raise PlanError("missing_field", f"{what} lacks field(s) {', '.join(missing)}")


def check_file_path(value: object, what: str) -> str:
    """A relative POSIX path inside the package folder."""
    if not isinstance(value, str):
        refuse_type(value, what, "a path string")
    segments = value.split("/")
    if (
        not value
        or len(value) > _MAX_PATH_CHARS
        or value.startswith("/")
        or "\\" in value
        or "\x00" in value
        or any(segment in ("", ".", "..") for segment in segments)
    ):
        raise PlanError(
            "task_files", f"{what} {value!r} must be a relative path inside the package folder"
        )
    return value


def load_json(value: object) -> object:
    """Decode JSON text or bytes (PlanError("json") if it is not JSON); any other
    value is returned as it is."""
    if isinstance(value, (bytes, str)):
        try:
            return orjson.loads(value)
        except orjson.JSONDecodeError as error:
            raise PlanError("json", f"not valid JSON: {error}") from None
    return value


def check_same(stated: object, computed: str, rule: str, what: str) -> None:
    """Refuse (PlanError(rule)) a stated id or digest that its content does not give."""
    if stated != computed:
        raise PlanError(rule, f"{what} states {rule} {stated!r} but its content gives {computed!r}")
