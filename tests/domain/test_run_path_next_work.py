"""Properties of a completion that takes its worker's next work in the same decision
(`run_path.complete_and_lease_next`) over random reachable Runs: its records are the
completion's, then only lease grants and start barriers of Attempts it claimed, each
the worker's, within its limit and its Tasks, never of a limited Task (these plans
have no limits: tests/cycle/test_run_path.py covers them); it takes every such
Attempt the grant allows until the limit; it folds and appends cleanly; and a Run
whose workers take their next work this way ends with no Step started twice."""

from __future__ import annotations

import random

from hypothesis import assume, event, given
from hypothesis import strategies as st

from domain.errors import QlflowError
from domain.run_path import (
    NextWork,
    applied,
    complete_and_advance,
    complete_and_lease_next,
    lease_and_start,
)
from domain.slots import attempt_slot
from domain.transitions import LEASE_LEASED
from domain.worker import grant_lease
from tests.domain.strategies import CYCLE, TTL_MS, World, plans, reachable_worlds
from tests.domain.test_decisions_properties import PROPERTY, encode

WORKER = "w-next"
# what a grant with its start barrier writes (the StepRun change in either log format)
LEASE_AND_START_TYPES = ("lease.granted", "attempt.starting", "step_run.mutated", "step.running")


def _held(world):
    """The Attempts a worker holds a live lease on; when there are none, the first
    one a worker may lease is leased and started (so most worlds have one)."""
    agg = world.agg

    def held():
        return [
            a
            for a in world.agg.active_attempts()
            if a.lease is not None
            and a.lease.status == LEASE_LEASED
            and a.lease.is_live(world.now_ms)
        ]

    if not held():
        for attempt in agg.active_attempts():
            try:
                world.apply(lease_and_start(agg, attempt.attempt_id, "w1", TTL_MS, world.now_ms))
            except QlflowError:
                continue
            break
    return held()


def _complete_checked(world, attempt, outcome, limit, tasks):
    """Complete `attempt` under its lease with `NextWork(limit, tasks)`, check what the
    decision holds against the completion alone, apply it; returns it (None: refused,
    as the completion alone is)."""
    agg, now, lease = world.agg, world.now_ms, attempt.lease
    args = (agg, attempt.attempt_id, lease.lease_id, lease.version, outcome, None, None, now)
    work = NextWork(WORKER, TTL_MS, limit, tasks)
    try:
        alone = complete_and_advance(*args)
    except QlflowError as refused:
        try:
            complete_and_lease_next(*args, next_work=work)
        except QlflowError as also:
            assert str(also) == str(refused)  # refused alike
            return None
        raise AssertionError("refused alone but not with next work") from refused
    carried = complete_and_lease_next(*args, next_work=work)
    assert encode(carried) == encode(complete_and_lease_next(*args, next_work=work))
    # the completion's records first, unchanged; then only grants with their start
    alone_events = {a.stream_id: a.events for a in alone.appends}
    for append in carried.appends:
        prefix = alone_events.get(append.stream_id, ())
        assert append.events[: len(prefix)] == prefix
        for new in append.events[len(prefix) :]:
            assert new.type in LEASE_AND_START_TYPES
            assert new.metadata["actor"] == f"worker:{WORKER}"
    # what it leased: claimed by this completion, in claim order, within limit and tasks
    after_alone = applied(agg, alone)
    claimed = [a for a in after_alone.attempts if a not in agg.attempts]
    taken = [grant.attempt_id for grant in carried.next_leases]
    event(f"took {min(len(taken), 2)}+ of {min(len(claimed), 3)}+ claimed, limit {limit}")
    assert len(taken) <= limit and taken == [a for a in claimed if a in taken]

    def eligible(attempt_id):
        step = after_alone.steps[after_alone.attempts[attempt_id].step_key]
        return (tasks is None or step.task_ref in tasks) and attempt_slot(
            after_alone, attempt_id
        ) is None

    assert all(eligible(a) for a in taken)
    if len(taken) < limit:  # every other eligible one only where the grant refuses it
        for attempt_id in (a for a in claimed if eligible(a) and a not in taken):
            try:
                grant_lease(after_alone, attempt_id, WORKER, TTL_MS, now)
            except QlflowError:
                continue
            raise AssertionError(f"{attempt_id} was grantable and left untaken")
    # it appends (versions contiguous, ids unique) and folds to started Attempts
    world.apply(carried)
    for grant in carried.next_leases:
        state = world.agg.attempts[grant.attempt_id]
        assert state.status == "starting"
        assert state.lease is not None and state.lease.lease_id == grant.lease_id
        assert state.lease.worker_id == WORKER
    return carried


@PROPERTY
@given(reachable_worlds(), st.integers(1, 3), st.data())
def test_a_completion_takes_its_next_work_within_its_limit_and_tasks(world, limit, data):
    held = _held(world)
    assume(held)
    attempt = data.draw(st.sampled_from(held))
    refs = sorted({s.task_ref for s in world.agg.steps.values()})
    tasks = data.draw(st.none() | st.frozensets(st.sampled_from(refs)))
    outcome = data.draw(st.sampled_from(("succeeded", "failed")))
    _complete_checked(world, attempt, outcome, limit, tasks)


@PROPERTY
@given(plans(2, 40), st.integers(0, 2**32))
def test_a_run_whose_workers_take_their_next_work_ends_with_nothing_run_twice(plan, seed):
    """The worker's queue is fed by its completions' next work; the cycle runs only
    when it is empty. Every Step starts at most once per Attempt and
    the Run ends."""
    rng = random.Random(seed)
    world = World(plan)
    refs = sorted({s.task_ref for s in world.agg.steps.values()})
    queue: list[str] = []
    started: list[str] = []
    for _ in range(4 * len(refs) + 20):
        if world.agg.run.is_terminal:
            break
        if not queue:
            for decide in CYCLE.values():  # recovery, cancellation (a deadline), claims
                world.apply(decide(world.agg, world.now_ms))
            for attempt in world.agg.active_attempts():
                try:
                    decision = world.apply(
                        lease_and_start(world.agg, attempt.attempt_id, WORKER, TTL_MS, world.now_ms)
                    )
                except QlflowError:
                    continue
                assert decision.lease is not None
                queue.append(decision.lease.attempt_id)
            started += queue
            if not queue:
                world.tick(TTL_MS)  # a retry's backoff: the next claim waits for it
                continue
        attempt = world.agg.attempts[queue.pop(rng.randrange(len(queue)))]
        outcome = "failed" if rng.random() < 0.2 else "succeeded"
        tasks = (
            None if rng.random() < 0.7 else frozenset(rng.sample(refs, rng.randint(0, len(refs))))
        )
        carried = _complete_checked(world, attempt, outcome, rng.randint(1, 4), tasks)
        assert carried is not None  # held and live: the completion is not refused
        taken = [grant.attempt_id for grant in carried.next_leases]
        started += taken
        queue += taken
        world.tick(rng.choice((0, 1, 10)))
    assert world.agg.run.is_terminal, "the Run did not end"
    assert len(started) == len(set(started)), "an Attempt was started twice"
