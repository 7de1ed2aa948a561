"""Worker-side units of work: lease, start barrier, running, renew, complete; and
the cancel intent. Each is one short transaction on the operation authority,
fenced by lease id and version (see docs/DESIGN.md "Leases and fencing").

Locks. A worker write takes its Attempt's lock, then the Run's stream head
(`load_aggregate`), waiting for each (bounded by the store's lock timeout): the
cycle never waits for a lock, so a worker queued behind it cannot deadlock with it.
Leasing takes the Attempt's lock without waiting and skips an Attempt another
replica is on.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, replace

from actors.authority import Units
from actors.loading import attempt_lock, load_aggregate
from domain import run_path
from domain import worker as worker_rules
from domain.cancellation import request_cancel
from domain.errors import FenceError, InvalidInput, LockTimeout, VersionConflict
from eventstore.api import Transaction
from projections import candidates
from projections.registry import commit

log = logging.getLogger("qlflow.worker")

CONFLICT_RETRIES = 20


@dataclass(frozen=True, slots=True)
class Lease:
    """A worker's authority over one Attempt: present it (id + version) on every write."""

    lease_id: str
    attempt_id: str
    run_id: str
    step_key: str
    task_ref: str
    version: int
    expires_at_ms: int
    worker_id: str
    stop_requested: bool = False
    started: bool = False  # granted with the start barrier (`lease_attempts(start=True)`)


def _with_retries(authority: Units, fn: Callable, name: str):
    """Run a unit of work; on a version conflict, re-read and decide again."""
    for attempt in range(CONFLICT_RETRIES):
        try:
            return authority.execute(fn, name=name)
        except VersionConflict:
            if attempt == CONFLICT_RETRIES - 1:
                raise
    raise AssertionError("unreachable")


def _decide_and_commit(tx: Transaction, run_id: str, decide, attempt_id: str | None = None):
    if attempt_id is not None:
        tx.lock(attempt_lock(attempt_id))
    aggregate = load_aggregate(tx, run_id)
    decision = decide(aggregate)
    if decision.appends:
        commit(tx, decision.appends, folded=aggregate)
    return aggregate, decision


def lease_attempts(
    authority: Units,
    worker_id: str,
    *,
    limit: int,
    ttl_ms: int,
    now_ms: int,
    run_id: str | None = None,
    step_key: str | None = None,
    tasks: frozenset[str] | None = None,
    start: bool = False,
) -> list[Lease]:
    """Lease up to `limit` claimed Attempts, oldest first; skip any another worker got.

    With `start` each grant also crosses the start barrier in its own commit (unit
    `lease_start`): for an executor that spawns at once."""
    decide = run_path.lease_and_start if start else worker_rules.grant_lease
    leases: list[Lease] = []
    offered = candidates.claimable_attempts(
        authority.store, now_ms, limit * 2, run_id=run_id, step_key=step_key, tasks=tasks
    )
    for attempt_id, attempt_run_id in offered:
        if len(leases) >= limit:
            break

        def grant(tx: Transaction, attempt_id=attempt_id, attempt_run_id=attempt_run_id):
            if not _lock_attempt(tx, attempt_id):
                return None  # another replica is on it: skip, never wait
            aggregate = load_aggregate(tx, attempt_run_id)
            try:
                decision = decide(aggregate, attempt_id, worker_id, ttl_ms, now_ms)
            except (FenceError, InvalidInput):
                return None  # no longer leasable: someone else got it, or the Run moved on
            commit(tx, decision.appends, folded=aggregate)
            return _lease_value(aggregate, decision.lease, started=start)

        try:
            granted = authority.execute(grant, name="lease_start" if start else "lease")
        except (VersionConflict, LockTimeout):
            continue  # the Run moved, or its head stayed held: leave it for the next call
        if granted is not None:
            leases.append(granted)
    if leases:
        log.info("worker %s leased %d attempt(s)", worker_id, len(leases))
    return leases


def _lease_value(aggregate, grant, stop_requested: bool = False, started: bool = False) -> Lease:
    attempt = aggregate.attempts[grant.attempt_id]
    step = aggregate.steps[attempt.step_key]
    return Lease(
        lease_id=grant.lease_id,
        attempt_id=grant.attempt_id,
        run_id=aggregate.run_id,
        step_key=attempt.step_key,
        task_ref=step.task_ref,
        version=grant.version,
        expires_at_ms=grant.expires_at_ms,
        worker_id=grant.worker_id,
        stop_requested=stop_requested,
        started=started,
    )


def _lock_attempt(tx: Transaction, attempt_id: str) -> bool:
    """The Attempt's lock first (the fixed lock order), without waiting."""
    return tx.try_lock([attempt_lock(attempt_id)])


def _worker_write(authority: Units, lease: Lease, name: str, decide):
    """One fenced worker write on the lease's Run; retried on a version conflict."""
    return _with_retries(
        authority,
        lambda tx: _decide_and_commit(tx, lease.run_id, decide, attempt_id=lease.attempt_id),
        name,
    )


def mark_starting(authority: Units, lease: Lease, now_ms: int) -> Lease:
    """The start barrier: written durably before the worker spawns anything."""
    _worker_write(
        authority,
        lease,
        "start",
        lambda agg: worker_rules.mark_starting(
            agg, lease.attempt_id, lease.lease_id, lease.version, now_ms
        ),
    )
    return lease


def mark_running(authority: Units, lease: Lease, now_ms: int) -> Lease:
    """starting -> running (from claimed+leased through starting in one transaction)."""
    _worker_write(
        authority,
        lease,
        "running",
        lambda agg: worker_rules.mark_running(
            agg, lease.attempt_id, lease.lease_id, lease.version, now_ms
        ),
    )
    return lease


def renew(authority: Units, lease: Lease, ttl_ms: int, now_ms: int) -> Lease:
    """Extend the lease; the answer says whether the Run asks the worker to stop."""
    _, decision = _worker_write(
        authority,
        lease,
        "renew",
        lambda agg: worker_rules.renew(
            agg, lease.attempt_id, lease.lease_id, lease.version, ttl_ms, now_ms
        ),
    )
    return replace(
        lease,
        version=decision.lease.version,
        expires_at_ms=decision.lease.expires_at_ms,
        stop_requested=decision.stop_requested,
    )


def complete(
    authority: Units,
    lease: Lease,
    outcome: str,
    *,
    result_code: str | None,
    output: dict | None,
    now_ms: int,
) -> str:
    """Record the Attempt's end under its lease, with what the frontier and attempt
    admission decide next from it, in one commit; returns the recorded status."""
    aggregate, decision = _worker_write(
        authority,
        lease,
        "complete",
        lambda agg: run_path.complete_and_advance(
            agg,
            lease.attempt_id,
            lease.lease_id,
            lease.version,
            outcome,
            result_code,
            output,
            now_ms,
        ),
    )
    if decision.replayed:
        recorded = aggregate.attempts[lease.attempt_id].status
    else:
        recorded = next(
            e.type.split(".", 1)[1]
            for e in decision.events(f"run-{lease.run_id}")
            if e.type.startswith("attempt.") and e.data.get("attempt_id") == lease.attempt_id
        )
    log.info(
        "attempt %s (%s/%s) completed: reported %s, recorded %s",
        lease.attempt_id,
        lease.run_id,
        lease.step_key,
        outcome,
        recorded,
    )
    return recorded


def cancel(authority: Units, run_id: str, reason: str, now_ms: int) -> bool:
    """Record cancel intent on the Run (idempotent). True if this call recorded it."""
    _, decision = _with_retries(
        authority,
        lambda tx: _decide_and_commit(tx, run_id, lambda agg: request_cancel(agg, reason, now_ms)),
        "cancel",
    )
    if decision.appends:
        log.info("run %s: cancel requested (%s)", run_id, reason)
    return bool(decision.appends)
