"""A session of another process holding qlflow's named locks, for tests on PostgreSQL."""

from __future__ import annotations

from collections.abc import Sequence

import psycopg

from eventstore.locks import LOCK_TABLE, lock_bucket


def hold_locks(url: str, names: Sequence[str]) -> psycopg.Connection:
    """A session (of the role `url` logs in as) holding the named locks, their
    `qlflow_locks` rows, until it is closed."""
    conn = psycopg.connect(url)
    conn.execute(
        f"SELECT 1 FROM {LOCK_TABLE} WHERE bucket = ANY (ARRAY("
        f"SELECT {lock_bucket('k')} FROM unnest(%s::text[]) k)) FOR UPDATE",
        (list(names),),
    )
    return conn
