"""Candidate queries: which Runs a cycle phase should look at, from indexes only.

The read model stores, per Run and phase, the window of instants in which the
phase's decision has work (`domain.work`, folded in `projections.runs`), and per
Attempt the window in which a worker may lease it. Every query here is the same:
the rows whose window holds `now_ms`, read from a partial index on the window's
opening instant. A dormant Run (waiting on a worker, or finished) is in none of
them. Pages are keyset pages over run ids (`after_run_id`), so a cycle can walk
several pages and the caller can rotate where it starts.
"""

from __future__ import annotations

from typing import Any

from domain.phases import RUN_PHASES
from domain.transitions import ATTEMPT_ACTIVE, ATTEMPT_NOT_YET_RUNNING
from eventstore.api import LockJoin, Reads, Transaction

__all__ = [
    "active_attempt_ids", "claimable_attempts", "claimable_condition", "held_not_running",
    "offered_attempts", "page", "work_probe",
]  # fmt: skip


def _open_at(prefix: str) -> str:
    """The condition "the window `<prefix>_opens_ms`..`<prefix>_closes_ms` holds the
    instant bound twice after it"."""
    return f"{prefix}_opens_ms <= ? AND ({prefix}_closes_ms IS NULL OR {prefix}_closes_ms > ?)"


def claimable_condition() -> str:
    """The SQL condition on `attempts` "a worker may lease it at the instant bound
    twice after it" (what `claimable_attempts` reads), for a query of its own."""
    return _open_at("grant")


Cursor = tuple[int, str]
"""Where a page ended: (the instant its last Run's work opened, that Run's id)."""


def page(
    store_or_tx: Reads, phase: str, now_ms: int, limit: int, after: Cursor | None = None
) -> list[str]:
    """Up to `limit` run ids with work for `phase` at `now_ms` (see `work_page`)."""
    return [run_id for _, run_id in work_page(store_or_tx, phase, now_ms, limit, after)]


def work_page(
    store_or_tx: Reads, phase: str, now_ms: int, limit: int, after: Cursor | None = None
) -> list[Cursor]:
    """Up to `limit` Runs with work for `phase` at `now_ms`, as (opened at, run id),
    the work that opened first first (then by id), after `after`: a range of the
    phase's index, whatever the number of dormant Runs."""
    if phase not in RUN_PHASES:
        raise ValueError(f"unknown phase {phase!r}; one of {RUN_PHASES}")
    where = _open_at(phase)
    params: list[Any] = [now_ms, now_ms]
    if after is not None:
        where += f" AND ({phase}_opens_ms, run_id) > (?, ?)"
        params += [after[0], after[1]]
    rows = store_or_tx.query(
        f"SELECT {phase}_opens_ms, run_id FROM runs WHERE {where} "
        f"ORDER BY {phase}_opens_ms, run_id LIMIT ?",
        (*params, limit),
    )
    return [(row[0], row[1]) for row in rows]


def work_probe(phase: str, now_ms: int) -> tuple[str, list[Any]]:
    """The query whose one row (or none) says whether `phase` has work at `now_ms`: the
    first row `work_page` would read (a cycle asks every phase at once)."""
    if phase not in RUN_PHASES:
        raise ValueError(f"unknown phase {phase!r}; one of {RUN_PHASES}")
    return f"SELECT 1 FROM runs WHERE {_open_at(phase)} LIMIT 1", [now_ms, now_ms]


def claimable_attempts(
    store_or_tx: Reads,
    now_ms: int,
    limit: int,
    *,
    run_id: str | None = None,
    step_key: str | None = None,
    tasks: frozenset[str] | None = None,
    full_slots: frozenset[str] = frozenset(),
    passing: frozenset[str] = frozenset(),
    lock_join: LockJoin | None = None,
) -> list[tuple[str, str, str | None]]:
    """(attempt_id, run_id, slot) of Attempts a worker may lease at `now_ms`, those
    whose grant window holds `now_ms` (`domain.work.grant_windows`), in lease order
    (`domain.slots.lease_order`: higher priority, then the Run admitted first, then
    the claim), leaving out the slots in `full_slots` and the Attempts in `passing`
    (other workers are leasing them). A range of the lease-order
    index: what it passes over is only what has a window that is not open now (a
    claim leased and not started yet, a claim past its Run's deadline before
    cancellation ends it) and, with `full_slots`, the claims waiting for those.
    `slot` is the limit slot a lease would take (None: no limit). `lock_join`: see
    `offered_attempts`."""
    where = [claimable_condition()]
    params: list[Any] = [now_ms, now_ms]
    if full_slots:
        where.append(f"(slot IS NULL OR slot NOT IN ({', '.join('?' for _ in full_slots)}))")
        params.extend(sorted(full_slots))
    if passing:
        where.append(f"attempt_id NOT IN ({', '.join('?' for _ in passing)})")
        params.extend(sorted(passing))
    if run_id is not None:
        where.append("run_id = ?")
        params.append(run_id)
    if step_key is not None:
        where.append("step_key = ?")
        params.append(step_key)
    if tasks is not None:
        if not tasks:
            return []
        where.append(f"task_ref IN ({', '.join('?' for _ in tasks)})")
        params.extend(sorted(tasks))
    join, suffix = lock_join if lock_join is not None else ("", "")
    rows = store_or_tx.query(
        f"""SELECT attempt_id, run_id, slot FROM attempts {join}
            WHERE {" AND ".join(where)}
            ORDER BY priority DESC, run_admitted_ms, run_id, claimed_position LIMIT ? {suffix}""",
        (*params, limit),
    )
    return [(row[0], row[1], row[2]) for row in rows]


def offered_attempts(
    tx: Transaction, now_ms: int, limit: int, *, lock_prefix: str, **filters: Any
) -> list[tuple[str, str, str | None]]:
    """`claimable_attempts` (the same `filters`) read in a lease's own transaction,
    taking the lock of each Attempt read (named `lock_prefix` + its id) and passing
    over those whose lock another transaction holds: workers side by side are offered
    different Attempts (docs/DESIGN.md "Workers side by side")."""
    join = tx.try_lock_join(f"'{_literal(lock_prefix)}' || attempts.attempt_id")
    return claimable_attempts(tx, now_ms, limit, **filters, lock_join=join)


def _literal(text: str) -> str:
    """`text` inside an SQL string literal."""
    return text.replace("'", "''")


def active_attempt_ids(tx: Reads, run_id: str) -> list[str]:
    """Sorted ids of the Run's non-terminal Attempts (the PostgreSQL lock order)."""
    active = sorted(ATTEMPT_ACTIVE)
    rows = tx.query(
        f"""SELECT attempt_id FROM attempts WHERE run_id = ?
            AND status IN ({", ".join("?" * len(active))}) ORDER BY attempt_id""",
        (run_id, *active),
    )
    return [row[0] for row in rows]


def held_not_running(store_or_tx: Reads, worker_id: str, now_ms: int) -> list[tuple[str, str, str]]:
    """(attempt_id, run_id, lease_id) of the Attempts whose live lease `worker_id`
    holds at `now_ms` and that no one recorded running yet (claimed or starting): a
    range of the live leases' index."""
    statuses = sorted(ATTEMPT_NOT_YET_RUNNING)
    rows = store_or_tx.query(
        f"""SELECT attempt_id, run_id, lease_id FROM attempts
            WHERE lease_status = 'leased' AND expires_at_ms > ? AND worker_id = ?
            AND status IN ({", ".join("?" * len(statuses))}) ORDER BY attempt_id""",
        (now_ms, worker_id, *statuses),
    )
    return [(row[0], row[1], row[2]) for row in rows]
