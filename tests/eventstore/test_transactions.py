"""store.transaction(): commit, rollback, own-write visibility, the rules of use."""

from __future__ import annotations

import pytest

from domain.errors import VersionConflict
from eventstore import StoreUsageError
from eventstore.api import PENDING_POSITION
from eventstore.validation import encode_appends
from tests.eventstore.builders import event, snapshot, stream

NOTES = {
    "sqlite": "CREATE TABLE notes (note_id TEXT PRIMARY KEY, body TEXT NOT NULL, n INTEGER)",
    "postgresql": "CREATE TABLE notes (note_id TEXT PRIMARY KEY, body TEXT NOT NULL, n BIGINT)",
}


@pytest.fixture
def notes_store(store):
    store.migrate("test-notes", [NOTES])
    return store


def test_leaving_the_block_commits_appends_and_statements_together(notes_store):
    with notes_store.transaction() as tx:
        tx.append([stream("run-a", 0, event("e1"))])
        tx.execute("INSERT INTO notes (note_id, body, n) VALUES (?, ?, ?)", ("a", "hello", 1))

    assert [r.event_id for r in notes_store.read_all()] == ["e1"]
    assert notes_store.query("SELECT note_id, body, n FROM notes") == [("a", "hello", 1)]


def test_an_exception_rolls_back_everything(notes_store):
    notes_store.append([stream("run-a", 0, event("e0"))])
    before = snapshot(notes_store)

    with pytest.raises(RuntimeError, match="boom"), notes_store.transaction() as tx:
        tx.append([stream("run-a", 1, event("e1"))])
        tx.append([stream("run-b", 0, event("b1"))])
        tx.execute("INSERT INTO notes (note_id, body) VALUES (?, ?)", ("a", "x"))
        raise RuntimeError("boom")

    assert snapshot(notes_store) == before
    assert notes_store.query("SELECT count(*) FROM notes") == [(0,)]


def test_reads_inside_a_transaction_see_its_own_writes(notes_store):
    with notes_store.transaction() as tx:
        written = tx.append([stream("run-a", 0, event("e1"), event("e2"))])
        tx.execute("INSERT INTO notes (note_id, body) VALUES (?, ?)", ("a", "x"))
        updated = tx.execute("UPDATE notes SET n = ? WHERE note_id = ?", (7, "a"))

        assert updated.rowcount == 1
        assert tx.read_stream("run-a") == written
        assert tx.read_all() == written
        assert tx.stream_versions(["run-a"]) == {"run-a": 2}
        assert tx.streams_with_prefix("run-") == ["run-a"]
        assert tx.head_position() == written[-1].global_position
        assert tx.query("SELECT note_id, n FROM notes WHERE note_id = ?", ("a",)) == [("a", 7)]


def test_a_caught_conflict_still_rolls_the_transaction_back(notes_store):
    notes_store.append([stream("run-b", 0, event("b1"))])
    before = snapshot(notes_store)

    with (
        pytest.raises(StoreUsageError, match="rolled back") as caught,
        notes_store.transaction() as tx,
    ):
        tx.append([stream("run-a", 0, event("a1"))])
        with pytest.raises(VersionConflict):
            tx.append([stream("run-c", 0, event("c1")), stream("run-b", 0, event("b2"))])
        with pytest.raises(StoreUsageError, match="can only roll back"):
            tx.query("SELECT 1")

    assert isinstance(caught.value.__cause__, VersionConflict)
    assert snapshot(notes_store) == before


def test_transactions_do_not_nest_on_one_thread(store):
    with store.transaction() as tx:
        with pytest.raises(StoreUsageError, match="do not nest"), store.transaction():
            pass
        with pytest.raises(StoreUsageError, match="do not nest"):
            store.append([stream("run-a", 0, event("e1"))])
        with pytest.raises(StoreUsageError, match="do not nest"):
            store.read_all()
        tx.append([stream("run-a", 0, event("e1"))])  # the open transaction still works

    assert [r.event_id for r in store.read_all()] == ["e1"]


def test_a_finished_transaction_cannot_be_used(store):
    with store.transaction() as tx:
        pass

    with pytest.raises(StoreUsageError, match="has ended"):
        tx.append([stream("run-a", 0, event("e1"))])
    with pytest.raises(StoreUsageError, match="has ended"):
        tx.read_all()


def test_a_closed_store_refuses_work(store_url):
    from eventstore import open_store

    closed = open_store(store_url)
    closed.close()
    closed.close()  # closing twice is harmless

    with pytest.raises(StoreUsageError, match="closed store"):
        closed.read_all()
    with pytest.raises(StoreUsageError, match="closed store"), closed.transaction():
        pass


def test_dialect_is_reported(store, store_url):
    assert store.dialect == store_url.split(":", 1)[0]
    assert store.url == store_url
    with store.transaction() as tx:
        assert tx.dialect == store.dialect


def test_an_append_at_commit_commits_with_what_follows_it(notes_store):
    """`append_at_commit` (a writer holding its streams' locks): the append may wait for
    COMMIT; the transaction's `appended` then has the positions the log gave."""
    notes_store.append([stream("run-a", 0, event("a0"))])
    with notes_store.transaction() as tx:
        returned = tx.append_at_commit(encode_appends([stream("run-a", 1, event("a1"))]))
        tx.execute("INSERT INTO notes (note_id, body) VALUES (?, ?)", ("a", "x"))

    stored = notes_store.read_all()
    assert [r.event_id for r in stored] == ["a0", "a1"]
    assert tx.appended == stored[1:]
    returned_at = [r.global_position for r in returned]
    assert returned_at in ([PENDING_POSITION], [stored[1].global_position])
    assert returned[0].event_id == "a1" and returned[0].data == stored[1].data
    assert notes_store.query("SELECT note_id, body FROM notes") == [("a", "x")]


@pytest.mark.parametrize("statement_after", [True, False])
def test_a_refused_append_at_commit_writes_nothing_of_its_transaction(
    notes_store, caplog, statement_after
):
    """Refused at the call (SQLite), or where PostgreSQL sends it: with the next
    statement or with COMMIT, aborting what is sent after it. A VersionConflict either
    way, nothing written, and the connection goes back rolled back (the pool has
    nothing to roll back or warn of)."""
    notes_store.append([stream("run-b", 0, event("b1"))])
    before = snapshot(notes_store)

    with pytest.raises(VersionConflict) as caught, notes_store.transaction() as tx:
        tx.execute("INSERT INTO notes (note_id, body) VALUES (?, ?)", ("a", "before"))
        tx.append_at_commit(encode_appends([stream("run-c", 0, event("c1"))]))
        tx.execute("INSERT INTO notes (note_id, body) VALUES (?, ?)", ("b", "between"))
        tx.append_at_commit(encode_appends([stream("run-b", 0, event("b2"))]))
        if statement_after:
            tx.execute("INSERT INTO notes (note_id, body) VALUES (?, ?)", ("c", "after"))

    assert (caught.value.stream_id, caught.value.expected, caught.value.actual) == ("run-b", 0, 1)
    assert snapshot(notes_store) == before
    assert notes_store.query("SELECT count(*) FROM notes") == [(0,)]
    assert not [r for r in caplog.records if "rolling back" in r.getMessage()]
