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

from collections.abc import Callable, Iterable, Sequence
from operator import itemgetter
from typing import Any

import orjson

from domain.aggregate import RunAggregate, extend, fold
from domain.errors import CorruptionError
from domain.phases import RUN_PHASES
from domain.records import Record
from domain.streams import lease_stream, run_stream, steps_stream
from domain.transitions import STEP_TERMINAL
from domain.work import grant_windows, phase_windows
from eventstore.grants import AUDIT, MOVE, READ, RUNTIME

COMPONENT = "projections.runs"
STREAM_PREFIXES = ("run-", "steps-", "lease-")

MIGRATIONS = [
    {
        "sqlite": [
            """CREATE TABLE runs (
                run_id TEXT PRIMARY KEY,
                package TEXT NOT NULL,
                workflow_key TEXT NOT NULL,
                publication_id TEXT NOT NULL,
                plan_digest TEXT NOT NULL,
                admission_key TEXT,
                status TEXT NOT NULL,
                version INTEGER NOT NULL,
                steps_version INTEGER NOT NULL DEFAULT 0,
                step_count INTEGER NOT NULL,
                open_steps INTEGER NOT NULL,
                admitted_at_ms INTEGER NOT NULL,
                timeout_ms INTEGER,
                deadline_ms INTEGER,
                cancel_requested_at_ms INTEGER,
                cancel_reason TEXT,
                result_code TEXT,
                error_code TEXT,
                terminal_at_ms INTEGER,
                needs_frontier INTEGER NOT NULL DEFAULT 0,
                needs_admission INTEGER NOT NULL DEFAULT 0,
                needs_cancellation INTEGER NOT NULL DEFAULT 0
            )""",
            """CREATE INDEX runs_frontier ON runs (run_id)
                WHERE status = 'running' AND needs_frontier = 1""",
            """CREATE INDEX runs_admission ON runs (run_id)
                WHERE status = 'running' AND needs_admission = 1""",
            """CREATE INDEX runs_cancellation ON runs (run_id)
                WHERE status = 'running' AND needs_cancellation = 1""",
            """CREATE INDEX runs_deadline ON runs (deadline_ms)
                WHERE status = 'running' AND cancel_requested_at_ms IS NULL
                AND deadline_ms IS NOT NULL""",
            """CREATE TABLE step_runs (
                run_id TEXT NOT NULL,
                step_key TEXT NOT NULL,
                step_run_id TEXT NOT NULL,
                task_ref TEXT NOT NULL,
                needs TEXT NOT NULL,
                status TEXT NOT NULL,
                epoch INTEGER NOT NULL,
                result_code TEXT,
                live_attempt_id TEXT,
                attempt_count INTEGER NOT NULL DEFAULT 0,
                updated_at_ms INTEGER,
                PRIMARY KEY (run_id, step_key)
            )""",
            """CREATE TABLE attempts (
                attempt_id TEXT PRIMARY KEY,
                run_id TEXT NOT NULL,
                step_key TEXT NOT NULL,
                step_run_id TEXT NOT NULL,
                step_epoch INTEGER NOT NULL,
                attempt_number INTEGER NOT NULL,
                task_ref TEXT NOT NULL,
                status TEXT NOT NULL,
                claimed_at_ms INTEGER,
                claimed_position INTEGER NOT NULL,
                lease_id TEXT,
                lease_version INTEGER,
                lease_status TEXT,
                worker_id TEXT,
                expires_at_ms INTEGER,
                started_at_ms INTEGER,
                ended_at_ms INTEGER,
                result_code TEXT,
                output TEXT
            )""",
            "CREATE INDEX attempts_by_run ON attempts (run_id, step_key)",
            """CREATE INDEX attempts_claimable ON attempts (claimed_position)
                WHERE status = 'claimed'""",
            """CREATE INDEX attempts_lease_expiry ON attempts (expires_at_ms)
                WHERE lease_status = 'leased'""",
        ],
    }
]
# PostgreSQL takes the same DDL with BIGINT for the integer columns.
MIGRATIONS[0]["postgresql"] = [
    stmt.replace("INTEGER", "BIGINT") for stmt in MIGRATIONS[0]["sqlite"]
]
# Step 2: the runs search (`Runtime.runs`, projections.views.list_runs) reads newest
# first, keyset-paged on (admitted_at_ms DESC, run_id), optionally by one status or
# one package (and workflow): each order has its index, so a page reads its rows only.
_SEARCH_INDEXES = [
    "CREATE INDEX runs_newest ON runs (admitted_at_ms DESC, run_id)",
    "CREATE INDEX runs_status_newest ON runs (status, admitted_at_ms DESC, run_id)",
    "CREATE INDEX runs_package_newest ON runs (package, workflow_key, admitted_at_ms DESC, run_id)",
    "CREATE INDEX runs_workflow_newest ON runs (workflow_key, admitted_at_ms DESC, run_id)",
]
MIGRATIONS.append({"sqlite": _SEARCH_INDEXES, "postgresql": _SEARCH_INDEXES})
# Step 3 (plan v2): a Run's bound parameters (JSON, NULL for a v1 plan); a StepRun's
# retry policy and the instant its retry may start; `admission_at_ms`, the earliest
# instant a Run flagged for admission has a StepRun it may admit (NULL: now).
_PLAN_V2_COLUMNS = [
    "ALTER TABLE runs ADD COLUMN params TEXT",
    "ALTER TABLE runs ADD COLUMN admission_at_ms INTEGER",
    "ALTER TABLE step_runs ADD COLUMN max_attempts INTEGER NOT NULL DEFAULT 1",
    "ALTER TABLE step_runs ADD COLUMN retry_at_ms INTEGER",
]
MIGRATIONS.append(
    {
        "sqlite": _PLAN_V2_COLUMNS,
        "postgresql": [stmt.replace("INTEGER", "BIGINT") for stmt in _PLAN_V2_COLUMNS],
    }
)
# Step 4: the candidate index is the domain's answer (domain.work): per phase the
# window of instants its decision has work in, per Attempt the window a worker may
# lease it in; one index per window on its opening instant. The hand-written flags
# and their indexes go. Running Runs of an older store get an opening of -1 (open at
# any instant) and are refolded at the next writable open (`backfill`).
WINDOW_COLUMNS = tuple(f"{phase}_{end}_ms" for phase in RUN_PHASES for end in ("opens", "closes"))
GRANT_COLUMNS = ("grant_opens_ms", "grant_closes_ms")
UNKNOWN_MS = -1  # an opening the migration could not compute: refolded by `backfill`


def _work_step(integer: str) -> list[str]:
    return [
        *(
            f"DROP INDEX {index}"
            for index in (
                "runs_frontier", "runs_admission", "runs_cancellation", "runs_deadline",
                "attempts_claimable", "attempts_lease_expiry",
            )
        ),
        *(
            f"ALTER TABLE runs DROP COLUMN needs_{phase}"
            for phase in ("frontier", "admission", "cancellation")
        ),
        "ALTER TABLE runs DROP COLUMN admission_at_ms",  # step 3's retry index: a window now
        *(f"ALTER TABLE runs ADD COLUMN {column} {integer}" for column in WINDOW_COLUMNS),
        *(f"ALTER TABLE attempts ADD COLUMN {column} {integer}" for column in GRANT_COLUMNS),
        "UPDATE runs SET "
        + ", ".join(f"{phase}_opens_ms = {UNKNOWN_MS}" for phase in RUN_PHASES)
        + " WHERE status = 'running'",
        f"UPDATE attempts SET grant_opens_ms = {UNKNOWN_MS} WHERE status = 'claimed'",
        *(
            f"CREATE INDEX runs_{phase}_opens ON runs ({phase}_opens_ms)"
            f" WHERE {phase}_opens_ms IS NOT NULL"
            for phase in RUN_PHASES
        ),
        "CREATE INDEX attempts_grantable ON attempts (claimed_position)"
        " WHERE grant_opens_ms IS NOT NULL",
    ]  # fmt: skip


MIGRATIONS.append({"sqlite": _work_step("INTEGER"), "postgresql": _work_step("BIGINT")})
WORK_STEP = len(MIGRATIONS)  # the step that added the windows: `backfill` fills them


TABLES = {
    "runs": ("run_id",),
    "step_runs": ("run_id", "step_key"),
    "attempts": ("attempt_id",),
}
GRANTS = {table: {RUNTIME: MOVE, AUDIT: READ} for table in TABLES}

Row = dict[str, Any]
# a stream id is "<family>-<entity id>": run-<run_id>, steps-<run_id>, lease-<attempt_id>
_RUN, _STEPS, _LEASE = (prefix.removesuffix("-") for prefix in STREAM_PREFIXES)
_IN_CHUNK = 500  # values per IN (...) list, well under either database's parameter limit


class _Table:
    """One read-model table as `apply` loads and stores it."""

    def __init__(self, name: str, columns: tuple[str, ...]) -> None:
        self.name = name
        self.columns = columns  # every column, in table order
        self.key = TABLES[name]
        self.key_of: Callable[[Row], Any] = itemgetter(*self.key)  # a str, or a tuple
        self.values: Callable[[Row], tuple] = itemgetter(*columns)
        self.select_sql = f"SELECT {', '.join(columns)} FROM {name} WHERE"  # + a condition
        updates = ", ".join(f"{c} = excluded.{c}" for c in columns if c not in self.key)
        self.upsert_sql = (
            f"INSERT INTO {name} ({', '.join(columns)}) VALUES ({', '.join('?' * len(columns))}) "
            f"ON CONFLICT ({', '.join(self.key)}) DO UPDATE SET {updates}"
        )

    def row(self, values: Sequence[Any]) -> Row:
        return dict(zip(self.columns, values, strict=True))

    def differing(self, rows: Iterable[Row], loaded: dict[Any, tuple]) -> list[tuple[tuple, bool]]:
        """(values, is new) of each row that is new or differs from `loaded` (key ->
        values as stored), in key order (a fixed row lock order)."""
        found = []
        for row in rows:
            key, values = self.key_of(row), self.values(row)
            stored = loaded.get(key)
            if stored != values:
                found.append((key, values, stored is None))
        found.sort(key=itemgetter(0))
        return [(values, new) for _key, values, new in found]


RUNS = _Table(
    "runs",
    (
        "run_id", "package", "workflow_key", "publication_id", "plan_digest", "admission_key",
        "status", "version", "steps_version", "step_count", "open_steps", "admitted_at_ms",
        "timeout_ms", "deadline_ms", "cancel_requested_at_ms", "cancel_reason", "result_code",
        "error_code", "terminal_at_ms", "params", *WINDOW_COLUMNS,
    ),
)  # fmt: skip
STEP_RUNS = _Table(
    "step_runs",
    (
        "run_id", "step_key", "step_run_id", "task_ref", "needs", "status", "epoch",
        "result_code", "live_attempt_id", "attempt_count", "updated_at_ms", "max_attempts",
        "retry_at_ms",
    ),
)  # fmt: skip
ATTEMPTS = _Table(
    "attempts",
    (
        "attempt_id", "run_id", "step_key", "step_run_id", "step_epoch", "attempt_number",
        "task_ref", "status", "claimed_at_ms", "claimed_position", "lease_id", "lease_version",
        "lease_status", "worker_id", "expires_at_ms", "started_at_ms", "ended_at_ms",
        "result_code", "output", *GRANT_COLUMNS,
    ),
)  # fmt: skip


TAKES_FOLDED = True  # see projections.registry


def apply(tx, records: Sequence[Record], folded: RunAggregate | None = None) -> None:
    """Fold freshly appended run, step and lease records into the read models
    (`folded`: a Run as its writer folded it just before these records)."""
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
            tx.executemany(table.upsert_sql, changed)


# --- load ------------------------------------------------------------------------------


class _Rows:
    """The rows a batch can touch, as folded so far, and their values as loaded."""

    def __init__(self) -> None:
        self.runs: dict[str, Row] = {}
        self.steps: dict[str, dict[str, Row]] = {}  # run_id -> step_key -> row
        self.attempts: dict[str, Row] = {}
        self._loaded: dict[str, dict[Any, tuple]] = {
            table.name: {} for table in (RUNS, STEP_RUNS, ATTEMPTS)
        }

    def add(self, table: _Table, row: Row) -> None:
        if table is RUNS:
            self.runs[row["run_id"]] = row
        elif table is STEP_RUNS:
            self.steps.setdefault(row["run_id"], {})[row["step_key"]] = row
        else:
            self.attempts[row["attempt_id"]] = row

    def add_loaded(self, table: _Table, found: Iterable[tuple]) -> None:
        """Rows as a query returned them (every column, in table order)."""
        loaded = self._loaded[table.name]
        for values in found:
            row = table.row(values)
            self.add(table, row)
            loaded[table.key_of(row)] = tuple(values)

    def step(self, run_id: str, step_key: str) -> Row | None:
        return self.steps.get(run_id, {}).get(step_key)

    def changed(self, table: _Table) -> list[tuple]:
        """Values of the table's new or changed rows, in key order."""
        if table is RUNS:
            current: Iterable[Row] = self.runs.values()
        elif table is STEP_RUNS:
            current = (row for steps in self.steps.values() for row in steps.values())
        else:
            current = self.attempts.values()
        return [values for values, _new in table.differing(current, self._loaded[table.name])]


def _load(tx, records: Sequence[Record]) -> _Rows:
    """Every row the records can touch: three queries (two when no Attempt is named)."""
    run_ids, attempt_ids = _named(records)
    rows = _Rows()
    rows.add_loaded(ATTEMPTS, _query_in(tx, f"{ATTEMPTS.select_sql} attempt_id", attempt_ids))
    run_ids.update(attempt["run_id"] for attempt in rows.attempts.values())
    rows.add_loaded(RUNS, _query_in(tx, f"{RUNS.select_sql} run_id", run_ids))
    steps, live_attempts = _select_steps_with_live_attempts(tx, run_ids)
    rows.add_loaded(STEP_RUNS, steps)
    rows.add_loaded(ATTEMPTS, (a for a in live_attempts if a[0] not in attempt_ids))
    return rows


def _named(records: Sequence[Record]) -> tuple[set[str], set[str]]:
    """The Run ids and Attempt ids the records name (a lease stream names its Attempt)."""
    run_ids: set[str] = set()
    attempt_ids: set[str] = set()
    for record in records:
        family, _, entity_id = record.stream_id.partition("-")
        if family == _RUN:
            run_ids.add(entity_id)
            if record.type.startswith("attempt."):
                attempt_ids.add(record.data["attempt_id"])
        elif family == _STEPS:
            run_ids.add(entity_id)
        elif family == _LEASE:
            attempt_ids.add(entity_id)
    return run_ids, attempt_ids


_STEPS_WITH_LIVE_ATTEMPTS = (
    f"SELECT {', '.join(f's.{c}' for c in STEP_RUNS.columns)}, "
    f"{', '.join(f'a.{c}' for c in ATTEMPTS.columns)} "
    "FROM step_runs s LEFT JOIN attempts a ON a.attempt_id = s.live_attempt_id WHERE s.run_id"
)


def _select_steps_with_live_attempts(tx, run_ids: Iterable[str]) -> tuple[list[tuple], list[tuple]]:
    """The Runs' StepRuns, and the Attempts they hold live."""
    split = len(STEP_RUNS.columns)
    found = _query_in(tx, _STEPS_WITH_LIVE_ATTEMPTS, run_ids)
    live_attempts = {row[split]: row[split:] for row in found if row[split] is not None}
    return [row[:split] for row in found], list(live_attempts.values())


def _query_in(tx, sql: str, values: Iterable[str]) -> list[tuple]:
    """Rows of `sql` + ` IN (values)`, in chunks of `_IN_CHUNK` values."""
    ordered = sorted(values)
    found: list[tuple] = []
    for start in range(0, len(ordered), _IN_CHUNK):
        chunk = ordered[start : start + _IN_CHUNK]
        found += tx.query(f"{sql} IN ({', '.join('?' * len(chunk))})", chunk)
    return found


# --- fold: like an UPDATE, a record whose row is missing changes nothing ---------------


def _fold(rows: _Rows, record: Record) -> str | None:
    """Fold one record; return the Run whose work windows it may change, if any."""
    family, _, entity_id = record.stream_id.partition("-")
    if family == _RUN:
        _fold_run_event(rows, entity_id, record)
        return entity_id
    if family == _STEPS:
        run = rows.runs.get(entity_id)
        if run is not None and run["steps_version"] < record.stream_version:
            run["steps_version"] = record.stream_version
        return None
    if family == _LEASE:
        return _fold_lease_event(rows, entity_id, record)
    return None


def _fold_run_event(rows: _Rows, run_id: str, record: Record) -> None:
    """Fold a RunEvent: admission inserts the Run and its StepRuns; any other event
    moves the Run's version, then does what its type says."""
    kind = record.type
    if kind == "workflow.admitted":
        _admit(rows, run_id, record)
        return
    run = rows.runs.get(run_id)
    if run is not None:
        run["version"] = record.stream_version
    fold = _RUN_EVENT_FOLDS.get(kind) or _RUN_EVENT_FAMILY_FOLDS.get(_family(kind))
    if fold is not None:
        fold(rows, run_id, run, record)


def _family(kind: str) -> str:
    """The event type's family: "step.failed" -> "step." ("" for a type with no dot)."""
    return kind[: kind.find(".") + 1]


def _update(row: Row | None, **values: Any) -> None:
    if row is not None:
        row.update(values)


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
            **dict.fromkeys(RUNS.columns),
            "run_id": run_id,
            "package": plan["package"],
            "workflow_key": plan["workflow_key"],
            "publication_id": plan["publication_id"],
            "plan_digest": plan["plan_digest"],
            "admission_key": data.get("admission_key"),
            "status": "running",
            "version": record.stream_version,
            "steps_version": 0,
            "step_count": len(steps),
            "open_steps": len(steps),
            "admitted_at_ms": admitted,
            "timeout_ms": timeout,
            "deadline_ms": admitted + timeout if timeout is not None else None,
            "params": _json(plan["params"]) if "params" in plan else None,
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
            },
        )


def _create_step(rows: _Rows, run_id: str, run: Row | None, record: Record) -> None:
    data = record.data
    _update(rows.step(run_id, data["step_key"]), status=data["status"], epoch=data["epoch"])


def _move_step(rows: _Rows, run_id: str, run: Row | None, record: Record) -> None:
    data = record.data
    to = data["to"]
    _update(
        rows.step(run_id, data["step_key"]),
        status=to,
        epoch=data["epoch"],
        result_code=data.get("result_code"),
        updated_at_ms=record.metadata.get("at_ms"),
        retry_at_ms=data.get("retry_at_ms"),
    )
    if run is not None and to in STEP_TERMINAL and data["from"] not in STEP_TERMINAL:
        run["open_steps"] -= 1


def _claim(rows: _Rows, run_id: str, run: Row | None, record: Record) -> None:
    data = record.data
    attempt_id = data["attempt_id"]
    if attempt_id in rows.attempts:
        raise CorruptionError(f"attempt {attempt_id!r} is claimed twice in the log")
    rows.add(
        ATTEMPTS,
        {
            **dict.fromkeys(ATTEMPTS.columns),
            "attempt_id": attempt_id,
            "run_id": run_id,
            "step_key": data["step_key"],
            "step_run_id": data["step_run_id"],
            "step_epoch": data["step_epoch"],
            "attempt_number": data["attempt_number"],
            "task_ref": data["admission"]["task_ref"],
            "status": "claimed",
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
    output = data.get("output")
    _update(
        rows.attempts.get(attempt_id),
        status=record.type.partition(".")[2],
        result_code=data.get("result_code"),
        ended_at_ms=record.metadata.get("at_ms"),
        output=None if output is None else _json(output),
    )
    for step in rows.steps.get(run_id, {}).values():
        if step["live_attempt_id"] == attempt_id:
            step["live_attempt_id"] = None


def _request_cancel(rows: _Rows, run_id: str, run: Row | None, record: Record) -> None:
    data = record.data
    _update(run, cancel_requested_at_ms=data["requested_at_ms"], cancel_reason=data["reason"])


def _end_run(rows: _Rows, run_id: str, run: Row | None, record: Record) -> None:
    data = record.data
    _update(
        run,
        status=record.type.partition(".")[2],
        result_code=data.get("result_code"),
        error_code=data.get("error_code"),
        terminal_at_ms=record.metadata.get("at_ms"),
    )


# What each RunEvent type does beyond moving the Run's version (`workflow.admitted`
# aside): an exact type first, else its family ("step.<to>", "attempt.<terminal>",
# "workflow.<terminal>"); any other type only moves the version.
_RUN_EVENT_FOLDS = {
    "step.created": _create_step,
    "attempt.claimed": _claim,
    "attempt.starting": _start_attempt,
    "attempt.running": _start_attempt,
    "workflow.cancel_requested": _request_cancel,
}
_RUN_EVENT_FAMILY_FOLDS = {
    "step.": _move_step,
    "attempt.": _end_attempt,
    "workflow.": _end_run,
}


def _fold_lease_event(rows: _Rows, attempt_id: str, record: Record) -> str | None:
    """Fold a lease record into its Attempt's row; return the Attempt's Run, if any."""
    attempt = rows.attempts.get(attempt_id)
    if attempt is None:
        return None
    kind, data = record.type, record.data
    if kind == "lease.granted":
        attempt.update(
            lease_id=data["lease_id"],
            lease_version=record.stream_version,
            lease_status="leased",
            worker_id=data["worker_id"],
            expires_at_ms=data["expires_at_ms"],
        )
    elif kind == "lease.renewed":
        attempt.update(lease_version=record.stream_version, expires_at_ms=data["expires_at_ms"])
    else:
        status = "completed" if kind == "lease.completed" else "released"
        attempt.update(lease_version=record.stream_version, lease_status=status)
    return attempt["run_id"]


# --- the candidate index: the domain's answer for the folded Run ------------------------


def _refresh_work(rows: _Rows, aggregate: RunAggregate) -> None:
    """Store `domain.work`'s windows for the Run and its Attempts held in `rows`."""
    run = rows.runs.get(aggregate.run_id)
    if run is None:
        return
    for phase, window in phase_windows(aggregate).items():
        run[f"{phase}_opens_ms"] = None if window is None else window.opens_ms
        run[f"{phase}_closes_ms"] = None if window is None else window.closes_ms
    grants = grant_windows(aggregate)
    for attempt_id in aggregate.attempts:
        attempt = rows.attempts.get(attempt_id)
        if attempt is not None:
            window = grants.get(attempt_id)
            attempt["grant_opens_ms"] = None if window is None else window.opens_ms
            attempt["grant_closes_ms"] = None if window is None else window.closes_ms


def _after(
    tx, records: Sequence[Record], rows: _Rows, touched: set[str], folded: RunAggregate | None
) -> list[RunAggregate]:
    """The touched Runs after these records: the writer's aggregate extended with
    them when it is the Run just before them, else folded by the domain from the
    Run's streams as this transaction reads them (the records are in the log)."""
    wanted = {run_id for run_id in touched if run_id in rows.runs}
    found = []
    if folded is not None and folded.run_id in wanted:
        streams = _by_run(records, rows).get(folded.run_id)
        if streams is not None and _continues(folded, streams):
            found.append(extend(folded, *streams))
            wanted.discard(folded.run_id)
    return found + _folded_runs(tx, wanted)


def _by_run(records: Sequence[Record], rows: _Rows) -> dict[str, _Streams]:
    """The records grouped by Run into (run, steps, {attempt: lease}) streams, in
    log order (a lease record's Run is its Attempt's, as held in `rows`)."""
    by_run: dict[str, _Streams] = {}
    for record in records:
        family, _, entity_id = record.stream_id.partition("-")
        if family == _LEASE:
            attempt = rows.attempts.get(entity_id)
            if attempt is None:
                continue
            streams = by_run.setdefault(attempt["run_id"], ([], [], {}))
            streams[2].setdefault(entity_id, []).append(record)
        elif family in (_RUN, _STEPS):
            streams = by_run.setdefault(entity_id, ([], [], {}))
            streams[0 if family == _RUN else 1].append(record)
    return by_run


def _continues(aggregate: RunAggregate, streams: _Streams) -> bool:
    """Whether each stream's records start right after the aggregate's version of it."""
    run_records, step_records, lease_records = streams
    if run_records and run_records[0].stream_version != aggregate.version + 1:
        return False
    if step_records and step_records[0].stream_version != aggregate.steps_version + 1:
        return False
    return all(
        found[0].stream_version == aggregate.lease_versions.get(attempt_id, 0) + 1
        for attempt_id, found in lease_records.items()
    )


def _folded_runs(tx, run_ids: Iterable[str]) -> list[RunAggregate]:
    """Each Run's aggregate, folded by the domain from its streams as `tx` reads them."""
    return [fold(*streams) for streams in _run_streams(tx, run_ids).values()]


_Streams = tuple[list[Record], list[Record], dict[str, list[Record]]]


def _run_streams(
    tx, run_ids: Iterable[str], upto_position: int | None = None
) -> dict[str, _Streams]:
    """Each existing Run's (run, steps, {attempt: lease}) streams as `tx` reads them
    (only records at or before `upto_position`, if given): two queries in all."""
    ordered = sorted(run_ids)
    if not ordered:
        return {}
    streams = tx.read_streams([s for r in ordered for s in (run_stream(r), steps_stream(r))])
    streams = {k: _upto(v, upto_position) for k, v in streams.items()}
    claimed = {
        run_id: [
            r.data["attempt_id"] for r in streams[run_stream(run_id)] if r.type == "attempt.claimed"
        ]
        for run_id in ordered
    }
    wanted = [lease_stream(a) for attempts in claimed.values() for a in attempts]
    leases = tx.read_streams(wanted) if wanted else {}
    return {
        run_id: (
            streams[run_stream(run_id)],
            streams[steps_stream(run_id)],
            {a: _upto(leases[lease_stream(a)], upto_position) for a in claimed[run_id]},
        )
        for run_id in ordered
        if streams[run_stream(run_id)]
    }


def _upto(records: list[Record], position: int | None) -> list[Record]:
    if position is None:
        return records
    return [r for r in records if r.global_position <= position]


def backfill(store, from_version: int) -> int:
    """After an upgrade across `WORK_STEP` (above), refold the Runs it left with an
    unknown candidate window and store the domain's answer; return how many."""
    if from_version == 0 or from_version >= WORK_STEP:
        return 0  # a new store has no Runs; a later step leaves the windows alone
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
                    tx.executemany(table.upsert_sql, changed)
            done += len(run_ids)


REFRESH_BATCH = 200  # Runs `backfill` refolds per transaction


def _json(value) -> str:
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()


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
                self._tx.executemany(table.upsert_sql, changed)


def _created(records: Sequence[Record]) -> tuple[set[str], set[str]]:
    """The Run ids the records admit and the Attempt ids they claim."""
    run_ids: set[str] = set()
    attempt_ids: set[str] = set()
    for record in records:
        kind = record.type
        if kind == "workflow.admitted" or kind == "attempt.claimed":
            family, _, run_id = record.stream_id.partition("-")
            if family == _RUN and kind == "workflow.admitted":
                run_ids.add(run_id)
            elif family == _RUN:
                attempt_ids.add(record.data["attempt_id"])
    return run_ids, attempt_ids
