"""The rebuild's own paths (SPEC §9): its replay keeps Runs in memory between batches
and writes them when they leave — with room for almost none, every Run leaves and
comes back many times, and the rebuilt read models must still equal the inline ones;
its swap writes only the rows that differ, NULLs included."""

from __future__ import annotations

import pytest

import qlflow
from projections import runs
from projections.rebuild import rebuild
from projections.verify import verify
from tests.projections.test_rebuild import execute, live_rows
from tests.projections.workload import random_workload


@pytest.fixture
def rt(store_url):
    runtime = qlflow.open(store_url)
    yield runtime
    runtime.close()


@pytest.mark.parametrize(("capacity", "batch"), [(1, 7), (3, 50), (1, 1)])
def test_a_replay_that_keeps_few_runs_in_memory_rebuilds_the_inline_read_models(
    rt, monkeypatch, capacity, batch
):
    random_workload(rt, 3)
    store = rt.store
    before = live_rows(store)
    assert len(before["runs"]) > 3 * capacity
    monkeypatch.setattr(runs.Replay, "capacity", capacity)

    report = verify(store, batch=batch)
    assert report.ok, report.lines()
    summary = rebuild(store, batch=batch)
    assert summary.events == store.head_position()
    assert live_rows(store) == before


def test_the_swap_rewrites_rows_that_differ_only_in_a_null(rt):
    random_workload(rt, 4, runs=8, ticks=12)
    store = rt.store
    before = live_rows(store)
    (ended,) = store.query("SELECT run_id FROM runs WHERE terminal_at_ms IS NOT NULL LIMIT 1")[0]
    (running,) = store.query("SELECT run_id FROM runs WHERE terminal_at_ms IS NULL LIMIT 1")[0]
    execute(store, "UPDATE runs SET terminal_at_ms = NULL WHERE run_id = ?", (ended,))
    execute(store, "UPDATE runs SET terminal_at_ms = 1 WHERE run_id = ?", (running,))
    assert live_rows(store) != before

    summary = rebuild(store)
    assert live_rows(store) == before
    assert summary.tables["runs"] == len(before["runs"])
