"""`IN (?, ?, ...)` lists of ids, in chunks either database takes."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

T = TypeVar("T")

IN_CHUNK = 512  # values per IN (...) list, well under either database's parameter limit


def chunks(values: Sequence[T], *, padded: bool = False) -> list[list[T]]:
    """`values` in lists of at most `IN_CHUNK`. `padded`: each list filled up to a
    power of two with its last value (the same rows), so a statement kept prepared
    has a few texts, not one per count of ids."""
    out = []
    for start in range(0, len(values), IN_CHUNK):
        chunk = list(values[start : start + IN_CHUNK])
        if padded:
            chunk += chunk[-1:] * ((1 << (len(chunk) - 1).bit_length()) - len(chunk))
        out.append(chunk)
    return out


def marks(chunk: Sequence[object]) -> str:
    """The `?` marks of an IN list of `chunk`."""
    return ", ".join("?" * len(chunk))
