"""Rules for JSON values a caller hands in (a Task's output, say): what JSON can hold."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from domain.errors import InvalidInput


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
