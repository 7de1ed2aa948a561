"""Which cycle phases have work on a Run, and when (docs/DESIGN.md, "The candidate index").

The answer is the decisions' own: nothing here restates a status rule. For a folded
aggregate, each decision (and the lease grant, for each active Attempt) is a function
of the observation time alone, and it can only change where a time the aggregate
holds is crossed — the Run's deadline, or a lease's expiry. Between two such instants
it is constant, so calling it once per interval tells exactly when it has work:

- `phase_windows(aggregate)` -> {phase: Window | None}: the instants at which
  `decide_<phase>(aggregate, now_ms)` returns records;
- `grant_windows(aggregate)` -> {attempt_id: Window}: the instants at which
  `grant_lease` would lease the Attempt (what a worker may claim).

A Window is half-open, `[opens_ms, closes_ms)`, `closes_ms` None for never. A
phase's work changes at most once in time (recovery and cancellation open at an
instant and stay open; frontier and attempt admission are open until the deadline),
so it is found by bisection; a grant's window may open and close (a lease expires,
then the deadline comes), and its few instants are all looked at.
tests/domain/test_work.py checks, over random Runs, that the windows and the
decisions agree at every instant.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial

from domain.aggregate import RunAggregate
from domain.attempts import decide_attempt_admission
from domain.cancellation import decide_cancellation
from domain.decision import Decision
from domain.errors import FenceError, InvalidInput
from domain.frontier import decide_frontier
from domain.phases import ADMISSION, CANCELLATION, FRONTIER, RECOVERY
from domain.recovery import decide_recovery
from domain.transitions import MIN_LEASE_TTL_MS, STEP_READY
from domain.worker import grant_lease

DECISIONS: Mapping[str, Callable[[RunAggregate, int], Decision]] = {
    RECOVERY: decide_recovery,
    CANCELLATION: decide_cancellation,
    FRONTIER: decide_frontier,
    ADMISSION: decide_attempt_admission,
}
"""The cycle's decision for each phase whose work is on a Run (`RUN_PHASES`)."""

_PROBE_WORKER = "work-probe"  # a grant is asked for, never written


@dataclass(frozen=True, slots=True)
class Window:
    """The instants `[opens_ms, closes_ms)` at which there is work (`closes_ms`
    None: it stays open until the aggregate changes)."""

    opens_ms: int
    closes_ms: int | None = None

    def contains(self, now_ms: int) -> bool:
        """Whether there is work at `now_ms`."""
        return self.opens_ms <= now_ms and (self.closes_ms is None or now_ms < self.closes_ms)


def instants(aggregate: RunAggregate) -> tuple[int, ...]:
    """Where the decisions over `aggregate` may change, sorted: 0 (the first
    observation time), the deadline, every active Attempt's lease expiry, and the
    instant each StepRun waiting for its retry may be claimed again."""
    found = {0}
    deadline = aggregate.run.deadline_ms
    if deadline is not None:
        found.add(deadline)
    for step in aggregate.steps.values():
        if step.status == STEP_READY and step.retry_at_ms is not None:
            found.add(step.retry_at_ms)
    for attempt in aggregate.active_attempts():
        if attempt.lease is not None:
            found.add(attempt.lease.expires_at_ms)
    return tuple(sorted(found))


def phase_windows(aggregate: RunAggregate) -> dict[str, Window | None]:
    """Each phase's Window of work on `aggregate` (None: no work at any instant)."""
    points = instants(aggregate)
    return {
        phase: _monotone_window(partial(_decides, decide, aggregate), points)
        for phase, decide in DECISIONS.items()
    }


def grant_windows(aggregate: RunAggregate) -> dict[str, Window]:
    """The Window in which each active Attempt may be leased (Attempts that never
    may are left out). A grant reads the Run's deadline and this Attempt's own lease,
    so only those instants are looked at."""
    deadline = aggregate.run.deadline_ms
    found = {}
    for attempt in aggregate.active_attempts():
        points = {0}
        if deadline is not None:
            points.add(deadline)
        if attempt.lease is not None:
            points.add(attempt.lease.expires_at_ms)
        window = _window(partial(_grantable, aggregate, attempt.attempt_id), sorted(points))
        if window is not None:
            found[attempt.attempt_id] = window
    return found


def _decides(
    decide: Callable[[RunAggregate, int], Decision], aggregate: RunAggregate, now_ms: int
) -> bool:
    return bool(decide(aggregate, now_ms).appends)


def _grantable(aggregate: RunAggregate, attempt_id: str, now_ms: int) -> bool:
    try:
        grant_lease(aggregate, attempt_id, _PROBE_WORKER, MIN_LEASE_TTL_MS, now_ms)
    except (FenceError, InvalidInput):  # InvalidInput: even the shortest lease would
        return False  # expire past the latest instant
    return True


def _window(has_work: Callable[[int], bool], points: Sequence[int]) -> Window | None:
    """The interval of `points`' intervals `[p_i, p_i+1)` where `has_work(p_i)`."""
    opens: int | None = None
    closes: int | None = None
    for point in points:
        if has_work(point):
            if opens is None:
                opens = point
            closes = None
        elif opens is not None and closes is None:
            closes = point
    return None if opens is None else Window(opens, closes)


def _monotone_window(has_work: Callable[[int], bool], points: Sequence[int]) -> Window | None:
    """`_window` for work that changes at most once over `points` (a phase's work
    opens once and stays, or is there until it closes once): a bisection, so a Run
    with many leases costs a few decisions, not one per lease."""
    first = has_work(points[0])
    last = has_work(points[-1]) if len(points) > 1 else first
    if first == last:
        return Window(points[0]) if first else None
    low, high = 0, len(points) - 1  # has_work(points[low]) == first != has_work(points[high])
    while high - low > 1:
        middle = (low + high) // 2
        if has_work(points[middle]) == first:
            low = middle
        else:
            high = middle
    return Window(points[0], points[high]) if first else Window(points[high])
