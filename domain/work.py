"""Which cycle phases have work on a Run, and when (docs/DESIGN.md, "The candidate index").

The answer is the decisions' own: nothing here restates a status rule. For a folded
aggregate, each decision (and the lease grant, for each active Attempt) is a function
of the observation time alone, and it can only change where a time the aggregate
holds is crossed — the Run's deadline, a lease's expiry, a retry time. Between two
such instants it is constant, so calling it once per interval tells exactly when it
has work:

- `phase_work(aggregate)` -> {phase: WorkSet}: the instants at which
  `decide_<phase>(aggregate, now_ms)` returns records;
- `grant_work(aggregate)` -> {attempt_id: WorkSet}: the instants at which
  `grant_lease` would lease the Attempt (what a worker may claim);
- `phase_windows` / `grant_windows`: the same as the index stores them;
- `at_rest(status)`: whether a Run in that status has no work at all, at any
  instant, without folding it (an ended Run; a rebuild asks it first).

A Window is half-open, `[opens_ms, closes_ms)`, `closes_ms` None for never. Nothing
is assumed about the shape of the work in time: a decision is called at every
instant where it may change, so a phase's work is exactly a `WorkSet`, a sorted
tuple of disjoint Windows (attempt admission under a retry is closed until the
retry time, open from it, and closed again at the deadline). `stored_window` is
the one Window the candidate index keeps for a WorkSet (see its docstring).
tests/domain/test_work.py checks, over random Runs with retries, backoffs and
deadlines, that the work sets and the decisions agree at every instant.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial

from domain.aggregate import RunAggregate
from domain.attempts import decide_attempt_claims
from domain.cancellation import decide_cancellation
from domain.decision import Decision, HasWork
from domain.errors import FenceError, InvalidInput
from domain.frontier import decide_frontier
from domain.phases import CANCELLATION, CLAIM, FRONTIER, RECOVERY
from domain.recovery import decide_recovery
from domain.transitions import MIN_LEASE_TTL_MS, RUN_TERMINAL, STEP_READY
from domain.worker import grant_lease

DECISIONS: Mapping[str, Callable[..., Decision]] = {
    RECOVERY: decide_recovery,
    CANCELLATION: decide_cancellation,
    FRONTIER: decide_frontier,
    CLAIM: decide_attempt_claims,
}
"""The cycle's decision for each phase whose work is on a Run (`RUN_PHASES`): called
`decide(aggregate, now_ms)`, or with `probe=True` to ask only whether it writes."""

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


WorkSet = tuple[Window, ...]
"""The instants at which there is work: sorted, disjoint, non-adjacent Windows
(empty: never)."""


def phase_work(aggregate: RunAggregate) -> dict[str, WorkSet]:
    """Each phase's exact WorkSet on `aggregate`: its decision called once per
    interval between the instants the aggregate holds."""
    points = instants(aggregate)
    return {
        phase: work_set(partial(_decides, decide, aggregate), points)
        for phase, decide in DECISIONS.items()
    }


def grant_work(aggregate: RunAggregate) -> dict[str, WorkSet]:
    """The WorkSet in which each active Attempt may be leased (Attempts that never
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
        work = work_set(partial(_grantable, aggregate, attempt.attempt_id), sorted(points))
        if work:
            found[attempt.attempt_id] = work
    return found


def phase_windows(aggregate: RunAggregate) -> dict[str, Window | None]:
    """Each phase's `stored_window` on `aggregate` (None: no work at any instant)."""
    return {phase: stored_window(work) for phase, work in phase_work(aggregate).items()}


def grant_windows(aggregate: RunAggregate) -> dict[str, Window]:
    """Each leasable Attempt's `stored_window`."""
    return {
        attempt_id: window
        for attempt_id, work in grant_work(aggregate).items()
        if (window := stored_window(work)) is not None
    }


def at_rest(status: str) -> bool:
    """Whether a Run whose status is `status` has no work: every phase's WorkSet and
    every Attempt's grant WorkSet empty, whatever else the aggregate holds. True of an
    ended Run: each decision and the lease grant start by refusing one
    (`RunState.is_terminal`); tests/domain/test_work.py checks it against
    `phase_work` and `grant_work`. A caller that knows the status may then skip the
    fold and the probing (docs/DESIGN.md, "Rebuild")."""
    return status in RUN_TERMINAL


def stored_window(work: WorkSet) -> Window | None:
    """The one Window the candidate index keeps for `work`: the work itself when it
    is one interval (what every decision gives today: tests/domain/test_work.py
    checks it), else from its first opening to its last closing. A gap in between is
    then a re-check: a cycle that looks at the Run there finds no work and writes
    nothing, and the next interval is still found after the first one closes."""
    if not work:
        return None
    return Window(work[0].opens_ms, work[-1].closes_ms)


def next_opening(work: WorkSet, after_ms: int) -> int | None:
    """The first instant after `after_ms` at which a Window of `work` opens."""
    return next((w.opens_ms for w in work if w.opens_ms > after_ms), None)


def _decides(decide: Callable[..., Decision], aggregate: RunAggregate, now_ms: int) -> bool:
    """Whether `decide` writes at `now_ms`: asked of a probe builder, which stops at
    the first record (the same code path, without building the rest)."""
    try:
        return bool(decide(aggregate, now_ms, probe=True).appends)
    except HasWork:
        return True


def _grantable(aggregate: RunAggregate, attempt_id: str, now_ms: int) -> bool:
    try:
        grant_lease(aggregate, attempt_id, _PROBE_WORKER, MIN_LEASE_TTL_MS, now_ms, probe=True)
    except HasWork:
        return True
    except (FenceError, InvalidInput):  # InvalidInput: even the shortest lease would
        return False  # expire past the latest instant
    return True


def work_set(has_work: Callable[[int], bool], points: Sequence[int]) -> WorkSet:
    """The Windows made of `points`' intervals `[p_i, p_i+1)` where `has_work(p_i)`
    (the last interval is open-ended): `has_work` must be constant on each."""
    found: list[Window] = []
    opens: int | None = None
    for point in points:
        if has_work(point):
            if opens is None:
                opens = point
        elif opens is not None:
            found.append(Window(opens, point))
            opens = None
    if opens is not None:
        found.append(Window(opens))
    return tuple(found)
