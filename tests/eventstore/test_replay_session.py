"""store.replay_session(): private copies that shadow live tables, bulk inserts, the
log in position order, and a swap that writes only the difference (both stores)."""

from __future__ import annotations

import pytest

from eventstore import StoreUsageError
from tests.eventstore.builders import event, stream

NOTES = {
    "sqlite": "CREATE TABLE notes (note_id TEXT PRIMARY KEY, body TEXT, n INTEGER)",
    "postgresql": "CREATE TABLE notes (note_id TEXT PRIMARY KEY, body TEXT, n BIGINT)",
}


@pytest.fixture
def notes_store(store):
    store.migrate("test-notes", [NOTES])
    with store.transaction() as tx:
        tx.executemany(
            "INSERT INTO notes (note_id, body, n) VALUES (?, ?, ?)",
            [("a", "same", 1), ("b", "stale", 2), ("gone", None, 3)],
        )
    store.append([stream("run-a", 0, event("e1", x=1), event("e2", x=2))])
    store.append([stream("run-b", 0, event("e3", x=3))])
    return store


def test_copies_shadow_the_live_tables_until_the_swap(notes_store):
    other = notes_store.query("SELECT note_id FROM notes ORDER BY note_id")
    with notes_store.replay_session() as session:
        session.copy_tables("test-notes", [NOTES])
        with session.reading():
            assert session.tx.query("SELECT COUNT(*) FROM notes") == [(0,)]  # the copy
            session.insert("notes", ("note_id", "body", "n"), [("a", "same", 1), ("b", "new", 2)])
            session.tx.execute(
                "INSERT INTO notes (note_id, body, n) VALUES (?, ?, ?)", ("c", None, 4)
            )
        assert notes_store.query("SELECT note_id FROM notes ORDER BY note_id") == other
        assert session.columns("notes") == ["note_id", "body", "n"]
        with session.exclusive():
            assert session.swap_in("notes", ("note_id",)) == 3
    assert notes_store.query("SELECT note_id, body, n FROM notes ORDER BY note_id") == [
        ("a", "same", 1),
        ("b", "new", 2),
        ("c", None, 4),
    ]


def test_the_log_is_read_in_position_order_and_decoded_lazily(notes_store):
    with notes_store.replay_session() as session:
        assert session.head_position() == notes_store.head_position()
        with session.reading():
            records = session.read_log(0)
            assert [r.event_id for r in records] == ["e1", "e2", "e3"]
            assert [r.data["x"] for r in records] == [1, 2, 3]
            after = session.read_log(records[0].global_position, limit=1)
            assert [r.event_id for r in after] == ["e2"]


# schema steps after NOTES: a non-unique index, then a unique one, another non-unique
# one and the drop of the first
NOTE_INDEXES = [
    "CREATE INDEX notes_by_n ON notes (n)",
    [
        "CREATE UNIQUE INDEX notes_one_body ON notes (body)",
        "CREATE INDEX notes_by_body ON notes (body, n)",
        "DROP INDEX notes_by_n",
    ],
]


def _copy_indexes(session) -> set[str]:
    """Names of the indexes on the session's copy of `notes` (not its primary key's)."""
    if session.tx.dialect == "sqlite":
        rows = session.tx.query(
            "SELECT name FROM sqlite_temp_master WHERE type = 'index' AND tbl_name = 'notes'"
            " AND sql IS NOT NULL"
        )
    else:
        rows = session.tx.query(
            "SELECT indexname FROM pg_indexes WHERE tablename = 'notes' AND schemaname = "
            "(SELECT nspname FROM pg_namespace WHERE oid = pg_my_temp_schema())"
            " AND indexname <> 'notes_pkey'"
        )
    return {row[0] for row in rows}


@pytest.mark.parametrize(
    ("keyed_only", "indexes"),
    [((), {"notes_one_body", "notes_by_body"}), (("notes",), {"notes_one_body"})],
    ids=["every index", "keyed only"],
)
def test_a_keyed_only_copy_keeps_its_unique_indexes_alone(notes_store, keyed_only, indexes):
    """A copy read and written by key alone is made without its non-unique indexes (nor
    the later drop of one); its unique indexes still hold."""
    steps = [NOTES, *({"sqlite": step, "postgresql": step} for step in NOTE_INDEXES)]
    notes_store.migrate("test-notes", steps)  # the live table has them all
    with notes_store.replay_session() as session:
        session.copy_tables("test-notes", steps, keyed_only)
        with session.reading():
            assert _copy_indexes(session) == indexes
        with pytest.raises(Exception, match=r"(?i)unique"), session.reading():
            session.insert("notes", ("note_id", "body", "n"), [("a", "x", 1), ("b", "x", 2)])


def test_a_snapshot_rolls_back_what_it_did_to_the_copy(notes_store):
    with notes_store.replay_session() as session:
        session.copy_tables("test-notes", [NOTES])
        with session.snapshot():
            session.insert("notes", ("note_id", "body", "n"), [("z", "x", 9)])
        with session.reading():
            assert session.tx.query(f"SELECT COUNT(*) FROM {session.copy('notes')}") == [(0,)]


def test_a_replay_session_is_refused_inside_a_transaction(notes_store):
    with notes_store.transaction(), pytest.raises(StoreUsageError):
        notes_store.replay_session().__enter__()


def test_copies_larger_than_the_page_cache_spill_and_swap_whole(notes_store, monkeypatch):
    """On SQLite the copies live in a temp file behind a bounded page cache (a rebuild's
    memory does not grow with the read models): rows far past that cache still swap in
    exactly. PostgreSQL's copies are the server's temp tables: the same rows, the same swap."""
    from eventstore import sqlite_store

    monkeypatch.setattr(sqlite_store, "REPLAY_CACHE_KIB", 64)
    rows = [(f"n{i:05d}", f"{i:05d}" * 200, i) for i in range(3000)]  # ~3 MB of bodies
    with notes_store.replay_session() as session:
        if isinstance(session, sqlite_store.SqliteReplaySession):
            assert session.tx.query("PRAGMA temp_store") == [(1,)]  # FILE
            assert session.tx.query("PRAGMA temp.cache_size") == [(-64,)]
        session.copy_tables("test-notes", [NOTES])
        with session.reading():
            for start in range(0, len(rows), 500):
                session.insert("notes", ("note_id", "body", "n"), rows[start : start + 500])
        with session.exclusive():
            assert session.swap_in("notes", ("note_id",)) == len(rows)
    assert notes_store.query("SELECT note_id, body, n FROM notes ORDER BY note_id") == rows


@pytest.mark.parametrize("ahead", [False, True], ids=["in turn", "read ahead"])
def test_read_ahead_gives_the_log_in_batches_and_stops_when_left(notes_store, ahead):
    more = [stream(f"run-{n}", 0, event(f"m{n}", x=n)) for n in range(5)]
    notes_store.append(more)
    with notes_store.replay_session() as session:
        session.reads_ahead = ahead  # both ways on either store
        with session.read_ahead(0, 3) as batches:
            found = [[(r.global_position, r.data["x"]) for r in b] for b in batches]
        positions = [p for b in found for p, _x in b]
        assert [len(b) for b in found] == [3, 3, 2]  # the last one short
        assert positions == sorted(positions) and len(set(positions)) == 8
        assert [x for b in found for _p, x in b] == [1, 2, 3, 0, 1, 2, 3, 4]
        with session.read_ahead(positions[3], 3, decode=False) as batches:
            rows = next(iter(batches))  # left after one batch: the reader stops
        assert [row[0] for row in rows] == positions[4:7]
        with session.reading():  # the session is still usable
            assert len(session.read_rows(0)) == 8
