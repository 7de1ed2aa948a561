"""What text both stores can hold."""

from __future__ import annotations

from typing import Any


def is_storable_text(value: Any) -> bool:
    """A non-empty str of UTF-8 encodable text (no lone surrogate) without NUL."""
    if not isinstance(value, str) or not value or "\x00" in value:
        return False
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
