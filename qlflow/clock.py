"""This host's wall clock, for what a person reads (times "ago", a progress line).

The domain never reads a clock; every decision gets `now_ms` from its caller, and a
Runtime call that passes none decides at the store's time (`Runtime.clock_ms()`,
docs/DESIGN.md "One clock per store"), never at this host's.
"""

from __future__ import annotations

from eventstore.clock import host_ms


def wall_clock_ms() -> int:
    """Milliseconds since the Unix epoch on this host, now."""
    return host_ms()
