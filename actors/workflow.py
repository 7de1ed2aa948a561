"""One Workflow's turn in a cycle phase — read, fold, decide, commit — and the
short-lived actor that runs it.

The turn is optimistic, as an event store is meant to be used: the Run's streams
are read without any lock, folded and decided, and only the write takes the lock.
The write unit first checks that every stream read is still at the version read —
the Run, StepRun and every lease stream, including the ones the decision does not
append to — so the decision is exactly what it would have been inside one long
transaction; a stream that moved is a `VersionConflict`, and the Run is left for
the next cycle. The write lock is thus held for the check, the append, the
read-model update and COMMIT only.

On a single-writer store (SQLite) the whole turn runs on the operation authority,
in turn with every other call (one hand-over between threads per Workflow; the read
needs no write lock, so another process's writers are not held up by a fold).
Otherwise (PostgreSQL) it runs on the actor's thread with pooled connections, and
the write unit first takes the fixed lock order of docs/DESIGN.md "Locks" without
waiting — the active Attempts' locks (`try_lock`), then the stream heads
(`lock_heads(wait=False)`) — and contention means `blocked`.
"""

from __future__ import annotations

from dataclasses import dataclass

import pykka

from actors.authority import Units
from actors.loading import RunStreams, attempt_lock, read_run_streams
from domain.aggregate import RunAggregate
from domain.errors import VersionConflict
from domain.work import DECISIONS
from eventstore.api import Transaction
from eventstore.validation import encode_appends
from projections.registry import commit_encoded


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


def converge(authority: Units, run_id: str, phase: str, now_ms: int) -> WorkflowOutcome:
    """Decide `phase` for one Run and commit its records; VersionConflict if one of
    its streams moved between the read and the write."""
    streams: RunStreams = authority.read(lambda tx: read_run_streams(tx, run_id))
    aggregate = streams.fold()
    decision = DECISIONS[phase](aggregate, now_ms)
    outcome = WorkflowOutcome(
        run_id,
        changed=bool(decision.appends),
        settled_run=decision.run_terminal is not None,
        settled_attempts=decision.settled_attempts,
        blocked=bool(decision.blocked),
    )
    if not decision.appends:
        return outcome
    batch = encode_appends(decision.appends)  # validated before the lock is taken

    def write(tx: Transaction) -> bool:
        if not lock_unchanged(tx, streams, aggregate):
            return False
        commit_encoded(tx, batch, folded=aggregate)
        return True

    if not authority.execute(write, name=phase):
        return WorkflowOutcome(run_id, blocked=True)
    return outcome


def lock_unchanged(tx: Transaction, streams: RunStreams, aggregate: RunAggregate) -> bool:
    """In the write transaction: take the locks without waiting and check that every
    stream read is still at the version read.

    False: another transaction holds one of the locks (never waited for).
    VersionConflict: a stream moved since it was read.
    """
    read = streams.versions()
    if not tx.try_lock([attempt_lock(a.attempt_id) for a in aggregate.active_attempts()]):
        return False
    # An Attempt's lease stream is only written under its lock, held now, so one read
    # as missing cannot appear before this transaction ends.
    current = tx.lock_heads(list(read), wait=False)
    if current is None:
        return False
    for stream_id, version in read.items():
        if current[stream_id] != version:
            raise VersionConflict(stream_id, version, current[stream_id])
    return True


class WorkflowActor(pykka.ThreadingActor):
    """Lives for one page: converges one Run for one phase and reports the outcome."""

    def __init__(self, authority: Units, run_id: str, phase: str, now_ms: int) -> None:
        super().__init__()
        self._authority = authority
        self._run_id = run_id
        self._phase = phase
        self._now_ms = now_ms

    def on_receive(self, message) -> WorkflowOutcome:
        # Every failure is reported, never raised: a pykka actor dies silently on
        # an exception from a `tell`, and one Workflow must not sink its page.
        try:
            run_id, phase, now_ms = self._run_id, self._phase, self._now_ms
            return self._authority.run(lambda units: converge(units, run_id, phase, now_ms))
        except VersionConflict:
            return WorkflowOutcome(self._run_id, conflict=True)
        except Exception as error:
            return WorkflowOutcome(self._run_id, error=f"{type(error).__name__}: {error}")
