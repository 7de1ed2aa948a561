"""The terms a worker may ask of a lease: how long it lives before it must be renewed."""

from __future__ import annotations

from domain.canonical import MAX_SAFE_INTEGER
from domain.errors import InvalidInput
from domain.transitions import MAX_LEASE_TTL_MS, MIN_LEASE_TTL_MS

MAX_INSTANT_MS = MAX_SAFE_INTEGER  # the latest instant a record can hold exactly


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


def lease_expiry(now_ms: int, ttl_ms: int) -> int:
    """When a lease granted or renewed at `now_ms` for `ttl_ms` expires; refused when
    that is past the latest instant (such a lease could never expire)."""
    expires_at_ms = now_ms + ttl_ms
    if expires_at_ms > MAX_INSTANT_MS:
        raise InvalidInput(
            "ttl_ms",
            "expiry_past_ceiling",
            f"a lease of {ttl_ms} ms at now_ms {now_ms} would expire at {expires_at_ms}, "
            f"past the latest instant {MAX_INSTANT_MS}: it could never expire",
        )
    return expires_at_ms
