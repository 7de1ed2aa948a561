"""Who holds a limit's slots, and who gets one next (docs/DESIGN.md, "Flow control").

The rules, in one place:

- **An Attempt holds its step's slot while its lease is held**, until the lease's
  expiry (`holds_until`): the commit that ends the lease (completed, released) frees
  it, and a lease that expired holds nothing at the store's clock — a worker that
  vanished never leaks a slot, and no timer has to free it.
- **A Run holds its Workflow's slot from the moment it leaves its queue** (or is
  admitted with a free slot) until the commit that ends it (`run_slot_state`).
- **Effective limit**: a `limits set` of the slot itself, else of its limit, else
  the count the Run's plan declares (`effective_slots`).
- **Order**: higher priority first, then the Run admitted first, then run id (a
  queued Run, `queue_order`); for leases the same, then the claim's position
  (`lease_order`), so a backlog drains Run by Run.

`SlotBook` applies them to the facts a transaction read under the slots' locks:
how many holders each slot has and the overrides. A decision asks `free` before it
grants and `take` after; a slot whose facts were not read is never free.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Final

from domain.aggregate import AttemptState, RunAggregate, effective_intent
from domain.decision import EMPTY, Decision, DecisionBuilder, check_now
from domain.event_types import EventType
from domain.flow import PlanFlow, SlotRef, effective_limit
from domain.ids import ADMISSION_EVENT, derive_id
from domain.transitions import LEASE_LEASED

HELD: Final = "held"  # a Run holds its Workflow's slot
QUEUED: Final = "queued"  # a Run waits in its Workflow's queue
QUEUE_ACTOR: Final = "cycle:queue"


def attempt_slot(aggregate: RunAggregate, attempt_id: str) -> SlotRef | None:
    """The slot a lease of this Attempt takes (None: its Task has no limit)."""
    return aggregate.plan.flow.step_slot(aggregate.attempts[attempt_id].step_key)


def holds_until(attempt: AttemptState) -> int | None:
    """Until when the Attempt holds its slot: its lease's expiry while the lease is
    held (not completed, not released), else None."""
    lease = attempt.lease
    if lease is None:
        return None
    return lease_holds_until(lease.status, lease.expires_at_ms)


def lease_holds_until(lease_status: str | None, expires_at_ms: int | None) -> int | None:
    """`holds_until` from the Attempt's lease as its last lease record left it (its
    status and expiry; None: never leased)."""
    return expires_at_ms if lease_status == LEASE_LEASED else None


def run_slot_state(aggregate: RunAggregate) -> str | None:
    """`HELD`, `QUEUED`, or None: the Run has no Workflow limit, or it ended."""
    return slot_state_of(aggregate.plan.flow, aggregate.run.is_terminal, aggregate.run.queued)


def slot_state_of(flow: PlanFlow, ended: bool, queued: bool) -> str | None:
    """`run_slot_state` from the Run's plan flow, whether it ended and whether it is
    queued (an ended Run holds nothing, queued or not)."""
    if flow.run_slot is None or ended:
        return None
    return QUEUED if queued else HELD


def effective_slots(ref: SlotRef, overrides: Mapping[str, int]) -> int:
    """The slot's limit now (`domain.flow.effective_limit`)."""
    return effective_limit(ref.slot, ref.declared, overrides)


def queue_order(priority: int, admitted_at_ms: int, run_id: str) -> tuple[int, int, str]:
    """The order in which Runs get slots: higher priority, then older, then by id."""
    return (-priority, admitted_at_ms, run_id)


def lease_order(
    priority: int, admitted_at_ms: int, run_id: str, claimed_position: int
) -> tuple[int, int, str, int]:
    """The order in which workers lease Attempts: the Run's `queue_order`, then the
    claim's position (the candidate index reads exactly this order)."""
    return (*queue_order(priority, admitted_at_ms, run_id), claimed_position)


class SlotBook:
    """The slots as a transaction found them under their locks (`held`: holders per
    slot, `overrides`: `limits set` values by slot or limit; `read`: the slots whose
    facts were read), and the slots it takes as it decides."""

    def __init__(
        self, held: Mapping[str, int], overrides: Mapping[str, int], read: Iterable[str]
    ) -> None:
        self._held = dict(held)
        self._overrides = dict(overrides)
        self._read = frozenset(read)

    def free(self, ref: SlotRef | None) -> bool:
        """Whether one more holder fits (no limit: always)."""
        if ref is None:
            return True
        if ref.slot not in self._read:
            return False
        return self._held.get(ref.slot, 0) < effective_slots(ref, self._overrides)

    def take(self, ref: SlotRef | None) -> None:
        """Count one more holder of the slot."""
        if ref is not None:
            self._held[ref.slot] = self._held.get(ref.slot, 0) + 1

    def held(self, slot: str) -> int:
        return self._held.get(slot, 0)


def takes_slot_at_admission(
    ref: SlotRef, held: int, queued_ahead: int, overrides: Mapping[str, int]
) -> bool:
    """Whether a Run admitted now takes its slot at once: the slots free beyond the
    Runs already queued ahead of it (at least its priority) leave it one; else it
    queues behind them."""
    return held + queued_ahead < effective_slots(ref, overrides)


def dequeue(aggregate: RunAggregate, now_ms: int, actor: str = QUEUE_ACTOR) -> Decision:
    """`workflow.dequeued`: the queued Run takes its slot (what the caller's SlotBook
    granted). Nothing for a Run that is not queued, ended or has cancel intent (a
    cancelled queued Run ends through cancellation without ever taking a slot)."""
    check_now(now_ms)
    run = aggregate.run
    ref = aggregate.plan.flow.run_slot
    if ref is None or not run.queued or run.is_terminal:
        return EMPTY
    if effective_intent(aggregate, now_ms) is not None:
        return EMPTY
    builder = DecisionBuilder.on(aggregate, now_ms, actor)
    builder.event(
        derive_id(ADMISSION_EVENT, run.plan.plan_digest, EventType.WORKFLOW_DEQUEUED),
        EventType.WORKFLOW_DEQUEUED,
        {"slot": ref.slot, "dequeued_at_ms": now_ms},
    )
    return builder.build()
