"""Which occurrences a schedule backfill admits (docs/DESIGN.md, "Schedules").

A backfill admits one Run per occurrence of a schedule in `[from_ms, to_ms)`, with
the admission key the live firing uses (`domain.schedules.admission_key`), so a
backfill and the live schedule never make two Runs for one occurrence. The
occurrences are the schedule's own (`domain.schedules.next_occurrence`: its cron in
its zone, daylight-saving rules included).
"""

from __future__ import annotations

from domain.errors import InvalidInput
from domain.occurrences import check_instant
from domain.schedule_spec import ScheduleSpec
from domain.schedules import next_occurrence

MAX_BACKFILL_RUNS = 1_000  # Runs one backfill call admits at most
MAX_BACKFILL_SPAN_MS = 366 * 24 * 3_600_000  # a range over a year is refused
BACKFILL_BATCH = 100  # Runs per transaction: no commit holds more


def check_range(from_ms: object, to_ms: object, max_runs: object) -> tuple[int, int, int]:
    """The range and limit as given, when `from_ms < to_ms`, the range is at most a
    year and `max_runs` is 1..MAX_BACKFILL_RUNS; else InvalidInput naming the field."""
    start, end = check_instant("from_ms", from_ms), check_instant("to_ms", to_ms)
    if end <= start:
        raise InvalidInput("to_ms", "range", f"to_ms ({end}) must be after from_ms ({start})")
    if end - start > MAX_BACKFILL_SPAN_MS:
        raise InvalidInput(
            "to_ms", "range", "a backfill range is at most 366 days; split it into several"
        )
    if isinstance(max_runs, bool) or not isinstance(max_runs, int):
        raise InvalidInput("max_runs", "int", f"max_runs must be an int, got {max_runs!r}")
    if not 1 <= max_runs <= MAX_BACKFILL_RUNS:
        raise InvalidInput(
            "max_runs", "range", f"max_runs must be 1..{MAX_BACKFILL_RUNS}, got {max_runs}"
        )
    return start, end, max_runs


def occurrences_between(
    spec: ScheduleSpec, from_ms: int, to_ms: int, max_runs: int
) -> tuple[list[int], bool]:
    """The first `max_runs` occurrences of `spec` in `[from_ms, to_ms)`, in order, and
    whether more remain in the range."""
    found: list[int] = []
    after = max(from_ms - 1, 0)  # next_occurrence is strictly after `after`
    while True:
        at = next_occurrence(spec, after)
        if at >= to_ms:
            return found, False
        if len(found) == max_runs:
            return found, True
        found.append(at)
        after = at
