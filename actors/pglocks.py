"""PostgreSQL lock helpers for SPEC §8's fixed lock order. None of them waits:
contention answers False, and the caller reports `blocked` or skips."""

from __future__ import annotations

from collections.abc import Sequence


def try_advisory_locks(tx, keys: Sequence[str]) -> bool:
    """Take a transaction-level advisory lock on each key, in sorted order."""
    for key in sorted(keys):
        (acquired,) = tx.query("SELECT pg_try_advisory_xact_lock(hashtextextended(?, 0))", (key,))[
            0
        ]
        if not acquired:
            return False
    return True


def try_lock_stream_heads(tx, stream_ids: Sequence[str]) -> bool:
    """Row-lock each existing stream head in the given order (FOR UPDATE SKIP LOCKED).

    A head that exists but is not returned is held by another transaction.
    """
    for stream_id in stream_ids:
        locked = tx.query(
            "SELECT 1 FROM streams WHERE stream_id = ? FOR UPDATE SKIP LOCKED", (stream_id,)
        )
        if not locked and tx.query("SELECT 1 FROM streams WHERE stream_id = ?", (stream_id,)):
            return False
    return True


def advisory_lock(tx, key: str) -> None:
    """Wait for the advisory lock on `key` (worker writes only: the cycle never
    waits, so a worker queued here cannot deadlock with it)."""
    tx.query("SELECT pg_advisory_xact_lock(hashtextextended(?, 0))", (key,))
