"""The read side of flow control (docs/DESIGN.md "Flow control"): the limits set at
runtime (`flow_limits`, folded from the `limit-` streams), and the facts a decision
about slots reads under the slots' locks, each in one statement.

Who holds a slot is the domain's answer stored with the Runs read model
(`projections.runs_windows`): an Attempt's `slot` and `slot_until_ms`
(`domain.slots.holds_until`), a Run's `run_slot` and `slot_state`
(`domain.slots.run_slot_state`). A holder counts at `now_ms` while `now_ms` is
before its `slot_until_ms` — a lease that expired holds nothing, with no write.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from domain import streams
from domain.event_types import EventType
from domain.flow import (
    TASK_LIMIT,
    WORKFLOW_LIMIT,
    Concurrency,
    effective_limit,
    limit_name,
    limit_of,
)
from domain.records import Record
from domain.revision import revision_from_json
from domain.slots import HELD, QUEUED
from eventstore.api import Transaction
from eventstore.grants import AUDIT, MOVE, READ, RUNTIME
from projections import candidates, publications
from projections.contract import Folded
from projections.published_revisions import FUNCTIONS as _REVISION_FUNCTIONS
from projections.published_revisions import published_revisions

COMPONENT = "projections.limits"
PUBLISHED_REVISIONS_SIGNATURE = _REVISION_FUNCTIONS[0].signature
STREAM_PREFIXES = (streams.prefix(streams.LIMIT),)
TABLE = "flow_limits"
_COLUMNS = ("target", "slots", "set_by", "set_at_ms", "version")
_CREATE = """CREATE TABLE flow_limits (
    target TEXT PRIMARY KEY,
    slots INTEGER NOT NULL,
    set_by TEXT,
    set_at_ms INTEGER NOT NULL,
    version INTEGER NOT NULL
)"""
MIGRATIONS = [{"sqlite": [_CREATE], "postgresql": [_CREATE.replace("INTEGER", "BIGINT")]}]
TABLES = {TABLE: ("target",)}
Replay = None  # the rebuild calls `apply` batch by batch
backfill = None  # nothing to fill after an upgrade
reads_ahead = None  # apply reads nothing worth sending ahead
reads_ahead_of_runs = None
GRANTS = {TABLE: {RUNTIME: MOVE, AUDIT: READ}}


def apply(tx: Transaction, records: Sequence[Record], folded: Folded | None = None) -> None:
    """Fold `limit.set` records: the target's limit is the last one set."""
    rows = {}
    for record in records:
        if record.type != EventType.LIMIT_SET:
            continue
        data = record.data
        rows[data["target"]] = (
            data["target"],
            data["new"],
            record.metadata.get("actor"),
            data["set_at_ms"],
            record.stream_version,
        )
    if rows:
        tx.upsert(TABLE, _COLUMNS, ("target",), [rows[key] for key in sorted(rows)])


# --- facts, each one statement -------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SlotFacts:
    """Holders per slot and the limits set for the slots or their limits."""

    held: dict[str, int]
    overrides: dict[str, int]
    queued_ahead: int = 0


def _marks(values: Sequence[str]) -> str:
    return ", ".join("?" * len(values))


def attempt_slot_facts(
    tx: Any, slots: Iterable[str], limits: Iterable[str], now_ms: int
) -> SlotFacts:
    """How many Attempts hold each slot at `now_ms`, and the overrides of the slots
    and their limits: the one statement a lease with limits adds."""
    slot_list = sorted(set(slots))
    targets = sorted(set(slot_list) | set(limits))
    rows = tx.query(
        f"""SELECT 'held', slot, COUNT(*) FROM attempts
            WHERE slot IN ({_marks(slot_list)}) AND slot_until_ms > ? GROUP BY slot
            UNION ALL
            SELECT 'set', target, slots FROM {TABLE} WHERE target IN ({_marks(targets)})""",
        (*slot_list, now_ms, *targets),
    )
    return _facts(rows)


def run_slot_facts(tx: Any, slot: str, limit: str, priority: int | None = None) -> SlotFacts:
    """The Runs holding `slot` and the overrides of the slot and its limit; with
    `priority` (a Run admitted now), also how many are queued for it at least as
    high. One statement."""
    ahead = ""
    params: tuple[Any, ...] = (slot,)
    if priority is not None:
        ahead = f"""SELECT 'ahead', run_slot, COUNT(*) FROM runs
            WHERE run_slot = ? AND slot_state = '{QUEUED}' AND priority >= ? GROUP BY run_slot
            UNION ALL"""
        params += (slot, priority)
    rows = tx.query(
        f"""SELECT 'held', run_slot, COUNT(*) FROM runs
            WHERE run_slot = ? AND slot_state = '{HELD}' GROUP BY run_slot
            UNION ALL {ahead}
            SELECT 'set', target, slots FROM {TABLE} WHERE target IN (?, ?)""",
        (*params, slot, limit),
    )
    return _facts(rows)


def _facts(rows: Iterable[Sequence[Any]]) -> SlotFacts:
    held: dict[str, int] = {}
    overrides: dict[str, int] = {}
    ahead = 0
    for kind, name, count in rows:
        if kind == "held":
            held[name] = count
        elif kind == "ahead":
            ahead = count
        else:
            overrides[name] = count
    return SlotFacts(held, overrides, ahead)


def queued_probe() -> tuple[str, list[Any]]:
    """The query whose one row (or none) says whether any Run waits in a queue (the
    first slot `queued_slots` would find)."""
    return f"SELECT 1 FROM runs WHERE slot_state = '{QUEUED}' LIMIT 1", []


def queued_slots(reader: Any, limit: int, after: str | None = None) -> list[str]:
    """Up to `limit` slots with Runs queued for them, in slot order after `after`: one
    index probe per slot (a skip scan of the queue index), whatever the queues'
    lengths."""
    rows = reader.query(
        f"""WITH RECURSIVE q(slot) AS (
                SELECT MIN(run_slot) FROM runs
                WHERE slot_state = '{QUEUED}' AND run_slot > ?
                UNION ALL
                SELECT (SELECT MIN(r.run_slot) FROM runs r
                        WHERE r.slot_state = '{QUEUED}' AND r.run_slot > q.slot)
                FROM q WHERE q.slot IS NOT NULL
            )
            SELECT slot FROM q WHERE slot IS NOT NULL LIMIT ?""",
        ("" if after is None else after, limit),
    )
    return [row[0] for row in rows]


def queued_runs(reader: Any, slot: str, limit: int) -> list[str]:
    """The first `limit` Runs queued for `slot`, in queue order
    (`domain.slots.queue_order`: a range of the queue index)."""
    rows = reader.query(
        f"""SELECT run_id FROM runs WHERE run_slot = ? AND slot_state = '{QUEUED}'
            ORDER BY priority DESC, admitted_at_ms, run_id LIMIT ?""",
        (slot, limit),
    )
    return [row[0] for row in rows]


# --- what `qlflow limits` lists ------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SlotHolder:
    """One holder of a limit's slot: an Attempt under its lease (until its expiry,
    on `worker_id`), or a Run of a limited Workflow."""

    slot: str
    run_id: str
    attempt_id: str | None = None
    step_key: str | None = None
    worker_id: str | None = None
    until_ms: int | None = None  # an Attempt's lease expiry


@dataclass(frozen=True, slots=True)
class Override:
    """A limit set at runtime."""

    target: str
    slots: int
    set_by: str | None
    set_at_ms: int


def holders(reader: Any, now_ms: int) -> list[SlotHolder]:
    """Every holder of every slot at `now_ms`, by slot."""
    attempts = reader.query(
        """SELECT slot, run_id, attempt_id, step_key, worker_id, slot_until_ms FROM attempts
           WHERE slot_until_ms > ? ORDER BY slot, slot_until_ms, attempt_id""",
        (now_ms,),
    )
    runs = reader.query(
        f"SELECT run_slot, run_id FROM runs WHERE slot_state = '{HELD}' ORDER BY run_slot, run_id"
    )
    found = [SlotHolder(*row) for row in attempts]
    found += [SlotHolder(slot, run_id) for slot, run_id in runs]
    return sorted(found, key=lambda h: (h.slot, h.run_id, h.attempt_id or ""))


def queued_counts(reader: Any) -> dict[str, int]:
    """How many Runs wait in each slot's queue."""
    rows = reader.query(
        f"SELECT run_slot, COUNT(*) FROM runs WHERE slot_state = '{QUEUED}' GROUP BY run_slot"
    )
    return {slot: count for slot, count in rows}


def waiting_counts(reader: Any, now_ms: int) -> dict[str, int]:
    """How many claimed Attempts of a limited Task a worker could lease at `now_ms`
    but for their slot, per slot."""
    rows = reader.query(
        f"""SELECT slot, COUNT(*) FROM attempts
            WHERE slot IS NOT NULL AND {candidates.claimable_condition()} GROUP BY slot""",
        (now_ms, now_ms),
    )
    return {slot: count for slot, count in rows}


def overrides(reader: Any) -> list[Override]:
    """Every limit set at runtime, by target."""
    rows = reader.query(f"SELECT target, slots, set_by, set_at_ms FROM {TABLE} ORDER BY target")
    return [Override(*row) for row in rows]


def override(reader: Any, target: str) -> tuple[int, int] | None:
    """(slots, version) of the limit last set for `target`, or None."""
    rows = reader.query(f"SELECT slots, version FROM {TABLE} WHERE target = ?", (target,))
    return (rows[0][0], rows[0][1]) if rows else None


def override_values(reader: Any, targets: Iterable[str]) -> dict[str, int]:
    """The limits set for `targets` (those set), by target."""
    names = sorted(set(targets))
    rows = reader.query(
        f"SELECT target, slots FROM {TABLE} WHERE target IN ({_marks(names)})", names
    )
    return {target: slots for target, slots in rows}


@dataclass(frozen=True, slots=True)
class LimitView:
    """One limit, or one key value of a keyed limit, as `qlflow limits` lists it.

    `target` is what `limits set` takes (`task:<package>/<task>`,
    `workflow:<package>/<workflow>`, or either with `[<key value>]`). `declared` is
    the count the package's head declares (None: it declares none any more), `key`
    a keyed limit's template, `set_to` what `limits set` gave it (with who and
    when), `limit` the one in force. `in_use` counts the holders at the time asked
    (a keyed limit's own row: across its key values), `waiting` the Attempts a
    worker could lease but for the slot (a Task) or the Runs queued (a Workflow)."""

    target: str
    kind: str
    declared: int | None
    key: str | None
    set_to: int | None
    set_by: str | None
    set_at_ms: int | None
    limit: int | None
    in_use: int
    waiting: int
    holders: tuple[SlotHolder, ...]


def list_limits(reader: Any, declared: Mapping[str, Concurrency], now_ms: int) -> list[LimitView]:
    """Every declared limit, and every key value in use, waited for or set, by target."""
    set_rows = {row.target: row for row in overrides(reader)}
    set_values = {target: row.slots for target, row in set_rows.items()}
    by_slot: dict[str, list[SlotHolder]] = {}
    for holder in holders(reader, now_ms):
        by_slot.setdefault(holder.slot, []).append(holder)
    waiting = queued_counts(reader)
    for slot, count in waiting_counts(reader, now_ms).items():
        waiting[slot] = waiting.get(slot, 0) + count
    targets = set(declared) | set(set_rows) | set(by_slot) | set(waiting)
    views = []
    for target in sorted(targets):
        limit = limit_of(target)
        declaration = declared.get(limit)
        own = tuple(by_slot.get(target, ()))
        in_use = len(own)
        if target == limit and declaration is not None and declaration.key is not None:
            in_use = sum(len(h) for slot, h in by_slot.items() if limit_of(slot) == limit)
        found = set_rows.get(target)
        views.append(
            LimitView(
                target=target,
                kind=target.partition(":")[0],
                declared=None if declaration is None else declaration.limit,
                key=declaration.key if declaration is not None and target == limit else None,
                set_to=None if found is None else found.slots,
                set_by=None if found is None else found.set_by,
                set_at_ms=None if found is None else found.set_at_ms,
                limit=effective_limit(target, declaration.limit, set_values)
                if declaration is not None
                else set_values.get(target, set_values.get(limit)),
                in_use=in_use,
                waiting=waiting.get(target, 0),
                holders=own,
            )
        )
    return views


def declared_limits(store: Any, packages: Iterable[str] | None = None) -> dict[str, Concurrency]:
    """The limits the newest generation of each installation of `packages` declares
    (None: every package the store can name), by limit name. Read through
    `projections.published_revisions`, so a least-privilege runtime role can ask too."""
    found: dict[str, Concurrency] = {}
    for package in sorted(set(known_packages(store) if packages is None else packages)):
        newest: dict[tuple[str, str], dict[str, Any]] = {}
        for _, data in published_revisions(store, package=package):
            revision = data["revision"]
            where = (revision["project"], revision["installation"])
            if where not in newest or newest[where]["generation"] < revision["generation"]:
                newest[where] = revision
        for document in newest.values():
            revision = revision_from_json(document)
            for task_id, task in revision.tasks.items():
                if task.concurrency is not None:
                    found[limit_name(TASK_LIMIT, revision.package, task_id)] = task.concurrency
            for key, workflow in revision.workflows.items():
                if workflow.limit is not None:
                    found[limit_name(WORKFLOW_LIMIT, revision.package, key)] = workflow.limit
    return found


def known_packages(store: Any) -> set[str]:
    """The packages whose limits `qlflow limits` lists: every published one where the
    publications can be read (a least-privilege runtime role reads none), and those of
    the Runs and of the limits set at runtime."""
    names = {row[0] for row in store.query("SELECT DISTINCT package FROM runs")}
    names |= {
        target.partition(":")[2].partition("/")[0]
        for (target,) in store.query(f"SELECT target FROM {TABLE}")
    }
    with store.session() as session:
        least_privilege = session.function_comment(PUBLISHED_REVISIONS_SIGNATURE) is not None
    if not least_privilege:
        names |= {publication.package for publication in publications.publications(store)}
    return names
