"""Decisions on Runs taken under their locks and committed together: one transaction
for a batch of worker writes, or for a page of the cycle (docs/DESIGN.md, "Batched
writes").

Each Run's records are its own: decided on the Run as the log holds it, checked
against the versions it was decided on, appended all or nothing. A batch only
shares the transaction — one BEGIN, one lock and read pass, one append call, one
read-model pass and one COMMIT for all of them. A decision that refuses (a fence, a
bad argument, a Run that does not exist) writes nothing for its Run and is
answered on its own; the others go on. What the COMMIT leaves is handed back
(`Batch.after`) for the caller to keep once the COMMIT has answered
(`actors.aggregate_cache`).

Locks keep the fixed order of docs/DESIGN.md "Locks": Attempt locks first, then Run
stream heads, each set in key order. `wait=True` (worker writes) waits for them,
bounded by the store's lock timeout; `wait=False` (leasing) skips what another
transaction holds.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from actors.aggregate_cache import AggregateCache
from actors.loading import RunStreams, attempt_lock, not_found, read_runs, slot_lock
from domain.aggregate import RunAggregate
from domain.decision import Decision
from domain.errors import FenceError, InvalidInput, NotFound, QlflowError
from domain.run_path import applied, chained
from domain.streams import run_stream
from eventstore.api import Transaction
from eventstore.validation import EncodedBatch, encode_appends
from projections.registry import commit_encoded, read_ahead_of_runs

K = TypeVar("K")

REFUSALS = (FenceError, InvalidInput, NotFound)
"""What a decision raises to refuse one write (answered to its caller; the rest go on)."""


@dataclass(frozen=True, slots=True)
class RunWrite:
    """One decision to take on one Run: `decide(aggregate)`, under the lock of
    `attempt_id` (if any, with the lock of its limit `slot`: docs/DESIGN.md "Flow
    control") and the Run's stream head.

    With `if_attempts_held`, the write also takes the locks of the Run's active
    Attempts, after its head and without waiting (a cancel that ends what no worker
    holds); where another transaction holds one, it decides `if_attempts_held`
    instead."""

    run_id: str
    decide: Callable[[RunAggregate], Decision]
    attempt_id: str | None = None
    if_attempts_held: Callable[[RunAggregate], Decision] | None = None
    slot: str | None = None  # a limit slot the write may take: locked with the Attempt


@dataclass(frozen=True, slots=True)
class Written:
    """What became of one RunWrite."""

    run_id: str
    aggregate: RunAggregate | None = None  # the Run as its decision saw it
    decision: Decision | None = None  # None: refused or held
    refusal: QlflowError | None = None  # the decision refused: nothing written for it
    held: bool = False  # another transaction holds its locks (wait=False): nothing written

    def result(self) -> tuple[RunAggregate, Decision]:
        """(aggregate, decision), or raise the refusal."""
        if self.refusal is not None:
            raise self.refusal
        assert self.aggregate is not None and self.decision is not None
        return self.aggregate, self.decision


@dataclass(frozen=True, slots=True)
class Batch:
    """A batch's answers (in the order of its writes) and the Runs as it leaves them."""

    written: list[Written]
    after: dict[str, RunAggregate] = field(default_factory=dict)


def write_runs(
    tx: Transaction,
    writes: Sequence[RunWrite],
    cache: AggregateCache | None,
    *,
    wait: bool,
    after_locks: Callable[[Transaction, set[str]], None] | None = None,
    written_here: Mapping[str, RunAggregate] | None = None,
) -> Batch:
    """Lock, read, decide and commit every write in `tx`. Several writes on one Run are
    decided in order, each on the Run as the one before left it. `after_locks` is
    called with the slots whose locks are taken, once every lock is, before any
    decision (what it reads, it reads under them).

    `written_here` (leasing without slots only): Runs an earlier write of `tx` left
    as given, their heads held by `tx`: neither locked nor read again, their writes'
    Attempts granted under the locks the offer's read took
    (`candidates.offered_attempts`). A completion's grant of the steps it made ready
    costs no round trip before its decision."""
    slots = {w.attempt_id: w.slot for w in writes if w.attempt_id}
    guessed: dict[str, Callable[[], frozenset[str]]] = {}
    if wait:
        # Attempts' (and slots') locks, then the Runs' heads, answered by nothing: a
        # store sends them with the read that follows (one round trip on PostgreSQL)
        keys = [k for a, s in slots.items() for k in (attempt_lock(a), *_slot_keys(s))]
        locked = {w.run_id for w in writes}
        tx.lock_ahead(keys, [run_stream(r) for r in locked])
        held_attempts: set[str] = set()
        # a write that tries its Run's active Attempts' locks after the head tries,
        # with the same read, those of the Run as this process last left it: checked
        # against the Run as read below (a guess that missed is tried again)
        named = set(slots)
        for run_id in sorted({w.run_id for w in writes if w.if_attempts_held}):
            base = cache.get(run_id) if cache is not None else None
            if base is not None:
                guessed[run_id] = tx.try_lock_each_ahead(active_attempt_keys(base))
                named.update(a.attempt_id for a in base.active_attempts())
        # and the read models' rows its records will likely touch, with the same read
        read_ahead_of_runs(tx, sorted(locked), sorted(named))
    elif not any(slots.values()):
        # no limit slot to read under its lock: try each lock and read every Run in one
        # round trip; what another transaction holds is skipped (its read is not used)
        known = written_here or {}
        run_ids = {w.run_id for w in writes if w.run_id not in known}
        attempts = [w.attempt_id for w in writes if w.attempt_id and w.run_id not in known]
        held_attempts, locked, streams = set(), set(), {}
        if attempts or run_ids:
            tried = tx.try_lock_each_ahead([attempt_lock(a) for a in attempts])
            heads = tx.lock_heads_each_ahead([run_stream(r) for r in run_ids])
            read_ahead_of_runs(tx, sorted(run_ids), sorted(attempts))
            streams = read_runs(tx, run_ids, cache)
            taken = tried()
            held_attempts = {a for a in attempts if attempt_lock(a) not in taken}
            locked = {r for r in run_ids if run_stream(r) in heads()}
            streams = {r: read for r, read in streams.items() if r in locked}
        locked |= {w.run_id for w in writes if w.run_id in known}
    else:
        held_attempts = _lock_attempts(tx, slots, wait)
        wanted = {w.run_id for w in writes if w.attempt_id not in held_attempts}
        locked = _lock_runs(tx, wanted, wait)
    if after_locks is not None:
        after_locks(tx, {s for a, s in slots.items() if s and a not in held_attempts})
    if wait or any(slots.values()):
        streams = read_runs(tx, locked, cache)
    current = {run_id: read.fold() for run_id, read in streams.items()}
    if not wait and written_here:
        current.update({r: a for r, a in written_here.items() if r in locked})
    probing = sorted({w.run_id for w in writes if w.if_attempts_held and w.run_id in current})
    wanted_keys = {r: active_attempt_keys(current[r]) for r in probing}
    free = {r for r in probing if r in guessed and guessed[r]().issuperset(wanted_keys[r])}
    free |= try_locks(tx, {r: k for r, k in wanted_keys.items() if r not in free})
    decisions: dict[str, list[Decision]] = {}
    written = []
    for write in writes:
        run_id = write.run_id
        if write.attempt_id in held_attempts or run_id not in locked:
            written.append(Written(run_id, held=True))
            continue
        aggregate = current.get(run_id)
        if aggregate is None:
            written.append(Written(run_id, refusal=not_found(run_id)))
            continue
        decide = write.decide
        if write.if_attempts_held is not None and run_id not in free:
            decide = write.if_attempts_held
        try:
            decision = decide(aggregate)
        except REFUSALS as refusal:
            written.append(Written(run_id, aggregate, refusal=refusal))
            continue
        if decision.appends:
            current[run_id] = applied(aggregate, decision)
            decisions.setdefault(run_id, []).append(decision)
        written.append(Written(run_id, aggregate, decision))
    after = {run_id: current[run_id] for run_id in decisions}
    if decisions:
        batches = [encode_appends(_joined(found).appends) for found in decisions.values()]
        commit_encoded(tx, joined_batch(batches), folded=after, at_commit=True)
    return Batch(written, after)


def joined_batch(batches: Sequence[EncodedBatch]) -> EncodedBatch:
    """One append call of several Runs' encoded appends (their streams are disjoint)."""
    if len(batches) == 1:
        return batches[0]
    return EncodedBatch(
        tuple(a for batch in batches for a in batch.appends),
        tuple(e for batch in batches for e in batch.events),
    )


def _joined(decisions: list[Decision]) -> Decision:
    return decisions[0] if len(decisions) == 1 else chained(*decisions)


def try_locks(tx: Transaction, keys: Mapping[K, Sequence[str]]) -> set[K]:
    """The items whose every lock `tx` took without waiting, each lock tried on its
    own in one statement (what another transaction holds is skipped)."""
    taken = tx.try_lock_each([key for item_keys in keys.values() for key in item_keys])
    return {item for item, item_keys in keys.items() if taken.issuperset(item_keys)}


def active_attempt_keys(aggregate: RunAggregate) -> list[str]:
    """The lock names of the Run's active Attempts (docs/DESIGN.md "Locks")."""
    return [attempt_lock(a.attempt_id) for a in aggregate.active_attempts()]


def _slot_keys(slot: str | None) -> list[str]:
    return [slot_lock(slot)] if slot else []


def _lock_attempts(tx: Transaction, slots: Mapping[str, str | None], wait: bool) -> set[str]:
    """Take the Attempts' locks (each with its slot's, if any) in key order; the ids
    whose lock another transaction holds (never any with `wait`: it waits, bounded,
    then LockTimeout)."""
    keys = {a: [attempt_lock(a), *([slot_lock(s)] if s else [])] for a, s in slots.items()}
    if not keys:
        return set()
    if wait:
        tx.lock_all(sorted({k for names in keys.values() for k in names}))
        return set()
    free: set[str] = try_locks(tx, keys)
    return set(slots) - free


def _lock_runs(tx: Transaction, run_ids: set[str], wait: bool) -> set[str]:
    """Lock the Runs' stream heads in key order; the Runs whose heads are held here."""
    streams = {run_stream(r): r for r in run_ids}
    if not streams:
        return set()
    if wait:
        tx.lock_heads(sorted(streams), wait=True)
        return set(run_ids)
    taken = tx.lock_heads_each(sorted(streams))
    return {r for s, r in streams.items() if s in taken}


# --- the cycle's page: decided outside the lock, checked and committed together ----------


@dataclass(frozen=True, slots=True)
class Prepared:
    """A Workflow actor's turn, decided on what it read without a lock."""

    streams: RunStreams
    aggregate: RunAggregate
    decision: Decision
    batch: EncodedBatch  # the decision's appends, validated and encoded
    after: RunAggregate  # the Run as the decision leaves it (`applied`), made before the lock


def commit_prepared(
    tx: Transaction, prepared: Sequence[Prepared]
) -> tuple[list[str], dict[str, RunAggregate]]:
    """Check each turn's streams are still at the versions it read and commit the
    turns that are, together. Returns each turn's fate — "written", "blocked" (another
    transaction holds one of its locks, never waited for) or "conflict" (a stream
    moved) — and the Runs as the commit leaves them.

    The locks of the whole page are tried at once, each on its own."""
    reads = [turn.streams.versions() for turn in prepared]
    unlocked = try_locks(tx, {i: active_attempt_keys(t.aggregate) for i, t in enumerate(prepared)})
    heads = tx.lock_heads_each(sorted({s for read in reads for s in read}))
    fates = []
    batches = []
    after: dict[str, RunAggregate] = {}
    for index, (turn, read) in enumerate(zip(prepared, reads, strict=True)):
        if index not in unlocked:
            fates.append("blocked")
            continue
        if not heads.keys() >= read.keys():
            fates.append("blocked")
            continue
        if any(heads[stream_id] != version for stream_id, version in read.items()):
            fates.append("conflict")
            continue
        fates.append("written")
        batches.append(turn.batch)
        after[turn.aggregate.run_id] = turn.after
    if batches:
        commit_encoded(tx, joined_batch(batches), folded=after, at_commit=True)
    return fates, after
