"""`Runtime.retain` on both stores: finished Runs go in bounded batches with
everything that is theirs, each batch named by a retention record; verify proves the
gaps are exactly what the records name and rebuild equals the read models; bad input
is a typed error with nothing removed."""

from __future__ import annotations

import json
import sqlite3
from contextlib import closing

import pytest

import qlflow
from domain import streams
from domain.errors import AdmissionCollision, InvalidInput, NotFound
from domain.event_types import EventType
from domain.retention import removed_runs
from domain.values import receipt_stream_id
from eventstore import faults, logs
from eventstore.api import StoreUsageError
from qlflow import archive as archiving
from tests.rerun.support import T0, drive, manifest
from tests.retention.support import event_count, finished_runs


@pytest.fixture
def rt(store_url):
    with qlflow.open(store_url) as runtime:
        yield runtime


def _run_rows(rt, run_id: str) -> list[int]:
    return [
        rt.store.query(f"SELECT COUNT(*) FROM {table} WHERE run_id = ?", (run_id,))[0][0]
        for table in ("runs", "step_runs", "attempts")
    ]


def test_finished_runs_go_in_batches_and_the_rest_of_the_log_still_verifies(rt):
    run_ids = finished_runs(rt, 5)
    head = rt.store.head_position()

    report = rt.retain(T0 + 3000, batch=2, now_ms=T0 + 10_000)

    assert report.run_ids == run_ids[:3]  # oldest first; the two newer stay
    assert [len(b.run_ids) for b in report.batches] == [2, 1]
    for run_id in run_ids[:3]:
        with pytest.raises(NotFound):
            rt.get_run(run_id)
        assert _run_rows(rt, run_id) == [0, 0, 0]
        assert rt.store.read_stream(streams.run_stream(run_id)) == []
        assert rt.store.read_stream(streams.steps_stream(run_id)) == []
    for run_id in run_ids[3:]:
        assert rt.get_run(run_id).status == "succeeded"
    assert report.attempt_ids
    leases = [streams.lease_stream(a) for a in report.attempt_ids]
    assert rt.store.stream_versions(leases) == dict.fromkeys(leases, 0)
    records = rt.store.read_stream(streams.retention_stream())
    assert [r.type for r in records] == [EventType.RETENTION_REMOVED] * 2
    first = records[0].data
    assert [run["run_id"] for run in removed_runs(first)] == run_ids[:2]
    assert all(run["last_version"] > 0 for run in removed_runs(first))
    assert first["events"] == report.batches[0].events
    assert first["digest"].startswith("sha256:")
    # positions are never reused: the records sit past the log's old head
    assert [r.global_position for r in records] == [head + 1, head + 2]
    assert event_count(rt) == head + 2 - report.events

    assert rt.verify_projections().ok
    rt.rebuild_projections()
    assert rt.verify_projections().ok
    # a new append goes past the record too
    run_id = rt.start("daily", "nightly", admission_key="after", now_ms=T0 + 20_000).run_id
    assert rt.store.read_stream(streams.run_stream(run_id))[0].global_position > head + 2


def test_a_dry_run_says_what_would_go_and_writes_nothing(rt):
    run_ids = finished_runs(rt, 3)
    head = rt.store.head_position()

    report = rt.retain(T0 + 5000, batch=2, dry_run=True, now_ms=T0 + 10_000)

    assert report.run_ids == run_ids and report.events > 0
    assert rt.store.head_position() == head
    assert all(rt.get_run(run_id).status == "succeeded" for run_id in run_ids)


def test_a_running_run_and_the_source_of_a_running_rerun_stay(rt):
    (source, other) = finished_runs(rt, 2, fail=frozenset({"right"}))
    rerun = rt.rerun(source, now_ms=T0 + 5000).run_id
    running = rt.start("daily", "nightly", admission_key="running", now_ms=T0 + 5000).run_id

    report = rt.retain(T0 + 9000, now_ms=T0 + 10_000)

    assert report.run_ids == [other]
    assert rt.get_run(source).status == "failed"
    assert rt.get_run(running).status == "running"
    drive(rt, rerun, T0 + 6000)
    assert rt.get_run(rerun).status == "succeeded"
    assert rt.retain(T0 + 5500, now_ms=T0 + 10_000).run_ids == [source]
    assert rt.get_run(rerun).rerun_of == source
    assert rt.verify_projections().ok


def test_nothing_old_enough_removes_nothing_and_writes_no_record(rt):
    finished_runs(rt, 2)
    head = rt.store.head_position()
    assert rt.retain(T0, now_ms=T0 + 10_000).run_ids == []
    assert rt.store.head_position() == head


@pytest.mark.parametrize(
    ("cutoff", "kw"),
    [
        (0, {}),
        (-5, {}),
        (T0 + 20_000, {}),  # in the future of now
        ("yesterday", {}),
        (True, {}),
        (T0 + 5000, {"batch": 0}),
        (T0 + 5000, {"batch": 10_001}),
        (T0 + 5000, {"dry_run": "yes"}),
        (T0 + 5000, {"max_batches": 0}),
    ],
)
def test_bad_input_is_a_typed_error_and_nothing_goes(rt, cutoff, kw):
    finished_runs(rt, 2)
    head, events = rt.store.head_position(), event_count(rt)
    with pytest.raises(InvalidInput):
        rt.retain(cutoff, now_ms=T0 + 10_000, **kw)
    assert (rt.store.head_position(), event_count(rt)) == (head, events)


def test_a_read_only_store_refuses_and_nothing_goes(store_url):
    with qlflow.open(store_url) as rt:
        finished_runs(rt, 2)
        events = event_count(rt)
    with qlflow.open(store_url, read_only=True) as ro:
        with pytest.raises(StoreUsageError):
            ro.retain(T0 + 5000, now_ms=T0 + 10_000)
        assert len(ro.retain(T0 + 5000, now_ms=T0 + 10_000, dry_run=True).run_ids) == 2
        assert event_count(ro) == events


@pytest.mark.parametrize(
    "point",
    ["retention.archived", "retention.recorded", "retention.deleted", "retention.before_commit"],
)
def test_a_failure_at_any_commit_point_leaves_the_batch_whole(rt, point, tmp_path):
    run_ids = finished_runs(rt, 3)
    head, events = rt.store.head_position(), event_count(rt)
    archive = tmp_path / "old.db"
    faults.arm(point, "raise")
    try:
        with pytest.raises(faults.InjectedFault):
            rt.retain(T0 + 5000, batch=2, archive=archive, now_ms=T0 + 10_000)
    finally:
        faults.disarm()
    assert (rt.store.head_position(), event_count(rt)) == (head, events)
    assert all(rt.get_run(run_id).status == "succeeded" for run_id in run_ids)
    assert all(rt.inspect_admission(admission_key=f"key-{n}").removed is None for n in range(3))
    # resumed: the next call removes them all, into the same archive
    report = rt.retain(T0 + 5000, batch=2, archive=archive, now_ms=T0 + 10_000)
    assert report.run_ids == run_ids
    assert all(archiving.archived_records(archive, run_id) for run_id in run_ids)
    assert rt.verify_projections().ok


def test_verify_names_a_gap_no_retention_record_covers(rt):
    finished_runs(rt, 2)
    rt.retain(T0 + 500, now_ms=T0 + 10_000)
    assert rt.verify_projections().ok
    # a stream removed behind retention's back: a gap no record names
    victim = "admission-" + rt.store.streams_with_prefix("admission-")[0].partition("-")[2]
    with rt.store.transaction() as tx:
        (position,) = tx.query("SELECT global_position FROM events WHERE stream_id = ?", (victim,))[
            0
        ]
        tx.execute("DELETE FROM events WHERE stream_id = ?", (victim,))
        tx.execute("DELETE FROM streams WHERE stream_id = ?", (victim,))
    report = rt.verify_projections()
    assert not report.ok
    lines = [problem.line() for problem in report.log_problems]
    gap = f"positions {position} to {position} are missing and no retention record"
    assert any(gap in line for line in lines)


def test_the_admission_key_of_a_removed_run_still_answers_existing_with_it(rt):
    (removed, kept) = finished_runs(rt, 2)
    rt.retain(T0 + 500, now_ms=T0 + 10_000)
    head = rt.store.head_position()
    # the key's receipt stream went with the Run: its tombstone answers for it
    assert rt.store.read_stream(receipt_stream_id("key-0")) == []
    assert rt.store.read_stream(receipt_stream_id("key-1")) != []

    again = rt.start("daily", "nightly", admission_key="key-0", now_ms=T0 + 20_000)

    assert (again.status, again.run_id) == ("existing", removed)
    assert again.removed == "removed by retention at 2027-01-15 08:00:10 UTC"
    assert rt.store.head_position() == head  # never a second Run
    inspected = rt.inspect_admission(admission_key="key-0")
    assert inspected is not None and inspected.removed == again.removed
    assert rt.inspect_admission(run_id=removed).removed == again.removed
    assert rt.inspect_admission(admission_key="key-1").removed is None
    with pytest.raises(NotFound, match="pruned by retention on 2027-01-15 08:00:10 UTC"):
        rt.get_run(removed)
    with pytest.raises(NotFound, match="pruned by retention"):
        rt.why(removed)
    assert rt.get_run(kept).status == "succeeded"


def _answer(receipt) -> dict:
    """What a receipt says, but its steps (they went with the Run) and its status."""
    found = dict(receipt.document())
    del found["steps"], found["receipt_digest"]  # the document's digest covers the steps
    return {**found, "receipt_digest": receipt.receipt_digest}


def test_a_removed_runs_tombstone_keeps_its_receipt_and_exact_replay(rt):
    (removed, kept) = finished_runs(rt, 2)
    admitted = rt.inspect_admission(admission_key="key-0")
    rows = rt.store.query("SELECT COUNT(*) FROM admission_receipts")[0][0]

    rt.retain(T0 + 500, now_ms=T0 + 10_000)
    head, events = rt.store.head_position(), event_count(rt)

    assert rt.store.query("SELECT COUNT(*) FROM admission_receipts")[0][0] == rows - 1
    again = rt.start("daily", "nightly", admission_key="key-0", now_ms=T0 + 20_000)
    assert again.status == "existing" and again.steps == ()
    assert _answer(again) == _answer(admitted)
    assert _answer(rt.inspect_admission(run_id=removed)) == _answer(admitted)
    # exact replay: the same key with another plan is a collision, as before removal
    with pytest.raises(AdmissionCollision, match="key-0"):
        rt.start("daily", "nightly", admission_key="key-0", params={"day": "tue"}, now_ms=T0)
    # and the removed Run's id is never used again, under any key
    with pytest.raises(AdmissionCollision, match="removed by retention"):
        rt.start("daily", "nightly", admission_key="other", run_id=removed, now_ms=T0)
    assert (rt.store.head_position(), event_count(rt)) == (head, events)

    # rebuild makes the tombstones again from the retention records
    rt.rebuild_projections()
    assert rt.verify_projections().ok
    rebuilt = rt.start("daily", "nightly", admission_key="key-0", now_ms=T0 + 30_000)
    assert (rebuilt.status, _answer(rebuilt), rebuilt.removed) == (
        "existing",
        _answer(admitted),
        again.removed,
    )
    assert rt.inspect_admission(admission_key="key-1").run_id == kept
    assert rt.store.head_position() == head


def test_an_archive_holds_every_removed_event_before_they_go(rt, tmp_path):
    run_ids = finished_runs(rt, 3)
    archive = tmp_path / "old.db"
    before = {run_id: rt.events(run_id, limit=None) for run_id in run_ids[:2]}
    receipts = [rt.store.read_stream(receipt_stream_id(f"key-{n}")) for n in range(2)]

    report = rt.retain(T0 + 1500, archive=archive, batch=1, now_ms=T0 + 10_000)

    assert report.run_ids == run_ids[:2]
    for n, run_id in enumerate(run_ids[:2]):
        archived = archiving.archived_records(archive, run_id)
        assert sorted(r.global_position for r in archived) == sorted(
            r.global_position for r in before[run_id]
        )
        assert {r.event_id: r.data for r in archived} == {
            r.event_id: dict(r.data) for r in before[run_id]
        }
        # and its key's receipt, which went with it (correlated to the Run)
        (receipt,) = receipts[n]
        with closing(sqlite3.connect(archive)) as db:
            found = db.execute(
                "SELECT event_id, data FROM events WHERE stream_id = ? AND correlation_id = ?",
                (receipt.stream_id, run_id),
            ).fetchall()
        assert [(event_id, json.loads(data)) for event_id, data in found] == [
            (receipt.event_id, dict(receipt.data))
        ]
    records = rt.store.read_stream(streams.retention_stream())
    assert all(r.data["archive_digest"].startswith("sha256:") for r in records)
    assert rt.verify_projections().ok
    # the same archive takes the next batches of the same store
    assert rt.retain(T0 + 5000, archive=archive, now_ms=T0 + 10_000).run_ids == run_ids[2:]
    assert archiving.archived_records(archive, run_ids[2])


def test_an_archive_path_that_is_not_an_archive_of_this_store_is_refused(rt, tmp_path, store_url):
    run_ids = finished_runs(rt, 2)
    head, events = rt.store.head_position(), event_count(rt)
    other = tmp_path / "notes.txt"
    other.write_text("not a database")
    foreign = tmp_path / "foreign.db"
    with qlflow.open(f"sqlite:///{tmp_path / 'other-store.db'}") as elsewhere:
        elsewhere.publish({**manifest(), "package": {"name": "other", "publisher": "acme"}})
        finished = elsewhere.start("other", "nightly", admission_key="x", now_ms=T0).run_id
        drive(elsewhere, finished, T0)
        elsewhere.retain(T0 + 1, archive=foreign, now_ms=T0 + 10)
    for path in (other, foreign, tmp_path / "missing" / "a.db"):
        with pytest.raises(InvalidInput):
            rt.retain(T0 + 5000, archive=path, now_ms=T0 + 10_000)
    assert (rt.store.head_position(), event_count(rt)) == (head, events)
    assert all(rt.get_run(run_id).status == "succeeded" for run_id in run_ids)


def test_the_stored_logs_of_a_removed_run_go_with_it(rt):
    (gone, kept) = finished_runs(rt, 2)
    attempt = rt.get_run(gone).steps["fetch"].attempts[0].attempt_id
    other = rt.get_run(kept).steps["fetch"].attempts[0].attempt_id
    rt.append_log(attempt, [("stdout", T0, b"fetched\n")])
    rt.append_log(other, [("stdout", T0, b"kept\n")])

    report = rt.retain(T0 + 500, now_ms=T0 + 10_000)

    assert report.run_ids == [gone] and report.log_bytes == len(b"fetched\n")
    assert logs.state(rt.store, attempt) is None
    assert logs.state(rt.store, other) is not None


def test_a_pruned_logs_note_goes_with_its_run(rt):
    (gone,) = finished_runs(rt, 1)
    attempt = rt.get_run(gone).steps["fetch"].attempts[0].attempt_id
    rt.append_log(attempt, [("stdout", T0, b"fetched\n")])
    rt.prune_logs(T0 + 1)
    assert set(logs.pruned_at(rt.store, [attempt])) == {attempt}

    rt.retain(T0 + 500, now_ms=T0 + 10_000)

    assert logs.pruned_at(rt.store, [attempt]) == {}


def test_a_runs_notification_outbox_goes_with_it_and_the_log_still_verifies(rt):
    document = manifest()
    document["workflows"]["nightly"]["notify"] = [{"on": ["failed"], "command": ["true"]}]
    rt.publish(document, now_ms=T0)
    run_id = rt.start("daily", "nightly", admission_key="notified", now_ms=T0).run_id
    drive(rt, run_id, T0, frozenset({"join"}))
    assert rt.get_run(run_id).status == "failed"
    outbox = streams.notification_stream(run_id)
    assert rt.store.read_stream(outbox), "the terminal commit wrote the outbox"

    report = rt.retain(T0 + 5_000, now_ms=T0 + 10_000)

    assert report.run_ids == [run_id]
    assert rt.store.read_stream(outbox) == []
    assert rt.verify_projections().ok
    rt.rebuild_projections()
    assert rt.verify_projections().ok


def test_a_rerun_again_under_its_key_answers_existing_after_its_source_is_removed(rt):
    (source, other) = finished_runs(rt, 2, fail=frozenset({"right"}))
    admitted = rt.rerun(source, admission_key="again", now_ms=T0 + 5000)
    drive(rt, admitted.run_id, T0 + 6000)
    rt.start("daily", "nightly", admission_key="unrelated", now_ms=T0 + 7000)
    assert rt.retain(T0 + 5500, now_ms=T0 + 10_000).run_ids == [source, other]
    head = rt.store.head_position()

    # the key wins: its Run is the answer, though the source it was a rerun of is gone
    again = rt.rerun(source, admission_key="again", now_ms=T0 + 20_000)
    assert (again.status, again.run_id, again.removed) == ("existing", admitted.run_id, None)
    assert again.receipt_digest == admitted.receipt_digest
    # a key whose Run is no rerun of this source is a collision, as with a live source
    with pytest.raises(AdmissionCollision, match="unrelated"):
        rt.rerun(source, admission_key="unrelated", now_ms=T0 + 20_000)
    with pytest.raises(AdmissionCollision, match="again"):
        rt.rerun(other, admission_key="again", now_ms=T0 + 20_000)
    # a key that admitted nothing has no Run to answer with: the source is gone
    with pytest.raises(NotFound, match="pruned by retention"):
        rt.rerun(source, admission_key="fresh", now_ms=T0 + 20_000)
    with pytest.raises(NotFound, match="pruned by retention"):
        rt.rerun(source, now_ms=T0 + 20_000)
    assert rt.store.head_position() == head  # nothing written by any of them

    # and once retention removed the rerun too, its tombstone answers for the key
    assert admitted.run_id in rt.retain(T0 + 9000, now_ms=T0 + 30_000).run_ids
    removed = rt.rerun(source, admission_key="again", now_ms=T0 + 40_000)
    assert (removed.status, removed.run_id) == ("existing", admitted.run_id)
    assert removed.removed is not None and removed.removed.startswith("removed by retention")
    assert rt.verify_projections().ok
