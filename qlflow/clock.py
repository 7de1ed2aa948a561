"""The wall clock of the facade, the CLI and the host loop: the one place that reads it.

The domain never reads a clock; every decision gets `now_ms` from its caller, and a
caller that passes none gets this.
"""

from __future__ import annotations

import time


def wall_clock_ms() -> int:
    """Milliseconds since the Unix epoch, now."""
    return time.time_ns() // 1_000_000
