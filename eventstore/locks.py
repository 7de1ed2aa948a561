"""Named locks: how a lock name becomes a PostgreSQL advisory lock key.

Every advisory lock qlflow takes is named by a string and keyed by one scheme, the
64-bit `hashtextextended(name, 0)`, whether the store takes it (`Transaction.lock`,
`try_lock`) or a server-side function does (a projection's SECURITY DEFINER source
takes its publisher lock itself). Two places hashing one name differently would not
exclude each other, so both build the key with `advisory_key`.

The key is scoped to the schema (`current_schema()`, which a SECURITY DEFINER
function pinned to its schema sees too): two qlflow schemas in one database never
block each other on a lock of the same name.
"""

from __future__ import annotations

DEFAULT_LOCK_TIMEOUT_MS = 5000  # the longest any lock is waited for
MIGRATION_LOCK = "qlflow-migrations"  # serialises schema migrations of one schema


def advisory_key(name_sql: str) -> str:
    """The SQL expression of the advisory lock key of the text expression `name_sql`."""
    return f"hashtextextended(coalesce(current_schema(), '') || '/' || {name_sql}, 0)"
