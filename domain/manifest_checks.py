"""Value checks of a package manifest that say where the value is.

Every refusal is a `ManifestError` naming the file, the table and the key, e.g.

    qlflow.toml: [workflows.nightly] steps[1].task: unknown task 'archiv' (tasks: archive, fetch)

and describing the value it found ("a list ['a']"), so a person can find and fix it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from domain.errors import ManifestError
from domain.fields import IDENTIFIER_PATTERN, NAME_PATTERN

# Publishers name streams and event data: at most 36 characters.
PUBLISHER_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,35}")

NameRule = tuple[re.Pattern[str], str]  # a pattern and how to say it to a person
NAME_RULE: NameRule = (
    NAME_PATTERN,
    "1-64 characters of A-Z a-z 0-9 _ -, starting with a letter or digit",
)
PUBLISHER_RULE: NameRule = (
    PUBLISHER_PATTERN,
    "1-36 characters of A-Z a-z 0-9 . _ -, starting with a letter or digit",
)
IDENTIFIER_RULE: NameRule = (
    IDENTIFIER_PATTERN,
    "1-128 characters of A-Z a-z 0-9 : . _ -, starting with a letter or digit",
)


def manifest_error(source: str, table: str | None, key: str | None, problem: str) -> ManifestError:
    """Build a ManifestError whose message (and attributes) name file, table and key."""
    where = source
    if table is not None:
        where += f": [{table}]"
    if key is not None:
        where += f" {key}" if table is not None else f": {key}"
    return ManifestError(f"{where}: {problem}", source=source, table=table, key=key)


def refuse_unknown_keys(
    source: str, table: str | None, raw: Mapping[str, Any], allowed: tuple[str, ...], what: str
) -> None:
    """Refuse a key of `raw` that `allowed` does not list (a table at the top level)."""
    for name in raw:
        if name not in allowed:
            listed = f"(allowed: {', '.join(allowed)})"
            if table is None:
                raise manifest_error(source, None, None, f"unknown {what} [{name}] {listed}")
            raise manifest_error(source, table, name, f"unknown {what} {listed}")


def table_at(source: str, table: str | None, key: str, raw: Any) -> Mapping[str, Any]:
    """`raw` if it is a table."""
    if not isinstance(raw, Mapping):
        raise manifest_error(source, table, key, f"must be a table, not {kind_of(raw)}")
    return raw


def required_name(source: str, table: str, raw: Mapping[str, Any], key: str, rule: NameRule) -> str:
    """The name under `key`, which must be there and follow `rule`."""
    if key not in raw:
        raise manifest_error(source, table, key, f"missing ({rule[1]})")
    return name_at(source, table, key, raw[key], key, rule)


def optional_name(
    source: str, table: str, raw: Mapping[str, Any], key: str, default: str, rule: NameRule
) -> str:
    """The name under `key` following `rule`, or `default` when there is none."""
    if key not in raw:
        return default
    return name_at(source, table, key, raw[key], key, rule)


def name_at(
    source: str, table: str, key: str, value: Any, what: str, rule: NameRule = NAME_RULE
) -> str:
    """`value` if it is a string following `rule`."""
    if not isinstance(value, str):
        raise manifest_error(source, table, key, f"{what} must be a string, not {describe(value)}")
    pattern, description = rule
    if not pattern.fullmatch(value):
        raise manifest_error(source, table, key, f"{what} {value!r} must be {description}")
    return value


def text_at(source: str, table: str, key: str, value: Any) -> str:
    """`value` if it is a string without NUL."""
    if not isinstance(value, str):
        raise manifest_error(source, table, key, f"must be a string, not {describe(value)}")
    if "\x00" in value:
        raise manifest_error(source, table, key, "must not contain a NUL character")
    return value


def bool_at(source: str, table: str, key: str, value: Any) -> bool:
    """`value` if it is true or false."""
    if not isinstance(value, bool):
        raise manifest_error(source, table, key, f"must be true or false, not {describe(value)}")
    return value


def relative_path_at(source: str, table: str, key: str, raw: Any) -> str:
    """`raw` if it is a plain relative path inside the package folder."""
    path = text_at(source, table, key, raw)
    problem = None
    if not path:
        problem = "an empty path"
    elif path.startswith(("/", "\\")) or re.match(r"[A-Za-z]:", path):
        problem = "an absolute path; name files relative to the package folder"
    elif "\\" in path:
        problem = "a path with a backslash; use '/' between folders"
    elif any(part in ("", ".", "..") for part in path.split("/")):
        problem = "not a plain relative path inside the package (no '..', '.' or empty parts)"
    if problem:
        raise manifest_error(source, table, key, f"{path!r} is {problem}")
    return path


def kind_of(value: Any) -> str:
    """What a TOML value is, in words: "a boolean", "an integer", "a table"…"""
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a float"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, Mapping):
        return "a table"
    return type(value).__name__


def describe(value: Any) -> str:
    """A value's kind and (up to 60 characters of) its repr."""
    text = repr(value)
    if len(text) > 60:
        text = text[:57] + "..."
    return f"{kind_of(value)} {text}"
