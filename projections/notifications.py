"""The read model of the notification outbox: one row per delivery (a Run and one of
its Workflow's notify rules), folded from the `notification-<run_id>` streams in the
append's transaction (docs/DESIGN.md, "Notifications").

A host asks it for the pending deliveries whose retry time has come — a partial
index on `retry_at_ms` over the pending rows — so delivering costs what is due, not
every notification ever written; `qlflow notifications` lists from it. The fold of
one record is the domain's (`domain.notify.next_delivery`), the same one a reader of
the stream itself uses. A Run retention removes takes its rows with it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson

from domain import streams
from domain.event_types import EventType
from domain.notify import Delivery, next_delivery
from domain.records import Record
from domain.retention import removed_runs
from eventstore.api import Reads, Transaction
from eventstore.grants import AUDIT, MOVE, READ, RUNTIME
from eventstore.in_lists import chunks, marks
from projections.contract import Folded

COMPONENT = "projections.notifications"
_OUTBOX = streams.prefix(streams.NOTIFICATION)
STREAM_PREFIXES = (_OUTBOX, streams.prefix(streams.RETENTION))
TABLE = "notification_deliveries"
_COLUMNS = (
    "run_id",
    "rule",
    "workflow_key",
    "status",
    "result_code",
    "target",
    "notification_id",
    "due_at_ms",
    "attempts",
    "delivered",
    "given_up",
    "retry_at_ms",
    "last_error",
    "to_try",
)
_CREATE = """CREATE TABLE notification_deliveries (
    run_id TEXT NOT NULL,
    rule INTEGER NOT NULL,
    workflow_key TEXT NOT NULL,
    status TEXT NOT NULL,
    result_code TEXT,
    target TEXT NOT NULL,
    notification_id TEXT NOT NULL,
    due_at_ms INTEGER NOT NULL,
    attempts INTEGER NOT NULL,
    delivered INTEGER NOT NULL,
    given_up INTEGER NOT NULL,
    retry_at_ms INTEGER NOT NULL,
    last_error TEXT,
    to_try INTEGER NOT NULL,
    PRIMARY KEY (run_id, rule)
)"""
_DUE = """CREATE INDEX notification_deliveries_due
    ON notification_deliveries (retry_at_ms, run_id, rule) WHERE to_try = 1"""
_LISTED = """CREATE INDEX notification_deliveries_listed
    ON notification_deliveries (due_at_ms, run_id, rule)"""
MIGRATIONS = [
    {
        "sqlite": [_CREATE, _DUE, _LISTED],
        "postgresql": [_CREATE.replace("INTEGER", "BIGINT"), _DUE, _LISTED],
    }
]
TABLES = {TABLE: ("run_id", "rule")}
# the runtime writes a Run's terminal commit (the due records) and the attempts
Replay = None  # the rebuild calls `apply` batch by batch
reads_ahead = None  # apply reads nothing worth sending ahead
reads_ahead_of_runs = None
GRANTS = {TABLE: {RUNTIME: MOVE, AUDIT: READ}}


def apply(tx: Transaction, records: Sequence[Record], folded: Folded | None = None) -> None:
    """Fold outbox records into their delivery rows; a retention record takes the
    removed Runs' rows."""
    for record in records:
        if record.type == EventType.RETENTION_REMOVED:
            _removed(tx, record)
        elif record.stream_id.startswith(_OUTBOX):
            before = _delivery(tx, record.stream_id[len(_OUTBOX) :], record.data.get("rule"))
            after = next_delivery(before, record)
            if after is not None:
                tx.upsert(TABLE, _COLUMNS, ("run_id", "rule"), [_row(after)])


def backfill(store: Any, from_version: int) -> None:
    """Fold the outboxes a store held before this read model existed."""
    if from_version != 0:
        return
    ids = store.streams_with_prefix(_OUTBOX)
    if not ids:
        return
    outboxes = store.read_streams(ids)
    with store.transaction() as tx:
        for records in outboxes.values():
            apply(tx, records)


def due(reads: Reads, now_ms: int, limit: int) -> list[Delivery]:
    """Pending deliveries whose retry time has come, the longest waiting first."""
    rows = reads.query(
        f"SELECT {', '.join(_COLUMNS)} FROM {TABLE} WHERE to_try = 1 AND retry_at_ms <= ? "
        "ORDER BY retry_at_ms, run_id, rule LIMIT ?",
        (now_ms, limit),
    )
    return [_from_row(row) for row in rows]


def listed(reads: Reads, *, delivered: bool) -> list[Delivery]:
    """The deliveries not delivered (pending or failed for good), or with `delivered`
    every one; oldest first."""
    where = "" if delivered else " WHERE delivered = 0"
    rows = reads.query(
        f"SELECT {', '.join(_COLUMNS)} FROM {TABLE}{where} ORDER BY due_at_ms, run_id, rule"
    )
    return [_from_row(row) for row in rows]


def _removed(tx: Transaction, record: Record) -> None:
    run_ids = sorted(run["run_id"] for run in removed_runs(record.data))
    for chunk in chunks(run_ids):
        tx.execute(f"DELETE FROM {TABLE} WHERE run_id IN ({marks(chunk)})", chunk)


def _delivery(tx: Transaction, run_id: str, rule: object) -> Delivery | None:
    if not isinstance(rule, int):
        return None
    rows = tx.query(
        f"SELECT {', '.join(_COLUMNS)} FROM {TABLE} WHERE run_id = ? AND rule = ?",
        (run_id, rule),
    )
    return _from_row(rows[0]) if rows else None


def _row(delivery: Delivery) -> tuple[Any, ...]:
    return (
        delivery.run_id,
        delivery.rule,
        delivery.workflow_key,
        delivery.status,
        delivery.result_code,
        orjson.dumps(delivery.target, option=orjson.OPT_SORT_KEYS).decode(),
        delivery.notification_id,
        delivery.due_at_ms,
        delivery.attempts,
        int(delivery.delivered),
        int(delivery.failed),
        delivery.retry_at_ms,
        delivery.last_error,
        int(delivery.is_pending),
    )


def _from_row(row: Sequence[Any]) -> Delivery:
    (run_id, rule, workflow_key, status, result_code, target, notification_id,
     due_at_ms, attempts, delivered, given_up, retry_at_ms, last_error, _to_try) = row  # fmt: skip
    return Delivery(
        run_id=run_id,
        workflow_key=workflow_key,
        rule=int(rule),
        status=status,
        result_code=result_code,
        target=orjson.loads(target),
        notification_id=notification_id,
        due_at_ms=int(due_at_ms),
        attempts=int(attempts),
        delivered=bool(delivered),
        failed=bool(given_up),
        retry_at_ms=int(retry_at_ms),
        last_error=last_error,
    )
