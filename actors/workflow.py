"""One Workflow's turn in a cycle phase — read, fold, decide — and the short-lived
actor that takes it; its page commits the turns together (`actors.supervisor`).

The turn is optimistic, as an event store is meant to be used: the Run's streams
are read without any lock (from the Run's base, `actors.loading`; the supervisor
reads its page's Runs together, a few queries for the page), folded and decided.
Only the page's write takes the lock, and it first checks that every stream each
turn read is still at the version read — the Run, StepRun and every lease stream,
including the ones the decision does not append to — so each decision is exactly
what it would have been inside one long transaction; a turn whose stream moved is
a conflict, and its Run is left for the next cycle
(`actors.run_writes.commit_prepared`). The fold of the decision's records onto the
Run (what the commit leaves) is made here too, so the write lock is held for the
checks, the append, the read-model update and COMMIT only.

The actor folds and decides on its page's thread from the streams its supervisor read
for it: a Workflow's turn costs no hand-over to the operation authority and no
connection of its own (docs/DESIGN.md "Pages, the supervisor and Workflow actors").
"""

from __future__ import annotations

from concurrent.futures import Executor
from dataclasses import dataclass

import pykka

from actors.authority import Units
from actors.loading import RunStreams, not_found, read_run_streams
from actors.run_writes import Prepared
from domain.run_path import applied
from domain.work import DECISIONS
from eventstore.validation import encode_appends


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


@dataclass(frozen=True, slots=True)
class Turn:
    """A decided turn: its outcome if written, and what to write (None: nothing)."""

    outcome: WorkflowOutcome
    prepared: Prepared | None = None


def prepare(units: Units, run_id: str, phase: str, now_ms: int) -> Turn:
    """Read and fold one Run and decide `phase` on it; nothing is written here."""
    cache = units.aggregates
    streams = units.read(lambda tx: read_run_streams(tx, run_id, cache))
    return decide_turn(streams, phase, now_ms)


def decide_turn(streams: RunStreams, phase: str, now_ms: int) -> Turn:
    """Fold one Run's streams as read and decide `phase` on it; nothing is written here."""
    run_id = streams.run_id
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
        return Turn(outcome)
    batch = encode_appends(decision.appends)  # validated before the lock is taken
    after = applied(aggregate, decision)
    return Turn(outcome, Prepared(streams, aggregate, decision, batch, after))


class WorkflowActor(pykka.ThreadingActor):
    """Lives for one page: decides one Run's turn for one phase, from the streams its
    supervisor read for it (None: the Run does not exist), and reports it. Its loop
    runs on one of its page's threads (`threads`), not on a thread of its own."""

    def __init__(
        self,
        run_id: str,
        streams: RunStreams | None,
        phase: str,
        now_ms: int,
        threads: Executor,
    ) -> None:
        super().__init__()
        self._run_id = run_id
        self._streams = streams
        self._phase = phase
        self._now_ms = now_ms
        self._threads = threads

    def _start_actor_loop(self) -> None:
        # pykka starts a thread per actor; a page's actors take turns on the page's
        # few threads instead (docs/DESIGN.md "Pages, the supervisor and Workflow
        # actors"): the loop ends when the actor is stopped, freeing its thread
        self._threads.submit(self._actor_loop)

    def on_receive(self, message: object) -> Turn:
        # Every failure is reported, never raised: a pykka actor dies silently on
        # an exception from a `tell`, and one Workflow must not sink its page.
        try:
            if self._streams is None:
                raise not_found(self._run_id)
            return decide_turn(self._streams, self._phase, self._now_ms)
        except Exception as error:
            return Turn(WorkflowOutcome(self._run_id, error=f"{type(error).__name__}: {error}"))
