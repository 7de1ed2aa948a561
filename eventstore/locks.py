"""Named locks: how a lock name becomes a PostgreSQL lock.

A named lock is a row lock on `qlflow_locks` (docs/DESIGN.md, "PostgreSQL roles"):
the name hashes (`hashtextextended(name, 0)`) to one of LOCK_BUCKETS rows, made once
by the eventstore schema, and a lock is `SELECT ... FOR UPDATE` of that row, whether
the store takes it (`Transaction.lock`, `try_lock`) or a server-side function does
(a projection's SECURITY DEFINER source takes its publisher lock itself): both build
the row with `lock_bucket`. A row lock needs UPDATE on the table, which the role
setup gives the writing roles only, so the read-only audit role cannot hold a lock
others wait on (any role may take any advisory lock key). The table is the
schema's, so two qlflow schemas never block each other; two names sharing a row
only wait for each other (1 in 16,384).

Only the migration lock stays advisory (`advisory_key`, scoped to the schema): it is
taken before the table exists.
"""

from __future__ import annotations

DEFAULT_LOCK_TIMEOUT_MS = 5000  # the longest any lock is waited for
MIGRATION_LOCK = "qlflow-migrations"  # serialises schema migrations of one schema


LOCK_TABLE = "qlflow_locks"
LOCK_BUCKETS = 16384  # a power of two: a bucket is the hash's low bits


def lock_bucket(name_sql: str) -> str:
    """The SQL expression of the `qlflow_locks` row of the text expression `name_sql`."""
    return f"(hashtextextended({name_sql}, 0) & {LOCK_BUCKETS - 1})::integer"


LOCK_TABLE_MIGRATION: tuple[str, ...] = (
    # `held` is the one column writers may UPDATE: what FOR UPDATE needs, and no more
    f"CREATE TABLE {LOCK_TABLE} (bucket INTEGER PRIMARY KEY, held BOOLEAN NOT NULL DEFAULT false)",
    f"INSERT INTO {LOCK_TABLE} (bucket) SELECT generate_series(0, {LOCK_BUCKETS - 1})",
)
"""The PostgreSQL statements of eventstore schema step 5: the lock rows."""


def advisory_key(name_sql: str) -> str:
    """The SQL expression of the advisory lock key of the text expression `name_sql`."""
    return f"hashtextextended(coalesce(current_schema(), '') || '/' || {name_sql}, 0)"
