"""Values from the store as the pages show them: a step's output and a Run's
parameters as JSON text (the templates escape it), cut to fit a table cell."""

from __future__ import annotations

from typing import Any

import orjson

OUTPUT_CHARS = 120  # a step table's output cell; the step page shows all of it


def json_text(value: Any, pretty: bool = False) -> str:
    """`value` as JSON with sorted keys (indented when `pretty`)."""
    option = orjson.OPT_SORT_KEYS | (orjson.OPT_INDENT_2 if pretty else 0)
    return orjson.dumps(value, option=option).decode()


def clipped(text: str, limit: int = OUTPUT_CHARS) -> tuple[str, bool]:
    """The first `limit` characters of `text`, and whether anything was cut."""
    if len(text) <= limit:
        return text, False
    return text[:limit] + "…", True


def param_value(value: Any) -> str:
    """A parameter's value as a start form and the params section write it."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)
