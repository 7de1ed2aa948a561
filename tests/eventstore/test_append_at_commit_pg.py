"""PostgreSQL's `append_at_commit`: the append goes out when it is decided, before the
statements that follow it and COMMIT (docs/DESIGN.md "Two round trips")."""

from __future__ import annotations

import time
from collections.abc import Iterator

import psycopg
import pytest

from domain.errors import VersionConflict
from eventstore import open_store
from eventstore.store import BaseStore
from eventstore.validation import encode_appends
from tests.eventstore.builders import event, snapshot, stream

pytestmark = pytest.mark.pg

# the transactions (other than the asking session's) that hold a write lock on `events`:
# an INSERT takes it when it runs, a read never does
_APPENDING = (
    "SELECT count(*) FROM pg_locks l JOIN pg_class c ON c.oid = l.relation "
    "WHERE c.relname = 'events' AND c.relnamespace = current_schema()::regnamespace "
    "AND l.mode = 'RowExclusiveLock' AND l.pid <> pg_backend_pid()"
)


_NOTES = "CREATE TABLE notes (note_id TEXT PRIMARY KEY)"


@pytest.fixture
def pg_store(pg_url: str) -> Iterator[BaseStore]:
    opened = open_store(pg_url)
    try:
        opened.migrate("test-notes", [{"postgresql": _NOTES}])
        yield opened
    finally:
        opened.close()


def _appending(url: str, within_s: float = 10.0) -> bool:
    """Whether another session's append reaches the server within `within_s` (polled:
    the server runs it while the client goes on)."""
    deadline = time.monotonic() + within_s
    with psycopg.connect(url, autocommit=True) as conn:
        while True:
            if conn.execute(_APPENDING).fetchall() != [(0,)]:
                return True
            if time.monotonic() > deadline:
                return False
            time.sleep(0.01)


def test_the_append_runs_on_the_server_before_the_transaction_commits(pg_store, pg_url):
    pg_store.append([stream("run-a", 0, event("a0"))])
    with pg_store.transaction() as tx:
        assert tx.stream_versions(["run-a"]) == {"run-a": 1}  # the write's read
        assert not _appending(pg_url, within_s=0)
        tx.append_at_commit(encode_appends([stream("run-a", 1, event("a1"))]))
        # nothing after it waits for an answer, and yet the server has it
        assert _appending(pg_url)
        tx.execute("INSERT INTO notes (note_id) VALUES (?)", ("a",))

    assert [r.event_id for r in pg_store.read_all()] == ["a0", "a1"]
    assert pg_store.query("SELECT note_id FROM notes") == [("a",)]
    assert [r.event_id for r in tx.appended] == ["a1"]


def test_a_transaction_whose_sent_append_was_refused_rolls_back_when_it_raises(pg_url):
    """An error of the caller's while a refused append is out: the caller's error, the
    refusal only ended with the pipeline, nothing written; the connection (the pool's
    only one) serves the next transactions."""
    store = open_store(pg_url, pool_max_size=1)
    try:
        store.append([stream("run-b", 0, event("b1"))])
        before = snapshot(store)

        with pytest.raises(RuntimeError, match="the caller's"), store.transaction() as tx:
            tx.stream_versions(["run-b"])
            tx.append_at_commit(encode_appends([stream("run-b", 0, event("b2"))]))
            raise RuntimeError("the caller's")

        assert snapshot(store) == before
        for index in range(2):
            with store.transaction() as tx:
                version = tx.stream_versions(["run-b"])["run-b"]
                tx.append_at_commit(encode_appends([stream("run-b", version, event(f"c{index}"))]))
        assert [r.event_id for r in store.read_stream("run-b")] == ["b1", "c0", "c1"]
    finally:
        store.close()


def test_a_refused_append_sent_at_once_is_the_conflict_of_the_next_statement(pg_store):
    pg_store.append([stream("run-c", 0, event("c1"))])
    before = snapshot(pg_store)

    with pytest.raises(VersionConflict) as caught, pg_store.transaction() as tx:
        tx.stream_versions(["run-c"])
        tx.append_at_commit(encode_appends([stream("run-c", 0, event("c2"))]))
        tx.query("SELECT count(*) FROM notes")  # waits for an answer: the refusal's

    assert (caught.value.stream_id, caught.value.expected, caught.value.actual) == ("run-c", 0, 1)
    assert snapshot(pg_store) == before
