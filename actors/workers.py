"""Worker-side units of work: lease, start barrier, running, renew, complete; and
the cancel intent. Each is one short transaction on the operation authority,
fenced by lease id and version (see docs/DESIGN.md "Fencing"); leasing
and `complete_many` take many Attempts in one transaction (`actors.run_writes`).

Locks. A worker write takes its Attempt's lock, then the Run's stream head,
waiting for each (bounded by the store's lock timeout): the cycle never waits for
a lock, so a worker queued behind it cannot deadlock with it. Leasing takes the
locks without waiting and skips an Attempt another replica is on.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

from actors.authority import Units
from actors.clock import Now
from actors.group_commit import GroupCommit
from actors.loading import ATTEMPT_LOCK, read_runs
from actors.retrying import DECIDE_AGAIN
from actors.run_writes import (
    Batch,
    RunWrite,
    Written,
    write_runs,
)
from domain import event_types, run_path
from domain import worker as worker_rules
from domain.aggregate import RunAggregate
from domain.cancellation import request_cancel
from domain.decision import EMPTY, Decision, LeaseGrant
from domain.errors import InvalidInput, LockTimeout, QlflowError, VersionConflict
from domain.event_types import EventType, Family
from domain.flow import limit_of
from domain.slots import SlotBook, attempt_slot
from domain.step_timeouts import step_deadline_ms
from domain.streams import lease_stream, run_stream
from domain.transitions import ATTEMPT_NOT_YET_RUNNING, Status
from eventstore.api import Reads, Transaction
from projections import candidates
from projections import limits as limit_rows
from projections.registry import read_ahead_of_runs

log = logging.getLogger("qlflow.worker")


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
    # docs/DESIGN.md "Step timeouts": the instant (the store's clock) the Attempt passes
    # its step's timeout, once it started (None: no timeout); a renewal at or after it
    # answers `step_timed_out` when the domain finds it past
    step_deadline_ms: int | None = None
    step_timed_out: bool = False


def _with_retries(authority: Units, fn: Callable[[Transaction], Batch], name: str) -> Batch:
    """Run a batch write (`retrying.DECIDE_AGAIN`). The Runs it leaves are kept once
    its COMMIT has answered."""
    batch = DECIDE_AGAIN.execute(authority, fn, name)
    authority.aggregates.put(batch.after.values())
    return batch


def lease_attempts(
    authority: Units,
    worker_id: str,
    *,
    limit: int,
    ttl_ms: int,
    now_ms: int | None,
    run_id: str | None = None,
    step_key: str | None = None,
    tasks: frozenset[str] | None = None,
    start: bool = False,
    worker: worker_rules.WorkerInfo | None = None,
    request_id: str | None = None,
    sent_again: bool = False,
) -> list[Lease]:
    """Lease up to `limit` claimed Attempts in lease order (`domain.slots.lease_order`),
    in one transaction; skip any another worker got or holds, and any whose limit's
    slots are all held (docs/DESIGN.md "Flow control"). A page whose Attempts other
    transactions hold is followed by the page after them (docs/DESIGN.md "Workers
    side by side"), as one whose full slots hide others' work is.

    With `start` each grant also crosses the start barrier in the same commit (unit
    `lease_start`): for an executor that spawns at once. `worker` (host, slots) is
    recorded on each grant where given (docs/DESIGN.md, "Workers").

    `request_id`: each grant names it as its cause. `sent_again` (a call with it
    raised before; its answer may have been lost): answered the leases that call
    granted that are still live and not recorded running, if any, and nothing new
    is leased (docs/DESIGN.md "A lost answer of a lease")."""
    # the page at the store's time as last seen; each grant at its time in the unit
    page_at = now_ms if now_ms is not None else authority.store.clock_ms()
    if request_id is not None and sent_again:
        granted = _granted_for_request(authority, worker_id, request_id, page_at)
        if granted:
            log.info("worker %s: %d lease(s) of request %s handed again", worker_id,
                     len(granted), request_id)  # fmt: skip
            return granted[:limit]
    full: frozenset[str] = frozenset()
    passed: frozenset[str] = frozenset()
    leases: list[Lease] = []
    terms: dict[str, Any] = {"run_id": run_id, "step_key": step_key, "tasks": tasks}
    for _ in range(SLOT_ROUNDS):
        page = limit - len(leases)
        past: dict[str, Any] = {"full_slots": full, "passing": passed}
        # nothing to lease: no write transaction (an idle worker's poll is one read)
        if not candidates.claimable_attempts(authority.store, page_at, 1, **terms, **past):
            break
        offer = partial(
            candidates.offered_attempts, now_ms=page_at, limit=page, lock_prefix=ATTEMPT_LOCK,
            **terms, **past,
        )  # fmt: skip
        granted, offered, blocked, held = _grant(
            authority, worker_id, offer, limit - len(leases), ttl_ms, now_ms, start, worker,
            request_id,
        )  # fmt: skip
        leases += granted
        # a page that ended on claims of full slots, or on Attempts other workers are
        # leasing right now, may hide work behind them: ask again past those
        if len(leases) >= limit or not (blocked or held) or offered < page:
            break
        full |= blocked
        passed |= held
    if leases:
        log.info("worker %s leased %d attempt(s)", worker_id, len(leases))
    return leases


SLOT_ROUNDS = 3  # pages a lease call reads when full slots fill them


def _grant(
    authority: Units,
    worker_id: str,
    offer: Callable[[Transaction], list[tuple[str, str, str | None]]],
    limit: int,
    ttl_ms: int,
    now_ms: int | None,
    start: bool,
    worker: worker_rules.WorkerInfo | None,
    request_id: str | None = None,
) -> tuple[list[Lease], int, frozenset[str], frozenset[str]]:
    """One lease transaction over the (attempt, run, slot) candidates `offer` reads in
    it: the leases granted, how many were offered, the slots found full, and the
    Attempts other transactions held."""
    now = Now(now_ms)
    blocked: set[str] = set()
    offered: list[tuple[str, str, str | None]] = []

    def grant(tx: Transaction) -> Batch:
        now.bind(tx)
        blocked.clear()
        offered[:] = offer(tx)
        causes = [request_id] * limit if request_id is not None else []
        return _grant_in(
            tx, authority, worker_id, offered, limit, ttl_ms, now, start, worker, blocked,
            causes=causes,
        )  # fmt: skip

    try:
        batch = _with_retries(authority, grant, "lease_start" if start else "lease")
    except (VersionConflict, LockTimeout):
        # Runs moved, or a lock stayed held: leave them for the next call
        return [], len(offered), frozenset(), frozenset()
    held = frozenset(
        attempt_id
        for (attempt_id, _run, _slot), written in zip(offered, batch.written, strict=True)
        if written.held
    )
    return _granted(batch, start), len(offered), frozenset(blocked), held


def _grant_in(
    tx: Transaction,
    authority: Units,
    worker_id: str,
    offered: Sequence[tuple[str, str, str | None]],
    limit: int,
    ttl_ms: int,
    now: Now,
    start: bool,
    worker: worker_rules.WorkerInfo | None,
    blocked: set[str],
    written_here: Mapping[str, RunAggregate] | None = None,
    causes: Sequence[str] = (),
) -> Batch:
    """Grant up to `limit` of the `offered` candidates in `tx` (skipping what another
    transaction holds and what a full limit slot blocks: added to `blocked`);
    `written_here`: Runs `tx` wrote before, as `write_runs` takes them; `causes`: the
    causation of each grant in turn, where it is not the Run's latest event."""
    rule = run_path.lease_and_start if start else worker_rules.grant_lease
    granted = 0
    book = SlotBook({}, {}, ())

    def read_slots(tx: Transaction, locked: set[str]) -> None:
        nonlocal book
        if locked:  # only a lease with limits reads them: one statement
            facts = limit_rows.attempt_slot_facts(
                tx, locked, {limit_of(slot) for slot in locked}, now()
            )
            book = SlotBook(facts.held, facts.overrides, locked)

    def decide_for(attempt_id: str) -> Callable[[RunAggregate], Decision]:
        def decide(aggregate: RunAggregate) -> Decision:
            nonlocal granted
            if granted >= limit:
                return EMPTY
            ref = attempt_slot(aggregate, attempt_id) if attempt_id in aggregate.attempts else None
            if not book.free(ref):
                assert ref is not None
                blocked.add(ref.slot)
                return EMPTY
            cause = causes[granted] if granted < len(causes) else None
            decision = rule(
                aggregate, attempt_id, worker_id, ttl_ms, now(), worker=worker, caused_by=cause
            )
            book.take(ref)
            granted += 1
            return decision

        return decide

    writes = [RunWrite(r, decide_for(a), a, slot=slot) for a, r, slot in offered]
    return write_runs(
        tx, writes, authority.aggregates, wait=False, after_locks=read_slots,
        written_here=written_here,
    )  # fmt: skip


def _granted(batch: Batch, started: bool) -> list[Lease]:
    """The leases a grant batch wrote, in its order."""
    return [
        _lease_value(batch.after.get(w.run_id, w.aggregate), w.decision.lease, started=started)
        for w in batch.written
        if w.aggregate is not None and w.decision is not None and w.decision.lease is not None
    ]


def _lease_value(
    aggregate: RunAggregate, grant: LeaseGrant, stop_requested: bool = False, started: bool = False
) -> Lease:
    attempt = aggregate.attempts[grant.attempt_id]
    step = aggregate.steps[attempt.step_key]
    return Lease(
        step_deadline_ms=step_deadline_ms(aggregate, grant.attempt_id),
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


@dataclass(frozen=True, slots=True)
class WorkerWrite:
    """One fenced worker write (a start barrier, a renewal) as `_worker_writes` takes it."""

    lease: Lease
    name: str  # its unit's name when written alone
    now: Now
    decide: Callable[[RunAggregate], Decision]


def _worker_writes(
    authority: Units, items: Sequence[WorkerWrite]
) -> list[tuple[RunAggregate, Decision] | QlflowError]:
    """Fenced worker writes in one transaction (docs/DESIGN.md "Group commit"), each
    decided and fenced on its own, retried together on a version conflict: per item
    (the Run as the batch left it, its decision), or its refusal."""
    writes = [RunWrite(i.lease.run_id, i.decide, i.lease.attempt_id) for i in items]
    names = {item.name for item in items}

    def unit(tx: Transaction) -> Batch:
        for item in items:
            item.now.bind(tx)
        return write_runs(tx, writes, authority.aggregates, wait=True)

    batch = _with_retries(authority, unit, names.pop() if len(names) == 1 else "worker_writes")
    answers: list[tuple[RunAggregate, Decision] | QlflowError] = []
    for written in batch.written:
        if written.refusal is not None:
            answers.append(written.refusal)
            continue
        before, decision = written.result()
        answers.append((batch.after.get(written.run_id, before), decision))
    return answers


def _worker_write(
    authority: Units,
    lease: Lease,
    name: str,
    now: Now,
    decide: Callable[[RunAggregate], Decision],
    group: GroupedWorkerWrites | None = None,
) -> tuple[RunAggregate, Decision]:
    """One fenced worker write on the lease's Run; retried on a version conflict.
    (the Run as the write left it, the decision). On the store's clock, through
    `group` if given: shared with the writes of other threads that arrive together."""
    item = WorkerWrite(lease, name, now, decide)
    if group is not None and now.given is None:
        answer = group.submit(item)
    else:
        answer = _worker_writes(authority, [item])[0]
    if isinstance(answer, QlflowError):
        raise answer
    return answer


class GroupedWorkerWrites:
    """`mark_starting`, `mark_running` and `renew` on the store's clock for callers on
    many threads: writes that arrive together share one transaction
    (`actors.group_commit`), each decided, fenced and answered on its own."""

    def __init__(self, authority: Units, max_batch: int) -> None:
        self._group: GroupCommit[WorkerWrite, tuple[RunAggregate, Decision] | QlflowError] = (
            GroupCommit(lambda items: _worker_writes(authority, items), max_batch)
        )

    @property
    def batches(self) -> int:
        """Commits made so far (fewer than writes when they were grouped)."""
        return self._group.batches

    def submit(self, item: WorkerWrite) -> tuple[RunAggregate, Decision] | QlflowError:
        return self._group.submit(item)


def mark_starting(
    authority: Units, lease: Lease, now_ms: int | None, group: GroupedWorkerWrites | None = None
) -> Lease:
    """The start barrier: written durably before the worker spawns anything. The
    answer carries the step's deadline when it has a timeout."""
    now = Now(now_ms)
    after, _ = _worker_write(
        authority,
        lease,
        "start",
        now,
        lambda agg: worker_rules.mark_starting(
            agg, lease.attempt_id, lease.lease_id, lease.version, now()
        ),
        group,
    )
    return replace(lease, step_deadline_ms=step_deadline_ms(after, lease.attempt_id))


def mark_running(
    authority: Units, lease: Lease, now_ms: int | None, group: GroupedWorkerWrites | None = None
) -> Lease:
    """starting -> running (from claimed+leased through starting in one transaction)."""
    now = Now(now_ms)
    _worker_write(
        authority,
        lease,
        Status.RUNNING,
        now,
        lambda agg: worker_rules.mark_running(
            agg, lease.attempt_id, lease.lease_id, lease.version, now()
        ),
        group,
    )
    return lease


def renew(
    authority: Units,
    lease: Lease,
    ttl_ms: int,
    now_ms: int | None,
    group: GroupedWorkerWrites | None = None,
) -> Lease:
    """Extend the lease; the answer says whether the Run asks the worker to stop, or
    the Attempt is past its step's timeout."""
    now = Now(now_ms)
    after, decision = _worker_write(
        authority,
        lease,
        "renew",
        now,
        lambda agg: worker_rules.renew(
            agg, lease.attempt_id, lease.lease_id, lease.version, ttl_ms, now()
        ),
        group,
    )
    grant = decision.lease
    assert grant is not None, "a renewal that does not refuse grants the lease"
    return replace(
        lease,
        version=grant.version,
        expires_at_ms=grant.expires_at_ms,
        stop_requested=decision.stop_requested,
        step_deadline_ms=step_deadline_ms(after, lease.attempt_id),
        step_timed_out=decision.step_timed_out,
    )


@dataclass(frozen=True, slots=True)
class NextWork:
    """What a completing worker leases next in its completion's commit: up to `limit`
    claimable Attempts (of `tasks`, of `run_id`; None: any), as
    `lease_attempts(start=True)` right after the completion would (the same
    candidates, order, limit slots and records), for `ttl_ms`, `worker` recorded on
    the grants."""

    worker_id: str
    ttl_ms: int
    limit: int
    tasks: frozenset[str] | None = None
    worker: worker_rules.WorkerInfo | None = None
    run_id: str | None = None  # only this Run's Attempts (a host driving one Run)


@dataclass(frozen=True, slots=True)
class Completion:
    """One Attempt's outcome, as `complete` takes it, for `complete_many`."""

    lease: Lease
    outcome: str
    result_code: str | None = None
    output: Mapping[str, Any] | None = None
    execution: Mapping[str, Any] | None = None  # how it ran: domain.execution
    # what the worker takes next in the same commit (docs/DESIGN.md "The run path")
    next_work: NextWork | None = None


@dataclass(frozen=True, slots=True)
class Completed:
    """What `complete_many` did with one Completion: `status` is what `complete` would
    return (the recorded status), or `error` what it would raise (nothing was written
    for that one)."""

    lease: Lease
    status: str | None = None
    error: QlflowError | None = None
    next_leases: tuple[Lease, ...] = ()  # leased with it (`Completion.next_work`), started


def complete(
    authority: Units,
    lease: Lease,
    outcome: str,
    *,
    result_code: str | None,
    output: dict[str, Any] | None,
    now_ms: int | None,
    execution: Mapping[str, Any] | None = None,
) -> str:
    """Record the Attempt's end under its lease, with what the frontier and attempt
    admission decide next from it, in one commit; returns the recorded status."""
    (done,) = complete_many(
        authority, [Completion(lease, outcome, result_code, output, execution)], now_ms
    )
    if done.error is not None:
        raise done.error
    assert done.status is not None
    return done.status


def complete_many(
    authority: Units, completions: Sequence[Completion], now_ms: int | None
) -> list[Completed]:
    """Record several Attempts' ends, each as `complete` would, in one commit. A bad
    argument in any of them (InvalidInput) refuses the call and writes nothing; a
    completion its lease no longer allows (FenceError, NotFound) is answered with
    that error and the others are recorded."""

    now = Now(now_ms)

    def decide_for(done: Completion) -> Callable[[RunAggregate], Decision]:
        lease = done.lease
        return lambda agg: run_path.complete_and_advance(
            agg,
            lease.attempt_id,
            lease.lease_id,
            lease.version,
            done.outcome,
            done.result_code,
            done.output,
            now(),
            execution=done.execution,
        )

    writes = [RunWrite(c.lease.run_id, decide_for(c), c.lease.attempt_id) for c in completions]

    next_leases: dict[int, tuple[Lease, ...]] = {}

    def unit(tx: Transaction) -> Batch:
        batch = write_runs(now.bind(tx), writes, authority.aggregates, wait=True)
        for index, written in enumerate(batch.written):
            refusal = written.refusal
            if isinstance(refusal, InvalidInput) and len(writes) > 1:
                # a bad argument refuses the whole call: nothing is written
                raise InvalidInput(refusal.field, refusal.rule, f"completions[{index}]: {refusal}")
        next_leases.clear()
        next_leases.update(_lease_next(tx, authority, completions, batch, now))
        return batch

    batch = _with_retries(authority, unit, "complete")
    answers = []
    for index, (done, written) in enumerate(zip(completions, batch.written, strict=True)):
        if written.refusal is not None:
            answers.append(Completed(done.lease, error=written.refusal))
            continue
        recorded = _recorded(done.lease, written)
        log.info(
            "attempt %s (%s/%s) completed: reported %s, recorded %s",
            done.lease.attempt_id,
            done.lease.run_id,
            done.lease.step_key,
            done.outcome,
            recorded,
        )
        answers.append(
            Completed(done.lease, status=recorded, next_leases=next_leases.get(index, ()))
        )
    return answers


def _lease_next(
    tx: Transaction,
    authority: Units,
    completions: Sequence[Completion],
    batch: Batch,
    now: Now,
) -> dict[int, tuple[Lease, ...]]:
    """In the completions' transaction, after them: the leases each recorded
    completion's `next_work` asks for, granted as `lease_attempts(start=True)` grants
    them (the candidates read in this transaction see what the completions made
    ready). Completions asking alike (one worker, its terms) share one grant, its
    leases handed out in their order, each caused by the completion it is handed to.
    A replayed completion is handed again what its first commit granted with it
    (`_granted_with`), nothing new. `batch.after` takes the Runs the grants leave."""
    asking: dict[NextWork, list[int]] = {}  # by the terms asked, the limit left out
    handed: dict[int, tuple[Lease, ...]] = {}
    for index, (done, written) in enumerate(zip(completions, batch.written, strict=True)):
        if done.next_work is None or written.refusal is not None:
            continue
        if written.result()[1].replayed:
            handed[index] = _granted_with(tx, authority, done.lease, now())
        else:
            asking.setdefault(replace(done.next_work, limit=0), []).append(index)
    if asking:
        # the grant's read-model rows, guessed to go with the offer's read: the Runs the
        # completions wrote and the Attempts they claimed, the next steps a grant of
        # their own Run names (docs/DESIGN.md "Two round trips")
        claimed = {
            attempt_id
            for w in batch.written
            if w.aggregate is not None and w.run_id in batch.after
            for attempt_id in batch.after[w.run_id].attempts
            if attempt_id not in w.aggregate.attempts
        }
        read_ahead_of_runs(tx, sorted(batch.after), sorted(claimed))
    for terms, indexes in asking.items():
        limits = [completions[i].next_work.limit for i in indexes]  # type: ignore[union-attr]
        offered = candidates.offered_attempts(
            tx, now(), sum(limits), lock_prefix=ATTEMPT_LOCK, run_id=terms.run_id,
            tasks=terms.tasks,
        )  # fmt: skip
        if not offered:
            continue
        # each completion's slots in turn, every grant in them caused by its completion
        causes: list[str] = []
        for index, limit in zip(indexes, limits, strict=True):
            causes += [_completed_event_id(completions[index].lease, batch.written[index])] * limit
        granted = _grant_in(
            tx, authority, terms.worker_id, offered, sum(limits), terms.ttl_ms, now, True,
            terms.worker, set(), written_here=batch.after, causes=causes,
        )  # fmt: skip
        batch.after.update(granted.after)
        leases = _granted(granted, started=True)
        if leases:
            log.info(
                "worker %s leased %d attempt(s) with its completion", terms.worker_id, len(leases)
            )
        for index, limit in zip(indexes, limits, strict=True):
            handed[index], leases = tuple(leases[:limit]), leases[limit:]
    return handed


def _completed_event_id(lease: Lease, written: Written) -> str:
    """The id of the `lease.completed` record a completion appends."""
    _, decision = written.result()
    return next(
        e.event_id
        for e in decision.events(lease_stream(lease.attempt_id))
        if e.type == EventType.LEASE_COMPLETED
    )


GRANTS_PAGE = 256  # records read at a time looking for a lost commit's grants


def _granted_with(
    tx: Transaction, authority: Units, completed: Lease, now_ms: int
) -> tuple[Lease, ...]:
    """The leases the commit that recorded `completed`'s completion granted with it,
    in their order, that are still live: the answer a lost COMMIT response did not
    bring (`_to_hand_again`). Those grants name the completion's `lease.completed`
    as their cause, and a commit's records have consecutive positions, all at one
    instant: they are read from that record on, up to the first record of another
    instant (docs/DESIGN.md "A lost answer of a completion that leased")."""
    completed_record = next(
        (
            r
            for r in tx.read_stream(lease_stream(completed.attempt_id))
            if r.type == EventType.LEASE_COMPLETED and r.data["lease_id"] == completed.lease_id
        ),
        None,
    )
    if completed_record is None:
        return ()
    cause, at_ms = completed_record.event_id, completed_record.metadata.get("at_ms")
    grants: list[Mapping[str, Any]] = []
    position = completed_record.global_position
    while True:
        page = tx.read_all(position, GRANTS_PAGE)
        for record in page:
            metadata = record.metadata
            if metadata.get("at_ms") != at_ms:
                page = []
                break
            if record.type == EventType.LEASE_GRANTED and metadata.get("causation_id") == cause:
                grants.append(record.data)
        if len(page) < GRANTS_PAGE:
            break
        position = page[-1].global_position
    return tuple(_to_hand_again(tx, authority, grants, now_ms))


def _to_hand_again(
    tx: Reads, authority: Units, grants: Sequence[Mapping[str, Any]], now_ms: int
) -> list[Lease]:
    """The leases of these `lease.granted` records that are still live and whose
    Attempts no one recorded running (a caller that did get the answer and runs them
    is not handed them again once it recorded that), in their order."""
    runs = read_runs(tx, {grant["run_id"] for grant in grants}, authority.aggregates)
    leases = []
    for grant in grants:
        streams = runs.get(grant["run_id"])
        if streams is None:
            continue  # removed since (retention): nothing to hand
        aggregate = streams.fold()
        attempt = aggregate.attempts[grant["attempt_id"]]
        lease = attempt.lease
        if lease is None or lease.lease_id != grant["lease_id"] or not lease.is_live(now_ms):
            continue  # it lapsed, or moved on: it is no one's to hand now
        if attempt.status not in ATTEMPT_NOT_YET_RUNNING:
            continue  # recorded running: the answer did reach a worker, which runs it
        held = LeaseGrant(
            grant["attempt_id"], lease.lease_id, lease.version, lease.worker_id,
            lease.expires_at_ms,
        )  # fmt: skip
        leases.append(_lease_value(aggregate, held, started=attempt.status == Status.STARTING))
    return leases


def _granted_for_request(
    authority: Units, worker_id: str, request_id: str, now_ms: int
) -> list[Lease]:
    """The leases a lease call with `request_id` granted that are still live and not
    recorded running, in the order it granted them: among the live leases
    `worker_id` holds of Attempts not running, those whose grant names the request
    as its cause."""
    store = authority.store
    held = candidates.held_not_running(store, worker_id, now_ms)
    if not held:
        return []
    streams = store.read_streams([lease_stream(attempt_id) for attempt_id, _, _ in held])
    granted = sorted(
        (
            record
            for attempt_id, _run, lease_id in held
            for record in streams.get(lease_stream(attempt_id), ())
            if record.type == EventType.LEASE_GRANTED
            and record.data["lease_id"] == lease_id
            and record.metadata.get("causation_id") == request_id
        ),
        key=lambda record: record.global_position,  # the order the call granted them in
    )
    return _to_hand_again(store, authority, [r.data for r in granted], now_ms)


class GroupedCompletions:
    """`complete` on the store's clock for callers on many threads (a host's slots):
    completions that arrive together share one `complete_many` commit
    (`actors.group_commit`); each is decided, fenced and answered on its own."""

    def __init__(self, authority: Units, max_batch: int) -> None:
        self._group: GroupCommit[Completion, Completed] = GroupCommit(
            lambda items: complete_many(authority, items, None), max_batch
        )

    @property
    def batches(self) -> int:
        """Commits made so far (fewer than completions when they were grouped)."""
        return self._group.batches

    def complete(self, completion: Completion) -> Completed:
        """Record `completion`; returns what was recorded or raises as `complete`."""
        done = self._group.submit(completion)
        if done.error is not None:
            raise done.error
        assert done.status is not None
        return done


def _recorded(lease: Lease, written: Written) -> str:
    """The status a completion recorded (or, replayed, had recorded before)."""
    aggregate, decision = written.result()
    if decision.replayed:
        return aggregate.attempts[lease.attempt_id].status
    return next(
        event_types.name(e.type)
        for e in decision.events(run_stream(lease.run_id))
        if event_types.family(e.type) == Family.ATTEMPT
        and e.data.get("attempt_id") == lease.attempt_id
    )


def cancel(authority: Units, run_id: str, reason: str, now_ms: int | None) -> bool:
    """Record cancel intent on the Run (idempotent), and with it what cancellation
    convergence ends at once; see `cancel_many`. True if this call recorded the
    intent."""
    return cancel_many(authority, [run_id], reason, now_ms)[0]


CANCEL_SLICE = 64  # Runs read, decided and appended together inside a cancel_many


@dataclass(frozen=True, slots=True)
class CancelRequest:
    """One Run's cancel, as `cancel` takes it, for a grouped commit."""

    run_id: str
    reason: str


def cancel_many(
    authority: Units, run_ids: Sequence[str], reason: str, now_ms: int | None
) -> list[bool]:
    """Record cancel intent on each Run in one commit (idempotent), and with it what
    cancellation convergence ends at once (`run_path.cancel_and_converge`) where the
    Run's active Attempts' locks are free — else the intent alone, and the rest ends
    with the held Attempts' completions (or the cycle). For each Run, in order: True
    if this call recorded its intent (a Run named twice: the first time). NotFound for
    a Run that does not exist, writing nothing."""
    answers = _cancel_each(authority, [CancelRequest(r, reason) for r in run_ids], now_ms, True)
    return [answer is True for answer in answers]


Cancelled = bool | QlflowError
"""A cancel's answer: whether it recorded the intent, or its refusal."""


def cancel_each(
    authority: Units, requests: Sequence[CancelRequest], now_ms: int | None
) -> list[Cancelled]:
    """Each request as `cancel` alone would answer it, all in one commit: True if it
    recorded its Run's intent (a Run asked twice: the first time), False if the intent
    was there before, or the refusal (a Run that does not exist, a bad reason), for
    which nothing is written."""
    return _cancel_each(authority, requests, now_ms, False)


def _cancel_each(
    authority: Units, requests: Sequence[CancelRequest], now_ms: int | None, refuse_all: bool
) -> list[Cancelled]:
    # in Run id order (the heads' lock order across slices), each request once
    first: dict[CancelRequest, int] = {}
    for index, request in enumerate(requests):
        first.setdefault(request, index)
    wanted = sorted(first, key=lambda r: (r.run_id, first[r]))
    now = Now(now_ms)

    def unit(tx: Transaction) -> Batch:
        now.bind(tx)

        def converge(reason: str) -> Callable[[RunAggregate], Decision]:
            return lambda aggregate: run_path.cancel_and_converge(aggregate, reason, now())

        def intent(reason: str) -> Callable[[RunAggregate], Decision]:
            # an Attempt's lock held elsewhere (a worker writing its lease) leaves the
            # Run's convergence to that worker's completion or the cycle: the intent
            # alone is recorded
            return lambda aggregate: request_cancel(aggregate, reason, now())

        written: list[Written] = []
        after: dict[str, RunAggregate] = {}
        # a slice of Runs at a time inside the one transaction (the heads in key order
        # across slices): the memory a call holds stays that of one slice
        for start in range(0, len(wanted), CANCEL_SLICE):
            writes = [
                RunWrite(r.run_id, converge(r.reason), if_attempts_held=intent(r.reason))
                for r in wanted[start : start + CANCEL_SLICE]
            ]
            batch = write_runs(tx, writes, authority.aggregates, wait=True)
            for found in batch.written:
                if found.refusal is not None and refuse_all:
                    raise found.refusal  # a Run that does not exist: nothing is written
            written += batch.written
            after.update(batch.after)
        return Batch(written, after)

    batch = _with_retries(authority, unit, "cancel")
    by_request = dict(zip(wanted, batch.written, strict=True))
    answers: list[Cancelled] = []
    for request in requests:
        found = by_request.pop(request, None)
        if found is None:  # asked again in this call: the first answer recorded it
            answers.append(False)
        elif found.refusal is not None:
            answers.append(found.refusal)
        else:
            decision = found.decision
            recorded = decision is not None and bool(decision.appends)
            answers.append(recorded)
            if recorded:
                assert decision is not None
                log.info(
                    "run %s: cancel requested (%s)%s",
                    request.run_id,
                    request.reason,
                    ", cancelled" if decision.run_terminal else "",
                )
    return answers


def grouped_cancels(authority: Units, max_batch: int) -> GroupCommit[CancelRequest, Cancelled]:
    """`cancel` on the store's clock for callers on many threads (a host stopping, a
    dashboard's users): cancels that arrive together share one `cancel_each` commit
    (`actors.group_commit`), each decided and answered on its own."""
    return GroupCommit(lambda items: cancel_each(authority, items, None), max_batch)
