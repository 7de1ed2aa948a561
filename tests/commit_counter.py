"""Counting the commits a test's calls make, by unit of work."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from eventstore import faults


@contextmanager
def commits_by_unit() -> Iterator[dict[str, int]]:
    """Yield a dict that counts each unit of work's commits while the block runs."""
    units: dict[str, int] = {}

    def count(name: str) -> None:
        if name.endswith(".after_commit"):
            unit = name.removesuffix(".after_commit")
            units[unit] = units.get(unit, 0) + 1

    faults.watch(count)
    try:
        yield units
    finally:
        faults.disarm()
