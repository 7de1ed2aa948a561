"""Worker-side units of work: lease, start barrier, running, renew, complete; and
the cancel intent. Each is one short transaction on the operation authority,
fenced by lease id and version (SPEC §5–6).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, replace

from actors.loading import load_aggregate
from domain import worker as worker_rules
from domain.cancellation import request_cancel
from domain.errors import NotFound, VersionConflict
from projections import candidates
from projections.registry import commit

log = logging.getLogger("qlflow.worker")

CONFLICT_RETRIES = 5


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


def run_of_attempt(store_or_tx, attempt_id: str) -> str:
    rows = store_or_tx.query("SELECT run_id FROM attempts WHERE attempt_id = ?", (attempt_id,))
    if not rows:
        raise NotFound(f"attempt {attempt_id!r} does not exist")
    return rows[0][0]


def _with_retries(authority, fn: Callable, name: str):
    """Run a unit of work; on a version conflict, re-read and decide again."""
    for attempt in range(CONFLICT_RETRIES):
        try:
            return authority.execute(fn, name=name)
        except VersionConflict:
            if attempt == CONFLICT_RETRIES - 1:
                raise
    raise AssertionError("unreachable")


def _decide_and_commit(tx, run_id: str, decide):
    aggregate = load_aggregate(tx, run_id)
    decision = decide(aggregate)
    if decision.appends:
        commit(tx, decision.appends)
    return aggregate, decision


def lease_attempts(
    authority,
    worker_id: str,
    *,
    limit: int,
    ttl_ms: int,
    now_ms: int,
    run_id: str | None = None,
    step_key: str | None = None,
    tasks: frozenset[str] | None = None,
) -> list[Lease]:
    """Lease up to `limit` claimed Attempts, oldest first; skip any another worker got."""
    leases: list[Lease] = []
    offered = candidates.claimable_attempts(
        authority.store, now_ms, limit * 2, run_id=run_id, step_key=step_key, tasks=tasks
    )
    for attempt_id, attempt_run_id in offered:
        if len(leases) >= limit:
            break

        def grant(tx, attempt_id=attempt_id, attempt_run_id=attempt_run_id):
            if tx.dialect == "postgresql" and not tx.try_advisory_locks([f"attempt:{attempt_id}"]):
                return None  # another replica is on it: skip, never wait
            aggregate = load_aggregate(tx, attempt_run_id)
            if not worker_rules.can_lease(aggregate, attempt_id, now_ms):
                return None
            decision = worker_rules.grant_lease(aggregate, attempt_id, worker_id, ttl_ms, now_ms)
            commit(tx, decision.appends)
            return decision.lease

        try:
            granted = authority.execute(grant, name="lease")
        except VersionConflict:
            continue
        if granted is not None:
            leases.append(_lease_value(granted, worker_id))
    if leases:
        log.info("worker %s leased %d attempt(s)", worker_id, len(leases))
    return leases


def _lease_value(granted, worker_id: str) -> Lease:
    return Lease(
        lease_id=granted.lease_id,
        attempt_id=granted.attempt_id,
        run_id=granted.run_id,
        step_key=granted.step_key,
        task_ref=granted.task_ref,
        version=granted.version,
        expires_at_ms=granted.expires_at_ms,
        worker_id=worker_id,
        stop_requested=bool(getattr(granted, "stop_requested", False)),
    )


def mark_starting(authority, lease: Lease, now_ms: int) -> Lease:
    """The start barrier: written durably before the worker spawns anything."""
    _with_retries(
        authority,
        lambda tx: _decide_and_commit(
            tx,
            lease.run_id,
            lambda agg: worker_rules.mark_starting(
                agg, lease.attempt_id, lease.lease_id, lease.version, now_ms
            ),
        ),
        "start",
    )
    return lease


def mark_running(authority, lease: Lease, now_ms: int) -> Lease:
    """starting -> running (from claimed+leased through starting in one transaction)."""
    _with_retries(
        authority,
        lambda tx: _decide_and_commit(
            tx,
            lease.run_id,
            lambda agg: worker_rules.mark_running(
                agg, lease.attempt_id, lease.lease_id, lease.version, now_ms
            ),
        ),
        "running",
    )
    return lease


def renew(authority, lease: Lease, ttl_ms: int, now_ms: int) -> Lease:
    """Extend the lease; the answer says whether the Run asks the worker to stop."""
    _, decision = _with_retries(
        authority,
        lambda tx: _decide_and_commit(
            tx,
            lease.run_id,
            lambda agg: worker_rules.renew(
                agg, lease.attempt_id, lease.lease_id, lease.version, ttl_ms, now_ms
            ),
        ),
        "renew",
    )
    granted = decision.lease
    return replace(
        lease,
        version=granted.version,
        expires_at_ms=granted.expires_at_ms,
        stop_requested=decision.stop_requested,
    )


def complete(
    authority,
    lease: Lease,
    outcome: str,
    *,
    result_code: str | None,
    output: dict | None,
    now_ms: int,
) -> str:
    """Record the Attempt's end under its lease; returns the recorded status."""
    _, decision = _with_retries(
        authority,
        lambda tx: _decide_and_commit(
            tx,
            lease.run_id,
            lambda agg: worker_rules.complete(
                agg,
                lease.attempt_id,
                lease.lease_id,
                lease.version,
                outcome,
                result_code,
                output,
                now_ms,
            ),
        ),
        "complete",
    )
    log.info(
        "attempt %s (%s/%s) completed: reported %s, recorded %s",
        lease.attempt_id,
        lease.run_id,
        lease.step_key,
        outcome,
        decision.attempt_status,
    )
    return decision.attempt_status


def cancel(authority, run_id: str, reason: str, now_ms: int) -> bool:
    """Record cancel intent on the Run (idempotent). True if this call recorded it."""
    _, decision = _with_retries(
        authority,
        lambda tx: _decide_and_commit(
            tx, run_id, lambda agg: request_cancel(agg, reason, now_ms)
        ),
        "cancel",
    )
    if decision.appends:
        log.info("run %s: cancel requested (%s)", run_id, reason)
    return bool(decision.appends)
