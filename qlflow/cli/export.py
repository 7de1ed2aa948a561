"""`qlflow export --to audit.db`: the event log, the read models and the step logs of
any store (SQLite or PostgreSQL) copied into a fresh SQLite database for auditors —
tables with primary and foreign keys, indexes, and full-text search on event types
and log text — ready for Datasette or `sqlite-utils query`.

sqlite-utils does the writing. It is imported by this command only: it pulls numpy
in where numpy is installed, which no runtime, worker or edge host should pay for.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import orjson
import typer

from eventstore import logs as log_store
from qlflow.cli.app import ADMINISTER, JsonOption, app, wants_json
from qlflow.cli.exits import CliError
from qlflow.cli.opening import opened, redact
from qlflow.cli.output import stdout_console, write_json
from qlflow.cli.progress import replay_progress
from qlflow.cli.times import TIME_HELP, optional_time, when
from qlflow.clock import wall_clock_ms
from qlflow.export_layout import EVENT_COLUMNS, event_row
from qlflow.runtime import Runtime

if TYPE_CHECKING:
    from sqlite_utils import Database

BATCH = 2000
FORMAT = "qlflow audit export 1"
# the read models, with their keys and what they point at (table, column -> table, column)
READ_MODELS: dict[str, tuple[str, ...]] = {
    "runs": ("run_id",),
    "step_runs": ("run_id", "step_key"),
    "attempts": ("attempt_id",),
    "publications": ("publication_id",),
    "publishers": ("publisher",),
    "admission_receipts": ("receipt_stream",),
}
FOREIGN_KEYS = (
    ("step_runs", "run_id", "runs", "run_id"),
    ("attempts", "run_id", "runs", "run_id"),
    ("admission_receipts", "run_id", "runs", "run_id"),
    ("runs", "publication_id", "publications", "publication_id"),
    ("events", "run_id", "runs", "run_id"),
    ("log_chunks", "attempt_id", "attempts", "attempt_id"),
    ("log_attempts", "attempt_id", "attempts", "attempt_id"),
)
INDEXES = (
    ("events", ("stream_id", "stream_version")),
    ("events", ("type",)),
    ("events", ("at_ms",)),
    ("events", ("run_id",)),
    ("runs", ("admitted_at_ms",)),
    ("runs", ("status",)),
    ("runs", ("package", "workflow_key")),
    ("attempts", ("run_id", "step_key")),
    ("log_chunks", ("at_ms",)),
)
# a filter by admission time, for the tables that belong to a Run
_BY_RUN = {
    "runs": "admitted_at_ms >= ?",
    "step_runs": "run_id IN (SELECT run_id FROM runs WHERE admitted_at_ms >= ?)",
    "attempts": "run_id IN (SELECT run_id FROM runs WHERE admitted_at_ms >= ?)",
    "admission_receipts": "admitted_at_ms >= ?",
}


@app.command(
    rich_help_panel=ADMINISTER,
    epilog="Examples: [bold]qlflow export --to audit.db[/bold], then [bold]datasette "
    "audit.db[/bold] or [bold]sqlite-utils search audit.db log_chunks 'disk on fire'"
    "[/bold]; [bold]qlflow --db postgresql://... export --to last-week.db --since 7d[/bold]",
)
def export(
    ctx: typer.Context,
    to: Annotated[Path, typer.Option("--to", metavar="FILE", help="The SQLite file to write.")],
    since: Annotated[
        str | None,
        typer.Option(
            metavar="TIME", help=f"Only events, Runs and logs from this time on: {TIME_HELP}."
        ),
    ] = None,
    replace: Annotated[
        bool, typer.Option("--replace", help="Overwrite FILE if it exists.")
    ] = False,
    json_out: JsonOption = False,
) -> None:
    """Write the event log, the read models and the step logs into a fresh SQLite
    database for audit (Datasette, sqlite-utils), from either store."""
    now = wall_clock_ms()
    since_ms = optional_time("--since", since, now)
    target = to.expanduser().resolve()
    if target.exists() and not replace:
        raise CliError(f"{target} exists; give --replace to overwrite it")
    if not target.parent.is_dir():
        raise CliError(f"folder {target.parent} does not exist")
    as_json = wants_json(ctx, json_out)
    partial = target.with_name(f".{target.name}.{os.getpid()}.partial")
    partial.unlink(missing_ok=True)
    with opened(ctx) as rt:
        try:
            counts = _write(rt, partial, since_ms, now, progress=not as_json)
        except BaseException:
            partial.unlink(missing_ok=True)
            raise
    os.replace(partial, target)
    if as_json:
        write_json({"to": str(target), "since_ms": since_ms, "tables": counts})
        return
    console = stdout_console()
    scope = f" since {when(since_ms, now)}" if since_ms is not None else ""
    console.print(f"exported{scope} to {target}:", soft_wrap=True)
    for table, rows in counts.items():
        console.print(f"  {table:<20} {rows:>9} rows")
    console.print(f"try: sqlite-utils tables {target} --counts; datasette {target}")


def _write(
    rt: Runtime, path: Path, since_ms: int | None, now_ms: int, *, progress: bool
) -> dict[str, int]:
    import sqlite_utils  # only here: it pulls numpy in (see the module docstring)

    db = sqlite_utils.Database(path)
    db.execute("PRAGMA journal_mode = WAL")
    counts: dict[str, int] = {}
    for table, key in READ_MODELS.items():
        counts[table] = _copy_table(db, rt, table, key, since_ms)
    run_of_attempt: dict[str, str] = dict(rt.store.query("SELECT attempt_id, run_id FROM attempts"))
    head = rt.store.head_position()
    with replay_progress("exporting events", enabled=progress) as report:
        counts["events"] = _insert(
            db, "events", ("global_position",), _events(rt, since_ms, run_of_attempt, head, report)
        )
    counts["log_attempts"] = _insert(
        db,
        "log_attempts",
        ("attempt_id",),
        (_state_row(s) for s in log_store.all_states(rt.store) if _wanted(s.last_at_ms, since_ms)),
        columns=_STATE_COLUMNS,
    )
    counts["log_chunks"] = _insert(
        db,
        "log_chunks",
        ("attempt_id", "seq"),
        (_chunk_row(c) for c in log_store.iter_chunks(rt.store) if _wanted(c.at_ms, since_ms)),
        columns=_CHUNK_COLUMNS,
    )
    for table, column, other, other_column in FOREIGN_KEYS:
        db[table].add_foreign_key(column, other, other_column, ignore=True)  # type: ignore[union-attr]
    for table, columns in INDEXES:
        db[table].create_index(columns, if_not_exists=True)  # type: ignore[union-attr]
    db["events"].enable_fts(["type", "stream_id"], create_triggers=True)  # type: ignore[union-attr]
    db["log_chunks"].enable_fts(["text"], create_triggers=True)  # type: ignore[union-attr]
    db["export_info"].insert(  # type: ignore[union-attr]
        {
            "format": FORMAT,
            "source": redact(rt.url),
            "exported_at_ms": now_ms,
            "since_ms": since_ms,
            "head_position": head,
        }
    )
    db.execute("PRAGMA journal_mode = DELETE")  # one file to hand over
    db.close()
    return counts


def _copy_table(
    db: Database, rt: Runtime, table: str, key: tuple[str, ...], since_ms: int | None
) -> int:
    """A read model as it is, every column, in key order (the Runs' since `since_ms`)."""
    where = ""
    params: list[Any] = []
    if since_ms is not None and table in _BY_RUN:
        where, params = f" WHERE {_BY_RUN[table]}", [since_ms]
    with rt.store.session() as session:
        cursor = session.execute(f"SELECT * FROM {table} WHERE 1 = 0")
        columns = tuple(d[0] for d in cursor.description)
    rows = rt.store.query(
        f"SELECT {', '.join(columns)} FROM {table}{where} ORDER BY {', '.join(key)}", params
    )
    return _insert(db, table, key, (dict(zip(columns, r, strict=True)) for r in rows), columns)


def _events(
    rt: Runtime,
    since_ms: int | None,
    run_of_attempt: dict[str, str],
    head: int,
    report: Any,
) -> Iterator[dict[str, Any]]:
    done = 0
    for record in rt.store.iter_all(0, BATCH):
        if record.global_position > head:
            return
        done += 1
        if report is not None and done % BATCH == 0:
            report(record.global_position, head)
        metadata = record.metadata
        if not _wanted(metadata.get("at_ms"), since_ms):
            continue
        yield event_row(
            global_position=record.global_position,
            event_id=record.event_id,
            stream_id=record.stream_id,
            stream_version=record.stream_version,
            type=record.type,
            metadata=metadata,
            data_json=orjson.dumps(record.data).decode(),
            metadata_json=orjson.dumps(metadata).decode(),
            run_of_attempt=run_of_attempt,
        )
    if report is not None:
        report(head, head)


_CHUNK_COLUMNS = ("attempt_id", "seq", "at_ms", "stream", "text", "bytes")
_STATE_COLUMNS = (
    "attempt_id",
    "next_seq",
    "head_bytes",
    "tail_bytes",
    "dropped_bytes",
    "marker_seq",
    "first_at_ms",
    "last_at_ms",
)


def _chunk_row(chunk: log_store.Chunk) -> dict[str, Any]:
    return {
        "attempt_id": chunk.attempt_id,
        "seq": chunk.seq,
        "at_ms": chunk.at_ms,
        "stream": chunk.stream,
        "text": chunk.data.decode("utf-8", "replace"),
        "bytes": chunk.data,
    }


def _state_row(state: log_store.LogState) -> dict[str, Any]:
    return {name: getattr(state, name) for name in _STATE_COLUMNS}


def _wanted(at_ms: int | None, since_ms: int | None) -> bool:
    return since_ms is None or (at_ms is not None and at_ms >= since_ms)


def _insert(
    db: Database,
    table: str,
    key: tuple[str, ...],
    rows: Iterable[dict[str, Any]],
    columns: Sequence[str] | None = None,
) -> int:
    """Create `table` (typed from `EVENT_COLUMNS` or from its rows) and insert `rows`
    in batches; returns how many."""
    counted = _Counted(rows)
    target = db[table]
    if table == "events":
        target.create(EVENT_COLUMNS, pk="global_position", not_null={"event_id", "type"})  # type: ignore[union-attr]
    target.insert_all(counted, pk=key[0] if len(key) == 1 else key, batch_size=BATCH)  # type: ignore[union-attr]
    if not db[table].exists() and columns is not None:
        db[table].create(  # type: ignore[union-attr]
            {column: str for column in columns}, pk=key[0] if len(key) == 1 else key
        )
    return counted.count


class _Counted:
    """An iterator that counts what passes through it."""

    def __init__(self, rows: Iterable[dict[str, Any]]) -> None:
        self._rows = iter(rows)
        self.count = 0

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return self

    def __next__(self) -> dict[str, Any]:
        row = next(self._rows)
        self.count += 1
        return row
