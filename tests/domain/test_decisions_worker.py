"""Worker transitions (SPEC §5–6): lease grant, start barrier, renewal with
stop_requested, completion mapping, release, fencing and idempotent replays."""

from __future__ import annotations

import pytest

from domain.cancellation import decide_cancellation, request_cancel
from domain.errors import FenceError, InvalidInput, NotFound
from domain.ids import LEASE_ID, derive_id
from domain.streams import lease_stream, run_stream
from domain.worker import complete, grant_lease, mark_running, mark_starting, release, renew
from tests.domain.strategies import (
    RUN_ID,
    START_MS,
    TTL_MS,
    World,
    attempt_of,
    claim,
    force_step,
    lease,
    make_plan,
    start,
)

RUN = run_stream(RUN_ID)


def claimed(timeout_ms: int | None = None) -> World:
    world = World(make_plan({"a": [], "b": []}, timeout_ms=timeout_ms))
    claim(world)
    return world


def types(decision, stream=RUN):
    return [e.type for e in decision.events(stream)]


# --- grant -----------------------------------------------------------------------------


def test_grant_leases_a_claimed_attempt():
    world = claimed()
    attempt = attempt_of(world, "a")
    decision = world.apply(grant_lease(world.agg, attempt.attempt_id, "w7", 30_000, world.now_ms))
    lease_id = derive_id(LEASE_ID, attempt.attempt_id, 1)
    assert decision.lease.lease_id == lease_id
    assert (decision.lease.version, decision.lease.expires_at_ms) == (1, world.now_ms + 30_000)
    (granted,) = decision.events(lease_stream(attempt.attempt_id))
    assert granted.type == "lease.granted"
    assert granted.data == {
        "lease_id": lease_id,
        "attempt_id": attempt.attempt_id,
        "run_id": RUN_ID,
        "step_key": "a",
        "task_ref": "pkg@1#t-a",
        "worker_id": "w7",
        "granted_at_ms": world.now_ms,
        "ttl_ms": 30_000,
        "expires_at_ms": world.now_ms + 30_000,
    }
    assert granted.metadata["actor"] == "worker:w7"
    assert decision.events(RUN) == ()


@pytest.mark.parametrize("ttl", [4_999, 600_001, 0, True, 5_000.0, None])
def test_grant_refuses_a_ttl_out_of_range(ttl):
    world = claimed()
    with pytest.raises(InvalidInput, match="ttl_ms"):
        grant_lease(world.agg, attempt_of(world, "a").attempt_id, "w", ttl, world.now_ms)


@pytest.mark.parametrize("ttl", [5_000, 600_000])
def test_grant_accepts_the_ttl_bounds(ttl):
    world = claimed()
    assert grant_lease(world.agg, attempt_of(world, "a").attempt_id, "w", ttl, world.now_ms).lease


def test_grant_refuses_while_another_lease_is_live():
    world = claimed()
    lease(world, "a", worker="w1")
    with pytest.raises(FenceError, match="leased to 'w1'"):
        grant_lease(world.agg, attempt_of(world, "a").attempt_id, "w2", TTL_MS, world.now_ms)


def test_expired_unstarted_lease_is_released_and_granted_again_in_one_append():
    world = claimed()
    first = lease(world, "a")
    world.tick(TTL_MS)
    decision = world.apply(grant_lease(world.agg, first.attempt_id, "w2", TTL_MS, world.now_ms))
    events = decision.events(lease_stream(first.attempt_id))
    assert [(e.type, e.data.get("reason")) for e in events] == [
        ("lease.released", "lease_expired"),
        ("lease.granted", None),
    ]
    assert decision.lease.version == 3
    assert decision.lease.lease_id == derive_id(LEASE_ID, first.attempt_id, 3)
    assert len(decision.appends) == 1


@pytest.mark.parametrize("intent", ["recorded", "deadline"])
def test_no_lease_for_a_run_with_cancel_intent(intent):
    world = claimed(timeout_ms=60_000)
    if intent == "recorded":
        world.apply(request_cancel(world.agg, "user", world.now_ms))
    else:
        world.tick(60_000)
    with pytest.raises(FenceError, match="cancel intent"):
        grant_lease(world.agg, attempt_of(world, "a").attempt_id, "w", TTL_MS, world.now_ms)


def test_grant_refuses_unknown_started_stale_and_terminal():
    world = claimed()
    with pytest.raises(NotFound):
        grant_lease(world.agg, "wta:missing", "w", TTL_MS, world.now_ms)
    start(world, "a")
    with pytest.raises(FenceError, match="only a claimed Attempt"):
        grant_lease(world.agg, attempt_of(world, "a").attempt_id, "w", TTL_MS, world.now_ms)
    force_step(world, "b", "ready")  # b's claim is now a stale admission
    with pytest.raises(FenceError, match="stale admission"):
        grant_lease(world.agg, attempt_of(world, "b").attempt_id, "w", TTL_MS, world.now_ms)
    solo = World(make_plan({"x": []}))
    claim(solo)
    solo.apply(request_cancel(solo.agg, "user", solo.now_ms))
    solo.apply(decide_cancellation(solo.agg, solo.now_ms))
    with pytest.raises(FenceError, match="terminal"):
        grant_lease(solo.agg, attempt_of(solo, "x").attempt_id, "w", TTL_MS, solo.now_ms)


# --- start barrier ---------------------------------------------------------------------


def test_mark_starting_crosses_the_start_barrier():
    world = claimed()
    grant = lease(world, "a")
    decision = world.apply(
        mark_starting(world.agg, grant.attempt_id, grant.lease_id, grant.version, world.now_ms)
    )
    assert types(decision) == ["attempt.starting", "step.running"]
    assert decision.events(RUN)[0].data == {
        "attempt_id": grant.attempt_id,
        "lease_id": grant.lease_id,
        "lease_version": grant.version,
        "worker_id": "w1",
    }
    assert decision.events(RUN)[1].data["attempt_id"] == grant.attempt_id
    step = world.agg.steps["a"]
    assert (step.status, step.epoch) == ("running", 2)
    again = mark_starting(world.agg, grant.attempt_id, grant.lease_id, grant.version, world.now_ms)
    assert again.replayed and again.noop


def test_mark_running_from_claimed_passes_the_barrier_in_one_decision():
    world = claimed()
    grant = lease(world, "a")
    decision = world.apply(
        mark_running(world.agg, grant.attempt_id, grant.lease_id, grant.version, world.now_ms)
    )
    assert types(decision) == ["attempt.starting", "step.running", "attempt.running"]
    assert attempt_of(world, "a").status == "running"
    again = mark_running(world.agg, grant.attempt_id, grant.lease_id, grant.version, world.now_ms)
    assert again.replayed and again.noop
    assert mark_starting(
        world.agg, grant.attempt_id, grant.lease_id, grant.version, world.now_ms
    ).replayed


def test_a_live_lease_may_start_under_cancel_intent():
    world = claimed()
    grant = lease(world, "a")
    world.apply(request_cancel(world.agg, "user", world.now_ms))
    decision = world.apply(
        mark_running(world.agg, grant.attempt_id, grant.lease_id, grant.version, world.now_ms)
    )
    assert types(decision) == ["attempt.starting", "step.running", "attempt.running"]


# --- renewal ---------------------------------------------------------------------------


def test_renew_bumps_the_version_and_reports_stop_requested():
    world = claimed()
    grant = start(world, "a")
    world.tick(1_000)
    decision = world.apply(
        renew(world.agg, grant.attempt_id, grant.lease_id, grant.version, 20_000, world.now_ms)
    )
    assert decision.lease.version == grant.version + 1
    assert decision.lease.expires_at_ms == world.now_ms + 20_000
    assert not decision.stop_requested
    (renewed,) = decision.events(lease_stream(grant.attempt_id))
    assert renewed.data == {
        "lease_id": grant.lease_id,
        "renewed_at_ms": world.now_ms,
        "ttl_ms": 20_000,
        "expires_at_ms": world.now_ms + 20_000,
    }
    # the same renewal again (lost response): answered with the renewal it made
    replay = renew(world.agg, grant.attempt_id, grant.lease_id, grant.version, 20_000, world.now_ms)
    assert replay.replayed and replay.noop and replay.lease == decision.lease
    world.apply(request_cancel(world.agg, "user", world.now_ms))
    current = decision.lease
    stop = renew(
        world.agg, grant.attempt_id, current.lease_id, current.version, TTL_MS, world.now_ms
    )
    assert stop.stop_requested and not stop.noop


def test_stop_requested_when_the_deadline_passed():
    world = claimed(timeout_ms=20_000)
    grant = start(world, "a")
    world.tick(TTL_MS - 1)
    first = world.apply(
        renew(world.agg, grant.attempt_id, grant.lease_id, grant.version, 60_000, world.now_ms)
    )
    world.tick(20_000)
    second = renew(
        world.agg, grant.attempt_id, first.lease.lease_id, first.lease.version, 60_000, world.now_ms
    )
    assert not first.stop_requested and second.stop_requested


# --- completion ------------------------------------------------------------------------

INTENTS = [None, "user", "policy", "shutdown", "reconcile", "timeout", "deadline"]


def expected_completion(intent, outcome, result_code):
    if intent in ("timeout", "deadline"):
        return "timed_out", "execution_timed_out"
    if intent is not None:
        return "cancelled", "execution_cancelled"
    if outcome == "succeeded":
        return "succeeded", None
    return "failed", result_code or "execution_failed"


@pytest.mark.parametrize("result_code", [None, "exit_3"])
@pytest.mark.parametrize("outcome", ["succeeded", "failed"])
@pytest.mark.parametrize("intent", INTENTS)
def test_completion_mapping(intent, outcome, result_code):
    world = claimed(timeout_ms=60_000)
    grant = start(world, "a", running=True)
    world.apply(  # keep the lease live past the deadline
        renew(world.agg, grant.attempt_id, grant.lease_id, grant.version, 600_000, world.now_ms)
    )
    version = grant.version + 1
    if intent == "deadline":
        world.tick(60_000)
    elif intent is not None:
        world.apply(request_cancel(world.agg, intent, world.now_ms))
    output = {"exit_code": 0 if outcome == "succeeded" else 3}
    decision = world.apply(
        complete(
            world.agg,
            grant.attempt_id,
            grant.lease_id,
            version,
            outcome,
            result_code,
            output,
            world.now_ms,
        )
    )
    status, code = expected_completion(intent, outcome, result_code)
    assert types(decision) == [f"attempt.{status}", f"step.{status}"]
    assert decision.events(RUN)[0].data == {
        "attempt_id": grant.attempt_id,
        "result_code": code,
        "reported_outcome": outcome,
        "output": output,
        "execution": None,  # how it ran: the executor gives it, never in the output
        "lease_id": grant.lease_id,
    }
    (completed,) = decision.events(lease_stream(grant.attempt_id))
    assert completed.type == "lease.completed" and completed.data["outcome"] == status
    step = world.agg.steps["a"]
    assert (step.status, step.result_code) == (status, code)
    assert attempt_of(world, "a").status == status
    assert decision.settled_attempts == 1 and decision.settled_steps == 1
    # the same completion again after a lost response: replayed, nothing new
    again = complete(
        world.agg,
        grant.attempt_id,
        grant.lease_id,
        version,
        outcome,
        result_code,
        output,
        world.now_ms,
    )
    assert again.replayed and again.noop


def test_complete_before_start_is_refused():
    world = claimed()
    grant = lease(world, "a")
    with pytest.raises(InvalidInput, match="mark it starting"):
        complete(
            world.agg,
            grant.attempt_id,
            grant.lease_id,
            grant.version,
            "succeeded",
            None,
            None,
            world.now_ms,
        )


def test_complete_refuses_bad_arguments():
    world = claimed()
    grant = start(world, "a")
    args = (world.agg, grant.attempt_id, grant.lease_id, grant.version)
    with pytest.raises(InvalidInput, match="outcome"):
        complete(*args, "cancelled", None, None, world.now_ms)
    with pytest.raises(InvalidInput, match="result_code"):
        complete(*args, "failed", "", None, world.now_ms)
    with pytest.raises(InvalidInput, match="output"):
        complete(*args, "failed", None, [1], world.now_ms)


def test_a_different_completion_after_completion_is_fenced():
    world = claimed()
    grant = start(world, "a")
    args = (world.agg, grant.attempt_id, grant.lease_id, grant.version)
    world.apply(complete(*args, "succeeded", None, None, world.now_ms))
    args = (world.agg, grant.attempt_id, grant.lease_id, grant.version)
    with pytest.raises(FenceError, match="completed"):
        complete(*args, "failed", None, None, world.now_ms)


# --- release ---------------------------------------------------------------------------


def test_release_gives_a_claim_back():
    world = claimed()
    grant = lease(world, "a")
    decision = world.apply(
        release(
            world.agg,
            grant.attempt_id,
            grant.lease_id,
            grant.version,
            "capacity_changed",
            world.now_ms,
        )
    )
    (released,) = decision.events(lease_stream(grant.attempt_id))
    assert released.data == {"lease_id": grant.lease_id, "reason": "capacity_changed"}
    assert attempt_of(world, "a").status == "claimed"
    again = release(
        world.agg, grant.attempt_id, grant.lease_id, grant.version, "capacity_changed", world.now_ms
    )
    assert again.replayed and again.noop
    regrant = world.apply(grant_lease(world.agg, grant.attempt_id, "w2", TTL_MS, world.now_ms))
    assert regrant.lease.version == 3


def test_release_refuses_a_started_attempt_and_unknown_reasons():
    world = claimed()
    grant = start(world, "a")
    args = (world.agg, grant.attempt_id, grant.lease_id, grant.version)
    with pytest.raises(InvalidInput, match="start barrier"):
        release(*args, "shutdown", world.now_ms)
    with pytest.raises(InvalidInput, match="reason"):
        release(*args, "bored", world.now_ms)


# --- fencing ---------------------------------------------------------------------------

OPERATIONS = ["start", "running", "renew", "complete", "release"]


def call(op, world, attempt_id, lease_id, version):
    now = world.now_ms
    agg = world.agg
    if op == "start":
        return mark_starting(agg, attempt_id, lease_id, version, now)
    if op == "running":
        return mark_running(agg, attempt_id, lease_id, version, now)
    if op == "renew":
        return renew(agg, attempt_id, lease_id, version, TTL_MS, now)
    if op == "complete":
        return complete(agg, attempt_id, lease_id, version, "succeeded", None, None, now)
    return release(agg, attempt_id, lease_id, version, "declined", now)


def fenced_world(op):
    """An Attempt at the state where `op` is the worker's next legal write."""
    world = claimed()
    if op in ("complete",):
        return world, start(world, "a")
    return world, lease(world, "a")


@pytest.mark.parametrize("op", OPERATIONS)
def test_unknown_lease_is_fenced(op):
    world, grant = fenced_world(op)
    with pytest.raises(FenceError, match="unknown lease 'wls:nope'"):
        call(op, world, grant.attempt_id, "wls:nope", grant.version)


@pytest.mark.parametrize("op", OPERATIONS)
def test_replaced_lease_is_fenced(op):
    world = claimed()
    old = lease(world, "a", worker="w1")
    world.tick(TTL_MS)
    new = world.apply(grant_lease(world.agg, old.attempt_id, "w2", TTL_MS, world.now_ms)).lease
    with pytest.raises(FenceError, match=f"was replaced by '{new.lease_id}'"):
        call(op, world, old.attempt_id, old.lease_id, old.version)


@pytest.mark.parametrize("op", OPERATIONS)
def test_stale_version_is_fenced(op):
    world, grant = fenced_world(op)
    with pytest.raises(FenceError, match=f"stale version {grant.version + 5}"):
        call(op, world, grant.attempt_id, grant.lease_id, grant.version + 5)


@pytest.mark.parametrize("op", OPERATIONS)
def test_expired_lease_is_fenced(op):
    world, grant = fenced_world(op)
    world.tick(TTL_MS + 3)
    expected = f"expired at {grant.expires_at_ms} \\(now {world.now_ms}\\)"
    with pytest.raises(FenceError, match=expected):
        call(op, world, grant.attempt_id, grant.lease_id, grant.version)


@pytest.mark.parametrize("op", ["start", "running", "renew", "release"])
def test_completed_lease_is_fenced(op):
    world = claimed()
    grant = start(world, "a")
    world.apply(
        complete(
            world.agg,
            grant.attempt_id,
            grant.lease_id,
            grant.version,
            "failed",
            None,
            None,
            world.now_ms,
        )
    )
    with pytest.raises(FenceError, match="is completed"):
        call(op, world, grant.attempt_id, grant.lease_id, grant.version)


@pytest.mark.parametrize("op", ["start", "running", "renew", "complete"])
def test_released_lease_is_fenced(op):
    world = claimed()
    grant = lease(world, "a")
    world.apply(
        release(
            world.agg, grant.attempt_id, grant.lease_id, grant.version, "shutdown", world.now_ms
        )
    )
    with pytest.raises(FenceError, match="is released"):
        call(op, world, grant.attempt_id, grant.lease_id, grant.version)


@pytest.mark.parametrize("op", OPERATIONS)
def test_terminal_run_is_fenced(op):
    world = World(make_plan({"x": [], "y": []}))
    claim(world)
    grant = lease(world, "x")
    world.apply(
        release(
            world.agg, grant.attempt_id, grant.lease_id, grant.version, "shutdown", world.now_ms
        )
    )
    world.apply(request_cancel(world.agg, "user", world.now_ms))
    world.apply(decide_cancellation(world.agg, world.now_ms))
    assert world.agg.run.status == "cancelled"
    with pytest.raises(FenceError, match="terminal"):
        call(op, world, grant.attempt_id, grant.lease_id, grant.version)


def test_started_attempt_answers_only_to_its_start_lease():
    world = claimed()
    grant = start(world, "a")
    assert world.agg.attempts[grant.attempt_id].started_lease_id == grant.lease_id
    assert world.now_ms == START_MS  # fencing below is by lease identity, not by time
    with pytest.raises(FenceError):
        call(
            "complete",
            world,
            grant.attempt_id,
            derive_id(LEASE_ID, grant.attempt_id, 9),
            grant.version,
        )


@pytest.mark.parametrize("op", OPERATIONS)
def test_a_lease_is_live_until_just_before_it_expires(op):
    world, grant = fenced_world(op)
    world.tick(TTL_MS - 1)
    assert not call(op, world, grant.attempt_id, grant.lease_id, grant.version).noop
    world.tick(1)  # now == expires_at_ms
    with pytest.raises(FenceError, match="expired"):
        call(op, world, grant.attempt_id, grant.lease_id, grant.version)


def test_a_lease_left_on_an_ended_attempt_grants_nothing():
    # a grant that raced a cancellation (each CAS'd only its own streams) leaves a live
    # lease on a cancelled Attempt: no start, no renewal, no completion under it
    world = claimed()
    lease(world, "b")  # b stays blocked, so the Run stays running
    attempt_id = attempt_of(world, "a").attempt_id
    early = world.agg
    world.apply(request_cancel(world.agg, "user", world.now_ms))
    world.apply(decide_cancellation(world.agg, world.now_ms))
    raced = grant_lease(early, attempt_id, "w1", TTL_MS, world.now_ms)
    world.apply(raced)  # the lease stream was still at its expected version
    grant = raced.lease
    assert world.agg.attempts[attempt_id].status == "cancelled"
    assert world.agg.run.status == "running"
    for op in OPERATIONS:
        with pytest.raises(FenceError, match="holds no execution authority"):
            call(op, world, attempt_id, grant.lease_id, grant.version)
