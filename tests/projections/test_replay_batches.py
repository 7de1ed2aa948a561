"""Rebuild and verify fold each Run once, from the records the replay read (docs/DESIGN.md,
"Rebuild"): over a log whose Runs interleave, with batch boundaries inside Runs and
inside single appends, with Runs leaving memory and coming back, and with held Runs
folded part-way, their rows and candidate windows are exactly what the append-time
projection wrote (both stores)."""

from __future__ import annotations

import orjson
import pytest

import qlflow
from domain.phases import RUN_PHASES
from projections import runs, runs_replay
from projections.rebuild import rebuild
from projections.verify import verify
from tests.projections.test_rebuild import live_rows
from tests.projections.workload import random_workload


@pytest.fixture
def rt(store_url):
    runtime = qlflow.open(store_url)
    random_workload(runtime, seed=5, runs=12, ticks=30)
    yield runtime
    runtime.close()


def batches_of_each_run(store, batch: int) -> dict[str, set[int]]:
    """Run id -> the numbers of the replay batches (of `batch` events) holding its records."""
    spans: dict[str, set[int]] = {}
    attempts: dict[str, str] = {}
    rows = store.query("SELECT global_position, stream_id, type, data FROM events")
    for number, (_position, stream, kind, data) in enumerate(sorted(rows)):
        family, _, entity = stream.partition("-")
        if kind == "attempt.claimed":
            attempts[orjson.loads(data)["attempt_id"]] = entity
        run_id = attempts.get(entity) if family == "lease" else entity
        if family in ("run", "steps", "lease") and run_id is not None:
            spans.setdefault(run_id, set()).add(number // batch)
    return spans


def appends_split(store, batch: int) -> int:
    """How many batch boundaries fall between a step.* RunEvent and its StepRunMutation."""
    rows = sorted(store.query("SELECT global_position, event_id, type, data FROM events"))
    number_of = {event_id: number for number, (_p, event_id, _t, _d) in enumerate(rows)}
    split = 0
    for number, (_position, _event_id, kind, data) in enumerate(rows):
        if kind == "step_run.mutated":
            event = number_of[orjson.loads(data)["event_id"]]
            split += event // batch != number // batch
    return split


@pytest.mark.parametrize(
    ("batch", "capacity", "held_records"),
    [(5000, runs_replay.REPLAY_RUNS, runs_replay.HELD_RECORDS), (13, 4, 9), (2, 2, 1)],
)
def test_rebuild_and_verify_equal_the_append_time_projection_across_batches(
    rt, monkeypatch, batch, capacity, held_records
):
    store = rt.store
    spans = batches_of_each_run(store, batch)
    if batch < 5000:  # the log is cut inside Runs, and inside appends
        assert sum(len(numbers) > 3 for numbers in spans.values()) >= 6
        assert appends_split(store, batch) >= 3
        assert len(spans) > 2 * capacity  # Runs leave memory and come back
    before = live_rows(store)
    opens = " OR ".join(f"{phase}_opens_ms IS NOT NULL" for phase in RUN_PHASES)
    assert store.query(f"SELECT COUNT(*) FROM runs WHERE {opens}")[0][0] > 0  # open windows
    monkeypatch.setattr(runs.Replay, "capacity", capacity)
    monkeypatch.setattr(runs_replay, "HELD_RECORDS", held_records)

    report = verify(store, batch=batch)
    assert report.ok, report.lines()
    assert report.position == store.head_position()
    for table, check in report.tables.items():
        assert check.rows == check.rows_replay == len(before[table])
        assert check.checksum_live == check.checksum_replay

    summary = rebuild(store, batch=batch)
    assert summary.events == store.head_position()
    assert live_rows(store) == before
