"""Read models of Runs, StepRuns and Attempts (with their current lease), and the
candidate flags the cycle pages over (SPEC §9).

Everything here is a deterministic function of the `run-`, `steps-` and `lease-`
records, so a replay of the log rebuilds identical rows. The candidate flags are
recomputed from a Run's step rows after each batch touching it, which keeps a
dormant Run out of every candidate index: it costs rows and nothing else.
"""

from __future__ import annotations

from collections.abc import Sequence

import orjson

from domain.records import Record

COMPONENT = "projections.runs"
STREAM_PREFIXES = ("run-", "steps-", "lease-")

TERMINAL_STEP = frozenset({"succeeded", "failed", "cancelled", "timed_out", "skipped"})
LIVE_ATTEMPT = frozenset({"claimed", "starting", "running"})

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

TABLES = {
    "runs": ("run_id",),
    "step_runs": ("run_id", "step_key"),
    "attempts": ("attempt_id",),
}


def apply(tx, records: Sequence[Record]) -> None:
    """Fold freshly appended run, step and lease records into the read models."""
    touched: list[str] = []
    for record in records:
        run_id = _apply_one(tx, record)
        if run_id and run_id not in touched:
            touched.append(run_id)
    for run_id in touched:
        _refresh_candidate_flags(tx, run_id)


def _apply_one(tx, record: Record) -> str | None:
    stream = record.stream_id
    if stream.startswith("run-"):
        return _apply_run_event(tx, record)
    if stream.startswith("steps-"):
        run_id = stream[len("steps-") :]
        tx.execute(
            "UPDATE runs SET steps_version = ? WHERE run_id = ? AND steps_version < ?",
            (record.stream_version, run_id, record.stream_version),
        )
        return None
    if stream.startswith("lease-"):
        return _apply_lease_event(tx, record)
    return None


def _apply_run_event(tx, record: Record) -> str:
    run_id = record.stream_id[len("run-") :]
    data = record.data
    kind = record.type
    at_ms = record.metadata.get("at_ms")
    if kind == "workflow.admitted":
        plan = data["plan"]
        timeout = plan.get("timeout_ms")
        admitted = data["admitted_at_ms"]
        steps = plan["steps"]
        tx.execute(
            """INSERT INTO runs (run_id, package, workflow_key, publication_id, plan_digest,
                admission_key, status, version, step_count, open_steps, admitted_at_ms,
                timeout_ms, deadline_ms)
               VALUES (?, ?, ?, ?, ?, ?, 'running', ?, ?, ?, ?, ?, ?)""",
            (
                run_id,
                plan["package"],
                plan["workflow_key"],
                plan["publication_id"],
                plan["plan_digest"],
                data.get("admission_key"),
                record.stream_version,
                len(steps),
                len(steps),
                admitted,
                timeout,
                admitted + timeout if timeout is not None else None,
            ),
        )
        for step in steps:
            tx.execute(
                """INSERT INTO step_runs (run_id, step_key, step_run_id, task_ref, needs,
                    status, epoch, updated_at_ms) VALUES (?, ?, ?, ?, ?, ?, 0, ?)""",
                (
                    run_id,
                    step["key"],
                    step["step_run_id"],
                    step["task_ref"],
                    ",".join(step["needs"]),
                    step["initial_status"],
                    admitted,
                ),
            )
        return run_id

    tx.execute("UPDATE runs SET version = ? WHERE run_id = ?", (record.stream_version, run_id))
    if kind == "step.created":
        tx.execute(
            "UPDATE step_runs SET status = ?, epoch = ? WHERE run_id = ? AND step_key = ?",
            (data["status"], data["epoch"], run_id, data["step_key"]),
        )
    elif kind.startswith("step."):
        to = data["to"]
        closes = to in TERMINAL_STEP and data["from"] not in TERMINAL_STEP
        tx.execute(
            """UPDATE step_runs SET status = ?, epoch = ?, result_code = ?, updated_at_ms = ?
               WHERE run_id = ? AND step_key = ?""",
            (to, data["epoch"], data.get("result_code"), at_ms, run_id, data["step_key"]),
        )
        if closes:
            tx.execute("UPDATE runs SET open_steps = open_steps - 1 WHERE run_id = ?", (run_id,))
    elif kind == "attempt.claimed":
        admission = data["admission"]
        tx.execute(
            """INSERT INTO attempts (attempt_id, run_id, step_key, step_run_id, step_epoch,
                attempt_number, task_ref, status, claimed_at_ms, claimed_position)
               VALUES (?, ?, ?, ?, ?, ?, ?, 'claimed', ?, ?)""",
            (
                data["attempt_id"],
                run_id,
                data["step_key"],
                data["step_run_id"],
                data["step_epoch"],
                data["attempt_number"],
                admission["task_ref"],
                at_ms,
                record.global_position,
            ),
        )
        tx.execute(
            """UPDATE step_runs SET live_attempt_id = ?, attempt_count = attempt_count + 1
               WHERE run_id = ? AND step_key = ?""",
            (data["attempt_id"], run_id, data["step_key"]),
        )
    elif kind in ("attempt.starting", "attempt.running"):
        status = kind.split(".", 1)[1]
        tx.execute(
            """UPDATE attempts SET status = ?,
                started_at_ms = COALESCE(started_at_ms, ?) WHERE attempt_id = ?""",
            (status, at_ms, data["attempt_id"]),
        )
    elif kind.startswith("attempt."):
        status = kind.split(".", 1)[1]
        output = data.get("output")
        tx.execute(
            """UPDATE attempts SET status = ?, result_code = ?, ended_at_ms = ?, output = ?
               WHERE attempt_id = ?""",
            (
                status,
                data.get("result_code"),
                at_ms,
                None if output is None else _json(output),
                data["attempt_id"],
            ),
        )
        tx.execute(
            """UPDATE step_runs SET live_attempt_id = NULL
               WHERE run_id = ? AND live_attempt_id = ?""",
            (run_id, data["attempt_id"]),
        )
    elif kind == "workflow.cancel_requested":
        tx.execute(
            "UPDATE runs SET cancel_requested_at_ms = ?, cancel_reason = ? WHERE run_id = ?",
            (data["requested_at_ms"], data["reason"], run_id),
        )
    elif kind.startswith("workflow."):
        tx.execute(
            """UPDATE runs SET status = ?, result_code = ?, error_code = ?, terminal_at_ms = ?
               WHERE run_id = ?""",
            (kind.split(".", 1)[1], data.get("result_code"), data.get("error_code"), at_ms, run_id),
        )
    return run_id


def _apply_lease_event(tx, record: Record) -> str | None:
    attempt_id = record.stream_id[len("lease-") :]
    data = record.data
    kind = record.type
    if kind == "lease.granted":
        tx.execute(
            """UPDATE attempts SET lease_id = ?, lease_version = ?, lease_status = 'leased',
                worker_id = ?, expires_at_ms = ? WHERE attempt_id = ?""",
            (
                data["lease_id"],
                record.stream_version,
                data["worker_id"],
                data["expires_at_ms"],
                attempt_id,
            ),
        )
    elif kind == "lease.renewed":
        tx.execute(
            "UPDATE attempts SET lease_version = ?, expires_at_ms = ? WHERE attempt_id = ?",
            (record.stream_version, data["expires_at_ms"], attempt_id),
        )
    else:
        status = "completed" if kind == "lease.completed" else "released"
        tx.execute(
            "UPDATE attempts SET lease_version = ?, lease_status = ? WHERE attempt_id = ?",
            (record.stream_version, status, attempt_id),
        )
    rows = tx.query("SELECT run_id FROM attempts WHERE attempt_id = ?", (attempt_id,))
    return rows[0][0] if rows else None


def _refresh_candidate_flags(tx, run_id: str) -> None:
    """Recompute which cycle phases have work on this Run, from its own rows only."""
    runs = tx.query(
        "SELECT status, cancel_requested_at_ms, open_steps FROM runs WHERE run_id = ?",
        (run_id,),
    )
    if not runs:
        return
    status, cancel_at, open_steps = runs[0]
    if status != "running":
        tx.execute(
            """UPDATE runs SET needs_frontier = 0, needs_admission = 0, needs_cancellation = 0
               WHERE run_id = ?""",
            (run_id,),
        )
        return
    rows = tx.query(
        """SELECT s.step_key, s.needs, s.status, s.live_attempt_id, a.status, a.lease_status
           FROM step_runs s LEFT JOIN attempts a ON a.attempt_id = s.live_attempt_id
           WHERE s.run_id = ?""",
        (run_id,),
    )
    status_of = {row[0]: row[2] for row in rows}
    frontier = open_steps == 0
    admission = False
    cancellation = open_steps == 0
    for _key, needs, step_status, live_attempt, attempt_status, lease_status in rows:
        if step_status == "pending":
            cancellation = True
            if all(status_of[n] in TERMINAL_STEP for n in needs.split(",") if n):
                frontier = True
        elif step_status == "ready":
            if live_attempt is None:
                admission = True
                cancellation = True
            elif attempt_status == "claimed" and lease_status != "leased":
                cancellation = True
        elif step_status in ("lost", "waiting_approval"):
            cancellation = True
            frontier = frontier or step_status == "lost"
    tx.execute(
        """UPDATE runs SET needs_frontier = ?, needs_admission = ?, needs_cancellation = ?
           WHERE run_id = ?""",
        (int(frontier), int(admission), int(cancellation and cancel_at is not None), run_id),
    )


def _json(value) -> str:
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()
