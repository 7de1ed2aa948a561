"""Transient store errors never end work: while a step runs and as it ends, its
host's PostgreSQL backends are terminated again and again for seconds (a storm, not
a fault at one chosen point), or another SQLite connection holds the write lock
(BEGIN IMMEDIATE) past the busy timeout. Every write the host makes for the step —
task lookup, start, renewals, log pieces, its completion, the next step's lease —
is tried again until the store answers; the step succeeds with one Attempt and its
dependent runs."""

from __future__ import annotations

import sqlite3
import threading
import time
import uuid
from pathlib import Path

import psycopg
import pytest

import qlflow
from qlflow.driver import Driver
from qlflow.executor import LocalProcessExecutor, PublishedTasks
from tests.cli.helpers import read_pid, wait_for, write_package

STORM_S = 4.0  # how long the store keeps failing: shorter than the lease, so it must live
TTL_MS = 10_000
WORK = """
import json, os, sys, time
with open("work.pid.tmp", "w") as handle:
    handle.write(str(os.getpid()))
os.replace("work.pid.tmp", "work.pid")
for i in range(int(sys.argv[1])):
    print("tick", i, flush=True)  # log pieces sent while the store fails
    time.sleep(0.1)
json.dump({"rows": 3}, open(os.environ["QLFLOW_OUTPUT"], "w"))
"""
TOML = """
[package]
name = "storm"
publisher = "tests"

[tasks.work]
command = ["python3", "work.py", "{ticks}"]
files = ["work.py"]

[tasks.after]
command = ["sh", "-c", "cat $QLFLOW_INPUTS > after.json"]

[workflows.flow]
steps = [{{ key = "work", task = "work" }}, {{ key = "after", task = "after", needs = ["work"] }}]
"""


def _terminator(server_url: str, application: str, stop: threading.Event) -> int:
    """Terminate every backend of `application`, again and again, until `stop` is set
    or STORM_S has passed; returns how many it terminated."""
    killed = 0
    deadline = time.monotonic() + STORM_S
    with psycopg.connect(server_url, autocommit=True) as conn:
        while not stop.is_set() and time.monotonic() < deadline:
            rows = conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE application_name = %s",
                (application,),
            ).fetchall()
            killed += len(rows)
            stop.wait(0.02)  # a storm, not a busy loop
    return killed


def _lock_holder(path: str, stop: threading.Event) -> int:
    """Hold SQLite's write lock (BEGIN IMMEDIATE) again and again for STORM_S, each time
    far past the store's busy timeout, letting go for a moment in between; returns how
    many times it took it."""
    taken = 0
    deadline = time.monotonic() + STORM_S
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        while not stop.is_set() and time.monotonic() < deadline:
            conn.execute("BEGIN IMMEDIATE")
            taken += 1
            stop.wait(1.0)  # the busy timeout is 300 ms: every write meanwhile fails
            conn.execute("ROLLBACK")
            stop.wait(0.05)
    finally:
        conn.close()
    return taken


@pytest.mark.parametrize("store", ["sqlite", pytest.param("postgresql", marks=pytest.mark.pg)])
def test_a_store_storm_during_a_running_step_never_ends_it(store, tmp_path: Path, request):
    application = f"qlflow-storm-{uuid.uuid4().hex[:12]}"
    sqlite = store == "sqlite"
    if sqlite:
        path = tmp_path / "q.db"
        url = f"sqlite:///{path}?busy_timeout_ms=300"
    else:
        url = f"{request.getfixturevalue('pg_url')}&application_name={application}"
    folder = write_package(tmp_path / "storm", TOML.format(ticks=20), {"work.py": WORK})
    ttl_ms = TTL_MS
    rt = qlflow.open(url)
    stop = threading.Event()
    storm_result: list[int] = []
    try:
        rt.publish(folder)
        run_id = rt.start("storm", "flow").run_id
        tasks = PublishedTasks(rt, {"storm": folder})
        executor = LocalProcessExecutor(rt, tasks.resolve, log_dir=tmp_path / "logs", ttl_ms=ttl_ms)
        driver = Driver(
            rt, executor, worker_id="storm", interval_ms=100, ttl_ms=ttl_ms, until_run=run_id
        )
        runner = threading.Thread(target=driver.run, daemon=True)
        runner.start()
        wait_for(lambda: read_pid(folder / "work.pid"), 30, "the step to start")
        if sqlite:
            storm = lambda: storm_result.append(_lock_holder(str(path), stop))  # noqa: E731
        else:
            server = request.getfixturevalue("pg_server_url")
            storm = lambda: storm_result.append(_terminator(server, application, stop))  # noqa: E731
        stormer = threading.Thread(target=storm, daemon=True)
        stormer.start()
        runner.join(120)
        stop.set()
        stormer.join(30)
        assert not runner.is_alive(), "the host did not finish the Run"
        executor.close()
        run = rt.get_run(run_id)
    finally:
        stop.set()
        rt.close()
    assert storm_result and storm_result[0] > 0, "the storm never hit the store"
    work = run.steps["work"]
    assert (run.status, work.status) == ("succeeded", "succeeded"), (run.status, work)
    [attempt] = work.attempts  # one Attempt: nothing failed, nothing ran twice
    assert (attempt.status, attempt.exit_code, attempt.output) == ("succeeded", 0, {"rows": 3})
    assert run.steps["after"].status == "succeeded"
    assert '"work":{"rows":3}' in (folder / "after.json").read_text().replace(" ", "")
