"""The retention read model: one tombstone row per Run retention removed
(docs/DESIGN.md, "Retention").

A `retention.removed` record folds into this table and takes the removed Runs' rows
out of the Runs read model and their snapshots, in the append's transaction. A
replay of the remaining log gives the same tables: the removed Runs' own records are
gone, so the replay never makes their rows, and the record still leaves their
tombstones. A tombstone is what admission, `show`, `logs` and `why` answer for a Run
that is no longer in the log ("removed by retention at ...").
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from domain import streams
from domain.errors import NotFound
from domain.event_types import EventType
from domain.records import Record
from domain.retention import RECEIPT_FIELDS, receipt_of, removed_runs
from domain.values import EXISTING, AdmissionReceipt, utc_text
from eventstore.api import Transaction
from eventstore.grants import ADMISSION, AUDIT, READ, RUNTIME
from eventstore.in_lists import chunks, marks
from projections.contract import Folded

COMPONENT = "projections.retention"
STREAM_PREFIXES = (streams.prefix(streams.RETENTION),)
TABLE = "removed_runs"
_RUN_COLUMNS = (
    "run_id",
    "admission_key",
    "status",
    "terminal_at_ms",
    "removed_at_ms",
    "retention_version",
)
_COLUMNS = (*_RUN_COLUMNS, *(f"receipt_{name}" for name in RECEIPT_FIELDS))
_CREATE = """CREATE TABLE removed_runs (
    run_id TEXT PRIMARY KEY,
    admission_key TEXT,
    status TEXT NOT NULL,
    terminal_at_ms INTEGER,
    removed_at_ms INTEGER NOT NULL,
    retention_version INTEGER NOT NULL
)"""
_BY_KEY = "CREATE INDEX removed_runs_by_key ON removed_runs (admission_key)"
# step 2: the tombstone keeps its key's receipt (domain.retention.RECEIPT_FIELDS), whose
# stream now goes with the Run; NULL in a tombstone whose receipt stream was kept
_RECEIPT_TYPES = {
    name: "INTEGER" if name in ("final_run_version", "final_steps_version", "admitted_at_ms")
    else "TEXT"
    for name in RECEIPT_FIELDS
}  # fmt: skip
_ADD_RECEIPT = [
    f"ALTER TABLE removed_runs ADD COLUMN receipt_{name} {kind}"
    for name, kind in _RECEIPT_TYPES.items()
]
MIGRATIONS = [
    {"sqlite": [_CREATE, _BY_KEY], "postgresql": [_CREATE.replace("INTEGER", "BIGINT"), _BY_KEY]},
    {"sqlite": _ADD_RECEIPT, "postgresql": [a.replace("INTEGER", "BIGINT") for a in _ADD_RECEIPT]},
]
TABLES = {TABLE: ("run_id",)}
Replay = None  # the rebuild calls `apply` batch by batch
backfill = None  # nothing to fill after an upgrade
reads_ahead = None  # apply reads nothing worth sending ahead
reads_ahead_of_runs = None
GRANTS = {TABLE: {RUNTIME: READ, ADMISSION: READ, AUDIT: READ}}
# the Runs read model's tables and the snapshots, by the column naming the Run
_RUN_ROWS = ("runs", "step_runs", "attempts", "run_snapshots")


def apply(tx: Transaction, records: Sequence[Record], folded: Folded | None = None) -> None:
    """Fold retention records: each removed Run leaves a tombstone and its rows go."""
    for record in records:
        if record.type != EventType.RETENTION_REMOVED:
            continue
        runs = removed_runs(record.data)
        rows = [
            (
                run["run_id"],
                run.get("admission_key"),
                run.get("status", ""),
                run.get("terminal_at_ms"),
                record.data["removed_at_ms"],
                record.stream_version,
                *_receipt_values(receipt_of(run)),
            )
            for run in runs
        ]
        _delete(tx, _RUN_ROWS, sorted(row[0] for row in rows))
        # a Run whose receipt the tombstone keeps: its key's receipt stream went too
        kept = sorted(run["run_id"] for run in runs if receipt_of(run) is not None)
        _delete(tx, ("admission_receipts",), kept)
        if rows:
            tx.upsert(TABLE, _COLUMNS, ("run_id",), rows)


def _receipt_values(receipt: Any) -> tuple[Any, ...]:
    if not isinstance(receipt, dict):
        return (None,) * len(RECEIPT_FIELDS)
    return tuple(receipt.get(name) for name in RECEIPT_FIELDS)


def _delete(tx: Any, tables: Sequence[str], run_ids: Sequence[str]) -> None:
    for chunk in chunks(run_ids):
        for table in tables:
            tx.execute(f"DELETE FROM {table} WHERE run_id IN ({marks(chunk)})", chunk)


def tombstone(reads: Any, run_id: str) -> dict[str, Any] | None:
    """The tombstone of a removed Run, or None when retention did not remove it."""
    rows = reads.query(f"SELECT {', '.join(_COLUMNS)} FROM {TABLE} WHERE run_id = ?", (run_id,))
    return dict(zip(_COLUMNS, rows[0], strict=True)) if rows else None


def removed_receipt(
    reads: Any, *, admission_key: str | None = None, run_id: str | None = None
) -> AdmissionReceipt | None:
    """The receipt a tombstone keeps, by admission key or run id ("existing", saying
    when retention removed the Run; without its steps, which went with the Run), or
    None when no tombstone keeps one."""
    column, value = ("admission_key", admission_key) if run_id is None else ("run_id", run_id)
    rows = reads.query(
        f"SELECT {', '.join(_COLUMNS)} FROM {TABLE} WHERE {column} = ? "
        "AND receipt_plan_digest IS NOT NULL ORDER BY removed_at_ms DESC LIMIT 1",
        (value,),
    )
    return _receipt_kept(dict(zip(_COLUMNS, rows[0], strict=True))) if rows else None


def admission_tombstones_query(run_id: str, admission_key: str) -> tuple[str, list[Any]]:
    """The one query of `admission_tombstones` (to read it ahead:
    `Transaction.read_ahead`)."""
    return (
        f"SELECT {', '.join(_COLUMNS)} FROM {TABLE} WHERE run_id = ? "
        "OR (admission_key = ? AND receipt_plan_digest IS NOT NULL)",
        [run_id, admission_key],
    )


def admission_tombstones(
    rows: Sequence[Sequence[Any]], run_id: str, admission_key: str
) -> tuple[dict[str, Any] | None, AdmissionReceipt | None]:
    """From the rows of `admission_tombstones_query`: (`tombstone(run_id)`,
    `removed_receipt(admission_key=admission_key)`) — what admission asks of
    retention, in one query."""
    found = [dict(zip(_COLUMNS, row, strict=True)) for row in rows]
    of_run = next((row for row in found if row["run_id"] == run_id), None)
    kept = [
        row
        for row in found
        if row["admission_key"] == admission_key and row["receipt_plan_digest"] is not None
    ]
    latest = max(kept, key=lambda row: row["removed_at_ms"], default=None)
    return of_run, _receipt_kept(latest) if latest is not None else None


def _receipt_kept(found: dict[str, Any]) -> AdmissionReceipt:
    kept = {name: found[f"receipt_{name}"] for name in RECEIPT_FIELDS}
    return AdmissionReceipt(
        run_id=found["run_id"],
        admission_key=found["admission_key"],
        status=EXISTING,
        steps=(),
        removed_at_ms=found["removed_at_ms"],
        **kept,
    )


def tombstones_by_prefix(reads: Any, prefix: str, limit: int = 10) -> list[str]:
    """Run ids of removed Runs starting with `prefix` (for resolving a short id)."""
    rows = reads.query(
        f"SELECT run_id FROM {TABLE} WHERE run_id >= ? AND run_id < ? ORDER BY run_id LIMIT ?",
        (prefix, prefix + "\U0010ffff", limit),
    )
    return [row[0] for row in rows]


def pruned_text(run_id: str, found: dict[str, Any]) -> str:
    """What a reader is told of a Run retention removed."""
    ended = found.get("terminal_at_ms")
    how = f" (it ended {found['status']} at {utc_text(ended)})" if ended is not None else ""
    return (
        f"run {run_id!r} was pruned by retention on {utc_text(found['removed_at_ms'])}{how}: "
        "its events and logs are no longer in this store; an archive written by "
        "`qlflow retain --archive FILE` still has them"
    )


def run_not_found(reads: Any, run_id: str) -> NotFound:
    """The NotFound for a Run the read models do not have: pruned by retention (and
    when), or never there."""
    found = tombstone(reads, run_id)
    if found is None:
        return NotFound(f"run {run_id!r} does not exist; `qlflow runs` lists the runs")
    return NotFound(pruned_text(run_id, found))
