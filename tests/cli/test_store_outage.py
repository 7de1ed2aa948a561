"""The store unavailable while a host works: longer than SQLite's busy timeout
(another connection holds the write lock), or PostgreSQL connections terminated
again and again. Worker writes are retried while the lease is renewed, nothing is
killed for it, and the Run still succeeds with one Attempt; hosts never give up;
`events --follow` resumes where it was; the errors are typed (StoreUnavailable)."""

from __future__ import annotations

import signal
import sqlite3
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import orjson
import psycopg
import pytest

import qlflow
from eventstore import faults
from qlflow.driver import Driver
from qlflow.errors import StoreUnavailable
from qlflow.executor import LocalProcessExecutor, PublishedTasks
from tests.cli.helpers import (
    Spawned,
    one_error_line,
    qlflow_json,
    read_pid,
    wait_for,
    write_package,
)
from tests.cli.helpers import qlflow as run_qlflow
from tests.cli.partition import Partition
from tests.cycle.helpers import T0, manifest

SQLITE_OUTAGE_S = 8.0  # longer than the busy timeout (5 s): every write in it fails
WORK = """
import os, sys, time
with open("work.pid.tmp", "w") as handle:
    handle.write(str(os.getpid()))
os.replace("work.pid.tmp", "work.pid")
time.sleep(float(sys.argv[1]))
"""


def _package(tmp_path: Path, seconds: float) -> Path:
    toml = f"""
[package]
name = "outage"
publisher = "tests"

[tasks.work]
command = ["python3", "work.py", "{seconds}"]
files = ["work.py"]

[workflows.flow]
steps = [{{ key = "work", task = "work" }}]
"""
    return write_package(tmp_path / "outage", toml, {"work.py": WORK})


def _hold_write_lock(path: str, seconds: float) -> threading.Thread:
    """Another connection takes SQLite's write lock (BEGIN EXCLUSIVE) and keeps it for
    `seconds`; returns once it holds it."""
    held = threading.Event()

    def holder() -> None:
        conn = sqlite3.connect(path, isolation_level=None)
        try:
            conn.execute("BEGIN EXCLUSIVE")
            held.set()
            threading.Event().wait(seconds)  # the outage itself, not a wait for a result
            conn.execute("ROLLBACK")
        finally:
            conn.close()

    thread = threading.Thread(target=holder, daemon=True)
    thread.start()
    assert held.wait(10), "the lock holder did not get the write lock"
    return thread


def _terminate(server_url: str, application: str) -> int:
    """Terminate every backend of `application` and wait until each is gone."""
    with psycopg.connect(server_url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pg_terminate_backend(pid, 5000) FROM pg_stat_activity "
            "WHERE application_name = %s",
            (application,),
        ).fetchall()
    return len(rows)


@pytest.fixture
def outage_url(request: pytest.FixtureRequest, store_url: str) -> Iterator[tuple[str, str]]:
    """(url, application name): a PostgreSQL URL names its connections for the storm."""
    application = f"qlflow-outage-{uuid.uuid4().hex[:12]}"
    url = (
        store_url
        if store_url.startswith("sqlite")
        else f"{store_url}&application_name={application}"
    )
    yield url, application
    faults.disarm()


def test_a_step_runs_through_a_store_outage_and_the_run_succeeds_with_one_attempt(
    outage_url: tuple[str, str], tmp_path: Path, request: pytest.FixtureRequest
):
    """SQLite: another connection holds the write lock for 8 s as the Attempt is
    recorded running, and again as it completes. PostgreSQL: the host's connections
    are terminated as the Attempt is recorded running, and then every time its
    completion is about to commit, for longer than the lease lives — the lease must
    be renewed between those tries."""
    url, application = outage_url
    sqlite = url.startswith("sqlite")
    folder = _package(tmp_path, 10.0 if sqlite else 2.0)
    ttl_ms = 30_000 if sqlite else 5_000
    rt = qlflow.open(url)
    threads: list[threading.Thread] = []
    try:
        rt.publish(folder)
        run_id = rt.start("outage", "flow").run_id
        if sqlite:
            path = url.removeprefix("sqlite:///")

            def outage() -> None:
                threads.append(_hold_write_lock(path, SQLITE_OUTAGE_S))

            faults.arm("running.before_begin", outage, nth=1)
            faults.arm("complete.before_begin", outage, nth=1)
        else:
            server = request.getfixturevalue("pg_server_url")
            until: list[float] = []

            def terminate() -> None:
                _terminate(server, application)  # the connection in use dies too

            def terminate_for_a_while() -> None:
                until.append(until[0] if until else time.monotonic() + 2 * ttl_ms / 1000)
                if time.monotonic() < until[0]:
                    terminate()

            faults.arm("running.after_begin", terminate, nth=1)
            faults.arm("complete.before_commit", terminate_for_a_while)
        tasks = PublishedTasks(rt, {"outage": folder})
        executor = LocalProcessExecutor(rt, tasks.resolve, log_dir=tmp_path / "logs", ttl_ms=ttl_ms)
        driver = Driver(
            rt, executor, worker_id="outage", interval_ms=100, ttl_ms=ttl_ms, until_run=run_id
        )
        runner = threading.Thread(target=driver.run, daemon=True)
        runner.start()
        runner.join(90)
        assert not runner.is_alive(), "the host did not finish the Run"
        executor.close()
        counts = faults.counts()
        run = rt.get_run(run_id)
        renewals = [e for e in rt.timeline(run_id) if e.type == "lease.renewed"]
    finally:
        faults.disarm()
        for thread in threads:
            thread.join(30)
        rt.close()
    step = run.steps["work"]
    assert run.status == "succeeded", (run.status, step)
    [attempt] = step.attempts
    assert attempt.status == "succeeded"
    assert attempt.exit_code == 0  # it ran to its end: never killed
    assert attempt.pid == read_pid(folder / "work.pid")
    # each write that met the outage was tried again (and got through)
    assert counts["running.before_begin"] >= 2, counts
    assert counts["complete.before_begin"] >= 2, counts
    if not sqlite:
        # the completion failed for twice the TTL: the lease lived on by renewals
        assert counts["complete.before_begin"] >= 5, counts
        assert len(renewals) >= 2, renewals


def test_serve_keeps_going_through_an_outage_and_says_so(tmp_path: Path):
    # A short busy timeout: each tick fails fast, so the old host gave up (30 failed
    # ticks in a row) long before this outage ended.
    path = tmp_path / "q.db"
    db = f"sqlite:///{path}?busy_timeout_ms=200"
    folder = _package(tmp_path, 1.0)
    assert qlflow_json("publish", str(folder), db=db, cwd=tmp_path)
    receipt = qlflow_json("start", "outage", "flow", db=db, cwd=tmp_path)
    assert run_qlflow("cycle", db=db, cwd=tmp_path).returncode == 0  # its Attempt is claimed
    lock = _hold_write_lock(str(path), 10.0)
    serve = Spawned(
        "serve", "--package-dir", str(folder), "--interval-ms", "100", db=db, cwd=tmp_path
    )
    try:
        # a write command in the outage: one line, exit status 5
        refused = run_qlflow("cancel", receipt["run_id"], db=db, cwd=tmp_path)
        assert refused.returncode == 5, refused.stderr
        assert "database is locked" in one_error_line(refused.stderr)
        lock.join(30)
        assert serve.process.poll() is None, serve.stderr  # still serving

        def finished() -> dict | None:
            shown = qlflow_json("show", receipt["run_id"], db=db, cwd=tmp_path)
            return shown if shown["status"] != "running" else None

        shown = wait_for(finished, 60, "the Run to end")
        assert serve.process.poll() is None, serve.stderr
        serve.process.send_signal(signal.SIGTERM)
        assert serve.wait(30) == 0, serve.stderr
    finally:
        serve.kill()
    assert shown["status"] == "succeeded", shown
    [attempt] = shown["steps"]["work"]["attempts"]
    assert (attempt["status"], attempt["execution"]["exit_code"]) == ("succeeded", 0)
    stderr = serve.stderr
    assert "the store is unavailable" in stderr, stderr
    assert "the store answers again" in stderr, stderr
    assert "Traceback" not in stderr, stderr
    assert len(stderr.splitlines()) < 40, stderr  # a few lines for a 10 s outage, not one a tick


def test_a_full_disk_is_a_typed_store_unavailable_and_writes_nothing(tmp_path: Path):
    with qlflow.open(f"sqlite:///{tmp_path / 'full.db'}") as rt:
        rt.publish(manifest([("a", [])]), now_ms=T0)
        pages = rt.store.query("PRAGMA page_count")[0][0]
        rt.store.query(f"PRAGMA max_page_count = {pages}")  # the file may not grow: full
        before = rt.store.head_position()
        big = manifest([(f"step{i:03d}", []) for i in range(120)], package="big")
        with pytest.raises(StoreUnavailable) as caught:
            rt.publish(big, now_ms=T0 + 1)
        assert caught.value.reason == "disk_full"
        assert "full" in str(caught.value)
        assert rt.store.head_position() == before


@pytest.mark.pg
def test_pooled_connections_the_server_closed_are_replaced(pg_url: str, pg_server_url: str):
    application = f"qlflow-idle-{uuid.uuid4().hex[:12]}"
    with qlflow.open(f"{pg_url}&application_name={application}") as rt:
        rt.publish(manifest([("a", [])]), now_ms=T0)
        assert _terminate(pg_server_url, application) >= 1  # every idle pooled connection
        # the first call after that gets a checked connection, not a dead one
        run_id = rt.start("demo", "flow", now_ms=T0 + 1).run_id
        rt.cycle(now_ms=T0 + 2)
        assert rt.get_run(run_id).steps["a"].attempts[0].status == "claimed"


@pytest.mark.pg
def test_events_follow_resumes_after_the_network_to_the_server_is_cut(pg_url: str, tmp_path: Path):
    partition = Partition(pg_url)
    with qlflow.open(pg_url) as rt:
        rt.publish(manifest([("a", [])]), now_ms=T0)
        follow = Spawned(
            "--connect-timeout-s",
            "1",
            "events",
            "--follow",
            "--json",
            "--interval-ms",
            "100",
            db=partition.url,
            cwd=tmp_path,
        )

        def printed() -> list[dict]:
            return [orjson.loads(line) for line in follow.stdout.splitlines()]

        try:
            first = wait_for(printed, 30, "the first events")
            partition.cut()
            wait_for(lambda: partition.refused, 30, "the follow to try to reconnect")
            for n in range(3):  # events committed while it cannot reach the server
                rt.start("demo", "flow", run_id=f"in-the-cut-{n}", now_ms=T0 + n)
            wait_for(lambda: "retrying" in follow.stderr, 30, "the follow to say so")
            partition.heal()
            head = rt.store.head_position()
            wait_for(lambda: printed()[-1]["global_position"] == head, 60, "it to catch up")
        finally:
            follow.process.send_signal(signal.SIGTERM)
            follow.wait(30)
            follow.kill()
            partition.close()
    positions = [record["global_position"] for record in printed()]
    assert positions[: len(first)] == [r["global_position"] for r in first]
    assert positions == list(range(1, head + 1))  # each once, none missing
    assert "the store is unavailable, retrying" in follow.stderr, follow.stderr
    assert "resuming after position" in follow.stderr, follow.stderr
