"""Event store overhead against the raw driver, in the same run (issue 2).

    python -m bench.eventstore [--pg URL] [--streams 2000]

Writes `--streams` streams of 10 events (~200-byte payloads), one transaction per
stream, through the store and through plain sqlite3 / psycopg code doing the same
rows with the same CAS statement; then reads everything back both ways. The two
sides run interleaved in chunks so drift (page cache, checkpoints, other load) hits
both alike. Both encode payloads before BEGIN, as store.append does, so "lock hold" is
BEGIN to COMMIT on both sides. read_all returns Records, so the raw read decodes its
rows into Records too.
Prints a table and writes bench/results/eventstore.json. The PostgreSQL part runs
when --pg or QLFLOW_TEST_PG_URL is given, in fresh schemas dropped afterwards.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field

import orjson
import psycopg
from rich.console import Console
from rich.table import Table

from bench.output import results_path
from domain.records import NewEvent, Record, StreamAppend
from eventstore import open_store
from eventstore.url import with_search_path
from eventstore.validation import encode_appends

EVENTS_PER_STREAM = 10
CHUNK = 50  # streams per turn: the sides alternate so the machine's noise hits both alike
READ_PASSES = 5  # alternating full reads per side; the median counts
RESULTS = results_path("eventstore")
TARGETS = {
    ("sqlite", "append"): 0.9,
    ("sqlite", "read_all"): 0.8,
    ("postgresql", "append"): 0.8,
}
_COLUMNS = "global_position, event_id, stream_id, stream_version, type, data, metadata"
_RAW_SQLITE_SCHEMA = (
    "CREATE TABLE streams (stream_id TEXT PRIMARY KEY, version INTEGER NOT NULL) WITHOUT ROWID",
    "CREATE TABLE events (global_position INTEGER PRIMARY KEY, event_id TEXT NOT NULL UNIQUE,"
    " stream_id TEXT NOT NULL, stream_version INTEGER NOT NULL, type TEXT NOT NULL,"
    " data TEXT NOT NULL, metadata TEXT NOT NULL, UNIQUE (stream_id, stream_version))",
)
_RAW_PG_SCHEMA = (
    'CREATE TABLE streams (stream_id TEXT COLLATE "C" PRIMARY KEY, version BIGINT NOT NULL)',
    "CREATE TABLE events (global_position BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,"
    ' event_id TEXT COLLATE "C" NOT NULL UNIQUE, stream_id TEXT COLLATE "C" NOT NULL,'
    " stream_version BIGINT NOT NULL, type TEXT NOT NULL, data TEXT NOT NULL,"
    " metadata TEXT NOT NULL, UNIQUE (stream_id, stream_version))",
)


@dataclass
class Side:
    """Timings of one side (store or raw) of one dialect."""

    append_seconds: float = 0.0
    holds: list[float] = field(default_factory=list)
    read_seconds: list[float] = field(default_factory=list)
    events_read: int = 0


def workload(streams: int) -> list[StreamAppend]:
    """`streams` new streams of EVENTS_PER_STREAM events, ~200 bytes of data each."""
    appends = []
    for s in range(streams):
        stream_id = f"run-bench{s:06d}"
        events = tuple(
            NewEvent(
                event_id=f"wbe:{s:06d}{v:04d}{'0' * 22}",
                type="step.succeeded",  # a known type: the append checks its shape
                data={
                    "step_run_id": f"srn:{s:06d}{v:04d}",
                    "step_key": f"step-{v:03d}",
                    "from": "running",
                    "to": "succeeded",
                    "epoch": v,
                    "attempt": v,
                    "output": "x" * 120,
                    "exit_code": 0,
                    "duration_ms": 1234 + v,
                },
                metadata={
                    "at_ms": 1_700_000_000_000 + s * 10 + v,
                    "actor": "bench",
                    "causation_id": f"wbc:{s:06d}{v:04d}",
                    "correlation_id": stream_id,
                },
            )
            for v in range(1, EVENTS_PER_STREAM + 1)
        )
        appends.append(StreamAppend(stream_id, 0, events))
    return appends


def _encode(value) -> str:
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()


def _event_rows(append: StreamAppend) -> list[tuple]:
    return [
        (e.event_id, append.stream_id, v, e.type, _encode(e.data), _encode(e.metadata))
        for v, e in enumerate(append.events, start=1)
    ]


def _to_record(row: tuple) -> Record:
    position, event_id, stream_id, version, event_type, data, metadata = row
    return Record(
        event_id,
        stream_id,
        version,
        position,
        event_type,
        orjson.loads(data),
        orjson.loads(metadata),
    )


def run_store(url: str, side: Side, **options):
    """The store side: returns (append_chunk, read, close)."""
    store = open_store(url, **options)

    def append_chunk(chunk: Sequence[StreamAppend]) -> None:
        start = time.perf_counter()
        for append in chunk:
            batch = encode_appends([append])  # what store.append does before BEGIN
            t0 = time.perf_counter()
            with store.transaction() as tx:
                tx.append_encoded(batch)
            side.holds.append(time.perf_counter() - t0)
        side.append_seconds += time.perf_counter() - start

    def read() -> None:
        start = time.perf_counter()
        records = store.read_all()
        side.read_seconds.append(time.perf_counter() - start)
        side.events_read = len(records)

    return append_chunk, read, store.close


def raw_sqlite(path: str, synchronous: str, side: Side):
    """Plain sqlite3 doing the same rows: BEGIN IMMEDIATE, the CAS insert, executemany, COMMIT."""
    import sqlite3

    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute(f"PRAGMA synchronous={synchronous}")
    for statement in _RAW_SQLITE_SCHEMA:
        conn.execute(statement)

    def append_chunk(chunk: Sequence[StreamAppend]) -> None:
        start = time.perf_counter()
        for append in chunk:
            rows = _event_rows(append)
            t0 = time.perf_counter()
            conn.execute("BEGIN IMMEDIATE")
            cursor = conn.execute(
                "INSERT INTO streams (stream_id, version) VALUES (?, ?) "
                "ON CONFLICT (stream_id) DO NOTHING",
                (append.stream_id, len(append.events)),
            )
            if cursor.rowcount != 1:
                raise RuntimeError("raw CAS failed")
            conn.executemany(
                "INSERT INTO events (event_id, stream_id, stream_version, type, data, metadata) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                rows,
            )
            conn.execute("COMMIT")
            side.holds.append(time.perf_counter() - t0)
        side.append_seconds += time.perf_counter() - start

    def read() -> None:
        start = time.perf_counter()
        rows = conn.execute(f"SELECT {_COLUMNS} FROM events ORDER BY global_position").fetchall()
        records = [_to_record(row) for row in rows]
        side.read_seconds.append(time.perf_counter() - start)
        side.events_read = len(records)

    return append_chunk, read, conn.close


def raw_postgres(url: str, side: Side):
    """Plain psycopg doing the same rows: the CAS insert, executemany, commit."""
    conn = psycopg.connect(url)
    for statement in _RAW_PG_SCHEMA:
        conn.execute(statement)
    conn.commit()

    def append_chunk(chunk: Sequence[StreamAppend]) -> None:
        start = time.perf_counter()
        with conn.cursor() as cursor:
            for append in chunk:
                rows = _event_rows(append)
                t0 = time.perf_counter()
                cursor.execute(
                    "INSERT INTO streams (stream_id, version) VALUES (%s, %s) "
                    "ON CONFLICT (stream_id) DO NOTHING",
                    (append.stream_id, len(append.events)),
                )
                if cursor.rowcount != 1:
                    raise RuntimeError("raw CAS failed")
                cursor.executemany(
                    "INSERT INTO events (event_id, stream_id, stream_version, type, data, metadata)"
                    " VALUES (%s, %s, %s, %s, %s, %s)",
                    rows,
                )
                conn.commit()
                side.holds.append(time.perf_counter() - t0)
        side.append_seconds += time.perf_counter() - start

    def read() -> None:
        start = time.perf_counter()
        rows = conn.execute(f"SELECT {_COLUMNS} FROM events ORDER BY global_position").fetchall()
        conn.commit()
        records = [_to_record(row) for row in rows]
        side.read_seconds.append(time.perf_counter() - start)
        side.events_read = len(records)

    return append_chunk, read, conn.close


def compare(store_side, raw_side, appends: Sequence[StreamAppend]) -> None:
    """Append on both sides in alternating chunks, then read everything back alternately."""
    store_append, store_read, store_close = store_side
    raw_append, raw_read, raw_close = raw_side
    chunks = [appends[i : i + CHUNK] for i in range(0, len(appends), CHUNK)]
    try:
        for chunk in chunks:
            raw_append(chunk)
            store_append(chunk)
        for _ in range(READ_PASSES):
            raw_read()
            store_read()
    finally:
        store_close()
        raw_close()


def summarise(dialect: str, store: Side, raw: Side, events: int) -> dict:
    def p(values: list[float], q: int) -> float:
        return statistics.quantiles(values, n=100)[q - 1] * 1000

    result = {
        "events": events,
        "append_events_per_s": {
            "qlflow": events / store.append_seconds,
            "raw": events / raw.append_seconds,
        },
        "read_all_events_per_s": {
            "qlflow": store.events_read / statistics.median(store.read_seconds),
            "raw": raw.events_read / statistics.median(raw.read_seconds),
        },
        "lock_hold_ms": {
            "qlflow": {"p50": p(store.holds, 50), "p95": p(store.holds, 95)},
            "raw": {"p50": p(raw.holds, 50), "p95": p(raw.holds, 95)},
        },
    }
    result["append_ratio"] = raw.append_seconds / store.append_seconds
    result["read_all_ratio"] = statistics.median(raw.read_seconds) / statistics.median(
        store.read_seconds
    )
    result["targets"] = {
        metric: {"min_ratio": target, "met": result[f"{metric}_ratio"] >= target}
        for (d, metric), target in TARGETS.items()
        if d == dialect
    }
    return result


def bench_sqlite(appends: Sequence[StreamAppend], synchronous: str) -> dict:
    with tempfile.TemporaryDirectory(prefix="qlflow-bench-") as tmp:
        store, raw = Side(), Side()
        compare(
            run_store(f"sqlite:///{tmp}/store.db", store, synchronous=synchronous),
            raw_sqlite(f"{tmp}/raw.db", synchronous, raw),
            appends,
        )
    return summarise("sqlite", store, raw, len(appends) * EVENTS_PER_STREAM) | {
        "synchronous": synchronous
    }


def bench_postgres(appends: Sequence[StreamAppend], url: str) -> dict:
    store_schema, raw_schema = f"bench_{uuid.uuid4().hex}", f"bench_raw_{uuid.uuid4().hex}"
    with psycopg.connect(url, autocommit=True) as admin:
        admin.execute(f"CREATE SCHEMA {store_schema}")
        admin.execute(f"CREATE SCHEMA {raw_schema}")
    try:
        store, raw = Side(), Side()
        compare(
            run_store(with_search_path(url, store_schema), store),
            raw_postgres(with_search_path(url, raw_schema), raw),
            appends,
        )
    finally:
        with psycopg.connect(url, autocommit=True) as admin:
            admin.execute(f"DROP SCHEMA {store_schema} CASCADE")
            admin.execute(f"DROP SCHEMA {raw_schema} CASCADE")
    return summarise("postgresql", store, raw, len(appends) * EVENTS_PER_STREAM)


def _verdict(targets: dict, metric: str) -> str:
    if metric not in targets:
        return "—"
    mark = "[green]met[/]" if targets[metric]["met"] else "[red]MISSED[/]"
    return f"≥ {targets[metric]['min_ratio']:.1f}× {mark}"


def render(results: dict, console: Console) -> None:
    table = Table(
        title=f"event store vs raw driver ({results['streams']} streams × 10 events, "
        "one transaction each)",
        caption="ratio = raw time / qlflow time (1.00× = as fast as the raw driver)",
    )
    for column in ("dialect", "metric", "qlflow", "raw", "ratio", "target"):
        table.add_column(column, justify="left" if column in ("dialect", "metric") else "right")
    for dialect, r in results["dialects"].items():
        a, rd, h = r["append_events_per_s"], r["read_all_events_per_s"], r["lock_hold_ms"]
        table.add_row(
            dialect,
            "append events/s",
            f"{a['qlflow']:,.0f}",
            f"{a['raw']:,.0f}",
            f"{r['append_ratio']:.2f}×",
            _verdict(r["targets"], "append"),
        )
        table.add_row(
            dialect,
            "read_all events/s",
            f"{rd['qlflow']:,.0f}",
            f"{rd['raw']:,.0f}",
            f"{r['read_all_ratio']:.2f}×",
            _verdict(r["targets"], "read_all"),
        )
        for q in ("p50", "p95"):
            table.add_row(
                dialect,
                f"lock hold {q} ms",
                f"{h['qlflow'][q]:.3f}",
                f"{h['raw'][q]:.3f}",
                f"{h['raw'][q] / h['qlflow'][q]:.2f}×",
                "—",
            )
    console.print(table)


def main(argv: Sequence[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(prog="python -m bench.eventstore", description=__doc__)
    parser.add_argument("--pg", default=os.environ.get("QLFLOW_TEST_PG_URL"), help="PostgreSQL URL")
    parser.add_argument("--streams", type=int, default=2000)
    parser.add_argument("--synchronous", default="FULL", help="SQLite synchronous level")
    parser.add_argument("--smoke", action="store_true", help="20 streams: does it still run")
    args = parser.parse_args(argv)
    if args.smoke:
        args.streams = 20
    appends = workload(args.streams)
    results: dict = {
        "streams": args.streams,
        "events_per_stream": EVENTS_PER_STREAM,
        "dialects": {},
    }
    results["dialects"]["sqlite"] = bench_sqlite(appends, args.synchronous.upper())
    if args.pg:
        results["dialects"]["postgresql"] = bench_postgres(appends, args.pg)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_bytes(orjson.dumps(results, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS))
    console = Console()
    render(results, console)
    console.print(f"written {RESULTS}")
    return results


if __name__ == "__main__":
    main()
