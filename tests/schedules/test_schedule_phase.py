"""The schedule phase through the runtime, on both stores, with explicit now_ms:
on-time fires, grace and misfire, pause/resume, the start guard, new generations,
DST in two zones, and the read model under rebuild and verify."""

from __future__ import annotations

import pytest

import qlflow
from domain.schedules import admission_key, occurrence_run_id
from qlflow.errors import InvalidInput, ManifestError, NotFound
from tests.schedules.helpers import (
    DAY,
    HOUR,
    MINUTE,
    cycle_every,
    fired,
    iso,
    manifest,
    ms,
    schedule,
    skipped,
)

DAY0 = ms("2024-05-01T00:00:00Z")


@pytest.fixture
def rt(store_url):
    runtime = qlflow.open(store_url)
    yield runtime
    runtime.close()


def only(rt) -> qlflow.ScheduleView:
    (view,) = rt.schedules()
    return view


def test_a_simulated_day_fires_every_occurrence_once_and_on_time(rt):
    rt.publish(manifest(schedule("0 */2 * * *"), schedule("45 9 * * *")), now_ms=DAY0 - MINUTE)
    # a 3-minute cadence that never lands on an occurrence: each fires up to 3 min late
    cycle_every(rt, DAY0 + MINUTE, DAY0 + DAY + MINUTE, 3 * MINUTE)
    two_hourly = [DAY0 + h * HOUR for h in range(0, 24, 2)] + [DAY0 + DAY]
    assert sorted(fired(rt)) == sorted([*two_hourly, DAY0 + 9 * HOUR + 45 * MINUTE])
    runs = rt.runs(limit=100)
    assert len(runs) == len(two_hourly) + 1
    by_id = {view.schedule_id: view for view in rt.schedules()}
    for view in by_id.values():
        for at in fired(rt):
            receipt = rt.inspect_admission(admission_key=admission_key(view.schedule_id, at))
            if receipt is not None:
                assert receipt.run_id == occurrence_run_id(view.schedule_id, at)
    # every Run was admitted within one cadence of its occurrence
    for run in runs:
        receipt = rt.inspect_admission(run_id=run.run_id)
        scheduled_for = int(receipt.admission_key.rsplit(":", 1)[1])
        assert 0 < run.admitted_at_ms - scheduled_for < 3 * MINUTE
    assert skipped(rt) == []
    assert rt.verify_projections().ok


def test_the_schedule_is_armed_at_the_first_occurrence_after_its_publication(rt):
    rt.publish(manifest(schedule("0 3 * * *", "Europe/Berlin")), now_ms=DAY0 + 2 * HOUR)
    assert only(rt).status == "unarmed" and only(rt).next_fire_at_ms is None
    rt.cycle(now_ms=DAY0 + 5 * HOUR)  # 07:00 Berlin: today's 03:00 is before publication
    assert only(rt).next_fire_at_ms == DAY0 + DAY + HOUR  # tomorrow 03:00 CEST = 01:00Z
    assert fired(rt) == []


def test_grace_fires_late_within_it_and_skip_admits_nothing_beyond(rt):
    rt.publish(manifest(schedule("0 * * * *")), now_ms=DAY0 - MINUTE)
    rt.cycle(now_ms=DAY0 - MINUTE)  # armed at 00:00
    rt.cycle(now_ms=DAY0 + 4 * MINUTE + 59_000)  # standalone grace: 5 min
    assert fired(rt) == [DAY0]
    rt.cycle(now_ms=DAY0 + HOUR + 5 * MINUTE + 1)  # just past the grace
    assert fired(rt) == [DAY0]
    assert skipped(rt) == [
        {
            "from_ms": DAY0 + HOUR,
            "to_ms": DAY0 + HOUR + 5 * MINUTE + 1,
            "next_fire_at_ms": DAY0 + 2 * HOUR,
            "reason": "late",
        }
    ]
    assert len(rt.runs()) == 1


def test_a_long_outage_with_skip_admits_nothing_and_resumes_on_time(rt):
    rt.publish(manifest(schedule("*/10 * * * *")), now_ms=DAY0 - MINUTE)
    rt.cycle(now_ms=DAY0)  # armed at 00:00 (due at once: fired next cycle)
    rt.cycle(now_ms=DAY0)
    assert fired(rt) == [DAY0]
    rt.cycle(now_ms=DAY0 + 3 * DAY + 7 * MINUTE)  # three days down: no backlog
    assert fired(rt) == [DAY0]
    assert [(s["from_ms"], s["next_fire_at_ms"]) for s in skipped(rt)] == [
        (DAY0 + 10 * MINUTE, DAY0 + 3 * DAY + 10 * MINUTE)
    ]
    rt.cycle(now_ms=DAY0 + 3 * DAY + 10 * MINUTE)
    assert fired(rt) == [DAY0, DAY0 + 3 * DAY + 10 * MINUTE]


def test_a_long_outage_with_fire_once_admits_only_the_oldest_missed(rt):
    rt.publish(manifest(schedule("*/10 * * * *", misfire="fire_once")), now_ms=DAY0 - MINUTE)
    rt.cycle(now_ms=DAY0 - MINUTE)
    rt.cycle(now_ms=DAY0 + 3 * DAY + 7 * MINUTE)
    assert fired(rt) == [DAY0]  # the oldest missed, once
    assert only(rt).next_fire_at_ms == DAY0 + 3 * DAY + 10 * MINUTE
    rt.cycle(now_ms=DAY0 + 3 * DAY + 8 * MINUTE)
    assert len(rt.runs()) == 1
    assert skipped(rt) == []


def test_pause_stops_fires_and_resume_does_not_backfill(rt):
    rt.publish(manifest(schedule("0 * * * *")), now_ms=DAY0 - MINUTE)
    rt.cycle(now_ms=DAY0 - MINUTE)
    sid = only(rt).schedule_id
    assert rt.pause_schedule(sid, now_ms=DAY0 - 30_000) is True
    assert rt.pause_schedule(sid, now_ms=DAY0 - 20_000) is False  # already paused
    assert only(rt).paused and only(rt).next_fire_at_ms is None
    cycle_every(rt, DAY0, DAY0 + 5 * HOUR, 10 * MINUTE)
    assert fired(rt) == []
    assert rt.resume_schedule(sid, now_ms=DAY0 + 5 * HOUR + 30 * MINUTE) is True
    assert only(rt).next_fire_at_ms == DAY0 + 6 * HOUR  # nothing of hours 0-5
    cycle_every(rt, DAY0 + 5 * HOUR + 30 * MINUTE, DAY0 + 7 * HOUR, 10 * MINUTE)
    assert fired(rt) == [DAY0 + 6 * HOUR, DAY0 + 7 * HOUR]
    with pytest.raises(NotFound):
        rt.pause_schedule("sch:" + "0" * 32)


@pytest.mark.parametrize("stop", ["withdraw", "quarantine", "revoke"])
def test_the_start_guard_stops_fires_and_the_cursor_moves_on_with_the_reason(rt, stop):
    publication = rt.publish(manifest(schedule("0 * * * *")), now_ms=DAY0 - MINUTE)
    cycle_every(rt, DAY0 - MINUTE, DAY0 + HOUR + 3 * MINUTE, 4 * MINUTE)  # within the grace
    assert fired(rt) == [DAY0, DAY0 + HOUR]
    at = DAY0 + HOUR + 4 * MINUTE
    if stop == "withdraw":
        rt.withdraw(publication.publication_id, now_ms=at)
    elif stop == "quarantine":
        rt.quarantine(publication.publication_id, now_ms=at)
    else:
        rt.revoke_publisher("acme", now_ms=at)
    cycle_every(rt, DAY0 + HOUR + 10 * MINUTE, DAY0 + 4 * HOUR, 10 * MINUTE)
    assert fired(rt) == [DAY0, DAY0 + HOUR]
    reason = {"withdraw": "withdrawn", "quarantine": "quarantined", "revoke": "publisher_revoked"}
    assert [(s["from_ms"], s["reason"]) for s in skipped(rt)] == [
        (DAY0 + h * HOUR, reason[stop]) for h in (2, 3, 4)
    ]
    assert only(rt).next_fire_at_ms == DAY0 + 5 * HOUR
    assert len(rt.runs()) == 2


def test_a_new_generation_keeps_changes_and_retires_schedules_by_id(rt):
    keep, drop = schedule("0 * * * *"), schedule("30 * * * *")
    rt.publish(manifest(keep, drop), now_ms=DAY0 - MINUTE)
    cycle_every(rt, DAY0 - MINUTE, DAY0 + HOUR + 3 * MINUTE, 4 * MINUTE)
    before = {view.cron: view for view in rt.schedules()}
    assert set(before) == {"0 * * * *", "30 * * * *"}
    # generation 2: keeps the hourly one (misfire changed: same id), drops :30, adds :15
    new = schedule("15 * * * *")
    second = rt.publish(
        manifest({**keep, "misfire": "fire_once"}, new), now_ms=DAY0 + HOUR + 20 * MINUTE
    )
    assert second.generation == 2
    rt.cycle(now_ms=DAY0 + HOUR + 25 * MINUTE)
    after = {view.cron: view for view in rt.schedules()}
    assert set(after) == {"0 * * * *", "15 * * * *"}  # the retired one is not listed
    assert after["0 * * * *"].schedule_id == before["0 * * * *"].schedule_id
    assert after["0 * * * *"].misfire == "fire_once"
    assert after["0 * * * *"].last_fired_at_ms == DAY0 + HOUR  # its cursor was kept
    assert after["15 * * * *"].next_fire_at_ms == DAY0 + 2 * HOUR + 15 * MINUTE
    retired = rt.events(types=["schedule.retired"])
    assert [e.stream_id for e in retired] == [f"schedule-{before['30 * * * *'].schedule_id}"]
    with pytest.raises(InvalidInput):
        rt.pause_schedule(before["30 * * * *"].schedule_id, now_ms=DAY0 + 2 * HOUR)
    cycle_every(rt, DAY0 + HOUR + 30 * MINUTE, DAY0 + 3 * HOUR, 5 * MINUTE)
    assert fired(rt)[3:] == [DAY0 + 2 * HOUR, DAY0 + 2 * HOUR + 15 * MINUTE, DAY0 + 3 * HOUR]
    # runs of the new generation come from it
    last = rt.inspect_admission(run_id=rt.runs(limit=1)[0].run_id)
    assert last.publication_id == second.publication_id
    # a generation that declares the dropped schedule again arms it afresh
    rt.publish(manifest(keep, new, drop), now_ms=DAY0 + 3 * HOUR + MINUTE)
    rt.cycle(now_ms=DAY0 + 3 * HOUR + 2 * MINUTE)
    again = {view.cron: view for view in rt.schedules()}["30 * * * *"]
    assert again.next_fire_at_ms == DAY0 + 3 * HOUR + 30 * MINUTE
    assert rt.verify_projections().ok


def test_a_changed_cron_is_a_new_schedule_and_the_old_one_stops(rt):
    rt.publish(manifest(schedule("0 3 * * *")), now_ms=DAY0 - MINUTE)
    rt.cycle(now_ms=DAY0)
    old = only(rt)
    rt.publish(manifest(schedule("0 4 * * *")), now_ms=DAY0 + MINUTE)
    cycle_every(rt, DAY0 + 2 * MINUTE, DAY0 + 5 * HOUR, 10 * MINUTE)
    new = only(rt)
    assert new.schedule_id != old.schedule_id
    assert fired(rt) == [DAY0 + 4 * HOUR]


# DST: (zone, cron, the days to cross, the instants it must fire at, in UTC)
DST_CASES = {
    # spring forward 2024-03-31 02:00 CET -> 03:00 CEST: 02:30 does not exist and
    # fires once at 03:00 CEST (01:00Z)
    "berlin-spring": (
        "Europe/Berlin",
        "30 2 * * *",
        "2024-03-30T00:00Z",
        ["2024-03-30T01:30Z", "2024-03-31T01:00Z", "2024-04-01T00:30Z"],
    ),
    # fall back 2024-10-27 03:00 CEST -> 02:00 CET: 02:30 happens twice, fires once
    "berlin-fall": (
        "Europe/Berlin",
        "30 2 * * *",
        "2024-10-26T00:00Z",
        ["2024-10-26T00:30Z", "2024-10-27T00:30Z", "2024-10-28T01:30Z"],
    ),
    # spring forward 2024-03-10 02:00 EST -> 03:00 EDT: 02:30 fires at 03:00 EDT (07:00Z)
    "new-york-spring": (
        "America/New_York",
        "30 2 * * *",
        "2024-03-09T00:00Z",
        ["2024-03-09T07:30Z", "2024-03-10T07:00Z", "2024-03-11T06:30Z"],
    ),
    # fall back 2024-11-03 02:00 EDT -> 01:00 EST: hourly at :30 fires 01:30 once
    "new-york-fall-hourly": (
        "America/New_York",
        "30 * * * *",
        "2024-11-03T04:00Z",
        [f"2024-11-03T{h:02d}:30Z" for h in (4, 5, 7, 8)],
    ),
}


@pytest.mark.parametrize("case", list(DST_CASES))
def test_dst_transitions_fire_no_duplicate_and_lose_no_existing_wall_time(rt, case):
    zone_name, cron, start, expected = DST_CASES[case]
    start_ms = ms(start)
    rt.publish(manifest(schedule(cron, zone_name)), now_ms=start_ms - MINUTE)
    hours = 5 if case.endswith("hourly") else 3 * 24 - 1
    cycle_every(rt, start_ms, start_ms + hours * HOUR - 1, 10 * MINUTE)
    assert [iso(at) for at in fired(rt)] == expected
    assert skipped(rt) == []


def test_a_bad_schedule_is_refused_at_publish_and_nothing_is_written(rt):
    for bad, field in (
        (schedule("@daily"), "schedules[0].cron"),
        (schedule("0 3 * *"), "schedules[0].cron"),
        ({"cron": "0 3 * * *"}, "schedules[0].timezone"),
        (schedule("0 3 * * *", "Mars/Olympus"), "schedules[0].timezone"),
        (schedule("0 3 * * *", misfire="catch_up"), "schedules[0].misfire"),
        (schedule("0 3 * * *", params={"n": 1.5}), "schedules[0].params.n"),
    ):
        with pytest.raises(ManifestError) as caught:
            rt.publish(manifest(bad), now_ms=DAY0)
        assert caught.value.key == field and "[workflows.flow]" in str(caught.value)
    assert rt.events() == []
    assert rt.schedules() == []


REGION = {"region": {"type": "string", "default": "us"}}


def test_params_are_stored_with_the_schedule_and_name_it(rt):
    rt.publish(
        manifest(
            schedule("0 3 * * *", params={"region": "eu"}), schedule("0 3 * * *"), params=REGION
        ),
        now_ms=DAY0,
    )
    views = rt.schedules()
    assert sorted((view.params for view in views), key=len) == [{}, {"region": "eu"}]
    assert len({view.schedule_id for view in views}) == 2


def test_a_scheduled_run_binds_the_schedule_params_into_its_plan(rt):
    rt.publish(
        manifest(
            schedule("0 3 * * *", params={"region": "eu"}), schedule("0 4 * * *"), params=REGION
        ),
        now_ms=DAY0,
    )
    cycle_every(rt, DAY0, DAY0 + 5 * HOUR, 30 * MINUTE)
    assert sorted(run.params["region"] for run in rt.runs(limit=10)) == ["eu", "us"]


@pytest.mark.parametrize(
    ("params", "given", "rule"),
    [
        (None, {"region": "eu"}, "unknown parameter 'region'"),
        ({"region": {"type": "string"}}, {}, "'region' (string) is required"),
        ({"region": {"type": "integer"}}, {"region": "eu"}, "'region' is an integer"),
    ],
)
def test_schedule_params_that_do_not_bind_are_refused_at_publish(rt, params, given, rule):
    with pytest.raises(ManifestError) as caught:
        rt.publish(manifest(schedule("0 3 * * *", params=given), params=params), now_ms=DAY0)
    assert caught.value.key == "schedules[0].params.region"
    assert rule in str(caught.value)
    assert rt.events() == []


def test_rebuild_and_verify_cover_the_schedules_read_model(rt):
    rt.publish(manifest(schedule("0 * * * *"), schedule("*/20 * * * *")), now_ms=DAY0 - MINUTE)
    cycle_every(rt, DAY0 - MINUTE, DAY0 + 3 * HOUR, 4 * MINUTE)
    assert len(fired(rt)) == 3 + 9
    rt.pause_schedule(rt.schedules()[0].schedule_id, now_ms=DAY0 + 3 * HOUR)
    before = rt.schedules()
    assert rt.verify_projections().ok
    rt.rebuild_projections()
    assert rt.schedules() == before
    assert rt.verify_projections().ok
    assert rt.rebuild_projections().tables["schedules"] == 2


def test_the_cycle_reports_the_schedule_phase(rt):
    rt.publish(manifest(schedule("0 * * * *")), now_ms=DAY0 - MINUTE)
    armed = rt.cycle(now_ms=DAY0 - MINUTE).schedule
    assert (armed.scanned, armed.changed, armed.fired) == (1, 1, 0)
    due = rt.cycle(now_ms=DAY0)
    assert (due.schedule.scanned, due.schedule.fired) == (1, 1)
    # its Run's admission claimed its root in the same commit: a worker may lease it now
    assert due.frontier.scanned + due.claim.scanned == 0
    assert len(rt.lease_attempts("w1", now_ms=DAY0)) == 1
    idle = rt.cycle(now_ms=DAY0 + MINUTE).schedule
    assert (idle.scanned, idle.changed) == (0, 0)


def test_the_edge_profile_has_a_30_second_grace(sqlite_url):
    with qlflow.open(sqlite_url, "edge") as edge:
        edge.publish(manifest(schedule("0 * * * *")), now_ms=DAY0 - MINUTE)
        edge.cycle(now_ms=DAY0 - MINUTE)
        edge.cycle(now_ms=DAY0 + 29_000)  # within 30 s: fires
        edge.cycle(now_ms=DAY0 + HOUR + 31_000)  # 31 s late: skipped
        assert fired(edge) == [DAY0]
        assert [s["reason"] for s in skipped(edge)] == ["late"]
