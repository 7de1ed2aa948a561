"""Read models of Runs, StepRuns and Attempts (with their current lease), and the
candidate index the cycle pages over (docs/DESIGN.md "The candidate index").

Everything here is a deterministic function of the `run-`, `steps-` and `lease-`
records, so a replay of the log rebuilds identical rows. The candidate index is the
domain's answer (`domain.work`) for the Run folded after each batch touching it:
per phase the window `[<phase>_opens_ms, <phase>_closes_ms)` in which its decision
has work, per Attempt the window in which a worker may lease it. A dormant Run has
no open window and is in no candidate index: it costs rows and nothing else.

`apply` has one shape for any batch, one append's records or a rebuild's thousands:

1. load: the rows the batch can touch (its Runs, their StepRuns, the Attempts it
   names or its StepRuns hold live), with a few `IN (...)` queries;
2. fold: every record, in log order, into those rows in memory; then the work windows
   of each Run a run or lease record touched, from its aggregate (`_folded_runs`);
3. store: each row that is new or differs from what was loaded, once, with one
   `executemany` UPSERT per table, in key order (a fixed row lock order).

Loading before writing is safe beside other writers: on PostgreSQL every transaction
that appends a Run's records holds that Run's stream head lock from before its reads
until COMMIT (actors.loading), so no one else changes these rows meanwhile.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import orjson

from domain import execution as execution_rules
from domain.aggregate import RunAggregate, extend, fold
from domain.errors import CorruptionError
from domain.phases import RUN_PHASES
from domain.records import Record
from domain.streams import run_stream
from projections.runs_fold import (
    _created,
    _fold,
    _json,
    _load,
    _named,
    _query_in,
    _Rows,
    _select_steps_with_live_attempts,
)
from projections.runs_schema import (  # the module's contract (projections.registry)
    ATTEMPTS,
    COMPONENT,
    EXECUTION_STEP,
    GRANT_COLUMNS,
    GRANTS,
    MIGRATIONS,
    RUNS,
    STEP_RUNS,
    STREAM_PREFIXES,
    TABLES,
    UNKNOWN_MS,
    WINDOW_COLUMNS,
    WORK_STEP,
)
from projections.runs_windows import (
    _after,
    _by_run,
    _folded_runs,
    _refresh_work,
    _run_streams,
)

__all__ = [
    "COMPONENT", "GRANTS", "GRANT_COLUMNS", "MIGRATIONS", "STREAM_PREFIXES", "TABLES",
    "TAKES_FOLDED", "WINDOW_COLUMNS", "WORK_STEP", "EXECUTION_STEP", "Replay", "apply", "backfill",
]  # fmt: skip

TAKES_FOLDED = True  # see projections.registry


def apply(tx, records: Sequence[Record], folded: Mapping[str, RunAggregate] | None = None) -> None:
    """Fold freshly appended run, step and lease records into the read models
    (`folded`: Runs as their writer's decisions left them, after these records)."""
    rows = _load(tx, records)
    touched: set[str] = set()
    for record in records:
        run_id = _fold(rows, record)
        if run_id is not None:
            touched.add(run_id)
    for aggregate in _after(tx, records, rows, touched, folded):
        _refresh_work(rows, aggregate)
    for table in (RUNS, STEP_RUNS, ATTEMPTS):
        changed = rows.changed(table)
        if changed:
            tx.upsert(table.name, table.columns, table.key, changed)


def backfill(store, from_version: int) -> int:
    """After an upgrade, fill what the schema steps could not compute (a new store has
    nothing to fill): across `WORK_STEP`, refold the Runs left with an unknown
    candidate window; across `EXECUTION_STEP`, split the Attempts' old executor
    records out of their outputs. Returns how many Runs were refolded."""
    if from_version == 0:
        return 0
    if from_version < EXECUTION_STEP:
        _split_executions(store)
    if from_version >= WORK_STEP:
        return 0  # a later step leaves the windows alone
    done = 0
    while True:
        with store.transaction() as tx:
            found = tx.query(
                f"SELECT run_id FROM runs WHERE {RUN_PHASES[0]}_opens_ms = ?"
                " ORDER BY run_id LIMIT ?",
                (UNKNOWN_MS, REFRESH_BATCH),
            )
            run_ids = [row[0] for row in found]
            if not run_ids:
                return done
            tx.lock_heads([run_stream(r) for r in run_ids], wait=True)
            rows = _Rows()
            rows.add_loaded(RUNS, _query_in(tx, f"{RUNS.select_sql} run_id", run_ids))
            rows.add_loaded(ATTEMPTS, _query_in(tx, f"{ATTEMPTS.select_sql} run_id", run_ids))
            for aggregate in _folded_runs(tx, run_ids):
                _refresh_work(rows, aggregate)
            for table in (RUNS, ATTEMPTS):
                changed = rows.changed(table)
                if changed:
                    tx.upsert(table.name, table.columns, table.key, changed)
            done += len(run_ids)


REFRESH_BATCH = 200  # Runs `backfill` refolds per transaction


def _split_executions(store) -> None:
    """Attempts folded before `EXECUTION_STEP` hold their terminal event's output as
    logged, which an old executor filled with its own record: store them as a fold of
    that event does now (`domain.execution.split`), so `verify` agrees with a replay."""
    with store.transaction() as tx:
        rows = tx.query(
            "SELECT attempt_id, output FROM attempts WHERE execution IS NULL AND output IS NOT NULL"
        )
        split = []
        for attempt_id, output in rows:
            kept, execution = execution_rules.split({"output": orjson.loads(output)})
            if execution is not None:
                split.append((None if kept is None else _json(kept), _json(execution), attempt_id))
        if split:
            tx.executemany(
                "UPDATE attempts SET output = ?, execution = ? WHERE attempt_id = ?", split
            )


# --- replay: the rebuild's path ----------------------------------------------------------

REPLAY_RUNS = 2048  # Runs a replay keeps in memory (about 9 KiB each, with StepRuns and Attempts)

Insert = Callable[[str, Sequence[str], list[tuple]], None]
"""`insert(table, columns, rows)`: add new rows to a table in bulk (plain INSERT or COPY)."""


class Replay:
    """`apply` for a rebuild, batch after batch into tables that start empty.

    Each batch goes through `apply`'s load, fold and work windows (from aggregates it
    holds beside the rows and extends batch by batch), but the rows stay
    in memory between batches and are written only when they leave: once more than
    `capacity` Runs are held, the least recently named half leave, and `flush` empties
    the lot. So a Run's rows are loaded at most once while they stay (never, if the
    replay admitted it), and most rows are written once, as new rows, by `insert`. A
    Run leaves with all its StepRuns and Attempts, so any row not in memory has its
    newest values in the table."""

    capacity = REPLAY_RUNS

    def __init__(self, tx, insert: Insert) -> None:
        self._tx = tx
        self._insert = insert
        self._rows = _Rows()
        self._recent: dict[str, None] = {}  # Runs in memory, least recently named first
        self._aggregates: dict[str, RunAggregate] = {}  # the Runs in memory, folded
        self._unfolded: set[str] = set()  # Runs in memory whose last batch ended mid-append
        self._last = 0  # the position of the last record folded

    def apply(self, records: Sequence[Record]) -> None:
        """Fold one batch, in log order; past capacity, write out the older half."""
        rows = self._rows
        self._load_missing(records)
        touched: set[str] = set()
        for record in records:
            run_id = _fold(rows, record)
            if run_id is not None:
                touched.add(run_id)
        for aggregate in self._fold_aggregates(records):
            _refresh_work(rows, aggregate)
        if len(self._recent) > self.capacity:
            # a Run whose last batch ended mid-append stays until its windows are
            # known: once written out, an Attempt that ended in that append would not
            # be loaded again to have its window cleared
            older = list(self._recent)[: len(self._recent) // 2]
            self._write([run_id for run_id in older if run_id not in self._unfolded])

    def flush(self) -> None:
        """Write out every row held in memory, and forget them."""
        for streams in _run_streams(self._tx, self._unfolded, self._last).values():
            _refresh_work(self._rows, fold(*streams))
        self._unfolded.clear()
        self._write(list(self._recent))

    def _fold_aggregates(self, records: Sequence[Record]) -> list[RunAggregate]:
        """The aggregate of every Run the batch has records of, after the batch: one
        held from the last batch is extended, any other folded from the log up to the
        batch's last record (the log may hold more by now).

        A batch may end inside an append (a RunEvent without its StepRunMutation yet):
        such a Run cannot be folded until the next batch brings the rest, so it waits
        in `_unfolded` (`flush` folds what is left, and raises if the log is corrupt)."""
        by_run = _by_run(records, self._rows)
        if records:
            self._last = max(self._last, max(record.global_position for record in records))
        held = self._aggregates
        missing = [run_id for run_id in by_run if run_id not in held]
        found = _run_streams(self._tx, missing, self._last)
        folded = []
        for run_id, streams in by_run.items():
            try:
                if run_id in found:
                    held[run_id] = fold(*found[run_id])
                elif run_id in held:
                    held[run_id] = extend(held[run_id], *streams)
                else:
                    continue
            except CorruptionError:
                held.pop(run_id, None)
                self._unfolded.add(run_id)
                continue
            self._unfolded.discard(run_id)
            folded.append(held[run_id])
        return folded

    def _load_missing(self, records: Sequence[Record]) -> None:
        """What `_load` loads, but only rows that are neither in memory nor created by
        these records (in a log that is not corrupt, such a row is not stored yet)."""
        tx, rows = self._tx, self._rows
        run_ids, attempt_ids = _named(records)
        created_runs, created_attempts = _created(records)
        missing = attempt_ids - rows.attempts.keys() - created_attempts
        rows.add_loaded(ATTEMPTS, _query_in(tx, f"{ATTEMPTS.select_sql} attempt_id", missing))
        run_ids.update(rows.attempts[a]["run_id"] for a in attempt_ids if a in rows.attempts)
        absent = run_ids - self._recent.keys() - created_runs
        rows.add_loaded(RUNS, _query_in(tx, f"{RUNS.select_sql} run_id", absent))
        steps, live_attempts = _select_steps_with_live_attempts(tx, absent)
        rows.add_loaded(STEP_RUNS, steps)
        rows.add_loaded(ATTEMPTS, (a for a in live_attempts if a[0] not in rows.attempts))
        recent = self._recent
        for run_id in run_ids:
            recent.pop(run_id, None)
            recent[run_id] = None

    def _write(self, run_ids: list[str]) -> None:
        """Store the rows of these Runs (new ones inserted, changed ones upserted) and
        drop them from memory."""
        rows = self._rows
        leaving = set(run_ids)
        for run_id in run_ids:
            del self._recent[run_id]
            self._aggregates.pop(run_id, None)
            self._unfolded.discard(run_id)
        runs = [rows.runs.pop(run_id) for run_id in run_ids if run_id in rows.runs]
        steps = [row for run_id in run_ids for row in rows.steps.pop(run_id, {}).values()]
        attempt_ids = [a for a, row in rows.attempts.items() if row["run_id"] in leaving]
        attempts = [rows.attempts.pop(attempt_id) for attempt_id in attempt_ids]
        for table, gone in ((RUNS, runs), (STEP_RUNS, steps), (ATTEMPTS, attempts)):
            loaded = rows._loaded[table.name]
            found = table.differing(gone, loaded)
            for row in gone:
                loaded.pop(table.key_of(row), None)
            new = [values for values, is_new in found if is_new]
            changed = [values for values, is_new in found if not is_new]
            if new:
                self._insert(table.name, table.columns, new)
            if changed:
                self._tx.upsert(table.name, table.columns, table.key, changed)
