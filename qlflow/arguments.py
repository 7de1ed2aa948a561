"""Checks of the facade's own arguments, made before anything is read or written:
values the domain never sees (instants the facade fills in, filters and limits of
reads, a Lease handed back by a caller), and the storable-text rule for names and
ids. Everything the domain decides it checks itself; its InvalidInput passes
through the facade unchanged."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Any

from actors.workers import Completion, Lease
from domain.canonical import MAX_SAFE_INTEGER
from domain.errors import InvalidInput
from domain.text import is_storable_text

MAX_MS = MAX_SAFE_INTEGER  # every instant and duration fits a JSON number exactly


def instant(field: str, value: Any) -> int:
    """An epoch-ms instant: an int from 0 to MAX_MS (a bool is not an int)."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_MS:
        raise InvalidInput(
            field,
            "non-negative integer",
            f"{field} must be an int from 0 to {MAX_MS} (milliseconds), got {value!r}",
        )
    return value


def text(field: str, value: Any) -> str:
    """A non-empty string of UTF-8 text without NUL (both stores can hold it)."""
    if not isinstance(value, str) or not is_storable_text(value):
        raise InvalidInput(
            field,
            "non-empty string",
            f"{field} must be a non-empty string of UTF-8 text without NUL, got {value!r}",
        )
    return value


def optional_text(field: str, value: Any) -> str | None:
    """None, or a text (see `text`)."""
    return None if value is None else text(field, value)


def text_list(field: str, values: Any, most: int) -> list[str]:
    """An iterable (not one string) of at most `most` texts, as a list in its order."""
    if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
        raise InvalidInput(
            field,
            "iterable of strings",
            f"{field} must be a list of strings, got {type(values).__name__}",
        )
    found = []
    for value in values:
        found.append(text(f"{field}[]", value))
        if len(found) > most:
            raise InvalidInput(field, f"at most {most}", f"{field} holds more than {most} items")
    return found


def texts(field: str, values: Any) -> frozenset[str]:
    """An iterable of texts (not one string) as a set."""
    if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
        raise InvalidInput(
            field,
            "iterable of strings",
            f"{field} must be a list of strings, got {type(values).__name__}",
        )
    return frozenset(text(f"{field}[]", value) for value in values)


def positive(field: str, value: Any, low: int = 1, high: int = MAX_MS) -> int:
    """An int from `low` to `high` (a bool is not an int)."""
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        bound = f"between {low} and {high}"
        raise InvalidInput(
            field, "integer range", f"{field} must be an integer {bound}, got {value!r}"
        )
    return value


def lease_of(lease: Any) -> Lease:
    """A Lease as `lease_attempts` handed it out: every field of its type."""
    if not isinstance(lease, Lease):
        raise InvalidInput(
            "lease", "Lease", f"expected a Lease from lease_attempts, got {type(lease).__name__}"
        )
    for name in ("lease_id", "attempt_id", "run_id", "step_key", "task_ref", "worker_id"):
        text(f"lease.{name}", getattr(lease, name))
    positive("lease.version", lease.version)
    instant("lease.expires_at_ms", lease.expires_at_ms)
    for name in ("stop_requested", "started", "step_timed_out"):
        flag(f"lease.{name}", getattr(lease, name))
    return lease


def flag(field: str, value: Any) -> bool:
    """A bool, refused otherwise (1 or "yes" are not flags)."""
    if not isinstance(value, bool):
        raise InvalidInput(field, "bool", f"{field} must be a bool, got {value!r}")
    return value


def completions_of(field: str, values: Any, most: int) -> list[Completion]:
    """A list (any iterable, not one string) of at most `most` Completions, each with
    its Lease checked (`lease_of`) and its output copied (the domain checks the rest)."""
    if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
        raise InvalidInput(field, "iterable", f"{field} must be a list of qlflow.Completion")
    found = []
    for index, completion in enumerate(values):
        if not isinstance(completion, Completion):
            raise InvalidInput(
                field,
                "Completion",
                f"{field}[{index}] must be a qlflow.Completion, got {type(completion).__name__}",
            )
        if completion.result_code is not None:
            text(f"{field}[{index}].result_code", completion.result_code)
        output, execution = completion.output, completion.execution
        found.append(
            replace(
                completion,
                lease=lease_of(completion.lease),
                # copies the caller cannot change; anything else the domain refuses
                output=dict(output) if isinstance(output, Mapping) else output,
                execution=dict(execution) if isinstance(execution, Mapping) else execution,
            )
        )
        if len(found) > most:
            raise InvalidInput(field, f"at most {most}", f"{field} holds more than {most} items")
    return found
