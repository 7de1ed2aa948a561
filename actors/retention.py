"""Retention: removing finished Runs in bounded batches (docs/DESIGN.md, "Retention").

Each batch is one transaction: it picks the oldest finished Runs the domain says may
go (`domain.retention.refusal`), locks their stream heads and the retention stream,
appends the retention record first (so its position is past every removed one and
positions are never reused), which folds into tombstones and takes the Runs' rows
out of the read models, then deletes the Runs' streams (their keys' receipt streams
too: the tombstone keeps the receipt) and stored logs. A crash
anywhere before COMMIT leaves the batch whole; after it, gone and recorded. The next
call resumes with whatever is still old enough.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import orjson

from actors.authority import Units
from domain import retention, streams
from domain.retention import Candidate, RemovedRun
from domain.values import receipt_stream_id
from eventstore import faults, logs, removal
from eventstore.api import Reads, Transaction
from projections import registry
from projections.publications import RECEIPT

UNIT = "retention"  # the unit of work's name: its fault points are retention.*
_SCAN = 500  # candidate Runs read per query while filling a batch


@dataclass(frozen=True, slots=True)
class BatchResult:
    """What one batch removed (or, in a dry run, would remove)."""

    run_ids: tuple[str, ...]
    events: int
    positions: tuple[retention.Range, ...]
    log_bytes: int
    attempt_ids: tuple[str, ...] = ()
    record_position: int | None = None  # where its retention record went
    archive: dict[str, Any] | None = None


@dataclass(slots=True)
class RetentionReport:
    """What a `retain` call removed, batch by batch."""

    finished_before_ms: int
    dry_run: bool
    batches: list[BatchResult] = field(default_factory=list)

    @property
    def runs(self) -> int:
        return sum(len(b.run_ids) for b in self.batches)

    @property
    def events(self) -> int:
        return sum(b.events for b in self.batches)

    @property
    def log_bytes(self) -> int:
        return sum(b.log_bytes for b in self.batches)

    @property
    def run_ids(self) -> list[str]:
        return [run_id for b in self.batches for run_id in b.run_ids]

    @property
    def attempt_ids(self) -> list[str]:
        return [a for b in self.batches for a in b.attempt_ids]

    def document(self) -> dict[str, Any]:
        """The report as JSON-ready data."""
        return {
            "finished_before_ms": self.finished_before_ms,
            "dry_run": self.dry_run,
            "runs": self.runs,
            "events": self.events,
            "log_bytes": self.log_bytes,
            "batches": [
                {
                    "runs": list(b.run_ids),
                    "events": b.events,
                    "positions": [list(r) for r in b.positions],
                    "log_bytes": b.log_bytes,
                    "record_position": b.record_position,
                    **({"archive": b.archive} if b.archive else {}),
                }
                for b in self.batches
            ],
        }


Archiver = Callable[[Transaction, Sequence[dict[str, Any]], Sequence[Any]], dict[str, Any]]
"""Writes a batch's Runs and stored event rows somewhere durable before anything is
deleted; returns what the retention record says of it (its digest)."""


def retain(
    authority: Units,
    finished_before_ms: int,
    *,
    now_ms: int,
    batch: int = retention.DEFAULT_BATCH,
    max_batches: int | None = None,
    dry_run: bool = False,
    archiver: Archiver | None = None,
    progress: Callable[[RetentionReport], None] | None = None,
) -> RetentionReport:
    """Remove finished Runs that ended before `finished_before_ms`, `batch` Runs per
    transaction, until none is left (or `max_batches` ran). A dry run writes nothing
    and says what would go."""
    retention.check_cutoff(finished_before_ms, now_ms)
    retention.check_batch(batch)
    report = RetentionReport(finished_before_ms, dry_run)
    after: tuple[int, str] | None = None  # a dry run's cursor: nothing moves under it
    while max_batches is None or len(report.batches) < max_batches:
        if dry_run:
            found, after = authority.read(
                partial(_dry_batch, cutoff=finished_before_ms, limit=batch, after=after)
            )
        else:
            found = authority.execute(
                lambda tx: _batch(tx, finished_before_ms, batch, now_ms, archiver), name=UNIT
            )
        if found is None:
            break
        report.batches.append(found)
        if progress is not None:
            progress(report)
    return report


def _dry_batch(
    reads: Reads, cutoff: int, limit: int, after: tuple[int, str] | None
) -> tuple[BatchResult | None, tuple[int, str] | None]:
    chosen = _choose(reads, cutoff, limit, after)
    if not chosen:
        return None, after
    last = chosen[-1]
    run_ids = [row["run_id"] for row in chosen]
    attempts = _attempts(reads, run_ids)
    rows = removal.stream_rows(reads, _streams(run_ids, attempts, _keys(chosen)))
    rows, _ = _own_receipts(chosen, rows)
    result = BatchResult(
        tuple(run_ids),
        len(rows),
        tuple(retention.ranges(row[0] for row in rows)),
        _log_bytes(reads, attempts),
        tuple(attempts),
    )
    return result, (last["terminal_at_ms"], last["run_id"])


def _batch(
    tx: Transaction, cutoff: int, limit: int, now_ms: int, archiver: Archiver | None
) -> BatchResult | None:
    chosen = _choose(tx, cutoff, limit, None)
    if not chosen:
        return None
    run_ids = [row["run_id"] for row in chosen]
    log_stream = streams.retention_stream()
    attempts = _attempts(tx, run_ids)
    names = _streams(run_ids, attempts, _keys(chosen))
    heads = tx.lock_heads(sorted({*names, log_stream}), wait=True) or {}
    # under the locks: a rerun admitted meanwhile keeps its source
    kept = set(_removable(tx, chosen, cutoff))
    chosen = [row for row in chosen if row["run_id"] in kept]
    if not chosen:
        return None
    run_ids = [row["run_id"] for row in chosen]
    attempts = _attempts(tx, run_ids)
    rows, receipts = _own_receipts(chosen, removal.stream_rows(tx, names))
    names = sorted({row[2] for row in rows} | set(_streams(run_ids, attempts, ())))
    runs = [
        RemovedRun(
            row["run_id"],
            row["status"],
            row["admission_key"],
            row["terminal_at_ms"],
            heads.get(streams.run_stream(row["run_id"]), 0),
            heads.get(streams.steps_stream(row["run_id"]), 0),
            receipts.get(row["run_id"]),
        )
        for row in chosen
    ]
    archived = None
    if archiver is not None:
        archived = archiver(tx, [run.document() for run in runs], rows)
        faults.hit(f"{UNIT}.archived")
    append = retention.record(
        heads.get(log_stream, 0),
        runs,
        rows,
        now_ms,
        None if archived is None else archived.get("digest"),
    )
    (written,) = registry.commit(tx, [append])
    faults.hit(f"{UNIT}.recorded")
    removal.remove_streams(tx, names)
    pruned = logs.remove(tx, attempts)
    faults.hit(f"{UNIT}.deleted")
    return BatchResult(
        tuple(run_ids),
        len(rows),
        tuple(retention.ranges(row[0] for row in rows)),
        pruned.bytes,
        tuple(attempts),
        written.global_position,
        archived,
    )


_RUN_COLUMNS = ("run_id", "status", "admission_key", "terminal_at_ms")


def _choose(
    reads: Reads, cutoff: int, limit: int, after: tuple[int, str] | None
) -> list[dict[str, Any]]:
    """The oldest finished Runs (at most `limit`, after `after`) the domain lets go."""
    chosen: list[dict[str, Any]] = []
    cursor = after
    while len(chosen) < limit:
        where = "terminal_at_ms IS NOT NULL AND terminal_at_ms < ?"
        params: list[int | str] = [cutoff]
        if cursor is not None:
            where += " AND (terminal_at_ms > ? OR (terminal_at_ms = ? AND run_id > ?))"
            params += [cursor[0], cursor[0], cursor[1]]
        found = [
            dict(zip(_RUN_COLUMNS, row, strict=True))
            for row in reads.query(
                f"SELECT {', '.join(_RUN_COLUMNS)} FROM runs WHERE {where} "
                f"ORDER BY terminal_at_ms, run_id LIMIT {_SCAN}",
                params,
            )
        ]
        if not found:
            break
        keep = set(_removable(reads, found, cutoff))
        chosen += [row for row in found if row["run_id"] in keep][: limit - len(chosen)]
        cursor = (found[-1]["terminal_at_ms"], found[-1]["run_id"])
        if len(found) < _SCAN:
            break
    return chosen


def _removable(reads: Reads, rows: Sequence[dict[str, Any]], cutoff: int) -> list[str]:
    """The run ids of `rows` the domain lets retention remove."""
    reruns: dict[str, list[str]] = {}
    ids = [row["run_id"] for row in rows]
    for start in range(0, len(ids), 500):
        chunk = ids[start : start + 500]
        marks = ", ".join("?" * len(chunk))
        for source, status in reads.query(
            f"SELECT rerun_of, status FROM runs WHERE rerun_of IN ({marks})", chunk
        ):
            reruns.setdefault(source, []).append(status)
    candidates = [
        Candidate(
            row["run_id"],
            row["status"],
            row["terminal_at_ms"],
            tuple(reruns.get(row["run_id"], ())),
        )
        for row in rows
    ]
    return retention.removable(candidates, cutoff)


def _attempts(reads: Reads, run_ids: Sequence[str]) -> list[str]:
    found: list[str] = []
    for start in range(0, len(run_ids), 500):
        chunk = list(run_ids[start : start + 500])
        marks = ", ".join("?" * len(chunk))
        found += [
            row[0]
            for row in reads.query(
                f"SELECT attempt_id FROM attempts WHERE run_id IN ({marks})", chunk
            )
        ]
    return sorted(found)


def _streams(run_ids: Sequence[str], attempt_ids: Sequence[str], keys: Sequence[str]) -> list[str]:
    names = [streams.run_stream(r) for r in run_ids]
    names += [streams.steps_stream(r) for r in run_ids]
    names += [streams.lease_stream(a) for a in attempt_ids]
    names += [streams.notification_stream(r) for r in run_ids]  # its outbox goes with it
    names += [receipt_stream_id(key) for key in keys]  # its receipt: a tombstone keeps it
    return sorted(set(names))


def _keys(chosen: Sequence[dict[str, Any]]) -> list[str]:
    return [row["admission_key"] for row in chosen if row["admission_key"]]


def _own_receipts(
    chosen: Sequence[dict[str, Any]], rows: Sequence[removal.Row]
) -> tuple[list[removal.Row], dict[str, dict[str, Any]]]:
    """The rows to remove and, per Run, what its tombstone keeps of its receipt
    (`domain.retention.kept_receipt`). A receipt stream goes only when it is the
    receipt of that Run alone (one receipt that names it, with every kept field)."""
    mine = {
        receipt_stream_id(row["admission_key"]): row["run_id"]
        for row in chosen
        if row["admission_key"]
    }
    found: dict[str, list[removal.Row]] = {}
    for row in rows:
        if row[2] in mine:
            found.setdefault(row[2], []).append(row)
    receipts: dict[str, dict[str, Any]] = {}
    keep: set[str] = set()  # receipt streams that stay
    for stream, run_id in mine.items():
        held = found.get(stream, [])
        document = orjson.loads(held[0][5]) if len(held) == 1 and held[0][4] == RECEIPT else {}
        kept = retention.kept_receipt(document)
        if kept is None or document.get("run_id") != run_id:
            keep.add(stream)
        else:
            receipts[run_id] = kept
    return [row for row in rows if row[2] not in keep], receipts


def _log_bytes(reads: Reads, attempt_ids: Sequence[str]) -> int:
    total = 0
    for start in range(0, len(attempt_ids), 500):
        chunk = list(attempt_ids[start : start + 500])
        marks = ", ".join("?" * len(chunk))
        ((size,),) = reads.query(
            f"SELECT COALESCE(SUM(length(bytes)), 0) FROM log_chunks WHERE attempt_id IN ({marks})",
            chunk,
        )
        total += int(size)
    return total
