"""Retry policy (plan v2): a reported failure with attempts left goes back to ready
and waits its backoff; losses are never retried past the start barrier."""

from __future__ import annotations

import random

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from domain.attempts import decide_attempt_claims
from domain.cancellation import decide_cancellation, request_cancel
from domain.frontier import decide_frontier
from domain.recovery import decide_recovery
from domain.retries import next_retry_at_ms, reported_failures, retry_number, waiting_retry
from domain.retry import MAX_BACKOFF_MS, RetryPolicy, backoff_after
from domain.worker import complete, grant_lease, mark_running, mark_starting
from tests.domain.strategies import START_MS, TTL_MS, World, dag_needs, drive, make_plan
from tests.hypothesis_budget import examples

CHAIN = {"a": [], "b": ["a"]}


def world_with(max_attempts: int, backoff_ms: int, timeout_ms: int | None = None) -> World:
    return World(make_plan(CHAIN, retries={"a": (max_attempts, backoff_ms)}, timeout_ms=timeout_ms))


def claim(world: World) -> str:
    decision = world.apply(decide_attempt_claims(world.agg, world.now_ms))
    claimed = [e for e in decision.appends[0].events if e.type == "attempt.claimed"]
    assert len(claimed) == 1, decision
    return claimed[0].data["attempt_id"]


def run_attempt(world: World, attempt_id: str, outcome: str, code: str | None = None) -> None:
    now = world.now_ms
    world.apply(grant_lease(world.agg, attempt_id, "w1", TTL_MS, now))
    lease = world.agg.attempts[attempt_id].lease
    world.apply(mark_running(world.agg, attempt_id, lease.lease_id, lease.version, now))
    lease = world.agg.attempts[attempt_id].lease
    world.apply(
        complete(world.agg, attempt_id, lease.lease_id, lease.version, outcome, code, None, now)
    )


def cycle(world: World) -> None:
    for decide in (decide_recovery, decide_cancellation, decide_frontier):
        world.apply(decide(world.agg, world.now_ms))


def test_two_failures_then_success_takes_three_attempts_and_waits_each_backoff():
    world = world_with(3, 1_000)
    first = claim(world)
    run_attempt(world, first, "failed")
    step = world.agg.steps["a"]
    assert step.status == "ready" and step.retry_at_ms == START_MS + 1_000
    assert world.agg.attempts[first].status == "failed"
    assert retry_number(world.agg, "a") == (2, 3)
    assert next_retry_at_ms(world.agg) == START_MS + 1_000

    world.tick(999)
    assert waiting_retry(world.agg.steps["a"], world.now_ms)
    assert decide_attempt_claims(world.agg, world.now_ms).appends == ()
    world.tick(1)
    second = claim(world)
    run_attempt(world, second, "failed", "worker_shutdown")  # the host's stop is a failure
    assert world.agg.steps["a"].retry_at_ms == world.now_ms + 2_000  # doubled
    world.tick(1_999)
    assert decide_attempt_claims(world.agg, world.now_ms).appends == ()
    world.tick(1)
    third = claim(world)
    run_attempt(world, third, "succeeded")
    assert world.agg.steps["a"].status == "succeeded"
    assert len(world.agg.steps["a"].attempt_ids) == 3
    for _ in range(3):
        cycle(world)
        world.apply(decide_attempt_claims(world.agg, world.now_ms))
        for attempt in world.agg.active_attempts():
            run_attempt(world, attempt.attempt_id, "succeeded")
    assert world.agg.run.status == "succeeded"
    assert world.refold() == world.agg


def test_a_step_that_exhausts_its_attempts_fails_the_run():
    world = world_with(2, 0)
    run_attempt(world, claim(world), "failed")
    assert world.agg.steps["a"].status == "ready"
    run_attempt(world, claim(world), "failed")
    assert world.agg.steps["a"].status == "failed"
    assert world.agg.steps["a"].result_code == "execution_failed"
    cycle(world)
    assert world.agg.steps["b"].status == "skipped"
    assert world.agg.run.status == "failed"


def test_a_lost_attempt_past_the_start_barrier_is_not_retried():
    world = world_with(3, 0)
    attempt_id = claim(world)
    world.apply(grant_lease(world.agg, attempt_id, "w1", TTL_MS, world.now_ms))
    lease = world.agg.attempts[attempt_id].lease
    world.apply(mark_starting(world.agg, attempt_id, lease.lease_id, lease.version, world.now_ms))
    world.tick(TTL_MS)
    for _ in range(2):
        cycle(world)
    assert world.agg.attempts[attempt_id].status == "lost"
    assert world.agg.steps["a"].status == "failed"
    assert world.agg.steps["a"].result_code == "lease_expired"
    assert world.agg.run.status == "failed"


def test_a_loss_before_the_barrier_is_requeued_without_using_a_retry():
    world = world_with(2, 0)
    attempt_id = claim(world)
    world.apply(grant_lease(world.agg, attempt_id, "w1", TTL_MS, world.now_ms))
    world.tick(TTL_MS)
    cycle(world)
    assert world.agg.attempts[attempt_id].status == "lost"
    assert world.agg.steps["a"].status == "ready"
    assert reported_failures(world.agg, "a") == 0
    run_attempt(world, claim(world), "failed")
    assert world.agg.steps["a"].status == "ready"  # the one retry is still there


def test_a_cancel_while_a_step_waits_for_its_retry_settles_it_cancelled():
    world = world_with(3, 60_000)
    run_attempt(world, claim(world), "failed")
    world.apply(request_cancel(world.agg, "user", world.now_ms))
    cycle(world)
    assert world.agg.steps["a"].status == "cancelled"
    assert world.agg.run.status == "cancelled"


def test_a_timeout_while_a_step_waits_for_its_retry_settles_it_timed_out():
    world = world_with(3, 60_000, timeout_ms=30_000)
    run_attempt(world, claim(world), "failed")
    world.tick(30_000)
    cycle(world)
    assert world.agg.steps["a"].status == "timed_out"
    assert world.agg.run.status == "timed_out"


@given(
    backoff=st.integers(0, MAX_BACKOFF_MS),
    failures=st.integers(1, 80),
)
def test_backoff_doubles_and_is_capped(backoff, failures):
    policy = RetryPolicy(64, backoff)
    wait = backoff_after(policy, failures)
    assert wait == min(backoff * 2 ** (failures - 1), MAX_BACKOFF_MS)
    assert backoff_after(policy, failures + 1) >= wait


@settings(max_examples=examples(40), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    needs=dag_needs(1, 12),
    limits=st.lists(st.tuples(st.integers(1, 4), st.integers(0, 3_000)), min_size=12, max_size=12),
    seed=st.integers(0, 2**32),
)
def test_random_workloads_with_retries_keep_the_retry_rules(needs, limits, seed):
    keys = sorted(needs)
    plan = make_plan(needs, retries={key: limits[i] for i, key in enumerate(keys)})
    world = World(plan)
    drive(world, random.Random(seed))
    agg = world.agg
    assert world.refold() == agg
    retry_at: dict[str, int] = {}
    for decision, _after in world.history:
        for append in decision.appends:
            for event in append.events:
                key = event.data.get("step_key")
                if event.type == "step.ready" and "retry_at_ms" in event.data:
                    retry_at[key] = event.data["retry_at_ms"]
                if event.type == "attempt.claimed" and key in retry_at:
                    assert event.metadata["at_ms"] >= retry_at.pop(key)
    for key, step in agg.steps.items():
        planned = plan.step(key)
        failures = reported_failures(agg, key)
        assert failures <= planned.max_attempts
        if step.status == "failed" and step.result_code == "execution_failed":
            assert failures == planned.max_attempts
        if step.status == "succeeded":
            assert failures < planned.max_attempts
