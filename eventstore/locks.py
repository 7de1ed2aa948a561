"""Named locks: how a lock name becomes a PostgreSQL advisory lock key.

Every advisory lock qlflow takes is named by a string and keyed by one scheme, the
64-bit `hashtextextended(name, 0)`, whether the store takes it (`Transaction.lock`,
`try_lock`) or a server-side function does (a projection's SECURITY DEFINER source
takes its publisher lock itself). Two places hashing one name differently would not
exclude each other, so both build the key with `advisory_key`.
"""

from __future__ import annotations

DEFAULT_LOCK_TIMEOUT_MS = 5000  # the longest a lock or head lock is waited for


def advisory_key(name_sql: str) -> str:
    """The SQL expression of the advisory lock key of the text expression `name_sql`."""
    return f"hashtextextended({name_sql}, 0)"
