"""Rebuild and verify of the read models from the log, on both stores (SPEC §9)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest

import eventstore
import qlflow
from eventstore import StoreUsageError
from projections.rebuild import ReplayCopy, projection_tables, rebuild
from projections.verify import CHANGED, EXTRA, MISSING, Difference, verify
from tests.projections.workload import T0, random_workload

ROOT = Path(__file__).resolve().parents[2]


class Interrupted(Exception):
    """Raised from a progress callback to stop a rebuild half-way."""


@pytest.fixture
def rt(store_url):
    runtime = qlflow.open(store_url)
    yield runtime
    runtime.close()


@pytest.fixture
def store(rt):
    return rt.store


def live_rows(store) -> dict[str, list[tuple]]:
    """Every row of every read-model table, ordered by its key."""
    return {
        table: [
            tuple(row) for row in store.query(f"SELECT * FROM {table} ORDER BY {', '.join(key)}")
        ]
        for table, key in projection_tables().items()
    }


def execute(store, sql: str, params=()) -> None:
    with store.transaction() as tx:
        tx.execute(sql, params)


@pytest.mark.parametrize("seed", [1, 2])
def test_rebuild_after_a_random_workload_gives_exactly_the_inline_read_models(rt, store, seed):
    random_workload(rt, seed)
    statuses = {s for (s,) in store.query("SELECT DISTINCT status FROM runs")}
    attempt_statuses = {s for (s,) in store.query("SELECT DISTINCT status FROM attempts")}
    # the workload reaches the interesting corners: failures, cancels, expiries, live work
    assert {"succeeded", "failed", "cancelled", "running"} <= statuses
    assert {"succeeded", "lost", "cancelled"} <= attempt_statuses
    before = live_rows(store)

    report = rt.verify_projections()
    assert report.ok, report.lines()
    assert report.position == store.head_position()
    for table, check in report.tables.items():
        assert check.checksum_live == check.checksum_replay
        assert check.rows == check.rows_replay == len(before[table])

    seen: list[tuple[int, int]] = []
    summary = rt.rebuild_projections(progress=lambda done, total: seen.append((done, total)))
    assert live_rows(store) == before
    assert summary.events == summary.position == store.head_position()
    assert summary.tail_events == 0
    assert summary.tables == {table: len(rows) for table, rows in before.items()}
    assert [done for done, _ in seen] == sorted(done for done, _ in seen)
    assert seen[-1] == (summary.events, summary.events)
    assert len(seen) == summary.events // 5000 + 1  # one call per batch of 5000

    again = verify(store)
    assert again.ok
    assert {t: c.checksum_live for t, c in again.tables.items()} == {
        t: c.checksum_live for t, c in report.tables.items()
    }


def test_verify_names_each_hand_altered_row_and_rebuild_repairs_it(rt, store):
    random_workload(rt, seed=3, runs=8, ticks=12)
    before = live_rows(store)
    run_id, step_key, status = store.query(
        "SELECT run_id, step_key, status FROM step_runs ORDER BY run_id, step_key LIMIT 1"
    )[0]
    attempt_id = store.query("SELECT attempt_id FROM attempts ORDER BY attempt_id LIMIT 1")[0][0]
    execute(
        store,
        "UPDATE step_runs SET status = 'x' WHERE run_id = ? AND step_key = ?",
        (run_id, step_key),
    )
    execute(store, "DELETE FROM attempts WHERE attempt_id = ?", (attempt_id,))
    execute(store, "INSERT INTO publishers (publisher, status) VALUES ('mallory', 'active')")

    report = verify(store)
    assert not report.ok
    assert {t for t, check in report.tables.items() if not check.ok} == {
        "step_runs",
        "attempts",
        "publishers",
    }
    assert report.tables["attempts"].rows == report.tables["attempts"].rows_replay - 1
    assert report.differences == [
        Difference("publishers", {"publisher": "mallory"}, EXTRA),
        Difference(
            "step_runs",
            {"run_id": run_id, "step_key": step_key},
            CHANGED,
            {"status": ("x", status)},
        ),
        Difference("attempts", {"attempt_id": attempt_id}, MISSING),
    ]
    text = "\n".join(report.lines())
    assert f"step_runs [run_id={run_id!r}, step_key={step_key!r}]" in text
    assert f"status live='x' replay={status!r}" in text
    assert attempt_id in text and "mallory" in text
    orjson.dumps(report.to_dict())  # JSON-ready for --json

    rebuild(store)
    assert live_rows(store) == before
    assert verify(store).ok


def test_a_rebuild_interrupted_half_way_leaves_the_live_read_models_intact(rt, store):
    random_workload(rt, seed=4, runs=8, ticks=12)
    # an altered row would be repaired by any swap, partial or whole: it proves there was none
    execute(store, "UPDATE runs SET version = version + 100 WHERE run_id = 'r4-001'")
    before = live_rows(store)
    calls: list[int] = []

    def stop_half_way(done: int, total: int) -> None:
        calls.append(done)
        if done >= total // 2:
            raise Interrupted

    with pytest.raises(Interrupted):
        rebuild(store, progress=stop_half_way, batch=50)
    assert 0 < calls[-1] < store.head_position()
    assert live_rows(store) == before
    report = verify(store)
    assert [(d.table, d.key, tuple(d.columns)) for d in report.differences] == [
        ("runs", {"run_id": "r4-001"}, ("version",))
    ]
    rebuild(store)  # nothing was left behind that stops the next rebuild
    assert verify(store).ok


_KILLED_CHILD = """
import sys, eventstore
from projections.rebuild import rebuild
store = eventstore.open_store(sys.argv[1])
def hang(done, total):
    if done >= 100:
        print("replaying", flush=True)
        sys.stdin.readline()  # wait here until the parent kills us
rebuild(store, progress=hang, batch=50)
print("finished", flush=True)
"""


def test_a_rebuild_killed_half_way_leaves_the_live_read_models_intact(rt, store, store_url):
    random_workload(rt, seed=5, runs=8, ticks=12)
    execute(store, "UPDATE runs SET open_steps = 99 WHERE run_id = 'r5-001'")
    before = live_rows(store)
    child = subprocess.Popen(
        [sys.executable, "-c", _KILLED_CHILD, store_url],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        text=True,
    )
    try:
        assert child.stdout.readline().strip() == "replaying"  # blocks until mid-replay
        child.send_signal(signal.SIGKILL)
        assert child.wait(timeout=30) == -signal.SIGKILL
    finally:
        if child.poll() is None:
            child.kill()
    assert live_rows(store) == before
    assert [d.table for d in verify(store).differences] == ["runs"]
    rebuild(store)
    assert verify(store).ok


@pytest.mark.parametrize("when", ["first batch", "last batch"])
def test_events_appended_during_the_replay_are_in_the_swapped_read_models(rt, store, when):
    random_workload(rt, seed=6, runs=6, ticks=10)
    head = store.head_position()
    appended: list[int] = []

    def append_while_replaying(done: int, total: int) -> None:
        if appended or (when == "last batch" and done < total):
            return
        rt.start("demo", "diamond", admission_key="late", run_id="late", now_ms=T0 + 99_000)
        rt.cycle(now_ms=T0 + 99_001)
        appended.append(store.head_position() - head)

    summary = rebuild(store, progress=append_while_replaying, batch=100)
    assert appended and appended[0] > 0
    assert summary.position == store.head_position() == head + appended[0]
    # after the last batch, only the swap transaction can pick them up
    assert summary.tail_events == (appended[0] if when == "last batch" else 0)
    assert store.query("SELECT status, version FROM runs WHERE run_id = 'late'") == [("running", 6)]
    assert verify(store).ok


def test_readers_see_the_old_rows_until_the_swap_commits(rt, store, monkeypatch):
    random_workload(rt, seed=7, runs=6, ticks=10)
    attempts = store.query("SELECT COUNT(*) FROM attempts")[0][0]
    execute(
        store,
        "DELETE FROM attempts WHERE attempt_id = (SELECT MIN(attempt_id) FROM attempts)",
    )
    reader = eventstore.open_store(store.url)  # another connection, as a reader would have
    seen_during_swap: list[int] = []
    swap = ReplayCopy.swap

    def swap_then_look(copy):
        rows = swap(copy)  # done but not committed yet
        seen_during_swap.append(reader.query("SELECT COUNT(*) FROM attempts")[0][0])
        return rows

    monkeypatch.setattr(ReplayCopy, "swap", swap_then_look)
    try:
        summary = rebuild(store)
        assert seen_during_swap == [attempts - 1]  # the old rows, never a half-empty table
        assert reader.query("SELECT COUNT(*) FROM attempts")[0][0] == attempts
        assert summary.tables["attempts"] == attempts
    finally:
        reader.close()


def test_rebuild_and_verify_of_an_empty_log(store):
    summary = rebuild(store)
    assert summary.events == summary.position == 0
    assert set(summary.tables) == set(projection_tables())
    assert not any(summary.tables.values())
    report = verify(store)
    assert report.ok and report.position == 0
    assert len({c.checksum_live for c in report.tables.values()}) == 1  # all empty alike


def test_rebuild_refuses_to_run_inside_an_open_store_transaction(store):
    with store.transaction():
        with pytest.raises(StoreUsageError):
            rebuild(store)
        with pytest.raises(StoreUsageError):
            verify(store)


def test_rebuild_throughput_is_reported(rt, store):
    random_workload(rt, seed=8, runs=4, ticks=8)
    started = time.perf_counter()
    summary = rebuild(store)
    assert 0 < summary.seconds <= time.perf_counter() - started
    document = summary.to_dict()
    assert document["events_per_second"] == pytest.approx(summary.events / summary.seconds)
    orjson.dumps(document)
