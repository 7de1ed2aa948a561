"""The rebuild's fold of the Runs read model (docs/DESIGN.md, "Rebuild").

`Replay` folds the log batch after batch into tables that start empty. Each record
is read once, from the batch the rebuild read, and goes two ways: into the Run's rows
(`runs_fold`, as `apply` folds it) and into the Run's streams held beside them. The
domain folds those streams once, when the Run's records end (its terminal event, or
it leaves memory, or the log ends), and the candidate windows are the domain's answer
for that aggregate, computed then, once (`runs_windows._refresh_work`). Then the Run
leaves with its rows, its streams and its aggregate: memory holds at most `capacity`
Runs, however long the log.

A Run whose earlier records are no longer held (it left memory, then the log names it
again: a Run dormant for a long while, a lease record after its end) has its rows
loaded back from the copy, and at its end its streams are read back from the log: the
one case that reads records twice. The Run's streams are held as the stored rows the
rebuild read (no more objects than the read made): records are made of them again
only if the domain folds them, which a Run at rest at its end never needs. When the
Runs held have more than `HELD_RECORDS` records in all, those with the most are
folded into their aggregates at the end of the batch, so a Run whose records span the
whole log holds an aggregate and a few records, never its whole history.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from domain.aggregate import RunAggregate, extend, fold
from domain.errors import CorruptionError
from domain.event_types import EventType, Family, of
from domain.flow import PlanFlow
from domain.plan_record import flow_from_data
from domain.records import Record
from domain.transitions import RUN_TERMINAL
from domain.work import at_rest
from eventstore.api import Row as StoredRow
from eventstore.api import Transaction
from eventstore.replay import DecodedRecord, LazyRecord, decoded_rows
from projections.contract import Insert
from projections.run_streams import read_whole_runs
from projections.runs_fold import (
    _fold_lease_event,
    _fold_run_event,
    _fold_steps_version,
    _query_in,
    _Rows,
    _select_steps_with_live_attempts,
)
from projections.runs_schema import _LEASE, _RUN, _STEPS, ATTEMPTS, RUNS, STEP_RUNS, Row
from projections.runs_windows import _refresh_at_rest, _refresh_work

REPLAY_RUNS = 2048  # Runs a replay keeps in memory (about 9 KiB each, with StepRuns and Attempts)
HELD_RECORDS = 50_000  # records held in all Runs' streams before the longest are folded
_RUN_ENDED = frozenset(of(Family.WORKFLOW, status) for status in RUN_TERMINAL)
_WORKFLOW_ADMITTED = EventType.WORKFLOW_ADMITTED.value
_ATTEMPT_CLAIMED = EventType.ATTEMPT_CLAIMED.value
_ATTEMPT_EVENT = f"{Family.ATTEMPT}."  # the prefix of every Attempt RunEvent type


RecordOf = Callable[[StoredRow], Any]  # a record of a stored row (`ReplayCopy`'s `record_of`)


class _Held:
    """A Run in memory: its aggregate folded so far (None: nothing folded yet) and its
    records since, per stream, in log order, as the stored rows they were read as.
    `whole`: every record of the Run since its admission went through this replay
    (False: earlier ones are read back at its end)."""

    __slots__ = ("aggregate", "flow", "leases", "named", "run", "steps", "whole")

    def __init__(self, whole: bool) -> None:
        self.whole = whole
        self.aggregate: RunAggregate | None = None
        self.flow: PlanFlow | None = None  # what its plan binds of flow control
        self.named = 0  # the last batch that named it (the least recently named leave first)
        self.run: list[StoredRow] = []
        self.steps: list[StoredRow] = []
        self.leases: dict[str, list[StoredRow]] = {}

    def count(self) -> int:
        """How many records it holds."""
        return len(self.run) + len(self.steps) + sum(map(len, self.leases.values()))

    def folded(self, record_of: RecordOf) -> RunAggregate:
        """The aggregate after every held record, made records by `record_of`
        (CorruptionError if they do not fold, e.g. a batch ended inside an append);
        the records are then let go."""
        run = [record_of(row) for row in self.run]
        steps = [record_of(row) for row in self.steps]
        leases = {a: [record_of(row) for row in rows] for a, rows in self.leases.items()}
        if self.aggregate is None:
            aggregate = fold(run, steps, leases)
        else:
            aggregate = extend(self.aggregate, run, steps, leases)
        self.aggregate = aggregate
        self.run, self.steps, self.leases = [], [], {}
        return aggregate


class Replay:
    """`apply` for a rebuild, batch after batch into tables that start empty (see the
    module docstring): same rows, same windows, each record read and decoded once.

    Rows stay in memory while their Run does and are written when it leaves, new rows
    by `insert` in bulk. A Run leaves with all its StepRuns and Attempts, so any row
    not in memory has its newest values in the table."""

    capacity = REPLAY_RUNS
    # its copies are read and written by key alone: no non-unique index is kept up
    keyed_only = (RUNS.name, STEP_RUNS.name, ATTEMPTS.name)

    def __init__(self, tx: Transaction, insert: Insert) -> None:
        self._tx = tx
        self._insert = insert
        self._rows = _Rows()
        self._held: dict[str, _Held] = {}
        self._batch = 0  # batches folded
        self._ending: set[str] = set()  # ended Runs waiting for the rest of their last append
        self._last = 0  # the position of the last record folded
        self._held_records = 0  # how many records the held Runs hold
        self._record_of: RecordOf = LazyRecord

    def apply(self, records: Sequence[Record]) -> None:
        """`apply_rows` of records (their documents decoded already)."""
        self.apply_rows(decoded_rows(records), DecodedRecord)

    def apply_rows(self, found: Sequence[StoredRow], record_of: RecordOf) -> None:
        """Fold one batch of stored rows (the rebuild's whole batch: the pass skips
        those of other categories), in log order; then let go of the Runs that ended
        in it and, past capacity, of the older half.

        A record is made (`record_of`) of each row of a RunEvent or a lease record,
        whose fold reads its data; a StepRunMutation moves only the steps version, read
        from its row, and its data is never decoded unless the domain folds the Run.
        The batch is folded in one pass while every record names rows in memory (the
        common case: a Run held whole, one this batch admits, an Attempt held). The
        first record that names one not in memory has the rows the rest of the batch
        names loaded (`_load_missing`, in a few queries), and the pass goes on from it
        with the check off: what is still missing then is in no table either, and its
        record changes nothing, as in `apply`."""
        if not found:
            return
        self._record_of = record_of
        rows, held, ending = self._rows, self._held, self._ending
        attempts, runs = rows.attempts, rows.runs
        held_get, attempts_get, runs_get = held.get, attempts.get, runs.get
        fold_run, fold_steps, fold_lease = _fold_run_event, _fold_steps_version, _fold_lease_event
        self._batch = batch = self._batch + 1
        added = 0  # records added to held streams
        loaded = False  # `_load_missing` ran for the rest of this batch
        for number, row in enumerate(found):
            family, _, entity_id = row[2].partition("-")
            if family == _RUN:
                record = record_of(row)
                kind = record.type
                streams = held_get(entity_id)
                if streams is None or not streams.whole:
                    if not loaded and self._missing_for(entity_id, kind, record, streams):
                        self._load_missing(found[number:])
                        loaded = True
                    streams = held_get(entity_id)
                    if streams is None:  # admitted by this very record
                        streams = held[entity_id] = _Held(kind == _WORKFLOW_ADMITTED)
                fold_run(rows, entity_id, record)
                streams.named = batch
                if streams.whole:
                    streams.run.append(row)
                    added += 1
                    if kind == _WORKFLOW_ADMITTED:
                        streams.flow = flow_from_data(record.data["plan"], record)
                if kind in _RUN_ENDED:
                    ending.add(entity_id)
            elif family == _STEPS:
                streams = held_get(entity_id)
                if streams is None:
                    if not loaded:
                        self._load_missing(found[number:])
                        loaded = True
                    streams = held[entity_id]
                run = runs_get(entity_id)
                if run is not None:
                    fold_steps(run, row[3])
                streams.named = batch
                if streams.whole:
                    streams.steps.append(row)
                    added += 1
            elif family == _LEASE:
                attempt = attempts_get(entity_id)
                if attempt is None and not loaded:
                    self._load_missing(found[number:])
                    loaded = True
                    attempt = attempts_get(entity_id)
                fold_lease(rows, entity_id, record_of(row))
                if attempt is not None:
                    streams = held[attempt["run_id"]]
                    streams.named = batch
                    if streams.whole:
                        streams.leases.setdefault(entity_id, []).append(row)
                        added += 1
        self._held_records += added
        self._last = found[-1][0]
        leaving = list(ending)
        if len(held) > self.capacity:
            by_age = sorted(held, key=lambda run_id: held[run_id].named)  # stable: oldest first
            leaving += [run_id for run_id in by_age[: len(held) // 2] if run_id not in ending]
        self._leave(leaving, strict=False)
        if self._held_records > HELD_RECORDS:
            self._fold_longest()

    def _missing_for(self, run_id: str, kind: str, record: Record, streams: _Held | None) -> bool:
        """Whether a RunEvent of a Run not held whole names rows not in memory: its
        Run's (unless this record admits it) or, an Attempt's event, its Attempt's
        (unless this record claims it)."""
        if streams is None and kind != _WORKFLOW_ADMITTED:
            return True
        if kind.startswith(_ATTEMPT_EVENT) and kind != _ATTEMPT_CLAIMED:
            return record.data["attempt_id"] not in self._rows.attempts
        return False

    def _fold_longest(self) -> None:
        """Fold the Runs holding the most records into their aggregates until the held
        records are half of `HELD_RECORDS` (a Run cut off inside an append waits)."""
        held = self._held.values()
        total = sum(streams.count() for streams in held)
        for streams in (
            sorted(held, key=lambda s: s.count(), reverse=True) if total > HELD_RECORDS else ()
        ):
            if total <= HELD_RECORDS // 2:
                break
            count = streams.count()
            try:
                streams.folded(self._record_of)
            except CorruptionError:
                continue  # mid-append: folded once the rest arrives
            total -= count
        self._held_records = total

    def flush(self) -> None:
        """Write out every Run held in memory, and forget them (CorruptionError if the
        records of one do not fold)."""
        self._leave(list(self._held), strict=True)

    def _leave(self, run_ids: list[str], *, strict: bool) -> None:
        """Fold these Runs, store their windows and rows, and let them go. Not `strict`:
        a Run whose records do not fold yet (the batch ended inside its append) stays."""
        held, rows = self._held, self._rows
        if not run_ids:
            return
        # the Attempts of these Runs, in one pass over those in memory
        attempts: dict[str, list[Row]] = {run_id: [] for run_id in run_ids}
        for attempt in rows.attempts.values():
            found_attempts = attempts.get(attempt["run_id"])
            if found_attempts is not None:
                found_attempts.append(attempt)
        done, resting = [], {}
        for run_id in run_ids:
            streams, run = held[run_id], rows.runs.get(run_id)
            if streams.whole and streams.flow is not None and run and at_rest(run["status"]):
                resting[run_id] = (run, streams.flow)  # the domain needs no fold of it
        for run_id, (run, flow) in resting.items():
            _refresh_at_rest(run, attempts[run_id], flow)
            done.append(run_id)
        run_ids = [run_id for run_id in run_ids if run_id not in resting]
        found = read_whole_runs(self._tx, [r for r in run_ids if not held[r].whole], self._last)
        for run_id in run_ids:
            streams = held[run_id]
            try:
                if streams.whole:
                    count = streams.count()
                    aggregate: RunAggregate | None = streams.folded(self._record_of)
                    self._held_records -= count
                else:
                    read = found.get(run_id)
                    aggregate = None if read is None else fold(*read)
            except CorruptionError:
                if strict:
                    raise
                continue
            if aggregate is not None:
                _refresh_work(self._rows, aggregate)
            done.append(run_id)
        self._write(done, attempts)

    def _load_missing(self, found: Sequence[StoredRow]) -> None:
        """What `_load` loads, but only rows that are neither in memory nor created by
        these records (in a log that is not corrupt, such a row is not stored yet). A
        Run held whole has every row its records can name in memory: its records are
        only looked at for the Attempts they claim."""
        tx, rows, held, record_of = self._tx, self._rows, self._held, self._record_of
        attempts = rows.attempts
        run_ids: set[str] = set()  # named, and not held whole
        attempt_ids: set[str] = set()  # named, and not in memory
        created_runs: set[str] = set()
        created_attempts: set[str] = set()
        for row in found:
            family, _, entity_id = row[2].partition("-")
            if family == _LEASE:
                if entity_id not in attempts:
                    attempt_ids.add(entity_id)
            elif family == _RUN:
                kind = row[4]
                if kind == _WORKFLOW_ADMITTED:
                    created_runs.add(entity_id)
                elif kind == _ATTEMPT_CLAIMED:
                    created_attempts.add(record_of(row).data["attempt_id"])
                streams = held.get(entity_id)
                if streams is None or not streams.whole:
                    run_ids.add(entity_id)
                    if kind.startswith(_ATTEMPT_EVENT):
                        attempt_id = record_of(row).data["attempt_id"]
                        if attempt_id not in attempts:
                            attempt_ids.add(attempt_id)
            elif family == _STEPS and entity_id not in held:
                run_ids.add(entity_id)
        missing = attempt_ids - created_attempts
        rows.add_loaded(ATTEMPTS, _query_in(tx, f"{ATTEMPTS.select_sql} attempt_id", missing))
        run_ids.update(attempts[a]["run_id"] for a in attempt_ids if a in attempts)
        absent = run_ids - held.keys() - created_runs
        rows.add_loaded(RUNS, _query_in(tx, f"{RUNS.select_sql} run_id", absent))
        steps, live_attempts = _select_steps_with_live_attempts(tx, absent)
        rows.add_loaded(STEP_RUNS, steps)
        rows.add_loaded(ATTEMPTS, (a for a in live_attempts if a[0] not in attempts))
        for run_id in run_ids:
            if run_id not in held:
                held[run_id] = _Held(run_id in created_runs)

    def _write(self, run_ids: Iterable[str], attempts_of: dict[str, list[Row]]) -> None:
        """Store the rows of these Runs (new ones inserted, changed ones upserted) and
        drop them from memory (`attempts_of`: each one's Attempts in memory)."""
        rows = self._rows
        leaving = set(run_ids)
        if not leaving:
            return
        for run_id in leaving:
            self._held_records -= self._held.pop(run_id).count()
            self._ending.discard(run_id)
        runs = [rows.runs.pop(run_id) for run_id in sorted(leaving) if run_id in rows.runs]
        steps = [row for run_id in sorted(leaving) for row in rows.steps.pop(run_id, {}).values()]
        attempts = [
            rows.attempts.pop(attempt["attempt_id"])
            for run_id in leaving
            for attempt in attempts_of[run_id]
        ]
        for table, gone in ((RUNS, runs), (STEP_RUNS, steps), (ATTEMPTS, attempts)):
            loaded = rows._loaded[table.name]
            found = table.differing(gone, loaded)
            for row in gone:
                loaded.pop(table.key_of(row), None)
            new = [values for values, stored in found if stored is None]
            changed = [(values, stored) for values, stored in found if stored is not None]
            if new:
                self._insert(table.name, table.columns, new)
            if changed:
                values, stored = zip(*changed, strict=True)
                self._tx.upsert(table.name, table.columns, table.key, values, stored=stored)
