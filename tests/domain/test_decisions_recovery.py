"""Recovery (SPEC §6): pre-start requeue, post-start lost → failed, with and without
cancel intent, backlog untouched, never twice."""

from __future__ import annotations

import pytest

from domain.cancellation import request_cancel
from domain.recovery import decide_recovery
from domain.streams import lease_stream, run_stream
from domain.worker import release
from tests.domain.strategies import (
    RUN_ID,
    TTL_MS,
    World,
    attempt_of,
    claim,
    lease,
    make_plan,
    start,
)

RUN = run_stream(RUN_ID)


def claimed_world(timeout_ms: int | None = None) -> World:
    world = World(make_plan({"a": [], "b": []}, timeout_ms=timeout_ms))
    claim(world)
    return world


def types(decision, stream=RUN):
    return [e.type for e in decision.events(stream)]


def test_expired_claim_before_start_is_lost_and_requeued():
    world = claimed_world()
    grant = lease(world, "a")
    world.tick(TTL_MS)  # now == expires_at: the lease is no longer live
    decision = world.apply(decide_recovery(world.agg, world.now_ms))
    assert types(decision) == ["attempt.lost", "step.ready"]
    lost = decision.events(RUN)[0].data
    assert lost["result_code"] == "lease_expired" and lost["lease_id"] == grant.lease_id
    released = decision.events(lease_stream(grant.attempt_id))
    assert [(e.type, e.data["reason"]) for e in released] == [("lease.released", "lease_expired")]
    step = world.agg.steps["a"]
    assert (step.status, step.epoch) == ("ready", 2)
    assert world.agg.attempts[grant.attempt_id].status == "lost"
    assert decision.settled_attempts == 1 and decision.settled_steps == 0
    assert decide_recovery(world.agg, world.now_ms + 10 * TTL_MS).noop  # never twice


@pytest.mark.parametrize("running", [False, True])
def test_expired_lease_after_start_is_lost_then_failed(running):
    world = claimed_world()
    grant = start(world, "a", running=running)
    world.tick(TTL_MS)
    decision = world.apply(decide_recovery(world.agg, world.now_ms))
    assert types(decision) == ["attempt.lost", "step.lost", "step.failed"]
    assert types(decision, lease_stream(grant.attempt_id)) == ["lease.released"]
    step = world.agg.steps["a"]
    assert (step.status, step.result_code, step.epoch) == ("failed", "lease_expired", 4)
    assert decision.settled_steps == 1
    assert decide_recovery(world.agg, world.now_ms).noop


@pytest.mark.parametrize("intent", ["recorded", "deadline"])
def test_under_intent_pre_start_step_is_left_ready(intent):
    world = claimed_world(timeout_ms=3 * TTL_MS)
    lease(world, "a")
    if intent == "recorded":
        world.apply(request_cancel(world.agg, "user", world.now_ms))
        world.tick(TTL_MS)
    else:
        world.tick(3 * TTL_MS)
    decision = world.apply(decide_recovery(world.agg, world.now_ms))
    assert types(decision) == ["attempt.lost"]
    assert (world.agg.steps["a"].status, world.agg.steps["a"].epoch) == ("ready", 1)


@pytest.mark.parametrize("intent", ["recorded", "deadline"])
def test_under_intent_post_start_step_is_left_lost(intent):
    world = claimed_world(timeout_ms=3 * TTL_MS)
    start(world, "a", running=True)
    if intent == "recorded":
        world.apply(request_cancel(world.agg, "reconcile", world.now_ms))
        world.tick(TTL_MS)
    else:
        world.tick(3 * TTL_MS)
    decision = world.apply(decide_recovery(world.agg, world.now_ms))
    assert types(decision) == ["attempt.lost", "step.lost"]
    assert world.agg.steps["a"].status == "lost"


def test_live_lease_and_backlog_are_untouched():
    world = claimed_world()
    grant = lease(world, "a")
    world.tick(TTL_MS - 1)
    assert decide_recovery(world.agg, world.now_ms).noop  # a's lease is still live
    world.tick(10**9)  # b was never leased: backlog, however old
    decision = decide_recovery(world.agg, world.now_ms)
    lost = [e.data["attempt_id"] for e in decision.events(RUN) if e.type == "attempt.lost"]
    assert lost == [grant.attempt_id]


def test_released_claim_is_backlog():
    world = claimed_world()
    grant = lease(world, "a")
    world.apply(
        release(
            world.agg, grant.attempt_id, grant.lease_id, grant.version, "declined", world.now_ms
        )
    )
    world.tick(10 * TTL_MS)
    assert decide_recovery(world.agg, world.now_ms).noop
    assert attempt_of(world, "a").status == "claimed"


def test_recovery_ids_do_not_depend_on_the_clock():
    world = claimed_world()
    start(world, "a")
    lease(world, "b")
    world.tick(TTL_MS)
    first = decide_recovery(world.agg, world.now_ms)
    later = decide_recovery(world.agg, world.now_ms + 77_000)
    assert [(e.event_id, e.data) for a in first.appends for e in a.events] == [
        (e.event_id, e.data) for a in later.appends for e in a.events
    ]
    assert first.settled_attempts == 2
