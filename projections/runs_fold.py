"""Load and fold for the Runs read model: the rows a batch of records can touch,
and each record folded into them in memory, as `projections.runs.apply` and the
rebuild's `Replay` use them."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import orjson

from domain import execution as execution_rules
from domain.errors import CorruptionError
from domain.event_types import EventType, Family
from domain.records import Record
from domain.transitions import STEP_TERMINAL, Status
from eventstore.api import Reads, Transaction
from eventstore.in_lists import chunks, marks
from projections.contract import Folded
from projections.runs_schema import (
    _LEASE,
    _RUN,
    _STEPS,
    ATTEMPTS,
    RUNS,
    STEP_RUNS,
    Row,
    _Table,
)

# --- load ------------------------------------------------------------------------------


class _Rows:
    """The rows a batch can touch, as folded so far, and their values as loaded."""

    def __init__(self) -> None:
        self.runs: dict[str, Row] = {}
        self.steps: dict[str, dict[str, Row]] = {}  # run_id -> step_key -> row
        self.attempts: dict[str, Row] = {}
        self._loaded: dict[str, dict[Any, tuple[Any, ...]]] = {
            table.name: {} for table in (RUNS, STEP_RUNS, ATTEMPTS)
        }

    def add(self, table: _Table, row: Row) -> None:
        if table is RUNS:
            self.runs[row["run_id"]] = row
        elif table is STEP_RUNS:
            self.steps.setdefault(row["run_id"], {})[row["step_key"]] = row
        else:
            self.attempts[row["attempt_id"]] = row

    def add_loaded(self, table: _Table, found: Iterable[tuple[Any, ...]]) -> None:
        """Rows as a query returned them (every column, in table order)."""
        loaded = self._loaded[table.name]
        for values in found:
            row = table.row(values)
            self.add(table, row)
            loaded[table.key_of(row)] = tuple(values)

    def step(self, run_id: str, step_key: str) -> Row | None:
        return self.steps.get(run_id, {}).get(step_key)

    def store(self, tx: Transaction, table: _Table) -> None:
        """Write the table's new or changed rows, in key order, each changed one with
        its values as loaded (`Transaction.upsert`: a store may write only what
        differs)."""
        if table is RUNS:
            current: Iterable[Row] = self.runs.values()
        elif table is STEP_RUNS:
            current = (row for steps in self.steps.values() for row in steps.values())
        else:
            current = self.attempts.values()
        found = table.differing(current, self._loaded[table.name])
        if found:
            values, stored = zip(*found, strict=True)
            tx.upsert(table.name, table.columns, table.key, values, stored=stored)


def _load(tx: Reads, records: Sequence[Record], folded: Folded | None = None) -> _Rows:
    """Every row the records can touch and that exists already (a Run these records
    admit, an Attempt they claim, is not stored yet): key lookups by Run and by
    Attempt, `eventstore.in_lists.IN_CHUNK` ids each, all sent together (`query_all`)."""
    rows = _Rows()
    queries, count = _load_queries(records, folded)
    if not queries:
        return rows
    found = tx.query_all(queries, prepared=True)
    for runs in found[:count]:
        rows.add_loaded(RUNS, (row for row in runs if row[0] not in rows.runs))
    for attempts_found in found[2 * count :]:
        rows.add_loaded(ATTEMPTS, attempts_found)
    split = len(STEP_RUNS.columns)
    live = {}
    for steps in found[count : 2 * count]:
        for row in steps:
            if rows.step(row[0], row[1]) is None:
                rows.add_loaded(STEP_RUNS, [row[:split]])
                if row[split] is not None:
                    live[row[split]] = row[split:]
    rows.add_loaded(ATTEMPTS, (a for a in live.values() if a[0] not in rows.attempts))
    return rows


def load_queries(
    records: Sequence[Record], folded: Folded | None = None
) -> list[tuple[str, list[str]]]:
    """The queries `_load` sends for these records (what a writer may read ahead:
    `Transaction.read_ahead`); positions play no part."""
    return _load_queries(records, folded)[0]


def load_queries_of_runs(
    run_ids: Iterable[str], attempt_ids: Iterable[str]
) -> list[tuple[str, list[str]]]:
    """The queries `_load` sends for records of these Runs that name these Attempts of
    theirs, none of them new (a worker's write on its Attempt, a cancel of a Run's
    active ones): what a writer may read ahead before it decides."""
    return _queries(sorted(set(run_ids)), sorted(set(attempt_ids)), [])[0]


def _load_queries(
    records: Sequence[Record], folded: Folded | None = None
) -> tuple[list[tuple[str, list[str]]], int]:
    """`_load`'s queries, and how many conditions they are made of."""
    run_ids, attempt_ids, of_named_runs = _named(records)
    loose = attempt_ids - of_named_runs
    if folded and loose:
        # an Attempt only a lease record names, of a Run its writer holds: its Run is
        # known (the rows read are those its row would have led to)
        for run_id, aggregate in folded.items():
            placed = loose.intersection(aggregate.attempts)
            if placed:
                run_ids.add(run_id)
                of_named_runs |= placed
                loose -= placed
                if not loose:
                    break
    created_runs, created_attempts = _created(records)
    named, attempts = sorted(run_ids - created_runs), sorted(attempt_ids - created_attempts)
    # the Runs of a condition: named ones, or (a lease record names only its Attempt)
    # the ones those Attempts' rows name, where no record of the Run names it too; each
    # its own query, as an OR of the two would scan the whole table
    unplaced = [a for a in attempts if a not in of_named_runs]
    return _queries(named, attempts, unplaced)


def _queries(
    named: list[str], attempts: list[str], unplaced: list[str]
) -> tuple[list[tuple[str, list[str]]], int]:
    """The Runs' rows (`named`, and those of the `unplaced` Attempts), their steps with
    live Attempts, and the `attempts` rows, by key."""
    conditions = [(f"IN ({marks(chunk)})", chunk) for chunk in chunks(named, padded=True)]
    conditions += [
        (f"IN (SELECT r.run_id FROM attempts r WHERE r.attempt_id IN ({marks(chunk)}))", chunk)
        for chunk in chunks(unplaced, padded=True)
    ]
    queries = [(f"{RUNS.select_sql} run_id {where}", values) for where, values in conditions]
    queries += [(f"{_STEPS_WITH_LIVE_ATTEMPTS} {where}", values) for where, values in conditions]
    queries += [
        (f"{ATTEMPTS.select_sql} attempt_id IN ({marks(chunk)})", chunk)
        for chunk in chunks(attempts, padded=True)
    ]
    return queries, len(conditions)


def _created(records: Sequence[Record]) -> tuple[set[str], set[str]]:
    """The Run ids the records admit and the Attempt ids they claim."""
    run_ids: set[str] = set()
    attempt_ids: set[str] = set()
    for record in records:
        kind = record.type
        if kind == EventType.WORKFLOW_ADMITTED or kind == EventType.ATTEMPT_CLAIMED:
            family, _, run_id = record.stream_id.partition("-")
            if family == _RUN and kind == EventType.WORKFLOW_ADMITTED:
                run_ids.add(run_id)
            elif family == _RUN:
                attempt_ids.add(record.data["attempt_id"])
    return run_ids, attempt_ids


def _named(records: Sequence[Record]) -> tuple[set[str], set[str], set[str]]:
    """The Run ids and Attempt ids the records name (a lease stream names its Attempt),
    and those of the Attempts whose Run they name too (a Run's Attempt record)."""
    run_ids: set[str] = set()
    attempt_ids: set[str] = set()
    of_named_runs: set[str] = set()
    for record in records:
        family, _, entity_id = record.stream_id.partition("-")
        if family == _RUN:
            run_ids.add(entity_id)
            if record.type.startswith(_ATTEMPT_EVENT):
                attempt_ids.add(record.data["attempt_id"])
                of_named_runs.add(record.data["attempt_id"])
        elif family == _STEPS:
            run_ids.add(entity_id)
        elif family == _LEASE:
            attempt_ids.add(entity_id)
    return run_ids, attempt_ids, of_named_runs


_ATTEMPT_EVENT = f"{Family.ATTEMPT}."  # the prefix of every Attempt RunEvent type
# Plain values for the per-record comparisons: a StrEnum member's lookup and comparison
# cost several times a str's (docs/DESIGN.md, "Rebuild").
_WORKFLOW_ADMITTED = EventType.WORKFLOW_ADMITTED.value
_ATTEMPT_CLAIMED = EventType.ATTEMPT_CLAIMED.value
_LEASE_GRANTED = EventType.LEASE_GRANTED.value
_LEASE_RENEWED = EventType.LEASE_RENEWED.value
_LEASE_COMPLETED = EventType.LEASE_COMPLETED.value
# the lease statuses as plain str: the same value stored, bound several times faster
_LEASED, _COMPLETED, _RELEASED = Status.LEASED.value, Status.COMPLETED.value, Status.RELEASED.value
# a new row's columns all None, copied and filled in
_RUN_BLANK: Row = dict.fromkeys(RUNS.columns)
_ATTEMPT_BLANK: Row = dict.fromkeys(ATTEMPTS.columns)


_STEPS_WITH_LIVE_ATTEMPTS = (
    f"SELECT {', '.join(f's.{c}' for c in STEP_RUNS.columns)}, "
    f"{', '.join(f'a.{c}' for c in ATTEMPTS.columns)} "
    "FROM step_runs s LEFT JOIN attempts a ON a.attempt_id = s.live_attempt_id WHERE s.run_id"
)


def _select_steps_with_live_attempts(
    tx: Reads, run_ids: Iterable[str]
) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    """The Runs' StepRuns, and the Attempts they hold live."""
    split = len(STEP_RUNS.columns)
    found = _query_in(tx, _STEPS_WITH_LIVE_ATTEMPTS, run_ids)
    live_attempts = {row[split]: row[split:] for row in found if row[split] is not None}
    return [row[:split] for row in found], list(live_attempts.values())


def _query_in(tx: Reads, sql: str, values: Iterable[str]) -> list[tuple[Any, ...]]:
    """Rows of `sql` + ` IN (values)`, in chunks (none: no query)."""
    found: list[tuple[Any, ...]] = []
    for chunk in chunks(sorted(values)):
        found += tx.query(f"{sql} IN ({marks(chunk)})", chunk)
    return found


# --- fold: like an UPDATE, a record whose row is missing changes nothing ---------------


def _fold(rows: _Rows, record: Record) -> str | None:
    """Fold one record; return the Run whose work windows it may change, if any."""
    family, _, entity_id = record.stream_id.partition("-")
    return _fold_family(rows, family, entity_id, record)


def _fold_family(rows: _Rows, family: str, entity_id: str, record: Record) -> str | None:
    """`_fold` for a record whose stream id is already split into family and entity."""
    if family == _RUN:
        _fold_run_event(rows, entity_id, record)
        return entity_id
    if family == _STEPS:
        run = rows.runs.get(entity_id)
        if run is not None:
            _fold_steps_version(run, record.stream_version)
        return None
    if family == _LEASE:
        return _fold_lease_event(rows, entity_id, record)
    return None


def _fold_steps_version(run: Row, version: int) -> None:
    """A StepRunMutation (at `version` of its stream) moves only its Run's steps
    version: all it reads of the record (a rebuild reads it from the stored row,
    without decoding its data)."""
    if run["steps_version"] < version:
        run["steps_version"] = version


def _fold_run_event(rows: _Rows, run_id: str, record: Record) -> None:
    """Fold a RunEvent: admission inserts the Run and its StepRuns; any other event
    moves the Run's version, then does what its type says."""
    kind = record.type
    if kind == _WORKFLOW_ADMITTED:
        _admit(rows, run_id, record)
        return
    run = rows.runs.get(run_id)
    if run is not None:
        run["version"] = record.stream_version
    fold = _FOLD_OF_TYPE.get(kind, _UNSEEN)
    if fold is _UNSEEN:
        fold = _fold_of(kind)
    if fold is not None:
        fold(rows, run_id, run, record)


_UNSEEN: Any = object()


def _fold_of(kind: str) -> Any:
    """What a RunEvent type does (`_RUN_EVENT_FOLDS`, else its family's), remembered:
    one dict lookup per record after the first of its type (the types a log holds are
    few; a log full of made-up ones fills `_TYPES_REMEMBERED` and no more)."""
    fold = _RUN_EVENT_FOLDS.get(kind) or _RUN_EVENT_FAMILY_FOLDS.get(_family(kind))
    if len(_FOLD_OF_TYPE) < _TYPES_REMEMBERED:
        _FOLD_OF_TYPE[kind] = fold
    return fold


def _family(kind: str) -> str:
    """The event type's family: "step.failed" -> "step." ("" for a type with no dot)."""
    return kind[: kind.find(".") + 1]


def _admit(rows: _Rows, run_id: str, record: Record) -> None:
    data = record.data
    plan = data["plan"]
    steps = plan["steps"]
    timeout = plan.get("timeout_ms")
    admitted = data["admitted_at_ms"]
    if run_id in rows.runs:
        raise CorruptionError(f"run {run_id!r} is admitted twice in the log")
    rows.add(
        RUNS,
        {
            **_RUN_BLANK,
            "run_id": run_id,
            "package": plan["package"],
            "workflow_key": plan["workflow_key"],
            "publication_id": plan["publication_id"],
            "plan_digest": plan["plan_digest"],
            "admission_key": data.get("admission_key"),
            "status": Status.RUNNING,
            "version": record.stream_version,
            "steps_version": 0,
            "step_count": len(steps),
            "open_steps": len(steps),
            "admitted_at_ms": admitted,
            "timeout_ms": timeout,
            "deadline_ms": admitted + timeout if timeout is not None else None,
            "params": _json(plan["params"]) if "params" in plan else None,
            "rerun_of": (data.get("rerun_of") or {}).get("run_id"),
        },
    )
    for step in steps:
        if rows.step(run_id, step["key"]) is not None:
            raise CorruptionError(f"run {run_id!r} admits step {step['key']!r} twice")
        rows.add(
            STEP_RUNS,
            {
                "run_id": run_id,
                "step_key": step["key"],
                "step_run_id": step["step_run_id"],
                "task_ref": step["task_ref"],
                "needs": ",".join(step["needs"]),
                "status": step["initial_status"],
                "epoch": 0,
                "result_code": None,
                "live_attempt_id": None,
                "attempt_count": 0,
                "updated_at_ms": admitted,
                "max_attempts": step["retry"]["max_attempts"] if "retry" in step else 1,
                "retry_at_ms": None,
                "reused_from": None,
                "reused_output": None,
            },
        )


def _create_step(rows: _Rows, run_id: str, run: Row | None, record: Record) -> None:
    data = record.data
    step = rows.step(run_id, data["step_key"])
    status, epoch = data["status"], data["epoch"]
    if step is not None:
        step["status"] = status
        step["epoch"] = epoch


def _move_step(rows: _Rows, run_id: str, run: Row | None, record: Record) -> None:
    data = record.data
    to = data["to"]
    step = rows.step(run_id, data["step_key"])
    epoch, result_code = data["epoch"], data.get("result_code")
    at_ms, retry_at_ms = record.metadata.get("at_ms"), data.get("retry_at_ms")
    if step is not None:
        step["status"] = to
        step["epoch"] = epoch
        step["result_code"] = result_code
        step["updated_at_ms"] = at_ms
        step["retry_at_ms"] = retry_at_ms
    if run is not None and to in STEP_TERMINAL and data["from"] not in STEP_TERMINAL:
        run["open_steps"] -= 1


def _reuse_step(rows: _Rows, run_id: str, run: Row | None, record: Record) -> None:
    """A rerun's reused step: succeeded, with its origin and output (docs/DESIGN.md
    "Reruns")."""
    _move_step(rows, run_id, run, record)
    data = record.data
    output = data["output"]
    step = rows.step(run_id, data["step_key"])
    reused_from = _json(data["reused_from"])
    reused_output = None if output is None else _json(output)
    if step is not None:
        step["reused_from"] = reused_from
        step["reused_output"] = reused_output


def _claim(rows: _Rows, run_id: str, run: Row | None, record: Record) -> None:
    data = record.data
    attempt_id = data["attempt_id"]
    if attempt_id in rows.attempts:
        raise CorruptionError(f"attempt {attempt_id!r} is claimed twice in the log")
    rows.add(
        ATTEMPTS,
        {
            **_ATTEMPT_BLANK,
            "attempt_id": attempt_id,
            "run_id": run_id,
            "step_key": data["step_key"],
            "step_run_id": data["step_run_id"],
            "step_epoch": data["step_epoch"],
            "attempt_number": data["attempt_number"],
            "task_ref": data["admission"]["task_ref"],
            "status": Status.CLAIMED,
            "claimed_at_ms": record.metadata.get("at_ms"),
            "claimed_position": record.global_position,
        },
    )
    step = rows.step(run_id, data["step_key"])
    if step is not None:
        step["live_attempt_id"] = attempt_id
        step["attempt_count"] += 1


def _start_attempt(rows: _Rows, run_id: str, run: Row | None, record: Record) -> None:
    attempt = rows.attempts.get(record.data["attempt_id"])
    if attempt is not None:
        attempt["status"] = record.type.partition(".")[2]
        if attempt["started_at_ms"] is None:
            attempt["started_at_ms"] = record.metadata.get("at_ms")


def _end_attempt(rows: _Rows, run_id: str, run: Row | None, record: Record) -> None:
    data = record.data
    attempt_id = data["attempt_id"]
    output, execution = execution_rules.split(data)
    attempt = rows.attempts.get(attempt_id)
    status, result_code = record.type.partition(".")[2], data.get("result_code")
    ended_at_ms = record.metadata.get("at_ms")
    output_json = None if output is None else _json(output)
    execution_json = None if execution is None else _json(execution)
    if attempt is not None:
        attempt["status"] = status
        attempt["result_code"] = result_code
        attempt["ended_at_ms"] = ended_at_ms
        attempt["output"] = output_json
        attempt["execution"] = execution_json
    for step in rows.steps.get(run_id, {}).values():
        if step["live_attempt_id"] == attempt_id:
            step["live_attempt_id"] = None


def _request_cancel(rows: _Rows, run_id: str, run: Row | None, record: Record) -> None:
    data = record.data
    requested_at_ms, reason = data["requested_at_ms"], data["reason"]
    if run is not None:
        run["cancel_requested_at_ms"] = requested_at_ms
        run["cancel_reason"] = reason


def _dequeue(rows: _Rows, run_id: str, run: Row | None, record: Record) -> None:
    """A queued Run took its slot: only its version moves here; `slot_state` is the
    domain's answer, stored with the candidate windows (`runs_windows`)."""


def _end_run(rows: _Rows, run_id: str, run: Row | None, record: Record) -> None:
    data = record.data
    status, result_code = record.type.partition(".")[2], data.get("result_code")
    error_code, terminal_at_ms = data.get("error_code"), record.metadata.get("at_ms")
    if run is not None:
        run["status"] = status
        run["result_code"] = result_code
        run["error_code"] = error_code
        run["terminal_at_ms"] = terminal_at_ms


# What each RunEvent type does beyond moving the Run's version (`workflow.admitted`
# aside): an exact type first, else its family ("step.<to>", "attempt.<terminal>",
# "workflow.<terminal>"); any other type only moves the version.
_RUN_EVENT_FOLDS = {
    EventType.STEP_CREATED.value: _create_step,
    EventType.ATTEMPT_CLAIMED.value: _claim,
    EventType.ATTEMPT_STARTING.value: _start_attempt,
    EventType.ATTEMPT_RUNNING.value: _start_attempt,
    EventType.WORKFLOW_CANCEL_REQUESTED.value: _request_cancel,
    EventType.WORKFLOW_DEQUEUED.value: _dequeue,
    EventType.STEP_REUSED.value: _reuse_step,
}
_FOLD_OF_TYPE: dict[str, Any] = {}  # RunEvent type -> its fold (None: only the version)
_TYPES_REMEMBERED = 256
_RUN_EVENT_FAMILY_FOLDS = {
    f"{Family.STEP}.": _move_step,
    f"{Family.ATTEMPT}.": _end_attempt,
    f"{Family.WORKFLOW}.": _end_run,
}


def _fold_lease_event(rows: _Rows, attempt_id: str, record: Record) -> str | None:
    """Fold a lease record into its Attempt's row; return the Attempt's Run, if any."""
    attempt = rows.attempts.get(attempt_id)
    if attempt is None:
        return None
    kind, data = record.type, record.data
    if kind == _LEASE_GRANTED:
        lease_id, worker_id = data["lease_id"], data["worker_id"]
        expires_at_ms = data["expires_at_ms"]
        attempt["lease_id"] = lease_id
        attempt["lease_version"] = record.stream_version
        attempt["lease_status"] = _LEASED
        attempt["worker_id"] = worker_id
        attempt["expires_at_ms"] = expires_at_ms
        attempt["worker_host"] = data.get("worker_host")
        attempt["worker_slots"] = data.get("worker_slots")
        attempt["renewed_at_ms"] = None
    elif kind == _LEASE_RENEWED:
        expires_at_ms, renewed_at_ms = data["expires_at_ms"], data["renewed_at_ms"]
        attempt["lease_version"] = record.stream_version
        attempt["expires_at_ms"] = expires_at_ms
        attempt["renewed_at_ms"] = renewed_at_ms
    else:  # the lease ended: its last renewal is no worker's news any more
        attempt["lease_version"] = record.stream_version
        attempt["lease_status"] = _COMPLETED if kind == _LEASE_COMPLETED else _RELEASED
        attempt["renewed_at_ms"] = None
    run_id: str = attempt["run_id"]
    return run_id


def _json(value: Any) -> str:
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()
