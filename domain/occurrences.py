"""When a cron fires: its occurrences in a schedule's zone, as epoch milliseconds.

cronsim matches the five fields against wall-clock time; this module turns a wall
time into an instant with one rule for every expression:

- a wall time that does not exist (clocks spring forward) fires once, at the first
  valid instant after it — the transition itself, where the clock shows the end
  of the gap (02:30 on a Berlin spring-forward day fires at 03:00 CEST);
- a wall time that happens twice (clocks fall back) fires once, at its first
  instant (01:30 on a New York fall-back day fires at 01:30 EDT, not again at EST).

Each wall time fires at most once, and wall times that map to one instant (02:00,
02:15, … in a gap, and the 03:00 after it) are one occurrence. cronsim applies this
rule itself only when the minute and hour fields are fixed; for "0 * * * *" or
"*/15 * * * *" it steps through real time, which fires a repeated wall time twice
and drops a missing one. So cronsim is handed naive wall times, never a zone, and
the mapping to instants is done here.

Zones are read from the `tzdata` package, not the host's database, so every replica
with the same install computes the same instants.
"""

from __future__ import annotations

import functools
from datetime import UTC, datetime, timedelta
from importlib import resources
from zoneinfo import ZoneInfo

from cronsim import CronSim, CronSimError

from domain.errors import InvalidInput

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
MS = timedelta(milliseconds=1)
# cronsim and datetime stop at year 9999; stay far below so an occurrence can be found.
MAX_INSTANT_MS = (datetime(9000, 1, 1, tzinfo=UTC) - EPOCH) // MS
# Wall times after `after_ms` can still map at or before it when `after_ms` lies in
# the second pass of a repeated hour; no zone repeats more than a day of minutes.
_MAX_CANDIDATES = 2 * 24 * 60


@functools.cache
def zone_names() -> frozenset[str]:
    """Every IANA zone name the `tzdata` package holds."""
    text = resources.files("tzdata").joinpath("zones").read_text(encoding="utf-8")
    return frozenset(text.split())


@functools.lru_cache(maxsize=512)
def _load(name: str) -> ZoneInfo:
    path = resources.files("tzdata.zoneinfo").joinpath(*name.split("/"))
    with path.open("rb") as data:
        return ZoneInfo.from_file(data, key=name)


def zone(name: str) -> ZoneInfo:
    """The IANA zone `name` from `tzdata`; InvalidInput("timezone", "iana") otherwise."""
    if not isinstance(name, str) or name not in zone_names():
        raise InvalidInput(
            "timezone",
            "iana",
            f"timezone must be an IANA zone name such as 'UTC' or 'Europe/Berlin', got {name!r}",
        )
    return _load(name)


def parse_cron(cron: str) -> CronSim:
    """cronsim's parse of a 5-field expression (raises CronSimError when malformed)."""
    return CronSim(cron, datetime(2000, 1, 1))


def wall_time(at_ms: int, tz: ZoneInfo) -> datetime:
    """The naive wall-clock time the zone shows at the instant `at_ms`."""
    return (EPOCH + at_ms * MS).astimezone(tz).replace(tzinfo=None)


def wall_to_ms(wall: datetime, tz: ZoneInfo) -> int:
    """The instant a naive wall time fires at in `tz` (the rule in the module docstring)."""
    first = (wall.replace(tzinfo=tz, fold=0) - EPOCH) // MS
    if wall_time(first, tz) == wall:
        return first  # exists; fold=0 is the first of two instants when it is repeated
    # In a gap, fold=0 reads the wall time with the offset before the transition and
    # fold=1 with the one after: the transition lies in (low, high]. Find the first
    # instant whose wall time is not before `wall`.
    low = (wall.replace(tzinfo=tz, fold=1) - EPOCH) // MS
    high = first
    while high - low > 1:
        middle = (low + high) // 2
        if wall_time(middle, tz) >= wall:
            high = middle
        else:
            low = middle
    return high


def check_instant(name: str, value: object) -> int:
    """Refuse an instant (epoch ms) that is not an int in [0, MAX_INSTANT_MS]."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidInput(name, "non_negative_int", f"{name} must be an int >= 0, got {value!r}")
    if value > MAX_INSTANT_MS:
        raise InvalidInput(name, "range", f"{name} must be at most {MAX_INSTANT_MS}, got {value}")
    return value


def next_after(cron: str, timezone: str, after_ms: int) -> int:
    """The first occurrence of `cron` in `timezone` strictly after `after_ms` (epoch ms).

    Bounded: one forward step of cronsim, plus at most the wall times of one repeated
    hour that already fired at their first instant. InvalidInput("cron",
    "no_occurrence") for an expression that never fires again (none within 50 years).
    """
    after_ms = check_instant("after_ms", after_ms)
    tz = zone(timezone)
    try:
        walls = CronSim(cron, wall_time(after_ms, tz))
    except CronSimError as error:
        raise InvalidInput("cron", "syntax", f"cron {cron!r} is not valid: {error}") from None
    # Every wall time up to the one `after_ms` shows maps at or before `after_ms`, and
    # the mapping never decreases, so the first mapped instant past `after_ms` is the
    # answer.
    for _ in range(_MAX_CANDIDATES):
        try:
            wall = next(walls)
        except StopIteration:
            break
        at_ms = wall_to_ms(wall, tz)
        if at_ms > after_ms:
            if at_ms > MAX_INSTANT_MS:
                break
            return at_ms
    raise InvalidInput(
        "cron", "no_occurrence", f"cron {cron!r} has no occurrence in {timezone} after {after_ms}"
    )
