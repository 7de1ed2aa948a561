"""What only the SQLite adapter promises: WAL, durability level, URLs, many connections."""

from __future__ import annotations

import threading
import warnings

import pytest

from domain.errors import DurabilityWarning, VersionConflict
from domain.records import NewEvent, StreamAppend
from eventstore import open_store
from tests.eventstore.builders import event, stream


def pragma(store, name: str):
    return store.query(f"PRAGMA {name}")[0][0]


def test_defaults_are_wal_and_full_sync(sqlite_url):
    store = open_store(sqlite_url)
    try:
        assert pragma(store, "journal_mode") == "wal"
        assert pragma(store, "synchronous") == 2  # FULL
        assert pragma(store, "busy_timeout") == 5000
    finally:
        store.close()


@pytest.mark.parametrize("how", ["option", "url"])
def test_synchronous_and_busy_timeout_are_configurable(sqlite_url, how):
    with pytest.warns(DurabilityWarning):
        if how == "option":
            store = open_store(sqlite_url, synchronous="normal", busy_timeout_ms=1500)
        else:
            store = open_store(f"{sqlite_url}?synchronous=NORMAL&busy_timeout_ms=1500")
    try:
        assert pragma(store, "synchronous") == 1  # NORMAL
        assert pragma(store, "busy_timeout") == 1500
        assert store.synchronous == "NORMAL"
    finally:
        store.close()


def test_relative_and_absolute_paths(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    relative = open_store("sqlite:///relative.db")
    relative.append([stream("run-a", 0, event("e1"))])
    relative.close()
    absolute = open_store(f"sqlite:///{tmp_path}/relative.db")  # "sqlite:////tmp/..."

    try:
        assert (tmp_path / "relative.db").exists()
        assert [r.event_id for r in absolute.read_all()] == ["e1"]
    finally:
        absolute.close()


def test_two_stores_on_one_file_write_from_many_threads(sqlite_url):
    """Each store is one connection; BEGIN IMMEDIATE makes read-then-write safe across them."""
    stores = [open_store(sqlite_url), open_store(sqlite_url)]
    barrier = threading.Barrier(6)
    outcomes: list[object] = []

    def writer(n: int) -> None:
        store = stores[n % 2]
        barrier.wait(timeout=30)
        for i in range(10):
            try:
                with store.transaction() as tx:
                    head = tx.stream_versions(["run-shared"])["run-shared"]
                    tx.append([stream("run-shared", head, event(f"w{n}-{i}"))])
                outcomes.append("ok")
            except BaseException as exc:
                outcomes.append(exc)

    threads = [threading.Thread(target=writer, args=(n,), daemon=True) for n in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)

    try:
        # reading the head inside the write transaction leaves no room for a conflict
        assert outcomes == ["ok"] * 60
        assert [r.stream_version for r in stores[0].read_stream("run-shared")] == list(range(1, 61))
    finally:
        for store in stores:
            store.close()


def test_the_second_connection_still_sees_version_conflicts(sqlite_url):
    first, second = open_store(sqlite_url), open_store(sqlite_url)
    try:
        first.append([StreamAppend("run-a", 0, (NewEvent("e1", "t", {}),))])
        with pytest.raises(VersionConflict):
            second.append([StreamAppend("run-a", 0, (NewEvent("e2", "t", {}),))])
    finally:
        first.close()
        second.close()


def test_checkpoints_run_between_transactions_and_keep_the_wal_bounded(tmp_path):
    from eventstore.sqlite_store import CHECKPOINT_EVERY

    path = tmp_path / "wal.db"
    store = open_store(f"sqlite:///{path}")
    wal = path.with_name("wal.db-wal")
    try:
        assert pragma(store, "wal_autocheckpoint") == 0  # never inside a COMMIT

        def commit_transactions(count: int, first: int) -> None:
            for n in range(first, first + count):
                store.append([stream(f"run-{n}", 0, event(f"e{n}", pad="x" * 3000))])

        commit_transactions(2 * CHECKPOINT_EVERY, 0)
        size_early = wal.stat().st_size
        commit_transactions(8 * CHECKPOINT_EVERY, 2 * CHECKPOINT_EVERY)

        # the WAL is written from its start again after each checkpoint: five times the
        # transactions leave it about as large (without checkpoints it would be 5x)
        assert wal.stat().st_size <= size_early * 1.25
        assert len(store.read_all()) == 10 * CHECKPOINT_EVERY
    finally:
        store.close()


@pytest.mark.parametrize("level", ["NORMAL", "OFF", "normal"])
def test_a_level_that_may_lose_acknowledged_writes_warns(sqlite_url, level):
    with pytest.warns(DurabilityWarning, match="power loss") as caught:
        open_store(f"{sqlite_url}?synchronous={level}").close()
    assert f"synchronous={level.upper()}" in str(caught[0].message)


@pytest.mark.parametrize("level", ["FULL", "EXTRA"])
def test_a_durable_level_does_not_warn(sqlite_url, level):
    with warnings.catch_warnings():
        warnings.simplefilter("error", DurabilityWarning)
        open_store(f"{sqlite_url}?synchronous={level}").close()
