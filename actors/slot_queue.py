"""The queue phase of a cycle (docs/DESIGN.md "Flow control"): Runs waiting in their
Workflow's queue take the slots that are free, in queue order.

A Workflow limit's slot is freed by the commit that ends the Run holding it, and
that commit cannot take another Run's stream; so each cycle looks at the slots
that have a queue (`projections.limits.queued_slots`, one index probe per slot) and
gives each one turn: one transaction that takes the slot's lock without waiting,
reads the Runs holding it and the overrides under it, and dequeues the first Runs
of its queue while `domain.slots.SlotBook` says a slot is free — each Run's
`workflow.dequeued` with the claims of its ready steps
(`domain.run_path.dequeue_and_claim`), in that one commit.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from actors.authority import Units
from actors.loading import slot_lock
from actors.run_writes import Batch, RunWrite, write_runs
from domain import run_path
from domain.aggregate import RunAggregate
from domain.decision import EMPTY, Decision
from domain.errors import VersionConflict
from domain.flow import limit_of
from domain.phases import QUEUE
from domain.slots import SlotBook
from eventstore.api import Transaction
from projections import limits as limit_rows

QUEUE_READ = 32  # queued Runs a turn reads (the most it can dequeue at once)


@dataclass(frozen=True, slots=True)
class QueueOutcome:
    """What one slot's turn did: how many Runs left the queue."""

    slot: str
    dequeued: int = 0
    blocked: bool = False
    conflict: bool = False
    error: str | None = None
    run_ids: tuple[str, ...] = ()


def slot_page(authority: Units, limit: int, after: str | None) -> list[str]:
    """Up to `limit` slots with a queue, after `after` (slot order)."""
    return limit_rows.queued_slots(authority.store, limit, after)


def turn(
    tx: Transaction, authority: Units, slot: str, now_ms: int
) -> tuple[QueueOutcome, dict[str, RunAggregate]]:
    """One slot's turn in the open transaction `tx` (see the module docstring), and
    the Runs as it leaves them."""
    if not tx.try_lock([slot_lock(slot)]):
        return QueueOutcome(slot, blocked=True), {}
    facts = limit_rows.run_slot_facts(tx, slot, limit_of(slot))
    book = SlotBook(facts.held, facts.overrides, (slot,))
    queued = limit_rows.queued_runs(tx, slot, QUEUE_READ)
    dequeued: list[str] = []

    def decide_for(run_id: str) -> Callable[[RunAggregate], Decision]:
        def decide(aggregate: RunAggregate) -> Decision:
            ref = aggregate.plan.flow.run_slot
            if ref is None or ref.slot != slot or not book.free(ref):
                return EMPTY
            decision = run_path.dequeue_and_claim(aggregate, now_ms)
            if decision.appends:
                book.take(ref)
                dequeued.append(run_id)
            return decision

        return decide

    writes = [RunWrite(run_id, decide_for(run_id)) for run_id in queued]
    batch: Batch = write_runs(tx, writes, authority.aggregates, wait=False)
    return QueueOutcome(slot, dequeued=len(dequeued), run_ids=tuple(dequeued)), batch.after


def run_turn(authority: Units, slot: str, now_ms: int) -> QueueOutcome:
    """One slot's turn as its own unit of work ("queue"); every failure is reported."""
    try:
        outcome, after = authority.execute(lambda tx: turn(tx, authority, slot, now_ms), name=QUEUE)
    except VersionConflict:
        return QueueOutcome(slot, conflict=True)
    except Exception as error:  # a lost store, a lock timeout
        return QueueOutcome(slot, error=f"{type(error).__name__}: {error}")
    authority.aggregates.put(after.values())
    return outcome
