"""The store's lock verbs: `lock`, `try_lock`, `try_lock_each`, `lock_heads`,
`lock_heads_each`, server-side functions.

The contract part runs on both stores. On SQLite every write transaction holds the
database's one write lock, so the verbs hold at once; the PostgreSQL part shows two
transactions excluding each other, and that a wait is bounded (LockTimeout)."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest

from domain.errors import InvalidInput, LockTimeout
from eventstore import StoreUsageError, open_store
from tests.eventstore.builders import event, snapshot, stream

WAIT_S = 20


def test_locks_are_granted_inside_a_transaction(store):
    store.append([stream("run-a", 0, event("a1"), event("a2"))])
    with store.transaction() as tx:
        tx.lock("publisher:acme")
        tx.lock("publisher:acme")  # taken again by its holder: granted at once
        tx.lock_all(["attempt:z", "attempt:y", "publisher:acme"])
        tx.lock_all([])
        assert tx.try_lock(["attempt:x", "attempt:y", "attempt:x"]) is True
        assert tx.try_lock([]) is True
        heads = tx.lock_heads(["run-missing", "run-a"], wait=False)
        assert heads == {"run-missing": 0, "run-a": 2}
        assert list(heads) == ["run-missing", "run-a"]  # in the order asked
        assert tx.lock_heads(["run-a"], wait=True) == {"run-a": 2}
        assert tx.lock_heads([], wait=True) == {}
        tx.append([stream("run-a", 2, event("a3"))])
        assert tx.lock_heads(["run-a"], wait=False) == {"run-a": 3}  # its own write


@pytest.mark.parametrize(
    "call",
    [
        lambda tx: tx.lock(""),
        lambda tx: tx.lock(7),
        lambda tx: tx.try_lock("attempt:x"),
        lambda tx: tx.lock_all("attempt:x"),
        lambda tx: tx.lock_all(["ok", ""]),
        lambda tx: tx.try_lock(["ok", None]),
        lambda tx: tx.lock_heads("run-a", wait=False),
        lambda tx: tx.call("drop table events; --"),
    ],
    ids=[
        "empty key",
        "int key",
        "one string",
        "all one string",
        "all empty key",
        "None key",
        "one stream id",
        "bad function",
    ],
)
def test_bad_lock_names_are_invalid_input_and_write_nothing(store, call):
    store.append([stream("run-a", 0, event("a1"))])
    before = snapshot(store)
    with pytest.raises(InvalidInput), store.transaction() as tx:
        call(tx)
    assert snapshot(store) == before


def test_a_database_without_the_function_says_none(store):
    with store.transaction() as tx:
        assert tx.function_comment("qlflow_no_such_function(text)") is None


def test_store_kind_capabilities(store):
    assert store.single_writer is (store.dialect == "sqlite")


def test_sqlite_has_no_server_side_functions(sqlite_url):
    with open_store(sqlite_url) as store:
        refused = pytest.raises(StoreUsageError, match="no server-side functions")
        with refused, store.transaction() as tx:
            tx.call("anything", ("x",))


# --- PostgreSQL: two transactions ------------------------------------------------------


@pytest.fixture
def pg_store(pg_url):
    with open_store(pg_url, lock_timeout_ms=300) as opened:
        opened.append([stream("run-a", 0, event("a1")), stream("run-b", 0, event("b1"))])
        yield opened


@contextmanager
def held_elsewhere(store, take: Callable) -> Iterator[None]:
    """Run `take(tx)` in a transaction on another thread and keep it open (with
    whatever it locked) until the block ends; then that transaction commits."""
    ready, release, failed = threading.Event(), threading.Event(), []

    def hold() -> None:
        try:
            with store.transaction() as tx:
                take(tx)
                ready.set()
                release.wait(WAIT_S)
        except BaseException as error:  # reported below
            failed.append(error)
            ready.set()

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert ready.wait(WAIT_S) and not failed, failed
        yield
    finally:
        release.set()
        holder.join(WAIT_S)
    assert not failed, failed


@pytest.mark.pg
def test_try_lock_is_all_or_nothing_and_never_waits(pg_store):
    with held_elsewhere(pg_store, lambda tx: tx.lock("attempt:b")):
        with pg_store.transaction() as tx:
            started = time.monotonic()
            assert tx.try_lock(["attempt:a", "attempt:b"]) is False
            assert time.monotonic() - started < 0.3 * 5  # never waited for a timeout
        with pg_store.transaction() as tx:
            assert tx.try_lock(["attempt:a", "attempt:c"]) is True
    with pg_store.transaction() as tx:  # released when the holder committed
        assert tx.try_lock(["attempt:b"]) is True


@pytest.mark.pg
def test_a_lock_wait_is_bounded_and_leaves_the_transaction_to_roll_back(pg_store):
    before = snapshot(pg_store)
    with held_elsewhere(pg_store, lambda tx: tx.lock("publisher:acme")):
        timed_out = pytest.raises(LockTimeout, match="not granted within 300 ms")
        with timed_out, pg_store.transaction() as tx:
            tx.append([stream("run-a", 1, event("a2"))])
            tx.lock("publisher:acme")
        doomed = pytest.raises(StoreUsageError, match="can only roll back")
        with doomed, pg_store.transaction() as tx:
            with contextlib.suppress(LockTimeout):
                tx.lock("publisher:acme")  # caught, yet the transaction cannot commit
            tx.read_stream("run-a")
    assert snapshot(pg_store) == before


@pytest.mark.pg
def test_a_lock_is_granted_when_its_holder_commits(pg_url, pg_server_url):
    import psycopg

    with open_store(pg_url, lock_timeout_ms=WAIT_S * 1000) as store:
        got: list[str] = []
        release = threading.Event()

        def waiter() -> None:
            with store.transaction() as tx:
                tx.lock("installation:demo")
                got.append("granted")

        with held_elsewhere(store, lambda tx: tx.lock("installation:demo")):
            thread = threading.Thread(target=waiter)
            thread.start()
            deadline = time.monotonic() + WAIT_S
            with psycopg.connect(pg_server_url, autocommit=True) as probe:
                while time.monotonic() < deadline and not release.is_set():
                    waiting = probe.execute(
                        "SELECT 1 FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                        "AND query LIKE '%qlflow_locks%'"
                    ).fetchone()
                    if waiting:
                        release.set()
                    time.sleep(0.01)
            assert release.is_set(), "the second locker never waited"
            assert not got
        thread.join(WAIT_S)
        assert got == ["granted"]


@pytest.mark.pg
def test_lock_all_waits_for_each_lock_bounded_and_takes_them_all(pg_store):
    with held_elsewhere(pg_store, lambda tx: tx.lock("attempt:b")):
        timed_out = pytest.raises(LockTimeout, match="not granted within 300 ms")
        with timed_out, pg_store.transaction() as tx:
            tx.lock_all(["attempt:c", "attempt:a", "attempt:b"])
        with pg_store.transaction() as tx:
            tx.lock_all(["attempt:a", "attempt:c"])
    with pg_store.transaction() as tx:
        tx.lock_all(["attempt:a", "attempt:b", "attempt:c"])
        checker_saw: list[bool] = []

        def check(other) -> None:
            checker_saw.append(other.try_lock(["attempt:a"]) or other.try_lock(["attempt:c"]))

        with held_elsewhere(pg_store, check):
            pass
        assert checker_saw == [False]  # every one of them is held here


@pytest.mark.pg
def test_held_heads_answer_none_or_time_out(pg_store):
    with held_elsewhere(pg_store, lambda tx: tx.lock_heads(["run-b"], wait=True)):
        with pg_store.transaction() as tx:
            assert tx.lock_heads(["run-a", "run-b"], wait=False) is None
        with pg_store.transaction() as tx:
            assert tx.lock_heads(["run-a", "run-new"], wait=False) == {"run-a": 1, "run-new": 0}
        with pytest.raises(LockTimeout), pg_store.transaction() as tx:
            tx.lock_heads(["run-a", "run-b"], wait=True)
    with pg_store.transaction() as tx:
        assert tx.lock_heads(["run-b"], wait=False) == {"run-b": 1}


def test_lock_ahead_takes_the_locks_then_the_heads_before_the_next_read(store):
    store.append([stream("run-a", 0, event("a1"))])
    with store.transaction() as tx:
        tx.lock_ahead(["attempt:b", "attempt:a"], ["run-a", "run-missing"])
        tx.lock_ahead([], [])
        assert tx.read_streams_after({"run-a": 0})["run-a"][0].event_id == "a1"
        tx.append([stream("run-a", 1, event("a2"))])
    with store.transaction() as tx, pytest.raises(InvalidInput):
        tx.lock_ahead("attempt:a", [])  # type: ignore[arg-type]


def test_try_lock_each_ahead_answers_as_try_lock_each(store):
    store.append([stream("run-a", 0, event("a1"))])
    with store.transaction() as tx:
        tx.lock_ahead([], ["run-a"])
        taken = tx.try_lock_each_ahead(["attempt:b", "attempt:a", "attempt:a"])
        nothing = tx.try_lock_each_ahead([])
        assert len(tx.read_stream("run-a")) == 1
        assert taken() == {"attempt:a", "attempt:b"} and taken() is taken()
        assert nothing() == frozenset()
        asked_first = tx.try_lock_each_ahead(["attempt:c"])
        assert asked_first() == {"attempt:c"}  # asked before any statement took it along
        assert tx.try_lock_each(["attempt:d", "attempt:a"]) == {"attempt:a", "attempt:d"}
        tx.append([stream("run-a", 1, event("a2"))])
    with store.transaction() as tx, pytest.raises(InvalidInput):
        tx.try_lock_each("attempt:a")  # type: ignore[arg-type]


def test_lock_heads_each_ahead_answers_as_lock_heads_each(store):
    store.append([stream("run-a", 0, event("a1"), event("a2"))])
    with store.transaction() as tx:
        heads = tx.lock_heads_each_ahead(["run-missing", "run-a"])
        assert tx.lock_heads_each_ahead([])() == {}
        assert len(tx.read_stream("run-a")) == 2
        assert heads() == {"run-missing": 0, "run-a": 2} and heads() is heads()
        asked_first = tx.lock_heads_each_ahead(["run-a"])
        assert asked_first() == {"run-a": 2}  # asked before any statement took it along
        assert tx.lock_heads_each(["run-a", "run-other"]) == {"run-a": 2, "run-other": 0}
        tx.append([stream("run-a", 2, event("a3"))])
    with store.transaction() as tx, pytest.raises(InvalidInput):
        tx.lock_heads_each("run-a")  # type: ignore[arg-type]


def test_stream_versions_ahead_answers_as_stream_versions(store):
    store.append([stream("run-a", 0, event("a1"), event("a2"))])
    with store.transaction() as tx:
        versions = tx.stream_versions_ahead(["run-missing", "run-a", "run-a"])
        assert tx.stream_versions_ahead([])() == {}
        assert tx.function_comment("qlflow_no_such_function(text)") is None
        assert versions() == {"run-missing": 0, "run-a": 2} and versions() is versions()
        assert list(versions()) == ["run-missing", "run-a"]  # in the order asked
        asked_first = tx.stream_versions_ahead(["run-a"])
        assert asked_first() == {"run-a": 2}  # asked before any statement took it along
        tx.append([stream("run-a", 2, event("a3"))])
        assert tx.stream_versions_ahead(["run-a"])() == {"run-a": 3}


def test_read_ahead_answers_the_query_all_that_follows_an_append(store):
    store.append([stream("run-a", 0, event("a1"))])
    queries = [
        ("SELECT stream_id, version FROM streams WHERE stream_id = ?", ["run-a"]),
        ("SELECT count(*) FROM events WHERE stream_id = ?", ["run-a"]),
    ]
    with store.transaction() as tx:
        tx.read_ahead(queries)
        tx.append([stream("run-a", 1, event("a2"))])
        # what the queries see after the append, on both stores
        assert tx.query_all(queries) == [[("run-a", 2)], [(2,)]]
        tx.read_ahead(queries)
        tx.execute("UPDATE streams SET version = version WHERE stream_id = ?", ("run-x",))
        tx.append([stream("run-a", 2, event("a3"))])
        assert tx.query_all(queries) == [[("run-a", 3)], [(3,)]]
        tx.read_ahead(queries)
        tx.upsert("streams", ["stream_id", "version"], ["stream_id"], [("run-z", 1)])
        # a write after the read ahead: the answer is read again, after it
        assert tx.query_all([("SELECT version FROM streams WHERE stream_id = ?", ["run-z"])]) == [
            [(1,)]
        ]


@pytest.mark.pg
def test_lock_ahead_waits_bounded_at_the_next_statement(pg_store):
    before = snapshot(pg_store)
    with held_elsewhere(pg_store, lambda tx: tx.lock("attempt:b")):
        timed_out = pytest.raises(LockTimeout, match="not granted within 300 ms")
        with timed_out, pg_store.transaction() as tx:
            tx.lock_ahead(["attempt:a", "attempt:b"], ["run-a"])
            tx.read_streams_after({"run-a": 0})
        doomed = pytest.raises(StoreUsageError, match="can only roll back")
        with doomed, pg_store.transaction() as tx:
            tx.lock_ahead(["attempt:b"], [])
            with contextlib.suppress(LockTimeout):
                tx.read_stream("run-a")
            tx.append([stream("run-a", 1, event("a2"))])
    holding = held_elsewhere(pg_store, lambda tx: tx.lock_heads(["run-b"], wait=True))
    with holding, pytest.raises(LockTimeout), pg_store.transaction() as tx:
        tx.lock_ahead(["attempt:a"], ["run-a", "run-b"])
        tx.read_stream("run-a")
    assert snapshot(pg_store) == before
    with pg_store.transaction() as tx:
        tx.lock_ahead(["attempt:a"], ["run-a"])
        tx.read_stream("run-a")
        checker_saw: list[object] = []

        def check(other) -> None:
            checker_saw.append(other.try_lock(["attempt:a"]))
            checker_saw.append(other.lock_heads(["run-a"], wait=False))

        with held_elsewhere(pg_store, check):
            pass
        assert checker_saw == [False, None]  # both held here


@pytest.mark.pg
def test_try_lock_each_never_waits_and_says_which_it_took(pg_store):
    holding = held_elsewhere(pg_store, lambda tx: tx.lock("attempt:b"))
    with holding, pg_store.transaction() as tx:
        started = time.monotonic()
        ahead = tx.try_lock_each_ahead(["attempt:a", "attempt:b", "attempt:c"])
        tx.read_stream("run-a")
        assert ahead() == {"attempt:a", "attempt:c"}
        assert tx.try_lock_each(["attempt:b", "attempt:d"]) == {"attempt:d"}
        assert time.monotonic() - started < 0.3 * 5  # never waited for a timeout
        tx.append([stream("run-a", 1, event("a2"))])  # the transaction goes on
    assert [r.event_id for r in pg_store.read_stream("run-a")] == ["a1", "a2"]
    # what a transaction took stays held until it ends
    holding = held_elsewhere(pg_store, lambda tx: tx.try_lock_each(["attempt:a", "attempt:e"]))
    with holding, pg_store.transaction() as tx:
        assert tx.try_lock_each(["attempt:a", "attempt:f"]) == {"attempt:f"}


@pytest.mark.pg
def test_lock_heads_each_never_waits_and_leaves_out_the_held_ones(pg_store):
    holding = held_elsewhere(pg_store, lambda tx: tx.lock_heads(["run-b"], wait=True))
    with holding, pg_store.transaction() as tx:
        started = time.monotonic()
        ahead = tx.lock_heads_each_ahead(["run-a", "run-b", "run-new"])
        tx.read_stream("run-a")
        assert ahead() == {"run-a": 1, "run-new": 0}
        assert tx.lock_heads_each(["run-b"]) == {}
        assert time.monotonic() - started < 0.3 * 5  # never waited for a timeout


@pytest.mark.pg
def test_a_server_side_function_is_found_with_its_comment_and_called(pg_store):
    with pg_store.transaction() as tx:
        tx.execute(
            "CREATE FUNCTION qlflow_test_echo(value text) RETURNS text LANGUAGE sql "
            "AS 'SELECT value'"
        )
        assert tx.function_comment("qlflow_test_echo(text)") == ""
        tx.execute("COMMENT ON FUNCTION qlflow_test_echo(text) IS 'v1'")
        assert tx.function_comment("qlflow_test_echo(text)") == "v1"
        assert tx.call("qlflow_test_echo", ("hello",)) == "hello"
