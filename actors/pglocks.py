"""PostgreSQL lock helpers for SPEC §8's fixed lock order. None of them waits:
contention answers False, and the caller reports `blocked` or skips."""

from __future__ import annotations

from collections.abc import Sequence


def try_advisory_locks(tx, keys: Sequence[str]) -> bool:
    """Take a transaction-level advisory lock on each key, in one statement.

    Locks taken before a refusal stay held until the transaction ends, which is
    harmless: the caller gives up this transaction."""
    if not keys:
        return True
    (acquired,) = tx.query(
        "SELECT bool_and(pg_try_advisory_xact_lock(hashtextextended(k, 0))) "
        "FROM unnest(?::text[]) AS k",
        (sorted(keys),),
    )[0]
    return bool(acquired)


def try_lock_heads(tx, stream_ids: Sequence[str]) -> dict[str, int] | None:
    """Row-lock the named stream heads (all existing) in one statement, without
    waiting: their versions, or None if another transaction holds one of them.

    SKIP LOCKED never waits, so the order rows are locked in cannot deadlock."""
    if not stream_ids:
        return {}
    rows = tx.query(
        "SELECT stream_id, version FROM streams WHERE stream_id = ANY(?) FOR UPDATE SKIP LOCKED",
        (list(stream_ids),),
    )
    return dict(rows) if len(rows) == len(stream_ids) else None


def advisory_lock(tx, key: str) -> None:
    """Wait for the advisory lock on `key` (worker writes only: the cycle never
    waits, so a worker queued here cannot deadlock with it)."""
    tx.query("SELECT pg_advisory_xact_lock(hashtextextended(?, 0))", (key,))
