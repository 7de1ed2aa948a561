"""Rebuild the read models from the event log, beside the live ones, then swap.

How the fresh copy is built. The store's replay session (`store.replay_session()`,
see eventstore.replay) is a private connection on which every projection table has
an empty copy (made from the modules' own MIGRATIONS) shadowing the live table of
the same name. So the projection modules' own folds, run on that session, write the
fresh copy, while every other connection (the runtime's, other replicas') still sees
only the live tables.

A module's fold here is its `Replay(tx, insert)` if it has one, else its `apply`; a
`Replay` whose `folds_nothing` is true (snapshots) is handed no records at all. A
`Replay` folds batch after batch (`apply(records)`) like `apply` does, but may hold
rows in memory between batches as long as it writes them all by `flush()`; `insert`
adds new rows to a copy in bulk (the session's `insert`). The log is read once and
each document decoded at most once: a fold with `apply_rows` is handed the batch's
stored rows whole, with the function that makes a record of one (`record_of`), and
makes records only of the rows it reads as records; the others are handed records of
their categories' rows, sorted out in one pass, with `data` decoded and `metadata`
decoded on first use (docs/DESIGN.md, "Rebuild").

Replay runs in batches, one short read transaction each, holding no write lock, so
the runtime keeps working meanwhile. A failure or a kill at any point before the swap
leaves the live tables untouched: they were never written, and the copies vanish
with the session.

The swap takes the append lock once, at the end (`session.exclusive()`): no append is
in flight and none can start. Under that lock the events appended since the replay's
last batch (the tail) are folded into the copy, and then every live table is made
equal to its copy (`session.swap_in`), in that one transaction; a rebuild of correct
read models writes nothing. Readers see the old rows or the new rows, never a mix.
"""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Any

from domain import streams
from domain.errors import CorruptionError, InvalidInput, SchemaError
from domain.records import Record
from eventstore.api import EventStore, ReplaySession, Row, Transaction
from eventstore.replay import LazyRecord
from projections import registry, snapshots
from projections.contract import Insert, Projection, Replayer
from projections.log_check import DOCUMENT, LogCheck, check_log

Progress = Callable[[int, int], None]
"""`progress(events_done, events_total)`, called after each replayed batch."""

DEFAULT_BATCH = 5000


@dataclass(frozen=True, slots=True)
class RebuildSummary:
    """What a rebuild did: events replayed (`tail_events` of them inside the swap),
    the log position the new read models reflect, and the rows of each table."""

    events: int
    tail_events: int
    position: int
    tables: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def events_per_second(self) -> float:
        return self.events / self.seconds if self.seconds > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "events_per_second": self.events_per_second}


def rebuild(
    store: EventStore, progress: Progress | None = None, *, batch: int = DEFAULT_BATCH
) -> RebuildSummary:
    """Replay the whole log into fresh read models and swap them in atomically."""
    check_batch(batch)
    started = time.perf_counter()
    registry.migrate_all(store)
    with ReplayCopy.open(store) as copy:
        try:
            copy.replay(progress, batch)
        # a record no fold can read: undecodable JSON (orjson's error is a ValueError),
        # or a document without what its type needs (a KeyError or TypeError in a fold)
        except (ValueError, KeyError, TypeError, CorruptionError) as exc:
            raise _broken_log(copy, exc) from exc
        replayed = copy.events
        with copy.exclusive():
            copy.catch_up()
            rows = copy.swap()
            # snapshots are dropped, not rebuilt: the next appends write them again
            copy.tx.execute(f"DELETE FROM {copy.live(snapshots.TABLE)}")
    return RebuildSummary(
        events=copy.events,
        tail_events=copy.events - replayed,
        position=copy.position,
        tables=rows,
        seconds=time.perf_counter() - started,
    )


def _broken_log(copy: ReplayCopy, error: Exception) -> Exception:
    """CorruptionError naming the records the replay could not read (or `error` itself
    when the log check finds none)."""
    with copy.snapshot():
        problems = check_log(copy.tx, copy.live("events"), copy.live("streams"))
    broken = [problem for problem in problems if problem.kind == DOCUMENT]
    if not broken:
        return error
    shown = 10
    more = f" and {len(broken) - shown} more" if len(broken) > shown else ""
    return CorruptionError(
        f"the log has {len(broken)} record(s) no replay can read, nothing was rebuilt: "
        + "; ".join(problem.line() for problem in broken[:shown])
        + more
        + " (qlflow verify lists every problem)"
    )


def projection_tables() -> dict[str, tuple[str, ...]]:
    """Every read-model table with its key columns, over all projection modules."""
    tables: dict[str, tuple[str, ...]] = {}
    for module in registry.modules():
        tables.update(module.TABLES)
    return tables


class ReplayCopy:
    """Fresh read models built on a private connection, shadowing the live tables.

    `tx` is a store Transaction on that connection: its `execute`/`query` reach the
    copies through unqualified names; `live(table)` and `copy(table)` give qualified
    names of either side."""

    def __init__(self, session: ReplaySession) -> None:
        self._session = session
        self.tx: Transaction = session.tx
        self.tables = projection_tables()
        self.position = 0
        self.events = 0
        self._total = 0  # the log's head as last seen (progress)
        self.check: LogCheck | None = None  # verify's: the log checked as it is read
        self.failure: Exception | None = None  # what stopped the folds, under a check
        folds = [
            (module.STREAM_PREFIXES, fold)
            for module in registry.modules()
            if not getattr(
                fold := _replayer(module, session.tx, session.insert), "folds_nothing", False
            )
        ]
        for prefixes, _fold in folds:
            for found in prefixes:
                if found != streams.prefix(streams.category(found)):
                    raise SchemaError(f"stream prefix {found!r} is not a whole category's")
        # (fold, its `apply_rows` or None), in the modules' order: a fold with
        # `apply_rows` is handed the batch's rows and passes over those outside its
        # categories itself (in the pass it makes anyway), making records only of the
        # rows it reads as records, so the batch is not sorted out for it
        self._folds = [(fold, getattr(fold, "apply_rows", None)) for _p, fold in folds]
        self._sorted = {
            number: prefixes
            for number, (prefixes, fold) in enumerate(folds)
            if self._folds[number][1] is None
        }
        # every category some fold wants the batch sorted out for (a cheap first test)
        self._sorted_prefixes = tuple(p for prefixes in self._sorted.values() for p in prefixes)
        # category prefix -> the sorted-out folds its streams go to
        self._routes: dict[str, tuple[int, ...]] = {}

    @classmethod
    @contextmanager
    def open(cls, store: EventStore) -> Iterator[ReplayCopy]:
        """A copy with empty fresh tables; the connection (and copy) end on exit."""
        with store.replay_session() as session:
            copy = cls(session)
            for module in registry.modules():
                keyed_only = getattr(module.Replay, "keyed_only", ())
                session.copy_tables(module.COMPONENT, module.MIGRATIONS, keyed_only)
            yield copy

    def live(self, table: str) -> str:
        """The qualified name of the live `table`."""
        return self._session.live(table)

    def copy(self, table: str) -> str:
        """The qualified name of the copy of `table`."""
        return self._session.copy(table)

    def replay(self, progress: Progress | None, batch: int) -> None:
        """Fold the log into the copy, `batch` events per short read transaction.

        The batches are read (and decoded) one ahead, by a thread, while the current
        one is folded; then, the folds caught up, the log is read again from where
        they stand until a batch comes back short: the replay ends only on a short
        batch read after every earlier one was folded, so what was appended while it
        ran is in it, not left to the swap's tail."""
        self._total = self._session.head_position()
        check = self.check
        read_ahead = self._session.read_ahead(self.position, batch, decode=False)
        with _fewer_collections():
            with read_ahead as batches:
                for found in batches:
                    with self._session.reading():
                        rows: Sequence[Row] = found if check is None else check.rows(found)
                        self._apply(rows)
                    # the last progress is the one after the replay's last read
                    self._done(rows, progress if len(rows) == batch else None)
            while True:
                with self._session.reading():
                    rows = self._read(batch)
                    self._apply(rows)
                    if len(rows) < batch:
                        self._flush()
                self._done(rows, progress)
                if len(rows) < batch:
                    return

    def _done(self, rows: Sequence[Row], progress: Progress | None) -> None:
        """Move the copy's position past `rows` (folded) and report progress."""
        if rows:
            self.position = rows[-1][0]
            self.events += len(rows)
        if progress is not None:
            self._total = max(self._total, self.events)
            progress(self.events, self._total)

    def catch_up(self) -> int:
        """Fold every event after the copy's position, inside the current transaction
        (exclusive or snapshot); returns how many there were."""
        rows = self._read()
        self._apply(rows)
        self._flush()
        if rows:
            self.position = rows[-1][0]
            self.events += len(rows)
        return len(rows)

    @contextmanager
    def exclusive(self) -> Iterator[None]:
        """One transaction holding the append lock; commits on normal exit."""
        with self._session.exclusive():
            yield

    @contextmanager
    def snapshot(self) -> Iterator[None]:
        """One transaction seeing a single consistent state of log and live tables;
        rolled back on exit (nothing it did to the copy is kept)."""
        with self._session.snapshot():
            yield

    def swap(self) -> dict[str, int]:
        """Make every live table's rows equal its copy's; returns rows per table.

        Only the difference is written: the live rows missing from the copy or unequal
        to it are deleted, then the copy's rows the live table lacks are inserted."""
        return {table: self._session.swap_in(table, key) for table, key in self.tables.items()}

    def same_rows(self, table: str) -> bool:
        """Whether the live `table` and its copy hold the same rows (compared by the
        database, as the swap compares them)."""
        return self._session.same_rows(table, self.tables[table])

    def columns(self, table: str) -> list[str]:
        """Column names of the live table, in table order."""
        return self._session.columns(table)

    def checked(self) -> LogCheck:
        """Check the log as the replay reads it (verify): each event read once for
        both (the check decodes each document; a fold decodes again the data of the
        records it makes). A fold that fails, or the first undecodable document, stops the
        folds (`failure`; `check.broken_at`) but not the reading or the check."""
        self.check = LogCheck()
        return self.check

    def _read(self, limit: int | None = None) -> Sequence[Row]:
        """The stored rows after the copy's position, in order (under a check,
        checked)."""
        rows = self._session.read_rows(self.position, limit)
        return rows if self.check is None else self.check.rows(rows)

    def _apply(self, rows: Sequence[Row]) -> None:
        check = self.check
        if check is None:
            self._route(rows)
            return
        if self.failure is not None:
            return
        if check.broken_at is not None:
            rows = [row for row in rows if row[0] < check.broken_at]
        try:
            self._route(rows)
            if check.broken_at is not None:
                self.failure = CorruptionError("the log has a document no replay can read")
        except Exception as exc:  # the report names it beside the log's problems
            self.failure = exc

    def _route(self, rows: Sequence[Row]) -> None:
        """Hand each fold its part of the batch, in log order: the rows whole to a fold
        with `apply_rows`, to the others the records of their categories' rows, sorted
        out in one pass by stream category (docs/DESIGN.md, "Rebuild")."""
        if not rows:
            return
        mine: dict[int, list[Any]] = {number: [] for number in self._sorted}
        wanted, routes, record_of = self._sorted_prefixes, self._routes, LazyRecord
        if wanted:
            for row in rows:
                stream = row[2]
                if not stream.startswith(wanted):
                    continue
                category = stream[: stream.find("-") + 1]
                route = routes.get(category)
                if route is None:
                    route = routes[category] = tuple(
                        number
                        for number, prefixes in self._sorted.items()
                        if stream.startswith(prefixes)
                    )
                record = record_of(row)
                for number in route:
                    mine[number].append(record)
        for number, (fold, apply_rows) in enumerate(self._folds):
            if apply_rows is not None:
                apply_rows(rows, record_of)
            elif mine[number]:
                fold.apply(mine[number])

    def _flush(self) -> None:
        if self.check is not None and self.failure is not None:
            return
        try:
            for fold, _whole in self._folds:
                fold.flush()
        except Exception as exc:
            if self.check is None:
                raise
            self.failure = exc


REPLAY_GC_THRESHOLD = 100_000  # allocations between young collections while replaying
_gc_lock = threading.Lock()
_gc_replays = 0  # replays running in this process
_gc_threshold: tuple[int, ...] = ()  # what the first of them found


@contextmanager
def _fewer_collections() -> Iterator[None]:
    """The cyclic garbage collector run less often while a replay runs: a replay
    makes and drops tens of thousands of decoded records and rows per batch, none of
    them in a reference cycle, and holds as many, so at the default threshold (a
    young collection every 700 allocations, a full one walking every held record
    every few hundred) collections took a quarter of a rebuild's time
    (docs/DESIGN.md "Rebuild"). Reference counting still frees every record and row as
    it is dropped, and the collector still runs, about a hundred times less often (so
    memory stays bounded; paused altogether, the process grew with the log). The
    threshold the first replay found is restored when the last one ends."""
    global _gc_replays, _gc_threshold
    with _gc_lock:
        if _gc_replays == 0:
            _gc_threshold = gc.get_threshold()
            gc.set_threshold(REPLAY_GC_THRESHOLD, *_gc_threshold[1:])
        _gc_replays += 1
    try:
        yield
    finally:
        with _gc_lock:
            _gc_replays -= 1
            if _gc_replays == 0:
                gc.set_threshold(*_gc_threshold)


class _Apply:
    """The replay of a module without its own `Replay`: its `apply`, batch by batch."""

    def __init__(self, module: Projection, tx: Transaction) -> None:
        self._module = module
        self._tx = tx

    def apply(self, records: Sequence[Record]) -> None:
        self._module.apply(self._tx, records)

    def flush(self) -> None:
        """`apply` holds nothing back."""


def _replayer(module: Projection, tx: Transaction, insert: Insert) -> Replayer:
    return _Apply(module, tx) if module.Replay is None else module.Replay(tx, insert)


def check_batch(batch: int) -> None:
    """InvalidInput unless `batch` is an int >= 1."""
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise InvalidInput("batch", "positive", f"batch must be an int >= 1, got {batch!r}")
