"""Candidate queries: which Runs a cycle phase should look at, from indexes only.

Each query reads a partial index of the read models, never all Runs: a dormant
Run (waiting on a worker, or finished) is in none of them. Pages are keyset
pages over run ids (`after_run_id`), so a cycle can walk several pages and the
caller can rotate where it starts.
"""

from __future__ import annotations

PHASES = ("recovery", "cancellation", "frontier", "admission")


def page(store_or_tx, phase: str, now_ms: int, limit: int, after_run_id: str = "") -> list[str]:
    """Up to `limit` run ids with work for `phase`, in run id order after `after_run_id`."""
    sql, params = _QUERIES[phase](now_ms)
    rows = store_or_tx.query(
        f"SELECT run_id FROM ({sql}) candidates WHERE run_id > ? ORDER BY run_id LIMIT ?",
        (*params, after_run_id, limit),
    )
    return [row[0] for row in rows]


def _recovery(now_ms: int):
    # a two-sided range makes SQLite use the partial expiry index instead of
    # walking every Attempt by run id (which made dormant Runs cost time)
    return (
        """SELECT DISTINCT run_id FROM attempts
           WHERE lease_status = 'leased' AND expires_at_ms BETWEEN 0 AND ?
             AND status IN ('claimed', 'starting', 'running')""",
        (now_ms,),
    )


def _cancellation(now_ms: int):
    return (
        """SELECT run_id FROM runs WHERE status = 'running' AND needs_cancellation = 1
           UNION
           SELECT run_id FROM runs WHERE status = 'running'
             AND cancel_requested_at_ms IS NULL AND deadline_ms IS NOT NULL
             AND deadline_ms <= ?""",
        (now_ms,),
    )


def _progress(flag: str):
    def query(now_ms: int):
        return (
            f"""SELECT run_id FROM runs WHERE status = 'running' AND {flag} = 1
                  AND cancel_requested_at_ms IS NULL
                  AND (deadline_ms IS NULL OR deadline_ms > ?)""",
            (now_ms,),
        )

    return query


def _admission(now_ms: int):
    # a Run whose only admissible StepRuns wait for a retry is left out until then
    return (
        """SELECT run_id FROM runs WHERE status = 'running' AND needs_admission = 1
              AND cancel_requested_at_ms IS NULL
              AND (deadline_ms IS NULL OR deadline_ms > ?)
              AND (admission_at_ms IS NULL OR admission_at_ms <= ?)""",
        (now_ms, now_ms),
    )


_QUERIES = {
    "recovery": _recovery,
    "cancellation": _cancellation,
    "frontier": _progress("needs_frontier"),
    "admission": _admission,
}


def claimable_attempts(
    store_or_tx,
    now_ms: int,
    limit: int,
    *,
    run_id: str | None = None,
    step_key: str | None = None,
    tasks: frozenset[str] | None = None,
) -> list[tuple[str, str]]:
    """(attempt_id, run_id) of claimed Attempts a worker may lease, oldest first.

    An Attempt is claimable when it has no lease, its lease was released, or its
    never-started lease expired; its Run must be running with no cancel intent
    and before its deadline.
    """
    where = [
        "a.status = 'claimed'",
        "(a.lease_status IS NULL OR a.lease_status = 'released'"
        " OR (a.lease_status = 'leased' AND a.expires_at_ms <= ?))",
        "r.status = 'running'",
        "r.cancel_requested_at_ms IS NULL",
        "(r.deadline_ms IS NULL OR r.deadline_ms > ?)",
    ]
    params: list = [now_ms, now_ms]
    if run_id is not None:
        where.append("a.run_id = ?")
        params.append(run_id)
    if step_key is not None:
        where.append("a.step_key = ?")
        params.append(step_key)
    if tasks is not None:
        if not tasks:
            return []
        where.append(f"a.task_ref IN ({', '.join('?' for _ in tasks)})")
        params.extend(sorted(tasks))
    rows = store_or_tx.query(
        f"""SELECT a.attempt_id, a.run_id FROM attempts a JOIN runs r ON r.run_id = a.run_id
            WHERE {" AND ".join(where)} ORDER BY a.claimed_position LIMIT ?""",
        (*params, limit),
    )
    return [(row[0], row[1]) for row in rows]


def active_attempt_ids(tx, run_id: str) -> list[str]:
    """Sorted ids of the Run's non-terminal Attempts (the PostgreSQL lock order)."""
    rows = tx.query(
        """SELECT attempt_id FROM attempts WHERE run_id = ?
           AND status IN ('claimed', 'starting', 'running') ORDER BY attempt_id""",
        (run_id,),
    )
    return [row[0] for row in rows]
