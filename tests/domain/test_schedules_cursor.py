"""The schedule cursor: arm, due, misfire, pause/resume, retire, fold, determinism."""

from __future__ import annotations

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import domain.schedules as schedules
from domain.errors import CorruptionError, InvalidInput
from domain.ids import RUN_ID, derive_id
from domain.occurrences import next_after
from domain.records import Record
from domain.schedules import (
    ACTIVE,
    LATE,
    NOTHING,
    PAUSED,
    RETIRED,
    ScheduleState,
    admission_key,
    arm,
    decide_due,
    fold_schedule,
    next_occurrence,
    occurrence_run_id,
    pause,
    resume,
    retire,
    work_at_ms,
)
from tests.domain.schedule_log import (
    DAY,
    EDGE_GRACE_MS,
    HOUR,
    MINUTE,
    STANDALONE_GRACE_MS,
    ScheduleLog,
    make_spec,
    ms,
)
from tests.hypothesis_budget import examples

MIDNIGHT = ms("2026-06-01T00:00Z")


def armed_log(cron="*/15 * * * *", misfire="skip", published=MIDNIGHT - 1, **kw) -> ScheduleLog:
    log = ScheduleLog(make_spec(cron, misfire=misfire, **kw))
    log.arm(published)
    return log


def event_types(log: ScheduleLog) -> list[str]:
    return [record.type for record in log.records]


# --- on time ------------------------------------------------------------------------------


@pytest.mark.parametrize("offset_ms", [0, 7_000, EDGE_GRACE_MS])
def test_every_15_minutes_over_a_day_fires_96_times_each_once(offset_ms):
    log = armed_log()
    for now in range(MIDNIGHT, MIDNIGHT + DAY, MINUTE):
        log.cycle(now + offset_ms)
    assert log.fired_at == list(range(MIDNIGHT, MIDNIGHT + DAY, 15 * MINUTE))
    assert len(log.fired_at) == 96
    assert len({o.run_id for o in log.admitted}) == 96
    assert event_types(log) == ["schedule.armed"] + ["schedule.fired"] * 96
    first = log.admitted[0]
    assert first.admission_key == f"schedule:{log.schedule_id}:{MIDNIGHT}"
    assert (
        first.run_id
        == derive_id(RUN_ID, first.admission_key)
        == occurrence_run_id(log.schedule_id, MIDNIGHT)
    )
    assert not any(o.late for o in log.admitted)
    assert log.state is not None and log.state.last_fired_at_ms == MIDNIGHT + DAY - 15 * MINUTE


def test_arm_is_at_the_first_occurrence_after_publication():
    log = armed_log(published=MIDNIGHT + 7 * MINUTE)
    assert log.state == ScheduleState(
        log.schedule_id, ACTIVE, 1, log.records[0].event_id, MIDNIGHT + 15 * MINUTE
    )
    assert log.records[0].data == {"next_fire_at_ms": MIDNIGHT + 15 * MINUTE}
    assert next_occurrence(log.spec, MIDNIGHT + 7 * MINUTE) == MIDNIGHT + 15 * MINUTE
    # published exactly on an occurrence: that one is not fired, the next is
    assert armed_log(published=MIDNIGHT).state.next_fire_at_ms == MIDNIGHT + 15 * MINUTE


def test_not_due_writes_nothing():
    log = armed_log()
    assert decide_due(log.state, log.spec, MIDNIGHT - 1, EDGE_GRACE_MS) is NOTHING
    assert NOTHING.noop and NOTHING.admit is None


def test_a_repeated_cycle_after_a_fire_writes_nothing():
    log = armed_log()
    log.cycle(MIDNIGHT + 1_000)
    assert log.cycle(MIDNIGHT + 2_000).noop
    assert log.fired_at == [MIDNIGHT]


# --- grace and misfire ----------------------------------------------------------------------


@pytest.mark.parametrize("grace", [EDGE_GRACE_MS, STANDALONE_GRACE_MS])
def test_the_grace_is_inclusive(grace):
    log = armed_log()
    decision = decide_due(log.state, log.spec, MIDNIGHT + grace, grace)
    assert decision.admit is not None and decision.admit.scheduled_for_ms == MIDNIGHT
    late = decide_due(log.state, log.spec, MIDNIGHT + grace + 1, grace)
    assert late.admit is None and late.events[0].type == "schedule.skipped"


def test_skip_after_a_long_outage_admits_nothing_and_moves_past_now():
    log = armed_log()
    now = MIDNIGHT + 3 * DAY + 5 * MINUTE  # the host was down for three days
    decision = log.cycle(now)
    assert decision.admit is None
    assert log.records[-1].type == "schedule.skipped"
    assert log.records[-1].data == {
        "from_ms": MIDNIGHT,
        "to_ms": now,
        "next_fire_at_ms": MIDNIGHT + 3 * DAY + 15 * MINUTE,
        "reason": LATE,
    }
    # back on time afterwards
    log.cycle(MIDNIGHT + 3 * DAY + 15 * MINUTE)
    assert log.fired_at == [MIDNIGHT + 3 * DAY + 15 * MINUTE]


def test_fire_once_after_a_long_outage_admits_only_the_oldest_missed():
    log = armed_log(misfire="fire_once")
    now = MIDNIGHT + 3 * DAY + 5 * MINUTE
    decision = log.cycle(now)
    assert decision.admit is not None and decision.admit.late
    assert log.fired_at == [MIDNIGHT]
    assert log.records[-1].data["next_fire_at_ms"] == MIDNIGHT + 3 * DAY + 15 * MINUTE
    assert log.cycle(now + 1).noop  # no backlog replay
    log.cycle(MIDNIGHT + 3 * DAY + 15 * MINUTE)
    assert log.fired_at == [MIDNIGHT, MIDNIGHT + 3 * DAY + 15 * MINUTE]
    assert not log.admitted[1].late


def test_within_the_grace_the_cursor_moves_past_now():
    # a 4-minute outage with a 5-minute grace: the due occurrence fires, the cursor
    # lands on the first occurrence after now
    log = armed_log(cron="* * * * *")
    log.cycle(MIDNIGHT + 4 * MINUTE, STANDALONE_GRACE_MS)
    assert log.fired_at == [MIDNIGHT]
    assert log.state.next_fire_at_ms == MIDNIGHT + 5 * MINUTE


def test_a_decade_of_missed_minutes_is_decided_with_two_occurrence_lookups(monkeypatch):
    calls = []

    def counting(cron, timezone, after_ms):
        calls.append(after_ms)
        return next_after(cron, timezone, after_ms)

    for misfire in ("skip", "fire_once"):
        log = armed_log(cron="* * * * *", misfire=misfire)
        monkeypatch.setattr(schedules, "next_after", counting)
        calls.clear()
        now = MIDNIGHT + 3650 * DAY
        log.cycle(now)
        assert calls == [now]
        assert log.state.next_fire_at_ms == now - now % MINUTE + MINUTE
        monkeypatch.undo()


def test_a_start_guard_refusal_skips_the_due_occurrence_with_its_reason():
    log = armed_log(misfire="fire_once")
    decision = log.cycle(MIDNIGHT + 1_000, refusal="withdrawn")
    assert decision.admit is None
    assert log.records[-1].data["reason"] == "withdrawn"
    assert log.state.next_fire_at_ms == MIDNIGHT + 15 * MINUTE
    assert log.cycle(MIDNIGHT + 2_000, refusal="withdrawn").noop  # nothing due: nothing said
    with pytest.raises(InvalidInput):
        decide_due(log.state, log.spec, MIDNIGHT + 20 * MINUTE, 0, refusal="not a word")


# --- pause, resume, retire ------------------------------------------------------------------


def test_pause_stops_fires_and_resume_does_not_backfill():
    log = armed_log()
    log.cycle(MIDNIGHT)
    log.apply(pause(log.state, MIDNIGHT + MINUTE))
    assert log.state.status == PAUSED and work_at_ms(log.state) is None
    assert pause(log.state, MIDNIGHT + 2 * MINUTE) is NOTHING
    for now in range(MIDNIGHT + MINUTE, MIDNIGHT + 2 * HOUR, MINUTE):
        assert log.cycle(now).noop
    resumed_at = MIDNIGHT + 2 * HOUR + 20 * MINUTE
    log.apply(resume(log.state, log.spec, resumed_at))
    assert log.state.status == ACTIVE
    assert work_at_ms(log.state) == MIDNIGHT + 2 * HOUR + 30 * MINUTE
    assert resume(log.state, log.spec, resumed_at) is NOTHING
    for now in range(resumed_at, MIDNIGHT + 3 * HOUR, MINUTE):
        log.cycle(now)
    assert log.fired_at == [
        MIDNIGHT,
        MIDNIGHT + 2 * HOUR + 30 * MINUTE,
        MIDNIGHT + 2 * HOUR + 45 * MINUTE,
    ]
    assert log.records[-4].metadata["actor"] == "user"


def test_retire_is_final_until_the_schedule_is_armed_again():
    log = armed_log()
    log.apply(pause(log.state, MIDNIGHT))
    log.apply(retire(log.state, MIDNIGHT + 1))
    assert log.state.status == RETIRED and work_at_ms(log.state) is None
    assert retire(log.state, MIDNIGHT + 2) is NOTHING
    assert log.cycle(MIDNIGHT + DAY).noop
    for action in (lambda: pause(log.state, MIDNIGHT + 3),
                   lambda: resume(log.state, log.spec, MIDNIGHT + 3)):  # fmt: skip
        with pytest.raises(InvalidInput) as refused:
            action()
        assert refused.value.rule == "retired"
    # a later generation declares it again: armed from that publication
    log.arm(MIDNIGHT + DAY + 1)
    assert log.state.status == ACTIVE
    assert log.state.next_fire_at_ms == MIDNIGHT + DAY + 15 * MINUTE


def test_arming_an_armed_schedule_writes_nothing():
    log = armed_log()
    assert arm(log.spec, log.schedule_id, MIDNIGHT + DAY, log.state) is NOTHING
    log.apply(pause(log.state, MIDNIGHT))
    assert arm(log.spec, log.schedule_id, MIDNIGHT + DAY, log.state) is NOTHING


def test_work_at_ms_is_the_cursor_of_an_active_schedule_only():
    assert work_at_ms(None) is None
    log = armed_log()
    assert work_at_ms(log.state) == MIDNIGHT


# --- determinism -------------------------------------------------------------------------


def encoded(decision) -> bytes:
    return orjson.dumps(
        [
            [
                a.stream_id,
                a.expected_version,
                [[e.event_id, e.type, e.data, e.metadata] for e in a.events],
            ]
            for a in decision.appends
        ]
    )


def test_the_same_inputs_give_byte_identical_records_and_ids():
    log = armed_log(misfire="fire_once")
    for now in (MIDNIGHT + 1_000, MIDNIGHT + 3 * DAY):
        first = decide_due(log.state, log.spec, now, EDGE_GRACE_MS)
        again = decide_due(log.state, log.spec, now, EDGE_GRACE_MS)
        assert first == again and encoded(first) == encoded(again)
    spec = log.spec
    assert encoded(arm(spec, log.schedule_id, 5)) == encoded(arm(spec, log.schedule_id, 5))
    assert encoded(pause(log.state, 9)) == encoded(pause(log.state, 9))


def test_a_repeat_after_a_lost_commit_recomputes_the_same_records():
    log = armed_log()
    decision = decide_due(log.state, log.spec, MIDNIGHT + 2_000, EDGE_GRACE_MS)
    # the COMMIT response was lost: the caller reloads the unchanged stream and decides again
    state = fold_schedule(log.records)
    assert decide_due(state, log.spec, MIDNIGHT + 2_000, EDGE_GRACE_MS) == decision


def test_two_replicas_at_different_instants_collide_on_the_version_not_the_id():
    log = armed_log()
    one = decide_due(log.state, log.spec, MIDNIGHT + 1_000, EDGE_GRACE_MS)
    two = decide_due(log.state, log.spec, MIDNIGHT + 2_000, EDGE_GRACE_MS)
    assert one.appends[0].expected_version == two.appends[0].expected_version == 1
    assert one.events[0].event_id != two.events[0].event_id
    assert one.admit == two.admit  # the same occurrence, key and run id


def test_metadata_names_the_decision():
    log = armed_log()
    log.cycle(MIDNIGHT + 1_000)
    armed, fired = log.records
    assert armed.metadata == {
        "at_ms": MIDNIGHT - 1,
        "causation_id": None,
        "correlation_id": log.schedule_id,
        "actor": "cycle:schedule",
    }
    assert fired.metadata["causation_id"] == armed.event_id
    assert fired.metadata["at_ms"] == MIDNIGHT + 1_000
    assert fired.data == {
        "scheduled_for_ms": MIDNIGHT,
        "run_id": occurrence_run_id(log.schedule_id, MIDNIGHT),
        "next_fire_at_ms": MIDNIGHT + 15 * MINUTE,
    }
    assert admission_key(log.schedule_id, MIDNIGHT) == f"schedule:{log.schedule_id}:{MIDNIGHT}"


def test_bad_arguments_are_refused():
    log = armed_log()
    for bad in (-1, 1.5, True, "1"):
        with pytest.raises(InvalidInput):
            decide_due(log.state, log.spec, bad, EDGE_GRACE_MS)
        with pytest.raises(InvalidInput):
            decide_due(log.state, log.spec, MIDNIGHT, bad)
    with pytest.raises(InvalidInput):
        decide_due(None, log.spec, MIDNIGHT, EDGE_GRACE_MS)
    with pytest.raises(InvalidInput):
        arm(log.spec, "", MIDNIGHT)
    other = ScheduleLog(make_spec("0 3 * * *"))
    with pytest.raises(InvalidInput):
        arm(log.spec, other.schedule_id, MIDNIGHT, log.state)


# --- the fold ----------------------------------------------------------------------------


def full_log() -> ScheduleLog:
    log = armed_log()
    log.cycle(MIDNIGHT)
    log.cycle(MIDNIGHT + DAY)
    log.apply(pause(log.state, MIDNIGHT + DAY + 1))
    log.apply(resume(log.state, log.spec, MIDNIGHT + DAY + 2))
    log.apply(retire(log.state, MIDNIGHT + DAY + 3))
    return log


def test_fold_of_the_whole_stream_equals_the_incremental_state():
    log = full_log()
    assert event_types(log) == [
        "schedule.armed", "schedule.fired", "schedule.skipped",
        "schedule.paused", "schedule.resumed", "schedule.retired",
    ]  # fmt: skip
    assert fold_schedule(log.records) == log.state
    assert fold_schedule(log.records[3:], fold_schedule(log.records[:3])) == log.state
    assert fold_schedule([]) is None


def altered(record: Record, data=None, drop=(), **fields) -> Record:
    """The record with other fields, or with data changed (`data`) or keys dropped."""
    values = {name: getattr(record, name) for name in Record.__slots__}
    if data is not None or drop:
        new_data = {**record.data, **(data or {})}
        for name in drop:
            new_data.pop(name)
        values["data"] = new_data
    values.update(fields)
    return Record(**values)


def replaced_data(record: Record, data) -> Record:
    return Record(**{**{name: getattr(record, name) for name in Record.__slots__}, "data": data})


def only(*records):
    return list(records)


CORRUPTIONS = [
    ("opens with schedule.armed", lambda r: only(altered(r[1], stream_version=1))),
    ("version gap: expected v2", lambda r: only(r[0], r[2])),
    ("not in a schedule stream", lambda r: only(altered(r[0], stream_id="run-x"))),
    ("not in stream", lambda r: only(r[0], altered(r[1], stream_id="schedule-sch:other"))),
    ("not a schedule event type", lambda r: only(r[0], altered(r[1], type="schedule.boom"))),
    ("data is not an object", lambda r: only(replaced_data(r[0], []))),
    ("not the cursor", lambda r: only(r[0], altered(r[1], data={"scheduled_for_ms": 5}))),
    ("is not after", lambda r: only(r[0], altered(r[1], data={"next_fire_at_ms": MIDNIGHT}))),
    ("not the occurrence's run id", lambda r: only(r[0], altered(r[1], data={"run_id": "x"}))),
    ("next_fire_at_ms is missing", lambda r: only(r[0], altered(r[1], drop=["next_fire_at_ms"]))),
    ("not an instant: True", lambda r: only(altered(r[0], data={"next_fire_at_ms": True}))),
    ("skips from 1", lambda r: [*r[:2], altered(r[2], data={"from_ms": 1})]),
    ("to_ms < next_fire_at_ms", lambda r: [*r[:2], altered(r[2], data={"to_ms": 2 * MIDNIGHT})]),
    ("reason is missing", lambda r: [*r[:2], altered(r[2], data={"reason": ""})]),
    ("schedule that is active", lambda r: [*r[:3], altered(r[4], stream_version=4)]),
    ("schedule that is paused", lambda r: [*r[:4], altered(r[1], stream_version=5)]),
    ("schedule that is retired", lambda r: [*r, altered(r[3], stream_version=7)]),
]


@pytest.mark.parametrize(("words", "mutate"), CORRUPTIONS, ids=[w for w, _ in CORRUPTIONS])
def test_a_malformed_stream_is_refused_naming_the_record(words, mutate):
    bad = mutate(full_log().records)
    with pytest.raises(CorruptionError) as caught:
        fold_schedule(bad)
    message = str(caught.value)
    assert words in message
    culprit = next(r for r in bad if message.startswith(f"{r.stream_id} v{r.stream_version} "))
    assert f"({culprit.event_id}, {culprit.type}): " in message


# --- random drives -------------------------------------------------------------------

ACTIONS = st.lists(
    st.tuples(
        st.sampled_from(["cycle"] * 6 + ["pause", "resume", "retire", "arm"]),
        st.integers(1, 3 * HOUR),
    ),
    max_size=40,
)


@settings(max_examples=examples(150), deadline=None)
@given(
    cron=st.sampled_from(["*/15 * * * *", "* * * * *", "0 * * * *", "30 2 * * *"]),
    zone_name=st.sampled_from(["UTC", "Europe/Berlin", "America/New_York"]),
    misfire=st.sampled_from(["skip", "fire_once"]),
    start=st.integers(ms("2026-01-01T00:00Z"), ms("2027-01-01T00:00Z")),
    actions=ACTIONS,
)
def test_random_drives_never_fire_an_occurrence_twice(cron, zone_name, misfire, start, actions):
    log = ScheduleLog(make_spec(cron, zone_name, misfire))
    log.arm(start)
    now = start
    for action, step in actions:
        now += step
        if action == "cycle":
            log.cycle(now, STANDALONE_GRACE_MS)
        elif action == "pause" and log.state.status != RETIRED:
            log.apply(pause(log.state, now))
        elif action == "resume" and log.state.status != RETIRED:
            log.apply(resume(log.state, log.spec, now))
        elif action == "retire":
            log.apply(retire(log.state, now))
        elif action == "arm":
            log.apply(arm(log.spec, log.schedule_id, now, log.state))
        state = log.state
        assert fold_schedule(log.records) == state
        if state.status == ACTIVE:
            # the cursor is always an occurrence, and never one already fired
            cursor = state.next_fire_at_ms
            assert next_after(cron, zone_name, cursor - 1) == cursor
            assert cursor not in log.fired_at
    assert len(set(log.fired_at)) == len(log.fired_at)
    assert log.fired_at == sorted(log.fired_at)
    for fired in log.fired_at:
        assert next_after(cron, zone_name, fired - 1) == fired


@settings(max_examples=examples(60), deadline=None)
@given(
    cron=st.sampled_from(["*/15 * * * *", "* * * * *", "0 * * * *", "0 1 * * *"]),
    zone_name=st.sampled_from(["Europe/Berlin", "America/New_York"]),
    start=st.sampled_from(
        [
            ms("2026-03-28T12:00Z"),
            ms("2026-10-24T12:00Z"),
            ms("2026-03-07T12:00Z"),
            ms("2026-10-31T12:00Z"),
        ]
    ),
    gaps=st.lists(st.integers(1_000, EDGE_GRACE_MS), min_size=1, max_size=64),
)
def test_cycles_closer_than_the_grace_fire_every_occurrence_exactly_once(
    cron, zone_name, start, gaps
):
    log = ScheduleLog(make_spec(cron, zone_name))
    log.arm(start)
    now = start
    end = start + DAY
    index = 0
    while now < end:
        now += gaps[index % len(gaps)]
        index += 1
        log.cycle(now, EDGE_GRACE_MS)
    expected = []  # every occurrence up to the last cycle
    at = next_after(cron, zone_name, start)
    while at <= now:
        expected.append(at)
        at = next_after(cron, zone_name, at)
    assert log.fired_at == expected
    assert all(not occurrence.late for occurrence in log.admitted)
    assert "schedule.skipped" not in event_types(log)


# --- overlap ------------------------------------------------------------------------------


def test_overlap_allow_fires_whatever_the_previous_run_does():
    log = armed_log(overlap="allow")
    decision = decide_due(log.state, log.spec, MIDNIGHT, 0, previous_running=True)
    assert decision.admit is not None and decision.admit.scheduled_for_ms == MIDNIGHT


def test_overlap_skip_skips_while_the_previous_run_runs():
    log = armed_log(overlap="skip")
    log.apply(decide_due(log.state, log.spec, MIDNIGHT + 1_000, 0, previous_running=True))
    assert log.admitted == []
    assert log.records[-1].data == {
        "from_ms": MIDNIGHT,
        "to_ms": MIDNIGHT + 1_000,
        "next_fire_at_ms": MIDNIGHT + 15 * MINUTE,
        "reason": schedules.OVERLAP,
    }
    fire = decide_due(log.state, log.spec, MIDNIGHT + 15 * MINUTE, 0, previous_running=False)
    assert fire.admit is not None


def test_overlap_queue_holds_the_occurrence_then_counts_lateness_from_the_end():
    log = armed_log(overlap="queue")
    held = decide_due(log.state, log.spec, MIDNIGHT + HOUR, 0, previous_running=True)
    assert held.noop  # held on the cursor: nothing written
    assert schedules.waits_for_previous(log.spec, True)
    assert not schedules.waits_for_previous(make_spec("* * * * *", overlap="skip"), True)
    # ended 40 minutes after the occurrence: lateness counts from the end, not the cursor
    ended = MIDNIGHT + 40 * MINUTE
    on_time = decide_due(
        log.state, log.spec, ended + 5 * MINUTE, 5 * MINUTE, previous_ended_at_ms=ended
    )
    assert on_time.admit is not None and on_time.admit.scheduled_for_ms == MIDNIGHT
    assert not on_time.admit.late
    late = decide_due(
        log.state, log.spec, ended + 5 * MINUTE + 1, 5 * MINUTE, previous_ended_at_ms=ended
    )
    assert late.admit is None and late.events[0].data["reason"] == LATE


def test_the_read_models_work_pair_holds_a_queue_schedule_only_while_its_run_runs():
    from domain.schedule_heads import Declaration, work_pair

    for overlap, expected in (("allow", (MIDNIGHT, MIDNIGHT)), ("queue", (None, MIDNIGHT))):
        log = armed_log(overlap=overlap)
        declaration = Declaration(
            log.schedule_id, "pub:x", "p", "i", "pkg", "acme", "wf", log.spec, MIDNIGHT - 1
        )
        assert work_pair(log.state, declaration, True) == expected
