"""The run path: worker writes that carry what would otherwise take another commit
(docs/DESIGN.md "The run path: two commits per step").

- `lease_and_start`: the lease grant and the start barrier in one decision, for an
  executor that spawns at once.
- `complete_and_advance`: the completion, then what the cancellation, frontier and
  attempt admission phases would decide next from it, in one decision.
- `admit_and_claim`: a Run's admission, then the Attempts attempt admission would
  claim for its ready roots, in one decision.
- `cancel_and_converge`: the cancel intent, then what cancellation convergence
  would decide next from it, in one decision.

Nothing here restates a rule: each part is the decision its own module makes
(`worker.grant_lease`, `worker.mark_starting`, `worker.complete`,
`frontier.decide_frontier`, `attempts.decide_attempt_claims`), each taken on
the aggregate as the part before it left it (`applied`), so the records are the
very ones those decisions write one commit at a time — ids, types and data; the
metadata names the worker as the actor.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from domain.admission import ADMISSION_ACTOR
from domain.aggregate import RunAggregate, extend, fold
from domain.attempts import decide_attempt_claims
from domain.cancellation import decide_cancellation, request_cancel
from domain.decision import Decision
from domain.frontier import decide_frontier
from domain.records import NewEvent, Record, StreamAppend
from domain.slots import QUEUE_ACTOR, dequeue
from domain.streams import LEASE, NOTIFICATION, category, entity_id, run_stream, steps_stream
from domain.worker import WorkerInfo, complete, grant_lease, mark_starting


def applied(aggregate: RunAggregate, decision: Decision) -> RunAggregate:
    """The aggregate after `decision`'s records, as a fold of the committed log would
    give it (global positions are not part of the aggregate); `decision` was taken on
    `aggregate`, and one that carries the aggregate it leaves (`Decision.after`) is
    not folded again."""
    if not decision.appends:
        return aggregate
    if decision.after is not None:
        return decision.after
    run_records, step_records, lease_records = _records(aggregate.run_id, decision)
    return extend(aggregate, run_records, step_records, lease_records)


def _records(
    run_id: str, decision: Decision
) -> tuple[list[Record], list[Record], dict[str, list[Record]]]:
    """A decision's records as the log will hold them (position 0), by stream."""
    run_records: list[Record] = []
    step_records: list[Record] = []
    lease_records: dict[str, list[Record]] = {}
    for append in decision.appends:
        records = [
            Record(
                event.event_id,
                append.stream_id,
                append.expected_version + offset,
                0,
                event.type,
                event.data,
                event.metadata,
            )
            for offset, event in enumerate(append.events, start=1)
        ]
        if append.stream_id == run_stream(run_id):
            run_records = records
        elif append.stream_id == steps_stream(run_id):
            step_records = records
        elif category(append.stream_id) == LEASE:
            lease_records[entity_id(append.stream_id)] = records
        elif category(append.stream_id) == NOTIFICATION:
            continue  # the outbox is not part of the Run's fold (docs/DESIGN.md "Notifications")
        else:
            raise AssertionError(f"decision bug: append to {append.stream_id!r}")
    return run_records, step_records, lease_records


def chained(*decisions: Decision, **fields: Any) -> Decision:
    """One Decision appending the records of `decisions`, taken in order, each on the
    aggregate the one before left: per stream the first expected version, the events
    in order."""
    order: list[str] = []
    expected: dict[str, int] = {}
    events: dict[str, list[NewEvent]] = {}
    for decision in decisions:
        for append in decision.appends:
            if append.stream_id not in expected:
                order.append(append.stream_id)
                expected[append.stream_id] = append.expected_version
                events[append.stream_id] = []
            head = expected[append.stream_id] + len(events[append.stream_id])
            if append.expected_version != head:
                raise AssertionError(
                    f"decision bug: {append.stream_id} expected at v{append.expected_version}, "
                    f"the chain is at v{head}"
                )
            events[append.stream_id].extend(append.events)
    appends = tuple(StreamAppend(s, expected[s], tuple(events[s])) for s in order)
    run_terminal = next((d.run_terminal for d in decisions if d.run_terminal), None)
    fields.setdefault("run_terminal", run_terminal)
    fields.setdefault("settled_attempts", sum(d.settled_attempts for d in decisions))
    fields.setdefault("settled_steps", sum(d.settled_steps for d in decisions))
    return Decision(appends=appends, **fields)


def lease_and_start(
    aggregate: RunAggregate,
    attempt_id: str,
    worker_id: str,
    ttl_ms: int,
    now_ms: int,
    *,
    worker: WorkerInfo | None = None,
    caused_by: str | None = None,
) -> Decision:
    """Grant the lease (as `grant_lease`, `caused_by` its cause) and cross the start
    barrier under it (as `mark_starting`) in one decision; its `lease` is the granted
    lease."""
    grant = grant_lease(
        aggregate, attempt_id, worker_id, ttl_ms, now_ms, worker=worker, caused_by=caused_by
    )
    assert grant.lease is not None
    granted = applied(aggregate, grant)
    start = mark_starting(granted, attempt_id, grant.lease.lease_id, grant.lease.version, now_ms)
    return chained(grant, start, lease=grant.lease, after=applied(granted, start))


def complete_and_advance(
    aggregate: RunAggregate,
    attempt_id: str,
    lease_id: str,
    lease_version: int,
    outcome: str,
    result_code: str | None,
    output: Mapping[str, Any] | None,
    now_ms: int,
    *,
    execution: Mapping[str, Any] | None = None,
) -> Decision:
    """`complete`, then cancellation convergence (a Run with cancel intent, or past
    its deadline, whose last held Attempt this was ends now), the frontier
    (dependents ready or skipped, the Run's terminal when every StepRun is) and
    attempt admission (`attempt.claimed` for the StepRuns that became ready), in the
    cycle's phase order, as the cycle would decide them next. A replayed completion
    stays a replay: whatever it did not carry, the cycle finishes."""
    done = complete(
        aggregate,
        attempt_id,
        lease_id,
        lease_version,
        outcome,
        result_code,
        output,
        now_ms,
        execution=execution,
    )
    if done.replayed or not done.appends:
        return done
    actor = _actor_of(done)
    after = applied(aggregate, done)
    converged = decide_cancellation(after, now_ms, actor=actor)
    settled = applied(after, converged)
    frontier = decide_frontier(settled, now_ms, actor=actor)
    advanced = applied(settled, frontier)
    admission = decide_attempt_claims(advanced, now_ms, actor=actor)
    return chained(done, converged, frontier, admission, after=applied(advanced, admission))


def admit_and_claim(
    admission: Decision, run_id: str, now_ms: int, *, advance: bool = False
) -> tuple[Decision, RunAggregate]:
    """The admission's records (`domain.admission.admission_records`), then the
    Attempts `decide_attempt_claims` claims for the ready roots of the Run they
    admit, as one decision; and the Run as it leaves it. `advance` (a rerun, whose
    reused steps are already succeeded) takes the frontier's decision first, so the
    steps that need only reused ones are ready and claimed in the same commit."""
    run_records, step_records, _ = _records(run_id, admission)
    admitted = fold(run_records, step_records)
    decisions = [admission]
    if advance:
        frontier = decide_frontier(admitted, now_ms, actor=ADMISSION_ACTOR)
        admitted = applied(admitted, frontier)
        decisions.append(frontier)
    claims = decide_attempt_claims(admitted, now_ms, actor=ADMISSION_ACTOR)
    return chained(*decisions, claims), applied(admitted, claims)


def dequeue_and_claim(aggregate: RunAggregate, now_ms: int) -> Decision:
    """`slots.dequeue` (the queued Run takes its Workflow's slot), then the Attempts
    `decide_attempt_claims` claims for its ready steps, as one decision."""
    taken = dequeue(aggregate, now_ms)
    if not taken.appends:
        return taken
    after = applied(aggregate, taken)
    claims = decide_attempt_claims(after, now_ms, actor=QUEUE_ACTOR)
    return chained(taken, claims, after=applied(after, claims))


def cancel_and_converge(aggregate: RunAggregate, reason: str, now_ms: int) -> Decision:
    """`request_cancel`, then `decide_cancellation` on the Run it leaves: what no worker
    holds ends now, the rest stays blocked until its workers' completions (or, for a
    worker that never reports, the cycle) end it. An intent already recorded
    (or a terminal Run) gives an empty decision, as `request_cancel` does."""
    intent = request_cancel(aggregate, reason, now_ms)
    if not intent.appends:
        return intent
    intended = applied(aggregate, intent)
    converged = decide_cancellation(intended, now_ms, actor=_actor_of(intent))
    return chained(intent, converged, blocked=converged.blocked, after=applied(intended, converged))


def _actor_of(decision: Decision) -> str:
    actor = decision.appends[0].events[0].metadata.get("actor")
    if not isinstance(actor, str):
        raise AssertionError("decision bug: a worker write without an actor")
    return actor
