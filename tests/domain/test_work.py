"""The work answer is exact: for random reachable Runs, `domain.work` says a phase
(or a lease grant) is open at an instant exactly when its decision has records there."""

from __future__ import annotations

import os

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from domain.aggregate import RunAggregate
from domain.work import DECISIONS, _grantable, grant_windows, instants, phase_windows
from tests.domain.strategies import World, make_plan, reachable_worlds

EXAMPLES = int(os.environ.get("QLFLOW_FUZZ_EXAMPLES", "200"))
PROPERTY = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def probes(aggregate: RunAggregate, now_ms: int) -> list[int]:
    """Every instant where an answer could change, either side, and around now."""
    found = {now_ms, now_ms + 1, 10**13}
    for point in instants(aggregate):
        found.update((point, point + 1, max(point - 1, 0)))
    return sorted(found)


@PROPERTY
@given(world=reachable_worlds(max_steps=24, max_actions=80), shift=st.integers(0, 20_000))
def test_phase_windows_are_the_decisions(world: World, shift: int) -> None:
    aggregate = world.agg
    windows = phase_windows(aggregate)
    for now in probes(aggregate, world.now_ms + shift):
        for phase, decide in DECISIONS.items():
            window = windows[phase]
            has_work = bool(decide(aggregate, now).appends)
            assert has_work == (window is not None and window.contains(now)), (phase, now, window)


@PROPERTY
@given(world=reachable_worlds(max_steps=24, max_actions=80), shift=st.integers(0, 20_000))
def test_grant_windows_are_the_lease_grant(world: World, shift: int) -> None:
    aggregate = world.agg
    windows = grant_windows(aggregate)
    for now in probes(aggregate, world.now_ms + shift):
        for attempt in aggregate.attempts.values():
            window = windows.get(attempt.attempt_id)
            grantable = attempt.is_active and _grantable(aggregate, attempt.attempt_id, now)
            assert grantable == (window is not None and window.contains(now)), (now, window)


def test_a_fresh_run_has_frontier_work_until_its_deadline() -> None:
    world = World(make_plan({"a": [], "b": ["a"]}, timeout_ms=4_000))
    windows = phase_windows(world.agg)
    deadline = world.agg.run.deadline_ms
    assert windows["admission"] is not None and windows["admission"].closes_ms == deadline
    assert windows["cancellation"] is not None and windows["cancellation"].opens_ms == deadline
    assert windows["recovery"] is None
