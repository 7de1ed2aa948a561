"""Whole-workflow cancellation convergence (SPEC §7, ADR-0228): every StepRun status
× every cancel reason, every Attempt state, parent last, partial convergence."""

from __future__ import annotations

import pytest

from domain.cancellation import decide_cancellation, request_cancel
from domain.errors import InvalidInput
from domain.ids import (
    CANCEL_ATTEMPT_EVENT,
    CANCEL_INTENT_EVENT,
    CANCEL_RUN_EVENT,
    CANCEL_STEP_EVENT,
    CANCEL_STEP_MUTATION,
    derive_id,
)
from domain.recovery import decide_recovery
from domain.streams import lease_stream, run_stream, steps_stream
from domain.transitions import CANCEL_REASONS
from domain.worker import complete, release
from tests.domain.strategies import (
    RUN_ID,
    START_MS,
    TTL_MS,
    World,
    attempt_of,
    claim,
    finish,
    force_step,
    lease,
    make_plan,
    start,
)

RUN = run_stream(RUN_ID)
STEPS = steps_stream(RUN_ID)


def build_step(status: str, reason: str) -> World:
    """A Run whose Step "x" is in `status`, then cancel intent with `reason`."""
    world = World(make_plan({"r": [], "x": ["r"]} if status == "pending" else {"x": []}))
    if status == "waiting_approval":
        force_step(world, "x", "waiting_approval")
    elif status in ("running", "lost"):
        claim(world)
        start(world, "x", running=True)
    elif status in ("succeeded", "failed"):
        claim(world)
        finish(world, "x", status)
    elif status in ("skipped", "cancelled", "timed_out"):
        force_step(world, "x", status, "code")
    world.apply(request_cancel(world.agg, reason, world.now_ms))
    if status == "lost":
        world.tick(TTL_MS)
        world.apply(decide_recovery(world.agg, world.now_ms))
        assert world.agg.steps["x"].status == "lost"
    return world


def expected_step(status: str, reason: str) -> tuple[str, str | None]:
    if status in ("pending", "lost"):
        return "cancelled", "workflow_cancelled"
    if status in ("ready", "waiting_approval"):
        if reason == "timeout":
            return "timed_out", "workflow_timed_out"
        return "cancelled", "workflow_cancelled"
    return status, None  # running is blocked, terminal is left as it is


STATUSES = [
    "pending", "ready", "waiting_approval", "running", "lost",
    "succeeded", "failed", "cancelled", "timed_out", "skipped",
]  # fmt: skip


@pytest.mark.parametrize("reason", CANCEL_REASONS)
@pytest.mark.parametrize("status", STATUSES)
def test_step_status_by_cancel_reason(status, reason):
    world = build_step(status, reason)
    before = world.agg.steps["x"]
    decision = world.apply(decide_cancellation(world.agg, world.now_ms))
    after = world.agg.steps["x"]
    to_status, code = expected_step(status, reason)
    assert after.status == to_status
    if to_status != status:
        assert after.result_code == code
        assert after.epoch == before.epoch + 1
        ids = [e.event_id for e in decision.events(RUN)]
        cancel_at = world.agg.run.cancel_requested_at_ms
        parts = (RUN_ID, cancel_at, "step", before.step_run_id, before.epoch)
        event_id = derive_id(CANCEL_STEP_EVENT, *parts)
        assert event_id in ids
        assert CANCEL_STEP_MUTATION + event_id[4:] in [e.event_id for e in decision.events(STEPS)]
    else:
        assert after.epoch == before.epoch
    parent = "timed_out" if reason == "timeout" else "cancelled"
    if status == "running":
        assert decision.blocked == (attempt_of(world, "x").attempt_id, before.step_run_id)
        assert decision.run_terminal is None
        assert world.agg.run.status == "running"
    else:
        assert decision.blocked == ()
        assert decision.run_terminal == parent  # whatever the steps' outcomes were
        last = decision.events(RUN)[-1]
        assert last.type == f"workflow.{parent}"
        assert last.data == {
            "result_code": f"workflow_{parent}",
            "error_code": "EXECUTION_TIMED_OUT" if reason == "timeout" else "EXECUTION_CANCELLED",
        }
    assert decide_cancellation(world.agg, world.now_ms).appends == ()


def build_attempt(state: str, reason: str) -> World:
    """A one-Step Run whose Attempt is in `state`, then cancel intent."""
    world = World(make_plan({"x": []}))
    claim(world)
    if state == "claimed_leased_live":
        lease(world, "x")
    elif state == "claimed_leased_expired":
        lease(world, "x")
        world.tick(TTL_MS)
    elif state == "claimed_released":
        grant = lease(world, "x")
        world.apply(
            release(
                world.agg, grant.attempt_id, grant.lease_id, grant.version, "shutdown", world.now_ms
            )
        )
    elif state in ("starting", "running"):
        start(world, "x", running=state == "running")
    elif state == "stale_admission":
        force_step(world, "x", "ready")  # a requeue the Attempt was not admitted against
    world.apply(request_cancel(world.agg, reason, world.now_ms))
    return world


ENDED = ["claimed_unleased", "claimed_leased_expired", "claimed_released"]
BLOCKED = ["claimed_leased_live", "starting", "running", "stale_admission"]


@pytest.mark.parametrize("reason", ["user", "timeout"])
@pytest.mark.parametrize("state", ENDED)
def test_claim_without_active_lease_is_ended(state, reason):
    world = build_attempt(state, reason)
    attempt = attempt_of(world, "x")
    decision = world.apply(decide_cancellation(world.agg, world.now_ms))
    to_status = "timed_out" if reason == "timeout" else "cancelled"
    events = decision.events(RUN)
    assert [e.type for e in events] == [
        f"attempt.{to_status}",
        f"step.{to_status}",
        f"workflow.{to_status}",
    ]
    cancel_at = world.agg.run.cancel_requested_at_ms
    assert events[0].event_id == derive_id(
        CANCEL_ATTEMPT_EVENT, RUN_ID, cancel_at, "attempt", attempt.attempt_id, attempt.step_epoch
    )
    assert events[0].data["result_code"] == f"execution_{to_status}"
    assert events[-1].event_id == derive_id(
        CANCEL_RUN_EVENT, RUN_ID, cancel_at, "run", RUN_ID, world.agg.version - 1
    )
    lease_events = decision.events(lease_stream(attempt.attempt_id))
    if state == "claimed_leased_expired":
        assert [(e.type, e.data["reason"]) for e in lease_events] == [
            ("lease.released", "lease_expired")
        ]
        assert world.agg.attempts[attempt.attempt_id].lease.status == "released"
    else:
        assert lease_events == ()
    assert world.agg.attempts[attempt.attempt_id].status == to_status
    assert decision.settled_attempts == 1 and decision.settled_steps == 1
    assert decision.blocked == ()


@pytest.mark.parametrize("reason", ["user", "timeout"])
@pytest.mark.parametrize("state", BLOCKED)
def test_attempt_holding_authority_is_blocked_never_ended(state, reason):
    world = build_attempt(state, reason)
    attempt = attempt_of(world, "x")
    step = world.agg.steps["x"]
    decision = decide_cancellation(world.agg, world.now_ms)
    assert decision.appends == ()
    assert decision.blocked == (attempt.attempt_id, step.step_run_id)
    assert decision.settled_attempts == 0 and decision.run_terminal is None


def test_partial_convergence_then_worker_completion_then_parent():
    world = World(make_plan({"a": [], "b": ["a"], "c": []}))
    claim(world)
    grant = start(world, "a", running=True)
    world.apply(request_cancel(world.agg, "user", world.now_ms))
    first = world.apply(decide_cancellation(world.agg, world.now_ms))
    assert [e.type for e in first.events(RUN)] == [
        "attempt.cancelled",
        "step.cancelled",
        "step.cancelled",
    ]
    assert {k: s.status for k, s in world.agg.steps.items()} == {
        "a": "running", "b": "cancelled", "c": "cancelled",
    }  # fmt: skip
    assert first.blocked == (grant.attempt_id, world.agg.steps["a"].step_run_id)
    assert first.run_terminal is None and world.agg.run.status == "running"
    # the worker finishes successfully: recorded as cancelled under intent
    world.apply(
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
    )
    assert world.agg.steps["a"].status == "cancelled"
    second = world.apply(decide_cancellation(world.agg, world.now_ms))
    assert [e.type for e in second.events(RUN)] == ["workflow.cancelled"]
    assert second.run_terminal == "cancelled" and second.blocked == ()


def test_running_step_with_no_visible_attempt_stays_blocked():
    world = World(make_plan({"x": []}))
    claim(world)
    start(world, "x")
    world.apply(request_cancel(world.agg, "policy", world.now_ms))
    # a log whose running StepRun has no active Attempt: its Attempt was lost, then the
    # StepRun was moved lost -> ready -> running by writes no v1 decision makes
    world.tick(TTL_MS)
    world.apply(decide_recovery(world.agg, world.now_ms))
    assert world.agg.steps["x"].status == "lost"
    force_step(world, "x", "ready")
    force_step(world, "x", "running")
    assert not any(a.is_active for a in world.agg.attempts.values())
    decision = decide_cancellation(world.agg, world.now_ms)
    assert decision.appends == ()
    assert decision.blocked == (world.agg.steps["x"].step_run_id,)


def test_deadline_records_timeout_intent_at_the_deadline_first():
    world = World(make_plan({"a": [], "b": ["a"]}, timeout_ms=60_000))
    deadline = START_MS + 60_000
    assert decide_cancellation(world.agg, deadline - 1).noop
    decision = world.apply(decide_cancellation(world.agg, deadline + 5_000))
    events = decision.events(RUN)
    assert events[0].type == "workflow.cancel_requested"
    assert events[0].data == {"reason": "timeout", "requested_at_ms": deadline}
    assert events[0].event_id == derive_id(CANCEL_INTENT_EVENT, RUN_ID, "timeout", deadline)
    assert [e.type for e in events[1:]] == [
        "step.timed_out",
        "step.cancelled",
        "workflow.timed_out",
    ]
    assert events[1].data["step_key"] == "a" and events[2].data["step_key"] == "b"
    assert world.agg.run.cancel_reason == "timeout"
    assert world.agg.run.cancel_requested_at_ms == deadline


def test_an_earlier_user_intent_keeps_its_reason_past_the_deadline():
    world = World(make_plan({"a": []}, timeout_ms=60_000))
    world.apply(request_cancel(world.agg, "user", START_MS + 10))
    decision = world.apply(decide_cancellation(world.agg, START_MS + 120_000))
    assert decision.run_terminal == "cancelled"
    assert world.agg.steps["a"].status == "cancelled"


def test_no_intent_or_terminal_run_gives_nothing():
    world = World(make_plan({"a": []}))
    assert decide_cancellation(world.agg, world.now_ms) == decide_cancellation(world.agg, 0)
    assert decide_cancellation(world.agg, world.now_ms).noop
    world.apply(request_cancel(world.agg, "user", world.now_ms))
    world.apply(decide_cancellation(world.agg, world.now_ms))
    assert world.agg.run.status == "cancelled"
    assert decide_cancellation(world.agg, world.now_ms).noop


def test_cancellation_ids_do_not_depend_on_the_observation_time():
    world = World(make_plan({"a": [], "b": ["a"], "c": []}))
    claim(world)
    world.apply(request_cancel(world.agg, "user", world.now_ms))
    early = decide_cancellation(world.agg, world.now_ms)
    late = decide_cancellation(world.agg, world.now_ms + 3_600_000)
    assert [(e.event_id, e.type, e.data) for a in early.appends for e in a.events] == [
        (e.event_id, e.type, e.data) for a in late.appends for e in a.events
    ]


def test_request_cancel_records_intent_once():
    world = World(make_plan({"a": []}))
    with pytest.raises(InvalidInput, match="reason"):
        request_cancel(world.agg, "because", world.now_ms)
    decision = world.apply(request_cancel(world.agg, "shutdown", world.now_ms + 1))
    assert [(e.type, e.data) for e in decision.events(RUN)] == [
        ("workflow.cancel_requested", {"reason": "shutdown", "requested_at_ms": world.now_ms + 1})
    ]
    assert request_cancel(world.agg, "user", world.now_ms + 2).noop
    assert world.agg.run.cancel_reason == "shutdown"


def test_request_cancel_past_the_deadline_leaves_the_timeout():
    world = World(make_plan({"a": []}, timeout_ms=1_000))
    assert request_cancel(world.agg, "user", START_MS + 1_000).noop
    assert not request_cancel(world.agg, "user", START_MS + 999).noop
