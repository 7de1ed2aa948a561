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


def lock_buckets(url: str, names: Sequence[str]) -> list[int]:
    """The lock bucket of each name, in order: names that share one share their lock."""
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            f"SELECT {lock_bucket('k')} FROM unnest(%s::text[]) WITH ORDINALITY u(k, o) ORDER BY o",
            (list(names),),
        ).fetchall()
    return [bucket for (bucket,) in rows]
