"""What an executor knows about how an Attempt ran — exit code, signal, pid, log
location — kept apart from the step's output (docs/DESIGN.md, "Outputs and
executions").

An Attempt's terminal event carries it as `execution`, beside `output`; only the
output is passed downstream. Completions written before `execution` existed held
the local executor's record in `output`; `split` reads them as they were meant.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from domain.errors import InvalidInput

# field -> the JSON types it may hold (None always allowed)
FIELDS: Mapping[str, tuple[type, ...]] = {
    "exit_code": (int,),
    "signal": (str,),
    "pid": (int,),
    "log_path": (str,),
    "stopped_by": (str,),
    "error": (str,),
}
MAX_TEXT = 4096  # characters of one text field

# An old local-executor record held in `output`: these keys and nothing else.
_LEGACY_KEYS = frozenset(FIELDS)
_LEGACY_REQUIRED = frozenset({"exit_code", "log_path"})


def check_execution(value: object, field: str = "execution") -> dict[str, Any] | None:
    """A copy of `value` if it is None or an object of the known fields with the right
    types (InvalidInput otherwise, saying which field is wrong)."""
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise InvalidInput(field, "object", f"{field} must be a mapping of {sorted(FIELDS)}")
    checked: dict[str, Any] = {}
    for key, item in value.items():
        kinds = FIELDS.get(key) if isinstance(key, str) else None
        if kinds is None:
            raise InvalidInput(
                field, "known_field", f"{field} has unknown field {key!r}; known: {sorted(FIELDS)}"
            )
        if item is not None and (isinstance(item, bool) or not isinstance(item, kinds)):
            raise InvalidInput(
                f"{field}.{key}", "type", f"{field}.{key} must be {kinds[0].__name__} or None"
            )
        if isinstance(item, str) and len(item) > MAX_TEXT:
            raise InvalidInput(
                f"{field}.{key}", "length", f"{field}.{key} holds more than {MAX_TEXT} characters"
            )
        checked[key] = item
    return checked


def split(data: Mapping[str, Any]) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """(output, execution) of an Attempt's terminal event data. An event without an
    `execution` field whose output is exactly an old local-executor record (its
    known fields only, `exit_code` and `log_path` among them) was never the task's
    output: it reads as the execution, with output None."""
    output = data.get("output")
    execution = data.get("execution")
    if "execution" not in data and isinstance(output, Mapping) and _is_legacy(output):
        return None, dict(output)
    return (
        None if output is None else dict(output),
        None if execution is None else dict(execution),
    )


def _is_legacy(output: Mapping[str, Any]) -> bool:
    keys = set(output)
    return _LEGACY_REQUIRED <= keys <= _LEGACY_KEYS
