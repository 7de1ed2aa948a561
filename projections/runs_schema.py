"""The tables of the Runs read model (runs, step_runs, attempts), their schema steps
and grants, and the row shape each table is upserted with (docs/DESIGN.md,
"Projections" and "The candidate index")."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from operator import itemgetter
from typing import Any

from domain.phases import RUN_PHASES
from domain.slots import HELD, QUEUED
from domain.streams import LEASE, RUN, STEPS, prefix
from domain.transitions import ATTEMPT_RUNNING, ATTEMPT_STARTING
from eventstore.grants import ADMISSION, AUDIT, MOVE, READ, RUNTIME

COMPONENT = "projections.runs"
STREAM_PREFIXES = tuple(prefix(c) for c in (RUN, STEPS, LEASE))

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
# the phases as steps 4 and 5 named them; step 10 renamed "admission" to "claim"
_STEP4_PHASES = ("recovery", "cancellation", "frontier", "admission")
_STEP4_COLUMNS = tuple(f"{p}_{end}_ms" for p in _STEP4_PHASES for end in ("opens", "closes"))
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
        *(f"ALTER TABLE runs ADD COLUMN {column} {integer}" for column in _STEP4_COLUMNS),
        *(f"ALTER TABLE attempts ADD COLUMN {column} {integer}" for column in GRANT_COLUMNS),
        "UPDATE runs SET "
        + ", ".join(f"{phase}_opens_ms = {UNKNOWN_MS}" for phase in _STEP4_PHASES)
        + " WHERE status = 'running'",
        f"UPDATE attempts SET grant_opens_ms = {UNKNOWN_MS} WHERE status = 'claimed'",
        *(
            f"CREATE INDEX runs_{phase}_opens ON runs ({phase}_opens_ms)"
            f" WHERE {phase}_opens_ms IS NOT NULL"
            for phase in _STEP4_PHASES
        ),
        "CREATE INDEX attempts_grantable ON attempts (claimed_position)"
        " WHERE grant_opens_ms IS NOT NULL",
    ]  # fmt: skip


MIGRATIONS.append({"sqlite": _work_step("INTEGER"), "postgresql": _work_step("BIGINT")})
WORK_STEP = len(MIGRATIONS)  # the step that added the windows: `backfill` fills them

# Step 5: the candidate indexes are ordered by when the work opened, then by key, so a
# page reads only windows that are open (a lease that expires next week, a dormant
# Run's, is past the page's end) instead of walking every Run in id order to find
# the few with work.
_WORK_ORDER = [
    *(f"DROP INDEX runs_{phase}_opens" for phase in _STEP4_PHASES),
    "DROP INDEX attempts_grantable",
    *(
        f"CREATE INDEX runs_{phase}_work ON runs ({phase}_opens_ms, run_id)"
        f" WHERE {phase}_opens_ms IS NOT NULL"
        for phase in _STEP4_PHASES
    ),
    "CREATE INDEX attempts_grant ON attempts (grant_opens_ms, claimed_position)"
    " WHERE grant_opens_ms IS NOT NULL",
]
MIGRATIONS.append({"sqlite": _WORK_ORDER, "postgresql": _WORK_ORDER})
# Step 6: how an Attempt ran (exit code, signal, pid, log location: domain.execution)
# is a column of its own, apart from its output. Attempts folded before it hold the old
# executor record in `output`; `backfill` splits them as a replay would.
_EXECUTION_STEP = ["ALTER TABLE attempts ADD COLUMN execution TEXT"]
MIGRATIONS.append({"sqlite": _EXECUTION_STEP, "postgresql": _EXECUTION_STEP})
EXECUTION_STEP = len(MIGRATIONS)
# Step 7: the Attempts starting or running, by Task, for a metrics scrape
# (`projections.gauges`): a partial index as small as what runs, not the history.
ACTIVE_WHERE = f"status IN ('{ATTEMPT_STARTING}', '{ATTEMPT_RUNNING}')"
_ACTIVE = [f"CREATE INDEX attempts_active ON attempts (task_ref) WHERE {ACTIVE_WHERE}"]
MIGRATIONS.append({"sqlite": _ACTIVE, "postgresql": _ACTIVE})
# Step 8: the Runs per status, kept by triggers on `runs` (every write of the table —
# the append's fold, a rebuild's swap, a backfill — keeps it equal to the table), so a
# scrape reads a handful of rows instead of counting every Run. On PostgreSQL the
# counter rows are written after the append, while its position lock serializes
# appenders anyway, so they add no wait of their own.
_COUNTS_TABLE = "CREATE TABLE run_counts (status TEXT PRIMARY KEY, runs {integer} NOT NULL)"
_COUNTS_FILL = (
    "INSERT INTO run_counts (status, runs) SELECT status, COUNT(*) FROM runs GROUP BY status"
)
_SQLITE_ADD = (
    "INSERT INTO run_counts (status, runs) VALUES (NEW.status, 1) "
    "ON CONFLICT (status) DO UPDATE SET runs = runs + 1;"
)
_SQLITE_REMOVE = "UPDATE run_counts SET runs = runs - 1 WHERE status = OLD.status;"
_COUNTS_SQLITE = [
    _COUNTS_TABLE.format(integer="INTEGER"),
    _COUNTS_FILL,
    f"CREATE TRIGGER runs_count_insert AFTER INSERT ON runs BEGIN {_SQLITE_ADD} END",
    f"CREATE TRIGGER runs_count_delete AFTER DELETE ON runs BEGIN {_SQLITE_REMOVE} END",
    "CREATE TRIGGER runs_count_update AFTER UPDATE OF status ON runs "
    f"WHEN OLD.status IS NOT NEW.status BEGIN {_SQLITE_REMOVE} {_SQLITE_ADD} END",
]
_COUNTS_POSTGRESQL = [
    _COUNTS_TABLE.format(integer="BIGINT"),
    _COUNTS_FILL,
    # the counts beside the table that fired (a rebuild's session has a temp copy of
    # run_counts first on its search_path)
    """CREATE FUNCTION qlflow_count_runs() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        IF TG_OP <> 'INSERT' THEN
            EXECUTE format('UPDATE %I.run_counts SET runs = runs - 1 WHERE status = $1',
                           TG_TABLE_SCHEMA) USING OLD.status;
        END IF;
        IF TG_OP <> 'DELETE' THEN
            EXECUTE format('INSERT INTO %I.run_counts AS c (status, runs) VALUES ($1, 1) '
                           'ON CONFLICT (status) DO UPDATE SET runs = c.runs + 1',
                           TG_TABLE_SCHEMA) USING NEW.status;
        END IF;
        RETURN NULL;
    END $$""",
    "CREATE TRIGGER runs_count_insert AFTER INSERT OR DELETE ON runs "
    "FOR EACH ROW EXECUTE FUNCTION qlflow_count_runs()",
    "CREATE TRIGGER runs_count_update AFTER UPDATE OF status ON runs FOR EACH ROW "
    "WHEN (OLD.status IS DISTINCT FROM NEW.status) EXECUTE FUNCTION qlflow_count_runs()",
]
MIGRATIONS.append({"sqlite": _COUNTS_SQLITE, "postgresql": _COUNTS_POSTGRESQL})
COUNTS_TABLE = "run_counts"
# Step 9: reruns (docs/DESIGN.md "Reruns"): the Run a Run reruns (NULL: none), indexed
# for `runs --rerun-of`; a reused StepRun's origin (JSON {run_id, attempt_id}) and
# the output it reuses (JSON), which its dependents are given.
_RERUN_STEP = [
    "ALTER TABLE runs ADD COLUMN rerun_of TEXT",
    "CREATE INDEX runs_rerun_of ON runs (rerun_of, admitted_at_ms DESC, run_id)"
    " WHERE rerun_of IS NOT NULL",
    "ALTER TABLE step_runs ADD COLUMN reused_from TEXT",
    "ALTER TABLE step_runs ADD COLUMN reused_output TEXT",
]
MIGRATIONS.append({"sqlite": _RERUN_STEP, "postgresql": _RERUN_STEP})
# Step 10: the cycle's phase that claims Attempts is "claim", not "admission" (the word
# of a Run's admission, `rt.start`): its window columns and index take the new name.
_CLAIM_STEP = [
    *(
        f"ALTER TABLE runs RENAME COLUMN admission_{end}_ms TO claim_{end}_ms"
        for end in ("opens", "closes")
    ),
    "DROP INDEX runs_admission_work",
    "CREATE INDEX runs_claim_work ON runs (claim_opens_ms, run_id)"
    " WHERE claim_opens_ms IS NOT NULL",
]
MIGRATIONS.append({"sqlite": _CLAIM_STEP, "postgresql": _CLAIM_STEP})
# Step 11: finished Runs oldest first, for retention (docs/DESIGN.md "Retention")
_FINISHED = [
    "CREATE INDEX runs_finished ON runs (terminal_at_ms, run_id) WHERE terminal_at_ms IS NOT NULL"
]
MIGRATIONS.append({"sqlite": _FINISHED, "postgresql": _FINISHED})
# Step 12: flow control (docs/DESIGN.md "Flow control"). A Run's priority, the slot of
# its Workflow's limit and whether it holds it or waits in its queue; an Attempt's
# lease order (its Run's priority and admission) and the slot of its Task's limit,
# with the instant its lease stops holding it. The candidate index is read in lease
# order; the slots' holders and queues each have an index of their own. Rows of an
# older store get what a replay gives them (their plans bind no flow).
FLOW_RUN_COLUMNS = ("priority", "run_slot", "slot_state")
FLOW_ATTEMPT_COLUMNS = ("priority", "run_admitted_ms", "slot", "slot_until_ms")


def _flow_step(integer: str) -> list[str]:
    return [
        f"ALTER TABLE runs ADD COLUMN priority {integer}",
        "ALTER TABLE runs ADD COLUMN run_slot TEXT",
        "ALTER TABLE runs ADD COLUMN slot_state TEXT",
        f"ALTER TABLE attempts ADD COLUMN priority {integer}",
        f"ALTER TABLE attempts ADD COLUMN run_admitted_ms {integer}",
        "ALTER TABLE attempts ADD COLUMN slot TEXT",
        f"ALTER TABLE attempts ADD COLUMN slot_until_ms {integer}",
        "UPDATE runs SET priority = 0",
        "UPDATE attempts SET priority = 0, run_admitted_ms ="
        " (SELECT r.admitted_at_ms FROM runs r WHERE r.run_id = attempts.run_id)",
        "CREATE INDEX attempts_lease_order ON attempts"
        " (priority DESC, run_admitted_ms, run_id, claimed_position)"
        " WHERE grant_opens_ms IS NOT NULL",
        "CREATE INDEX attempts_slot_holders ON attempts (slot, slot_until_ms)"
        " WHERE slot_until_ms IS NOT NULL",
        "CREATE INDEX runs_slot_queue ON runs (run_slot, priority DESC, admitted_at_ms, run_id)"
        f" WHERE slot_state = '{QUEUED}'",
        f"CREATE INDEX runs_slot_holders ON runs (run_slot) WHERE slot_state = '{HELD}'",
    ]


MIGRATIONS.append({"sqlite": _flow_step("INTEGER"), "postgresql": _flow_step("BIGINT")})
# Step 13: workers (docs/DESIGN.md "Workers"): the host and slots a worker said on the
# grant of an Attempt's lease, the last renewal of that lease while it is held (NULL
# once it ended, so a store upgraded across this step differs from a replay only in
# the leases held then: `backfill` reads those), and the Attempts by their end, for
# the workers seen lately.
_WORKERS_STEP = [
    "ALTER TABLE attempts ADD COLUMN worker_host TEXT",
    "ALTER TABLE attempts ADD COLUMN worker_slots {integer}",
    "ALTER TABLE attempts ADD COLUMN renewed_at_ms {integer}",
    "CREATE INDEX attempts_ended ON attempts (ended_at_ms) WHERE ended_at_ms IS NOT NULL",
]
MIGRATIONS.append(
    {
        dialect: [sql.format(integer=integer) for sql in _WORKERS_STEP]
        for dialect, integer in (("sqlite", "INTEGER"), ("postgresql", "BIGINT"))
    }
)
WORKERS_STEP = len(MIGRATIONS)


TABLES = {
    "runs": ("run_id",),
    "step_runs": ("run_id", "step_key"),
    "attempts": ("attempt_id",),
}
GRANTS = {table: {RUNTIME: MOVE, AUDIT: READ} for table in (*TABLES, COUNTS_TABLE)}
# the database's start guard reads which publication a rerun's source Run bound
# (projections.admission_guard: a same-plan rerun may bind a superseded publication)
GRANTS["runs"] = {**GRANTS["runs"], ADMISSION: READ}

Row = dict[str, Any]
# a stream id is "<family>-<entity id>": run-<run_id>, steps-<run_id>, lease-<attempt_id>
_RUN, _STEPS, _LEASE = RUN, STEPS, LEASE


class _Table:
    """One read-model table as `apply` loads and stores it."""

    def __init__(self, name: str, columns: tuple[str, ...]) -> None:
        self.name = name
        self.columns = columns  # every column, in table order
        self.key = TABLES[name]
        self.key_of: Callable[[Row], Any] = itemgetter(*self.key)  # a str, or a tuple
        self.values: Callable[[Row], tuple[Any, ...]] = itemgetter(*columns)
        self.select_sql = f"SELECT {', '.join(columns)} FROM {name} WHERE"  # + a condition

    def row(self, values: Sequence[Any]) -> Row:
        return dict(zip(self.columns, values, strict=True))

    def differing(
        self, rows: Iterable[Row], loaded: dict[Any, tuple[Any, ...]]
    ) -> list[tuple[tuple[Any, ...], tuple[Any, ...] | None]]:
        """(values, values as stored or None for a new row) of each row that is new or
        differs from `loaded` (key -> values as stored), in key order (a fixed row lock
        order)."""
        found = []
        for row in rows:
            key, values = self.key_of(row), self.values(row)
            stored = loaded.get(key)
            if stored != values:
                found.append((key, values, stored))
        found.sort(key=itemgetter(0))
        return [(values, stored) for _key, values, stored in found]


RUNS = _Table(
    "runs",
    (
        "run_id", "package", "workflow_key", "publication_id", "plan_digest", "admission_key",
        "status", "version", "steps_version", "step_count", "open_steps", "admitted_at_ms",
        "timeout_ms", "deadline_ms", "cancel_requested_at_ms", "cancel_reason", "result_code",
        "error_code", "terminal_at_ms", "params", *WINDOW_COLUMNS, "rerun_of",
        *FLOW_RUN_COLUMNS,
    ),
)  # fmt: skip
STEP_RUNS = _Table(
    "step_runs",
    (
        "run_id", "step_key", "step_run_id", "task_ref", "needs", "status", "epoch",
        "result_code", "live_attempt_id", "attempt_count", "updated_at_ms", "max_attempts",
        "retry_at_ms", "reused_from", "reused_output",
    ),
)  # fmt: skip
ATTEMPTS = _Table(
    "attempts",
    (
        "attempt_id", "run_id", "step_key", "step_run_id", "step_epoch", "attempt_number",
        "task_ref", "status", "claimed_at_ms", "claimed_position", "lease_id", "lease_version",
        "lease_status", "worker_id", "expires_at_ms", "started_at_ms", "ended_at_ms",
        "result_code", "output", *GRANT_COLUMNS, "execution", *FLOW_ATTEMPT_COLUMNS,
        "worker_host", "worker_slots", "renewed_at_ms",
    ),
)  # fmt: skip
