"""The work answer is exact: for random reachable Runs — with retry policies, backoffs
either side of the deadline, leases, cancel intent, lost workers — `domain.work` says a
phase (or a lease grant) has work at an instant exactly when its decision has records
there, and the window the candidate index stores is that work."""

from __future__ import annotations

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from domain.aggregate import RunAggregate
from domain.errors import FenceError, InvalidInput
from domain.transitions import MIN_LEASE_TTL_MS
from domain.work import (
    DECISIONS,
    Window,
    WorkSet,
    _grantable,
    at_rest,
    grant_windows,
    grant_work,
    instants,
    next_opening,
    phase_windows,
    phase_work,
    stored_window,
    work_set,
)
from domain.worker import grant_lease
from tests.domain.strategies import (
    World,
    diamond_failure_world,
    make_plan,
    reachable_worlds,
    retry_under_deadline_world,
)
from tests.hypothesis_budget import examples

PROPERTY = settings(
    max_examples=examples(200),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def probes(aggregate: RunAggregate, now_ms: int) -> list[int]:
    """Every instant where an answer could change, either side, and around now."""
    found = {now_ms, now_ms + 1, 10**13}
    for point in instants(aggregate):
        found.update((point, point + 1, max(point - 1, 0)))
    return sorted(found)


def holds(work: WorkSet, now_ms: int) -> bool:
    return any(window.contains(now_ms) for window in work)


def assert_stored_is_exact(work: WorkSet, stored: Window | None, what: str) -> None:
    """The stored window is the work itself: every decision's work is one interval
    today (`domain.work.stored_window` keeps a re-check hull otherwise)."""
    assert len(work) <= 1, (what, work)
    assert stored == (work[0] if work else None), (what, work, stored)


@PROPERTY
@given(world=reachable_worlds(max_steps=24, max_actions=80), shift=st.integers(0, 20_000))
@example(world=retry_under_deadline_world(), shift=0)
@example(world=retry_under_deadline_world(), shift=2_000)
@example(world=diamond_failure_world(), shift=0)
def test_phase_work_is_the_decisions(world: World, shift: int) -> None:
    aggregate = world.agg
    work = phase_work(aggregate)
    stored = phase_windows(aggregate)
    for phase in DECISIONS:
        assert_stored_is_exact(work[phase], stored[phase], phase)
    if at_rest(aggregate.run.status):
        assert not any(work.values()), work
    for now in probes(aggregate, world.now_ms + shift):
        for phase, decide in DECISIONS.items():
            has_work = bool(decide(aggregate, now).appends)
            assert has_work == holds(work[phase], now), (phase, now, work[phase])


@PROPERTY
@given(world=reachable_worlds(max_steps=24, max_actions=80), shift=st.integers(0, 20_000))
@example(world=retry_under_deadline_world(), shift=0)
@example(world=diamond_failure_world(), shift=0)
def test_grant_work_is_the_lease_grant(world: World, shift: int) -> None:
    aggregate = world.agg
    work = grant_work(aggregate)
    stored = grant_windows(aggregate)
    for attempt_id, found in work.items():
        assert_stored_is_exact(found, stored.get(attempt_id), attempt_id)
    if at_rest(aggregate.run.status):
        assert not work, work
    for now in probes(aggregate, world.now_ms + shift):
        for attempt in aggregate.attempts.values():
            found = work.get(attempt.attempt_id, ())
            leases = attempt.is_active and _leases(aggregate, attempt.attempt_id, now)
            assert leases == holds(found, now), (now, found)
            # the probe `grant_work` asks answers as the grant itself
            assert _grantable(aggregate, attempt.attempt_id, now) == _leases(
                aggregate, attempt.attempt_id, now
            ), (attempt.attempt_id, now)


def _leases(aggregate: RunAggregate, attempt_id: str, now_ms: int) -> bool:
    """Whether the lease grant itself (not its probe) leases the Attempt at `now_ms`."""
    try:
        grant = grant_lease(aggregate, attempt_id, "test-worker", MIN_LEASE_TTL_MS, now_ms)
    except (FenceError, InvalidInput):
        return False
    return bool(grant.appends)


def test_a_retry_under_a_deadline_is_admitted_from_its_retry_time_until_the_deadline() -> None:
    world = retry_under_deadline_world()
    retry_at = world.agg.steps["a"].retry_at_ms
    deadline = world.agg.run.deadline_ms
    assert retry_at is not None and deadline is not None and world.now_ms < retry_at < deadline
    work = phase_work(world.agg)["claim"]
    assert work == (Window(retry_at, deadline),)
    assert next_opening(work, world.now_ms) == retry_at


def test_a_failed_diamond_branch_skips_its_join_while_the_sibling_runs() -> None:
    world = diamond_failure_world()
    assert world.agg.steps["c"].status == "running"
    (window,) = phase_work(world.agg)["frontier"]
    assert window.contains(world.now_ms)


def test_a_gapped_work_set_is_stored_from_its_first_opening_to_its_last_closing() -> None:
    open_at = {0: True, 10: False, 20: True, 30: False}
    work = work_set(open_at.__getitem__, sorted(open_at))
    assert work == (Window(0, 10), Window(20, 30))
    assert stored_window(work) == Window(0, 30)
    assert next_opening(work, 5) == 20
    assert stored_window(()) is None


def test_a_fresh_run_has_frontier_work_until_its_deadline() -> None:
    world = World(make_plan({"a": [], "b": ["a"]}, timeout_ms=4_000))
    windows = phase_windows(world.agg)
    deadline = world.agg.run.deadline_ms
    assert windows["claim"] is not None and windows["claim"].closes_ms == deadline
    assert windows["cancellation"] is not None and windows["cancellation"].opens_ms == deadline
    assert windows["recovery"] is None
