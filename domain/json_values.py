"""Rules for JSON values a caller hands in (a Task's output, say): what JSON can hold."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import orjson

from domain.errors import InvalidInput

MAX_OUTPUT_BYTES = 64 * 1024  # a step's output, encoded as JSON


def check_finite(value: Any, field: str) -> None:
    """Refuse NaN and the infinities anywhere in `value` (InvalidInput, rule
    "finite_number"): JSON has no such numbers. Stored, they would turn into null,
    and the same value handed in again would no longer match what was stored."""
    pending: list[tuple[str, Any]] = [(field, value)]
    while pending:
        path, item = pending.pop()
        if isinstance(item, float) and not math.isfinite(item):
            raise InvalidInput(
                field,
                "finite_number",
                f"{path} is {item!r}: JSON numbers are finite; send null or a string instead",
            )
        if isinstance(item, Mapping):
            pending.extend((f"{path}.{key}", inner) for key, inner in item.items())
        elif isinstance(item, (list, tuple)):
            pending.extend((f"{path}[{index}]", inner) for index, inner in enumerate(item))


def check_output_size(value: Any, field: str) -> None:
    """Refuse a value whose JSON encoding passes MAX_OUTPUT_BYTES (InvalidInput, rule
    "output_size"), or that JSON cannot encode at all (rule "json")."""
    if value is None:
        return
    try:
        size = len(orjson.dumps(value))
    except (TypeError, orjson.JSONEncodeError) as error:
        raise InvalidInput(field, "json", f"{field} is not JSON: {error}") from None
    if size > MAX_OUTPUT_BYTES:
        raise InvalidInput(
            field,
            "output_size",
            f"{field} is {size} bytes as JSON; at most {MAX_OUTPUT_BYTES} (64 KiB)",
        )
