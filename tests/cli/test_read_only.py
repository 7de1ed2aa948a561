"""Read commands (`runs`, `show`, `events`, `why`, `verify`) open the store read-only:
they never create, convert, migrate or write-lock it. A missing store is one line
naming the path, a file that is not a qlflow store is refused and left byte for byte
as it was, a newer schema is refused with its version, and a read-only folder reads."""

from __future__ import annotations

import hashlib
import os
import sqlite3
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

import qlflow
from eventstore import StoreUsageError, open_store
from qlflow.errors import NotFound, SchemaError
from tests.cli.helpers import copy_example, one_error_line, qlflow_json
from tests.cli.helpers import qlflow as run_qlflow
from tests.cycle.helpers import T0, manifest

READ_COMMANDS = [("runs",), ("show", "run:x"), ("events",), ("why", "run:x"), ("verify",)]


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def siblings(path: Path) -> list[str]:
    return sorted(p.name for p in path.parent.iterdir())


@pytest.mark.parametrize("command", READ_COMMANDS, ids=lambda c: c[0])
def test_a_missing_store_is_one_line_naming_the_path_and_nothing_is_created(tmp_path, command):
    path = tmp_path / "typo.db"
    done = run_qlflow(*command, db=f"sqlite:///{path}", cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    line = one_error_line(done.stderr)
    assert str(path) in line and "does not exist" in line, line
    assert not path.exists()
    assert siblings(path) == []


def _foreign_database(path: Path) -> None:
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT)")
    conn.execute("INSERT INTO notes (body) VALUES ('mine, not qlflow''s')")
    conn.commit()
    conn.close()


@pytest.mark.parametrize(
    "command", [*READ_COMMANDS, ("cycle",), ("publish", "PACKAGE")], ids=lambda c: c[0]
)
def test_another_applications_sqlite_file_is_refused_unchanged(tmp_path, command):
    package = copy_example("nightly", tmp_path / "pkg")
    path = tmp_path / "app" / "other-app.db"
    path.parent.mkdir()
    _foreign_database(path)
    before, files = digest(path), siblings(path)
    args = [str(package) if part == "PACKAGE" else part for part in command]
    done = run_qlflow(*args, db=f"sqlite:///{path}", cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    line = one_error_line(done.stderr)
    assert "is not a qlflow store" in line and "notes" in line, line
    assert digest(path) == before  # byte for byte: not converted to WAL, no table added
    assert siblings(path) == files


def test_a_file_that_is_not_a_database_is_refused_unchanged(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_text("just some text, long enough to have a header of sorts\n" * 10)
    before = digest(path)
    for command in (("runs",), ("cycle",)):
        done = run_qlflow(*command, db=f"sqlite:///{path}", cwd=tmp_path)
        assert done.returncode == 2, done.stderr
        assert "is not a SQLite database" in one_error_line(done.stderr)
    assert digest(path) == before


@pytest.fixture
def store(tmp_path: Path) -> Path:
    """A qlflow store with one finished Run (run id "r1"), closed."""
    path = tmp_path / "store" / "q.db"
    path.parent.mkdir()
    with qlflow.open(f"sqlite:///{path}") as rt:
        rt.publish(manifest([("a", [])]), now_ms=T0)
        rt.start("demo", "flow", run_id="r1", now_ms=T0)
        rt.cycle(now_ms=T0 + 1)
        [lease] = rt.lease_attempts("w1", now_ms=T0 + 2)
        rt.mark_running(lease, now_ms=T0 + 3)
        rt.complete(lease, "succeeded", now_ms=T0 + 4)
        rt.cycle(now_ms=T0 + 5)
    return path


def test_a_store_from_a_newer_qlflow_is_refused_with_its_version(store: Path):
    conn = sqlite3.connect(store)
    conn.execute("UPDATE schema_versions SET version = 99 WHERE component = 'eventstore'")
    conn.commit()
    conn.close()
    before = digest(store)
    done = run_qlflow("runs", db=f"sqlite:///{store}", cwd=store.parent)
    assert done.returncode == 2, done.stderr
    line = one_error_line(done.stderr)
    assert "eventstore v99 is newer than this qlflow" in line, line
    assert digest(store) == before


def test_reads_take_no_write_lock_behind_a_long_writer(store: Path):
    url = f"sqlite:///{store}"
    holder = sqlite3.connect(store, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")  # in WAL mode: no other writer, readers go on
    try:
        started = time.monotonic()
        listed = qlflow_json("runs", db=url, cwd=store.parent)
        shown = qlflow_json("show", "r1", db=url, cwd=store.parent)
        verified = run_qlflow("verify", db=url, cwd=store.parent)
        took = time.monotonic() - started
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert [r["run_id"] for r in listed] == ["r1"]
    assert shown["status"] == "succeeded"
    assert verified.returncode == 0, verified.stderr
    # a write lock would have waited the busy timeout (5 s) and failed each command
    assert took < 15, took


def _without_root_override() -> list[str]:
    """A prefix that makes a child obey file permissions even when run as root (it
    drops the capabilities that bypass them), so a read-only folder is read-only."""
    if os.geteuid() != 0:
        return []
    return ["setpriv", "--bounding-set=-dac_override,-dac_read_search,-fowner", "--"]


@pytest.fixture
def read_only_folder(store: Path) -> Iterator[Path]:
    """The store's folder (and file) made read-only; restored afterwards."""
    store.chmod(0o444)
    store.parent.chmod(0o555)
    try:
        yield store
    finally:
        store.parent.chmod(0o755)
        store.chmod(0o644)


def test_a_read_only_folder_works_for_every_read_command(read_only_folder: Path):
    import subprocess

    from tests.cli.helpers import argv, cli_env

    store = read_only_folder
    url = f"sqlite:///{store}"
    before, files = digest(store), siblings(store)
    assert not Path(f"{store}-wal").exists()  # closed cleanly: every commit is in the file
    outputs = {}
    for command in (("runs", "--json"), ("show", "r1", "--json"), ("events"), ("why", "r1")):
        args = (command,) if isinstance(command, str) else command
        done = subprocess.run(
            [*_without_root_override(), *argv(*args, db=url)],
            cwd=tempfile.gettempdir(),
            env=cli_env(),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, (args, done.stderr)
        outputs[args[0]] = done.stdout
    verify = subprocess.run(
        [*_without_root_override(), *argv("verify", db=url)],
        cwd=tempfile.gettempdir(),
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert verify.returncode == 0, verify.stderr
    assert '"r1"' in outputs["runs"] and "succeeded" in outputs["show"]
    assert "attempt.succeeded" in outputs["events"]
    # and a write there is a store-unavailable error (exit 5), not a crash
    cycle = subprocess.run(
        [*_without_root_override(), *argv("cycle", db=url)],
        cwd=tempfile.gettempdir(),
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert cycle.returncode == 5, cycle.stderr
    assert "read-only" in one_error_line(cycle.stderr)
    assert digest(store) == before
    assert siblings(store) == files


def test_read_only_runtime_refuses_writes_and_never_migrates(store: Path):
    url = f"sqlite:///{store}"
    with qlflow.open(url, read_only=True) as rt:
        assert rt.get_run("r1").status == "succeeded"
        before = digest(store)
        with pytest.raises(StoreUsageError, match="read-only"):
            rt.cancel("r1", now_ms=T0 + 10)
        with pytest.raises(StoreUsageError, match="read-only"):
            rt.publish(manifest([("b", [])]), now_ms=T0 + 10)
    assert digest(store) == before


def test_a_store_behind_this_qlflow_is_refused_read_only_and_upgraded_by_a_write(tmp_path):
    url = f"sqlite:///{tmp_path / 'old.db'}"
    open_store(url).close()  # the event store's schema only: no read models yet
    before = digest(tmp_path / "old.db")
    with pytest.raises(SchemaError, match="read-only open never upgrades it"):
        qlflow.open(url, read_only=True)
    assert digest(tmp_path / "old.db") == before
    with qlflow.open(url) as rt:  # a write open upgrades it
        assert rt.runs() == []
    with qlflow.open(url, read_only=True) as rt:
        assert rt.runs() == []


@pytest.mark.pg
def test_postgresql_read_only_finds_no_store_and_creates_nothing(pg_url: str, tmp_path: Path):
    with pytest.raises(NotFound, match="no qlflow store in schema"):
        qlflow.open(pg_url, read_only=True)
    done = run_qlflow("runs", db=pg_url, cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert "no qlflow store in schema t_" in one_error_line(done.stderr)
    with psycopg.connect(pg_url) as conn:
        tables = conn.execute(
            "SELECT count(*) FROM pg_tables WHERE schemaname = current_schema()"
        ).fetchone()
    assert tables == (0,)


@pytest.mark.pg
def test_postgresql_read_only_sessions_are_read_only_transactions(pg_url: str):
    with qlflow.open(pg_url) as rt:
        rt.publish(manifest([("a", [])]), now_ms=T0)
    with qlflow.open(pg_url, read_only=True) as rt:
        assert rt.store.query("SHOW default_transaction_read_only") == [("on",)]
        with pytest.raises(StoreUsageError, match="read-only"):
            rt.start("demo", "flow", now_ms=T0 + 1)
        assert rt.runs() == []
        # no write lock either: a reader beside a writer holding every table's lock
        with psycopg.connect(pg_url) as writer:
            writer.execute("LOCK TABLE events, streams IN SHARE ROW EXCLUSIVE MODE")
            done = threading.Event()
            threading.Thread(target=lambda: (rt.events(), done.set()), daemon=True).start()
            assert done.wait(10)
            writer.rollback()
