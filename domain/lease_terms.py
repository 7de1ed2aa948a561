"""The terms a worker may ask of a lease: how long it lives before it must be renewed."""

from __future__ import annotations

from domain.errors import InvalidInput
from domain.transitions import MAX_LEASE_TTL_MS, MIN_LEASE_TTL_MS


def check_lease_ttl(ttl_ms: object) -> int:
    """Refuse a lease TTL that is not an int from MIN_LEASE_TTL_MS to MAX_LEASE_TTL_MS."""
    if (
        isinstance(ttl_ms, bool)
        or not isinstance(ttl_ms, int)
        or not MIN_LEASE_TTL_MS <= ttl_ms <= MAX_LEASE_TTL_MS
    ):
        raise InvalidInput(
            "ttl_ms",
            "range",
            f"ttl_ms must be an int from {MIN_LEASE_TTL_MS} to {MAX_LEASE_TTL_MS}, got {ttl_ms!r}",
        )
    return ttl_ms
