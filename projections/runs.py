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

from collections.abc import Sequence

import orjson

from domain import execution as execution_rules
from domain.event_types import EventType
from domain.phases import RUN_PHASES
from domain.records import Record
from domain.streams import lease_stream, run_stream
from domain.transitions import Status
from eventstore.api import PENDING_POSITION, EventStore, Transaction
from eventstore.in_lists import chunks
from projections.contract import Folded
from projections.runs_fold import (
    _fold,
    _json,
    _load,
    _query_in,
    _Rows,
    load_queries,
    load_queries_of_runs,
)
from projections.runs_replay import Replay  # the rebuild's fold (projections.registry)
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
    WORKERS_STEP,
)
from projections.runs_windows import (
    _after,
    _folded_runs,
    _refresh_work,
)

__all__ = [
    "COMPONENT", "GRANTS", "GRANT_COLUMNS", "MIGRATIONS", "STREAM_PREFIXES", "TABLES",
    "WINDOW_COLUMNS", "WORK_STEP", "EXECUTION_STEP", "Replay", "apply", "backfill", "reads_ahead",
    "reads_ahead_of_runs",
]  # fmt: skip


def reads_ahead(
    records: Sequence[Record], folded: Folded | None = None
) -> list[tuple[str, list[str]]]:
    """What `apply` of these records reads first (`projections.registry`: read ahead)."""
    return load_queries(records, folded)


def reads_ahead_of_runs(
    run_ids: Sequence[str], attempt_ids: Sequence[str]
) -> list[tuple[str, list[str]]]:
    """What `apply` reads first for records of these Runs naming these Attempts of theirs
    (`projections.registry`: read ahead before a write is decided)."""
    return load_queries_of_runs(run_ids, attempt_ids)


def apply(tx: Transaction, records: Sequence[Record], folded: Folded | None = None) -> None:
    """Fold freshly appended run, step and lease records into the read models
    (`folded`: Runs as their writer's decisions left them, after these records)."""
    rows = _load(tx, records, folded)
    touched: set[str] = set()
    for record in records:
        run_id = _fold(rows, record)
        if run_id is not None:
            touched.add(run_id)
    for aggregate in _after(tx, records, rows, touched, folded):
        _refresh_work(rows, aggregate)
    for table in (RUNS, STEP_RUNS, ATTEMPTS):
        rows.store(tx, table)
    # a claim whose append goes with COMMIT has its position on the server only
    # (`Transaction.append_at_commit`): the Attempt's claimed_position is read there
    pending = [
        (record.event_id, record.data["attempt_id"])
        for record in records
        if record.global_position == PENDING_POSITION and record.type == EventType.ATTEMPT_CLAIMED
    ]
    for chunk in chunks(pending, padded=True):  # one statement for a page's claims
        cases = " ".join(["WHEN ? THEN ?"] * len(chunk))
        tx.executemany(  # queued, not answered: it goes with the append
            "UPDATE attempts SET claimed_position = (SELECT e.global_position FROM events e"
            f" WHERE e.event_id = CASE attempt_id {cases} END)"
            f" WHERE attempt_id IN ({', '.join(['?'] * len(chunk))})",
            [[*(v for event_id, attempt_id in chunk for v in (attempt_id, event_id)),
              *(attempt_id for _event_id, attempt_id in chunk)]],
        )  # fmt: skip


def backfill(store: EventStore, from_version: int) -> int:
    """After an upgrade, fill what the schema steps could not compute (a new store has
    nothing to fill): across `WORK_STEP`, refold the Runs left with an unknown
    candidate window; across `EXECUTION_STEP`, split the Attempts' old executor
    records out of their outputs. Returns how many Runs were refolded."""
    if from_version == 0:
        return 0
    if from_version < EXECUTION_STEP:
        _split_executions(store)
    if from_version < WORKERS_STEP:
        _renewals_of_held_leases(store)
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
                rows.store(tx, table)
            done += len(run_ids)


REFRESH_BATCH = 200  # Runs `backfill` refolds per transaction


def _renewals_of_held_leases(store: EventStore) -> None:
    """Across `WORKERS_STEP`: an Attempt whose lease is held keeps what that lease's
    grant said (host, slots) and its last renewal; every other row keeps NULL, as a
    replay of grants written before the step leaves it (their grants said nothing,
    and `renewed_at_ms` is NULL once a lease ended). Reads the lease streams of the
    Attempts whose lease is held, nothing else."""
    with store.transaction() as tx:
        held = [row[0] for row in tx.query(
            "SELECT attempt_id FROM attempts WHERE lease_status = ?", (Status.LEASED.value,)
        )]  # fmt: skip
        filled = []
        for chunk in chunks(held):
            streams = tx.read_streams([lease_stream(attempt_id) for attempt_id in chunk])
            for attempt_id in chunk:
                said: tuple[object, object, object] = (None, None, None)
                for record in streams.get(lease_stream(attempt_id), ()):
                    data = record.data
                    if record.type == EventType.LEASE_GRANTED:
                        said = (data.get("worker_host"), data.get("worker_slots"), None)
                    elif record.type == EventType.LEASE_RENEWED:
                        said = (said[0], said[1], data["renewed_at_ms"])
                if said != (None, None, None):
                    filled.append((*said, attempt_id))
        if filled:
            tx.executemany(
                """UPDATE attempts SET worker_host = ?, worker_slots = ?, renewed_at_ms = ?
                   WHERE attempt_id = ?""",
                filled,
            )


def _split_executions(store: EventStore) -> None:
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
