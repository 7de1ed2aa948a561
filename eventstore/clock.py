"""The host's clock, as the stores read it (docs/DESIGN.md, "One clock per store").

A store's time is what decides leases: PostgreSQL's own clock, read in the round trip
of a write's first statement; SQLite's host, which is the one machine that writes it.
Between writes a store estimates its time from this host's clock and the offset its
last answer showed.
"""

from __future__ import annotations

import time
from collections.abc import Callable

HostClock = Callable[[], int]


def host_ms() -> int:
    """Milliseconds since the Unix epoch on this host, now."""
    return time.time_ns() // 1_000_000
