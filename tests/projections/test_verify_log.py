"""`verify` checks the log itself: each problem named by stream, version and
position, never a crash (both stores)."""

from __future__ import annotations

import pytest

import qlflow
from domain.errors import CorruptionError
from domain.streams import retention_stream
from projections.log_check import DOCUMENT
from projections.rebuild import rebuild
from projections.verify import verify
from tests.projections.workload import random_workload


@pytest.fixture
def rt(store_url):
    runtime = qlflow.open(store_url)
    random_workload(runtime, seed=3, runs=4, ticks=8)
    yield runtime
    runtime.close()


def execute(store, sql: str, params=()) -> None:
    with store.transaction() as tx:
        tx.execute(sql, params)


def middle_event_of_a_run(store) -> tuple[str, int, int]:
    """(stream, version, position) of an event that is neither first nor last of a run-."""
    [(stream, _last)] = store.query(
        "SELECT stream_id, version FROM streams WHERE stream_id LIKE 'run-%' AND version >= 3 "
        "ORDER BY stream_id LIMIT 1"
    )
    [(position,)] = store.query(
        "SELECT global_position FROM events WHERE stream_id = ? AND stream_version = 2",
        (stream,),
    )
    return stream, 2, position


def test_a_sound_log_verifies(rt):
    report = verify(rt.store)

    assert report.ok, report.lines()
    assert report.log_problems == []
    assert report.lines()[0].startswith("the log is sound")


def test_a_deleted_event_is_named(rt):
    stream, version, position = middle_event_of_a_run(rt.store)
    execute(rt.store, "DELETE FROM events WHERE global_position = ?", (position,))

    report = verify(rt.store)

    assert not report.ok
    [gap] = [p for p in report.log_problems if "not contiguous" in p.problem]
    assert (gap.stream, gap.version) == (stream, version + 1)
    assert f"versions {version} to {version} are missing" in gap.problem
    assert any(f"stream {stream}, version {version + 1}" in line for line in report.lines())


def test_a_head_moved_back_is_named(rt):
    [(stream, head)] = rt.store.query(
        "SELECT stream_id, version FROM streams WHERE stream_id LIKE 'run-%' AND version >= 2 "
        "ORDER BY stream_id LIMIT 1"
    )
    execute(rt.store, "UPDATE streams SET version = ? WHERE stream_id = ?", (head - 1, stream))

    report = verify(rt.store)

    assert not report.ok
    [moved] = report.log_problems
    assert (moved.stream, moved.version) == (stream, head)
    assert moved.problem == f"head says {head - 1}, the last event is version {head}"


def test_a_broken_document_is_named_not_a_crash(rt):
    stream, version, position = middle_event_of_a_run(rt.store)
    execute(
        rt.store,
        'UPDATE events SET data = \'{"plan": {"run\' WHERE global_position = ?',
        (position,),
    )

    report = verify(rt.store)

    assert not report.ok
    [broken] = report.log_problems
    assert (broken.stream, broken.version, broken.position) == (stream, version, position)
    assert broken.kind == DOCUMENT
    assert broken.problem.startswith("data is not valid JSON")
    assert report.tables == {}  # not replayed: the replay could only stop there


def test_a_document_that_is_not_an_object_is_named(rt):
    stream, _version, position = middle_event_of_a_run(rt.store)
    execute(rt.store, "UPDATE events SET metadata = '[1]' WHERE global_position = ?", (position,))

    report = verify(rt.store)

    [broken] = report.log_problems
    assert (broken.stream, broken.position) == (stream, position)
    assert broken.problem == "metadata is list, not an object"


def test_positions_that_do_not_follow_versions_are_named(rt):
    stream, version, position = middle_event_of_a_run(rt.store)
    [(top,)] = rt.store.query("SELECT max(global_position) FROM events")
    # version 2 moved after every later version of its stream
    execute(
        rt.store,
        "UPDATE events SET global_position = ? WHERE global_position = ?",
        (top + 10**6, position),
    )

    report = verify(rt.store)

    assert not report.ok
    problems = {(p.stream, p.version, p.position) for p in report.log_problems}
    assert (stream, version, top + 10**6) in problems
    # the positions it left and skipped are gaps no retention record names
    gaps = {(p.position, p.problem) for p in report.log_problems if p.stream == retention_stream()}
    assert gaps == {
        (first, f"positions {first} to {last} are missing and no retention record names them")
        for first, last in ((position, position), (top + 1, top + 10**6 - 1))
    }
    assert all(p.stream in (stream, "*", retention_stream()) for p in report.log_problems)


def test_rebuild_names_a_broken_document_and_changes_nothing(rt):
    stream, version, position = middle_event_of_a_run(rt.store)
    execute(rt.store, "UPDATE events SET data = '{\"pl' WHERE global_position = ?", (position,))
    runs_before = rt.store.query("SELECT * FROM runs ORDER BY run_id")

    with pytest.raises(CorruptionError) as caught:
        rebuild(rt.store)

    assert f"stream {stream}, version {version}, position {position}" in str(caught.value)
    assert rt.store.query("SELECT * FROM runs ORDER BY run_id") == runs_before


def two_step_created_events(store) -> list[tuple[str, int]]:
    """(stream, position) of the first step.created of two Runs."""
    rows = store.query(
        "SELECT stream_id, global_position FROM events WHERE type = 'step.created' "
        "AND stream_version = 2 ORDER BY stream_id LIMIT 2"
    )
    assert len(rows) == 2
    return [(stream, position) for stream, position in rows]


def emptied(store) -> list[tuple[str, int]]:
    """Two step.created documents emptied (as a store written before the append's
    shape check could hold them)."""
    chosen = two_step_created_events(store)
    for _stream, position in chosen:
        execute(store, "UPDATE events SET data = '{}' WHERE global_position = ?", (position,))
    return chosen


def test_every_event_its_fold_cannot_read_is_named(rt):
    chosen = emptied(rt.store)

    report = verify(rt.store)

    assert not report.ok
    named = {(p.stream, p.version, p.position): p.problem for p in report.log_problems}
    for stream, position in chosen:
        assert named[(stream, 2, position)] == (
            "step.created data lacks step_run_id, step_key, status, epoch"
        )


def test_rebuild_names_every_event_its_fold_cannot_read(rt):
    chosen = emptied(rt.store)
    runs_before = rt.store.query("SELECT * FROM runs ORDER BY run_id")

    with pytest.raises(CorruptionError) as caught:
        rebuild(rt.store)

    assert "2 record(s)" in str(caught.value)
    for stream, position in chosen:
        assert f"stream {stream}, version 2, position {position}" in str(caught.value)
    assert rt.store.query("SELECT * FROM runs ORDER BY run_id") == runs_before


def test_the_check_goes_on_past_where_the_folds_stop(rt):
    # verify checks the log on the replay's own read: a gap early on stops the folds,
    # and a broken document at the very end is still found
    stream, _version, position = middle_event_of_a_run(rt.store)
    execute(rt.store, "DELETE FROM events WHERE global_position = ?", (position,))
    [(top, last_stream)] = rt.store.query(
        "SELECT global_position, stream_id FROM events ORDER BY global_position DESC LIMIT 1"
    )
    execute(rt.store, "UPDATE events SET metadata = '[1]' WHERE global_position = ?", (top,))

    report = verify(rt.store)

    assert not report.ok
    found = {(p.stream, p.position, p.kind) for p in report.log_problems}
    assert (last_stream, top, DOCUMENT) in found
    assert any(p.stream == stream and "not contiguous" in p.problem for p in report.log_problems)
    assert report.tables == {}
