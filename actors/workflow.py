"""One Workflow's turn in a cycle phase: load, fold, decide, commit — and the
short-lived actor that runs it.

The unit of work is `converge(tx, run_id, phase, now_ms)`. On SQLite it runs on
the operation authority (one `BEGIN IMMEDIATE` per Workflow); on PostgreSQL on
the actor's own pooled connection, after taking the locks of SPEC §8 without
waiting: contention means `blocked`, and a later cycle tries again.
"""

from __future__ import annotations

from dataclasses import dataclass

import pykka

from actors.loading import lease_stream, load_aggregate, run_stream, steps_stream
from actors.pglocks import try_advisory_locks, try_lock_stream_heads
from domain.attempts import decide_attempt_admission
from domain.cancellation import decide_cancellation
from domain.errors import VersionConflict
from domain.frontier import decide_frontier
from domain.recovery import decide_recovery
from projections.candidates import active_attempt_ids
from projections.registry import commit

DECISIONS = {
    "recovery": decide_recovery,
    "cancellation": decide_cancellation,
    "frontier": decide_frontier,
    "admission": decide_attempt_admission,
}


@dataclass(frozen=True, slots=True)
class WorkflowOutcome:
    """What one Workflow's turn did."""

    run_id: str
    changed: bool = False
    settled_run: bool = False
    settled_attempts: int = 0
    blocked: bool = False
    conflict: bool = False
    error: str | None = None


def lock_for_convergence(tx, run_id: str) -> bool:
    """Take SPEC §8's locks in their fixed order without waiting (PostgreSQL only).

    Active Attempt ids, sorted, each by `pg_try_advisory_xact_lock`; then the Run,
    lease and StepRun stream heads. False means another transaction holds one.
    """
    if tx.dialect != "postgresql":
        return True
    attempt_ids = active_attempt_ids(tx, run_id)
    if not try_advisory_locks(tx, [f"attempt:{a}" for a in attempt_ids]):
        return False
    heads = [run_stream(run_id), *(lease_stream(a) for a in attempt_ids), steps_stream(run_id)]
    return try_lock_stream_heads(tx, heads)


def converge(tx, run_id: str, phase: str, now_ms: int) -> WorkflowOutcome:
    """Decide `phase` for one Run and commit its records in the caller's transaction."""
    if not lock_for_convergence(tx, run_id):
        return WorkflowOutcome(run_id, blocked=True)
    aggregate = load_aggregate(tx, run_id)
    decision = DECISIONS[phase](aggregate, now_ms)
    if decision.appends:
        commit(tx, decision.appends)
    return WorkflowOutcome(
        run_id,
        changed=bool(decision.appends),
        settled_run=decision.run_terminal is not None,
        settled_attempts=decision.settled_attempts,
        blocked=bool(decision.blocked),
    )


class WorkflowActor(pykka.ThreadingActor):
    """Lives for one page: converges one Run for one phase and reports the outcome."""

    def __init__(self, authority, run_id: str, phase: str, now_ms: int) -> None:
        super().__init__()
        self._authority = authority
        self._run_id = run_id
        self._phase = phase
        self._now_ms = now_ms

    def on_receive(self, message) -> WorkflowOutcome:
        run_id, phase, now_ms = self._run_id, self._phase, self._now_ms
        # Every failure is reported, never raised: a pykka actor dies silently on
        # an exception from a `tell`, and one Workflow must not sink its page.
        try:
            return self._authority.execute(
                lambda tx: converge(tx, run_id, phase, now_ms), name=phase
            )
        except VersionConflict:
            return WorkflowOutcome(run_id, conflict=True)
        except Exception as error:
            return WorkflowOutcome(run_id, error=f"{type(error).__name__}: {error}")
