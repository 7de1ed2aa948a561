"""A schedule's overlap policy on both stores, on a virtual clock: what an occurrence
does while the schedule's previous Run still runs (docs/DESIGN.md, "Schedules").

Every test fires a Run at T0 from a schedule due every 5 minutes, keeps it running
with a worker's lease and ends it later; the 5-minute occurrence meets it running.
"""

from __future__ import annotations

import pytest

import qlflow
from domain.schedules import admission_key
from projections import schedules as schedule_rows
from qlflow.testing import VirtualClock
from tests.schedules.helpers import MINUTE, fired, manifest, ms, schedule, skipped

T0 = ms("2024-05-01T10:00:00Z")
TTL = 600_000  # the longest lease: the first Run runs across the next occurrence


@pytest.fixture
def rt(store_url):
    runtime = qlflow.open(store_url)
    yield runtime
    runtime.close()


def _start(rt, overlap: str | None) -> tuple[VirtualClock, qlflow.Lease]:
    """Publish the schedule, fire its T0 occurrence and lease that Run's step."""
    clock = VirtualClock(T0 - MINUTE)
    rt.publish(manifest(schedule("*/5 * * * *", overlap=overlap)), now_ms=clock.now_ms)
    rt.cycle(now_ms=clock.now_ms)  # armed at T0
    rt.cycle(now_ms=clock.advance_to(T0))
    assert fired(rt) == [T0]
    (lease,) = rt.lease_attempts("w1", ttl_ms=TTL, now_ms=clock.now_ms, start=True)
    return clock, lease


def _due_ids(rt, now_ms: int) -> list[str]:
    """The schedule ids the schedule phase would read at `now_ms`."""
    return [sid for _, sid in schedule_rows.due(rt.store, now_ms, 100)]


def _only(rt) -> qlflow.ScheduleView:
    (view,) = rt.schedules()
    return view


def test_a_manifest_without_overlap_gets_skip(rt):
    clock, lease = _start(rt, None)
    assert _only(rt).overlap == "skip"
    rt.cycle(now_ms=clock.advance_to(T0 + 5 * MINUTE))
    assert fired(rt) == [T0]
    assert skipped(rt) == [
        {
            "from_ms": T0 + 5 * MINUTE,
            "to_ms": T0 + 5 * MINUTE,
            "next_fire_at_ms": T0 + 10 * MINUTE,
            "reason": "overlap",
        }
    ]
    rt.complete(lease, "succeeded", now_ms=clock.advance_to(T0 + 7 * MINUTE))
    rt.cycle(now_ms=clock.now_ms)  # the end of the Run brings nothing forward
    assert fired(rt) == [T0]
    rt.cycle(now_ms=clock.advance_to(T0 + 10 * MINUTE))
    assert fired(rt) == [T0, T0 + 10 * MINUTE]  # the previous Run ended: on time
    assert len(rt.runs()) == 2
    assert rt.verify_projections().ok


def test_allow_admits_the_occurrence_beside_the_running_one(rt):
    clock, _lease = _start(rt, "allow")
    assert _only(rt).overlap == "allow"
    rt.cycle(now_ms=clock.advance_to(T0 + 5 * MINUTE))
    assert fired(rt) == [T0, T0 + 5 * MINUTE]
    assert skipped(rt) == []
    assert [run.status for run in rt.runs()] == ["running", "running"]
    assert rt.verify_projections().ok


def test_queue_holds_the_occurrence_until_the_previous_run_ends(rt):
    clock, lease = _start(rt, "queue")
    (view,) = rt.schedules()
    version = len(rt.store.read_stream(f"schedule-{view.schedule_id}"))
    rt.cycle(now_ms=clock.advance_to(T0 + 5 * MINUTE))
    rt.cycle(now_ms=clock.advance_to(T0 + 6 * MINUTE))
    # held: nothing written, and the phase does not even read the schedule
    assert fired(rt) == [T0] and skipped(rt) == []
    assert len(rt.store.read_stream(f"schedule-{view.schedule_id}")) == version
    assert view.schedule_id not in _due_ids(rt, clock.now_ms)
    assert _only(rt).next_fire_at_ms == T0 + 5 * MINUTE  # still on the cursor

    rt.complete(lease, "succeeded", now_ms=clock.advance_to(T0 + 7 * MINUTE))
    assert view.schedule_id in _due_ids(rt, clock.now_ms)  # the Run's end brought it back
    rt.cycle(now_ms=clock.now_ms)
    assert fired(rt) == [T0, T0 + 5 * MINUTE]  # the held occurrence, admitted now
    queued = rt.inspect_admission(admission_key=admission_key(view.schedule_id, T0 + 5 * MINUTE))
    assert queued is not None
    assert rt.get_run(queued.run_id).admitted_at_ms == T0 + 7 * MINUTE
    assert _only(rt).next_fire_at_ms == T0 + 10 * MINUTE
    assert rt.verify_projections().ok


def test_queue_counts_lateness_from_the_previous_runs_end(rt):
    clock, lease = _start(rt, "queue")
    # the first Run outlives three occurrences and the grace (5 min) of the first
    for minute in (9, 10, 15, 18, 20):
        if minute in (9, 18):
            lease = rt.renew(lease, ttl_ms=TTL, now_ms=clock.advance_to(T0 + minute * MINUTE))
        rt.cycle(now_ms=clock.advance_to(T0 + minute * MINUTE))
    assert fired(rt) == [T0] and skipped(rt) == []
    rt.complete(lease, "failed", now_ms=clock.advance_to(T0 + 21 * MINUTE))
    rt.cycle(now_ms=clock.advance_to(T0 + 22 * MINUTE))  # within the grace of the end
    # one occurrence waited (the oldest); those it covered are not fired
    assert fired(rt) == [T0, T0 + 5 * MINUTE] and skipped(rt) == []
    assert _only(rt).next_fire_at_ms == T0 + 25 * MINUTE


def test_queue_past_the_grace_of_the_end_follows_the_misfire_policy(rt):
    clock, lease = _start(rt, "queue")
    rt.complete(lease, "succeeded", now_ms=clock.advance_to(T0 + 4 * MINUTE))
    # the previous Run ended before the occurrence: it is late from the occurrence
    rt.cycle(now_ms=clock.advance_to(T0 + 11 * MINUTE))  # 6 min late, grace 5 min
    assert fired(rt) == [T0]
    assert [(s["from_ms"], s["reason"]) for s in skipped(rt)] == [(T0 + 5 * MINUTE, "late")]


def test_a_schedule_keeps_its_cursor_when_a_new_generation_changes_its_overlap(rt):
    clock, lease = _start(rt, "allow")
    (before,) = rt.schedules()
    rt.publish(manifest(schedule("*/5 * * * *", overlap="queue")), now_ms=clock.advance(MINUTE))
    (after,) = rt.schedules()
    assert after.schedule_id == before.schedule_id and after.overlap == "queue"
    rt.cycle(now_ms=clock.advance_to(T0 + 5 * MINUTE))
    assert fired(rt) == [T0]  # the Run fired under allow still runs: held
    rt.complete(lease, "succeeded", now_ms=clock.advance_to(T0 + 6 * MINUTE))
    rt.cycle(now_ms=clock.now_ms)
    assert fired(rt) == [T0, T0 + 5 * MINUTE]
    assert rt.verify_projections().ok


def test_rebuild_gives_the_same_rows_for_a_held_and_a_released_schedule(rt):
    clock, lease = _start(rt, "queue")
    rt.cycle(now_ms=clock.advance_to(T0 + 5 * MINUTE))
    held = rt.store.query("SELECT * FROM schedules")
    rt.rebuild_projections()
    assert rt.store.query("SELECT * FROM schedules") == held
    rt.complete(lease, "succeeded", now_ms=clock.advance_to(T0 + 7 * MINUTE))
    released = rt.store.query("SELECT * FROM schedules")
    assert released != held
    rt.rebuild_projections()
    assert rt.store.query("SELECT * FROM schedules") == released
    assert rt.verify_projections().ok


def test_an_unknown_overlap_is_refused_at_publish_naming_the_field(rt):
    with pytest.raises(qlflow.errors.ManifestError) as refused:
        rt.publish(manifest(schedule("*/5 * * * *", overlap="wait")), now_ms=T0)
    assert "schedules[0].overlap" in str(refused.value)
    assert "'allow', 'skip', 'queue'" in str(refused.value)
    assert rt.events() == [] and rt.schedules() == []


def test_a_store_upgraded_to_overlap_learns_when_each_last_run_ended(store_url):
    with qlflow.open(store_url) as rt:
        clock, lease = _start(rt, "allow")
        rt.complete(lease, "succeeded", now_ms=clock.advance_to(T0 + 2 * MINUTE))
        before = rt.store.query("SELECT * FROM schedules")
        with rt.store.transaction() as tx:  # back to the schema before OVERLAP_STEP
            tx.execute("DROP INDEX schedules_running_run")
            for column in ("overlap", "last_run_ended_at_ms", "work_when_ended_ms"):
                tx.execute(f"ALTER TABLE schedules DROP COLUMN {column}")
            tx.execute(
                "UPDATE schema_versions SET version = ? WHERE component = ?",
                (schedule_rows.OVERLAP_STEP - 1, schedule_rows.COMPONENT),
            )
    with qlflow.open(store_url) as rt:  # migrates and backfills
        assert rt.store.query("SELECT * FROM schedules") == before
        assert rt.verify_projections().ok
        rt.cycle(now_ms=T0 + 5 * MINUTE)
        assert fired(rt) == [T0, T0 + 5 * MINUTE]


@pytest.mark.parametrize("batch", [1, 2, 5])
def test_a_rebuild_in_small_batches_still_ends_the_schedules_last_run(rt, batch):
    """Batches of a few records: the end of the schedule's last fired Run comes in a
    batch of Run ends alone, which the schedules' replay passes over only when no
    schedule waits on a running Run (here one does)."""
    from projections import rebuild, verify

    clock, lease = _start(rt, "queue")
    rt.complete(lease, "succeeded", now_ms=clock.advance_to(T0 + 2 * MINUTE))
    released = rt.store.query("SELECT * FROM schedules")
    with rt.store.transaction() as tx:  # a wrong row: the Run's end not folded
        tx.execute("UPDATE schedules SET last_run_ended_at_ms = NULL")
    assert not verify.verify(rt.store, batch=batch).ok
    rebuild.rebuild(rt.store, batch=batch)
    assert rt.store.query("SELECT * FROM schedules") == released
    assert verify.verify(rt.store, batch=batch).ok
