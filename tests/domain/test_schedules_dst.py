"""Occurrences across daylight-saving transitions.

The rule: a wall time that does not exist (spring forward) fires once, at the first
valid instant after it (the transition); a wall time that happens twice (fall back)
fires once, at its first instant. Everything else fires exactly when the zone's
clock shows it. The 2026 transitions used here:

- Europe/Berlin: 2026-03-29 01:00Z (02:00 CET -> 03:00 CEST),
  2026-10-25 01:00Z (03:00 CEST -> 02:00 CET);
- America/New_York: 2026-03-08 07:00Z (02:00 EST -> 03:00 EDT),
  2026-11-01 06:00Z (02:00 EDT -> 01:00 EST).
"""

from __future__ import annotations

import itertools
from datetime import timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from domain.errors import InvalidInput
from domain.occurrences import EPOCH, MS, next_after, parse_cron, wall_time, wall_to_ms, zone
from tests.domain.schedule_log import DAY, HOUR, MINUTE, ScheduleLog, local, make_spec, ms
from tests.hypothesis_budget import examples

BERLIN = "Europe/Berlin"
NEW_YORK = "America/New_York"
# (zone, first instant of the local day, length of that day in hours)
BERLIN_SPRING = (BERLIN, ms("2026-03-29T00:00+01:00"), 23)
BERLIN_FALL = (BERLIN, ms("2026-10-25T00:00+02:00"), 25)
NY_SPRING = (NEW_YORK, ms("2026-03-08T00:00-05:00"), 23)
NY_FALL = (NEW_YORK, ms("2026-11-01T00:00-04:00"), 25)
DST_DAYS = [BERLIN_SPRING, BERLIN_FALL, NY_SPRING, NY_FALL]
DAY_IDS = ["berlin-spring", "berlin-fall", "ny-spring", "ny-fall"]
CRONS = ["30 2 * * *", "0 * * * *", "*/15 * * * *", "0 1 * * *", "30 * * * *", "* * * * *"]


def occurrences(cron: str, zone_name: str, start_ms: int, end_ms: int) -> list[int]:
    """Every occurrence in [start_ms, end_ms), by repeated next_after."""
    found = []
    at = next_after(cron, zone_name, start_ms - 1)
    while at < end_ms:
        found.append(at)
        at = next_after(cron, zone_name, at)
    return found


def matching_walls(cron: str, first, last) -> list:
    """Every naive wall time in [first, last] the cron matches (cronsim's matching)."""
    walls = []
    for wall in parse_cron_at(cron, first - timedelta(seconds=1)):
        if wall > last:
            return walls
        walls.append(wall)
    return walls


def parse_cron_at(cron: str, wall):
    return type(parse_cron(cron))(cron, wall)


def brute_force(cron: str, zone_name: str, start_ms: int, end_ms: int) -> list[int]:
    """The rule, by scanning every minute of real time: a matching wall time fires at
    the first minute showing it; one that no minute shows (a gap) fires at the first
    minute showing a later wall time."""
    tz = zone(zone_name)
    instants = range(start_ms - DAY, end_ms + DAY, MINUTE)
    shown: dict = {}
    timeline = []
    for at in instants:
        wall = wall_time(at, tz)
        shown.setdefault(wall, at)
        timeline.append((at, wall))
    found = set()
    walls = matching_walls(
        cron, wall_time(start_ms - 12 * HOUR, tz), wall_time(end_ms + 12 * HOUR, tz)
    )
    for wall in walls:
        if wall in shown:
            found.add(shown[wall])
        else:
            found.add(next(at for at, later in timeline if later > wall))
    return sorted(at for at in found if start_ms <= at < end_ms)


# --- the concrete instants ----------------------------------------------------------------


def test_missing_daily_wall_time_fires_once_at_the_transition():
    # 02:30 does not exist on either spring-forward day: it fires at 03:00 summer time.
    assert occurrences("30 2 * * *", BERLIN, *BERLIN_SPRING[1:2], BERLIN_SPRING[1] + DAY) == [
        ms("2026-03-29T01:00Z")
    ]
    assert occurrences("30 2 * * *", NEW_YORK, NY_SPRING[1], NY_SPRING[1] + DAY) == [
        ms("2026-03-08T07:00Z")
    ]
    # The next day is back to 02:30 local.
    assert next_after("30 2 * * *", BERLIN, ms("2026-03-29T01:00Z")) == ms("2026-03-30T02:30+02:00")


def test_repeated_daily_wall_time_fires_once_at_its_first_instant():
    # 02:30 happens twice in Berlin on 2026-10-25 (00:30Z CEST, 01:30Z CET): once, CEST.
    assert occurrences("30 2 * * *", BERLIN, BERLIN_FALL[1], BERLIN_FALL[1] + 25 * HOUR) == [
        ms("2026-10-25T00:30Z")
    ]
    # 01:00 happens twice in New York on 2026-11-01 (05:00Z EDT, 06:00Z EST): once, EDT.
    assert occurrences("0 1 * * *", NEW_YORK, NY_FALL[1], NY_FALL[1] + 25 * HOUR) == [
        ms("2026-11-01T05:00Z")
    ]
    # 01:00 in Berlin is before the repeated hour: an ordinary day.
    assert occurrences("0 1 * * *", BERLIN, BERLIN_FALL[1], BERLIN_FALL[1] + 25 * HOUR) == [
        ms("2026-10-24T23:00Z")
    ]


def test_hourly_on_spring_forward_merges_the_missing_hour_into_the_transition():
    found = occurrences("0 * * * *", BERLIN, BERLIN_SPRING[1], BERLIN_SPRING[1] + 23 * HOUR)
    shown = [local(at, BERLIN)[11:] for at in found]
    assert shown[:4] == ["00:00+0100", "01:00+0100", "03:00+0200", "04:00+0200"]
    assert len(found) == 23  # 02:00 does not exist; it is the 03:00 fire


def test_hourly_on_fall_back_fires_the_repeated_hour_once():
    found = occurrences("0 * * * *", NEW_YORK, NY_FALL[1], NY_FALL[1] + 25 * HOUR)
    shown = [local(at, NEW_YORK)[11:] for at in found]
    assert shown[:4] == ["00:00-0400", "01:00-0400", "02:00-0500", "03:00-0500"]
    assert len(found) == 24  # 01:00 EST (06:00Z) does not fire again


def test_half_past_on_spring_forward_fires_the_missing_half_hour_at_the_transition():
    found = occurrences("30 * * * *", NEW_YORK, NY_SPRING[1], NY_SPRING[1] + 23 * HOUR)
    assert [local(at, NEW_YORK)[11:] for at in found[:4]] == [
        "00:30-0500",
        "01:30-0500",
        "03:00-0400",  # 02:30, which does not exist
        "03:30-0400",
    ]
    assert len(found) == 24


@pytest.mark.parametrize(("zone_name", "start", "hours"), [BERLIN_SPRING, NY_SPRING])
def test_every_15_minutes_on_spring_forward(zone_name, start, hours):
    found = occurrences("*/15 * * * *", zone_name, start, start + hours * HOUR)
    # 02:00, 02:15, 02:30 and 02:45 do not exist; they and 03:00 are one fire.
    assert len(found) == 96 - 4
    gap = [b - a for a, b in itertools.pairwise(found) if b - a != 15 * MINUTE]
    assert gap == []  # 01:45 standard time to 03:00 summer time is 15 real minutes


@pytest.mark.parametrize(("zone_name", "start", "hours"), [BERLIN_FALL, NY_FALL])
def test_every_15_minutes_on_fall_back(zone_name, start, hours):
    found = occurrences("*/15 * * * *", zone_name, start, start + hours * HOUR)
    assert len(found) == 96  # each wall time once; the repeated hour's second pass is quiet
    walls = [local(at, zone_name)[11:16] for at in found]
    assert len(set(walls)) == 96
    gaps = [b - a for a, b in itertools.pairwise(found) if b - a != 15 * MINUTE]
    assert gaps == [HOUR + 15 * MINUTE]


def test_next_after_an_instant_in_the_second_pass_skips_what_already_fired():
    # 01:20 EST on 2026-11-01 (06:20Z): 01:30 already fired at 05:30Z (EDT).
    assert next_after("*/30 * * * *", NEW_YORK, ms("2026-11-01T06:20Z")) == ms(
        "2026-11-01T02:00-05:00"
    )
    assert next_after("* * * * *", BERLIN, ms("2026-10-25T01:59Z")) == ms("2026-10-25T02:00Z")


def test_wall_to_ms_maps_gap_and_fold_by_the_rule():
    tz = zone(BERLIN)
    gap_wall = wall_time(ms("2026-03-29T00:30Z"), tz) + timedelta(hours=1)  # 02:30, missing
    assert wall_to_ms(gap_wall, tz) == ms("2026-03-29T01:00Z")
    fold_wall = wall_time(ms("2026-10-25T00:30Z"), tz)  # 02:30 CEST, repeated
    assert wall_to_ms(fold_wall, tz) == ms("2026-10-25T00:30Z")
    assert wall_time(ms("2026-10-25T01:30Z"), tz) == fold_wall


# --- no duplicate, no lost occurrence -----------------------------------------------------


@pytest.mark.parametrize("cron", CRONS)
@pytest.mark.parametrize(("zone_name", "start", "hours"), DST_DAYS, ids=DAY_IDS)
def test_dst_day_matches_the_rule_by_brute_force(cron, zone_name, start, hours):
    end = start + hours * HOUR
    assert occurrences(cron, zone_name, start, end) == brute_force(cron, zone_name, start, end)


@pytest.mark.parametrize("cron", ["30 2 * * *", "0 * * * *", "*/15 * * * *", "0 1 * * *"])
@pytest.mark.parametrize(("zone_name", "start", "hours"), DST_DAYS, ids=DAY_IDS)
def test_cursor_across_a_dst_day_fires_each_occurrence_once(cron, zone_name, start, hours):
    spec = make_spec(cron, zone_name)
    log = ScheduleLog(spec)
    log.arm(start - DAY - 1)  # published just before the first occurrence
    end = start + hours * HOUR + DAY
    for now in range(start - DAY, end, MINUTE):
        log.cycle(now + 5_000)  # every minute, 5 s late: always within the grace
    expected = occurrences(cron, zone_name, start - DAY, end)
    assert log.fired_at == expected
    assert len(set(log.fired_at)) == len(log.fired_at)
    types = {event.type for decision in log.decisions for event in decision.events}
    assert types == {"schedule.armed", "schedule.fired"}


ZONE_NAMES = [BERLIN, NEW_YORK, "Australia/Lord_Howe", "Pacific/Chatham", "America/Santiago"]
ZONES = st.sampled_from([*ZONE_NAMES, "UTC", "Asia/Kolkata"])
SOME_CRONS = st.sampled_from(
    [*CRONS, "45 1 * * *", "0,30 2 * * *", "*/20 1-3 * * *", "15 3 * * 0", "0 2 L * *"]
)


def transitions(zone_name: str) -> list[int]:
    """Noon UTC of each day in 2026-2027 on which the zone's offset changes."""
    tz = zone(zone_name)
    days = range(ms("2026-01-01T12:00Z"), ms("2028-01-01T12:00Z"), DAY)
    offsets = [(EPOCH + at * MS).astimezone(tz).utcoffset() for at in days]
    return [days[i] for i in range(1, len(days)) if offsets[i] != offsets[i - 1]]


TRANSITIONS = [(name, day) for name in ZONE_NAMES for day in transitions(name)]


@settings(max_examples=examples(60), deadline=None)
@given(
    near=st.sampled_from(TRANSITIONS),
    cron=SOME_CRONS,
    shift=st.integers(-60 * HOUR, 12 * HOUR),
)
def test_two_days_around_any_transition_match_the_rule_by_brute_force(near, cron, shift):
    zone_name, day = near
    start = day + shift - (day + shift) % MINUTE
    end = start + 2 * DAY
    assert occurrences(cron, zone_name, start, end) == brute_force(cron, zone_name, start, end)


@settings(max_examples=examples(200), deadline=None)
@given(zone_name=ZONES, cron=SOME_CRONS, after=st.integers(0, ms("2100-01-01T00:00Z")))
def test_next_after_is_strictly_later_and_nothing_fires_in_between(zone_name, cron, after):
    found = next_after(cron, zone_name, after)
    assert found > after
    assert next_after(cron, zone_name, found - 1) == found
    tz = zone(zone_name)
    wall = wall_time(found, tz)
    # Either the clock shows a matching wall time, or `found` is a transition that
    # stands in for a missing one (the clock jumped forward right at it).
    shows_match = matching_walls(cron, wall, wall) == [wall]
    jumped = wall_time(found - 1, tz) + timedelta(milliseconds=1) != wall
    assert shows_match or jumped


def test_instants_outside_the_supported_range_are_refused():
    with pytest.raises(InvalidInput) as refused:
        next_after("* * * * *", "UTC", -1)
    assert refused.value.field == "after_ms"
    with pytest.raises(InvalidInput):
        next_after("* * * * *", "UTC", (EPOCH.replace(year=9500) - EPOCH) // MS)
    with pytest.raises(InvalidInput) as refused:
        next_after("* * * * *", "Mars/Olympus", 0)
    assert refused.value.field == "timezone"
